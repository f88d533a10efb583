/*
 * The communicator's topology: each rank describes its own GPU (and its
 * host's PCI tree and NICs) as NCCL topology XML, every rank receives every
 * description through the bootstrap, the descriptions of one host are merged
 * (in rank order, so every rank merges alike), and topo_build does the rest.
 * The graph module itself never talks to other ranks: this is the runtime's
 * side of it.
 *
 * Exchanging whole descriptions costs a few KiB per rank; fine for the
 * machines we target (up to a few hundred ranks), to be replaced by a
 * per-host leader exchange beyond that.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/topo_comm.h"
#include "transport/net.h"

#include "bootstrap/bootstrap.h"
#include "runtime/comm.h"
#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "graph/topo.h"
#include "graph/topo_detect.h"

/* This rank's view: BRAID_TOPO_FILE if set, completed by detection of what it lacks. */
static ncclResult_t topo_comm_local_doc(struct ncclComm* comm, struct xml_doc** out) {
  ncclResult_t res = ncclSuccess;
  struct xml_doc* doc = NULL;
  char busid[32], source[96];
  const char* file = braid_param_str(BRAID_P_TOPO_FILE);
  braid_busid_to_str(comm->bus_id, busid, sizeof busid);
  if (file && file[0]) {
    BRAID_TRY(xml_parse_file(file, &doc));
    BRAID_CHECK(doc->root && strcmp(doc->root->name, "system") == 0, ncclInvalidUsage,
                "%s:%d: BRAID_TOPO_FILE must hold <system>, not <%s>", file, doc->root->line,
                doc->root->name);
    INFO(BRAID_LOG_ENV, "topology of this host read from %s", file);
  } else {
    snprintf(source, sizeof source, "the topology detected on %s",
             comm->peers[comm->rank].hostname);
    BRAID_TRY(xml_doc_create(source, &doc));
  }
  BRAID_TRY(topo_detect_gpu(doc, busid, comm->cuda_dev, comm->rank));
  BRAID_TRY(topo_nic_detect(doc));
  *out = doc;
  return ncclSuccess;
fail:
  xml_doc_free(doc);
  return res;
}

/* Every rank's description, as text: texts + r * stride, NUL-terminated. */
static ncclResult_t topo_comm_exchange(struct ncclComm* comm, const struct xml_doc* doc,
                                       char** texts, size_t* stride) {
  ncclResult_t res = ncclSuccess;
  char* mine = NULL;
  size_t len = 0;
  uint64_t* lens = NULL;
  uint64_t max = 0;
  *texts = NULL;
  BRAID_TRY(xml_write_string(doc, &mine, &len));
  BRAID_TRY(BRAID_CALLOC(&lens, (size_t)comm->nranks, "topology exchange"));
  lens[comm->rank] = len + 1;
  BRAID_TRY(bootstrap_allgather(comm->bootstrap, lens, sizeof *lens));
  for (int r = 0; r < comm->nranks; r++) max = BRAID_MAX(max, lens[r]);
  BRAID_CHECK(max > 0 && max < (64u << 20), ncclInternalError,
              "topology exchange: a description of %llu bytes", (unsigned long long)max);
  BRAID_TRY(BRAID_CALLOC(texts, (size_t)comm->nranks * max, "topology exchange"));
  memcpy(*texts + (size_t)comm->rank * max, mine, len + 1);
  BRAID_TRY(bootstrap_allgather(comm->bootstrap, *texts, max));
  for (int r = 0; r < comm->nranks; r++) (*texts)[(size_t)r * max + max - 1] = '\0';
  *stride = max;
fail:
  if (res != ncclSuccess) {
    free(*texts);
    *texts = NULL;
  }
  free(mine);
  free(lens);
  return res;
}

/* Groups the exchanged descriptions by host id and merges each host's (topo_merge.c). */
static ncclResult_t topo_comm_merge(struct ncclComm* comm, const char* texts, size_t stride,
                                    int* rank_host, int* nhosts, struct xml_doc** docs) {
  ncclResult_t res = ncclSuccess;
  const char** text = NULL;
  const char** names = NULL;
  uint64_t* hashes = NULL;
  BRAID_TRY(BRAID_CALLOC(&text, (size_t)comm->nranks, "topology merge"));
  BRAID_TRY(BRAID_CALLOC(&names, (size_t)comm->nranks, "topology merge"));
  BRAID_TRY(BRAID_CALLOC(&hashes, (size_t)comm->nranks, "topology merge"));
  for (int r = 0; r < comm->nranks; r++) {
    text[r] = texts + (size_t)r * stride;
    names[r] = comm->peers[r].hostname;
    hashes[r] = comm->peers[r].host_hash;
  }
  BRAID_TRY(topo_merge_hosts(text, hashes, names, comm->nranks, rank_host, nhosts, docs));
fail:
  free(text);
  free(names);
  free(hashes);
  return res;
}

/* BRAID_TOPO_DUMP_FILE: rank 0 writes its host's merged description. */
static void topo_comm_dump_topo(struct ncclComm* comm, struct xml_doc* doc, const int* rank_host,
                                const int64_t* rank_busid) {
  const char* path = braid_param_str(BRAID_P_TOPO_DUMP_FILE);
  if (comm->rank != 0 || path == NULL || path[0] == '\0') return;
  /* A failed dump was reported by braid_err; the communicator does not need it. */
  (void)topo_dump_host(doc, rank_host[0], rank_host, rank_busid, comm->nranks, path);
}

/*
 * Every rank must have reached the same channels, rings and overrides: they
 * do from the same descriptions, unless the environment differs between
 * ranks (BRAID_MAX_NCHANNELS, BRAID_ALGO, ...), which would hang the first
 * collective. Better to fail here and say so.
 */
static ncclResult_t topo_comm_check_agreement(struct ncclComm* comm,
                                              const struct braid_topo* topo) {
  ncclResult_t res = ncclSuccess;
  uint64_t* digests = NULL;
  uint64_t parts[4] = {
      (uint64_t)topo->rings.nchannels,
      braid_hash(topo->rings.order, sizeof(int) * (size_t)topo->rings.nchannels * topo->nranks),
      braid_hash(topo->tune.algo_override, sizeof topo->tune.algo_override),
      braid_hash(topo->tune.proto_override, sizeof topo->tune.proto_override)};
  BRAID_TRY(BRAID_CALLOC(&digests, (size_t)comm->nranks, "topology agreement"));
  digests[comm->rank] = braid_hash(parts, sizeof parts);
  BRAID_TRY(bootstrap_allgather(comm->bootstrap, digests, sizeof *digests));
  for (int r = 0; r < comm->nranks; r++)
    BRAID_CHECK(
        digests[r] == digests[0], ncclInvalidUsage,
        "rank %d (%s) and rank 0 (%s) computed different rings or algorithm choices from the "
        "same topology: set BRAID_/NCCL_ MIN_NCHANNELS, MAX_NCHANNELS, ALGO, PROTO and "
        "P2P_DISABLE alike on every rank",
        r, comm->peers[r].hostname, comm->peers[0].hostname);
fail:
  free(digests);
  return res;
}

static void topo_comm_log(const struct ncclComm* comm) {
  const struct braid_topo* topo = comm->topo;
  const struct braid_rings* rings = &topo->rings;
  char line[512];
  size_t len = 0;
  int show = BRAID_MIN(topo->nranks, 32);
  for (int i = 0; i < show && len < sizeof line - 16; i++)
    len += (size_t)snprintf(line + len, sizeof line - len, "%s%d", i ? " " : "", rings->order[i]);
  INFO(BRAID_LOG_INIT,
       "%d ranks on %d host%s: %d ring channels of %.1f GB/s (%s), "
       "ring 0: %s%s",
       topo->nranks, topo->nhosts, topo->nhosts == 1 ? "" : "s", rings->nchannels,
       rings->bw_per_channel, topo_path_type_name(topo->ring_intra_type), line,
       topo->nranks > show ? " ..." : "");
}

ncclResult_t topo_comm_init(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct xml_doc *local = NULL, **docs = NULL;
  char* texts = NULL;
  size_t stride = 0;
  int *rank_host = NULL, nhosts = 0;
  int64_t* rank_busid = NULL;
  struct braid_topo* topo = NULL;
  BRAID_CHECK(comm->topo == NULL && comm->peers != NULL, ncclInternalError,
              "topo_comm_init: topology already built or peers not exchanged");
  BRAID_TRY(topo_comm_local_doc(comm, &local));
  BRAID_TRY(topo_comm_exchange(comm, local, &texts, &stride));
  BRAID_TRY(BRAID_CALLOC(&docs, (size_t)comm->nranks, "host topologies"));
  BRAID_TRY(BRAID_CALLOC(&rank_host, (size_t)comm->nranks, "host topologies"));
  BRAID_TRY(BRAID_CALLOC(&rank_busid, (size_t)comm->nranks, "host topologies"));
  BRAID_TRY(topo_comm_merge(comm, texts, stride, rank_host, &nhosts, docs));
  for (int r = 0; r < comm->nranks; r++) rank_busid[r] = comm->peers[r].bus_id;
  topo_comm_dump_topo(comm, docs[rank_host[comm->rank]], rank_host, rank_busid);
  struct topo_build_opts opts = {.min_channels = comm->config.min_ctas,
                                 .max_channels = comm->config.max_ctas};
  BRAID_TRY(topo_build(docs, nhosts, rank_host, rank_busid, comm->nranks, &opts, &topo));
  BRAID_TRY(topo_comm_check_agreement(comm, topo));
  comm->topo = topo; /* the comm owns it now */
  topo = NULL;
  struct tune_plugin_args tuner = {.comm_id = comm->comm_hash,
                                   .net_lib = net_plugin_library_path()};
  BRAID_TRY(tune_plugin_open(comm->topo, &tuner)); /* NCCL_TUNER_PLUGIN, when there is one */
  const char* graph_file = braid_param_str(BRAID_P_GRAPH_DUMP_FILE);
  if (comm->rank == 0 && graph_file && graph_file[0])
    (void)topo_dump_graphs(comm->topo, rank_host[0], graph_file); /* reported if it fails */
  topo_comm_log(comm);
fail:
  topo_free(topo);
  for (int h = 0; docs && h < comm->nranks; h++) xml_doc_free(docs[h]);
  free(docs);
  free(texts);
  free(rank_host);
  free(rank_busid);
  xml_doc_free(local);
  return res;
}

void topo_comm_free(struct ncclComm* comm) {
  if (comm == NULL) return;
  tune_plugin_close(comm->topo);
  topo_free(comm->topo);
  comm->topo = NULL;
}

int tune_proto_named(const struct ncclComm* comm, braid_coll_t coll) {
  return comm != NULL && comm->topo != NULL && tune_proto_named_topo(comm->topo, coll);
}

ncclResult_t tune_choose(const struct ncclComm* comm, braid_coll_t coll, size_t bytes,
                         unsigned algo_mask, unsigned proto_mask, struct braid_tune_choice* out) {
  if (comm == NULL || comm->topo == NULL)
    return braid_err(ncclInternalError, "tune_choose called before topo_comm_init");
  return tune_choose_topo(comm->topo, coll, bytes, algo_mask, proto_mask, out);
}
