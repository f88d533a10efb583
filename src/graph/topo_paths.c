/*
 * Routes inside one node. From every GPU and every network port we find,
 * for every other node, the route with the highest bottleneck bandwidth
 * (ties: fewest hops, then lowest node index, so every rank finds the same
 * route), then classify it the way NCCL does:
 *
 *   NVL  NVLink only, directly or through the NVSwitch fabric
 *   NVB  NVLink only, through another GPU
 *   PIX  at most one PCIe switch          PXB  several switches, no CPU
 *   PHB  through a CPU's host bridge      SYS  across the CPU interconnect
 *
 * A GPU forwards only NVLink to NVLink (it is not a PCIe switch); a NIC only
 * joins its PCI link to its own ports; a network port ends a route. The
 * NIC-to-port hop is the adapter itself and adds nothing to the type.
 *
 * With peer-to-peer disabled (BRAID_P2P_DISABLE) GPUs exchange data through
 * host memory, so a GPU-to-GPU route is the route to the sender's nearest
 * CPU followed by the route from there to the receiver (at least PHB).
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utils.h"
#include "graph/topo.h"

struct path_label {
  float bw;
  int hops;
  int prev;      /* previous node, -1 at the source */
  int prev_link; /* link index in `prev` */
  int done;
};

/* May a route enter `node` by a link of type `in` and leave it by one of type `out`? */
static int topo_path_may_cross(const struct topo_node* node, int in, int out) {
  switch (node->type) {
    case TOPO_GPU:
      return in == TOPO_LINK_NVL && out == TOPO_LINK_NVL;
    case TOPO_NIC:
      return (in == TOPO_LINK_NET) != (out == TOPO_LINK_NET);
    case TOPO_NET:
      return 0;
    default:
      return 1;
  }
}

/* The label to settle next: widest, then shortest, then lowest index. */
static int topo_path_next(const struct path_label* lab, int n) {
  int best = -1;
  for (int i = 0; i < n; i++) {
    if (lab[i].done || lab[i].bw <= 0.0f) continue;
    if (best < 0 || lab[i].bw > lab[best].bw ||
        (lab[i].bw == lab[best].bw && lab[i].hops < lab[best].hops))
      best = i;
  }
  return best;
}

static void topo_path_search(const struct topo_system* sys, int src, struct path_label* lab) {
  int n = sys->nnodes;
  for (int i = 0; i < n; i++) lab[i] = (struct path_label){0.0f, 0, -1, -1, 0};
  lab[src].bw = tune_table.loc_bw;
  for (int u; (u = topo_path_next(lab, n)) >= 0;) {
    lab[u].done = 1;
    const struct topo_node* node = &sys->nodes[u];
    int in = u == src ? -1 : sys->nodes[lab[u].prev].links[lab[u].prev_link].type;
    for (int l = 0; l < node->nlinks; l++) {
      const struct topo_link* link = &node->links[l];
      if (u != src && !topo_path_may_cross(node, in, link->type)) continue;
      struct path_label* v = &lab[link->to];
      if (v->done) continue;
      float bw = BRAID_MIN(lab[u].bw, link->bw);
      int hops = lab[u].hops + 1;
      if (bw > v->bw || (bw == v->bw && bw > 0.0f && hops < v->hops)) {
        v->bw = bw;
        v->hops = hops;
        v->prev = u;
        v->prev_link = l;
      }
    }
  }
}

/* Path type of the route in `hops` (see the top of this file). */
static int topo_path_classify(const struct topo_system* sys, const int* hops, int nhops) {
  int type = BRAID_PATH_LOC, switches = 0;
  for (int i = 0; i < nhops; i++) {
    int u = hops[2 * i];
    const struct topo_link* link = &sys->nodes[u].links[hops[2 * i + 1]];
    int v = link->to;
    int t = link->type == TOPO_LINK_NET ? BRAID_PATH_LOC : link->type;
    if (link->type == TOPO_LINK_PCI &&
        (sys->nodes[u].type == TOPO_CPU || sys->nodes[v].type == TOPO_CPU))
      t = BRAID_PATH_PHB;
    if (i + 1 < nhops && sys->nodes[v].type == TOPO_GPU) t = BRAID_MAX(t, BRAID_PATH_NVB);
    if (i + 1 < nhops && sys->nodes[v].type == TOPO_PCI) switches++;
    type = BRAID_MAX(type, t);
  }
  if (switches >= 2 && type < BRAID_PATH_PXB) type = BRAID_PATH_PXB;
  return type;
}

/* Stores the routes from `src` to every node. */
static ncclResult_t topo_path_store(struct topo_system* sys, int src,
                                    const struct path_label* lab) {
  int n = sys->nnodes;
  for (int dst = 0; dst < n; dst++) {
    struct topo_path* p = &sys->paths[src * n + dst];
    if (dst == src) {
      *p = (struct topo_path){.type = BRAID_PATH_LOC, .bw = tune_table.loc_bw, .nhops = 0};
      continue;
    }
    if (lab[dst].bw <= 0.0f) {
      *p = (struct topo_path){.type = BRAID_PATH_DIS, .bw = 0.0f, .nhops = 0};
      continue;
    }
    int nhops = lab[dst].hops;
    int* hops = malloc((size_t)nhops * 2 * sizeof(int));
    if (hops == NULL) return braid_err(ncclSystemError, "out of memory storing topology paths");
    for (int v = dst, i = nhops - 1; i >= 0; v = lab[v].prev, i--) {
      hops[2 * i] = lab[v].prev;
      hops[2 * i + 1] = lab[v].prev_link;
    }
    *p = (struct topo_path){.bw = lab[dst].bw, .nhops = nhops, .hops = hops};
    p->type = topo_path_classify(sys, hops, nhops);
  }
  return ncclSuccess;
}

/* The CPU `gpu` reaches best (its own socket). */
static int topo_paths_nearest_cpu(const struct topo_system* sys, int gpu) {
  int best = -1;
  for (int c = 0; c < sys->nnodes; c++) {
    if (sys->nodes[c].type != TOPO_CPU) continue;
    const struct topo_path* p = &sys->paths[gpu * sys->nnodes + c];
    const struct topo_path* b = best >= 0 ? &sys->paths[gpu * sys->nnodes + best] : NULL;
    if (p->nhops > 0 && (b == NULL || p->bw > b->bw || (p->bw == b->bw && p->nhops < b->nhops)))
      best = c;
  }
  return best;
}

/* Replaces every GPU-to-GPU route by GPU -> nearest CPU -> GPU. */
static ncclResult_t topo_paths_via_cpu(struct topo_system* sys) {
  int n = sys->nnodes;
  for (int a = 0; a < n; a++) {
    if (sys->nodes[a].type != TOPO_GPU) continue;
    int cpu = topo_paths_nearest_cpu(sys, a);
    if (cpu < 0) continue;
    const struct topo_path* up = &sys->paths[a * n + cpu];
    for (int b = 0; b < n; b++) {
      const struct topo_path* down = &sys->paths[cpu * n + b];
      if (b == a || sys->nodes[b].type != TOPO_GPU || down->nhops <= 0) continue;
      int nhops = up->nhops + down->nhops;
      int* hops = malloc((size_t)nhops * 2 * sizeof(int));
      if (hops == NULL) return braid_err(ncclSystemError, "out of memory storing topology paths");
      memcpy(hops, up->hops, sizeof(int) * 2 * (size_t)up->nhops);
      memcpy(hops + 2 * up->nhops, down->hops, sizeof(int) * 2 * (size_t)down->nhops);
      struct topo_path* p = &sys->paths[a * n + b];
      free(p->hops);
      *p = (struct topo_path){.bw = BRAID_MIN(up->bw, down->bw), .nhops = nhops, .hops = hops};
      p->type = BRAID_MAX(topo_path_classify(sys, hops, nhops), BRAID_PATH_PHB);
    }
  }
  return ncclSuccess;
}

ncclResult_t topo_paths_compute(struct topo_system* sys) {
  ncclResult_t res = ncclSuccess;
  struct path_label* lab = NULL;
  int n = sys->nnodes;
  if (sys->paths) {
    for (int i = 0; i < n * n; i++) free(sys->paths[i].hops);
    free(sys->paths);
    sys->paths = NULL;
  }
  BRAID_TRY(BRAID_CALLOC(&sys->paths, (size_t)n * (size_t)n, "topology paths"));
  for (int i = 0; i < n * n; i++) sys->paths[i].nhops = -1;
  BRAID_TRY(BRAID_CALLOC(&lab, (size_t)n, "topology path search"));
  for (int src = 0; src < n; src++) {
    int type = sys->nodes[src].type;
    if (type != TOPO_GPU && type != TOPO_NET && type != TOPO_CPU) continue;
    topo_path_search(sys, src, lab);
    BRAID_TRY(topo_path_store(sys, src, lab));
  }
  if (sys->p2p_disabled) BRAID_TRY(topo_paths_via_cpu(sys));
fail:
  free(lab);
  return res;
}

const struct topo_path* topo_path_get(const struct topo_system* sys, int from, int to) {
  if (sys->paths == NULL || from < 0 || to < 0 || from >= sys->nnodes || to >= sys->nnodes)
    return NULL;
  const struct topo_path* p = &sys->paths[from * sys->nnodes + to];
  return p->nhops < 0 ? NULL : p;
}
