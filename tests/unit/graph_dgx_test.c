/*
 * Fixture (a), dgx_h100_8nic.xml: 8 H100 on one NVSwitch fabric and four
 * PCIe Gen5 switches, each holding two GPUs and two 400 Gb/s NICs. On one
 * host: the paths between GPUs and from GPUs to NICs (PIX to the NICs of the
 * GPU's own switch), the rings. On 2 and 16 hosts: the channel count, rings
 * that enter and leave every host at GPUs under the channel's NIC, every NIC
 * used equally, double binary trees. Per-rank descriptions grouped by
 * BRAID_HOSTID, as one machine posing as 16 hosts would produce them. Twin
 * hosts get what a search of each would find. 1,024 hosts in under a second.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/param.h"
#include "base/utils.h"
#include "graph/topo.h"
#include "test.h"

#define FIXTURE BRAID_FIXTURES "/dgx_h100_8nic.xml"
#define PPN 8

static struct braid_topo* build_hosts(int nhosts) {
  const char** files = calloc((size_t)nhosts, sizeof *files);
  int* ranks = calloc((size_t)nhosts, sizeof *ranks);
  struct braid_topo* topo = NULL;
  for (int h = 0; files && ranks && h < nhosts; h++) files[h] = FIXTURE, ranks[h] = PPN;
  TEST_EXPECT_RES(topo_build_from_files(files, nhosts, ranks, &topo), ncclSuccess);
  free(files);
  free(ranks);
  return topo;
}

static int near(float a, float b) { return fabsf(a - b) <= 0.02f * fabsf(b) + 0.01f; }

/* PCIe Gen5 x16 as tune_table.c derives it; a 400 Gb/s NIC is 50 GB/s. */
static const float gen5_x16 = 16 * 32.0f * (128.0f / 130.0f) / 8.0f * 0.88f, ndr = 50.0f;

static void test_one_host(void) {
  struct braid_topo* topo = build_hosts(1);
  if (topo == NULL) return;
  for (int a = 0; a < PPN; a++) {
    for (int b = 0; b < PPN; b++) {
      float bw = 0.0f;
      braid_path_type_t t = topo_path(topo, a, b, &bw);
      if (a != b)
        TEST_CHECK(t == BRAID_PATH_NVL && near(bw, 18 * 22.0f), "GPU %d->%d: %s %.1f", a, b,
                   topo_path_type_name(t), bw);
    }
    /* To the NICs: PIX under its own switch, PHB to the socket's other switch, SYS beyond. */
    for (int nic = 0; nic < 8; nic++) {
      char name[24];
      float bw = 0.0f;
      snprintf(name, sizeof name, "mlx5_%d", nic);
      braid_path_type_t t = topo_net_path(topo, a, name, &bw);
      braid_path_type_t want = nic / 2 == a / 2   ? BRAID_PATH_PIX
                               : nic / 4 == a / 4 ? BRAID_PATH_PHB
                                                  : BRAID_PATH_SYS;
      float want_bw = want == BRAID_PATH_SYS ? 22.0f : BRAID_MIN(ndr, gen5_x16);
      TEST_CHECK(t == want && near(bw, want_bw), "GPU %d -> %s: %s %.1f GB/s, expected %s %.1f", a,
                 name, topo_path_type_name(t), bw, topo_path_type_name(want), want_bw);
    }
  }
  const struct braid_rings* r = topo_rings(topo);
  TEST_CHECK(r->nchannels == 32 && near(r->bw_per_channel, 12.0f), "one host: %d x %.1f (%s)",
             r->nchannels, r->bw_per_channel, topo_explain(topo));
  for (int i = 0; i < PPN; i++) TEST_CHECK(r->order[i] == i, "NVSwitch ring in device order");
  TEST_CHECK(strstr(topo_explain(topo), "6 identical rings of 64.0 GB/s") != NULL, "one host: %s",
             topo_explain(topo));
  topo_free(topo);
}

/* Every ring a permutation, hosts' ranks contiguous and in host order. */
static void check_rings(const struct braid_topo* topo, const char* what) {
  const struct braid_rings* r = topo_rings(topo);
  char* seen = calloc((size_t)r->nranks, 1);
  for (int c = 0; seen && c < r->nchannels; c++) {
    memset(seen, 0, (size_t)r->nranks);
    int bad = 0;
    for (int i = 0; i < r->nranks; i++) {
      int rank = r->order[c * r->nranks + i];
      bad |= rank < 0 || rank >= r->nranks || seen[rank] || topo->rank_host[rank] != i / PPN;
      if (rank >= 0 && rank < r->nranks) seen[rank] = 1;
    }
    TEST_CHECK(!bad, "%s: channel %d is not a permutation of host segments", what, c);
  }
  free(seen);
}

/* The ring of channel c enters and leaves every host at GPUs under the channel's NIC. */
static void check_nics(const struct braid_topo* topo, const char* what) {
  const struct braid_rings* r = topo_rings(topo);
  int uses[8] = {0};
  for (int c = 0; c < r->nchannels; c++) {
    const char* name0 = NULL;
    int dev0 = topo_channel_net(topo, c, 0, &name0);
    if (dev0 >= 0 && dev0 < 8) uses[dev0]++;
    for (int h = 0; h < topo->nhosts; h++) {
      const char* name = NULL;
      int first = r->order[c * r->nranks + h * PPN], last = r->order[c * r->nranks + h * PPN + 7];
      int dev = topo_channel_net(topo, c, first, &name);
      TEST_CHECK(dev == dev0 && name != NULL, "%s: channel %d uses NIC %d on host %d, %d on 0",
                 what, c, dev, h, dev0);
      if (name == NULL) continue;
      TEST_CHECK(topo_net_path(topo, first, name, NULL) == BRAID_PATH_PIX &&
                     topo_net_path(topo, last, name, NULL) == BRAID_PATH_PIX,
                 "%s: channel %d enters host %d at rank %d and leaves at %d, not under %s", what, c,
                 h, first, last, name);
    }
  }
  for (int n = 0; n < 8; n++)
    TEST_CHECK(uses[n] == r->nchannels / 8, "%s: NIC %d carries %d of %d channels", what, n,
               uses[n], r->nchannels);
}

/* Channel c's tree: one root, parents and children agree, chains inside hosts. Returns the root. */
static int check_tree(const struct braid_topo* topo, int c, const char* what, int* inner) {
  const struct braid_tree_node* nodes = topo_trees(topo)->nodes + (size_t)c * topo->nranks;
  int roots = 0, root = -1, bad = 0;
  for (int r = 0; r < topo->nranks; r++) {
    if (nodes[r].up < 0) roots++, root = r;
    int cross = 0;
    for (int k = 0; k < 3; k++) {
      int d = nodes[r].down[k];
      if (d < 0) continue;
      bad |= nodes[d].up != r;
      cross += topo->rank_host[d] != topo->rank_host[r];
    }
    /* Inside a host a rank has at most its chain successor below it. */
    bad |= nodes[r].up >= 0 && topo->rank_host[nodes[r].up] == topo->rank_host[r] && cross > 0;
    if (cross > 0) inner[topo->rank_host[r]] = 1;
  }
  TEST_CHECK(roots == 1 && !bad, "%s: channel %d: %d roots%s", what, c, roots,
             bad ? ", inconsistent links" : "");
  return root;
}

/* Depth of the host tree of channel c (hosts on the path from the deepest head to the root). */
static int tree_host_depth(const struct braid_topo* topo, int c) {
  const struct braid_tree_node* nodes = topo_trees(topo)->nodes + (size_t)c * topo->nranks;
  int deepest = 0;
  for (int r = 0; r < topo->nranks; r++) {
    int hosts = 1;
    for (int x = r, steps = 0; nodes[x].up >= 0 && steps < topo->nranks; x = nodes[x].up, steps++)
      hosts += topo->rank_host[nodes[x].up] != topo->rank_host[x];
    deepest = BRAID_MAX(deepest, hosts);
  }
  return deepest;
}

static void check_trees(const struct braid_topo* topo, const char* what) {
  int n = topo->nhosts;
  int* inner0 = calloc((size_t)n, sizeof(int));
  int* inner1 = calloc((size_t)n, sizeof(int));
  const struct braid_trees* t = topo_trees(topo);
  TEST_CHECK(t->nchannels == topo_rings(topo)->nchannels, "%s: tree channels", what);
  for (int c = 0; inner0 && inner1 && c < t->nchannels; c++) {
    memset(c % 2 ? inner1 : inner0, 0, sizeof(int) * (size_t)n);
    int root = check_tree(topo, c, what, c % 2 ? inner1 : inner0);
    int root_host = root >= 0 ? topo->rank_host[root] : -1;
    TEST_CHECK(root_host == (c % 2 ? n - 1 : 0), "%s: channel %d rooted on host %d", what, c,
               root_host);
    int depth = tree_host_depth(topo, c), levels = 1;
    while ((1 << (levels - 1)) < n) levels++;
    TEST_CHECK(depth <= levels, "%s: channel %d's tree is %d hosts deep, expected <= %d", what, c,
               depth, levels);
  }
  for (int h = 0; inner0 && inner1 && h < n; h++)
    TEST_CHECK(!(inner0[h] && inner1[h]), "%s: host %d is inner in both trees", what, h);
  free(inner0);
  free(inner1);
}

static void test_hosts(int nhosts) {
  char what[32];
  snprintf(what, sizeof what, "%d hosts of (a)", nhosts);
  struct braid_topo* topo = build_hosts(nhosts);
  if (topo == NULL) return;
  const struct braid_rings* r = topo_rings(topo);
  /* 8 NICs x 48 GB/s rings = 384 GB/s, in channels of at most 12 GB/s. */
  TEST_CHECK(r->nchannels == 32 && near(r->bw_per_channel, 12.0f), "%s: %d x %.1f GB/s (%s)", what,
             r->nchannels, r->bw_per_channel, topo_explain(topo));
  TEST_CHECK(strstr(topo_explain(topo), "8 distinct rings of 48.0 GB/s") != NULL, "%s: %s", what,
             topo_explain(topo));
  check_rings(topo, what);
  check_nics(topo, what);
  check_trees(topo, what);
  float bw = 0.0f;
  TEST_CHECK(topo_path(topo, 0, PPN, &bw) == BRAID_PATH_NET && near(bw, ndr),
             "%s: across hosts %.1f GB/s", what, bw);
  topo_free(topo);
}

/* Rank r's own description: the fixture without the other GPUs (what topo_detect_gpu writes). */
static void copy_without_other_gpus(struct xml_doc* doc, struct xml_node* parent,
                                    const struct xml_node* src, const char* dev) {
  const struct xml_node* gpu = xml_child_find(src, "gpu", NULL, NULL);
  if (gpu && strcmp(xml_attr_get(gpu, "dev"), dev) != 0) return;
  struct xml_node* copy = NULL;
  xml_node_add(doc, parent, src->name, &copy);
  for (int a = 0; copy && a < src->nattrs; a++)
    xml_attr_set(copy, src->attrs[a].key, src->attrs[a].value);
  for (int i = 0; copy && i < src->nchildren; i++)
    copy_without_other_gpus(doc, copy, src->children[i], dev);
}

/*
 * 16 "hosts" on one machine: each rank sets BRAID_HOSTID to its host's name
 * and describes only its own GPU; grouping and merging must give the same
 * rings as 16 whole-host files. host_of(r) decides the grouping.
 */
static void test_hostid_merge(int nhosts, int interleaved) {
  int nranks = nhosts * PPN;
  struct xml_doc* whole = NULL;
  char** texts = calloc((size_t)nranks, sizeof *texts);
  uint64_t* hashes = calloc((size_t)nranks, sizeof *hashes);
  int64_t* busid = calloc((size_t)nranks, sizeof *busid);
  int* rank_host = calloc((size_t)nranks, sizeof *rank_host);
  struct xml_doc** docs = calloc((size_t)nranks, sizeof *docs);
  struct braid_topo *merged = NULL, *files = build_hosts(nhosts);
  int nh = 0;
  TEST_EXPECT_RES(xml_parse_file(FIXTURE, &whole), ncclSuccess);
  for (int r = 0; whole && files && r < nranks; r++) {
    int host = interleaved ? r % nhosts : r / PPN, local = interleaved ? r / nhosts : r % PPN;
    char id[32], dev[16];
    size_t len;
    snprintf(id, sizeof id, "node%02d", host);
    setenv("BRAID_HOSTID", id, 1);
    braid_param_reload();
    hashes[r] = braid_host_hash();
    snprintf(dev, sizeof dev, "%d", local);
    struct xml_doc* mine = NULL;
    xml_doc_create("rank", &mine);
    copy_without_other_gpus(mine, NULL, whole->root, dev);
    xml_write_string(mine, &texts[r], &len);
    xml_doc_free(mine);
    busid[r] = files->hosts[0].sys->nodes[files->rank_gpu[local]].id;
  }
  unsetenv("BRAID_HOSTID");
  braid_param_reload();
  TEST_EXPECT_RES(
      topo_merge_hosts((const char* const*)texts, hashes, NULL, nranks, rank_host, &nh, docs),
      ncclSuccess);
  TEST_CHECK(nh == nhosts, "%d host ids grouped into %d hosts", nhosts, nh);
  for (int r = 0; r < nranks; r++)
    TEST_CHECK(rank_host[r] == (interleaved ? r % nhosts : r / PPN), "rank %d on host %d", r,
               rank_host[r]);
  if (nh == nhosts)
    TEST_EXPECT_RES(topo_build(docs, nh, rank_host, busid, nranks, NULL, &merged), ncclSuccess);
  if (merged && files && !interleaved) {
    const struct braid_rings *a = topo_rings(merged), *b = topo_rings(files);
    TEST_CHECK(a->nchannels == b->nchannels &&
                   memcmp(a->order, b->order, sizeof(int) * (size_t)a->nchannels * nranks) == 0,
               "merged per-rank descriptions give other rings than whole-host files");
  }
  if (merged && interleaved) {
    /* Host h holds ranks h, h + 16, ...: every ring lists them together all the same. */
    const struct braid_rings* a = topo_rings(merged);
    TEST_CHECK(a->nchannels == 32, "interleaved hosts: %d channels", a->nchannels);
    for (int i = 0; i < nranks; i++)
      TEST_CHECK(merged->rank_host[a->order[i]] == i / PPN, "ring position %d on host %d", i,
                 merged->rank_host[a->order[i]]);
  }
  for (int r = 0; r < nranks; r++) free(texts[r]), xml_doc_free(docs[r]);
  free(texts), free(hashes), free(busid), free(rank_host), free(docs);
  topo_free(merged);
  topo_free(files);
  xml_doc_free(whole);
}

/* Searching every host afresh gives what twins copied: same rings, same NICs. */
static void test_twins(void) {
  struct braid_topo* topo = build_hosts(16);
  if (topo == NULL) return;
  for (int h = 0; h < 16; h++) TEST_CHECK(topo->hosts[h].twin == 0, "host %d is host 0's twin", h);
  int n = topo->rings.nchannels * topo->nranks;
  int* order = malloc(sizeof(int) * (size_t)n);
  int* nets = malloc(sizeof(int) * (size_t)topo->rings.nchannels * 16);
  for (int i = 0; order && nets && i < n; i++) order[i] = topo->rings.order[i];
  for (int i = 0; order && nets && i < topo->rings.nchannels * 16; i++)
    nets[i] = topo->ring_nets[i].net;
  for (int h = 0; h < 16; h++) topo->hosts[h].twin = h;
  free(topo->rings.order), free(topo->ring_nets);
  topo->rings.order = NULL, topo->ring_nets = NULL;
  TEST_EXPECT_RES(search_rings(topo), ncclSuccess);
  TEST_CHECK(order && topo->rings.order && memcmp(order, topo->rings.order, sizeof(int) * n) == 0,
             "twins changed the rings");
  for (int i = 0; nets && topo->ring_nets && i < topo->rings.nchannels * 16; i++)
    TEST_CHECK(nets[i] == topo->ring_nets[i].net, "twins changed the NIC of entry %d", i);
  free(order);
  free(nets);
  topo_free(topo);
  /* Same shape, other bus ids and NIC names: twins. A PCIe host: not. */
  const char* files[3] = {BRAID_FIXTURES "/ib_nic_node.xml", BRAID_FIXTURES "/twohost_b.xml",
                          BRAID_FIXTURES "/pcie_4gpu_2socket.xml"};
  int ranks[3] = {4, 4, 4};
  topo = NULL;
  TEST_EXPECT_RES(topo_build_from_files(files, 3, ranks, &topo), ncclSuccess);
  if (topo)
    TEST_CHECK(topo->hosts[1].twin == 0 && topo->hosts[2].twin == 2, "twins: %d %d",
               topo->hosts[1].twin, topo->hosts[2].twin);
  topo_free(topo);
}

static double seconds(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/*
 * 1,024 hosts (8,192 ranks): the whole build from parsed documents, search
 * included. The limit applies to CPU time: the build is single-threaded, so
 * on an idle machine that is its wall time, and a CI machine busy compiling
 * kernels next to the test does not make it fail.
 */
static void test_1024_hosts(void) {
  enum { N = 1024 };
  struct xml_doc** docs = calloc(N, sizeof *docs);
  int* rank_host = calloc(N * PPN, sizeof *rank_host);
  struct braid_topo* topo = NULL;
  for (int h = 0; docs && rank_host && h < N; h++) {
    TEST_EXPECT_RES(xml_parse_file(FIXTURE, &docs[h]), ncclSuccess);
    for (int i = 0; i < PPN; i++) rank_host[h * PPN + i] = h;
  }
  double wall = seconds(CLOCK_MONOTONIC), cpu = seconds(CLOCK_PROCESS_CPUTIME_ID);
  TEST_EXPECT_RES(topo_build(docs, N, rank_host, NULL, N * PPN, NULL, &topo), ncclSuccess);
  wall = seconds(CLOCK_MONOTONIC) - wall;
  cpu = seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu;
  fprintf(stderr,
          "1024 hosts x 8 GPUs: graphs, paths, rings, trees and tuning in %.3f s "
          "(%.3f s of CPU)\n",
          wall, cpu);
#ifdef BRAID_TIMING_STRICT
  TEST_CHECK(cpu < 1.0, "1024 hosts took %.3f s of CPU, expected under 1 s", cpu);
#endif
  if (topo) {
    check_rings(topo, "1024 hosts");
    check_nics(topo, "1024 hosts");
    check_trees(topo, "1024 hosts");
    TEST_CHECK(topo_rings(topo)->nchannels == 32, "1024 hosts: %d channels",
               topo_rings(topo)->nchannels);
  }
  topo_free(topo);
  for (int h = 0; docs && h < N; h++) xml_doc_free(docs[h]);
  free(docs);
  free(rank_host);
}

int main(void) {
  setenv("BRAID_DEBUG", "WARN", 1);
  braid_param_reload();
  test_one_host();
  test_hosts(2);
  test_hosts(16);
  test_hostid_merge(16, 0);
  test_hostid_merge(16, 1);
  test_twins();
  test_1024_hosts();
  return test_summary();
}
