/*
 * Ring search. A ring visits every rank once: inside each host a path
 * through its GPUs, then on to the next host over the network, back to the
 * first. Each ring of speed s charges s GB/s to every directed link it
 * crosses (GPU to GPU routes, NIC to first GPU, last GPU to NIC), so rings
 * that share a PCIe switch or a NIC share its bandwidth.
 *
 * For each speed of tune_search_speeds (fastest first) we pack as many rings
 * as the links allow, up to the channel limit, and keep the speed whose
 * rings carry the most in total; a slower speed must carry noticeably more
 * (tune_table.search_min_gain) to replace a faster one, since fewer, faster
 * rings need fewer connections for the same bandwidth. Inside a host the
 * next GPU is tried in order of path type (NVLink first), then bandwidth,
 * then rank distance, so NVSwitch machines get 0,1,2,...; a depth-first
 * search backtracks when a choice leaves no way to close the ring.
 *
 * Rings are then duplicated until no channel has to carry more than one CTA
 * moves (tune_table.chan_bw_max), within [min, max] channels. The search
 * counts its steps instead of timing itself, so it is bounded and every rank
 * gets the same answer.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "graph/topo.h"

#define RING_EPS 1e-4f

struct ring_search {
  struct braid_topo* topo;
  float speed;
  long budget;     /* DFS steps left to the whole search */
  long seg_budget; /* DFS steps left to the current host segment */
  int max_rings;
  int net_type_max; /* worst path type allowed between a NIC and a GPU (relaxed in steps) */
  int same_rail;    /* BRAID_CROSS_NIC=0: ring k uses only NIC k mod nnets on every host */
  int nrings;
  int* seq; /* [max_rings * nranks]: ring k, host h: local indices at seq + k*nranks + offset[h] */
  int* offset; /* [nhosts] */
  int* net;    /* [max_rings * nhosts]: NET node or -1 */
  float* virt; /* [nhosts]: network bandwidth left on hosts without NICs */
  int* used;   /* [max ranks on a host] */
};

static int ring_path_fits(const struct topo_system* sys, const struct topo_path* p, float s) {
  if (p == NULL || p->type == BRAID_PATH_DIS) return 0;
  for (int i = 0; i < p->nhops; i++)
    if (sys->nodes[p->hops[2 * i]].links[p->hops[2 * i + 1]].avail + RING_EPS < s) return 0;
  return 1;
}

static void ring_path_charge(struct topo_system* sys, const struct topo_path* p, float s) {
  for (int i = 0; p && i < p->nhops; i++)
    sys->nodes[p->hops[2 * i]].links[p->hops[2 * i + 1]].avail -= s;
}

static void ring_reset(struct braid_topo* topo) {
  for (int h = 0; h < topo->nhosts; h++) {
    struct topo_system* sys = topo->hosts[h].sys;
    for (int n = 0; n < sys->nnodes; n++)
      for (int l = 0; l < sys->nodes[n].nlinks; l++)
        sys->nodes[n].links[l].avail = sys->nodes[n].links[l].bw;
  }
}

static const struct topo_path* ring_gpu_path(const struct braid_topo* topo, int h, int a, int b) {
  const struct topo_host* host = &topo->hosts[h];
  return topo_path_get(host->sys, topo->rank_gpu[host->ranks[a]], topo->rank_gpu[host->ranks[b]]);
}

/* The routes the segment of host h in ring k uses, in order; returns how many (<= nranks + 1). */
static int ring_segment_paths(const struct ring_search* st, int k, int h,
                              const struct topo_path** out) {
  const struct braid_topo* topo = st->topo;
  const struct topo_host* host = &topo->hosts[h];
  const int* seq = st->seq + (size_t)k * topo->nranks + st->offset[h];
  int net = st->net[k * topo->nhosts + h], n = 0, last = host->nranks - 1;
  for (int i = 0; i < last; i++) out[n++] = ring_gpu_path(topo, h, seq[i], seq[i + 1]);
  if (topo->nhosts == 1 && last > 0) out[n++] = ring_gpu_path(topo, h, seq[last], seq[0]);
  if (topo->nhosts > 1 && net >= 0) {
    out[n++] = topo_path_get(host->sys, net, topo->rank_gpu[host->ranks[seq[0]]]);
    out[n++] = topo_path_get(host->sys, topo->rank_gpu[host->ranks[seq[last]]], net);
  }
  return n;
}

/* Charges (sign 1) or refunds (sign -1) the segment of host h in ring k. */
static void ring_segment_charge(struct ring_search* st, int k, int h, float sign) {
  struct braid_topo* topo = st->topo;
  const struct topo_path* paths[BRAID_MAX_RANKS_PER_HOST + 1];
  int n = ring_segment_paths(st, k, h, paths);
  for (int i = 0; i < n; i++) ring_path_charge(topo->hosts[h].sys, paths[i], sign * st->speed);
  if (topo->nhosts > 1 && st->net[k * topo->nhosts + h] < 0) st->virt[h] -= sign * st->speed;
}

/*
 * Host h takes the segment its twin (topo_twin.c) got in ring k: same local
 * order, same NIC index. The twin started from the same state, so it fits;
 * we check anyway and say 0 (search instead) if it does not.
 */
static int ring_copy_twin(struct ring_search* st, int k, int h) {
  struct braid_topo* topo = st->topo;
  int t = topo->hosts[h].twin, n = topo->hosts[h].nranks;
  const struct topo_path* paths[BRAID_MAX_RANKS_PER_HOST + 1];
  int* seq = st->seq + (size_t)k * topo->nranks;
  memcpy(seq + st->offset[h], seq + st->offset[t], sizeof(int) * (size_t)n);
  st->net[k * topo->nhosts + h] = st->net[k * topo->nhosts + t];
  ring_segment_charge(st, k, h, 1.0f);
  int ok = st->virt[h] > -RING_EPS, npaths = ring_segment_paths(st, k, h, paths);
  for (int i = 0; i < npaths && ok; i++)
    for (int j = 0; paths[i] && j < paths[i]->nhops && ok; j++)
      ok = topo->hosts[h].sys->nodes[paths[i]->hops[2 * j]].links[paths[i]->hops[2 * j + 1]].avail >
           -RING_EPS;
  if (!ok) ring_segment_charge(st, k, h, -1.0f);
  return ok;
}

/* Candidate order after local rank `cur`: path type, then bandwidth, then distance. */
static void ring_candidates(const struct ring_search* st, int h, int cur, int* cand, int* ncand) {
  const struct topo_host* host = &st->topo->hosts[h];
  int n = host->nranks;
  *ncand = 0;
  for (int d = 1; d < n; d++) {
    int c = (cur + d) % n;
    if (st->used[c]) continue;
    int i = (*ncand)++;
    const struct topo_path* pc = ring_gpu_path(st->topo, h, cur, c);
    while (i > 0) {
      const struct topo_path* pp = ring_gpu_path(st->topo, h, cur, cand[i - 1]);
      if (pp->type < pc->type || (pp->type == pc->type && pp->bw >= pc->bw)) break;
      cand[i] = cand[i - 1];
      i--;
    }
    cand[i] = c;
  }
}

/* Does the ring step from local rank a to b fit at this speed? -1 on either side is the NIC `net`. */
static int ring_step_fits(const struct ring_search* st, int h, int a, int b, int net) {
  const struct topo_host* host = &st->topo->hosts[h];
  const struct topo_path* p;
  if (b >= 0)
    p = a >= 0 ? ring_gpu_path(st->topo, h, a, b)
               : topo_path_get(host->sys, net, st->topo->rank_gpu[host->ranks[b]]);
  else
    p = topo_path_get(host->sys, st->topo->rank_gpu[host->ranks[a]], net);
  if (a < 0 || b < 0)
    return p && p->type <= st->net_type_max && ring_path_fits(host->sys, p, st->speed);
  return ring_path_fits(host->sys, p, st->speed);
}

/* Is there still an unvisited GPU the ring can end on (close the cycle, or leave by `net`)? */
static int ring_can_end(const struct ring_search* st, int h, const int* seq, int net) {
  int n = st->topo->hosts[h].nranks;
  for (int u = 0; u < n; u++)
    if (!st->used[u] && (net >= 0 ? ring_step_fits(st, h, u, -1, net)
                                  : st->topo->nhosts > 1 || ring_step_fits(st, h, u, seq[0], -1)))
      return 1;
  return 0;
}

/* Depth-first: extends seq[0..depth) of host h; 1 found (charged), 0 none, -1 budget spent. */
static int ring_dfs(struct ring_search* st, int k, int h, int* seq, int depth) {
  struct braid_topo* topo = st->topo;
  struct topo_host* host = &topo->hosts[h];
  int n = host->nranks, net = st->net[k * topo->nhosts + h];
  int cur = seq[depth - 1];
  if (depth == n) {
    const struct topo_path* close =
        topo->nhosts == 1 ? (n > 1 ? ring_gpu_path(topo, h, cur, seq[0]) : NULL)
        : net >= 0        ? topo_path_get(host->sys, topo->rank_gpu[host->ranks[cur]], net)
                          : NULL;
    if (close && !ring_path_fits(host->sys, close, st->speed)) return 0;
    if (close && net >= 0 && close->type > st->net_type_max) return 0;
    ring_path_charge(host->sys, close, st->speed);
    return 1;
  }
  int cand[BRAID_MAX_RANKS_PER_HOST], ncand;
  if (!ring_can_end(st, h, seq, net)) return 0; /* every order of the rest would fail at the end */
  ring_candidates(st, h, cur, cand, &ncand);
  for (int i = 0; i < ncand; i++) {
    if (--st->budget < 0 || --st->seg_budget < 0) return -1;
    const struct topo_path* p = ring_gpu_path(topo, h, cur, cand[i]);
    if (!ring_path_fits(host->sys, p, st->speed)) continue;
    ring_path_charge(host->sys, p, st->speed);
    st->used[cand[i]] = 1;
    seq[depth] = cand[i];
    int r = ring_dfs(st, k, h, seq, depth + 1);
    if (r == 1) return 1;
    st->used[cand[i]] = 0;
    ring_path_charge(host->sys, p, -st->speed);
    if (r < 0) return -1;
  }
  return 0;
}

/* Tries to start ring k on host h at local rank `first` (through `net` when multi-host). */
static int ring_try_start(struct ring_search* st, int k, int h, int first, int net) {
  struct braid_topo* topo = st->topo;
  struct topo_host* host = &topo->hosts[h];
  int* seq = st->seq + (size_t)k * topo->nranks + st->offset[h];
  const struct topo_path* in =
      net >= 0 ? topo_path_get(host->sys, net, topo->rank_gpu[host->ranks[first]]) : NULL;
  if (in && (!ring_path_fits(host->sys, in, st->speed) || in->type > st->net_type_max)) return 0;
  ring_path_charge(host->sys, in, st->speed);
  memset(st->used, 0, sizeof(int) * (size_t)host->nranks);
  st->used[first] = 1;
  seq[0] = first;
  st->net[k * topo->nhosts + h] = net;
  int r = ring_dfs(st, k, h, seq, 1);
  if (r != 1) ring_path_charge(host->sys, in, -st->speed);
  return r;
}

/* Marks every local rank reachable from the marked ones (forward) or reaching them (backward). */
static void ring_reach(const struct ring_search* st, int h, int net, int forward, char* mark) {
  int n = st->topo->hosts[h].nranks, grown = 1;
  while (grown) {
    grown = 0;
    for (int a = 0; a < n; a++)
      for (int b = 0; b < n; b++)
        if (a != b && mark[a] && !mark[b] &&
            (forward ? ring_step_fits(st, h, a, b, net) : ring_step_fits(st, h, b, a, net)))
          mark[b] = 1, grown = 1;
  }
}

/*
 * A necessary condition for a segment at this speed, checked before the
 * depth-first search: every GPU is reachable from where the ring may enter
 * and can reach where it may leave, each step fitting on its own. It turns
 * hopeless speeds (a socket link too slow for any ring) into an O(n^2)
 * answer instead of a search through n! orders.
 */
static int ring_feasible(const struct ring_search* st, int h, int net) {
  int n = st->topo->hosts[h].nranks;
  char in[BRAID_MAX_RANKS_PER_HOST] = {0}, out[BRAID_MAX_RANKS_PER_HOST] = {0};
  for (int a = 0; a < n; a++) {
    in[a] = net >= 0 ? ring_step_fits(st, h, -1, a, net) : a == 0;
    out[a] = net >= 0 ? ring_step_fits(st, h, a, -1, net) : a == 0;
  }
  ring_reach(st, h, net, 1, in);
  ring_reach(st, h, net, 0, out);
  for (int a = 0; a < n; a++)
    if (!in[a] || !out[a]) return 0;
  return 1;
}

/* The segment of ring k on host h: 1 found, 0 none, -1 budget spent. */
static int ring_find_segment(struct ring_search* st, int k, int h) {
  struct braid_topo* topo = st->topo;
  struct topo_host* host = &topo->hosts[h];
  int nnets = topo_system_count(host->sys, TOPO_NET);
  st->seg_budget = tune_table.search_segment_budget;
  if (host->twin != h && ring_copy_twin(st, k, h)) return 1;
  if (topo->nhosts == 1 || nnets == 0) {
    if (topo->nhosts > 1 && st->virt[h] + RING_EPS < st->speed) return 0;
    if (!ring_feasible(st, h, -1)) return 0;
    int r = ring_try_start(st, k, h, 0, -1);
    if (r == 1 && topo->nhosts > 1) st->virt[h] -= st->speed;
    return r < 0 ? (st->budget < 0 ? -1 : 0) : r;
  }
  /* Spread rings over the NICs: ring k starts its NIC search at NIC k mod nnets, the same
     index (rail) on every host; BRAID_CROSS_NIC=0 allows no other. */
  for (int j = 0; j < (st->same_rail ? 1 : nnets); j++) {
    int net = topo_system_nth(host->sys, TOPO_NET, (k + j) % nnets);
    if (!ring_feasible(st, h, net)) continue;
    int order[BRAID_MAX_RANKS_PER_HOST], n = host->nranks;
    for (int i = 0; i < n; i++) order[i] = i;
    /* First GPU: the one closest to this NIC. */
    for (int i = 1; i < n; i++) {
      for (int m = i; m > 0; m--) {
        const struct topo_path* a =
            topo_path_get(host->sys, net, topo->rank_gpu[host->ranks[order[m - 1]]]);
        const struct topo_path* b =
            topo_path_get(host->sys, net, topo->rank_gpu[host->ranks[order[m]]]);
        if (a->type < b->type || (a->type == b->type && a->bw >= b->bw)) break;
        int t = order[m];
        order[m] = order[m - 1];
        order[m - 1] = t;
      }
    }
    for (int i = 0; i < n; i++) {
      int r = ring_try_start(st, k, h, order[i], net);
      if (r < 0) return st->budget < 0 ? -1 : 0; /* this segment took too long: give up on it */
      if (r == 1) return 1;
    }
  }
  return 0;
}

/* Packs rings at st->speed; returns how many. */
static int ring_pack(struct ring_search* st) {
  struct braid_topo* topo = st->topo;
  ring_reset(topo);
  for (int h = 0; h < topo->nhosts; h++) st->virt[h] = tune_table.net_default_bw;
  st->nrings = 0;
  for (int k = 0; k < st->max_rings; k++) {
    int h, r = 1;
    for (h = 0; h < topo->nhosts && r == 1; h++) r = ring_find_segment(st, k, h);
    if (r != 1) {
      for (int g = 0; g < h - 1; g++) ring_segment_charge(st, k, g, -1.0f);
      break;
    }
    st->nrings++;
  }
  return st->nrings;
}

/* The most loaded link under the chosen rings, for the explanation. */
static void ring_bottleneck(struct ring_search* st, char* out, size_t size) {
  struct braid_topo* topo = st->topo;
  float worst = 0.0f;
  int wh = -1, wn = -1, wl = -1;
  ring_reset(topo);
  for (int h = 0; h < topo->nhosts; h++) st->virt[h] = tune_table.net_default_bw;
  for (int k = 0; k < st->nrings; k++)
    for (int h = 0; h < topo->nhosts; h++) ring_segment_charge(st, k, h, 1.0f);
  for (int h = 0; h < topo->nhosts; h++) {
    const struct topo_system* sys = topo->hosts[h].sys;
    for (int n = 0; n < sys->nnodes; n++) {
      for (int l = 0; l < sys->nodes[n].nlinks; l++) {
        const struct topo_link* link = &sys->nodes[n].links[l];
        float load = link->bw > 0.0f ? (link->bw - link->avail) / link->bw : 0.0f;
        if (load > worst + RING_EPS) {
          worst = load;
          wh = h, wn = n, wl = l;
        }
      }
    }
  }
  for (int h = 0; topo->nhosts > 1 && h < topo->nhosts; h++) {
    float load = (tune_table.net_default_bw - st->virt[h]) / tune_table.net_default_bw;
    if (topo_system_count(topo->hosts[h].sys, TOPO_NET) == 0 && load > worst + RING_EPS) {
      snprintf(out, size, "the network of host %d, which has no known NIC (%.2f GB/s assumed)", h,
               tune_table.net_default_bw);
      return;
    }
  }
  if (wh < 0) {
    snprintf(out, size, "nothing (one rank per ring)");
    return;
  }
  const struct topo_system* sys = topo->hosts[wh].sys;
  const struct topo_link* link = &sys->nodes[wn].links[wl];
  char a[64], b[64];
  topo_node_label(sys, wn, a, sizeof a);
  topo_node_label(sys, link->to, b, sizeof b);
  snprintf(out, size, "%s %s->%s %.1f GB/s, %.0f%% used", topo_link_type_name(link->type), a, b,
           link->bw, 100.0 * worst);
}

/* Worst path types inside hosts and to the NICs, for the graph dump and the tuning model. */
static void ring_types(struct ring_search* st) {
  struct braid_topo* topo = st->topo;
  int inter = BRAID_PATH_LOC;
  topo->ring_intra_type = BRAID_PATH_LOC;
  for (int k = 0; k < st->nrings; k++) {
    for (int h = 0; h < topo->nhosts; h++) {
      const struct topo_host* host = &topo->hosts[h];
      const int* seq = st->seq + (size_t)k * topo->nranks + st->offset[h];
      for (int i = 0; i + 1 < host->nranks; i++)
        topo->ring_intra_type =
            BRAID_MAX(topo->ring_intra_type, ring_gpu_path(topo, h, seq[i], seq[i + 1])->type);
      if (topo->nhosts == 1 && host->nranks > 1)
        topo->ring_intra_type = BRAID_MAX(
            topo->ring_intra_type, ring_gpu_path(topo, h, seq[host->nranks - 1], seq[0])->type);
      int net = st->net[k * topo->nhosts + h];
      if (topo->nhosts == 1) continue;
      if (net < 0) {
        inter = BRAID_MAX(inter, BRAID_PATH_SYS); /* no NIC known: through host memory */
        continue;
      }
      inter = BRAID_MAX(inter,
                        topo_path_get(host->sys, net, topo->rank_gpu[host->ranks[seq[0]]])->type);
      inter = BRAID_MAX(
          inter,
          topo_path_get(host->sys, topo->rank_gpu[host->ranks[seq[host->nranks - 1]]], net)->type);
    }
  }
  topo->ring_inter_type = inter;
}

static int ring_all_same(const struct ring_search* st) {
  const struct braid_topo* topo = st->topo;
  for (int k = 1; k < st->nrings; k++) {
    if (memcmp(st->seq, st->seq + (size_t)k * topo->nranks, sizeof(int) * (size_t)topo->nranks) !=
            0 ||
        memcmp(st->net, st->net + (size_t)k * topo->nhosts, sizeof(int) * (size_t)topo->nhosts) !=
            0)
      return 0;
  }
  return 1;
}

/* Writes rings k = 0..nrings-1 into topo->rings, duplicated to the channel count. */
static ncclResult_t ring_store(struct ring_search* st) {
  ncclResult_t res = ncclSuccess;
  struct braid_topo* topo = st->topo;
  int nranks = topo->nranks, nrings = st->nrings;
  float total = (float)nrings * st->speed;
  int nch = BRAID_MAX(nrings, (int)ceilf(total / tune_table.chan_bw_max - 1e-3f));
  if (topo->nhosts > 1) nch = BRAID_MAX(nch, tune_table.net_min_channels);
  nch = BRAID_MAX(BRAID_MIN(nch, topo->max_channels), topo->min_channels);
  /* Distinct rings get equal shares of the channels; identical ones (NVSwitch) need not. */
  if (!ring_all_same(st) && nch > nrings && nch % nrings != 0 &&
      nch - nch % nrings >= topo->min_channels)
    nch -= nch % nrings;
  BRAID_TRY(BRAID_CALLOC(&topo->rings.order, (size_t)nch * nranks, "ring orders"));
  BRAID_TRY(BRAID_CALLOC(&topo->ring_nets, (size_t)nch * topo->nhosts, "ring NICs"));
  for (int c = 0; c < nch; c++) {
    int k = c % nrings, pos = 0;
    for (int h = 0; h < topo->nhosts; h++) {
      const struct topo_host* host = &topo->hosts[h];
      for (int i = 0; i < host->nranks; i++)
        topo->rings.order[c * nranks + pos++] =
            host->ranks[st->seq[(size_t)k * nranks + st->offset[h] + i]];
      topo->ring_nets[c * topo->nhosts + h].net = st->net[k * topo->nhosts + h];
    }
  }
  topo->rings.nchannels = nch;
  topo->rings.nranks = nranks;
  topo->rings.bw_per_channel = BRAID_MIN(total / (float)nch, tune_table.chan_bw_max);
fail:
  return res;
}

/* Rank order, one ring, at whatever its slowest hop allows: when nothing else fits. */
static void ring_fallback(struct ring_search* st) {
  struct braid_topo* topo = st->topo;
  float bw = tune_table.loc_bw;
  for (int h = 0; h < topo->nhosts; h++) {
    const struct topo_host* host = &topo->hosts[h];
    for (int i = 0; i < host->nranks; i++) {
      st->seq[st->offset[h] + i] = i;
      if (i > 0) bw = BRAID_MIN(bw, ring_gpu_path(topo, h, i - 1, i)->bw);
    }
    st->net[h] = topo_system_nth(host->sys, TOPO_NET, 0);
  }
  if (topo->nhosts > 1) bw = BRAID_MIN(bw, tune_table.net_default_bw);
  st->nrings = 1;
  st->speed = BRAID_MAX(bw, 0.1f);
}

/* Tries every speed, keeps the best packing in best_seq/best_net. */
static void ring_search_speeds(struct ring_search* st, int* best_seq, int* best_net,
                               float* best_speed, int* best_n) {
  struct braid_topo* topo = st->topo;
  float best = 0.0f;
  *best_n = 0;
  for (int i = 0; tune_search_speeds[i] > 0.0f && st->budget >= 0; i++) {
    st->speed = tune_search_speeds[i];
    if (best > 0.0f && st->speed * (float)st->max_rings <= best + RING_EPS) break;
    int n = ring_pack(st);
    if (n > 0 && (float)n * st->speed > best * tune_table.search_min_gain + RING_EPS) {
      best = (float)n * st->speed;
      *best_n = n;
      *best_speed = st->speed;
      memcpy(best_seq, st->seq, sizeof(int) * (size_t)n * topo->nranks);
      memcpy(best_net, st->net, sizeof(int) * (size_t)n * topo->nhosts);
    }
  }
}

ncclResult_t search_rings(struct braid_topo* topo) {
  ncclResult_t res = ncclSuccess;
  struct ring_search st = {.topo = topo, .budget = tune_table.search_budget,
                           .same_rail = braid_param_int(BRAID_P_CROSS_NIC) == 0};
  int *best_seq = NULL, *best_net = NULL, best_n = 0, maxn = 1;
  float best_speed = 0.0f;
  char bottleneck[192];
  st.max_rings = topo->max_channels;
  for (int h = 0; h < topo->nhosts; h++) maxn = BRAID_MAX(maxn, topo->hosts[h].nranks);
  BRAID_TRY(BRAID_CALLOC(&st.seq, (size_t)st.max_rings * topo->nranks, "ring search"));
  BRAID_TRY(BRAID_CALLOC(&st.net, (size_t)st.max_rings * topo->nhosts, "ring search"));
  BRAID_TRY(BRAID_CALLOC(&st.offset, (size_t)topo->nhosts, "ring search"));
  BRAID_TRY(BRAID_CALLOC(&st.virt, (size_t)topo->nhosts, "ring search"));
  BRAID_TRY(BRAID_CALLOC(&st.used, (size_t)maxn, "ring search"));
  BRAID_TRY(BRAID_CALLOC(&best_seq, (size_t)st.max_rings * topo->nranks, "ring search"));
  BRAID_TRY(BRAID_CALLOC(&best_net, (size_t)st.max_rings * topo->nhosts, "ring search"));
  for (int h = 1; h < topo->nhosts; h++)
    st.offset[h] = st.offset[h - 1] + topo->hosts[h - 1].nranks;
  /*
   * Across hosts, first only NICs behind the GPUs' own PCIe switches (what
   * GPUDirect RDMA wants), then through the CPU, then across sockets: a few
   * fast, well-placed rings beat many slow ones through the host.
   */
  static const int net_types[] = {BRAID_PATH_PXB, BRAID_PATH_PHB, BRAID_PATH_SYS};
  for (size_t i = 0; i < BRAID_ARRAY_LEN(net_types) && topo->nranks > 1 && best_n == 0; i++) {
    st.net_type_max = net_types[i];
    ring_search_speeds(&st, best_seq, best_net, &best_speed, &best_n);
    if (topo->nhosts == 1) break;
  }
  if (best_n > 0) {
    st.nrings = best_n;
    st.speed = best_speed;
    memcpy(st.seq, best_seq, sizeof(int) * (size_t)best_n * topo->nranks);
    memcpy(st.net, best_net, sizeof(int) * (size_t)best_n * topo->nhosts);
  } else {
    ring_fallback(&st);
  }
  ring_types(&st);
  ring_bottleneck(&st, bottleneck, sizeof bottleneck);
  ring_reset(topo);
  BRAID_TRY(ring_store(&st));
  /* NVSwitch nodes get the same order every time; say so rather than call them distinct. */
  const char* kind = st.nrings == 1 ? "" : ring_all_same(&st) ? "identical " : "distinct ";
  int len = snprintf(
      topo->search_why, sizeof topo->search_why,
      "%s%d %sring%s of %.1f GB/s fit (%.1f GB/s in all; busiest link: %s); "
      "%d channels of %.1f GB/s (one channel moves up to %.0f GB/s)",
      best_n > 0 ? "" : "no ring fits within the search budget, using rank order: ", st.nrings,
      kind, st.nrings == 1 ? "" : "s", st.speed, st.speed * (float)st.nrings, bottleneck,
      topo->rings.nchannels, topo->rings.bw_per_channel, tune_table.chan_bw_max);
  (void)len; /* a long explanation is cut, which is fine */
  if (topo->nranks == 1)
    snprintf(topo->search_why, sizeof topo->search_why, "a single rank: nothing to connect");
  INFO(BRAID_LOG_GRAPH, "rings: %s (search took %ld steps)", topo->search_why,
       (long)tune_table.search_budget - st.budget);
fail:
  free(st.seq);
  free(st.net);
  free(st.offset);
  free(st.virt);
  free(st.used);
  free(best_seq);
  free(best_net);
  return res;
}
