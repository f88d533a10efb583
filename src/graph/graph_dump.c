/*
 * The chosen rings and trees in NCCL's graph XML (NCCL_GRAPH_DUMP_FILE), as
 * seen from one host: each <channel> lists that host's GPUs by CUDA device
 * in ring (or chain) order, between the <net> the channel arrives from and
 * leaves to when it crosses hosts.
 *
 *   <graphs version="1">
 *     <graph id="0" pattern="4" crossnic="0" nchannels="2" speedintra="12" speedinter="12"
 *            latencyinter="0" typeintra="NVL" typeinter="PIX" samechannels="1">
 *       <channel><net dev="0"/><gpu dev="0"/><gpu dev="1"/><net dev="0"/></channel>
 *     </graph>
 *     <graph id="1" pattern="1" ...> (trees) </graph>
 *   </graphs>
 */
#include <string.h>

#include "base/error.h"
#include "graph/topo.h"

enum { GRAPH_PATTERN_BALANCED_TREE = 1, GRAPH_PATTERN_RING = 4 }; /* NCCL's numbering */

static ncclResult_t graph_dump_attr_float(struct xml_node* node, const char* key, float v) {
  char text[32];
  snprintf(text, sizeof text, "%g", v);
  return xml_attr_set(node, key, text);
}

static ncclResult_t graph_dump_channel(struct xml_doc* doc, struct xml_node* graph,
                                       const struct braid_topo* topo, int host, int c) {
  ncclResult_t res = ncclSuccess;
  const struct topo_host* h = &topo->hosts[host];
  const int* order = topo->rings.order + (size_t)c * topo->nranks;
  struct xml_node *ch = NULL, *e = NULL;
  int net = topo->nhosts > 1 ? topo->ring_nets[c * topo->nhosts + host].net : -1;
  BRAID_TRY(xml_node_add(doc, graph, "channel", &ch));
  if (net >= 0) {
    BRAID_TRY(xml_node_add(doc, ch, "net", &e));
    BRAID_TRY(xml_attr_set_int(e, "dev", h->sys->nodes[net].u.net.dev));
  }
  for (int i = 0; i < topo->nranks; i++) {
    int r = order[i];
    if (topo->rank_host[r] != host) continue;
    BRAID_TRY(xml_node_add(doc, ch, "gpu", &e));
    BRAID_TRY(xml_attr_set_int(e, "dev", h->sys->nodes[topo->rank_gpu[r]].u.gpu.dev));
  }
  if (net >= 0) {
    BRAID_TRY(xml_node_add(doc, ch, "net", &e));
    BRAID_TRY(xml_attr_set_int(e, "dev", h->sys->nodes[net].u.net.dev));
  }
fail:
  return res;
}

static ncclResult_t graph_dump_graph(struct xml_doc* doc, const struct braid_topo* topo, int host,
                                     int id, int pattern, int nch, float bw) {
  ncclResult_t res = ncclSuccess;
  struct xml_node* g = NULL;
  int same = 1;
  for (int c = 1; c < nch; c++)
    same &= memcmp(topo->rings.order, topo->rings.order + (size_t)c * topo->nranks,
                   sizeof(int) * (size_t)topo->nranks) == 0;
  BRAID_TRY(xml_node_add(doc, doc->root, "graph", &g));
  BRAID_TRY(xml_attr_set_int(g, "id", id));
  BRAID_TRY(xml_attr_set_int(g, "pattern", pattern));
  BRAID_TRY(xml_attr_set(g, "crossnic", "0"));
  BRAID_TRY(xml_attr_set_int(g, "nchannels", nch));
  BRAID_TRY(graph_dump_attr_float(g, "speedintra", bw));
  BRAID_TRY(graph_dump_attr_float(g, "speedinter", bw));
  BRAID_TRY(xml_attr_set(g, "latencyinter", "0"));
  BRAID_TRY(xml_attr_set(g, "typeintra", topo_path_type_name(topo->ring_intra_type)));
  /* One host: NCCL writes PIX (its starting value) rather than a network type. */
  int inter = topo->nhosts > 1 ? topo->ring_inter_type : BRAID_PATH_PIX;
  BRAID_TRY(xml_attr_set(g, "typeinter", topo_path_type_name((braid_path_type_t)inter)));
  BRAID_TRY(xml_attr_set_int(g, "samechannels", same));
  for (int c = 0; c < nch; c++) BRAID_TRY(graph_dump_channel(doc, g, topo, host, c));
fail:
  return res;
}

ncclResult_t topo_dump_graphs(const struct braid_topo* topo, int host, const char* path) {
  ncclResult_t res = ncclSuccess;
  struct xml_doc* doc = NULL;
  struct xml_node* root = NULL;
  BRAID_CHECK(host >= 0 && host < topo->nhosts, ncclInternalError, "no host %d to dump", host);
  BRAID_TRY(xml_doc_create(path, &doc));
  BRAID_TRY(xml_node_add(doc, NULL, "graphs", &root));
  BRAID_TRY(xml_attr_set(root, "version", "1"));
  BRAID_TRY(graph_dump_graph(doc, topo, host, 0, GRAPH_PATTERN_RING, topo->rings.nchannels,
                             topo->rings.bw_per_channel));
  BRAID_TRY(graph_dump_graph(doc, topo, host, 1, GRAPH_PATTERN_BALANCED_TREE, topo->trees.nchannels,
                             topo->trees.bw_per_channel));
  BRAID_TRY(xml_write_file(path, doc));
fail:
  xml_doc_free(doc);
  return res;
}
