/*
 * The tuning model: for a collective of a given size, which algorithm,
 * protocol, channel count and thread count should be fastest. For each
 * (collective, algorithm, protocol) the model keeps a latency and a
 * per-channel bus bandwidth, derived once from the searched rings and trees
 * and the constants of tune_table.c:
 *
 *   time = latency + bytes / (channels x busbw per channel x algbw/busbw ratio)
 *
 * where small messages use fewer channels (a channel needs
 * nthreads x thread_bytes bytes to be worth its launch). The caller's masks
 * say what the data path can run; BRAID_ALGO / BRAID_PROTO narrow that (see
 * tune_override.c); a tuner plugin (tune_plugin.c) may then edit the
 * predicted times; the choice is explained in one INFO line.
 */
#include <math.h>
#include <string.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "graph/topo.h"
#include "graph/tune_override.h"
#include "graph/tune_plugin.h"

static int tune_link_class(int path_type) {
  if (path_type <= BRAID_PATH_NVB) return TUNE_LINK_NVL;
  if (path_type == BRAID_PATH_NET) return TUNE_LINK_NET;
  return TUNE_LINK_PCI;
}

/* busbw = algbw x factor (nccl-tests' definition); ratio is 1/factor. */
static float tune_ring_ratio(int coll, int n) {
  if (n <= 1) return 1.0f;
  switch (coll) {
    case BRAID_COLL_ALLREDUCE:
      return (float)n / (2.0f * (float)(n - 1));
    case BRAID_COLL_ALLGATHER:
    case BRAID_COLL_REDUCESCATTER:
      return (float)n / (float)(n - 1);
    default:
      return 1.0f;
  }
}

/* Pipeline steps of one call around the ring. */
static int tune_ring_steps(int coll, int n) {
  if (n <= 1) return 0;
  switch (coll) {
    case BRAID_COLL_ALLREDUCE:
      return 2 * (n - 1);
    case BRAID_COLL_SENDRECV:
      return 1;
    default:
      return n - 1;
  }
}

/*
 * Whether a ring collective's steps pay the forwarding cost (ring_fwd_lat): all-reduce,
 * reduce-scatter and all-gather, measured. Broadcast's and reduce's chains did not show it
 * (broadcast with Simple on 4 ranks: 8.4 us at 512 KB, 12.5 at 2 MB, against all-gather's
 * 15.9 and 19.1).
 */
static int tune_ring_forwards(int coll) {
  return coll == BRAID_COLL_ALLREDUCE || coll == BRAID_COLL_REDUCESCATTER ||
         coll == BRAID_COLL_ALLGATHER;
}

/*
 * The ring model: latency per step averages the ring's intra-host and network hops; a ring of
 * 3 or more ranks in one host adds its forwarding cost (rings across hosts: not measured).
 */
static void tune_model_ring(struct braid_topo* topo, struct tune_model* m) {
  int n = topo->nranks, nh = topo->nhosts > 1 ? topo->nhosts : 0;
  int intra = tune_link_class(topo->ring_intra_type);
  for (int p = 0; p < BRAID_PROTO_COUNT; p++) {
    float hop = ((float)(n - nh) * tune_table.hop_lat[intra][p] +
                 (float)nh * tune_table.hop_lat[TUNE_LINK_NET][p]) /
                (float)n;
    float fwd = n >= 3 && nh == 0 ? tune_table.ring_fwd_lat[intra][p] : 0.0f;
    float eff = tune_table.proto_eff[intra][p];
    if (nh) eff = BRAID_MIN(eff, tune_table.proto_eff[TUNE_LINK_NET][p]);
    for (int c = 0; c < BRAID_COLL_COUNT; c++) {
      m->lat[c][BRAID_ALGO_RING][p] =
          tune_table.base_lat[BRAID_ALGO_RING][p] +
          (float)tune_ring_steps(c, n) * (hop + (tune_ring_forwards(c) ? fwd : 0.0f));
      m->busbw_ch[c][BRAID_ALGO_RING][p] = topo->rings.bw_per_channel * eff;
      m->ratio[c][BRAID_ALGO_RING] = tune_ring_ratio(c, n);
    }
  }
}

/* The tree model (all-reduce only): reduce up, broadcast down, chain depth + log2(hosts). */
static void tune_model_tree(struct braid_topo* topo, struct tune_model* m) {
  int ppn = 1;
  for (int h = 0; h < topo->nhosts; h++) ppn = BRAID_MAX(ppn, topo->hosts[h].nranks);
  int levels = (int)ceil(log2((double)topo->nhosts));
  int intra = tune_link_class(topo->ring_intra_type);
  for (int p = 0; p < BRAID_PROTO_COUNT; p++) {
    float eff = tune_table.proto_eff[intra][p];
    if (topo->nhosts > 1) eff = BRAID_MIN(eff, tune_table.proto_eff[TUNE_LINK_NET][p]);
    float depth_lat = (float)(ppn - 1) * tune_table.hop_lat[intra][p] +
                      (float)levels * tune_table.hop_lat[TUNE_LINK_NET][p];
    m->lat[BRAID_COLL_ALLREDUCE][BRAID_ALGO_TREE][p] =
        tune_table.base_lat[BRAID_ALGO_TREE][p] + 2.0f * depth_lat;
    m->busbw_ch[BRAID_COLL_ALLREDUCE][BRAID_ALGO_TREE][p] =
        topo->trees.bw_per_channel * eff * tune_table.tree_eff;
  }
  /* NCCL's algbw/busbw for trees: each byte goes up and down. */
  m->ratio[BRAID_COLL_ALLREDUCE][BRAID_ALGO_TREE] = 0.5f;
}

/*
 * The direct all-reduce (all-reduce only): one hop, with every peer at
 * once; each rank sends (n-1) times its bytes, so algbw = busbw / (n-1)
 * per channel's share. Simple only (its steps are Simple's on any link).
 */
static void tune_model_direct(struct braid_topo* topo, struct tune_model* m) {
  int n = topo->nranks;
  if (n < 2) return;
  int link = topo->nhosts > 1 ? TUNE_LINK_NET : tune_link_class(topo->ring_intra_type);
  const int p = BRAID_PROTO_SIMPLE;
  m->lat[BRAID_COLL_ALLREDUCE][BRAID_ALGO_DIRECT][p] = tune_table.base_lat[BRAID_ALGO_DIRECT][p] +
                                                       tune_table.hop_lat[link][p] +
                                                       (float)(n - 2) * tune_table.direct_peer_lat;
  m->busbw_ch[BRAID_COLL_ALLREDUCE][BRAID_ALGO_DIRECT][p] =
      topo->rings.bw_per_channel * tune_table.proto_eff[link][p];
  m->ratio[BRAID_COLL_ALLREDUCE][BRAID_ALGO_DIRECT] = 1.0f / (float)(n - 1);
}

ncclResult_t tune_model_init(struct braid_topo* topo) {
  ncclResult_t res = ncclSuccess;
  struct tune_model* m = &topo->tune;
  memset(m, 0, sizeof *m);
  m->nranks = topo->nranks;
  m->nhosts = topo->nhosts;
  m->nchannels[BRAID_ALGO_RING] = topo->rings.nchannels;
  m->nchannels[BRAID_ALGO_TREE] = topo->trees.nchannels;
  m->nchannels[BRAID_ALGO_DIRECT] = topo->rings.nchannels;
  tune_model_ring(topo, m);
  tune_model_tree(topo, m);
  tune_model_direct(topo, m);
  /* LL128 relies on 128-byte store atomicity: NVLink only, Volta and later (as NCCL). */
  int intra = tune_link_class(topo->ring_intra_type);
  m->proto_topo_mask = (1u << BRAID_PROTO_SIMPLE) | (1u << BRAID_PROTO_LL);
  if (topo->min_sm >= 70 && (intra == TUNE_LINK_NVL || topo->nranks == 1) &&
      tune_table.proto_eff[intra][BRAID_PROTO_LL128] > 0.0f)
    m->proto_topo_mask |= 1u << BRAID_PROTO_LL128;
  BRAID_TRY(tune_override_parse(m));
  m->nthreads_override = (int)braid_param_int(BRAID_P_NTHREADS);
fail:
  return res;
}

/* Threads per CTA for protocol p: the table's, within what the kernels are built for. */
static int tune_nthreads(int p) { return BRAID_MIN(tune_table.nthreads[p], BRAID_MAX_NTHREADS); }

/* Channels worth using for `bytes` with protocol p. */
static int tune_channels(const struct tune_model* m, int algo, int p, size_t bytes) {
  size_t per = (size_t)tune_nthreads(p) * (size_t)tune_table.thread_bytes[p];
  size_t want = bytes / per + 1;
  int max = m->nchannels[algo];
  return want >= (size_t)max ? max : BRAID_MAX((int)want, 1);
}

static float tune_time(const struct tune_model* m, int coll, int algo, int p, size_t bytes,
                       int nch) {
  float busbw = (float)nch * m->busbw_ch[coll][algo][p];
  if (m->nranks == 1 || bytes == 0) return m->lat[coll][algo][p];
  if (busbw <= 0.0f) return INFINITY;
  return m->lat[coll][algo][p] + (float)bytes / (busbw * m->ratio[coll][algo] * 1e3f);
}

/*
 * What the model can run for `coll`: trees and the direct exchange for
 * all-reduce across hosts (direct from three ranks: two have the one-hop
 * exchange of the ring already, pair.h), unless `asked` names them.
 */
static unsigned tune_algo_with(const struct tune_model* m, int coll, unsigned asked) {
  unsigned mask = 1u << BRAID_ALGO_RING;
  if (coll != BRAID_COLL_ALLREDUCE) return mask;
  if (m->nhosts > 1 || (asked >> BRAID_ALGO_TREE & 1)) mask |= 1u << BRAID_ALGO_TREE;
  if (m->nranks >= 2 && m->nranks <= BRAID_DIRECT_MAX_RANKS &&
      ((m->nhosts > 1 && m->nranks >= 3) || (asked >> BRAID_ALGO_DIRECT & 1)))
    mask |= 1u << BRAID_ALGO_DIRECT;
  return mask;
}

/* The model's own candidates: BRAID_ALGO names ask for more ("^tree" asks for nothing more). */
static unsigned tune_algo_available(const struct tune_model* m, int coll) {
  return tune_algo_with(m, coll, m->algo_named[coll]);
}

/* Narrows `mask` by `pref` unless that leaves nothing (then the caller's mask wins). */
static unsigned tune_narrow(unsigned mask, unsigned pref) {
  return (mask & pref) ? (mask & pref) : mask;
}

/* Why (a, p) was not a candidate, or NULL when it was. */
static const char* tune_excluded(const struct tune_model* m, int coll, int a, int p,
                                 unsigned caller_amask, unsigned caller_pmask, unsigned amask,
                                 unsigned pmask) {
  if (((amask >> a) & 1) && ((pmask >> p) & 1)) return NULL;
  if (!((caller_amask >> a) & 1) || !((caller_pmask >> p) & 1)) return "caller cannot run it";
  if (!((amask >> a) & 1))
    return (tune_algo_available(m, coll) >> a) & 1 ? "BRAID_ALGO" : "topology";
  if (!((m->proto_topo_mask >> p) & 1)) return "topology";
  return m->proto_override[coll] == ~0u ? "off by default: only when BRAID_PROTO names it"
                                        : "BRAID_PROTO";
}

/* The protocols the user allows for `coll`; without BRAID_PROTO, those the model picks itself. */
static unsigned tune_proto_pref(const struct tune_model* m, int coll) {
  if (m->proto_named[coll]) return m->proto_override[coll];
  unsigned mask = 0;
  for (int p = 0; p < BRAID_PROTO_COUNT; p++)
    if (tune_table.proto_auto[p]) mask |= 1u << p;
  /* "^simple" removes from the model's own choice; what it leaves out entirely, it allows. */
  return (mask & m->proto_override[coll]) ? mask & m->proto_override[coll]
                                          : m->proto_override[coll];
}

/*
 * One INFO line: the choice, its predicted time split into latency and
 * transfer, and what every other algorithm/protocol would have cost or why
 * it was not considered (the caller's data path, the topology, or
 * BRAID_ALGO/BRAID_PROTO).
 */
static void tune_explain(const struct tune_model* m, int coll, size_t bytes, unsigned caller_amask,
                         unsigned caller_pmask, unsigned amask, unsigned pmask,
                         const struct braid_tune_choice* out, const char* note) {
  char others[512] = "";
  size_t len = 0;
  for (int a = 0; a < BRAID_ALGO_COUNT; a++) {
    for (int p = 0; p < BRAID_PROTO_COUNT; p++) {
      if ((a == (int)out->algo && p == (int)out->proto) || m->busbw_ch[coll][a][p] <= 0.0f)
        continue;
      const char* why = tune_excluded(m, coll, a, p, caller_amask, caller_pmask, amask, pmask);
      float t = tune_time(m, coll, a, p, bytes, tune_channels(m, a, p, bytes));
      len += (size_t)snprintf(others + len, len < sizeof others ? sizeof others - len : 0,
                              "%s%s/%s %.1f%s%s%s", len ? ", " : "", braid_algo_name(a),
                              braid_proto_name(p), t, why ? " (excluded: " : "", why ? why : "",
                              why ? ")" : "");
      if (len >= sizeof others) len = sizeof others - 1;
    }
  }
  float lat = m->lat[coll][out->algo][out->proto];
  float algbw =
      (float)out->nchannels * m->busbw_ch[coll][out->algo][out->proto] * m->ratio[coll][out->algo];
  INFO(BRAID_LOG_TUNING,
       "%s %zu B on %d ranks: %s/%s, %d channels x %d threads, %.1f us predicted "
       "(%.1f us latency + %.1f GB/s algbw); others in us: %s%s%s",
       braid_coll_name(coll), bytes, m->nranks, braid_algo_name(out->algo),
       braid_proto_name(out->proto), out->nchannels, out->nthreads, out->time_us, lat, algbw,
       others[0] ? others : "none", note[0] ? "; " : "", note);
}

/*
 * The tuner plugin's say. It sees the predicted time of every combination
 * the caller, the topology and BRAID_ALGO / BRAID_PROTO allow (Tree and
 * LL128 too where the model would not pick them itself) and may change
 * those times and ask for a channel count. A table it leaves as it was
 * keeps the model's choice; otherwise the least time of 0 or more wins, and
 * when it left no such time the model's choice stands. Its channel count is
 * bounded by the algorithm's channels. `note` says what it did.
 */
static void tune_plugin_choose(const struct tune_model* m, int coll, size_t bytes,
                               unsigned algo_mask, unsigned proto_mask,
                               struct braid_tune_choice* out, char* note, size_t size) {
  unsigned amask =
      tune_narrow(tune_narrow(algo_mask, tune_algo_with(m, coll, ~0u)), m->algo_override[coll]);
  unsigned pmask =
      tune_narrow(tune_narrow(proto_mask, m->proto_topo_mask), m->proto_override[coll]);
  float cost[BRAID_ALGO_COUNT][BRAID_PROTO_COUNT];
  for (int a = 0; a < BRAID_ALGO_COUNT; a++)
    for (int p = 0; p < BRAID_PROTO_COUNT; p++)
      cost[a][p] = ((amask >> a) & 1) && ((pmask >> p) & 1) && m->busbw_ch[coll][a][p] > 0.0f
                       ? tune_time(m, coll, a, p, bytes, tune_channels(m, a, p, bytes))
                       : TUNE_PLUGIN_IGNORE;
  int nch = 0, changed = 0, chose = 0;
  const struct braid_tune_choice model = *out;
  if (tune_plugin_cost(m->plugin, (braid_coll_t)coll, bytes, cost, &nch, &changed) != ncclSuccess) {
    snprintf(note, size, "tuner %s failed: the model's choice", tune_plugin_label(m->plugin));
    return;
  }
  float best = INFINITY;
  for (int a = 0; changed && a < BRAID_ALGO_COUNT; a++)
    for (int p = 0; p < BRAID_PROTO_COUNT; p++) {
      if (!((amask >> a) & 1) || !((pmask >> p) & 1) || m->busbw_ch[coll][a][p] <= 0.0f ||
          !(cost[a][p] >= 0.0f && cost[a][p] < best))
        continue;
      best = cost[a][p];
      chose = 1;
      out->algo = (braid_algo_t)a;
      out->proto = (braid_proto_t)p;
      out->nchannels = tune_channels(m, a, p, bytes);
    }
  if (nch > 0) out->nchannels = BRAID_MAX(1, BRAID_MIN(nch, m->nchannels[out->algo]));
  out->time_us = tune_time(m, coll, out->algo, out->proto, bytes, out->nchannels);
  int len = snprintf(note, size, "tuner %s: %s", tune_plugin_label(m->plugin),
                     !changed ? "the model's choice"
                     : chose  ? "its choice"
                              : "no cost it left is one Braid can run: the model's choice");
  if (chose && len > 0 && (size_t)len < size)
    len += snprintf(note + len, size - (size_t)len, " (the model's: %s/%s)",
                    braid_algo_name(model.algo), braid_proto_name(model.proto));
  if (nch > 0 && len > 0 && (size_t)len < size)
    len += snprintf(note + len, size - (size_t)len, ", %d channels asked", nch);
  if ((m->algo_override[coll] != ~0u || m->proto_override[coll] != ~0u) && len > 0 &&
      (size_t)len < size)
    snprintf(note + len, size - (size_t)len, ", within BRAID_ALGO/BRAID_PROTO");
}

int tune_proto_named_topo(const struct braid_topo* topo, braid_coll_t coll) {
  return coll >= 0 && coll < BRAID_COLL_COUNT && topo->tune.proto_named[coll] != 0;
}

ncclResult_t tune_choose_topo(const struct braid_topo* topo, braid_coll_t coll, size_t bytes,
                              unsigned algo_mask, unsigned proto_mask,
                              struct braid_tune_choice* out) {
  const struct tune_model* m = &topo->tune;
  if (coll < 0 || coll >= BRAID_COLL_COUNT || (algo_mask & ((1u << BRAID_ALGO_COUNT) - 1)) == 0 ||
      (proto_mask & ((1u << BRAID_PROTO_COUNT) - 1)) == 0)
    return braid_err(ncclInternalError,
                     "tune_choose: collective %d with algorithm mask 0x%x, protocol mask 0x%x: "
                     "expected a collective and at least one algorithm and protocol",
                     (int)coll, algo_mask, proto_mask);
  algo_mask &= (1u << BRAID_ALGO_COUNT) - 1;
  proto_mask &= (1u << BRAID_PROTO_COUNT) - 1;
  /* What the caller can run, narrowed by the topology, then by the user's override. */
  unsigned amask =
      tune_narrow(tune_narrow(algo_mask, tune_algo_available(m, coll)), m->algo_override[coll]);
  unsigned pmask =
      tune_narrow(tune_narrow(proto_mask, m->proto_topo_mask), tune_proto_pref(m, coll));
  float best = INFINITY;
  *out = (struct braid_tune_choice){
      .algo = BRAID_ALGO_RING, .proto = BRAID_PROTO_SIMPLE, .nchannels = 1};
  int found = 0;
  for (int a = 0; a < BRAID_ALGO_COUNT; a++) {
    for (int p = 0; p < BRAID_PROTO_COUNT; p++) {
      if (!((amask >> a) & 1) || !((pmask >> p) & 1)) continue;
      int nch = tune_channels(m, a, p, bytes);
      /* Not modelled (e.g. Direct with LL): never better than a modelled one. */
      float t = m->busbw_ch[coll][a][p] > 0.0f ? tune_time(m, coll, a, p, bytes, nch) : INFINITY;
      if (found && !(t < best)) continue;
      found = 1;
      best = t;
      *out = (struct braid_tune_choice){
          .algo = (braid_algo_t)a, .proto = (braid_proto_t)p, .nchannels = nch, .time_us = t};
    }
  }
  char note[192] = "";
  if (m->plugin != NULL && coll != BRAID_COLL_SENDRECV)
    tune_plugin_choose(m, coll, bytes, algo_mask, proto_mask, out, note, sizeof note);
  int nt = m->nthreads_override > 0 ? m->nthreads_override : tune_nthreads(out->proto);
  out->nthreads = BRAID_MIN(BRAID_MAX(nt / 32 * 32, 64), BRAID_MAX_NTHREADS);
  if (braid_log_enabled(BRAID_LOG_INFO, BRAID_LOG_TUNING))
    tune_explain(m, coll, bytes, algo_mask, proto_mask, amask, pmask, out, note);
  return ncclSuccess;
}
