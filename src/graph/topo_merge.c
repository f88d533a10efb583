/*
 * From every rank's own description to one document per host, and back out
 * to a file: the part of the communicator's topology set-up that needs no
 * communicator, so that unit tests can run it for 16 hosts of 8 GPUs.
 *
 * Ranks belong to the same host when their host ids are equal (the hash of
 * hostname and boot id, or BRAID_HOSTID: one machine can pose as several
 * hosts). Hosts are numbered in order of their first rank and each host's
 * descriptions are merged in rank order, so every rank builds the same
 * documents from the same exchanged texts.
 */
#include <stdlib.h>
#include <string.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/utils.h"
#include "graph/topo.h"

/* The host numbered for `hash`, creating it (and its document) when new. */
static ncclResult_t topo_merge_host_of(uint64_t hash, const char* hostname, int r,
                                       uint64_t* host_hashes, int* nhosts, struct xml_doc** docs,
                                       int* out) {
  char source[160];
  for (int h = 0; h < *nhosts; h++) {
    if (host_hashes[h] == hash) {
      *out = h;
      return ncclSuccess;
    }
  }
  snprintf(source, sizeof source, "host %s (rank %d)", hostname ? hostname : "?", r);
  host_hashes[*nhosts] = hash;
  *out = (*nhosts)++;
  return xml_doc_create(source, &docs[*out]);
}

ncclResult_t topo_merge_hosts(const char* const* texts, const uint64_t* host_hash,
                              const char* const* hostnames, int nranks, int* rank_host, int* nhosts,
                              struct xml_doc** docs) {
  ncclResult_t res = ncclSuccess;
  struct xml_doc* one = NULL;
  uint64_t* host_hashes = NULL;
  char source[64];
  *nhosts = 0;
  BRAID_TRY(BRAID_CALLOC(&host_hashes, (size_t)nranks, "host ids"));
  for (int r = 0; r < nranks; r++) {
    BRAID_TRY(topo_merge_host_of(host_hash[r], hostnames ? hostnames[r] : NULL, r, host_hashes,
                                 nhosts, docs, &rank_host[r]));
    snprintf(source, sizeof source, "rank %d's topology", r);
    BRAID_TRY(xml_parse_buffer(texts[r], strlen(texts[r]), source, &one));
    BRAID_TRY(topo_xml_fuse(docs[rank_host[r]], one));
    xml_doc_free(one);
    one = NULL;
  }
fail:
  xml_doc_free(one);
  free(host_hashes);
  return res;
}

ncclResult_t topo_dump_host(struct xml_doc* doc, int host, const int* rank_host,
                            const int64_t* rank_busid, int nranks, const char* path) {
  ncclResult_t res = ncclSuccess;
  /* The ranks as this communicator numbers them, so a reader sees who drove which GPU. */
  for (int r = 0; r < nranks; r++) {
    struct xml_node* gpu =
        rank_host[r] == host && doc->root ? topo_xml_find_gpu(doc->root, rank_busid[r]) : NULL;
    if (gpu) BRAID_TRY(xml_attr_set_int(gpu, "rank", r));
  }
  BRAID_TRY(xml_write_file(path, doc));
  INFO(BRAID_LOG_ENV, "topology of host %d written to %s", host, path);
fail:
  return res;
}
