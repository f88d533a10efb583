/*
 * NCCL tuner plugins (graph/tune_plugin.c) on the fixtures, without a GPU:
 * the test tuners of tests/plugins (built as libnccl-tuner-*.so in
 * BRAID_PLUGIN_DIR, which is on LD_LIBRARY_PATH) are loaded through the same
 * loader a communicator uses. A forcing tuner of each interface version gets
 * its choice, within the caller's masks and BRAID_ALGO / BRAID_PROTO; a
 * tuner's channel count is taken, bounded; `none`, a missing tuner and a
 * library of no known version leave the model's choice, the last two with a
 * WARN that names them; picks Braid cannot run (NVLS, an excluded protocol)
 * are ignored with one INFO; a tuner in the net plugin's library (handed to
 * the loader) is found; every library closes with its last user, also when
 * threads open and close tuners at once.
 *
 *   tune_plugin_test            the above
 *   tune_plugin_test default    BRAID_TUNER_PLUGIN unset finds libnccl-tuner.so
 */
#include <dlfcn.h>
#include <pthread.h>
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
#define MB (1u << 20)

static const char* path_in(const char* dir, const char* name) {
  static char path[8][512];
  static int next;
  char* p = path[next++ % 8];
  snprintf(p, 512, "%s/%s", dir, name);
  return p;
}

static struct braid_topo* build(const char* name, int nhosts, int per_host) {
  const char* files[4];
  int ranks[4];
  struct braid_topo* topo = NULL;
  for (int h = 0; h < nhosts; h++) files[h] = path_in(BRAID_FIXTURES, name), ranks[h] = per_host;
  TEST_EXPECT_RES(topo_build_from_files(files, nhosts, ranks, &topo), ncclSuccess);
  return topo;
}

/* As build, with `var` set while the model reads the environment. */
static struct braid_topo* build_with(const char* var, const char* value, const char* name) {
  setenv(var, value, 1);
  braid_param_reload();
  struct braid_topo* topo = build(name, 1, 2);
  unsetenv(var);
  braid_param_reload();
  return topo;
}

static struct braid_tune_choice choose(const struct braid_topo* topo, braid_coll_t coll,
                                       size_t bytes, unsigned amask, unsigned pmask) {
  struct braid_tune_choice c;
  memset(&c, 0, sizeof c);
  TEST_EXPECT_RES(tune_choose_topo(topo, coll, bytes, amask, pmask, &c), ncclSuccess);
  return c;
}

static int same(struct braid_tune_choice a, struct braid_tune_choice b) {
  return a.algo == b.algo && a.proto == b.proto && a.nchannels == b.nchannels;
}

static void expect(const struct braid_topo* topo, braid_coll_t coll, size_t bytes, unsigned amask,
                   unsigned pmask, braid_algo_t algo, braid_proto_t proto, const char* what) {
  struct braid_tune_choice c = choose(topo, coll, bytes, amask, pmask);
  TEST_CHECK(c.algo == algo && c.proto == proto, "%s: %s %zu B chose %s/%s, expected %s/%s", what,
             braid_coll_name(coll), bytes, braid_algo_name(c.algo), braid_proto_name(c.proto),
             braid_algo_name(algo), braid_proto_name(proto));
}

/* ---- the log, captured through BRAID_DEBUG_FILE ---- */

static char log_path[64];

static void log_start(void) {
  snprintf(log_path, sizeof log_path, "/tmp/braid_tuner_log_XXXXXX");
  int fd = mkstemp(log_path);
  if (fd >= 0) close(fd);
  setenv("BRAID_DEBUG", "INFO", 1);
  setenv("BRAID_DEBUG_SUBSYS", "INIT,TUNING,ENV", 1);
  setenv("BRAID_DEBUG_FILE", log_path, 1);
  braid_log_reset();
}

static const char* log_stop(void) {
  static char text[65536];
  setenv("BRAID_DEBUG", "NONE", 1);
  unsetenv("BRAID_DEBUG_SUBSYS");
  unsetenv("BRAID_DEBUG_FILE");
  braid_log_reset(); /* closes the file */
  FILE* f = fopen(log_path, "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  text[n] = '\0';
  if (f) fclose(f);
  unlink(log_path);
  return text;
}

/* Whether the process still has `file` loaded (a handle the loader failed to close). */
static int still_loaded(const char* file) {
  void* handle = dlopen(file, RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != NULL;
}

static void expect_log(const char* text, const char* want, const char* what) {
  TEST_CHECK(strstr(text, want) != NULL, "%s: the log lacks \"%s\":\n%s", what, want, text);
}

static int count(const char* text, const char* word) {
  int n = 0;
  for (const char* p = strstr(text, word); p; p = strstr(p + 1, word)) n++;
  return n;
}

/* Opens the tuner `setting` names (NULL: unset) for topo; the log of it. */
static const char* open_tuner(struct braid_topo* topo, const char* var, const char* setting,
                              const char* net_lib, ncclResult_t want) {
  unsetenv("BRAID_TUNER_PLUGIN");
  unsetenv("NCCL_TUNER_PLUGIN");
  if (setting) setenv(var, setting, 1);
  log_start();
  struct tune_plugin_args args = {.comm_id = 0x1234abcdull, .net_lib = net_lib};
  if (topo) TEST_EXPECT_RES(tune_plugin_open(topo, &args), want);
  unsetenv(var);
  return log_stop();
}

static const char* close_tuner(struct braid_topo* topo) {
  log_start();
  tune_plugin_close(topo);
  return log_stop();
}

/* ---- the tests ---- */

struct model {
  struct braid_tune_choice ar, ag, bc, rs, red;
};

static struct model model_of(const struct braid_topo* topo) {
  struct model m = {
      choose(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS),
      choose(topo, BRAID_COLL_ALLGATHER, 8, ALL_ALGOS, ALL_PROTOS),
      choose(topo, BRAID_COLL_BROADCAST, MB, ALL_ALGOS, ALL_PROTOS),
      choose(topo, BRAID_COLL_REDUCESCATTER, MB, ALL_ALGOS, ALL_PROTOS),
      choose(topo, BRAID_COLL_REDUCE, MB, ALL_ALGOS, ALL_PROTOS),
  };
  return m;
}

/*
 * A forcing tuner of interface version `version`, named by `setting`: all-reduce goes Tree/LL
 * and small all-gathers Ring/Simple on the 2-GPU node, where the model picks neither; what
 * the caller cannot run stays out; broadcast (every entry ignored), reduce-scatter (an error,
 * said once) and reduce (NVLS, which Braid lacks: one INFO) keep the model's choice.
 */
static void test_force(const char* setting, int version) {
  char what[96], want[160];
  snprintf(what, sizeof what, "tuner v%d (%s)", version, setting);
  struct braid_topo* topo = build("h200x2_nvswitch.xml", 1, 2);
  if (topo == NULL) return;
  struct model m = model_of(topo);
  static const size_t ar_sizes[] = {8, 64 << 10, MB, 256 * (size_t)MB};
  static const size_t ag_sizes[] = {8, 1024};
  for (size_t i = 0; i < sizeof ar_sizes / sizeof ar_sizes[0]; i++) {
    struct braid_tune_choice c =
        choose(topo, BRAID_COLL_ALLREDUCE, ar_sizes[i], ALL_ALGOS, ALL_PROTOS);
    TEST_CHECK(!(c.algo == BRAID_ALGO_TREE && c.proto == BRAID_PROTO_LL),
               "the model itself picks Tree/LL for %zu B: the test shows nothing", ar_sizes[i]);
  }
  for (size_t i = 0; i < sizeof ag_sizes / sizeof ag_sizes[0]; i++) {
    struct braid_tune_choice c =
        choose(topo, BRAID_COLL_ALLGATHER, ag_sizes[i], ALL_ALGOS, ALL_PROTOS);
    TEST_CHECK(!(c.algo == BRAID_ALGO_RING && c.proto == BRAID_PROTO_SIMPLE),
               "the model itself picks Ring/Simple for %zu B: the test shows nothing", ag_sizes[i]);
  }
  struct braid_tune_choice ring_only = choose(topo, BRAID_COLL_ALLREDUCE, MB, RING, ALL_PROTOS);
  struct braid_tune_choice simple_only = choose(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, SIMPLE);
  struct braid_tune_choice sendrecv = choose(topo, BRAID_COLL_SENDRECV, 8, RING, ALL_PROTOS);
  const char* text = open_tuner(topo, "BRAID_TUNER_PLUGIN", setting, NULL, ncclSuccess);
  TEST_CHECK(topo->tune.plugin != NULL, "%s: not loaded:\n%s", what, text);
  snprintf(want, sizeof want, "TUNER/Plugin: loaded tuner 'Force' (ncclTunerPlugin_v%d) from ",
           version);
  expect_log(text, want, what);
  expect_log(text, "BRAID_TUNER_PLUGIN set by environment to ", what);
  snprintf(want, sizeof want, "force tuner v%d: init nRanks 2 nNodes 1", version);
  expect_log(text, want, what);
  if (version == 5) {
    expect_log(text, "force tuner v5: commId 0x1234abcd, 1 NVLink domains of 2 to 2 ranks", what);
    expect_log(text, "changed the tuning constants init gave it", what);
  }
  /* At the sizes where the model chose otherwise (checked above, before the tuner). */
  for (size_t i = 0; i < sizeof ar_sizes / sizeof ar_sizes[0]; i++)
    expect(topo, BRAID_COLL_ALLREDUCE, ar_sizes[i], ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_TREE,
           BRAID_PROTO_LL, what);
  for (size_t i = 0; i < sizeof ag_sizes / sizeof ag_sizes[0]; i++)
    expect(topo, BRAID_COLL_ALLGATHER, ag_sizes[i], ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING,
           BRAID_PROTO_SIMPLE, what);
  /* The caller's masks bound it: no tree, or no LL, leaves the model's choice there. */
  TEST_CHECK(same(choose(topo, BRAID_COLL_ALLREDUCE, MB, RING, ALL_PROTOS), ring_only),
             "%s: ring only", what);
  TEST_CHECK(same(choose(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, SIMPLE), simple_only),
             "%s: Simple only", what);
  /* Send/receive is not the tuner's (as NCCL). */
  TEST_CHECK(same(choose(topo, BRAID_COLL_SENDRECV, 8, RING, ALL_PROTOS), sendrecv),
             "%s: send/receive", what);
  /*
   * A failing getCollInfo (reduce-scatter): the model decides, one WARN for the instance.
   * Reduce: the tuner's NVLS pick is ignored, with one INFO for the instance.
   */
  log_start();
  struct model t = model_of(topo);
  struct braid_tune_choice rs2 = choose(topo, BRAID_COLL_REDUCESCATTER, MB, ALL_ALGOS, ALL_PROTOS);
  struct braid_tune_choice red2 = choose(topo, BRAID_COLL_REDUCE, MB, ALL_ALGOS, ALL_PROTOS);
  text = log_stop();
  TEST_CHECK(same(t.rs, m.rs) && same(rs2, m.rs), "%s: reduce-scatter after a failed call", what);
  TEST_CHECK(count(text, "getCollInfo returned ncclInternalError") == 1,
             "%s: one WARN for failed calls:\n%s", what, text);
  expect_log(text, "BRAID WARN", what);
  expect_log(text, "tuner plugin 'Force'", what);
  TEST_CHECK(same(t.bc, m.bc), "%s: broadcast with every entry ignored: %s/%s", what,
             braid_algo_name(t.bc.algo), braid_proto_name(t.bc.proto));
  TEST_CHECK(same(t.red, m.red) && same(red2, m.red), "%s: reduce after an NVLS pick: %s/%s", what,
             braid_algo_name(t.red.algo), braid_proto_name(t.red.proto));
  TEST_CHECK(count(text,
                   "picked NVLS/Simple for Reduce of 1048576 B: an algorithm Braid does "
                   "not have; ignored") == 1,
             "%s: one INFO for the NVLS pick:\n%s", what, text);
  /* The choice explained: the tuner's, and what the model would have done. */
  log_start();
  choose(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS);
  text = log_stop();
  snprintf(want, sizeof want, "; tuner 'Force' (v%d): its choice (the model's: %s/%s)", version,
           braid_algo_name(m.ar.algo), braid_proto_name(m.ar.proto));
  expect_log(text, want, what);
  text = close_tuner(topo);
  TEST_CHECK(topo->tune.plugin == NULL, "%s: still open", what);
  snprintf(want, sizeof want, "force tuner v%d: finalize after ", version);
  expect_log(text, want, what);
  expect_log(text, "TUNER/Plugin: closing tuner 'Force'", what);
  /* Closed, the model decides again. */
  TEST_CHECK(same(choose(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS), m.ar),
             "%s: closed, the model's choice", what);
  topo_free(topo);
}

/* BRAID_ALGO / BRAID_PROTO win: the tuner chooses only among what they allow, and says so. */
static void test_overrides_win(void) {
  const char* force = path_in(BRAID_PLUGIN_DIR, "libnccl-tuner-force.so");
  struct braid_topo* topo = build_with("BRAID_ALGO", "Ring", "h200x2_nvswitch.xml");
  if (topo == NULL) return;
  const char* text = open_tuner(topo, "BRAID_TUNER_PLUGIN", force, NULL, ncclSuccess);
  expect_log(text, "BRAID_ALGO/BRAID_PROTO set: they win over tuner 'Force' (v5)", "BRAID_ALGO");
  TEST_CHECK(choose(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS).algo == BRAID_ALGO_RING,
             "BRAID_ALGO=Ring: the tuner's Tree chosen");
  log_start();
  choose(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS);
  text = log_stop();
  expect_log(text, "within BRAID_ALGO/BRAID_PROTO", "BRAID_ALGO");
  close_tuner(topo);
  topo_free(topo);
  topo = build_with("NCCL_PROTO", "LL", "h200x2_nvswitch.xml");
  if (topo == NULL) return;
  open_tuner(topo, "BRAID_TUNER_PLUGIN", force, NULL, ncclSuccess);
  /* The tuner sets Ring/Simple though NCCL_PROTO left it out: ignored, and said once. */
  log_start();
  expect(topo, BRAID_COLL_ALLGATHER, 8, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING, BRAID_PROTO_LL,
         "NCCL_PROTO=LL against the tuner's Simple");
  expect(topo, BRAID_COLL_ALLGATHER, 8, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_RING, BRAID_PROTO_LL,
         "NCCL_PROTO=LL against the tuner's Simple, again");
  text = log_stop();
  TEST_CHECK(count(text, "picked Ring/Simple for AllGather of 8 B: not a candidate here") == 1,
             "NCCL_PROTO=LL: one INFO for the tuner's Simple:\n%s", text);
  expect(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_TREE, BRAID_PROTO_LL,
         "NCCL_PROTO=LL and the tuner's Tree/LL");
  close_tuner(topo);
  topo_free(topo);
}

/* A tuner's channel count: taken for the model's choice, bounded by the algorithm's channels. */
static void test_channels(const char* setting) {
  struct braid_topo* topo = build("h200x2_nvswitch.xml", 1, 2);
  if (topo == NULL) return;
  struct model m = model_of(topo);
  struct braid_tune_choice big = choose(topo, BRAID_COLL_ALLGATHER, 64 * MB, ALL_ALGOS, ALL_PROTOS);
  open_tuner(topo, "BRAID_TUNER_PLUGIN", setting, NULL, ncclSuccess);
  struct braid_tune_choice c = choose(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS);
  TEST_CHECK(c.algo == m.ar.algo && c.proto == m.ar.proto && c.nchannels == 3,
             "%s: all-reduce %s/%s on %d channels, expected %s/%s on 3", setting,
             braid_algo_name(c.algo), braid_proto_name(c.proto), c.nchannels,
             braid_algo_name(m.ar.algo), braid_proto_name(m.ar.proto));
  c = choose(topo, BRAID_COLL_ALLGATHER, 8, ALL_ALGOS, ALL_PROTOS);
  TEST_CHECK(
      c.algo == m.ag.algo && c.proto == m.ag.proto && c.nchannels == topo_rings(topo)->nchannels,
      "%s: all-gather asked 1000 channels, got %d of the rings' %d", setting, c.nchannels,
      topo_rings(topo)->nchannels);
  c = choose(topo, BRAID_COLL_ALLGATHER, 64 * MB, ALL_ALGOS, ALL_PROTOS);
  TEST_CHECK(same(c, big), "%s: 64 MB all-gather on %d channels, the model's %d", setting,
             c.nchannels, big.nchannels);
  TEST_CHECK(same(choose(topo, BRAID_COLL_BROADCAST, MB, ALL_ALGOS, ALL_PROTOS), m.bc),
             "%s: broadcast, nothing asked", setting);
  close_tuner(topo);
  topo_free(topo);
}

/* `none`, a missing tuner and a library of no known version: the model's choice. */
static void test_refused(void) {
  struct braid_topo* topo = build("h200x2_nvswitch.xml", 1, 2);
  if (topo == NULL) return;
  struct model m = model_of(topo);
  const char* text = open_tuner(topo, "BRAID_TUNER_PLUGIN", "none", NULL, ncclSuccess);
  TEST_CHECK(topo->tune.plugin == NULL, "none: a tuner loaded");
  expect_log(text, "BRAID_TUNER_PLUGIN set by environment to none", "none");
  TEST_CHECK(strstr(text, "WARN") == NULL, "none: a WARN:\n%s", text);

  text = open_tuner(topo, "BRAID_TUNER_PLUGIN", "nosuchtuner", NULL, ncclSuccess);
  TEST_CHECK(topo->tune.plugin == NULL, "missing: a tuner loaded");
  expect_log(text, "BRAID WARN", "missing");
  expect_log(text, "BRAID_TUNER_PLUGIN=nosuchtuner: no tuner plugin loaded (", "missing");
  expect_log(text, "libnccl-tuner-nosuchtuner.so", "missing");
  expect_log(text, "the tuning model decides", "missing");
  text = open_tuner(topo, "BRAID_TUNER_PLUGIN", "nosuchtuner", NULL, ncclSuccess);
  TEST_CHECK(strstr(text, "WARN") == NULL, "missing again: not looked for twice:\n%s", text);
  text =
      open_tuner(topo, "NCCL_TUNER_PLUGIN", "/nonexistent/libnccl-tuner-x.so", NULL, ncclSuccess);
  expect_log(text, "NCCL_TUNER_PLUGIN=/nonexistent/libnccl-tuner-x.so: no tuner plugin loaded",
             "missing, NCCL's name");

  text = open_tuner(topo, "BRAID_TUNER_PLUGIN", "nosym", NULL, ncclSuccess);
  TEST_CHECK(topo->tune.plugin == NULL, "no known version: a tuner loaded");
  expect_log(text, "BRAID WARN", "nosym");
  expect_log(text, "BRAID_TUNER_PLUGIN: nosym has no ncclTunerPlugin_v5 to _v2", "nosym");
  expect_log(text, "; it has ncclTunerPlugin_v1: not loaded", "nosym");
  TEST_CHECK(!still_loaded("libnccl-tuner-nosym.so"), "nosym: the library stays loaded");
  struct model t = model_of(topo);
  TEST_CHECK(same(t.ar, m.ar) && same(t.ag, m.ag), "refused tuners: not the model's choice");

  /* An init that fails fails the open, leaves nothing open, and says which tuner. */
  struct braid_topo* three = build("nvlink_bridge_3gpu.xml", 1, 3);
  if (three) {
    const char* force = path_in(BRAID_PLUGIN_DIR, "libnccl-tuner-force.so");
    text = open_tuner(three, "BRAID_TUNER_PLUGIN", force, NULL, ncclInternalError);
    TEST_CHECK(three->tune.plugin == NULL, "failed init: left open");
    expect_log(text, "tuner plugin 'Force' (v5) from ", "failed init");
    expect_log(text, "init for 3 ranks on 1 host returned ncclInternalError", "failed init");
    expect_log(text, "TUNER/Plugin: closing tuner 'Force'", "failed init");
    TEST_CHECK(!still_loaded(force), "failed init: the library stays loaded");
    topo_free(three);
  }
  topo_free(topo);
}

/* A tuner in the net plugin's library is found when the tuner search finds none. */
static void test_net_library(void) {
  const char* net = path_in(BRAID_PLUGIN_DIR, "libnccl-tuner-force4.so");
  struct braid_topo* topo = build("h200x2_nvswitch.xml", 1, 2);
  if (topo == NULL) return;
  const char* text = open_tuner(topo, "BRAID_TUNER_PLUGIN", NULL, net, ncclSuccess);
  expect_log(text, "TUNER/Plugin: no tuner plugin (", "net library");
  expect_log(text, "the net plugin's library", "net library");
  expect_log(text, "loaded tuner 'Force' (ncclTunerPlugin_v4)", "net library");
  TEST_CHECK(strstr(text, "WARN") == NULL, "net library, nothing asked: a WARN:\n%s", text);
  expect(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_TREE, BRAID_PROTO_LL,
         "tuner from the net library");
  close_tuner(topo);
  /* Asked for one that is missing: said, then the net plugin's library, as NCCL. */
  text = open_tuner(topo, "BRAID_TUNER_PLUGIN", "missing2", net, ncclSuccess);
  expect_log(text, "no tuner plugin loaded", "missing, net library");
  expect_log(text, "looking in the net plugin's library", "missing, net library");
  TEST_CHECK(topo->tune.plugin != NULL, "missing, net library: not loaded");
  close_tuner(topo);
  TEST_CHECK(!still_loaded(net), "net library: the tuner's handle stays open");
  topo_free(topo);
}

/* The library is the process's: a second topology shares it; it closes with its last user. */
static void test_shared(void) {
  const char* force = path_in(BRAID_PLUGIN_DIR, "libnccl-tuner-force.so");
  struct braid_topo* a = build("h200x2_nvswitch.xml", 1, 2);
  struct braid_topo* b = build("h200x2_nvswitch.xml", 1, 2);
  if (a == NULL || b == NULL) return;
  open_tuner(a, "BRAID_TUNER_PLUGIN", force, NULL, ncclSuccess);
  /* Loaded: a later setting changes nothing until the last user closes it (as NCCL). */
  const char* text = open_tuner(b, "BRAID_TUNER_PLUGIN", "none", NULL, ncclSuccess);
  TEST_CHECK(b->tune.plugin != NULL, "second topology: no tuner");
  TEST_CHECK(strstr(text, "loaded tuner") == NULL, "loaded twice:\n%s", text);
  text = close_tuner(a);
  TEST_CHECK(strstr(text, "closing tuner") == NULL, "closed with a user left:\n%s", text);
  TEST_CHECK(still_loaded(force), "closed with a user left: the library is gone");
  expect(b, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_TREE, BRAID_PROTO_LL,
         "second topology, first closed");
  text = close_tuner(b);
  expect_log(text, "closing tuner 'Force'", "last user");
  TEST_CHECK(!still_loaded(force), "last user gone: the library stays loaded");
  close_tuner(b); /* twice: nothing */
  topo_free(a);
  topo_free(b);
}

/*
 * Communicators opening and closing the tuner from several threads at once: the library is
 * loaded and closed under its lock, each instance chooses as the tuner says, and nothing
 * stays loaded after the last close. Built with BRAID_TSAN, this shows any race there.
 */
#define THREADS 4
#define ROUNDS 25

struct worker {
  struct braid_topo* topo;
  int wrong; /* choices that were not the tuner's, or opens that failed */
};

static void* worker_run(void* arg) {
  struct worker* w = arg;
  struct tune_plugin_args args = {.comm_id = 1};
  for (int r = 0; r < ROUNDS; r++) {
    if (tune_plugin_open(w->topo, &args) != ncclSuccess || w->topo->tune.plugin == NULL) {
      w->wrong++;
      continue;
    }
    for (int i = 0; i < 8; i++) {
      struct braid_tune_choice c;
      if (tune_choose_topo(w->topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS, &c) !=
              ncclSuccess ||
          c.algo != BRAID_ALGO_TREE || c.proto != BRAID_PROTO_LL)
        w->wrong++;
    }
    tune_plugin_close(w->topo);
  }
  return NULL;
}

static void test_threads(void) {
  const char* force = path_in(BRAID_PLUGIN_DIR, "libnccl-tuner-force.so");
  struct worker w[THREADS];
  pthread_t tid[THREADS];
  memset(w, 0, sizeof w);
  for (int t = 0; t < THREADS; t++)
    if ((w[t].topo = build("h200x2_nvswitch.xml", 1, 2)) == NULL) return;
  setenv("BRAID_TUNER_PLUGIN", force, 1);
  braid_param_reload();
  int started = 0;
  for (; started < THREADS; started++)
    if (pthread_create(&tid[started], NULL, worker_run, &w[started]) != 0) break;
  TEST_CHECK(started == THREADS, "threads: started %d of %d", started, THREADS);
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  unsetenv("BRAID_TUNER_PLUGIN");
  braid_param_reload();
  for (int t = 0; t < THREADS; t++) {
    TEST_CHECK(w[t].wrong == 0, "threads: %d wrong choices or failed opens in thread %d",
               w[t].wrong, t);
    topo_free(w[t].topo);
  }
  TEST_CHECK(!still_loaded(force), "threads: the library stays loaded after the last close");
}

/* Unset, libnccl-tuner.so is looked for where the loader looks (here a v4 forcing tuner). */
static void test_default(void) {
  struct braid_topo* topo = build("h200x2_nvswitch.xml", 1, 2);
  if (topo == NULL) return;
  const char* text = open_tuner(topo, "BRAID_TUNER_PLUGIN", NULL, NULL, ncclSuccess);
  expect_log(text, "loaded tuner 'Force' (ncclTunerPlugin_v4) from ", "unset");
  expect_log(text, "libnccl-tuner.so", "unset");
  expect(topo, BRAID_COLL_ALLREDUCE, MB, ALL_ALGOS, ALL_PROTOS, BRAID_ALGO_TREE, BRAID_PROTO_LL,
         "libnccl-tuner.so");
  close_tuner(topo);
  topo_free(topo);
}

int main(int argc, char** argv) {
  setenv("BRAID_DEBUG", "NONE", 1);
  if (argc > 1 && strcmp(argv[1], "default") == 0) {
    test_default();
    return test_summary();
  }
  test_force(path_in(BRAID_PLUGIN_DIR, "libnccl-tuner-force.so"), 5);
  test_force(path_in(BRAID_PLUGIN_DIR, "libnccl-tuner-force4.so"), 4);
  test_force("libnccl-tuner-force3.so", 3);
  test_force("force2", 2);
  test_overrides_win();
  test_channels("channels");
  test_channels("channels2");
  test_refused();
  test_net_library();
  test_shared();
  test_threads();
  return test_summary();
}
