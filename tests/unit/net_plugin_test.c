/*
 * Loading NCCL net plugins (transport/net_plugin*.c) with the plugins the
 * tests build (tests/plugins): what the process says and chooses when the
 * plugin is disabled, absent, asked for and missing, a library without a net
 * table or of no known version, failing its init, or without devices; that a
 * list is tried in order; that a plugin of every version NCCL 2.28 loads (v6
 * to v11) is found by its name, chosen by default and by BRAID_NET / NCCL_NET,
 * and carries a message over the loopback within one process; and that a
 * connection presenting another job's key is never handed out.
 *
 * Each case runs in a child with its own environment, logging at INFO to a
 * file that the case then reads.
 *
 *   net_plugin_test <folder of the test plugins>   (on LD_LIBRARY_PATH too)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "test.h"
#include "transport/net.h"

#define WAIT_SEC 10.0

static const char* plugin_dir;
static char log_path[256];
static char log_text[1 << 16];

/* The child's environment: the plugin, the network, one more variable (NULL: unset). */
static void child_env(const char* plugin, const char* net, const char* name, const char* value) {
  static const char* const cleared[] = {"NCCL_NET_PLUGIN",
                                        "BRAID_NET_PLUGIN",
                                        "NCCL_NET",
                                        "BRAID_NET",
                                        "BRAIDTEST_NET_FAIL_INIT",
                                        "BRAIDTEST_NET_NDEV",
                                        "BRAIDTEST_NET_NO_TEST"};
  for (size_t i = 0; i < BRAID_ARRAY_LEN(cleared); i++) unsetenv(cleared[i]);
  if (plugin) setenv("NCCL_NET_PLUGIN", plugin, 1);
  if (net) setenv("NCCL_NET", net, 1);
  if (name) setenv(name, value, 1);
  setenv("BRAID_DEBUG", "INFO", 1);
  setenv("BRAID_DEBUG_SUBSYS", "INIT,NET", 1);
  setenv("BRAID_DEBUG_FILE", log_path, 1);
  braid_log_reset();
}

/* The child's log so far. */
static const char* child_log(void) {
  FILE* f = fopen(log_path, "r");
  size_t n = f ? fread(log_text, 1, sizeof log_text - 1, f) : 0;
  log_text[n] = '\0';
  if (f) fclose(f);
  return log_text;
}

/* A line of the log at `level` ("WARN", "INFO") that holds every one of `parts` (NULL-ended). */
static int log_has(const char* level, const char* const* parts) {
  char tag[16];
  snprintf(tag, sizeof tag, " %s ", level);
  for (const char* line = child_log(); line && *line;) {
    const char* end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[2048];
    snprintf(buf, sizeof buf, "%.*s", (int)BRAID_MIN(len, sizeof buf - 1), line);
    int all = strstr(buf, tag) != NULL;
    for (int i = 0; all && parts[i]; i++) all = strstr(buf, parts[i]) != NULL;
    if (all) return 1;
    line = end ? end + 1 : NULL;
  }
  return 0;
}
#define LOG_HAS(level, ...) log_has(level, (const char* const[]){__VA_ARGS__, NULL})

/* The backend Braid chooses without a plugin: IB with a usable port, else Socket. */
static const struct braid_net_ops* own_default(void) {
  char why[256];
  int ndev = 0;
  braid_net_ib.init(&ndev, why, sizeof why);
  return ndev > 0 ? &braid_net_ib : &braid_net_socket;
}

static int child_verdict(void) {
  if (test_failures) fprintf(stderr, "--- the child's log:\n%s---\n", child_log());
  return test_failures ? 1 : 0;
}

/* The process falls back to its own backends, and the plugin backend says why it has none. */
static void check_fallback(const char* why_part) {
  const struct braid_net_ops* ops = NULL;
  char why[BRAID_ERROR_MAX] = "";
  int ndev = -1;
  TEST_EXPECT_RES(braid_net_plugin.init(&ndev, why, sizeof why), ncclSuccess);
  TEST_CHECK(ndev == 0 && strstr(why, why_part), "plugin backend: %d devices, \"%s\"", ndev, why);
  TEST_CHECK(net_plugin_network_name() == NULL, "a plugin network without a plugin");
  TEST_EXPECT_RES(net_backend_select(&ops, &ndev), ncclSuccess);
  TEST_CHECK(ops == own_default(), "chose %s", ops ? ops->name : "nothing");
}

/* ------------------------------------------------------- what is said */

static int case_none(void) {
  child_env("none", NULL, NULL, NULL);
  check_fallback("disabled");
  TEST_CHECK(LOG_HAS("INFO", "net plugin disabled (NCCL_NET_PLUGIN=none)"), "no INFO line");
  TEST_CHECK(!strstr(child_log(), " WARN "), "a WARN without cause");
  return child_verdict();
}

static int case_unset(void) {
  child_env(NULL, NULL, NULL, NULL);
  char why[BRAID_ERROR_MAX] = "";
  int ndev = 0;
  braid_net_plugin.init(&ndev, why, sizeof why);
  if (ndev > 0) {
    fprintf(stderr, "note: a libnccl-net.so is installed here (%s); nothing more to check\n",
            net_plugin_network_name());
    return 0;
  }
  check_fallback("libnccl-net.so");
  TEST_CHECK(LOG_HAS("INFO", "NET/Plugin: no net plugin", "libnccl-net.so"), "no INFO line");
  TEST_CHECK(!strstr(child_log(), " WARN "), "a WARN when nothing was asked for");
  return child_verdict();
}

static int case_missing(void) {
  child_env("nosuchnet", NULL, NULL, NULL);
  check_fallback("nosuchnet");
  TEST_CHECK(LOG_HAS("WARN", "NCCL_NET_PLUGIN=nosuchnet", "nosuchnet:", "libnccl-net-nosuchnet.so",
                     "using Braid's own network backends"),
             "no WARN naming both files tried");
  return child_verdict();
}

static int case_missing_path(void) {
  child_env("/nonexistent/libnccl-net-x.so", NULL, NULL, NULL);
  check_fallback("/nonexistent/libnccl-net-x.so");
  TEST_CHECK(LOG_HAS("WARN", "/nonexistent/libnccl-net-x.so", "No such file"), "no WARN");
  TEST_CHECK(!strstr(child_log(), "libnccl-net-/"), "a path was taken for a name");
  return child_verdict();
}

static int case_old(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/libnccl-net-braidtest-old.so", plugin_dir);
  child_env(path, NULL, NULL, NULL);
  check_fallback("none of the net plugin versions");
  TEST_CHECK(LOG_HAS("WARN", path, "exports none of the net plugin versions Braid loads",
                     "ncclNetPlugin_v11", "_v6"),
             "no WARN naming the versions looked for");
  return child_verdict();
}

/* A library that loads but exports no net table at all. */
static int case_nosym(void) {
  child_env("libc.so.6", NULL, NULL, NULL);
  check_fallback("none of the net plugin versions");
  TEST_CHECK(LOG_HAS("WARN", "libc.so.6", "exports none of the net plugin versions Braid loads",
                     "using Braid's own network backends"),
             "no WARN for a library without a net table");
  return child_verdict();
}

/* A table with a slot NCCL needs left empty: refused before init, naming the slot. */
static int case_noslot(void) {
  child_env("braidtest", NULL, "BRAIDTEST_NET_NO_TEST", "1");
  check_fallback("leaves test empty");
  TEST_CHECK(LOG_HAS("WARN", "BraidTest (v11", "leaves test empty", "using Braid's own"),
             "no WARN naming the empty slot");
  TEST_CHECK(!LOG_HAS("INFO", "BraidTest: net plugin v11 on"), "init ran on an incomplete table");
  return child_verdict();
}

/* Initialized but without devices: said, and a v11 plugin's context given back (finalize). */
static int case_nodev(void) {
  child_env("braidtest", NULL, "BRAIDTEST_NET_NDEV", "0");
  check_fallback("has no device");
  TEST_CHECK(LOG_HAS("WARN", "BraidTest (v11", "has no device", "using Braid's own"),
             "no WARN for a plugin without devices");
  TEST_CHECK(LOG_HAS("INFO", "BraidTest: finalize"), "the unused plugin was not finalized");
  return child_verdict();
}

static int case_initfail(void) {
  child_env("braidtest", NULL, "BRAIDTEST_NET_FAIL_INIT", "1");
  check_fallback("init failed");
  TEST_CHECK(LOG_HAS("WARN", "BraidTest (v11", "init failed", braid_result_str(ncclSystemError),
                     "(2)", "using Braid's own"),
             "no WARN with init's result");
  /* The plugin's own line, through the logger Braid gave it. */
  TEST_CHECK(LOG_HAS("WARN", "BraidTest: init fails as BRAIDTEST_NET_FAIL_INIT asks"),
             "the plugin's WARN did not reach Braid's log");
  return child_verdict();
}

/* BRAID_NET=Plugin where there is none: an error that says why. */
static int case_named_unavailable(void) {
  const struct braid_net_ops* ops = NULL;
  int ndev = 0;
  child_env("none", "Plugin", NULL, NULL);
  ncclResult_t res = net_backend_select(&ops, &ndev);
  TEST_CHECK(res == ncclSystemError && strstr(braid_err_last(), "NCCL_NET=Plugin") &&
                 strstr(braid_err_last(), "disabled"),
             "%d: %s", (int)res, braid_err_last());
  return child_verdict();
}

/* ------------------------------------------------------ a plugin that works */

/*
 * A receive buffer registered as host memory, flushed after the message came (the test plugin
 * checks that a flush lies within its registration and returns a request to test); GPU memory
 * reaches the plugin as NCCL_PTR_CUDA, which the test plugin refuses, naming the type.
 */
static void registered_flush(const struct braid_net_ops* ops, void* r, char* in, size_t got,
                             void* mh) {
  void *freq = NULL, *cuda_mh = NULL;
  int fdone = 0;
  TEST_EXPECT_RES(ops->iflush(r, in, got, mh, &freq), ncclSuccess);
  TEST_CHECK(freq != NULL, "the plugin's flush request was not handed out");
  double end = braid_time_sec() + WAIT_SEC;
  while (freq && !fdone && braid_time_sec() < end)
    if (ops->test(freq, &fdone, NULL) != ncclSuccess) break;
  TEST_CHECK(freq == NULL || fdone, "the flush did not complete");
  TEST_CHECK(ops->reg_mr(r, in, 64, 1, &cuda_mh) != ncclSuccess && cuda_mh == NULL,
             "the test plugin took GPU memory");
  TEST_CHECK(LOG_HAS("WARN", "only host memory can be registered (type 2)"),
             "GPU memory did not reach the plugin as NCCL_PTR_CUDA");
}

/*
 * listen, connect and accept (interleaved: one process), one message of `bytes`: sent from an
 * unregistered buffer (the adapter registers it for the request), received into a registered
 * one that is then flushed.
 */
static void loopback(const struct braid_net_ops* ops, size_t bytes) {
  uint8_t key[BRAID_NET_KEY_BYTES], handle[BRAID_NET_HANDLE_BYTES] __attribute__((aligned(8)));
  void *l = NULL, *s = NULL, *r = NULL, *state = NULL, *sreq = NULL, *rreq = NULL, *mh = NULL;
  char* out = malloc(bytes + 1);
  char* in = malloc(bytes + 64);
  for (size_t i = 0; i < sizeof key; i++) key[i] = (uint8_t)(17 * i + 3);
  for (size_t i = 0; i < bytes; i++) out[i] = (char)(i * 7 + 1);
  TEST_EXPECT_RES(ops->listen(0, key, handle, &l), ncclSuccess);
  double end = braid_time_sec() + WAIT_SEC;
  while (l && (s == NULL || r == NULL) && braid_time_sec() < end) {
    if (s == NULL && ops->connect(0, key, handle, &state, &s) != ncclSuccess) break;
    if (r == NULL && ops->accept(l, &r) != ncclSuccess) break;
  }
  TEST_CHECK(s && r && state == NULL, "connected: send %p, receive %p", s, r);
  if (r) TEST_EXPECT_RES(ops->reg_mr(r, in, bytes + 64, 0, &mh), ncclSuccess);
  int sdone = 0, rdone = 0;
  size_t got = 0;
  while (s && mh && (!sdone || !rdone) && braid_time_sec() < end) {
    if (sreq == NULL && ops->isend(s, out, bytes, NULL, &sreq) != ncclSuccess) break;
    if (rreq == NULL && ops->irecv(r, in, bytes + 64, mh, &rreq) != ncclSuccess) break;
    if (sreq && !sdone && ops->test(sreq, &sdone, NULL) != ncclSuccess) break;
    if (rreq && !rdone && ops->test(rreq, &rdone, &got) != ncclSuccess) break;
  }
  TEST_CHECK(sdone && rdone && got == bytes && memcmp(in, out, bytes) == 0,
             "message of %zu bytes: sent %d, received %d (%zu bytes)", bytes, sdone, rdone, got);
  if (rdone) registered_flush(ops, r, in, got, mh);
  if (mh) TEST_EXPECT_RES(ops->dereg_mr(r, mh), ncclSuccess);
  if (s) ops->close_send(s);
  if (r) ops->close_recv(r);
  if (state) ops->connect_abandon(state);
  if (l) ops->close_listen(l);
  free(out);
  free(in);
}

/* A connection with another job's key is dropped (and logged); the right key then works. */
static void wrong_key(const struct braid_net_ops* ops) {
  uint8_t key[BRAID_NET_KEY_BYTES] = {1}, bad[BRAID_NET_KEY_BYTES] = {2};
  uint8_t handle[BRAID_NET_HANDLE_BYTES] __attribute__((aligned(8)));
  void *l = NULL, *s = NULL, *r = NULL, *state = NULL;
  TEST_EXPECT_RES(ops->listen(0, key, handle, &l), ncclSuccess);
  double end = braid_time_sec() + 1.0;
  while (l && braid_time_sec() < end && r == NULL) {
    if (s == NULL) ops->connect(0, bad, handle, &state, &s);
    ops->accept(l, &r);
  }
  TEST_CHECK(s != NULL && r == NULL, "wrong key: sender %p, accepted %p", s, r);
  TEST_CHECK(LOG_HAS("WARN", "presented a wrong key"), "the wrong key was not logged");
  if (s) ops->close_send(s);
  if (r) ops->close_recv(r);
  if (state) ops->connect_abandon(state);
  if (l) ops->close_listen(l);
}

/* The plugin `name` loads as version `version` and works; it is the default network. */
static void check_plugin(const char* version_text, int max_requests) {
  const struct braid_net_ops* ops = NULL;
  struct braid_net_props props;
  int ndev = 0;
  TEST_EXPECT_RES(net_backend_select(&ops, &ndev), ncclSuccess);
  TEST_CHECK(ops == &braid_net_plugin && ndev == 1, "chose %s with %d devices",
             ops ? ops->name : "nothing", ndev);
  const char* name = net_plugin_network_name();
  TEST_CHECK(name && strcmp(name, "BraidTest") == 0, "network %s", name ? name : "(none)");
  TEST_CHECK(LOG_HAS("INFO", "loaded net plugin BraidTest", version_text), "no INFO for %s",
             version_text);
  TEST_CHECK(LOG_HAS("INFO", "initialized net plugin BraidTest", "1 device"),
             "no INFO for the initialization");
  TEST_CHECK(LOG_HAS("INFO", "NET/Plugin selected", "Using network BraidTest"),
             "no INFO for the choice");
  TEST_CHECK(!strstr(child_log(), " WARN "), "a WARN while loading a plugin that works");
  TEST_EXPECT_RES(braid_net_plugin.get_properties(0, &props), ncclSuccess);
  TEST_CHECK(props.ptr_support == BRAID_NET_PTR_HOST && props.max_requests == max_requests &&
                 props.max_bytes == ((size_t)1 << 30) && props.speed_mbps == 10000,
             "props: ptr %u, max_requests %d, max_bytes %zu, speed %d", props.ptr_support,
             props.max_requests, props.max_bytes, props.speed_mbps);
  TEST_CHECK(braid_net_plugin.get_properties(1, &props) != ncclSuccess, "a second device");
  loopback(&braid_net_plugin, 0);
  loopback(&braid_net_plugin, 100000);
}

static int case_load(void) {
  child_env("braidtest", NULL, NULL, NULL);
  check_plugin("(v11)", 32);
  TEST_CHECK(LOG_HAS("INFO", "ncclCollNetPlugin_v11", "BraidTestColl", "no CollNet support"),
             "the CollNet table was not reported");
  TEST_CHECK(LOG_HAS("INFO", "BraidTest: net plugin v11 on"), "the plugin's INFO line is missing");
  wrong_key(&braid_net_plugin);
  return child_verdict();
}

static int case_version(int v) {
  char name[32], text[16];
  snprintf(name, sizeof name, "braidtest-v%d", v);
  snprintf(text, sizeof text, "(v%d)", v);
  child_env(name, NULL, NULL, NULL);
  check_plugin(text, v == 6 ? 8 : 32);
  return child_verdict();
}
static int case_v6(void) { return case_version(6); }
static int case_v7(void) { return case_version(7); }
static int case_v8(void) { return case_version(8); }
static int case_v9(void) { return case_version(9); }
static int case_v10(void) { return case_version(10); }

/* A list: the first that loads is used, the ones before it said. */
static int case_list(void) {
  const struct braid_net_ops* ops = NULL;
  int ndev = 0;
  child_env("nosuchnet,braidtest", NULL, NULL, NULL);
  TEST_EXPECT_RES(net_backend_select(&ops, &ndev), ncclSuccess);
  TEST_CHECK(ops == &braid_net_plugin, "chose %s", ops ? ops->name : "nothing");
  TEST_CHECK(LOG_HAS("WARN", "nosuchnet", "trying the next entry of NCCL_NET_PLUGIN"),
             "the missing first entry was not said");
  TEST_CHECK(!strstr(child_log(), "using Braid's own"), "gave up before the list's end");
  TEST_CHECK(LOG_HAS("INFO", "NET/Plugin selected", "Using network BraidTest"), "not selected");
  return child_verdict();
}

/* A list of which nothing loads: each entry said, Braid's own backends at the end. */
static int case_list_none(void) {
  child_env("nosuchnet,,alsonotthere", NULL, NULL, NULL);
  check_fallback("alsonotthere");
  TEST_CHECK(LOG_HAS("WARN", "nosuchnet", "trying the next entry"), "the first entry not said");
  TEST_CHECK(LOG_HAS("WARN", "alsonotthere", "using Braid's own network backends"),
             "the last entry not said");
  return child_verdict();
}

/* BRAID_NET / NCCL_NET by the plugin's network name (any case), by Plugin, and Braid's own. */
static int named_one(const char* net, const struct braid_net_ops* want) {
  const struct braid_net_ops* ops = NULL;
  int ndev = 0;
  child_env("braidtest", net, NULL, NULL);
  TEST_EXPECT_RES(net_backend_select(&ops, &ndev), ncclSuccess);
  TEST_CHECK(ops == want, "NCCL_NET=%s chose %s", net, ops ? ops->name : "nothing");
  return child_verdict();
}
static int case_named_network(void) { return named_one("braidtest", &braid_net_plugin); }
static int case_named_plugin(void) { return named_one("Plugin", &braid_net_plugin); }
static int case_named_socket(void) {
  int rc = named_one("Socket", &braid_net_socket);
  TEST_CHECK(!strstr(child_log(), "loaded net plugin"), "loaded a plugin nobody uses");
  return rc ? rc : child_verdict();
}

static int case_named_bogus(void) {
  const struct braid_net_ops* ops = NULL;
  int ndev = 0;
  child_env("braidtest", "carrier-pigeon", NULL, NULL);
  ncclResult_t res = net_backend_select(&ops, &ndev);
  TEST_CHECK(res == ncclInvalidUsage && strstr(braid_err_last(), "carrier-pigeon") &&
                 strstr(braid_err_last(), "BraidTest"),
             "%d: %s", (int)res, braid_err_last());
  return child_verdict();
}

/* ------------------------------------------------------------------ main */

static int in_child(int (*fn)(void)) {
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) _exit(fn());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

int main(int argc, char** argv) {
  static const struct {
    const char* name;
    int (*fn)(void);
  } cases[] = {{"none", case_none},
               {"unset", case_unset},
               {"missing", case_missing},
               {"missing_path", case_missing_path},
               {"old", case_old},
               {"nosym", case_nosym},
               {"noslot", case_noslot},
               {"nodev", case_nodev},
               {"initfail", case_initfail},
               {"named_unavailable", case_named_unavailable},
               {"load", case_load},
               {"v6", case_v6},
               {"v7", case_v7},
               {"v8", case_v8},
               {"v9", case_v9},
               {"v10", case_v10},
               {"list", case_list},
               {"list_none", case_list_none},
               {"named_network", case_named_network},
               {"named_plugin", case_named_plugin},
               {"named_socket", case_named_socket},
               {"named_bogus", case_named_bogus}};
  if (argc < 2) {
    fprintf(stderr, "usage: %s <folder of the test plugins> [case]\n", argv[0]);
    return 2;
  }
  plugin_dir = argv[1];
  snprintf(log_path, sizeof log_path, "/tmp/braid-net-plugin-test.%d.log", (int)getpid());
  for (size_t i = 0; i < BRAID_ARRAY_LEN(cases); i++) {
    if (argc > 2 && strcmp(argv[2], cases[i].name) != 0) continue;
    int rc = in_child(cases[i].fn);
    TEST_CHECK(rc == 0, "case %s (exit %d)", cases[i].name, rc);
    if (rc == 0) fprintf(stderr, "case %s: passed\n", cases[i].name);
  }
  unlink(log_path);
  return test_summary();
}
