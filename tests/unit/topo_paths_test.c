/*
 * Path types and bottleneck bandwidths on every fixture: NVLink through the
 * NVSwitch, NVLink through a bridge GPU, one and several PCIe switches, a
 * host bridge, across sockets, GPU to NIC, and across hosts.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/param.h"
#include "graph/topo.h"
#include "test.h"

static const char* fixture(const char* name) {
  static char path[4][512];
  static int next;
  char* p = path[next++ % 4];
  snprintf(p, 512, "%s/%s", BRAID_FIXTURES, name);
  return p;
}

static int near(float a, float b) { return fabsf(a - b) <= 0.05f * fabsf(b) + 0.01f; }

static void expect_path(const struct braid_topo* topo, int a, int b, braid_path_type_t type,
                        float bw, const char* what) {
  float got_bw = 0.0f;
  braid_path_type_t got = topo_path(topo, a, b, &got_bw);
  TEST_CHECK(got == type, "%s: path %d->%d is %s, expected %s", what, a, b,
             topo_path_type_name(got), topo_path_type_name(type));
  TEST_CHECK(near(got_bw, bw), "%s: path %d->%d carries %.2f GB/s, expected %.2f", what, a, b,
             got_bw, bw);
}

static struct braid_topo* build(const char* name, int nranks) {
  struct braid_topo* topo = NULL;
  const char* file = fixture(name);
  TEST_EXPECT_RES(topo_build_from_files(&file, 1, &nranks, &topo), ncclSuccess);
  return topo;
}

/* Bandwidths the model must derive (tune_table.c): NVLink per link, PCIe per lane, sockets. */
static const float nv18_sm90 = 18 * 22.0f, nv4_sm80 = 4 * 20.0f;
static float pcie(float gts, int lanes) {
  return (float)lanes * gts * (128.0f / 130.0f) / 8.0f * 0.88f;
}

static void test_nvswitch(void) {
  /* nccl_h200x2_dump.xml is NCCL 2.28's own NCCL_TOPO_DUMP_FILE from the 2x H200 machine, as written. */
  const char* names[] = {"h200x2_nvswitch.xml", "h200x4_nvswitch.xml", "h200x8_nvswitch.xml",
                         "nccl_dump_vm.xml", "nccl_h200x2_dump.xml"};
  int n[] = {2, 4, 8, 2, 2};
  for (int f = 0; f < 5; f++) {
    struct braid_topo* topo = build(names[f], n[f]);
    if (topo == NULL) continue;
    for (int a = 0; a < n[f]; a++) {
      expect_path(topo, a, a, BRAID_PATH_LOC, 5000.0f, names[f]);
      for (int b = 0; b < n[f]; b++)
        if (a != b) expect_path(topo, a, b, BRAID_PATH_NVL, nv18_sm90, names[f]);
    }
    topo_free(topo);
  }
}

static void test_pcie(void) {
  struct braid_topo* topo = build("pcie_4gpu_2socket.xml", 4);
  if (topo == NULL) return;
  expect_path(topo, 0, 1, BRAID_PATH_PIX, pcie(16.0f, 16), "same switch");
  expect_path(topo, 2, 3, BRAID_PATH_PIX, pcie(16.0f, 16), "same switch");
  expect_path(topo, 0, 2, BRAID_PATH_SYS, 10.0f, "across Skylake sockets");
  expect_path(topo, 3, 1, BRAID_PATH_SYS, 10.0f, "across Skylake sockets");
  expect_path(topo, 0, 9, BRAID_PATH_DIS, 0.0f, "no such rank");
  topo_free(topo);
}

static void test_nvlink_bridge(void) {
  struct braid_topo* topo = build("nvlink_bridge_3gpu.xml", 3);
  if (topo == NULL) return;
  expect_path(topo, 0, 1, BRAID_PATH_NVL, nv4_sm80, "direct NVLink");
  expect_path(topo, 1, 2, BRAID_PATH_NVL, nv4_sm80, "direct NVLink");
  expect_path(topo, 0, 2, BRAID_PATH_NVB, nv4_sm80, "NVLink through GPU 1");
  expect_path(topo, 2, 0, BRAID_PATH_NVB, nv4_sm80, "NVLink through GPU 1");
  topo_free(topo);
}

/* Paths to network ports, read from the host graph. */
static void expect_net(const struct braid_topo* topo, int rank, const char* net,
                       braid_path_type_t type, float bw) {
  const struct topo_system* sys = topo->hosts[topo->rank_host[rank]].sys;
  for (int n = 0; n < sys->nnodes; n++) {
    if (sys->nodes[n].type != TOPO_NET || strcmp(sys->nodes[n].u.net.name, net) != 0) continue;
    const struct topo_path* p = topo_path_get(sys, topo->rank_gpu[rank], n);
    TEST_CHECK(p && p->type == (int)type, "rank %d -> %s: %s, expected %s", rank, net,
               p ? topo_path_type_name(p->type) : "none", topo_path_type_name(type));
    TEST_CHECK(p && near(p->bw, bw), "rank %d -> %s: %.2f GB/s, expected %.2f", rank, net,
               p ? p->bw : 0.0f, bw);
    return;
  }
  TEST_CHECK(0, "no network port %s", net);
}

static void test_nics(void) {
  struct braid_topo* topo = build("ib_nic_node.xml", 4);
  if (topo == NULL) return;
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++)
      if (a != b) expect_path(topo, a, b, BRAID_PATH_NVL, nv18_sm90, "H100 NVSwitch");
  expect_net(topo, 0, "mlx5_0", BRAID_PATH_PIX, 50.0f); /* NDR under GPU 0's switch */
  expect_net(topo, 1, "mlx5_0", BRAID_PATH_PIX, 50.0f);
  expect_net(topo, 2, "mlx5_1", BRAID_PATH_PIX, 50.0f);
  expect_net(topo, 0, "mlx5_1", BRAID_PATH_SYS, 22.0f); /* Sapphire Rapids socket link */
  expect_net(topo, 2, "mlx5_2", BRAID_PATH_PHB, 25.0f); /* HDR on the socket's root port */
  expect_net(topo, 0, "mlx5_2", BRAID_PATH_SYS, 22.0f);
  float bw = 0.0f;
  TEST_CHECK(topo_net_path(topo, 3, "mlx5_1", &bw) == BRAID_PATH_PIX && bw == 50.0f,
             "topo_net_path");
  TEST_CHECK(topo_net_path(topo, 3, "mlx5_9", &bw) == BRAID_PATH_DIS && bw == 0.0f, "no such port");
  topo_free(topo);
  /* The VM dump: a NIC straight on the CPU element, an unknown speed (-1: 10 Gb/s). */
  topo = build("nccl_dump_vm.xml", 2);
  if (topo == NULL) return;
  expect_net(topo, 0, "eth0", BRAID_PATH_PHB, 1.25f);
  expect_net(topo, 1, "mlx5_0", BRAID_PATH_PHB,
             pcie(8.0f, 16)); /* link_speed="" counts as Gen3 x16 */
  topo_free(topo);
}

static void test_two_hosts(void) {
  const char* files[2] = {fixture("ib_nic_node.xml"), fixture("twohost_b.xml")};
  int ranks[2] = {4, 4};
  struct braid_topo* topo = NULL;
  TEST_EXPECT_RES(topo_build_from_files(files, 2, ranks, &topo), ncclSuccess);
  if (topo == NULL) return;
  TEST_CHECK(topo->nhosts == 2, "two hosts");
  expect_path(topo, 0, 1, BRAID_PATH_NVL, nv18_sm90, "same host");
  expect_path(topo, 5, 6, BRAID_PATH_NVL, nv18_sm90, "same host");
  expect_path(topo, 0, 4, BRAID_PATH_NET, 50.0f, "across hosts through NDR");
  expect_path(topo, 7, 2, BRAID_PATH_NET, 50.0f, "across hosts through NDR");
  topo_free(topo);
}

/* Nested switches: one switch apart (PIX), several (PXB). Written to a temporary file. */
static void test_nested_switches(void) {
  const char* text =
      "<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\">\n"
      " <pci busid=\"0000:10:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\">\n"
      "  <pci busid=\"0000:11:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\">\n"
      "   <pci busid=\"0000:12:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\"><gpu dev=\"0\" sm=\"80\"/></pci>\n"
      "   <pci busid=\"0000:13:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\"><gpu dev=\"1\" sm=\"80\"/></pci>\n"
      "  </pci>\n"
      "  <pci busid=\"0000:14:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"8\">\n"
      "   <pci busid=\"0000:15:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\"><gpu dev=\"2\" sm=\"80\"/></pci>\n"
      "  </pci>\n"
      "  <pci busid=\"0000:16:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\"><gpu dev=\"3\" sm=\"80\"/></pci>\n"
      " </pci>\n"
      " <pci busid=\"0000:20:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\"><gpu dev=\"4\" sm=\"80\"/></pci>\n"
      "</cpu></system>\n";
  char path[] = "/tmp/braid_topo_nested_XXXXXX";
  int fd = mkstemp(path);
  TEST_CHECK(fd >= 0, "mkstemp");
  if (fd < 0) return;
  TEST_CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write");
  close(fd);
  const char* file = path;
  int n = 5;
  struct braid_topo* topo = NULL;
  TEST_EXPECT_RES(topo_build_from_files(&file, 1, &n, &topo), ncclSuccess);
  unlink(path);
  if (topo == NULL) return;
  expect_path(topo, 0, 1, BRAID_PATH_PIX, pcie(16.0f, 16), "same leaf switch");
  expect_path(topo, 0, 3, BRAID_PATH_PXB, pcie(16.0f, 16), "leaf switch then its parent");
  expect_path(topo, 0, 2, BRAID_PATH_PXB, pcie(16.0f, 8), "two leaf switches, x8 uplink");
  expect_path(topo, 0, 4, BRAID_PATH_PHB, pcie(16.0f, 16), "through the host bridge");
  topo_free(topo);
}

/* Peer-to-peer disabled: GPUs go through host memory, even with NVLink between them. */
static void test_p2p_disabled(void) {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  braid_param_reload();
  struct braid_topo* topo = build("h200x2_nvswitch.xml", 2);
  if (topo) expect_path(topo, 0, 1, BRAID_PATH_SYS, 22.0f, "P2P disabled, across sockets");
  topo_free(topo);
  topo = build("h200x4_nvswitch.xml", 4);
  if (topo) {
    expect_path(topo, 0, 1, BRAID_PATH_PHB, pcie(32.0f, 16), "P2P disabled, same socket");
    expect_path(topo, 1, 2, BRAID_PATH_SYS, 22.0f, "P2P disabled, across sockets");
    TEST_CHECK(topo->ring_intra_type >= BRAID_PATH_PHB, "P2P disabled: rings avoid NVLink");
  }
  topo_free(topo);
  unsetenv("NCCL_P2P_DISABLE");
  braid_param_reload();
}

int main(void) {
  setenv("BRAID_DEBUG", "WARN", 1);
  test_nvswitch();
  test_pcie();
  test_nvlink_bridge();
  test_nics();
  test_two_hosts();
  test_nested_switches();
  test_p2p_disabled();
  return test_summary();
}
