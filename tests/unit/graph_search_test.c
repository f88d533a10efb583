/*
 * Ring and tree search: channel counts, every ring a permutation that uses
 * NVLink where there is NVLink, the same answer twice and on every rank
 * (each "rank" merging per-rank descriptions as topo_comm_init does), NICs
 * near the GPUs across hosts, double binary trees over 2/4/8 hosts, channel
 * bounds, the graph dump, and a node on which no good ring exists.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/param.h"
#include "graph/topo.h"
#include "graph/tune_table.h"
#include "test.h"

static const char* fixture(const char* name) {
  static char path[8][512];
  static int next;
  char* p = path[next++ % 8];
  snprintf(p, 512, "%s/%s", BRAID_FIXTURES, name);
  return p;
}

static struct braid_topo* build_hosts(const char* name, int nhosts, int per_host) {
  const char* files[8];
  int ranks[8];
  struct braid_topo* topo = NULL;
  for (int h = 0; h < nhosts; h++) files[h] = fixture(name), ranks[h] = per_host;
  TEST_EXPECT_RES(topo_build_from_files(files, nhosts, ranks, &topo), ncclSuccess);
  return topo;
}

/* Every ring visits every rank once, host segments contiguous and in host order. */
static void check_rings(const struct braid_topo* topo, const char* what) {
  const struct braid_rings* r = topo_rings(topo);
  TEST_CHECK(r->nchannels >= 1 && r->nchannels <= BRAID_MAX_CHANNELS, "%s: %d channels", what,
             r->nchannels);
  TEST_CHECK(r->nranks == topo->nranks && r->bw_per_channel > 0.0f, "%s: ring shape", what);
  for (int c = 0; c < r->nchannels; c++) {
    int seen[256] = {0};
    for (int i = 0; i < r->nranks; i++) {
      int rank = r->order[c * r->nranks + i];
      TEST_CHECK(rank >= 0 && rank < r->nranks && !seen[rank],
                 "%s: channel %d is not a permutation", what, c);
      if (rank >= 0 && rank < r->nranks) seen[rank] = 1;
      int host = rank >= 0 && rank < r->nranks ? topo->rank_host[rank] : -1;
      int expect_host = 0, pos = i;
      while (expect_host < topo->nhosts && pos >= topo->hosts[expect_host].nranks)
        pos -= topo->hosts[expect_host++].nranks;
      TEST_CHECK(host == expect_host, "%s: channel %d position %d is on host %d, expected %d", what,
                 c, i, host, expect_host);
      int prev, next;
      topo_ring_neighbors(r, c, rank, &prev, &next);
      TEST_CHECK(prev == r->order[c * r->nranks + (i + r->nranks - 1) % r->nranks] &&
                     next == r->order[c * r->nranks + (i + 1) % r->nranks],
                 "%s: neighbours", what);
    }
  }
}

/* Worst path type between consecutive ranks of a host in any ring. */
static braid_path_type_t ring_worst_intra(const struct braid_topo* topo) {
  const struct braid_rings* r = topo_rings(topo);
  braid_path_type_t worst = BRAID_PATH_LOC;
  for (int c = 0; c < r->nchannels; c++)
    for (int i = 0; i < r->nranks; i++) {
      int a = r->order[c * r->nranks + i], b = r->order[c * r->nranks + (i + 1) % r->nranks];
      if (topo->rank_host[a] != topo->rank_host[b]) continue;
      braid_path_type_t t = topo_path(topo, a, b, NULL);
      if (t > worst) worst = t;
    }
  return worst;
}

static void test_single_node(void) {
  struct {
    const char* name;
    int n, nch;
    float bw;
    braid_path_type_t worst;
  } cases[] = {
      {"h200x2_nvswitch.xml", 2, 32, 12.0f, BRAID_PATH_NVL},
      {"h200x4_nvswitch.xml", 4, 32, 12.0f, BRAID_PATH_NVL},
      {"h200x8_nvswitch.xml", 8, 32, 12.0f, BRAID_PATH_NVL},
      {"nvlink_bridge_3gpu.xml", 3, 7, 80.0f / 7.0f, BRAID_PATH_NVB},
      {"pcie_4gpu_2socket.xml", 4, 2, 5.0f, BRAID_PATH_SYS},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct braid_topo* topo = build_hosts(cases[i].name, 1, cases[i].n);
    if (topo == NULL) continue;
    check_rings(topo, cases[i].name);
    const struct braid_rings* r = topo_rings(topo);
    TEST_CHECK(r->nchannels == cases[i].nch, "%s: %d channels, expected %d (%s)", cases[i].name,
               r->nchannels, cases[i].nch, topo_explain(topo));
    TEST_CHECK(r->bw_per_channel > cases[i].bw - 0.05f && r->bw_per_channel < cases[i].bw + 0.05f,
               "%s: %.2f GB/s per channel, expected %.2f", cases[i].name, r->bw_per_channel,
               cases[i].bw);
    TEST_CHECK(ring_worst_intra(topo) == cases[i].worst, "%s: worst hop %s, expected %s",
               cases[i].name, topo_path_type_name(ring_worst_intra(topo)),
               topo_path_type_name(cases[i].worst));
    TEST_CHECK(topo_channel_net(topo, 0, 0, NULL) == -1, "%s: one host uses no NIC", cases[i].name);
    topo_free(topo);
  }
  /* PCIe: the ring crosses the socket link only twice (0 1 | 2 3). */
  struct braid_topo* topo = build_hosts("pcie_4gpu_2socket.xml", 1, 4);
  if (topo) {
    const int* o = topo_rings(topo)->order;
    TEST_CHECK(o[0] == 0 && o[1] == 1 && o[2] == 2 && o[3] == 3, "PCIe ring %d %d %d %d", o[0],
               o[1], o[2], o[3]);
    topo_free(topo);
  }
  /* A lone rank: one channel, nothing to connect. */
  topo = build_hosts("h200x2_nvswitch.xml", 1, 1);
  if (topo) {
    TEST_CHECK(topo_rings(topo)->nchannels == 1 && topo_rings(topo)->order[0] == 0,
               "one rank, one ring");
    TEST_CHECK(topo_trees(topo)->nodes[0].up == -1 && topo_trees(topo)->nodes[0].down[0] == -1,
               "one rank, no tree edges");
    TEST_CHECK(strstr(topo_explain(topo), "single rank") != NULL, "one rank: %s",
               topo_explain(topo));
    topo_free(topo);
  }
  /* NVSwitch: natural order. */
  topo = build_hosts("h200x8_nvswitch.xml", 1, 8);
  if (topo) {
    for (int i = 0; i < 8; i++) TEST_CHECK(topo_rings(topo)->order[i] == i, "8 GPU ring order");
    topo_free(topo);
  }
}

static int same_result(const struct braid_topo* a, const struct braid_topo* b) {
  const struct braid_rings *ra = topo_rings(a), *rb = topo_rings(b);
  const struct braid_trees *ta = topo_trees(a), *tb = topo_trees(b);
  return ra->nchannels == rb->nchannels && ra->bw_per_channel == rb->bw_per_channel &&
         memcmp(ra->order, rb->order, sizeof(int) * (size_t)ra->nchannels * ra->nranks) == 0 &&
         ta->nchannels == tb->nchannels &&
         memcmp(ta->nodes, tb->nodes, sizeof(*ta->nodes) * (size_t)ta->nchannels * ta->nranks) == 0;
}

/* One rank's description: the fixture's <system> and <cpu>s, and only its own GPU's switch. */
static struct xml_doc* rank_doc(const struct xml_doc* whole, int dev) {
  struct xml_doc* doc = NULL;
  struct xml_node *root = NULL, *cpu = NULL;
  char want[16];
  snprintf(want, sizeof want, "%d", dev);
  xml_doc_create("rank", &doc);
  xml_node_add(doc, NULL, "system", &root);
  xml_attr_set(root, "version", "1");
  for (int c = 0; c < whole->root->nchildren; c++) {
    const struct xml_node* wc = whole->root->children[c];
    xml_node_add(doc, root, "cpu", &cpu);
    for (int a = 0; a < wc->nattrs; a++) xml_attr_set(cpu, wc->attrs[a].key, wc->attrs[a].value);
    for (int s = 0; s < wc->nchildren; s++) {
      const struct xml_node* sw = wc->children[s];
      const struct xml_node* gpu_pci = sw->nchildren ? sw->children[0] : NULL;
      const struct xml_node* gpu = gpu_pci ? xml_child_find(gpu_pci, "gpu", "dev", want) : NULL;
      if (gpu) xml_node_copy(doc, cpu, sw, NULL);
    }
  }
  return doc;
}

/* Determinism: twice the same; and 8 ranks, each merging 8 per-rank descriptions, agree. */
static void test_deterministic(void) {
  struct braid_topo* a = build_hosts("h200x8_nvswitch.xml", 1, 8);
  struct braid_topo* b = build_hosts("h200x8_nvswitch.xml", 1, 8);
  TEST_CHECK(a && b && same_result(a, b), "two builds differ");
  struct xml_doc* whole = NULL;
  TEST_EXPECT_RES(xml_parse_file(fixture("h200x8_nvswitch.xml"), &whole), ncclSuccess);
  char* texts[8] = {0};
  size_t lens[8];
  int64_t busid[8];
  for (int r = 0; whole && r < 8; r++) {
    struct xml_doc* d = rank_doc(whole, r);
    xml_write_string(d, &texts[r], &lens[r]);
    xml_doc_free(d);
  }
  for (int r = 0; whole && a && r < 8; r++) busid[r] = a->hosts[0].sys->nodes[a->rank_gpu[r]].id;
  for (int me = 0; whole && a && me < 8; me++) {
    struct xml_doc* merged = NULL;
    struct braid_topo* t = NULL;
    int rank_host[8] = {0};
    xml_doc_create("merged", &merged);
    for (int r = 0; r < 8; r++) {
      struct xml_doc* one = NULL;
      TEST_EXPECT_RES(xml_parse_buffer(texts[r], lens[r], "rank text", &one), ncclSuccess);
      if (one) TEST_EXPECT_RES(topo_xml_fuse(merged, one), ncclSuccess);
      xml_doc_free(one);
    }
    TEST_EXPECT_RES(topo_build(&merged, 1, rank_host, busid, 8, NULL, &t), ncclSuccess);
    TEST_CHECK(t && same_result(a, t), "rank %d's merged view differs from the whole node", me);
    topo_free(t);
    xml_doc_free(merged);
  }
  for (int r = 0; r < 8; r++) free(texts[r]);
  xml_doc_free(whole);
  topo_free(a);
  topo_free(b);
}

static void test_two_hosts(void) {
  const char* files[2] = {fixture("ib_nic_node.xml"), fixture("twohost_b.xml")};
  int ranks[2] = {4, 4};
  struct braid_topo* topo = NULL;
  TEST_EXPECT_RES(topo_build_from_files(files, 2, ranks, &topo), ncclSuccess);
  if (topo == NULL) return;
  check_rings(topo, "two hosts");
  const struct braid_rings* r = topo_rings(topo);
  TEST_CHECK(r->nchannels == 8 && r->bw_per_channel > 11.9f && r->bw_per_channel < 12.1f,
             "two hosts: %d channels of %.1f GB/s (%s)", r->nchannels, r->bw_per_channel,
             topo_explain(topo));
  TEST_CHECK(ring_worst_intra(topo) == BRAID_PATH_NVL, "two hosts: intra-host hops use NVLink");
  for (int c = 0; c < r->nchannels; c++) {
    const char *name0 = NULL, *name4 = NULL;
    int dev0 = topo_channel_net(topo, c, 0, &name0), dev4 = topo_channel_net(topo, c, 4, &name4);
    /* NDR ports only (the HDR one is slower), alternating, on both hosts alike. */
    TEST_CHECK(dev0 == c % 2 && name0 && strcmp(name0, c % 2 ? "mlx5_1" : "mlx5_0") == 0,
               "channel %d: host 0 uses %s (dev %d)", c, name0 ? name0 : "nothing", dev0);
    TEST_CHECK(dev4 == c % 2 && name4 && strcmp(name4, c % 2 ? "mlx5_5" : "mlx5_4") == 0,
               "channel %d: host 1 uses %s (dev %d)", c, name4 ? name4 : "nothing", dev4);
    /* The ring enters and leaves each host at GPUs under that NIC's switch. */
    int first = r->order[c * 8], last = r->order[c * 8 + 3];
    int near0 = c % 2 ? 2 : 0;
    TEST_CHECK((first == near0 || first == near0 + 1) && (last == near0 || last == near0 + 1),
               "channel %d enters host 0 at %d, leaves at %d", c, first, last);
  }
  topo_free(topo);
}

/*
 * Hosts without any NIC: rings still cross them, at the default network speed, with no NIC
 * named, on the channels every ring across hosts gets at least (one proxy connection is the
 * bottleneck there, not the NIC).
 */
static void test_hosts_without_nics(void) {
  struct braid_topo* topo = build_hosts("h200x4_nvswitch.xml", 2, 4);
  if (topo == NULL) return;
  check_rings(topo, "hosts without NICs");
  TEST_CHECK(topo_rings(topo)->nchannels == tune_table.net_min_channels,
             "hosts without NICs: %d channels (%s)",
             topo_rings(topo)->nchannels, topo_explain(topo));
  TEST_CHECK(topo_channel_net(topo, 0, 0, NULL) == -1, "no NIC to name");
  float bw = 0.0f;
  TEST_CHECK(topo_path(topo, 0, 4, &bw) == BRAID_PATH_NET && bw > 1.2f && bw < 1.3f,
             "default 10 Gb/s");
  topo_free(topo);
}

/* Tree of channel c: one root, consistent up/down, no cycle; returns the root. */
static int check_tree(const struct braid_topo* topo, int c, const char* what) {
  const struct braid_trees* t = topo_trees(topo);
  const struct braid_tree_node* nodes = t->nodes + (size_t)c * t->nranks;
  int roots = 0, root = -1;
  for (int r = 0; r < t->nranks; r++) {
    if (nodes[r].up < 0)
      roots++, root = r;
    else {
      int found = 0;
      for (int k = 0; k < 3; k++) found |= nodes[nodes[r].up].down[k] == r;
      TEST_CHECK(found, "%s channel %d: %d's parent %d does not list it", what, c, r, nodes[r].up);
    }
    for (int k = 0; k < 3; k++)
      if (nodes[r].down[k] >= 0)
        TEST_CHECK(nodes[nodes[r].down[k]].up == r,
                   "%s channel %d: child %d of %d points elsewhere", what, c, nodes[r].down[k], r);
    int steps = 0;
    for (int x = r; x >= 0 && steps <= t->nranks; x = nodes[x].up) steps++;
    TEST_CHECK(steps <= t->nranks, "%s channel %d: a cycle above %d", what, c, r);
  }
  TEST_CHECK(roots == 1, "%s channel %d: %d roots", what, c, roots);
  return root;
}

static void test_trees(void) {
  int hosts[] = {1, 2, 4, 8};
  for (int i = 0; i < 4; i++) {
    char what[64];
    snprintf(what, sizeof what, "%d hosts", hosts[i]);
    struct braid_topo* topo = build_hosts("ib_nic_node.xml", hosts[i], 4);
    if (topo == NULL) continue;
    const struct braid_trees* t = topo_trees(topo);
    TEST_CHECK(t->nchannels == topo_rings(topo)->nchannels && t->nchannels >= 2,
               "%s: tree channels", what);
    int inner[2][8] = {{0}};
    for (int c = 0; c < t->nchannels; c++) {
      int root = check_tree(topo, c, what);
      const struct braid_tree_node* nodes = t->nodes + (size_t)c * t->nranks;
      for (int r = 0; r < t->nranks; r++) {
        if (nodes[r].up >= 0 && topo->rank_host[nodes[r].up] == topo->rank_host[r]) continue;
        /* A host head: count its children on other hosts. */
        int kids = 0;
        for (int k = 0; k < 3; k++)
          kids += nodes[r].down[k] >= 0 && topo->rank_host[nodes[r].down[k]] != topo->rank_host[r];
        if (c < 2 && kids > 0) inner[c][topo->rank_host[r]] = 1;
      }
      if (hosts[i] == 1)
        TEST_CHECK(root == topo_rings(topo)->order[c * 4], "%s: chain starts the ring", what);
    }
    /* Double binary tree: no host is an inner node of both trees. */
    for (int h = 0; hosts[i] > 1 && h < hosts[i]; h++)
      TEST_CHECK(!(inner[0][h] && inner[1][h]), "%s: host %d is inner in both trees", what, h);
    topo_free(topo);
  }
  /* The binary trees themselves, for every size up to 64 positions. */
  for (int n = 1; n <= 64; n++) {
    for (int p = 0; p < n; p++) {
      int u0, a0, b0, u1, a1, b1;
      search_dtree(n, p, &u0, &a0, &b0, &u1, &a1, &b1);
      int kids[4] = {a0, b0, a1, b1}, ups[2] = {u0, u1};
      for (int k = 0; k < 4; k++) {
        if (kids[k] < 0) continue;
        int q0, q1, q2, q3, q4, q5;
        search_dtree(n, kids[k], &q0, &q1, &q2, &q3, &q4, &q5);
        TEST_CHECK((k < 2 ? q0 : q3) == p, "n=%d: child %d of %d has another parent", n, kids[k],
                   p);
      }
      TEST_CHECK((ups[0] < 0) == (p == 0), "n=%d: tree 0 is rooted at 0 only", n);
      if (n % 2 == 0)
        TEST_CHECK(!((a0 >= 0 || b0 >= 0) && (a1 >= 0 || b1 >= 0)),
                   "n=%d: position %d is inner in both trees", n, p);
    }
  }
}

static void test_channel_bounds(void) {
  setenv("BRAID_MAX_NCHANNELS", "4", 1);
  braid_param_reload();
  struct braid_topo* topo = build_hosts("h200x8_nvswitch.xml", 1, 8);
  TEST_CHECK(topo && topo_rings(topo)->nchannels == 4 && topo_rings(topo)->bw_per_channel <= 12.0f,
             "BRAID_MAX_NCHANNELS=4");
  topo_free(topo);
  unsetenv("BRAID_MAX_NCHANNELS");
  setenv("NCCL_MIN_NCHANNELS", "6", 1); /* the NCCL name works too */
  braid_param_reload();
  topo = build_hosts("pcie_4gpu_2socket.xml", 1, 4);
  TEST_CHECK(topo && topo_rings(topo)->nchannels == 6, "NCCL_MIN_NCHANNELS=6: %d",
             topo ? topo_rings(topo)->nchannels : -1);
  topo_free(topo);
  unsetenv("NCCL_MIN_NCHANNELS");
  braid_param_reload();
}

static void test_graph_dump(void) {
  const char* files[2] = {fixture("ib_nic_node.xml"), fixture("twohost_b.xml")};
  int ranks[2] = {4, 4};
  struct braid_topo* topo = NULL;
  struct xml_doc* doc = NULL;
  char path[] = "/tmp/braid_graph_dump_XXXXXX";
  int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  TEST_EXPECT_RES(topo_build_from_files(files, 2, ranks, &topo), ncclSuccess);
  if (topo) TEST_EXPECT_RES(topo_dump_graphs(topo, 0, path), ncclSuccess);
  TEST_EXPECT_RES(xml_parse_file(path, &doc), ncclSuccess);
  unlink(path);
  if (doc && topo) {
    TEST_CHECK(strcmp(doc->root->name, "graphs") == 0 && doc->root->nchildren == 2, "two <graph>s");
    const struct xml_node* ring = doc->root->children[0];
    TEST_CHECK(strcmp(xml_attr_get(ring, "pattern"), "4") == 0, "ring pattern");
    TEST_CHECK(atoi(xml_attr_get(ring, "nchannels")) == topo_rings(topo)->nchannels &&
                   ring->nchildren == topo_rings(topo)->nchannels,
               "channel count");
    TEST_CHECK(strcmp(xml_attr_get(ring, "typeintra"), "NVL") == 0, "typeintra %s",
               xml_attr_get(ring, "typeintra"));
    TEST_CHECK(strcmp(xml_attr_get(ring, "typeinter"), "PIX") == 0, "typeinter %s",
               xml_attr_get(ring, "typeinter"));
    const struct xml_node* ch = ring->children[0];
    TEST_CHECK(ch->nchildren == 6 && strcmp(ch->children[0]->name, "net") == 0 &&
                   strcmp(ch->children[1]->name, "gpu") == 0 &&
                   strcmp(ch->children[5]->name, "net") == 0,
               "a channel is net, 4 gpus, net");
  }
  xml_doc_free(doc);
  topo_free(topo);
}

/* 16 GPUs, NVLink only within pairs: no all-NVLink ring exists; the search ends and stays valid. */
static void test_hard_node(void) {
  char path[] = "/tmp/braid_topo_pairs_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return;
  FILE* f = fdopen(fd, "w");
  fprintf(f, "<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\">\n");
  for (int g = 0; g < 16; g++) {
    int peer = g ^ 1;
    fprintf(f,
            "<pci busid=\"0000:%02x:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" "
            "link_width=\"16\">"
            "<gpu dev=\"%d\" sm=\"80\"><nvlink target=\"0000:%02x:00.0\" count=\"12\" "
            "tclass=\"0x030200\"/></gpu></pci>\n",
            0x10 + g, g, 0x10 + peer);
  }
  fprintf(f, "</cpu></system>\n");
  fclose(f);
  const char* file = path;
  int n = 16;
  struct braid_topo* topo = NULL;
  TEST_EXPECT_RES(topo_build_from_files(&file, 1, &n, &topo), ncclSuccess);
  unlink(path);
  if (topo == NULL) return;
  check_rings(topo, "NVLink pairs");
  const int* o = topo_rings(topo)->order;
  TEST_CHECK(topo_path(topo, o[0], o[1], NULL) == BRAID_PATH_NVL,
             "the ring starts over an NVLink pair");
  topo_free(topo);
}

int main(void) {
  setenv("BRAID_DEBUG", "WARN", 1);
  braid_param_reload();
  test_single_node();
  test_deterministic();
  test_two_hosts();
  test_hosts_without_nics();
  test_trees();
  test_channel_bounds();
  test_graph_dump();
  test_hard_node();
  return test_summary();
}
