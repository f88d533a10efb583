/*
 * From one topology document per host to a complete struct braid_topo:
 * node graphs and their paths, which GPU each rank drives, the rank-to-rank
 * path matrix, rings, trees and the tuning model. This is where the
 * communicator path (runtime/topo_comm.c, after the exchange) and the file path
 * (unit tests, braid-info) meet; nothing here talks to other ranks, so the
 * unit tests need neither GPUs nor sockets.
 */
#include <stdlib.h>
#include <string.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "graph/topo.h"

void topo_free(struct braid_topo* topo) {
  if (topo == NULL) return;
  for (int h = 0; topo->hosts && h < topo->nhosts; h++) {
    topo_system_free(topo->hosts[h].sys);
    free(topo->hosts[h].ranks);
  }
  free(topo->hosts);
  free(topo->rank_host);
  free(topo->rank_gpu);
  free(topo->rank_net_bw);
  free(topo->rings.order);
  free(topo->trees.nodes);
  free(topo->ring_nets);
  free(topo);
}

/* GPU nodes of `sys` in `dev` order (bus id on a tie). */
static int topo_build_gpus_by_dev(const struct topo_system* sys, int* out, int max) {
  int n = 0;
  for (int i = 0; i < sys->nnodes && n < max; i++) {
    if (sys->nodes[i].type != TOPO_GPU) continue;
    int j = n++;
    while (j > 0) {
      const struct topo_node* a = &sys->nodes[out[j - 1]];
      const struct topo_node* b = &sys->nodes[i];
      if (a->u.gpu.dev < b->u.gpu.dev || (a->u.gpu.dev == b->u.gpu.dev && a->id < b->id)) break;
      out[j] = out[j - 1];
      j--;
    }
    out[j] = i;
  }
  return n;
}

/* The GPU node of rank r, by bus id: the error lists what the topology has instead. */
static ncclResult_t topo_build_find_gpu(const struct topo_system* sys, int r, int64_t busid,
                                        int* out) {
  char want[32], have[512] = "", one[32];
  *out = topo_node_find(sys, TOPO_GPU, busid);
  if (*out >= 0) return ncclSuccess;
  braid_busid_to_str(busid, want, sizeof want);
  for (int i = 0; i < sys->nnodes && strlen(have) < sizeof have - 40; i++) {
    if (sys->nodes[i].type != TOPO_GPU) continue;
    braid_busid_to_str(sys->nodes[i].id, one, sizeof one);
    strcat(have, have[0] ? ", " : "");
    strcat(have, one);
  }
  return braid_err(ncclInvalidUsage,
                   "rank %d uses the GPU at %s, which the topology of its host (%s) does not list "
                   "(it lists: %s); fix or remove BRAID_TOPO_FILE",
                   r, want, sys->source, have[0] ? have : "no GPU");
}

/* Fills each host's rank list and each rank's GPU. */
static ncclResult_t topo_build_ranks(struct braid_topo* topo, const int* rank_host,
                                     const int64_t* rank_busid) {
  ncclResult_t res = ncclSuccess;
  int gpus[BRAID_MAX_RANKS_PER_HOST];
  for (int r = 0; r < topo->nranks; r++) {
    BRAID_CHECK(rank_host[r] >= 0 && rank_host[r] < topo->nhosts, ncclInternalError,
                "rank %d is on host %d of %d", r, rank_host[r], topo->nhosts);
    topo->hosts[rank_host[r]].nranks++;
  }
  for (int h = 0; h < topo->nhosts; h++) {
    struct topo_host* host = &topo->hosts[h];
    BRAID_CHECK(host->nranks > 0 && host->nranks <= BRAID_MAX_RANKS_PER_HOST, ncclInvalidUsage,
                "host %d (%s) has %d ranks: expected 1 to %d", h, host->sys->source, host->nranks,
                BRAID_MAX_RANKS_PER_HOST);
    BRAID_TRY(BRAID_CALLOC(&host->ranks, (size_t)host->nranks, "host ranks"));
    host->nranks = 0;
  }
  for (int r = 0; r < topo->nranks; r++) {
    struct topo_host* host = &topo->hosts[rank_host[r]];
    int local = host->nranks++;
    host->ranks[local] = r;
    topo->rank_host[r] = rank_host[r];
    if (rank_busid) {
      BRAID_TRY(topo_build_find_gpu(host->sys, r, rank_busid[r], &topo->rank_gpu[r]));
      continue;
    }
    int n = topo_build_gpus_by_dev(host->sys, gpus, BRAID_MAX_RANKS_PER_HOST);
    BRAID_CHECK(
        local < n, ncclInvalidUsage,
        "%s describes %d GPU%s but more ranks run on that host: expected one <gpu> per rank",
        host->sys->source, n, n == 1 ? "" : "s");
    topo->rank_gpu[r] = gpus[local];
  }
  for (int h = 0; h < topo->nhosts; h++) {
    const struct topo_host* host = &topo->hosts[h];
    for (int i = 0; i < host->nranks; i++)
      for (int j = i + 1; j < host->nranks; j++)
        BRAID_CHECK(topo->rank_gpu[host->ranks[i]] != topo->rank_gpu[host->ranks[j]],
                    ncclInvalidUsage,
                    "ranks %d and %d use the same GPU of one host: one rank per GPU is supported",
                    host->ranks[i], host->ranks[j]);
  }
fail:
  return res;
}

/* The best bandwidth from rank r's GPU to the network (a default when its host has no NIC). */
static float topo_build_net_bw(const struct braid_topo* topo, int r) {
  const struct topo_system* sys = topo->hosts[topo->rank_host[r]].sys;
  float best = 0.0f;
  for (int i = 0; i < sys->nnodes; i++) {
    if (sys->nodes[i].type != TOPO_NET) continue;
    const struct topo_path* p = topo_path_get(sys, topo->rank_gpu[r], i);
    if (p && p->type != BRAID_PATH_DIS) best = BRAID_MAX(best, p->bw);
  }
  return best > 0.0f ? best : tune_table.net_default_bw;
}

/*
 * What topo_path needs beyond the host graphs: each rank's best bandwidth to
 * the network. Pairs are not stored: at 1,024 hosts of 8 GPUs a matrix of
 * every pair would be half a gigabyte, and a pair's answer is one lookup.
 */
static ncclResult_t topo_build_paths(struct braid_topo* topo) {
  ncclResult_t res = ncclSuccess;
  BRAID_TRY(BRAID_CALLOC(&topo->rank_net_bw, (size_t)topo->nranks, "rank network bandwidth"));
  for (int r = 0; r < topo->nranks; r++) {
    const struct topo_system* sys = topo->hosts[topo->rank_host[r]].sys;
    int sm = sys->nodes[topo->rank_gpu[r]].u.gpu.sm;
    topo->min_sm = r == 0 ? sm : BRAID_MIN(topo->min_sm, sm);
    topo->rank_net_bw[r] = topo_build_net_bw(topo, r);
  }
fail:
  return res;
}

/* Channel bounds: BRAID_MIN/MAX_NCHANNELS, then the communicator's config. */
static void topo_build_channel_bounds(struct braid_topo* topo, const struct topo_build_opts* opts) {
  int max = (int)braid_param_int(BRAID_P_MAX_NCHANNELS);
  int min = (int)braid_param_int(BRAID_P_MIN_NCHANNELS);
  max = max > 0 ? BRAID_MIN(max, BRAID_MAX_CHANNELS) : BRAID_MAX_CHANNELS;
  min = min > 0 ? min : tune_table.min_channels;
  if (opts && opts->max_channels > 0) max = BRAID_MIN(max, opts->max_channels);
  if (opts && opts->min_channels > 0) min = BRAID_MAX(min, opts->min_channels);
  if (topo->nranks == 1) min = max = 1; /* a lone rank only copies */
  topo->max_channels = BRAID_MAX(max, 1);
  topo->min_channels = BRAID_MAX(BRAID_MIN(min, topo->max_channels), 1);
}

ncclResult_t topo_build(struct xml_doc** docs, int nhosts, const int* rank_host,
                        const int64_t* rank_busid, int nranks, const struct topo_build_opts* opts,
                        struct braid_topo** out) {
  ncclResult_t res = ncclSuccess;
  struct braid_topo* topo = NULL;
  *out = NULL;
  BRAID_CHECK(nhosts > 0 && nranks > 0, ncclInternalError, "topology of %d ranks on %d hosts",
              nranks, nhosts);
  BRAID_TRY(BRAID_CALLOC(&topo, 1, "the topology"));
  topo->nranks = nranks;
  topo->nhosts = nhosts;
  BRAID_TRY(BRAID_CALLOC(&topo->hosts, (size_t)nhosts, "topology hosts"));
  BRAID_TRY(BRAID_CALLOC(&topo->rank_host, (size_t)nranks, "topology ranks"));
  BRAID_TRY(BRAID_CALLOC(&topo->rank_gpu, (size_t)nranks, "topology ranks"));
  for (int h = 0; h < nhosts; h++) {
    BRAID_TRY(topo_xml_to_system(docs[h], &topo->hosts[h].sys));
    topo->hosts[h].sys->p2p_disabled = braid_param_int(BRAID_P_P2P_DISABLE) != 0;
    BRAID_TRY(topo_paths_compute(topo->hosts[h].sys));
  }
  BRAID_TRY(topo_build_ranks(topo, rank_host, rank_busid));
  BRAID_TRY(topo_build_paths(topo));
  topo_build_channel_bounds(topo, opts);
  topo_hosts_find_twins(topo);
  BRAID_TRY(search_rings(topo));
  BRAID_TRY(search_trees(topo));
  BRAID_TRY(tune_model_init(topo));
  *out = topo;
  return ncclSuccess;
fail:
  topo_free(topo);
  return res;
}

ncclResult_t topo_build_from_files(const char* const* files, int nhosts, const int* ranks_per_host,
                                   struct braid_topo** out) {
  ncclResult_t res = ncclSuccess;
  struct xml_doc** docs = NULL;
  int* rank_host = NULL;
  int nranks = 0;
  *out = NULL;
  BRAID_CHECK(nhosts > 0 && nhosts <= 65536, ncclInvalidArgument, "%d hosts: expected 1 to 65536",
              nhosts);
  for (int h = 0; h < nhosts; h++) {
    BRAID_CHECK(ranks_per_host[h] > 0 && ranks_per_host[h] <= BRAID_MAX_RANKS_PER_HOST,
                ncclInvalidArgument, "host %d: %d ranks: expected 1 to %d", h, ranks_per_host[h],
                BRAID_MAX_RANKS_PER_HOST);
    nranks += ranks_per_host[h];
  }
  BRAID_TRY(BRAID_CALLOC(&docs, (size_t)nhosts, "topology documents"));
  BRAID_TRY(BRAID_CALLOC(&rank_host, (size_t)nranks, "topology ranks"));
  for (int h = 0, r = 0; h < nhosts; h++) {
    BRAID_TRY(xml_parse_file(files[h], &docs[h]));
    for (int i = 0; i < ranks_per_host[h]; i++) rank_host[r++] = h;
  }
  BRAID_TRY(topo_build(docs, nhosts, rank_host, NULL, nranks, NULL, out));
fail:
  for (int h = 0; docs && h < nhosts; h++) xml_doc_free(docs[h]);
  free(docs);
  free(rank_host);
  return res;
}
