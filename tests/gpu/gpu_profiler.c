/*
 * gpu_profiler: the profiler plugin's events from real collectives. One
 * process drives every visible GPU (at most 4) through ncclCommInitAll,
 * with the test profiler of tests/plugins loaded by NCCL_PROFILER_PLUGIN
 * (the v5 build) and NCCL_PROFILE_EVENT_MASK=7 (group, collective, p2p).
 * It launches, on every communicator:
 *   1. an all-reduce of 1024 floats, 2. another, 3. a broadcast of 77
 *   int8 from rank 0, 4. one group of an all-gather (256 floats each) and
 *   a reduce-scatter (256 floats each), 5. with 2 ranks or more, a group of
 *   a send of 100 int32 to the next rank and a receive from the previous.
 * After the communicators are destroyed (each finalize appends one JSON
 * line to BRAIDTEST_PROFILER_TRACE), it reads the trace back: per rank one
 * collective event per collective called, with its name, count, type,
 * root and sequence number, an algorithm, protocol and channel count; one
 * group event per launch, parenting every collective and p2p event of that
 * launch (the two collectives of step 4 under one group); every event
 * stopped. Only the public API is used, as in gpu_coll.
 *
 * Exit status: 0 passed, 1 failed, 77 no GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "nccl.h"

#define MAX_DEVS 4
#define MAX_EVENTS 64

static int failures;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "gpu_profiler: FAILED: " __VA_ARGS__); \
      fprintf(stderr, "\n");                               \
      failures++;                                          \
    }                                                      \
  } while (0)

#define NCCL_OK(call)                                                                 \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess) {                                                          \
      fprintf(stderr, "gpu_profiler: %s: %s\n", #call, ncclGetErrorString(r_));       \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

#define CUDA_OK(call)                                                                 \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      fprintf(stderr, "gpu_profiler: %s: %s\n", #call, cudaGetErrorString(e_));       \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

struct event {
  int id, parent, stopped;
  long long count, seq;
  int root, peer, nchannels;
  char type[16], func[32], datatype[32], algo[16], proto[16];
};

/* The value after "key": in [from, to), as text (quotes stripped); "" when absent. */
static void field(const char* from, const char* to, const char* key, char* out, size_t n) {
  char pat[40];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  out[0] = '\0';
  const char* p = strstr(from, pat);
  if (p == NULL || p >= to) return;
  p += strlen(pat);
  if (*p == '"') p++;
  size_t i = 0;
  while (p < to && *p != '"' && *p != ',' && *p != '}' && i + 1 < n) out[i++] = *p++;
  out[i] = '\0';
}

static long long field_int(const char* from, const char* to, const char* key) {
  char text[32];
  field(from, to, key, text, sizeof text);
  return text[0] ? strtoll(text, NULL, 0) : -999;
}

/* The events of one trace line; returns how many. */
static int parse_events(const char* line, struct event* ev, int max) {
  int n = 0;
  for (const char* p = strstr(line, "{\"id\":"); p && n < max; p = strstr(p + 1, "{\"id\":")) {
    const char* end = strchr(p, '}');
    if (end == NULL) break;
    struct event* e = &ev[n++];
    memset(e, 0, sizeof *e);
    e->id = (int)field_int(p, end, "id");
    e->parent = (int)field_int(p, end, "parent");
    e->stopped = (int)field_int(p, end, "stopped");
    e->count = field_int(p, end, "count");
    e->seq = field_int(p, end, "seq");
    e->root = (int)field_int(p, end, "root");
    e->peer = (int)field_int(p, end, "peer");
    e->nchannels = (int)field_int(p, end, "nChannels");
    field(p, end, "type", e->type, sizeof e->type);
    field(p, end, "func", e->func, sizeof e->func);
    field(p, end, "datatype", e->datatype, sizeof e->datatype);
    field(p, end, "algo", e->algo, sizeof e->algo);
    field(p, end, "proto", e->proto, sizeof e->proto);
  }
  return n;
}

static const struct event* find(const struct event* ev, int n, const char* type, const char* func,
                                int nth) {
  for (int i = 0; i < n; i++)
    if (strcmp(ev[i].type, type) == 0 && (func == NULL || strcmp(ev[i].func, func) == 0) && nth-- == 0)
      return &ev[i];
  return NULL;
}

static const struct event* by_id(const struct event* ev, int n, int id) {
  for (int i = 0; i < n; i++)
    if (ev[i].id == id) return &ev[i];
  return NULL;
}

static int count_type(const struct event* ev, int n, const char* type) {
  int c = 0;
  for (int i = 0; i < n; i++) c += strcmp(ev[i].type, type) == 0;
  return c;
}

/* A task event: present, stopped, under a stopped group event. */
static const struct event* check_task(int rank, const struct event* ev, int n, const char* type,
                                      const char* func, int nth) {
  const struct event* e = find(ev, n, type, func, nth);
  CHECK(e != NULL, "rank %d: no %s event #%d for %s", rank, type, nth + 1, func);
  if (e == NULL) return NULL;
  const struct event* g = by_id(ev, n, e->parent);
  CHECK(e->stopped == 1, "rank %d: %s #%d stopped %d times", rank, func, nth + 1, e->stopped);
  CHECK(g != NULL && strcmp(g->type, "Group") == 0 && g->stopped == 1,
        "rank %d: %s #%d's parent %d is not a stopped group event", rank, func, nth + 1, e->parent);
  return e;
}

static void check_coll(int rank, const struct event* e, long long count, const char* dtype,
                       int root, long long seq) {
  if (e == NULL) return;
  CHECK(e->count == count && strcmp(e->datatype, dtype) == 0 && e->root == root && e->seq == seq,
        "rank %d: %s: count %lld %s root %d seq %lld, expected %lld %s root %d seq %lld", rank,
        e->func, e->count, e->datatype, e->root, e->seq, count, dtype, root, seq);
  CHECK(e->algo[0] && strcmp(e->algo, "none") != 0 && e->proto[0] &&
            strcmp(e->proto, "none") != 0 && e->nchannels >= 1,
        "rank %d: %s: algorithm '%s', protocol '%s', %d channels", rank, e->func, e->algo,
        e->proto, e->nchannels);
}

static void check_rank(const char* line, int ndev) {
  static struct event ev[MAX_EVENTS];
  char text[16];
  field(line, line + strlen(line), "rank", text, sizeof text);
  const int rank = atoi(text);
  const int n = parse_events(line, ev, MAX_EVENTS);
  const int launches = ndev > 1 ? 5 : 4;
  CHECK(count_type(ev, n, "Group") == launches, "rank %d: %d group events, expected %d", rank,
        count_type(ev, n, "Group"), launches);
  CHECK(count_type(ev, n, "Coll") == 5, "rank %d: %d collective events, expected 5", rank,
        count_type(ev, n, "Coll"));
  const struct event* ar0 = check_task(rank, ev, n, "Coll", "AllReduce", 0);
  const struct event* ar1 = check_task(rank, ev, n, "Coll", "AllReduce", 1);
  const struct event* bc = check_task(rank, ev, n, "Coll", "Broadcast", 0);
  const struct event* ag = check_task(rank, ev, n, "Coll", "AllGather", 0);
  const struct event* rs = check_task(rank, ev, n, "Coll", "ReduceScatter", 0);
  /* Collectives without a root report root 0, as NCCL's do. */
  check_coll(rank, ar0, 1024, "ncclFloat32", 0, 0);
  check_coll(rank, ar1, 1024, "ncclFloat32", 0, 1);
  check_coll(rank, bc, 77, "ncclInt8", 0, 0);
  check_coll(rank, ag, 256, "ncclFloat32", 0, 0);
  check_coll(rank, rs, 256, "ncclFloat32", 0, 0);
  if (ar0 && ar1 && bc && ag)
    CHECK(ar0->parent != ar1->parent && ar1->parent != bc->parent && bc->parent != ag->parent,
          "rank %d: calls outside a group share a group event", rank);
  if (ag && rs)
    CHECK(ag->parent == rs->parent, "rank %d: one group's collectives under two group events", rank);
  if (ndev > 1) {
    CHECK(count_type(ev, n, "P2p") == 2, "rank %d: %d p2p events, expected 2", rank,
          count_type(ev, n, "P2p"));
    const struct event* s = check_task(rank, ev, n, "P2p", "Send", 0);
    const struct event* r = check_task(rank, ev, n, "P2p", "Recv", 0);
    if (s)
      CHECK(s->count == 100 && s->peer == (rank + 1) % ndev && strcmp(s->datatype, "ncclInt32") == 0,
            "rank %d: send of %lld %s to %d", rank, s->count, s->datatype, s->peer);
    if (r)
      CHECK(r->count == 100 && r->peer == (rank + ndev - 1) % ndev,
            "rank %d: receive of %lld from %d", rank, r->count, r->peer);
    if (s && r) CHECK(s->parent == r->parent, "rank %d: the send and receive in two groups", rank);
  }
}

int main(void) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    fprintf(stderr, "gpu_profiler: no GPU: skipped\n");
    return 77;
  }
  const char* trace = getenv("BRAIDTEST_PROFILER_TRACE");
  if (trace == NULL || getenv("NCCL_PROFILER_PLUGIN") == NULL) {
    fprintf(stderr, "gpu_profiler: set NCCL_PROFILER_PLUGIN and BRAIDTEST_PROFILER_TRACE\n");
    return 1;
  }
  remove(trace);
  if (ndev > MAX_DEVS) ndev = MAX_DEVS;
  int devs[MAX_DEVS];
  ncclComm_t comms[MAX_DEVS];
  cudaStream_t streams[MAX_DEVS];
  float* buf[MAX_DEVS];
  const size_t floats = 256 * (size_t)ndev + 1024;
  for (int i = 0; i < ndev; i++) devs[i] = i;
  NCCL_OK(ncclCommInitAll(comms, ndev, devs));
  for (int i = 0; i < ndev; i++) {
    CUDA_OK(cudaSetDevice(i));
    CUDA_OK(cudaStreamCreate(&streams[i]));
    CUDA_OK(cudaMalloc((void**)&buf[i], 2 * floats * sizeof(float)));
    CUDA_OK(cudaMemset(buf[i], 0, 2 * floats * sizeof(float)));
  }
  /* Steps 1 to 3: each call is a group of its own, per communicator. */
  for (int k = 0; k < 2; k++) {
    NCCL_OK(ncclGroupStart()); /* one thread drives every GPU: the calls of one step together */
    for (int i = 0; i < ndev; i++)
      NCCL_OK(ncclAllReduce(buf[i], buf[i] + floats, 1024, ncclFloat32, ncclSum, comms[i], streams[i]));
    NCCL_OK(ncclGroupEnd());
  }
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < ndev; i++)
    NCCL_OK(ncclBroadcast(buf[i], buf[i] + floats, 77, ncclInt8, 0, comms[i], streams[i]));
  NCCL_OK(ncclGroupEnd());
  /* Step 4: two collectives in one group. */
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < ndev; i++) {
    NCCL_OK(ncclAllGather(buf[i], buf[i] + floats, 256, ncclFloat32, comms[i], streams[i]));
    NCCL_OK(ncclReduceScatter(buf[i], buf[i] + floats, 256, ncclFloat32, ncclSum, comms[i], streams[i]));
  }
  NCCL_OK(ncclGroupEnd());
  /* Step 5: a ring of sends and receives. */
  if (ndev > 1) {
    NCCL_OK(ncclGroupStart());
    for (int i = 0; i < ndev; i++) {
      NCCL_OK(ncclSend(buf[i], 100, ncclInt32, (i + 1) % ndev, comms[i], streams[i]));
      NCCL_OK(ncclRecv(buf[i] + floats, 100, ncclInt32, (i + ndev - 1) % ndev, comms[i], streams[i]));
    }
    NCCL_OK(ncclGroupEnd());
  }
  for (int i = 0; i < ndev; i++) {
    CUDA_OK(cudaSetDevice(i));
    CUDA_OK(cudaStreamSynchronize(streams[i]));
  }
  for (int i = 0; i < ndev; i++) NCCL_OK(ncclCommDestroy(comms[i]));
  for (int i = 0; i < ndev; i++) {
    CUDA_OK(cudaSetDevice(i));
    CUDA_OK(cudaFree(buf[i]));
    CUDA_OK(cudaStreamDestroy(streams[i]));
  }

  FILE* f = fopen(trace, "r");
  CHECK(f != NULL, "no trace at %s (the profiler was not loaded, or never finalized)", trace);
  if (f == NULL) return 1;
  static char line[1 << 20];
  int lines = 0;
  while (fgets(line, sizeof line, f)) {
    lines++;
    CHECK(strstr(line, "\"version\":5,") != NULL, "trace line %d is not the v5 plugin's", lines);
    check_rank(line, ndev);
  }
  fclose(f);
  CHECK(lines == ndev, "%d trace lines (communicators finalized), expected %d", lines, ndev);
  fprintf(stderr, "gpu_profiler: %d communicators, %s\n", ndev, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
