/*
 * Read-only questions about a built topology: rings, trees, paths, which NIC
 * a channel uses. They never fail; out-of-range arguments give "none".
 */
#include <stddef.h>
#include <string.h>

#include "base/utils.h"
#include "graph/topo.h"

const struct braid_rings* topo_rings(const struct braid_topo* topo) {
  return topo ? &topo->rings : NULL;
}

const struct braid_trees* topo_trees(const struct braid_topo* topo) {
  return topo ? &topo->trees : NULL;
}

const char* topo_explain(const struct braid_topo* topo) { return topo ? topo->search_why : ""; }

braid_path_type_t topo_path(const struct braid_topo* topo, int a, int b, float* bw) {
  if (bw) *bw = 0.0f;
  if (topo == NULL || a < 0 || b < 0 || a >= topo->nranks || b >= topo->nranks)
    return BRAID_PATH_DIS;
  if (topo->rank_host[a] != topo->rank_host[b]) {
    if (bw) *bw = BRAID_MIN(topo->rank_net_bw[a], topo->rank_net_bw[b]);
    return BRAID_PATH_NET;
  }
  const struct topo_system* sys = topo->hosts[topo->rank_host[a]].sys;
  const struct topo_path* p = topo_path_get(sys, topo->rank_gpu[a], topo->rank_gpu[b]);
  if (p == NULL) return BRAID_PATH_DIS;
  if (bw) *bw = p->bw;
  return (braid_path_type_t)p->type;
}

int topo_channel_net(const struct braid_topo* topo, int channel, int rank, const char** name) {
  if (name) *name = NULL;
  if (topo == NULL || topo->nhosts < 2 || channel < 0 || channel >= topo->rings.nchannels ||
      rank < 0 || rank >= topo->nranks)
    return -1;
  int h = topo->rank_host[rank];
  int net = topo->ring_nets[channel * topo->nhosts + h].net;
  if (net < 0) return -1;
  const struct topo_node* node = &topo->hosts[h].sys->nodes[net];
  if (name) *name = node->u.net.name;
  return node->u.net.dev;
}

braid_path_type_t topo_net_path(const struct braid_topo* topo, int rank, const char* name,
                                float* bw) {
  if (bw) *bw = 0.0f;
  if (topo == NULL || name == NULL || rank < 0 || rank >= topo->nranks) return BRAID_PATH_DIS;
  const struct topo_system* sys = topo->hosts[topo->rank_host[rank]].sys;
  for (int n = 0; n < sys->nnodes; n++) {
    if (sys->nodes[n].type != TOPO_NET || strcmp(sys->nodes[n].u.net.name, name) != 0) continue;
    const struct topo_path* p = topo_path_get(sys, topo->rank_gpu[rank], n);
    if (p == NULL) return BRAID_PATH_DIS;
    if (bw) *bw = p->bw;
    return (braid_path_type_t)p->type;
  }
  return BRAID_PATH_DIS;
}

void topo_ring_neighbors(const struct braid_rings* rings, int channel, int rank, int* prev,
                         int* next) {
  *prev = *next = -1;
  if (rings == NULL || channel < 0 || channel >= rings->nchannels) return;
  const int* order = rings->order + (size_t)channel * rings->nranks;
  for (int i = 0; i < rings->nranks; i++) {
    if (order[i] != rank) continue;
    *prev = order[(i + rings->nranks - 1) % rings->nranks];
    *next = order[(i + 1) % rings->nranks];
    return;
  }
}

const char* topo_path_type_name(braid_path_type_t type) {
  static const char* names[] = {"LOC", "NVL", "NVB", "PIX", "PXB", "PHB", "SYS", "NET", "DIS"};
  return (int)type >= 0 && (int)type <= BRAID_PATH_DIS ? names[type] : "?";
}
