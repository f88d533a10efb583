/*
 * Twin hosts: hosts whose graphs are the same node for node and link for
 * link (bus ids and names aside), with their ranks on the same GPUs. A
 * cluster is usually hundreds of such hosts. The ring search gives a host
 * the answer its twin got (search_ring.c) instead of searching it again,
 * which is what keeps a search over 1,024 hosts well under a second; the
 * answer is the same one a fresh search would find, because the search is
 * deterministic and a twin starts from the same state.
 *
 * Identity is by node index, not by bus id: the search speaks in node
 * indices, so two hosts built from the same XML layout with other bus ids
 * (twohost_b.xml next to ib_nic_node.xml) are twins too.
 */
#include <string.h>

#include "base/utils.h"
#include "graph/topo.h"

/* Folds one value into a running FNV-style hash. */
static uint64_t twin_mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0x100000001b3ULL;
}

static uint64_t twin_float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* A hash of what the search reads from host h. */
static uint64_t twin_shape(const struct braid_topo* topo, int h) {
  const struct topo_host* host = &topo->hosts[h];
  const struct topo_system* sys = host->sys;
  uint64_t s = twin_mix((uint64_t)sys->nnodes, (uint64_t)host->nranks);
  for (int n = 0; n < sys->nnodes; n++) {
    const struct topo_node* node = &sys->nodes[n];
    s = twin_mix(s, (uint64_t)node->type << 32 | (uint32_t)node->nlinks);
    for (int l = 0; l < node->nlinks; l++) {
      s = twin_mix(s, (uint64_t)node->links[l].to << 8 | (uint64_t)node->links[l].type);
      s = twin_mix(s, twin_float_bits(node->links[l].bw));
    }
  }
  for (int i = 0; i < host->nranks; i++) s = twin_mix(s, (uint64_t)topo->rank_gpu[host->ranks[i]]);
  return s;
}

/* Do hosts a and b look alike to the search? (The hash only says they may.) */
static int twin_equal(const struct braid_topo* topo, int a, int b) {
  const struct topo_host *ha = &topo->hosts[a], *hb = &topo->hosts[b];
  const struct topo_system *sa = ha->sys, *sb = hb->sys;
  if (sa->nnodes != sb->nnodes || ha->nranks != hb->nranks || sa->p2p_disabled != sb->p2p_disabled)
    return 0;
  for (int n = 0; n < sa->nnodes; n++) {
    const struct topo_node *x = &sa->nodes[n], *y = &sb->nodes[n];
    if (x->type != y->type || x->nlinks != y->nlinks) return 0;
    for (int l = 0; l < x->nlinks; l++)
      if (x->links[l].to != y->links[l].to || x->links[l].type != y->links[l].type ||
          x->links[l].bw != y->links[l].bw)
        return 0;
  }
  for (int i = 0; i < ha->nranks; i++)
    if (topo->rank_gpu[ha->ranks[i]] != topo->rank_gpu[hb->ranks[i]]) return 0;
  return 1;
}

void topo_hosts_find_twins(struct braid_topo* topo) {
  /* Distinct shapes seen so far, by their first host; few in any real cluster. */
  int firsts[64], nfirsts = 0;
  for (int h = 0; h < topo->nhosts; h++) {
    struct topo_host* host = &topo->hosts[h];
    host->shape = twin_shape(topo, h);
    host->twin = h;
    for (int i = 0; i < nfirsts && host->twin == h; i++)
      if (topo->hosts[firsts[i]].shape == host->shape && twin_equal(topo, firsts[i], h))
        host->twin = firsts[i];
    if (host->twin == h && nfirsts < (int)BRAID_ARRAY_LEN(firsts)) firsts[nfirsts++] = h;
  }
}
