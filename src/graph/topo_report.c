/*
 * braid-info --topo: the machine as Braid sees it, and why it will run the
 * way it does. The node (detected, all visible GPUs being the ranks of one
 * node, or read from a topology file) is built exactly as a communicator
 * would build it, then printed: the device tree, the path matrix, the rings
 * and trees with their bandwidths and the search's explanation, and what
 * the tuning model picks for a few sizes. --dot draws the node for Graphviz.
 * BRAID_TOPO_FILE is read when no file is given, and BRAID_TOPO_DUMP_FILE
 * receives the node's XML, detected or read: on a GPU machine,
 * `BRAID_TOPO_DUMP_FILE=node.xml braid-info --topo` records the machine in
 * the form a VM's BRAID_TOPO_FILE or a unit-test fixture takes.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "graph/topo.h"

static void report_node_line(FILE* out, const struct topo_system* sys, int n, int depth) {
  const struct topo_node* node = &sys->nodes[n];
  char label[64];
  topo_node_label(sys, n, label, sizeof label);
  fprintf(out, "%*s%s", 2 + 2 * depth, "", label);
  switch (node->type) {
    case TOPO_GPU:
      fprintf(out, "  CUDA dev %d, SM %d", node->u.gpu.dev, node->u.gpu.sm);
      if (node->u.gpu.mem_mib) fprintf(out, ", %.0f GiB", (double)node->u.gpu.mem_mib / 1024.0);
      break;
    case TOPO_PCI:
      fprintf(out, "  PCIe switch, %.1f GB/s up", node->u.pci.bw);
      break;
    case TOPO_NET:
      fprintf(out, "  net dev %d, %.1f GB/s%s", node->u.net.dev, node->u.net.bw,
              node->u.net.gdr ? ", GPUDirect RDMA" : "");
      break;
    default:
      break;
  }
  for (int l = 0; node->type == TOPO_GPU && l < node->nlinks; l++) {
    const struct topo_link* link = &node->links[l];
    if (link->type != TOPO_LINK_NVL) continue;
    topo_node_label(sys, link->to, label, sizeof label);
    fprintf(out, "; NVLink %.0f GB/s to %s", link->bw, label);
  }
  fputc('\n', out);
}

/* The PCI tree under a CPU, depth first; `seen` stops at nodes printed already. */
static void report_tree(FILE* out, const struct topo_system* sys, int n, int depth, char* seen) {
  seen[n] = 1;
  report_node_line(out, sys, n, depth);
  const struct topo_node* node = &sys->nodes[n];
  for (int l = 0; l < node->nlinks; l++) {
    const struct topo_link* link = &node->links[l];
    int to = link->to;
    if (seen[to] || sys->nodes[to].type == TOPO_CPU || sys->nodes[to].type == TOPO_NVS) continue;
    if (link->type != TOPO_LINK_PCI && link->type != TOPO_LINK_NET) continue;
    report_tree(out, sys, to, depth + 1, seen);
  }
}

static ncclResult_t report_machine(FILE* out, const struct braid_topo* topo) {
  ncclResult_t res = ncclSuccess;
  const struct topo_system* sys = topo->hosts[0].sys;
  char* seen = NULL;
  BRAID_TRY(BRAID_CALLOC(&seen, (size_t)sys->nnodes, "the report"));
  fprintf(out, "Machine: %s\n", sys->source);
  for (int n = 0; n < sys->nnodes; n++)
    if (sys->nodes[n].type == TOPO_CPU) report_tree(out, sys, n, 0, seen);
  for (int a = 0; a < sys->nnodes; a++)
    for (int l = 0; l < sys->nodes[a].nlinks; l++)
      if (sys->nodes[a].links[l].type == TOPO_LINK_SYS && a < sys->nodes[a].links[l].to)
        fprintf(out, "  CPU/%lld <-> CPU/%lld: %.1f GB/s\n", (long long)sys->nodes[a].id,
                (long long)sys->nodes[sys->nodes[a].links[l].to].id, sys->nodes[a].links[l].bw);
  if (topo_system_count(sys, TOPO_NVS))
    fprintf(out, "  NVSwitch fabric: every NVLink GPU reaches every other through it\n");
fail:
  free(seen);
  return res;
}

static void report_paths(FILE* out, const struct braid_topo* topo) {
  const struct topo_system* sys = topo->hosts[0].sys;
  fprintf(out, "\nPaths between ranks (type, bottleneck GB/s):\n      ");
  for (int b = 0; b < topo->nranks; b++) fprintf(out, " %10d", b);
  fputc('\n', out);
  for (int a = 0; a < topo->nranks; a++) {
    fprintf(out, "  %3d ", a);
    for (int b = 0; b < topo->nranks; b++) {
      float bw;
      braid_path_type_t t = topo_path(topo, a, b, &bw);
      fprintf(out, " %4s %5.0f", topo_path_type_name(t), a == b ? 0.0f : bw);
    }
    fputc('\n', out);
  }
  if (topo_system_count(sys, TOPO_NET) == 0) return;
  fprintf(out, "\nPaths from ranks to network ports:\n");
  for (int a = 0; a < topo->nranks; a++) {
    fprintf(out, "  %3d ", a);
    for (int n = 0; n < sys->nnodes; n++) {
      if (sys->nodes[n].type != TOPO_NET) continue;
      const struct topo_path* p = topo_path_get(sys, topo->rank_gpu[a], n);
      fprintf(out, " %s:%s %.0f", sys->nodes[n].u.net.name,
              topo_path_type_name(p ? (braid_path_type_t)p->type : BRAID_PATH_DIS),
              p ? p->bw : 0.0f);
    }
    fputc('\n', out);
  }
}

static void report_rings_trees(FILE* out, const struct braid_topo* topo) {
  const struct braid_rings* r = &topo->rings;
  const struct braid_trees* t = &topo->trees;
  fprintf(out, "\nRings: %d channels x %.1f GB/s = %.1f GB/s, worst hop %s\n  why: %s\n",
          r->nchannels, r->bw_per_channel, r->bw_per_channel * (float)r->nchannels,
          topo_path_type_name(topo->ring_intra_type), topo->search_why);
  for (int c = 0; c < r->nchannels; c++) {
    if (c > 0 &&
        memcmp(r->order, r->order + (size_t)c * r->nranks, sizeof(int) * (size_t)r->nranks) == 0)
      continue; /* print each distinct ring once */
    fprintf(out, "  channel %2d:", c);
    for (int i = 0; i < r->nranks; i++) fprintf(out, " %d", r->order[c * r->nranks + i]);
    fputc('\n', out);
  }
  fprintf(out, "Trees: %d channels x %.1f GB/s; channel 0 (rank: up / down):\n", t->nchannels,
          t->bw_per_channel);
  for (int i = 0; i < t->nranks && t->nchannels > 0; i++) {
    const struct braid_tree_node* n = &t->nodes[i];
    fprintf(out, "  %3d: %3d / %d %d %d\n", i, n->up, n->down[0], n->down[1], n->down[2]);
  }
}

/* "8 B", "64 KiB", "2 MiB": a power of two as a size. */
static void report_size(char* buf, size_t len, size_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    u++;
  }
  snprintf(buf, len, "%zu %s", bytes, units[u]);
}

/*
 * Where the model's choice changes, at every power of two from 8 B to 2 GiB: one line per
 * collective, each algorithm/protocol with the sizes it takes, e.g.
 * "Ring/LL 8 B - 2 MiB, Ring/Simple 4 MiB - 2 GiB".
 */
static void report_switch_points(FILE* out, const struct braid_topo* topo, const int* colls,
                                 size_t ncolls) {
  fprintf(out, "Choices by size (powers of two, 8 B - 2 GiB):\n");
  for (size_t c = 0; c < ncolls; c++) {
    char line[512], lo[32], hi[32];
    int len = snprintf(line, sizeof line, "  %-13s", braid_coll_name(colls[c]));
    struct braid_tune_choice run = {0}, now;
    size_t first = 0, last = 0;
    for (size_t bytes = 8;; bytes *= 2) {
      int end = bytes > ((size_t)2 << 30);
      if (!end && tune_choose_topo(topo, colls[c], bytes, ~0u, ~0u, &now) != ncclSuccess) return;
      if (first != 0 && (end || now.algo != run.algo || now.proto != run.proto)) {
        report_size(lo, sizeof lo, first);
        report_size(hi, sizeof hi, last);
        if (len > 0 && (size_t)len < sizeof line)
          len += snprintf(line + len, sizeof line - (size_t)len, "%s %s/%s %s - %s",
                          first == 8 ? "" : ",", braid_algo_name(run.algo),
                          braid_proto_name(run.proto), lo, hi);
        first = 0;
      }
      if (end) break;
      if (first == 0) {
        run = now;
        first = bytes;
      }
      last = bytes;
    }
    fprintf(out, "%s\n", line);
  }
}

static void report_tuning(FILE* out, const struct braid_topo* topo) {
  static const size_t sizes[] = {8, 65536, 1 << 20, 16 << 20, 256 << 20, 1u << 30};
  static const int colls[] = {BRAID_COLL_ALLREDUCE, BRAID_COLL_ALLGATHER, BRAID_COLL_REDUCESCATTER,
                              BRAID_COLL_BROADCAST};
  fprintf(out, "\nTuning (every algorithm/protocol allowed | Ring/Simple only):\n");
  for (size_t c = 0; c < BRAID_ARRAY_LEN(colls); c++) {
    for (size_t s = 0; s < BRAID_ARRAY_LEN(sizes); s++) {
      struct braid_tune_choice all, simple;
      if (tune_choose_topo(topo, colls[c], sizes[s], ~0u, ~0u, &all) != ncclSuccess ||
          tune_choose_topo(topo, colls[c], sizes[s], 1u << BRAID_ALGO_RING,
                           1u << BRAID_PROTO_SIMPLE, &simple) != ncclSuccess)
        return;
      fprintf(out, "  %-13s %10zu B: %s/%-6s %2d ch %8.1f us | %2d ch %8.1f us\n",
              braid_coll_name(colls[c]), sizes[s], braid_algo_name(all.algo),
              braid_proto_name(all.proto), all.nchannels, all.time_us, simple.nchannels,
              simple.time_us);
    }
  }
  report_switch_points(out, topo, colls, BRAID_ARRAY_LEN(colls));
}

/* Graphviz: one box per device, one edge per pair of linked devices. */
static ncclResult_t report_dot(const struct topo_system* sys, const char* path) {
  FILE* f = fopen(path, "w");
  char a[64], b[64];
  if (f == NULL) return braid_err(ncclSystemError, "cannot create %s: %s", path, strerror(errno));
  fprintf(f, "graph topology {\n  node [shape=box, fontname=\"monospace\"];\n");
  for (int n = 0; n < sys->nnodes; n++) {
    topo_node_label(sys, n, a, sizeof a);
    const char* color = sys->nodes[n].type == TOPO_GPU   ? "palegreen"
                        : sys->nodes[n].type == TOPO_CPU ? "lightblue"
                                                         : "white";
    fprintf(f, "  \"%s\" [style=filled, fillcolor=%s];\n", a, color);
  }
  for (int n = 0; n < sys->nnodes; n++) {
    for (int l = 0; l < sys->nodes[n].nlinks; l++) {
      const struct topo_link* link = &sys->nodes[n].links[l];
      const struct topo_node* peer = &sys->nodes[link->to];
      int back = 0; /* a pair of directions is drawn once, from its lower index */
      for (int k = 0; k < peer->nlinks; k++)
        back |= peer->links[k].to == n && peer->links[k].type == link->type;
      if (back && link->to < n) continue;
      topo_node_label(sys, n, a, sizeof a);
      topo_node_label(sys, link->to, b, sizeof b);
      fprintf(f, "  \"%s\" -- \"%s\" [label=\"%s %.0f GB/s\"%s];\n", a, b,
              topo_link_type_name(link->type), link->bw,
              link->type == TOPO_LINK_NVL ? ", color=green, penwidth=2" : "");
    }
  }
  fprintf(f, "}\n");
  if (fclose(f) != 0)
    return braid_err(ncclSystemError, "cannot write %s: %s", path, strerror(errno));
  return ncclSuccess;
}

ncclResult_t topo_node_load(FILE* out, const char* topo_file, int use_env,
                            struct braid_topo** topo) {
  ncclResult_t res = ncclSuccess;
  struct xml_doc* doc = NULL;
  struct topo_system* sys = NULL;
  int rank_host[BRAID_MAX_RANKS_PER_HOST] = {0}, ngpus = 0;
  const char* dump_file = use_env ? braid_param_str(BRAID_P_TOPO_DUMP_FILE) : NULL;
  *topo = NULL;
  /* As in a communicator, BRAID_TOPO_FILE replaces detection (a VM given its host's shape). */
  if (use_env && (topo_file == NULL || topo_file[0] == '\0'))
    topo_file = braid_param_str(BRAID_P_TOPO_FILE);
  if (topo_file && topo_file[0])
    BRAID_TRY(xml_parse_file(topo_file, &doc));
  else
    BRAID_TRY(topo_detect_all(&doc, &ngpus));
  if (dump_file && dump_file[0]) {
    BRAID_TRY(xml_write_file(dump_file, doc));
    fprintf(out, "Topology (NCCL topology XML) written to %s\n", dump_file);
  }
  BRAID_TRY(topo_xml_to_system(doc, &sys));
  ngpus = BRAID_MIN(topo_system_count(sys, TOPO_GPU), BRAID_MAX_RANKS_PER_HOST);
  BRAID_CHECK(ngpus > 0, ncclInvalidUsage, "%s describes no GPU (a <gpu> in a <pci> in a <cpu>)",
              doc->source);
  BRAID_TRY(topo_build(&doc, 1, rank_host, NULL, ngpus, NULL, topo));
fail:
  topo_system_free(sys);
  xml_doc_free(doc);
  return res;
}

ncclResult_t topo_report(FILE* out, const char* topo_file, const char* dot_file) {
  ncclResult_t res = ncclSuccess;
  struct braid_topo* topo = NULL;
  BRAID_TRY(topo_node_load(out, topo_file, 1, &topo));
  fprintf(out, "%d GPU%s, taken as the ranks of one node (rank i = the i-th CUDA device)\n",
          topo->nranks, topo->nranks == 1 ? "" : "s");
  BRAID_TRY(report_machine(out, topo));
  report_paths(out, topo);
  report_rings_trees(out, topo);
  report_tuning(out, topo);
  if (dot_file && dot_file[0]) {
    BRAID_TRY(report_dot(topo->hosts[0].sys, dot_file));
    fprintf(out, "\nGraphviz picture written to %s (dot -Tpng %s -o topo.png)\n", dot_file,
            dot_file);
  }
fail:
  topo_free(topo);
  return res;
}
