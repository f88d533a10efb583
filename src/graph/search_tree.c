/*
 * Trees. Inside a host the ranks form a chain, in the order of the channel's
 * ring (so the chain starts at the GPU nearest the channel's NIC); across
 * hosts the chain heads form a double binary tree: two binary trees over
 * the hosts in which a host is an inner node of at most one (for an even
 * number of hosts), so that running half of the data on each tree uses
 * every host's links in both directions. Even channels use the first tree,
 * odd channels the second.
 *
 * The binary tree is NCCL's layout, so that trees can be compared with
 * NCCL's logs: position p's lowest set bit b gives its level; its parent
 * is (p ^ b) | (b << 1) (or p ^ b past the end), its children p -/+ b/2.
 * The second tree mirrors the first (p -> n-1-p) for an even n, and shifts
 * it by one (p -> p-1) for an odd n.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utils.h"
#include "graph/topo.h"

void search_btree(int n, int pos, int* up, int* down0, int* down1) {
  int bit;
  *up = *down0 = *down1 = -1;
  if (n <= 1 || pos < 0 || pos >= n) return;
  for (bit = 1; bit < n; bit <<= 1)
    if (bit & pos) break;
  if (pos == 0) {
    *down1 = bit >> 1; /* the root's only child */
    return;
  }
  int u = (pos ^ bit) | (bit << 1);
  *up = u >= n ? (pos ^ bit) : u;
  int low = bit >> 1;
  *down0 = low == 0 ? -1 : pos - low;
  int d1 = low == 0 ? -1 : pos + low;
  while (d1 >= n) {
    low >>= 1;
    d1 = low == 0 ? -1 : pos + low;
  }
  *down1 = d1;
}

/* Maps a position of the transformed tree back (mirror for even n, shift for odd). */
static int search_dtree_back(int n, int x) {
  if (x < 0) return -1;
  return n % 2 == 0 ? n - 1 - x : (x + 1) % n;
}

void search_dtree(int n, int pos, int* up0, int* d00, int* d01, int* up1, int* d10, int* d11) {
  search_btree(n, pos, up0, d00, d01);
  int p = n % 2 == 0 ? n - 1 - pos : (pos - 1 + n) % n;
  int u, a, b;
  search_btree(n, p, &u, &a, &b);
  *up1 = search_dtree_back(n, u);
  *d10 = search_dtree_back(n, a);
  *d11 = search_dtree_back(n, b);
}

/* Fills the tree nodes of channel c; start[h] is where host h's ranks begin in a ring. */
static void search_tree_channel(struct braid_topo* topo, int c, const int* start) {
  struct braid_tree_node* nodes = topo->trees.nodes + (size_t)c * topo->nranks;
  const int* ring = topo->rings.order + (size_t)c * topo->nranks;
  int nh = topo->nhosts;
  for (int r = 0; r < topo->nranks; r++)
    nodes[r] = (struct braid_tree_node){.up = -1, .down = {-1, -1, -1}};
  /* Chains: the ring lists each host's ranks contiguously, host after host. */
  for (int h = 0; h < nh; h++) {
    int n = topo->hosts[h].nranks;
    for (int i = 0; i < n; i++) {
      int r = ring[start[h] + i];
      if (i > 0) nodes[r].up = ring[start[h] + i - 1];
      if (i + 1 < n) nodes[r].down[0] = ring[start[h] + i + 1];
    }
  }
  if (nh == 1) return;
  /* Heads: the first rank of each host's segment. */
  int up0, a0, b0, up1, a1, b1;
  for (int h = 0; h < nh; h++) {
    int head = ring[start[h]];
    search_dtree(nh, h, &up0, &a0, &b0, &up1, &a1, &b1);
    int up = c % 2 == 0 ? up0 : up1, kids[2] = {c % 2 == 0 ? a0 : a1, c % 2 == 0 ? b0 : b1};
    if (up >= 0) nodes[head].up = ring[start[up]];
    int nd = nodes[head].down[0] >= 0 ? 1 : 0;
    for (int k = 0; k < 2; k++)
      if (kids[k] >= 0) nodes[head].down[nd++] = ring[start[kids[k]]];
  }
}

ncclResult_t search_trees(struct braid_topo* topo) {
  ncclResult_t res = ncclSuccess;
  int nch = topo->rings.nchannels, *start = NULL;
  BRAID_TRY(BRAID_CALLOC(&topo->trees.nodes, (size_t)nch * topo->nranks, "tree nodes"));
  BRAID_TRY(BRAID_CALLOC(&start, (size_t)topo->nhosts, "tree search"));
  for (int h = 1; h < topo->nhosts; h++) start[h] = start[h - 1] + topo->hosts[h - 1].nranks;
  topo->trees.nchannels = nch;
  topo->trees.nranks = topo->nranks;
  topo->trees.bw_per_channel = topo->rings.bw_per_channel;
  for (int c = 0; c < nch; c++) search_tree_channel(topo, c, start);
fail:
  free(start);
  return res;
}
