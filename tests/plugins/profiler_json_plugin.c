/*
 * A profiler plugin for the tests, written against NCCL's profiler
 * interface alone (profiler_abi.h, the plugin's own copy of NCCL 2.28's
 * headers): it records every event Braid starts, with its parent, its
 * fields, the states recorded and whether it was stopped, and at finalize
 * appends one JSON line per communicator to $BRAIDTEST_PROFILER_TRACE:
 *
 *   {"version":5,"name":"...","rank":0,"nranks":2,"nnodes":1,"commId":"0x..",
 *    "mask_given":N,"mask":M,"events":[{"id":1,"type":"Group","parent":0,
 *    "stopped":1,...},{"id":2,"type":"Coll","parent":1,"func":"AllReduce",...}]}
 *
 * Built once per interface version (BRAIDTEST_PROF_VERSION 1 to 5, the
 * only ncclProfiler_vN it exports); BRAIDTEST_PROF_VERSION 6 exports only
 * ncclProfiler_v6, a version NCCL 2.28 does not load. Environment:
 * BRAIDTEST_PROFILER_MASK replaces the event mask at init (else the one
 * given stays); BRAIDTEST_PROFILER_FAIL=init makes init fail,
 * BRAIDTEST_PROFILER_FAIL=start makes every startEvent fail.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "profiler_abi.h"

#ifndef BRAIDTEST_PROF_VERSION
#error "BRAIDTEST_PROF_VERSION: the interface version this build exports"
#endif

#define VISIBLE __attribute__((visibility("default")))
#define MAX_STATES 8

struct event {
  int id, type, parent, stopped, nstates;
  int states[MAX_STATES];
  size_t bytes;          /* the last transSize recorded (v4, v5) */
  char func[32], datatype[32], algo[16], proto[16], comm[64];
  int func_num, datatype_num, algo_num, proto_num; /* v1's numbers, -1 otherwise */
  unsigned long long seq, count, comm_hash;
  int root, peer, nchannels, channel, nsteps, chunk, is_send, step, pid_ok;
  struct event* next;
};

struct context {
  int rank, nranks, nnodes, mask_given;
  unsigned long long comm_id;
  char name[64];
  struct event* events; /* newest first */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int next_id = 1;
static int event_mask;
static int* mask_at;

static int fail_is(const char* what) {
  const char* f = getenv("BRAIDTEST_PROFILER_FAIL");
  return f && strcmp(f, what) == 0;
}

static const char* type_name(int type) {
  switch (type) {
    case ncclProfileGroup: return "Group";
    case ncclProfileColl: return "Coll";
    case ncclProfileP2p: return "P2p";
    case ncclProfileProxyOp: return "ProxyOp";
    case ncclProfileProxyStep: return "ProxyStep";
    case ncclProfileProxyCtrl: return "ProxyCtrl";
    case ncclProfileKernelCh: return "KernelCh";
    default: return "Other";
  }
}

static ncclResult_t common_init(void** context, int* mask, const char* name, unsigned long long id,
                                int nnodes, int nranks, int rank) {
  if (fail_is("init")) return ncclInternalError;
  struct context* c = calloc(1, sizeof *c);
  if (c == NULL) return ncclSystemError;
  c->mask_given = *mask;
  const char* m = getenv("BRAIDTEST_PROFILER_MASK");
  if (m) *mask = (int)strtol(m, NULL, 0);
  mask_at = mask;
  event_mask = *mask;
  snprintf(c->name, sizeof c->name, "%s", name ? name : "");
  c->comm_id = id;
  c->nnodes = nnodes;
  c->nranks = nranks;
  c->rank = rank;
  *context = c;
  return ncclSuccess;
}

/* A new event of `type` under the parent handle `parent` (ours, or NULL). */
static struct event* event_new(struct context* c, int type, void* parent) {
  struct event* e = calloc(1, sizeof *e);
  if (e == NULL) return NULL;
  e->type = type;
  e->parent = parent ? ((struct event*)parent)->id : 0;
  e->func_num = e->datatype_num = e->algo_num = e->proto_num = -1;
  pthread_mutex_lock(&lock);
  e->id = next_id++;
  e->next = c->events;
  c->events = e;
  pthread_mutex_unlock(&lock);
  return e;
}

static void copy(char* to, size_t n, const char* from) { snprintf(to, n, "%s", from ? from : "(null)"); }

static ncclResult_t stop_event(void* handle) {
  struct event* e = handle;
  if (e == NULL) return ncclSuccess;
  pthread_mutex_lock(&lock);
  e->stopped++;
  pthread_mutex_unlock(&lock);
  return ncclSuccess;
}

static void state_add(struct event* e, int state, size_t bytes) {
  pthread_mutex_lock(&lock);
  if (e->nstates < MAX_STATES) e->states[e->nstates++] = state;
  e->bytes = bytes;
  pthread_mutex_unlock(&lock);
}

static void write_event(FILE* f, const struct event* e) {
  fprintf(f, "{\"id\":%d,\"type\":\"%s\",\"parent\":%d,\"stopped\":%d", e->id, type_name(e->type),
          e->parent, e->stopped);
  if (e->type == ncclProfileColl || e->type == ncclProfileP2p)
    fprintf(f,
            ",\"func\":\"%s\",\"func_num\":%d,\"count\":%llu,\"datatype\":\"%s\",\"datatype_num\":%d,"
            "\"comm\":\"%s\",\"commHash\":\"0x%llx\"",
            e->func, e->func_num, e->count, e->datatype, e->datatype_num, e->comm, e->comm_hash);
  if (e->type == ncclProfileColl)
    fprintf(f, ",\"seq\":%llu,\"root\":%d,\"algo\":\"%s\",\"proto\":\"%s\",\"algo_num\":%d,"
               "\"proto_num\":%d,\"nChannels\":%d",
            e->seq, e->root, e->algo, e->proto, e->algo_num, e->proto_num, e->nchannels);
  if (e->type == ncclProfileP2p) fprintf(f, ",\"peer\":%d", e->peer);
  if (e->type == ncclProfileProxyOp)
    fprintf(f, ",\"peer\":%d,\"channel\":%d,\"nSteps\":%d,\"chunkSize\":%d,\"isSend\":%d,\"pid_ok\":%d",
            e->peer, e->channel, e->nsteps, e->chunk, e->is_send, e->pid_ok);
  if (e->type == ncclProfileProxyStep) fprintf(f, ",\"step\":%d,\"bytes\":%zu", e->step, e->bytes);
  fprintf(f, ",\"states\":[");
  for (int i = 0; i < e->nstates; i++) fprintf(f, "%s%d", i ? "," : "", e->states[i]);
  fprintf(f, "]}");
}

static ncclResult_t finalize(void* context) {
  struct context* c = context;
  const char* path = getenv("BRAIDTEST_PROFILER_TRACE");
  char* text = NULL;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (f == NULL) return ncclSystemError;
  fprintf(f,
          "{\"version\":%d,\"name\":\"%s\",\"rank\":%d,\"nranks\":%d,\"nnodes\":%d,"
          "\"commId\":\"0x%llx\",\"mask_given\":%d,\"mask\":%d,\"events\":[",
          BRAIDTEST_PROF_VERSION, c->name, c->rank, c->nranks, c->nnodes, c->comm_id,
          c->mask_given, mask_at ? *mask_at : event_mask);
  /* Oldest first: the list is newest first, so write it reversed. */
  int n = 0;
  for (struct event* e = c->events; e; e = e->next) n++;
  struct event** all = calloc((size_t)n + 1, sizeof *all);
  int i = n;
  for (struct event* e = c->events; e && all; e = e->next) all[--i] = e;
  for (i = 0; all && i < n; i++) {
    if (i) fputc(',', f);
    write_event(f, all[i]);
  }
  fprintf(f, "]}\n");
  fclose(f);
  if (path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      flock(fd, LOCK_EX);
      ssize_t w = write(fd, text, len);
      (void)w;
      flock(fd, LOCK_UN);
      close(fd);
    }
  }
  free(text);
  for (struct event* e = c->events; e;) {
    struct event* next = e->next;
    free(e);
    e = next;
  }
  free(all);
  free(c);
  return ncclSuccess;
}

/* The fields every version has alike: proxy events. */
#define FILL_PROXY(e, d)                                         \
  do {                                                           \
    if ((d)->type == ncclProfileProxyOp) {                       \
      (e)->peer = (d)->proxyOp.peer;                             \
      (e)->channel = (d)->proxyOp.channelId;                     \
      (e)->nsteps = (d)->proxyOp.nSteps;                         \
      (e)->chunk = (d)->proxyOp.chunkSize;                       \
      (e)->is_send = (d)->proxyOp.isSend;                        \
      (e)->pid_ok = (d)->proxyOp.pid == getpid();                \
    } else if ((d)->type == ncclProfileProxyStep) {              \
      (e)->step = (d)->proxyStep.step;                           \
    }                                                            \
  } while (0)

/* Names (v2 and later): the task's strings. */
#define FILL_TASK_NAMES(e, d)                                    \
  do {                                                           \
    if ((d)->type == ncclProfileColl) {                          \
      copy((e)->func, sizeof (e)->func, (d)->coll.func);         \
      copy((e)->datatype, sizeof (e)->datatype, (d)->coll.datatype); \
      copy((e)->algo, sizeof (e)->algo, (d)->coll.algo);         \
      copy((e)->proto, sizeof (e)->proto, (d)->coll.proto);      \
      (e)->seq = (d)->coll.seqNumber;                            \
      (e)->count = (d)->coll.count;                              \
      (e)->root = (d)->coll.root;                                \
    } else if ((d)->type == ncclProfileP2p) {                    \
      copy((e)->func, sizeof (e)->func, (d)->p2p.func);          \
      copy((e)->datatype, sizeof (e)->datatype, (d)->p2p.datatype); \
      (e)->count = (d)->p2p.count;                               \
      (e)->peer = (d)->p2p.peer;                                 \
    }                                                            \
  } while (0)

#if BRAIDTEST_PROF_VERSION == 5 || BRAIDTEST_PROF_VERSION == 4
#if BRAIDTEST_PROF_VERSION == 5
typedef ncclProfilerEventDescr_v5_t descr_t;
typedef ncclProfilerEventStateArgs_v5_t args_t;
static ncclResult_t init(void** context, uint64_t comm_id, int* mask, const char* name, int nnodes,
                         int nranks, int rank, ncclDebugLogger_t logfn) {
  if (logfn) logfn(NCCL_LOG_INFO, NCCL_INIT, __FILE__, __LINE__, "braidtest profiler v5: init rank %d", rank);
  return common_init(context, mask, name, comm_id, nnodes, nranks, rank);
}
#else
typedef ncclProfilerEventDescr_v4_t descr_t;
typedef ncclProfilerEventStateArgs_v4_t args_t;
static ncclResult_t init(void** context, int* mask, const char* name, uint64_t comm_hash,
                         int nnodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)logfn;
  return common_init(context, mask, name, comm_hash, nnodes, nranks, rank);
}
#endif
static ncclResult_t start_event(void* context, void** handle, descr_t* d) {
  *handle = NULL;
  if (fail_is("start")) return ncclInternalError;
  struct event* e = event_new(context, (int)d->type, d->parentObj);
  if (e == NULL) return ncclSuccess;
  FILL_TASK_NAMES(e, d);
  if (d->type == ncclProfileColl) e->nchannels = d->coll.nChannels;
#if BRAIDTEST_PROF_VERSION == 5
  /* v5 also names the group in parentGroup: it must agree with parentObj. */
  if (d->type == ncclProfileColl && d->coll.parentGroup != d->parentObj) e->parent = -1;
  if (d->type == ncclProfileP2p && d->p2p.parentGroup != d->parentObj) e->parent = -1;
#endif
  FILL_PROXY(e, d);
  *handle = e;
  return ncclSuccess;
}
static ncclResult_t record_state(void* handle, ncclProfilerEventState_t state, args_t* args) {
  if (handle) state_add(handle, (int)state, args ? args->proxyStep.transSize : 0);
  return ncclSuccess;
}
#else
#if BRAIDTEST_PROF_VERSION == 1
typedef ncclProfilerEventDescr_v1_t descr_t;
#elif BRAIDTEST_PROF_VERSION == 2
typedef ncclProfilerEventDescr_v2_t descr_t;
#else
typedef ncclProfilerEventDescr_v3_t descr_t;
#endif
static ncclResult_t init(void** context, int* mask) {
  return common_init(context, mask, NULL, 0, -1, -1, -1);
}
static ncclResult_t start_event(void* context, void** handle, descr_t* d) {
  *handle = NULL;
  if (fail_is("start")) return ncclInternalError;
  struct event* e = event_new(context, d->type, d->parentObj);
  if (e == NULL) return ncclSuccess;
  if (d->type == ncclProfileColl) {
    copy(e->comm, sizeof e->comm, d->coll.name);
    e->comm_hash = d->coll.commHash;
    e->nchannels = d->coll.nMaxChannels;
  } else if (d->type == ncclProfileP2p) {
    copy(e->comm, sizeof e->comm, d->p2p.name);
    e->comm_hash = d->p2p.commHash;
  }
#if BRAIDTEST_PROF_VERSION == 1
  if (d->type == ncclProfileColl) {
    e->func_num = d->coll.func;
    e->datatype_num = d->coll.datatype;
    e->algo_num = d->coll.algo;
    e->proto_num = d->coll.proto;
    e->seq = d->coll.seqNumber;
    e->count = d->coll.count;
    e->root = d->coll.root;
  } else if (d->type == ncclProfileP2p) {
    e->func_num = d->p2p.func;
    e->datatype_num = d->p2p.datatype;
    e->count = d->p2p.count;
    e->peer = d->p2p.peer;
  }
#else
  FILL_TASK_NAMES(e, d);
#endif
  FILL_PROXY(e, d);
  *handle = e;
  return ncclSuccess;
}
static ncclResult_t record_state(void* handle, ncclProfilerEventState_t state,
                                 ncclProfilerEventStateArgs_v1_t* args) {
  (void)args;
  if (handle) state_add(handle, (int)state, 0);
  return ncclSuccess;
}
#endif

#define EXPORT_NAME2(v) ncclProfiler_v##v
#define EXPORT_NAME(v) EXPORT_NAME2(v)
#define TYPE_NAME2(v) ncclProfiler_v##v##_t
#define TYPE_NAME(v) TYPE_NAME2(v)

#if BRAIDTEST_PROF_VERSION == 6
/* A version NCCL 2.28 does not know: only its symbol matters to the loader. */
VISIBLE const struct {
  const char* name;
} ncclProfiler_v6 = {"braidtest-v6"};
/* Unused in this build, kept so that every build compiles the same code. */
void* braidtest_profiler_unused[] = {(void*)init, (void*)start_event, (void*)record_state,
                                     (void*)stop_event, (void*)finalize};
#else
VISIBLE const TYPE_NAME(BRAIDTEST_PROF_VERSION) EXPORT_NAME(BRAIDTEST_PROF_VERSION) = {
    .name = "braidtest",
    .init = init,
    .startEvent = start_event,
    .stopEvent = stop_event,
    .recordEventState = record_state,
    .finalize = finalize,
};
#endif
