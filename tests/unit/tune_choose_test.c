/*
 * The tuning model: what it picks for small, medium and large messages on
 * the fixtures, that it only ever returns what the caller's masks allow,
 * and that BRAID_ALGO / BRAID_PROTO (and their NCCL names) steer it.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "graph/topo.h"
#include "test.h"

#define ALL_ALGOS ((1u << BRAID_ALGO_COUNT) - 1)
#define ALL_PROTOS ((1u << BRAID_PROTO_COUNT) - 1)
#define RING (1u << BRAID_ALGO_RING)
#define SIMPLE (1u << BRAID_PROTO_SIMPLE)

static const char* fixture(const char* name) {
  static char path[8][512];
  static int next;
  char* p = path[next++ % 8];
  snprintf(p, 512, "%s/%s", BRAID_FIXTURES, name);
  return p;
}

static struct braid_topo* build(const char* name, int nhosts, int per_host) {
  const char* files[16];
  int ranks[16];
  struct braid_topo* topo = NULL;
  for (int h = 0; h < nhosts; h++) files[h] = fixture(name), ranks[h] = per_host;
  TEST_EXPECT_RES(topo_build_from_files(files, nhosts, ranks, &topo), ncclSuccess);
  return topo;
}

static struct braid_tune_choice choose(const struct braid_topo* topo, braid_coll_t coll,
                                       size_t bytes, unsigned amask, unsigned pmask) {
  struct braid_tune_choice c;
  memset(&c, 0, sizeof c);
  TEST_EXPECT_RES(tune_choose_topo(topo, coll, bytes, amask, pmask, &c), ncclSuccess);
  return c;
}

static void expect(const struct braid_topo* topo, braid_coll_t coll, size_t bytes, unsigned amask,
                   unsigned pmask, braid_algo_t algo, braid_proto_t proto, const char* what) {
  struct braid_tune_choice c = choose(topo, coll, bytes, amask, pmask);
  TEST_CHECK(c.algo == algo && c.proto == proto, "%s: %s %zu B chose %s/%s, expected %s/%s", what,
             braid_coll_name(coll), bytes, braid_algo_name(c.algo), braid_proto_name(c.proto),
             braid_algo_name(algo), braid_proto_name(proto));
}

/* Today's data path: Ring/Simple only; channels grow with the size, threads stay 512. */
static void test_ring_simple_only(void) {
  struct braid_topo* topo = build("h200x2_nvswitch.xml", 1, 2);
  if (topo == NULL) return;
  float last = 0.0f;
  for (size_t bytes = 8; bytes <= (1ull << 31); bytes *= 4) {
    struct braid_tune_choice c = choose(topo, BRAID_COLL_ALLREDUCE, bytes, RING, SIMPLE);
    TEST_CHECK(c.algo == BRAID_ALGO_RING && c.proto == BRAID_PROTO_SIMPLE,
               "only Ring/Simple allowed");
    TEST_CHECK(c.nthreads == 512, "%zu B: %d threads", bytes, c.nthreads);
    TEST_CHECK(c.time_us >= last, "%zu B: predicted time falls with size", bytes);
    last = c.time_us;
  }
  TEST_CHECK(choose(topo, BRAID_COLL_ALLREDUCE, 8, RING, SIMPLE).nchannels == 1,
             "8 B: one channel");
  TEST_CHECK(choose(topo, BRAID_COLL_ALLREDUCE, 256 << 10, RING, SIMPLE).nchannels == 9,
             "256 KiB: 9 channels");
  TEST_CHECK(choose(topo, BRAID_COLL_ALLREDUCE, 1 << 30, RING, SIMPLE).nchannels == 32,
             "1 GiB: all 32");
  /* Large messages approach 32 x 12 x 0.86 GB/s of bus bandwidth (2 ranks: algbw = busbw). */
  struct braid_tune_choice c = choose(topo, BRAID_COLL_ALLREDUCE, 1 << 30, RING, SIMPLE);
  float busbw = (float)(1 << 30) / (c.time_us * 1e3f);
  TEST_CHECK(busbw > 300.0f && busbw < 340.0f, "1 GiB all-reduce at %.0f GB/s predicted", busbw);
  topo_free(topo);
}

static struct braid_topo* build_with(const char* var, const char* value, const char* name,
                                     int nhosts, int per_host) {
  setenv(var, value, 1);
  braid_param_reload();
  struct braid_topo* topo = build(name, nhosts, per_host);
  unsetenv(var);
  braid_param_reload();
  return topo;
}

/*
 * Every algorithm and protocol allowed (one NVSwitch node): LL small, Simple
 * large; LL128 only when BRAID_PROTO names it (tune_table.proto_auto), and
 * then it takes the middle sizes.
 */
static void test_sizes(void) {
  struct braid_topo* topo =
      build_with("BRAID_PROTO", "LL,LL128,Simple", "h200x8_nvswitch.xml", 1, 8);
  if (topo == NULL) return;
  expect(topo, BRAID_COLL_ALLREDUCE, 8, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING, BRAID_PROTO_LL,
         "8 GPUs, LL128 allowed");
  expect(topo, BRAID_COLL_ALLREDUCE, 1 << 20, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_LL128, "8 GPUs, LL128 allowed");
  expect(topo, BRAID_COLL_ALLREDUCE, 1u << 30, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_SIMPLE, "8 GPUs, LL128 allowed");
  topo_free(topo);
  topo = build("h200x8_nvswitch.xml", 1, 8);
  if (topo == NULL) return;
  for (size_t bytes = 8; bytes <= (1ull << 30); bytes *= 4)
    TEST_CHECK(
        choose(topo, BRAID_COLL_ALLREDUCE, bytes, ALL_ALGOS, ALL_PROTOS).proto != BRAID_PROTO_LL128,
        "8 GPUs, %zu B: LL128 chosen without BRAID_PROTO", bytes);
  expect(topo, BRAID_COLL_ALLREDUCE, 8, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING, BRAID_PROTO_LL,
         "8 GPUs");
  expect(topo, BRAID_COLL_ALLREDUCE, 1u << 30, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_SIMPLE, "8 GPUs");
  expect(topo, BRAID_COLL_ALLGATHER, 1u << 30, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_SIMPLE, "8 GPUs");
  /* One node: trees are never picked on their own (they are chains). */
  for (size_t bytes = 8; bytes <= (1ull << 30); bytes *= 8)
    TEST_CHECK(
        choose(topo, BRAID_COLL_ALLREDUCE, bytes, ALL_ALGOS, ALL_PROTOS).algo == BRAID_ALGO_RING,
        "one node, %zu B: no tree", bytes);
  topo_free(topo);
  /* PCIe: LL128 is unsafe there and never chosen, even when allowed. */
  topo = build("pcie_4gpu_2socket.xml", 1, 4);
  for (size_t bytes = 8; topo && bytes <= (1ull << 30); bytes *= 4)
    TEST_CHECK(
        choose(topo, BRAID_COLL_ALLREDUCE, bytes, ALL_ALGOS, ALL_PROTOS).proto != BRAID_PROTO_LL128,
        "PCIe, %zu B: LL128 chosen", bytes);
  topo_free(topo);
}

/*
 * The LL/Simple switch within one host, as measured (docs/tuning.md, Tuning model constants):
 * two ranks take Simple from 1 MB (all-reduce, broadcast) and 2 MB (all-gather, reduce-scatter);
 * four ranks, where a ring forwards, keep LL up to 2 MB for all-reduce, all-gather and
 * reduce-scatter and take Simple at 4 MB; broadcast does not pay the forwarding cost.
 */
static void test_ll_switch(void) {
  struct braid_topo* topo = build("h200x2_nvswitch.xml", 1, 2);
  if (topo == NULL) return;
  expect(topo, BRAID_COLL_ALLREDUCE, 512 << 10, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_LL, "2 GPUs");
  expect(topo, BRAID_COLL_ALLREDUCE, 1 << 20, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_SIMPLE, "2 GPUs");
  expect(topo, BRAID_COLL_ALLGATHER, 1 << 20, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_LL, "2 GPUs");
  expect(topo, BRAID_COLL_REDUCESCATTER, 2 << 20, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_SIMPLE, "2 GPUs");
  expect(topo, BRAID_COLL_BROADCAST, 1 << 20, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_SIMPLE, "2 GPUs");
  topo_free(topo);
  topo = build("h200x4_nvswitch.xml", 1, 4);
  if (topo == NULL) return;
  const braid_coll_t fwd[] = {BRAID_COLL_ALLREDUCE, BRAID_COLL_ALLGATHER, BRAID_COLL_REDUCESCATTER};
  for (size_t i = 0; i < sizeof fwd / sizeof fwd[0]; i++) {
    expect(topo, fwd[i], 2 << 20, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING, BRAID_PROTO_LL, "4 GPUs");
    expect(topo, fwd[i], 4 << 20, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING, BRAID_PROTO_SIMPLE,
           "4 GPUs");
  }
  expect(topo, BRAID_COLL_BROADCAST, 2 << 20, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_SIMPLE, "4 GPUs");
  topo_free(topo);
}

/* Across hosts: trees win small all-reduces, rings large ones. */
static void test_multi_host(void) {
  int hosts[] = {2, 4, 8};
  for (int i = 0; i < 3; i++) {
    struct braid_topo* topo = build("ib_nic_node.xml", hosts[i], 4);
    if (topo == NULL) continue;
    char what[32];
    snprintf(what, sizeof what, "%d hosts", hosts[i]);
    expect(topo, BRAID_COLL_ALLREDUCE, 8, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_TREE, BRAID_PROTO_LL,
           what);
    expect(topo, BRAID_COLL_ALLREDUCE, 1u << 30, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
           BRAID_PROTO_SIMPLE, what);
    expect(topo, BRAID_COLL_ALLGATHER, 8, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING, BRAID_PROTO_LL,
           what);
    topo_free(topo);
  }
}

/*
 * Sixteen hosts, as across hosts the data path runs Simple only: trees for
 * small all-reduces (4 network levels instead of the ring's 2 x 15 steps
 * across hosts, and Direct's 15 peers), rings for large ones; with one GPU
 * per host and with eight (128 ranks, past Direct's 32: there the ring's 254
 * steps cost ~1 ms, and it wins only from ~2 GiB).
 */
static void test_sixteen_hosts(void) {
  const char* names[] = {"ib_nic_node.xml", "dgx_h100_8nic.xml"};
  const int per_host[] = {1, 8};
  const size_t ring_from[] = {1ull << 30, 1ull << 32};
  for (int i = 0; i < 2; i++) {
    struct braid_topo* topo = build(names[i], 16, per_host[i]);
    if (topo == NULL) continue;
    char what[64];
    snprintf(what, sizeof what, "16 hosts x %d GPU (%s)", per_host[i], names[i]);
    for (size_t bytes = 8; bytes <= 1024; bytes *= 4)
      expect(topo, BRAID_COLL_ALLREDUCE, bytes, ALL_ALGOS, SIMPLE, BRAID_ALGO_TREE,
             BRAID_PROTO_SIMPLE, what);
    expect(topo, BRAID_COLL_ALLREDUCE, ring_from[i], ALL_ALGOS, SIMPLE, BRAID_ALGO_RING,
           BRAID_PROTO_SIMPLE, what);
    topo_free(topo);
  }
}

/* Whatever the masks, the answer is inside them. */
static void test_masks(void) {
  struct braid_topo* topo = build("ib_nic_node.xml", 2, 4);
  if (topo == NULL) return;
  for (unsigned am = 1; am <= ALL_ALGOS; am++)
    for (unsigned pm = 1; pm <= ALL_PROTOS; pm++)
      for (int coll = 0; coll < BRAID_COLL_COUNT; coll++)
        for (size_t bytes = 0; bytes <= (1ull << 32); bytes = bytes ? bytes * 16 : 1) {
          struct braid_tune_choice c = choose(topo, (braid_coll_t)coll, bytes, am, pm);
          TEST_CHECK((am >> c.algo & 1) && (pm >> c.proto & 1), "masks %x/%x: got %s/%s", am, pm,
                     braid_algo_name(c.algo), braid_proto_name(c.proto));
          TEST_CHECK(c.nchannels >= 1 && c.nchannels <= BRAID_MAX_CHANNELS, "channels %d",
                     c.nchannels);
        }
  struct braid_tune_choice c;
  TEST_EXPECT_RES(tune_choose_topo(topo, BRAID_COLL_ALLREDUCE, 8, 0, ALL_PROTOS, &c),
                  ncclInternalError);
  TEST_EXPECT_RES(tune_choose_topo(topo, BRAID_COLL_COUNT, 8, ALL_ALGOS, ALL_PROTOS, &c),
                  ncclInternalError);
  topo_free(topo);
}

/*
 * The direct all-reduce (one hop to every peer): small all-reduces across
 * hosts (Simple, the one protocol there) from three ranks on, never large ones, never two ranks
 * (the ring's one-hop exchange serves them), never another collective; BRAID_ALGO=Direct forces it
 * even on one host.
 */
static void test_direct(void) {
  const unsigned direct = 1u << BRAID_ALGO_DIRECT;
  struct braid_topo* topo = build("ib_nic_node.xml", 4, 1);
  if (topo) {
    for (size_t bytes = 8; bytes <= 4096; bytes *= 8) {
      expect(topo, BRAID_COLL_ALLREDUCE, bytes, ALL_ALGOS, SIMPLE, BRAID_ALGO_DIRECT,
             BRAID_PROTO_SIMPLE, "4 hosts x 1 GPU");
    }
    expect(topo, BRAID_COLL_ALLREDUCE, 1u << 30, ALL_ALGOS, SIMPLE, BRAID_ALGO_RING,
           BRAID_PROTO_SIMPLE, "4 hosts x 1 GPU");
    struct braid_tune_choice c = choose(topo, BRAID_COLL_ALLGATHER, 8, ALL_ALGOS, ALL_PROTOS);
    TEST_CHECK(c.algo == BRAID_ALGO_RING, "all-gather chose %s", braid_algo_name(c.algo));
    topo_free(topo);
  }
  topo = build("ib_nic_node.xml", 2, 1);
  if (topo) {
    for (size_t bytes = 8; bytes <= (1u << 30); bytes *= 64)
      TEST_CHECK(choose(topo, BRAID_COLL_ALLREDUCE, bytes, ALL_ALGOS, ALL_PROTOS).algo !=
                     BRAID_ALGO_DIRECT,
                 "2 ranks, %zu B: direct chosen", bytes);
    topo_free(topo);
  }
  topo = build("h200x2_nvswitch.xml", 1, 2);
  if (topo) {
    TEST_CHECK(
        choose(topo, BRAID_COLL_ALLREDUCE, 8, ALL_ALGOS, ALL_PROTOS).algo != BRAID_ALGO_DIRECT,
        "one host: direct chosen unasked");
    topo_free(topo);
  }
  topo = build_with("BRAID_ALGO", "Direct", "h200x2_nvswitch.xml", 1, 2);
  expect(topo, BRAID_COLL_ALLREDUCE, 1u << 20, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_DIRECT,
         BRAID_PROTO_SIMPLE, "BRAID_ALGO=Direct on one host");
  expect(topo, BRAID_COLL_ALLREDUCE, 1u << 20, RING | direct, ALL_PROTOS, BRAID_ALGO_DIRECT,
         BRAID_PROTO_SIMPLE, "BRAID_ALGO=Direct on one host");
  TEST_CHECK(
      topo && choose(topo, BRAID_COLL_BROADCAST, 8, ALL_ALGOS, ALL_PROTOS).algo == BRAID_ALGO_RING,
      "BRAID_ALGO=Direct: broadcast has no direct algorithm");
  topo_free(topo);
}

static void test_overrides(void) {
  struct braid_topo* topo = build_with("BRAID_PROTO", "LL", "h200x2_nvswitch.xml", 1, 2);
  expect(topo, BRAID_COLL_ALLREDUCE, 1u << 30, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_LL, "BRAID_PROTO=LL");
  expect(topo, BRAID_COLL_ALLREDUCE, 1u << 30, RING, SIMPLE, BRAID_ALGO_RING, BRAID_PROTO_SIMPLE,
         "BRAID_PROTO=LL but the caller runs Simple only");
  topo_free(topo);
  topo = build_with("NCCL_PROTO", "LL128", "h200x2_nvswitch.xml", 1, 2);
  expect(topo, BRAID_COLL_ALLREDUCE, 8, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING, BRAID_PROTO_LL128,
         "NCCL_PROTO=LL128");
  topo_free(topo);
  /* An exclusion only removes from the model's own choice (LL128 stays off unless named). */
  topo = build_with("BRAID_PROTO", "^ll", "h200x2_nvswitch.xml", 1, 2);
  expect(topo, BRAID_COLL_ALLREDUCE, 8, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING, BRAID_PROTO_SIMPLE,
         "BRAID_PROTO=^ll");
  topo_free(topo);
  topo = build_with("BRAID_ALGO", "Tree", "h200x2_nvswitch.xml", 1, 2);
  expect(topo, BRAID_COLL_ALLREDUCE, 1u << 30, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_TREE,
         BRAID_PROTO_SIMPLE, "BRAID_ALGO=Tree on one node");
  expect(topo, BRAID_COLL_ALLGATHER, 1u << 30, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_SIMPLE, "BRAID_ALGO=Tree: all-gather has no tree");
  topo_free(topo);
  topo = build_with("BRAID_ALGO", "allreduce:tree;allgather:ring", "ib_nic_node.xml", 2, 4);
  expect(topo, BRAID_COLL_ALLREDUCE, 1u << 30, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_TREE,
         BRAID_PROTO_SIMPLE, "per collective");
  expect(topo, BRAID_COLL_BROADCAST, 1u << 30, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
         BRAID_PROTO_SIMPLE, "per collective");
  topo_free(topo);
  topo = build_with("NCCL_ALGO", "NVLS,Ring", "ib_nic_node.xml", 2, 4);
  expect(topo, BRAID_COLL_ALLREDUCE, 8, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING, BRAID_PROTO_LL,
         "NCCL's NVLS ignored");
  topo_free(topo);
  topo = build_with("BRAID_NTHREADS", "256", "h200x2_nvswitch.xml", 1, 2);
  TEST_CHECK(topo && choose(topo, BRAID_COLL_ALLREDUCE, 8, RING, SIMPLE).nthreads == 256,
             "BRAID_NTHREADS=256");
  topo_free(topo);
  /* Mistakes are errors that name the variable and the word. */
  setenv("BRAID_ALGO", "ring,tee", 1);
  braid_param_reload();
  const char* file = fixture("h200x2_nvswitch.xml");
  int n = 2;
  topo = NULL;
  TEST_EXPECT_RES(topo_build_from_files(&file, 1, &n, &topo), ncclInvalidUsage);
  TEST_CHECK(strstr(braid_err_last(), "BRAID_ALGO: unknown name 'tee'") != NULL, "message: %s",
             braid_err_last());
  setenv("BRAID_ALGO", "allreduce=tree", 1);
  braid_param_reload();
  TEST_EXPECT_RES(topo_build_from_files(&file, 1, &n, &topo), ncclInvalidUsage);
  setenv("BRAID_ALGO", "allreduc:tree", 1);
  braid_param_reload();
  TEST_EXPECT_RES(topo_build_from_files(&file, 1, &n, &topo), ncclInvalidUsage);
  TEST_CHECK(strstr(braid_err_last(), "unknown collective 'allreduc'") != NULL, "message: %s",
             braid_err_last());
  unsetenv("BRAID_ALGO");
  braid_param_reload();
}

/* The INFO log of a choice (BRAID_DEBUG_SUBSYS=TUNING), read back from BRAID_DEBUG_FILE. */
static char* explain(const struct braid_topo* topo, braid_coll_t coll, size_t bytes, unsigned amask,
                     unsigned pmask) {
  char path[] = "/tmp/braid_tune_log_XXXXXX";
  int fd = mkstemp(path);
  static char text[4096];
  text[0] = '\0';
  if (fd < 0) return text;
  close(fd);
  setenv("BRAID_DEBUG", "INFO", 1);
  setenv("BRAID_DEBUG_SUBSYS", "TUNING", 1);
  setenv("BRAID_DEBUG_FILE", path, 1);
  braid_log_reset();
  choose(topo, coll, bytes, amask, pmask);
  setenv("BRAID_DEBUG", "NONE", 1);
  unsetenv("BRAID_DEBUG_SUBSYS");
  unsetenv("BRAID_DEBUG_FILE");
  braid_log_reset(); /* closes the file */
  FILE* f = fopen(path, "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  text[n] = '\0';
  if (f) fclose(f);
  unlink(path);
  return text;
}

static void expect_line(const char* text, const char* want, const char* what) {
  TEST_CHECK(strstr(text, want) != NULL, "%s: the log line lacks \"%s\":\n%s", what, want, text);
}

static void test_explain(void) {
  struct braid_topo* topo = build("h200x8_nvswitch.xml", 1, 8);
  if (topo == NULL) return;
  const char* text = explain(topo, BRAID_COLL_ALLREDUCE, 1 << 20, ALL_ALGOS, ALL_PROTOS);
  expect_line(text, "Ring/LL128 ", "1 MiB, default protocols");
  expect_line(text, "(excluded: off by default: only when BRAID_PROTO names it)",
              "1 MiB, default protocols");
  topo_free(topo);
  topo = build_with("BRAID_PROTO", "LL,LL128,Simple", "h200x8_nvswitch.xml", 1, 8);
  if (topo == NULL) return;
  text = explain(topo, BRAID_COLL_ALLREDUCE, 1 << 20, ALL_ALGOS, ALL_PROTOS);
  int lines = 0;
  for (const char* c = text; *c; c++) lines += *c == '\n';
  TEST_CHECK(lines == 1, "one choice, %d log lines:\n%s", lines, text);
  expect_line(text, "BRAID INFO TUNING AllReduce 1048576 B on 8 ranks: Ring/LL128, ", "1 MiB");
  expect_line(text, "us predicted (", "1 MiB");
  expect_line(text, "us latency + ", "1 MiB");
  expect_line(text, "Ring/Simple ", "1 MiB");
  expect_line(text, "Tree/LL128 ", "1 MiB");
  text = explain(topo, BRAID_COLL_ALLREDUCE, 1 << 20, RING, SIMPLE);
  expect_line(text, ": Ring/Simple, ", "Simple only");
  expect_line(text, "Ring/LL128 ", "Simple only");
  expect_line(text, "(excluded: caller cannot run it)", "Simple only");
  topo_free(topo);
  topo = build_with("BRAID_PROTO", "Simple", "h200x8_nvswitch.xml", 1, 8);
  text = explain(topo, BRAID_COLL_ALLREDUCE, 8, ALL_ALGOS, ALL_PROTOS);
  expect_line(text, "AllReduce 8 B on 8 ranks: Ring/Simple", "BRAID_PROTO=Simple");
  expect_line(text, "Ring/LL ", "BRAID_PROTO=Simple");
  expect_line(text, "(excluded: BRAID_PROTO)", "BRAID_PROTO=Simple");
  topo_free(topo);
  /* PCIe: LL128 is the topology's to exclude, and is not even listed (no bandwidth there). */
  topo = build("pcie_4gpu_2socket.xml", 1, 4);
  text = explain(topo, BRAID_COLL_ALLGATHER, 8, ALL_ALGOS, ALL_PROTOS);
  expect_line(text, "AllGather 8 B on 4 ranks: Ring/LL, ", "PCIe");
  TEST_CHECK(strstr(text, "LL128") == NULL, "PCIe: LL128 listed:\n%s", text);
  topo_free(topo);
}

/*
 * An exclusion only removes: "^tree" never turns on Direct, nor "^ring" Tree, on one host;
 * "^simple" does not turn LL128 on (off by default), and "^simple,ll" leaves LL128 alone.
 */
static void test_exclusions(void) {
  struct braid_topo* topo = build_with("BRAID_ALGO", "^tree", "h200x2_nvswitch.xml", 1, 2);
  if (topo == NULL) return;
  for (size_t bytes = 8; bytes <= (1ull << 30); bytes *= 16)
    TEST_CHECK(choose(topo, BRAID_COLL_ALLREDUCE, bytes, ALL_ALGOS, ALL_PROTOS).algo ==
                   BRAID_ALGO_RING,
               "BRAID_ALGO=^tree, 2 GPUs, %zu B: the ring, as without it", bytes);
  topo_free(topo);
  topo = build_with("BRAID_ALGO", "^ring", "h200x8_nvswitch.xml", 1, 8);
  if (topo == NULL) return;
  TEST_CHECK(choose(topo, BRAID_COLL_ALLREDUCE, 1 << 20, ALL_ALGOS, ALL_PROTOS).algo !=
                 BRAID_ALGO_TREE,
             "BRAID_ALGO=^ring on one node does not ask for trees");
  topo_free(topo);
  topo = build_with("BRAID_PROTO", "^simple", "h200x8_nvswitch.xml", 1, 8);
  if (topo == NULL) return;
  for (size_t bytes = 8; bytes <= (1ull << 30); bytes *= 16)
    TEST_CHECK(choose(topo, BRAID_COLL_ALLREDUCE, bytes, ALL_ALGOS, ALL_PROTOS).proto ==
                   BRAID_PROTO_LL,
               "BRAID_PROTO=^simple, %zu B: LL (LL128 stays off by default)", bytes);
  topo_free(topo);
  topo = build_with("BRAID_PROTO", "^simple,ll", "h200x8_nvswitch.xml", 1, 8);
  if (topo == NULL) return;
  TEST_CHECK(choose(topo, BRAID_COLL_ALLREDUCE, 1 << 20, ALL_ALGOS, ALL_PROTOS).proto ==
                 BRAID_PROTO_LL128,
             "BRAID_PROTO=^simple,ll leaves LL128");
  topo_free(topo);
}

int main(void) {
  setenv("BRAID_DEBUG", "NONE", 1); /* the override mistakes WARN by design */
  braid_param_reload();
  test_ring_simple_only();
  test_sizes();
  test_ll_switch();
  test_multi_host();
  test_direct();
  test_sixteen_hosts();
  test_masks();
  test_overrides();
  test_exclusions();
  test_explain();
  return test_summary();
}
