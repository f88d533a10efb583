/*
 * NCCL profiler plugins (runtime/profiler.c) without a GPU: the test plugin
 * of tests/plugins (NCCL's interface only; built as
 * libnccl-profiler-braidtest-v<N>.so in BRAID_PROFILER_DIR, which is on
 * LD_LIBRARY_PATH) is loaded through the loader a communicator uses, in
 * each version NCCL 2.28 reads (v5 to v1). Each gets group, collective,
 * send/receive and proxy events in its own layout (read back from the JSON
 * trace it writes): names or numbers, counts, sequence numbers, parents,
 * states, stops. NCCL_PROFILE_EVENT_MASK is the mask init starts from, and
 * the plugin's mask decides which events come. `none`, a missing library,
 * a library of no version NCCL 2.28 reads, a failing init and failing
 * startEvents leave no profiler (or no event) with a message that names
 * them, never an error. The net plugin's library is searched, and the
 * library closes with its last instance.
 *
 *   profiler_test            the above
 *   profiler_test default    NCCL_PROFILER_PLUGIN unset finds libnccl-profiler.so
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/coll.h"
#include "base/debug.h"
#include "base/param.h"
#include "runtime/profiler.h"
#include "runtime/profiler_abi.h"
#include "test.h"

static char log_path[64], trace_path[64];

static void log_start(void) {
  snprintf(log_path, sizeof log_path, "/tmp/braid_prof_log_XXXXXX");
  int fd = mkstemp(log_path);
  if (fd >= 0) close(fd);
  setenv("BRAID_DEBUG", "INFO", 1);
  setenv("BRAID_DEBUG_SUBSYS", "INIT,ENV", 1);
  setenv("BRAID_DEBUG_FILE", log_path, 1);
  braid_log_reset();
}

static const char* log_stop(void) {
  static char text[65536];
  setenv("BRAID_DEBUG", "NONE", 1);
  unsetenv("BRAID_DEBUG_SUBSYS");
  unsetenv("BRAID_DEBUG_FILE");
  braid_log_reset();
  FILE* f = fopen(log_path, "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  text[n] = '\0';
  if (f) fclose(f);
  unlink(log_path);
  return text;
}

static void expect_in(const char* text, const char* want, const char* what) {
  TEST_CHECK(strstr(text, want) != NULL, "%s: lacks \"%s\":\n%s", what, want, text);
}

static int still_loaded(const char* file) {
  void* handle = dlopen(file, RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != NULL;
}

/* The trace the plugin wrote since trace_start, or "". */
static void trace_start(void) {
  snprintf(trace_path, sizeof trace_path, "/tmp/braid_prof_trace_XXXXXX");
  int fd = mkstemp(trace_path);
  if (fd >= 0) close(fd);
  setenv("BRAIDTEST_PROFILER_TRACE", trace_path, 1);
}

static const char* trace_stop(void) {
  static char text[65536];
  FILE* f = fopen(trace_path, "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  text[n] = '\0';
  if (f) fclose(f);
  unlink(trace_path);
  unsetenv("BRAIDTEST_PROFILER_TRACE");
  return text;
}

static const struct braid_profiler_args args = {
    .comm_hash = 0xabc, .comm_name = "unit", .nnodes = 1, .nranks = 2, .rank = 1};

/* Sets the plugin variable (NULL: unset), the mask, and opens an instance; its log in *log. */
static struct braid_profiler* open_with(const char* setting, const char* mask, const char* net_lib,
                                        const char** log) {
  unsetenv("NCCL_PROFILER_PLUGIN");
  unsetenv("BRAID_PROFILER_PLUGIN");
  if (setting) setenv("NCCL_PROFILER_PLUGIN", setting, 1);
  if (mask) setenv("NCCL_PROFILE_EVENT_MASK", mask, 1);
  else unsetenv("NCCL_PROFILE_EVENT_MASK");
  braid_param_reload();
  log_start();
  struct braid_profiler_args a = args;
  a.net_lib = net_lib;
  struct braid_profiler* p = profiler_open(&a);
  *log = log_stop();
  return p;
}

/* What a launch and a network connection give the profiler. */
static void emit_all(struct braid_profiler* p) {
  void* g = profiler_group_start(p);
  struct braid_profiler_task ar = {.coll = BRAID_COLL_ALLREDUCE, .count = 1024, .root = -1,
                                   .dtype = ncclFloat32, .algo = BRAID_ALGO_RING,
                                   .proto = BRAID_PROTO_LL, .nchannels = 2};
  struct braid_profiler_task bc = {.coll = BRAID_COLL_BROADCAST, .count = 77, .root = 1,
                                   .dtype = ncclInt8, .algo = BRAID_ALGO_TREE,
                                   .proto = BRAID_PROTO_SIMPLE, .nchannels = 1};
  struct braid_profiler_task send = {.coll = BRAID_COLL_SENDRECV, .is_send = 1, .count = 5,
                                     .peer = 0, .dtype = ncclUint64, .algo = -1, .proto = -1};
  struct braid_profiler_task recv = send;
  recv.is_send = 0;
  recv.count = 6;
  void* h[5] = {profiler_task_start(p, g, &ar), profiler_task_start(p, g, &ar),
                profiler_task_start(p, g, &bc), profiler_task_start(p, g, &send),
                profiler_task_start(p, g, &recv)};
  for (int i = 0; i < 5; i++) profiler_event_stop(p, h[i]);
  profiler_event_stop(p, g);
  const struct braid_proxy_events* ev = &profiler_proxy_events;
  void* op = ev->op_start(p, 1, 0, 3, 4, 4096);
  void* step = ev->step_start(p, op, 7);
  ev->step_state(p, step, BRAID_PROXY_STEP_SEND_WAIT, 4000);
  ev->step_stop(p, step);
  ev->op_stop(p, op);
}

static void test_version(int v) {
  char setting[64], what[32], want[512];
  snprintf(setting, sizeof setting, "braidtest-v%d", v);
  snprintf(what, sizeof what, "v%d", v);
  const char* log;
  trace_start();
  struct braid_profiler* p = open_with(setting, "31", NULL, &log);
  TEST_CHECK(p != NULL, "%s: no profiler:\n%s", what, log);
  if (p == NULL) return;
  snprintf(want, sizeof want, "PROFILER/Plugin: loaded profiler 'braidtest' (v%d) from ", v);
  expect_in(log, want, what);
  expect_in(log, "NCCL_PROFILER_PLUGIN set by environment to braidtest-v", what);
  TEST_CHECK(strstr(log, "WARN") == NULL, "%s: a WARN:\n%s", what, log);
  emit_all(p);
  profiler_close(p);
  const char* t = trace_stop();
  snprintf(want, sizeof want, "libnccl-profiler-braidtest-v%d.so", v);
  TEST_CHECK(!still_loaded(want), "%s: the library stays loaded after its last instance", what);
  snprintf(want, sizeof want, "{\"version\":%d,", v);
  expect_in(t, want, what);
  expect_in(t, "\"mask_given\":31,\"mask\":31", what);
  if (v >= 4) expect_in(t, "\"name\":\"unit\",\"rank\":1,\"nranks\":2,\"nnodes\":1,\"commId\":\"0xabc\"", what);
  expect_in(t, "{\"id\":1,\"type\":\"Group\",\"parent\":0,\"stopped\":1", what);
  /* Two all-reduces (sequence 0 and 1), a broadcast, a send, a receive, all under the group. */
  if (v >= 2) {
    expect_in(t, "{\"id\":2,\"type\":\"Coll\",\"parent\":1,\"stopped\":1,\"func\":\"AllReduce\","
                 "\"func_num\":-1,\"count\":1024,\"datatype\":\"ncclFloat32\"", what);
    expect_in(t, "\"seq\":0,\"root\":-1,\"algo\":\"Ring\",\"proto\":\"LL\",\"algo_num\":-1,"
                 "\"proto_num\":-1,\"nChannels\":2", what);
    expect_in(t, "{\"id\":3,\"type\":\"Coll\",\"parent\":1,\"stopped\":1,\"func\":\"AllReduce\"", what);
    expect_in(t, "\"seq\":1,\"root\":-1", what);
    expect_in(t, "{\"id\":4,\"type\":\"Coll\",\"parent\":1,\"stopped\":1,\"func\":\"Broadcast\","
                 "\"func_num\":-1,\"count\":77,\"datatype\":\"ncclInt8\"", what);
    expect_in(t, "\"seq\":0,\"root\":1,\"algo\":\"Tree\",\"proto\":\"Simple\"", what);
    expect_in(t, "{\"id\":5,\"type\":\"P2p\",\"parent\":1,\"stopped\":1,\"func\":\"Send\","
                 "\"func_num\":-1,\"count\":5,\"datatype\":\"ncclUint64\"", what);
    expect_in(t, "{\"id\":6,\"type\":\"P2p\",\"parent\":1,\"stopped\":1,\"func\":\"Recv\","
                 "\"func_num\":-1,\"count\":6", what);
  } else {
    /* v1: ncclFunc_t, ncclDataType_t and NCCL's algorithm and protocol numbers. */
    expect_in(t, "{\"id\":2,\"type\":\"Coll\",\"parent\":1,\"stopped\":1,\"func\":\"\","
                 "\"func_num\":4,\"count\":1024,\"datatype\":\"\",\"datatype_num\":7", what);
    expect_in(t, "\"seq\":0,\"root\":-1,\"algo\":\"\",\"proto\":\"\",\"algo_num\":1,"
                 "\"proto_num\":0,\"nChannels\":2", what);
    expect_in(t, "\"seq\":1,\"root\":-1", what);
    expect_in(t, "\"func_num\":0,\"count\":77,\"datatype\":\"\",\"datatype_num\":0", what);
    expect_in(t, "\"algo_num\":0,\"proto_num\":2", what);
    expect_in(t, "{\"id\":5,\"type\":\"P2p\",\"parent\":1,\"stopped\":1,\"func\":\"\","
                 "\"func_num\":6,\"count\":5,\"datatype\":\"\",\"datatype_num\":5", what);
    expect_in(t, "\"func_num\":7,\"count\":6", what);
  }
  /* v1 to v3 carry the comm's name and hash in each task; v5 names the group twice, alike. */
  if (v <= 3) expect_in(t, "\"comm\":\"unit\",\"commHash\":\"0xabc\"", what);
  expect_in(t, "\"type\":\"P2p\",\"parent\":1,\"stopped\":1", what);
  expect_in(t, "{\"id\":7,\"type\":\"ProxyOp\",\"parent\":0,\"stopped\":1,\"peer\":0,\"channel\":3,"
               "\"nSteps\":4,\"chunkSize\":4096,\"isSend\":1,\"pid_ok\":1", what);
  snprintf(want, sizeof want,
           "{\"id\":8,\"type\":\"ProxyStep\",\"parent\":7,\"stopped\":1,\"step\":7,\"bytes\":%d,"
           "\"states\":[9]}",
           v >= 4 ? 4000 : 0);
  expect_in(t, want, what);
  TEST_CHECK(strstr(t, "\"parent\":-1") == NULL, "%s: parentObj and parentGroup differ:\n%s", what, t);
}

/* The mask: NCCL_PROFILE_EVENT_MASK is where init starts; the plugin's word decides. */
static void test_mask(void) {
  const char* log;
  trace_start();
  struct braid_profiler* p = open_with("braidtest-v5", "2", NULL, &log);
  TEST_CHECK(p && profiler_wants(p, PROF_EV_COLL) && !profiler_wants(p, PROF_EV_GROUP),
             "mask 2: collectives only:\n%s", log);
  if (p) emit_all(p);
  profiler_close(p);
  const char* t = trace_stop();
  expect_in(t, "\"mask_given\":2,\"mask\":2", "mask 2");
  expect_in(t, "{\"id\":1,\"type\":\"Coll\",\"parent\":0,\"stopped\":1,\"func\":\"AllReduce\"", "mask 2");
  TEST_CHECK(strstr(t, "Group") == NULL && strstr(t, "P2p") == NULL && strstr(t, "Proxy") == NULL,
             "mask 2: other events came:\n%s", t);

  trace_start();
  setenv("BRAIDTEST_PROFILER_MASK", "0x18", 1); /* the plugin wants proxy ops and steps */
  p = open_with("braidtest-v4", NULL, NULL, &log);
  unsetenv("BRAIDTEST_PROFILER_MASK");
  if (p) emit_all(p);
  profiler_close(p);
  t = trace_stop();
  expect_in(t, "\"mask_given\":0,\"mask\":24", "plugin's mask");
  expect_in(t, "{\"id\":1,\"type\":\"ProxyOp\",\"parent\":0,\"stopped\":1", "plugin's mask");
  expect_in(t, "{\"id\":2,\"type\":\"ProxyStep\",\"parent\":1,\"stopped\":1", "plugin's mask");
  TEST_CHECK(strstr(t, "Coll") == NULL && strstr(t, "Group") == NULL,
             "plugin's mask: events it did not ask for:\n%s", t);
}

/* Every way of having no profiler: none says so, the others warn; never an error. */
static void test_refused(void) {
  const char* log;
  struct braid_profiler* p = open_with("none", "31", NULL, &log);
  TEST_CHECK(p == NULL, "none: a profiler");
  expect_in(log, "NCCL_PROFILER_PLUGIN set by environment to none", "none");
  TEST_CHECK(strstr(log, "WARN") == NULL, "none: a WARN:\n%s", log);
  TEST_CHECK(profiler_loaded() == NULL, "none: a library loaded");

  p = open_with("nosuchprofiler", "31", NULL, &log);
  TEST_CHECK(p == NULL, "missing: a profiler");
  expect_in(log, "BRAID WARN", "missing");
  expect_in(log, "NCCL_PROFILER_PLUGIN=nosuchprofiler: no profiler plugin loaded (", "missing");
  expect_in(log, "libnccl-profiler-nosuchprofiler.so", "missing");
  p = open_with("nosuchprofiler", "31", NULL, &log);
  TEST_CHECK(p == NULL && strstr(log, "WARN") == NULL, "missing again: looked for twice:\n%s", log);

  p = open_with("braidtest-v6", "31", NULL, &log);
  TEST_CHECK(p == NULL, "v6 only: a profiler");
  expect_in(log, "BRAID WARN", "v6 only");
  expect_in(log, "NCCL_PROFILER_PLUGIN: braidtest-v6 has no ncclProfiler_v5 to _v1", "v6 only");
  expect_in(log, "; it has ncclProfiler_v6: not loaded", "v6 only");
  TEST_CHECK(!still_loaded("libnccl-profiler-braidtest-v6.so"), "v6 only: the library stays loaded");

  setenv("BRAIDTEST_PROFILER_FAIL", "init", 1);
  p = open_with("braidtest-v5", "31", NULL, &log);
  TEST_CHECK(p == NULL, "failing init: a profiler");
  expect_in(log, "BRAID WARN", "failing init");
  expect_in(log, "init for rank 1 of 2 returned ncclInternalError; this communicator has no profiler",
            "failing init");
  TEST_CHECK(!still_loaded("libnccl-profiler-braidtest-v5.so"), "failing init: library stays loaded");

  setenv("BRAIDTEST_PROFILER_FAIL", "start", 1);
  trace_start();
  p = open_with("braidtest-v3", "31", NULL, &log);
  TEST_CHECK(p != NULL, "failing starts: no profiler:\n%s", log);
  log_start();
  if (p) {
    emit_all(p);
    emit_all(p);
  }
  log = log_stop();
  profiler_close(p);
  unsetenv("BRAIDTEST_PROFILER_FAIL");
  const char* t = trace_stop();
  expect_in(log, "startEvent returned ncclInternalError", "failing starts");
  TEST_CHECK(strstr(strstr(log, "startEvent returned") ? strstr(log, "startEvent returned") + 1 : log,
                    "startEvent returned") == NULL,
             "failing starts: said more than once:\n%s", log);
  TEST_CHECK(strstr(log, "WARN") == NULL, "failing starts: a WARN:\n%s", log);
  expect_in(t, "\"events\":[]", "failing starts");
}

/* Unset and no libnccl-profiler.so: the net plugin's library is searched. */
static void test_net_library(void) {
  const char* log;
  char path[512];
  snprintf(path, sizeof path, "%s/libnccl-profiler-braidtest-v2.so", BRAID_PROFILER_DIR);
  struct braid_profiler* p = open_with(NULL, "1", path, &log);
  TEST_CHECK(p != NULL, "net library: no profiler:\n%s", log);
  expect_in(log, "loaded profiler 'braidtest' (v2) from ", "net library");
  expect_in(log, ", the net plugin's library", "net library");
  TEST_CHECK(strstr(log, "WARN") == NULL, "net library: a WARN:\n%s", log);
  profiler_close(p);
}

/* Two communicators share the library; it closes with the second. */
static void test_shared(void) {
  const char* log;
  struct braid_profiler* a = open_with("braidtest-v5", "1", NULL, &log);
  struct braid_profiler* b = open_with("braidtest-v5", "1", NULL, &log);
  TEST_CHECK(a && b && a != b, "shared: two instances");
  profiler_close(a);
  TEST_CHECK(still_loaded("libnccl-profiler-braidtest-v5.so"), "shared: closed under a user");
  profiler_close(b);
  TEST_CHECK(!still_loaded("libnccl-profiler-braidtest-v5.so"), "shared: not closed");
}

static void test_default(void) {
  const char* log;
  struct braid_profiler* p = open_with(NULL, "1", NULL, &log);
  TEST_CHECK(p != NULL, "default: libnccl-profiler.so not found:\n%s", log);
  expect_in(log, "loaded profiler 'braidtest' (v3) from ", "default");
  expect_in(log, "libnccl-profiler.so", "default");
  profiler_close(p);
}

int main(int argc, char** argv) {
  setenv("BRAID_DEBUG", "NONE", 1);
  if (argc > 1 && strcmp(argv[1], "default") == 0) {
    test_default();
    return test_summary();
  }
  for (int v = 5; v >= 1; v--) test_version(v);
  test_mask();
  test_refused();
  test_net_library();
  test_shared();
  return test_summary();
}
