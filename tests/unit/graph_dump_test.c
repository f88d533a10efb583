/*
 * What Braid writes comes back: the BRAID_TOPO_DUMP_FILE of a host (merged
 * from its ranks' own descriptions, as topo_comm_init writes it) loads as a
 * BRAID_TOPO_FILE and gives the same paths and rings; NCCL's own dump goes
 * through unchanged; the BRAID_GRAPH_DUMP_FILE of each host parses back to
 * the rings, NICs and bandwidth that were searched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "graph/topo.h"
#include "test.h"

static void temp_path(char* path, size_t size, const char* what) {
  snprintf(path, size, "/tmp/braid_%s_XXXXXX", what);
  int fd = mkstemp(path);
  TEST_CHECK(fd >= 0, "mkstemp %s", path);
  if (fd >= 0) close(fd);
}

/* Two hosts of two ranks each, every rank describing the whole fixture (as detection does). */
static void test_topo_dump(const char* fixture, int ppn) {
  char path[64];
  const char* texts[16];
  uint64_t hashes[16];
  int64_t busid[16];
  int rank_host[16], nhosts = 0, nranks = 2 * ppn;
  struct xml_doc *whole = NULL, *docs[16] = {0};
  struct braid_topo *before = NULL, *after = NULL, *file = NULL;
  char* text = NULL;
  size_t len = 0;
  temp_path(path, sizeof path, "topo_dump");
  TEST_EXPECT_RES(xml_parse_file(fixture, &whole), ncclSuccess);
  TEST_EXPECT_RES(topo_build_from_files(&fixture, 1, &ppn, &file), ncclSuccess);
  if (whole == NULL || file == NULL) goto done;
  TEST_EXPECT_RES(xml_write_string(whole, &text, &len), ncclSuccess);
  for (int r = 0; r < nranks; r++) {
    texts[r] = text;
    hashes[r] = braid_hash(r < ppn ? "hostA" : "hostB", 5);
    busid[r] = file->hosts[0].sys->nodes[file->rank_gpu[r % ppn]].id;
  }
  TEST_EXPECT_RES(topo_merge_hosts(texts, hashes, NULL, nranks, rank_host, &nhosts, docs),
                  ncclSuccess);
  TEST_CHECK(nhosts == 2, "%s: %d hosts", fixture, nhosts);
  if (nhosts != 2) goto done;
  TEST_EXPECT_RES(topo_build(docs, 2, rank_host, busid, nranks, NULL, &before), ncclSuccess);
  /* Host 1's dump marks its GPUs with ranks ppn.. of this communicator. */
  TEST_EXPECT_RES(topo_dump_host(docs[1], 1, rank_host, busid, nranks, path), ncclSuccess);
  const char* files[2] = {path, path};
  int ranks[2] = {ppn, ppn};
  TEST_EXPECT_RES(topo_build_from_files(files, 2, ranks, &after), ncclSuccess);
  if (before && after) {
    const struct braid_rings *a = topo_rings(before), *b = topo_rings(after);
    TEST_CHECK(a->nchannels == b->nchannels && a->bw_per_channel == b->bw_per_channel &&
                   memcmp(a->order, b->order, sizeof(int) * (size_t)a->nchannels * nranks) == 0,
               "%s: the dump gives other rings", fixture);
    for (int x = 0; x < nranks; x++)
      for (int y = 0; y < nranks; y++) {
        float bw_a, bw_b;
        TEST_CHECK(topo_path(before, x, y, &bw_a) == topo_path(after, x, y, &bw_b) && bw_a == bw_b,
                   "%s: path %d->%d differs after the dump", fixture, x, y);
      }
  }
  struct xml_doc* dumped = NULL;
  TEST_EXPECT_RES(xml_parse_file(path, &dumped), ncclSuccess);
  for (int r = ppn; dumped && r < nranks; r++) {
    struct xml_node* gpu = topo_xml_find_gpu(dumped->root, busid[r]);
    const char* rank = gpu ? xml_attr_get(gpu, "rank") : NULL;
    TEST_CHECK(rank && atoi(rank) == r, "%s: GPU of rank %d marked rank %s", fixture, r,
               rank ? rank : "(none)");
  }
  xml_doc_free(dumped);
done:
  unlink(path);
  free(text);
  for (int h = 0; h < 16; h++) xml_doc_free(docs[h]);
  xml_doc_free(whole);
  topo_free(before);
  topo_free(after);
  topo_free(file);
}

/* Channel c of the <graph> of `host` in the dump: its GPUs by device, its NIC at both ends. */
static void check_channel(const struct braid_topo* topo, int host, int c,
                          const struct xml_node* ch) {
  const struct topo_host* h = &topo->hosts[host];
  const int* order = topo->rings.order + (size_t)c * topo->nranks;
  const char* name = NULL;
  int net = topo_channel_net(topo, c, h->ranks[0], &name), i = 0, bad = 0;
  if (net >= 0) bad |= ch->nchildren < 2 || strcmp(ch->children[i++]->name, "net") != 0;
  for (int k = 0; k < topo->nranks && !bad; k++) {
    if (topo->rank_host[order[k]] != host) continue;
    const struct xml_node* e = i < ch->nchildren ? ch->children[i++] : NULL;
    int dev = h->sys->nodes[topo->rank_gpu[order[k]]].u.gpu.dev;
    bad |= e == NULL || strcmp(e->name, "gpu") != 0 || atoi(xml_attr_get(e, "dev")) != dev;
  }
  if (net >= 0 && !bad) {
    const struct xml_node* e = i < ch->nchildren ? ch->children[i++] : NULL;
    bad |= e == NULL || strcmp(e->name, "net") != 0 || atoi(xml_attr_get(e, "dev")) != net ||
           atoi(xml_attr_get(ch->children[0], "dev")) != net;
  }
  TEST_CHECK(!bad && i == ch->nchildren, "host %d channel %d: dump differs from the ring", host, c);
}

static void test_graph_dump(void) {
  const char* files[2] = {BRAID_FIXTURES "/ib_nic_node.xml", BRAID_FIXTURES "/twohost_b.xml"};
  int ranks[2] = {4, 4};
  struct braid_topo* topo = NULL;
  TEST_EXPECT_RES(topo_build_from_files(files, 2, ranks, &topo), ncclSuccess);
  for (int host = 0; topo && host < 2; host++) {
    char path[64];
    struct xml_doc* doc = NULL;
    temp_path(path, sizeof path, "graph_dump");
    TEST_EXPECT_RES(topo_dump_graphs(topo, host, path), ncclSuccess);
    TEST_EXPECT_RES(xml_parse_file(path, &doc), ncclSuccess);
    unlink(path);
    if (doc == NULL) continue;
    TEST_CHECK(strcmp(doc->root->name, "graphs") == 0 && doc->root->nchildren == 2,
               "<graphs> with a ring and a tree graph");
    for (int g = 0; g < doc->root->nchildren; g++) {
      const struct xml_node* graph = doc->root->children[g];
      const char* pattern = xml_attr_get(graph, "pattern");
      TEST_CHECK(pattern && atoi(pattern) == (g == 0 ? 4 : 1), "graph %d pattern %s", g,
                 pattern ? pattern : "(none)");
      TEST_CHECK(atoi(xml_attr_get(graph, "nchannels")) == topo->rings.nchannels &&
                     graph->nchildren == topo->rings.nchannels,
                 "graph %d: channel count", g);
      TEST_CHECK(fabs(atof(xml_attr_get(graph, "speedintra")) - topo->rings.bw_per_channel) < 1e-3,
                 "graph %d: speedintra %s", g, xml_attr_get(graph, "speedintra"));
      for (int c = 0; c < graph->nchildren; c++) check_channel(topo, host, c, graph->children[c]);
    }
    xml_doc_free(doc);
  }
  topo_free(topo);
  /* A path that cannot be written is an error naming it, not a crash. */
  topo = NULL;
  TEST_EXPECT_RES(topo_build_from_files(files, 1, ranks, &topo), ncclSuccess);
  if (topo) {
    ncclResult_t res = topo_dump_graphs(topo, 0, "/nonexistent/dir/graph.xml");
    TEST_CHECK(res != ncclSuccess && strstr(braid_err_last(), "/nonexistent/dir/graph.xml"),
               "unwritable dump: %d %s", (int)res, braid_err_last());
  }
  topo_free(topo);
}

int main(void) {
  setenv("BRAID_DEBUG", "NONE", 1);
  braid_param_reload();
  test_topo_dump(BRAID_FIXTURES "/dgx_h100_8nic.xml", 8);
  test_topo_dump(BRAID_FIXTURES "/ib_nic_node.xml", 4);
  test_topo_dump(BRAID_FIXTURES "/nccl_h200x2_dump.xml", 2);
  test_topo_dump(BRAID_FIXTURES "/pcie_4gpu_2socket.xml", 4);
  test_graph_dump();
  return test_summary();
}
