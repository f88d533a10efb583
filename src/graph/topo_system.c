/*
 * The graph of one node: creating nodes and directed links, finding them,
 * and naming them for logs and reports. Nodes live in one array so a node
 * is an index, which keeps paths and search state plain integers.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utils.h"
#include "graph/topo.h"

/*
 * Far beyond any machine; they bound what a topology file can ask for. Sockets are joined
 * pairwise and each is a path source, so their count costs the most (a file of 2000 CPUs took
 * 34 s to load).
 */
#define TOPO_MAX_NODES 1024
#define TOPO_MAX_CPUS 64

ncclResult_t topo_system_create(const char* source, struct topo_system** out) {
  ncclResult_t res = ncclSuccess;
  struct topo_system* sys = NULL;
  BRAID_TRY(BRAID_CALLOC(&sys, 1, "a topology system"));
  snprintf(sys->source, sizeof sys->source, "%s", source ? source : "(memory)");
  *out = sys;
fail:
  return res;
}

static void topo_paths_free(struct topo_system* sys) {
  if (sys->paths == NULL) return;
  for (int i = 0; i < sys->nnodes * sys->nnodes; i++) free(sys->paths[i].hops);
  free(sys->paths);
  sys->paths = NULL;
}

void topo_system_free(struct topo_system* sys) {
  if (sys == NULL) return;
  topo_paths_free(sys);
  for (int i = 0; i < sys->nnodes; i++) free(sys->nodes[i].links);
  free(sys->nodes);
  free(sys);
}

ncclResult_t topo_node_add(struct topo_system* sys, int type, int64_t id, int* index) {
  if (sys->nnodes >= TOPO_MAX_NODES)
    return braid_err(ncclInvalidUsage, "%s: more than %d devices in one node: expected fewer",
                     sys->source, TOPO_MAX_NODES);
  if (type == TOPO_CPU) {
    int ncpus = 0;
    for (int i = 0; i < sys->nnodes; i++) ncpus += sys->nodes[i].type == TOPO_CPU;
    if (ncpus >= TOPO_MAX_CPUS)
      return braid_err(ncclInvalidUsage,
                       "%s: more than %d CPU sockets (NUMA nodes) in one node: expected fewer",
                       sys->source, TOPO_MAX_CPUS);
  }
  if (sys->nnodes == sys->cap_nodes) {
    int cap = sys->cap_nodes ? sys->cap_nodes * 2 : 32;
    struct topo_node* n = realloc(sys->nodes, (size_t)cap * sizeof *n);
    if (n == NULL) return braid_err(ncclSystemError, "out of memory growing the topology graph");
    sys->nodes = n;
    sys->cap_nodes = cap;
  }
  topo_paths_free(sys); /* paths index by node count: a new node invalidates them */
  struct topo_node* node = &sys->nodes[sys->nnodes];
  memset(node, 0, sizeof *node);
  node->type = type;
  node->id = id;
  *index = sys->nnodes++;
  return ncclSuccess;
}

int topo_node_find(const struct topo_system* sys, int type, int64_t id) {
  for (int i = 0; i < sys->nnodes; i++)
    if (sys->nodes[i].type == type && sys->nodes[i].id == id) return i;
  return -1;
}

ncclResult_t topo_link_add(struct topo_system* sys, int a, int b, int type, float bw) {
  struct topo_node* node = &sys->nodes[a];
  for (int l = 0; l < node->nlinks; l++) {
    if (node->links[l].to == b && node->links[l].type == type) {
      node->links[l].bw += bw;
      node->links[l].avail = node->links[l].bw;
      return ncclSuccess;
    }
  }
  if (node->nlinks == node->cap_links) {
    int cap = node->cap_links ? node->cap_links * 2 : 4;
    struct topo_link* l = realloc(node->links, (size_t)cap * sizeof *l);
    if (l == NULL) return braid_err(ncclSystemError, "out of memory adding a topology link");
    node->links = l;
    node->cap_links = cap;
  }
  node->links[node->nlinks++] = (struct topo_link){.to = b, .type = type, .bw = bw, .avail = bw};
  return ncclSuccess;
}

ncclResult_t topo_link_add_both(struct topo_system* sys, int a, int b, int type, float bw) {
  ncclResult_t res = ncclSuccess;
  BRAID_TRY(topo_link_add(sys, a, b, type, bw));
  BRAID_TRY(topo_link_add(sys, b, a, type, bw));
fail:
  return res;
}

int topo_system_count(const struct topo_system* sys, int type) {
  int n = 0;
  for (int i = 0; i < sys->nnodes; i++) n += sys->nodes[i].type == type;
  return n;
}

int topo_system_nth(const struct topo_system* sys, int type, int n) {
  for (int i = 0; i < sys->nnodes; i++)
    if (sys->nodes[i].type == type && n-- == 0) return i;
  return -1;
}

const char* topo_node_type_name(int type) {
  static const char* names[] = {"GPU", "PCI", "NVS", "CPU", "NIC", "NET"};
  return type >= 0 && type < TOPO_NODE_TYPES ? names[type] : "?";
}

const char* topo_link_type_name(int type) {
  switch (type) {
    case TOPO_LINK_LOC:
      return "LOC";
    case TOPO_LINK_NVL:
      return "NVL";
    case TOPO_LINK_PCI:
      return "PCI";
    case TOPO_LINK_SYS:
      return "SYS";
    case TOPO_LINK_NET:
      return "NET";
    default:
      return "?";
  }
}

void topo_node_label(const struct topo_system* sys, int index, char* out, size_t size) {
  const struct topo_node* n = &sys->nodes[index];
  char busid[32];
  if (n->type == TOPO_NIC && n->id < 0) { /* a NIC NCCL hangs directly on a CPU element */
    snprintf(out, size, "NIC/on-CPU/%lld", (long long)(-1000 - n->id));
    return;
  }
  switch (n->type) {
    case TOPO_GPU:
    case TOPO_PCI:
    case TOPO_NIC:
      braid_busid_to_str(n->id, busid, sizeof busid);
      snprintf(out, size, "%s/%s", topo_node_type_name(n->type), busid);
      break;
    case TOPO_NET:
      snprintf(out, size, "NET/%s", n->u.net.name);
      break;
    default:
      snprintf(out, size, "%s/%lld", topo_node_type_name(n->type), (long long)n->id);
      break;
  }
}
