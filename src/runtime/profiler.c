/*
 * NCCL profiler plugins (NCCL_PROFILER_PLUGIN): finding the library,
 * reading whichever interface version it exports (ncclProfiler_v5 down to
 * _v1, as NCCL 2.28 does), and giving each version its own descriptor
 * layout for the events of profiler.h. Ownership: the library is the
 * process's (lib, under lib_lock, counted by its users); an instance's
 * context is the plugin's, handed back to its finalize; event handles are
 * the plugin's, each stopped once.
 */
#include "runtime/profiler.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "abi/coll.h"
#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/plugin_lib.h"
#include "runtime/profiler_abi.h"

/* The process's profiler library, while any communicator uses it. */
struct profiler_lib {
  void* handle;
  int version;       /* 1 to 5 */
  const void* sym;   /* the exported ncclProfiler_vN struct */
  const char* name;
  char label[PATH_MAX + 64];
  int users;
};

struct braid_profiler {
  void* ctx;                        /* the plugin's, for this communicator */
  int rank;
  uint64_t comm_hash;
  char comm_name[64];
  uint64_t seq[BRAID_COLL_COUNT];   /* collectives started, per collective */
  int start_failed;                 /* a failed startEvent was reported (atomic) */
};

static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;
static struct profiler_lib lib;
/* What the last search that found nothing looked for ("<setting>\n<net library>"). */
static char lib_not_found[2 * PATH_MAX + 2];
/* The event mask every instance shares (the plugins' eActivationMask); read atomically. */
static int profiler_event_mask;

static const char* profiler_result(ncclResult_t res) {
  static const char* names[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                "ncclRemoteError",   "ncclInProgress"};
  return (int)res >= 0 && (int)res < (int)(sizeof names / sizeof names[0]) ? names[res]
                                                                           : "an unknown result";
}

/* ---- the plugin's logger: NCCL's levels and subsystems to Braid's ---- */

static void profiler_log(int level, unsigned long flags, const char* file, int line,
                         const char* fmt, ...) {
  braid_log_level_t lv = level == 2 || level == 4 ? BRAID_LOG_WARN
                         : level == 3             ? BRAID_LOG_INFO
                         : level == 5             ? BRAID_LOG_TRACE
                                                  : BRAID_LOG_VERSION;
  /* NCCL's subsystem bits up to NCCL_PROXY (0x400) are Braid's; then BOOTSTRAP and REG. */
  uint32_t subsys = (uint32_t)(flags & 0x7ffu);
  if (flags & 0x1000u) subsys |= BRAID_LOG_BOOTSTRAP;
  if (flags & 0x2000u) subsys |= BRAID_LOG_REG;
  if (subsys == 0) subsys = BRAID_LOG_INIT;
  if (level <= 0 || !braid_log_enabled(lv, subsys)) return;
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  braid_log_emit(lv, subsys & (~subsys + 1u), file ? file : "profiler", line, "%s", text);
}

/* ---- names as NCCL gives them ---- */

/* ncclFunc_t: the collectives as braid_coll_t, then SendRecv, Send, Recv. */
static int profiler_func(const struct braid_profiler_task* t) {
  return t->coll != BRAID_COLL_SENDRECV ? t->coll : t->is_send ? 6 : 7;
}
static const char* profiler_func_name(const struct braid_profiler_task* t) {
  return t->coll != BRAID_COLL_SENDRECV ? braid_coll_name(t->coll) : t->is_send ? "Send" : "Recv";
}
static const char* profiler_type_name(ncclDataType_t t) {
  static const char* names[] = {"ncclInt8",     "ncclUint8",   "ncclInt32",     "ncclUint32",
                                "ncclInt64",    "ncclUint64",  "ncclFloat16",   "ncclFloat32",
                                "ncclFloat64",  "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return (int)t >= 0 && (int)t < (int)(sizeof names / sizeof names[0]) ? names[t] : "unknown";
}
/* NCCL's algorithm numbers (v1), and names for the others; Direct is Braid's own. */
static int profiler_algo_nccl(int algo) {
  return algo == BRAID_ALGO_RING ? 1 : algo == BRAID_ALGO_TREE ? 0 : 255;
}
static const char* profiler_algo_name(int algo) {
  return algo < 0 ? "none" : braid_algo_name(algo);
}
static int profiler_proto_nccl(int proto) {
  return proto == BRAID_PROTO_LL ? 0 : proto == BRAID_PROTO_LL128 ? 1 : proto == BRAID_PROTO_SIMPLE ? 2 : 255;
}
static const char* profiler_proto_name(int proto) {
  return proto < 0 ? "none" : braid_proto_name(proto);
}

/* ---- the five versions: init, and an event as each one's descriptor ---- */

static ncclResult_t profiler_init_call(const struct braid_profiler_args* a, void** ctx) {
  const char* name = a->comm_name && a->comm_name[0] ? a->comm_name : NULL;
  switch (lib.version) {
    case 5:
      return ((const prof_v5_t*)lib.sym)->init(ctx, a->comm_hash, &profiler_event_mask, name,
                                               a->nnodes, a->nranks, a->rank, profiler_log);
    case 4:
      return ((const prof_v4_t*)lib.sym)->init(ctx, &profiler_event_mask, name, a->comm_hash,
                                               a->nnodes, a->nranks, a->rank, profiler_log);
    default: return ((const prof_v1_t*)lib.sym)->init(ctx, &profiler_event_mask);
  }
}

/* v5 and v4: the descriptor differs in its type's width and v5's parentGroup. */
static ncclResult_t profiler_start_v5(void* ctx, void** h, const prof_descr_v5_t* d) {
  prof_descr_v5_t copy = *d;
  return ((const prof_v5_t*)lib.sym)->startEvent(ctx, h, &copy);
}

static ncclResult_t profiler_start_v4(void* ctx, void** h, const prof_descr_v5_t* d) {
  prof_descr_v4_t e;
  memset(&e, 0, sizeof e);
  e.type = (uint8_t)d->type;
  e.parentObj = d->parentObj;
  e.rank = d->rank;
  switch (d->type) {
    case PROF_EV_COLL:
      e.coll.seqNumber = d->coll.seqNumber;
      e.coll.func = d->coll.func;
      e.coll.sendBuff = d->coll.sendBuff;
      e.coll.recvBuff = d->coll.recvBuff;
      e.coll.count = d->coll.count;
      e.coll.root = d->coll.root;
      e.coll.datatype = d->coll.datatype;
      e.coll.nChannels = d->coll.nChannels;
      e.coll.nWarps = d->coll.nWarps;
      e.coll.algo = d->coll.algo;
      e.coll.proto = d->coll.proto;
      break;
    case PROF_EV_P2P:
      e.p2p.func = d->p2p.func;
      e.p2p.buff = d->p2p.buff;
      e.p2p.datatype = d->p2p.datatype;
      e.p2p.count = d->p2p.count;
      e.p2p.peer = d->p2p.peer;
      e.p2p.nChannels = d->p2p.nChannels;
      break;
    case PROF_EV_PROXY_OP: memcpy(&e.proxyOp, &d->proxyOp, sizeof e.proxyOp); break;
    case PROF_EV_PROXY_STEP: e.proxyStep.step = d->proxyStep.step; break;
    default: break;
  }
  return ((const prof_v4_t*)lib.sym)->startEvent(ctx, h, &e);
}

/*
 * v3 and v2 carry the communicator's name and hash in each task (NCCL 2.28 gives them empty;
 * Braid fills them). The task's fields are filled by `fill` on the version's struct.
 */
#define PROFILER_FILL_V23(e, d, p)                                 \
  do {                                                             \
    (e).type = (uint8_t)(d)->type;                                 \
    (e).parentObj = (d)->parentObj;                                \
    (e).rank = (d)->rank;                                          \
    if ((d)->type == PROF_EV_COLL) {                               \
      (e).coll.name = (p)->comm_name;                              \
      (e).coll.commHash = (p)->comm_hash;                          \
      (e).coll.seqNumber = (d)->coll.seqNumber;                    \
      (e).coll.func = (d)->coll.func;                              \
      (e).coll.sendBuff = (d)->coll.sendBuff;                      \
      (e).coll.recvBuff = (d)->coll.recvBuff;                      \
      (e).coll.count = (d)->coll.count;                            \
      (e).coll.root = (d)->coll.root;                              \
      (e).coll.datatype = (d)->coll.datatype;                      \
      (e).coll.nMaxChannels = (d)->coll.nChannels;                 \
      (e).coll.nWarps = (d)->coll.nWarps;                          \
      (e).coll.algo = (d)->coll.algo;                              \
      (e).coll.proto = (d)->coll.proto;                            \
    } else if ((d)->type == PROF_EV_P2P) {                         \
      (e).p2p.name = (p)->comm_name;                               \
      (e).p2p.commHash = (p)->comm_hash;                           \
      (e).p2p.func = (d)->p2p.func;                                \
      (e).p2p.buff = (d)->p2p.buff;                                \
      (e).p2p.datatype = (d)->p2p.datatype;                        \
      (e).p2p.count = (d)->p2p.count;                              \
      (e).p2p.peer = (d)->p2p.peer;                                \
    } else if ((d)->type == PROF_EV_PROXY_OP) {                    \
      memcpy(&(e).proxyOp, &(d)->proxyOp, sizeof (e).proxyOp);     \
    } else if ((d)->type == PROF_EV_PROXY_STEP) {                  \
      (e).proxyStep.step = (d)->proxyStep.step;                    \
    }                                                              \
  } while (0)

static ncclResult_t profiler_start_v3(const struct braid_profiler* p, void** h,
                                      const prof_descr_v5_t* d) {
  prof_descr_v3_t e;
  memset(&e, 0, sizeof e);
  PROFILER_FILL_V23(e, d, p);
  return ((const prof_v1_t*)lib.sym)->startEvent(p->ctx, h, &e);
}

static ncclResult_t profiler_start_v2(const struct braid_profiler* p, void** h,
                                      const prof_descr_v5_t* d) {
  prof_descr_v2_t e;
  memset(&e, 0, sizeof e);
  PROFILER_FILL_V23(e, d, p);
  if (d->type == PROF_EV_COLL) e.coll.trafficBytes = 0; /* NCCL 2.28 gives none either */
  return ((const prof_v1_t*)lib.sym)->startEvent(p->ctx, h, &e);
}

/* v1: numbers for names; `t` is the task (NULL for group and proxy events). */
static ncclResult_t profiler_start_v1(const struct braid_profiler* p, void** h,
                                      const prof_descr_v5_t* d,
                                      const struct braid_profiler_task* t) {
  prof_descr_v1_t e;
  memset(&e, 0, sizeof e);
  e.type = (uint8_t)d->type;
  e.parentObj = d->parentObj;
  e.rank = d->rank;
  if (d->type == PROF_EV_COLL && t) {
    e.coll.name = p->comm_name;
    e.coll.commHash = p->comm_hash;
    e.coll.seqNumber = d->coll.seqNumber;
    e.coll.func = (uint8_t)profiler_func(t);
    e.coll.sendBuff = d->coll.sendBuff;
    e.coll.recvBuff = d->coll.recvBuff;
    e.coll.count = d->coll.count;
    e.coll.root = d->coll.root;
    e.coll.datatype = (uint8_t)t->dtype;
    e.coll.nMaxChannels = d->coll.nChannels;
    e.coll.nWarps = d->coll.nWarps;
    e.coll.algo = (uint8_t)profiler_algo_nccl(t->algo);
    e.coll.proto = (uint8_t)profiler_proto_nccl(t->proto);
  } else if (d->type == PROF_EV_P2P && t) {
    e.p2p.name = p->comm_name;
    e.p2p.commHash = p->comm_hash;
    e.p2p.func = (uint8_t)profiler_func(t);
    e.p2p.buff = d->p2p.buff;
    e.p2p.datatype = (uint8_t)t->dtype;
    e.p2p.count = d->p2p.count;
    e.p2p.peer = d->p2p.peer;
  } else if (d->type == PROF_EV_PROXY_OP) {
    memcpy(&e.proxyOp, &d->proxyOp, sizeof e.proxyOp);
  } else if (d->type == PROF_EV_PROXY_STEP) {
    e.proxyStep.step = d->proxyStep.step;
  }
  return ((const prof_v1_t*)lib.sym)->startEvent(p->ctx, h, &e);
}

/* Starts an event in the plugin's version; NULL when it is not recorded or the plugin failed. */
static void* profiler_start(struct braid_profiler* p, const prof_descr_v5_t* d,
                            const struct braid_profiler_task* t) {
  void* h = NULL;
  ncclResult_t res;
  switch (lib.version) {
    case 5: res = profiler_start_v5(p->ctx, &h, d); break;
    case 4: res = profiler_start_v4(p->ctx, &h, d); break;
    case 3: res = profiler_start_v3(p, &h, d); break;
    case 2: res = profiler_start_v2(p, &h, d); break;
    default: res = profiler_start_v1(p, &h, d, t); break;
  }
  if (res == ncclSuccess) return h;
  if (!__atomic_exchange_n(&p->start_failed, 1, __ATOMIC_RELAXED))
    INFO(BRAID_LOG_INIT,
         "profiler %s: startEvent returned %s for an event of type 0x%llx; that event is not "
         "recorded, the call goes on (said once per communicator)",
         lib.label, profiler_result(res), (unsigned long long)d->type);
  return NULL;
}

/* The state of a proxy step in NCCL's numbers; v1 to v3 get no arguments with it. */
static void profiler_step_state(void* ctx, void* step, braid_proxy_step_state_t state,
                                size_t bytes) {
  (void)ctx;
  static const int nccl_state[] = {[BRAID_PROXY_STEP_SEND_WAIT] = PROF_STATE_STEP_SEND_WAIT,
                                   [BRAID_PROXY_STEP_RECV_FLUSH] = PROF_STATE_STEP_RECV_FLUSH_WAIT,
                                   [BRAID_PROXY_STEP_RECV_GPU] = PROF_STATE_STEP_RECV_GPU_WAIT};
  if (step == NULL) return;
  if (lib.version >= 4) {
    prof_state_args_v5_t args;
    memset(&args, 0, sizeof args);
    args.proxyStep.transSize = bytes;
    (void)((const prof_v5_t*)lib.sym)->recordEventState(step, nccl_state[state], &args);
  } else {
    prof_state_args_v1_t args;
    memset(&args, 0, sizeof args);
    (void)((const prof_v1_t*)lib.sym)->recordEventState(step, nccl_state[state], &args);
  }
}

/* ---- finding the library ---- */

/* Fills lib from an opened library; 0 (and a message) when it exports no version Braid reads. */
static int profiler_lib_resolve(void* handle, const char* opened, int quiet) {
  for (int v = 5; v >= 1; v--) {
    char symbol[32];
    snprintf(symbol, sizeof symbol, "ncclProfiler_v%d", v);
    const void* sym = dlsym(handle, symbol);
    if (sym == NULL) continue;
    char path[PATH_MAX];
    braid_plugin_path(handle, opened, path, sizeof path);
    lib.handle = handle;
    lib.version = v;
    lib.sym = sym;
    lib.name = ((const prof_v1_t*)sym)->name ? ((const prof_v1_t*)sym)->name : "unnamed";
    snprintf(lib.label, sizeof lib.label, "'%s' (v%d) from %s", lib.name, v, path);
    return 1;
  }
  char others[128] = "";
  size_t len = 0;
  for (int v = 6; v <= 9; v++) {
    char symbol[32];
    snprintf(symbol, sizeof symbol, "ncclProfiler_v%d", v);
    if (dlsym(handle, symbol) && len < sizeof others)
      len += (size_t)snprintf(others + len, sizeof others - len, "%s %s", len ? "," : "; it has",
                              symbol);
  }
  if (quiet)
    INFO(BRAID_LOG_INIT, "PROFILER/Plugin: %s has no ncclProfiler_v5 to _v1%s: no profiler",
         opened, others);
  else
    WARN("%s: %s has no ncclProfiler_v5 to _v1 (the versions NCCL 2.28 reads)%s: not loaded; "
         "no profiler",
         braid_param_var(BRAID_P_PROFILER_PLUGIN), opened, others);
  return 0;
}

/* Loads the process's profiler unless it is loaded already; 1 when there is one. Under lib_lock. */
static int profiler_lib_load(const char* net_lib) {
  if (lib.users > 0) return 1;
  const struct braid_plugin_search search = {
      .kind = "profiler", .label = "PROFILER", .param = BRAID_P_PROFILER_PLUGIN,
      .log_subsys = BRAID_LOG_INIT, .without = "no profiler", .net_lib = net_lib,
      .not_found = lib_not_found, .not_found_size = sizeof lib_not_found};
  char opened[PATH_MAX];
  int from_net = 0, quiet = 0;
  void* handle = braid_plugin_find(&search, opened, sizeof opened, &from_net, &quiet);
  if (handle == NULL) return 0;
  if (!profiler_lib_resolve(handle, opened, quiet)) {
    dlclose(handle);
    return 0;
  }
  lib_not_found[0] = '\0';
  /* The mask the first init starts from; later ones get what the plugin left in it. */
  __atomic_store_n(&profiler_event_mask, (int)braid_param_int(BRAID_P_PROFILE_EVENT_MASK),
                   __ATOMIC_RELAXED);
  INFO(BRAID_LOG_INIT, "PROFILER/Plugin: loaded profiler %s%s", lib.label,
       from_net ? ", the net plugin's library" : "");
  return 1;
}

static void profiler_lib_release(void) {
  pthread_mutex_lock(&lib_lock);
  if (--lib.users == 0) {
    INFO(BRAID_LOG_INIT, "PROFILER/Plugin: closing profiler %s", lib.label);
    dlclose(lib.handle);
    memset(&lib, 0, sizeof lib);
  }
  pthread_mutex_unlock(&lib_lock);
}

/* ---- instances ---- */

struct braid_profiler* profiler_open(const struct braid_profiler_args* a) {
  pthread_mutex_lock(&lib_lock);
  int loaded = profiler_lib_load(a->net_lib);
  if (loaded) lib.users++;
  pthread_mutex_unlock(&lib_lock);
  if (!loaded) return NULL;
  struct braid_profiler* p = calloc(1, sizeof *p);
  if (p == NULL) {
    WARN("rank %d: out of host memory for a profiler instance; no profiler", a->rank);
    profiler_lib_release();
    return NULL;
  }
  p->rank = a->rank;
  p->comm_hash = a->comm_hash;
  snprintf(p->comm_name, sizeof p->comm_name, "%s", a->comm_name ? a->comm_name : "");
  ncclResult_t res = profiler_init_call(a, &p->ctx);
  if (res != ncclSuccess) {
    /* As NCCL: the communicator goes on without a profiler. */
    WARN("profiler %s: init for rank %d of %d returned %s; this communicator has no profiler",
         lib.label, a->rank, a->nranks, profiler_result(res));
    free(p);
    profiler_lib_release();
    return NULL;
  }
  INFO(BRAID_LOG_INIT, "PROFILER/Plugin: rank %d profiles with %s, event mask 0x%x", a->rank,
       lib.label, (unsigned)__atomic_load_n(&profiler_event_mask, __ATOMIC_RELAXED));
  return p;
}

void profiler_close(struct braid_profiler* p) {
  if (p == NULL) return;
  ncclResult_t res = ((const prof_v5_t*)lib.sym)->finalize(p->ctx);
  if (res != ncclSuccess)
    WARN("profiler %s: finalize for rank %d returned %s", lib.label, p->rank,
         profiler_result(res));
  free(p);
  profiler_lib_release();
}

int profiler_wants(const struct braid_profiler* p, int types) {
  return p != NULL && (__atomic_load_n(&profiler_event_mask, __ATOMIC_RELAXED) & types) != 0;
}

const char* profiler_loaded(void) {
  pthread_mutex_lock(&lib_lock);
  const char* label = lib.users > 0 ? lib.label : NULL;
  pthread_mutex_unlock(&lib_lock);
  return label;
}

/* ---- events ---- */

void* profiler_group_start(struct braid_profiler* p) {
  if (!profiler_wants(p, PROF_EV_GROUP)) return NULL;
  prof_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = PROF_EV_GROUP;
  d.rank = p->rank;
  return profiler_start(p, &d, NULL);
}

void* profiler_task_start(struct braid_profiler* p, void* group,
                          const struct braid_profiler_task* t) {
  const int p2p = t->coll == BRAID_COLL_SENDRECV;
  if (!profiler_wants(p, p2p ? PROF_EV_P2P : PROF_EV_COLL)) return NULL;
  prof_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = p2p ? PROF_EV_P2P : PROF_EV_COLL;
  d.parentObj = group;
  d.rank = p->rank;
  if (p2p) {
    d.p2p.func = profiler_func_name(t);
    d.p2p.buff = t->is_send ? (void*)t->sendbuff : t->recvbuff;
    d.p2p.datatype = profiler_type_name(t->dtype);
    d.p2p.count = t->count;
    d.p2p.peer = t->peer;
    d.p2p.nChannels = (uint8_t)t->nchannels;
    d.p2p.parentGroup = group;
  } else {
    d.coll.seqNumber = t->coll >= 0 && t->coll < BRAID_COLL_COUNT ? p->seq[t->coll]++ : 0;
    d.coll.func = profiler_func_name(t);
    d.coll.sendBuff = t->sendbuff;
    d.coll.recvBuff = t->recvbuff;
    d.coll.count = t->count;
    d.coll.root = t->root;
    d.coll.datatype = profiler_type_name(t->dtype);
    d.coll.nChannels = (uint8_t)t->nchannels;
    d.coll.nWarps = (uint8_t)t->nwarps;
    d.coll.algo = profiler_algo_name(t->algo);
    d.coll.proto = profiler_proto_name(t->proto);
    d.coll.parentGroup = group;
  }
  return profiler_start(p, &d, t);
}

void profiler_event_stop(struct braid_profiler* p, void* handle) {
  (void)p;
  if (handle) (void)((const prof_v5_t*)lib.sym)->stopEvent(handle);
}

/* ---- the network proxy's sink ---- */

static void* profiler_proxy_op_start(void* ctx, int is_send, int peer, int channel, int nsteps,
                                     int chunk_bytes) {
  struct braid_profiler* p = ctx;
  if (!profiler_wants(p, PROF_EV_PROXY_OP)) return NULL;
  prof_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = PROF_EV_PROXY_OP;
  d.rank = p->rank;
  d.proxyOp.pid = getpid();
  d.proxyOp.channelId = (uint8_t)channel;
  d.proxyOp.peer = peer;
  d.proxyOp.nSteps = nsteps;
  d.proxyOp.chunkSize = chunk_bytes;
  d.proxyOp.isSend = is_send;
  return profiler_start(p, &d, NULL);
}

static void* profiler_proxy_step_start(void* ctx, void* op, int step) {
  struct braid_profiler* p = ctx;
  if (op == NULL || !profiler_wants(p, PROF_EV_PROXY_STEP)) return NULL;
  prof_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = PROF_EV_PROXY_STEP;
  d.parentObj = op;
  d.rank = p->rank;
  d.proxyStep.step = step;
  return profiler_start(p, &d, NULL);
}

static void profiler_proxy_stop(void* ctx, void* handle) { profiler_event_stop(ctx, handle); }

const struct braid_proxy_events profiler_proxy_events = {
    .op_start = profiler_proxy_op_start,
    .op_stop = profiler_proxy_stop,
    .step_start = profiler_proxy_step_start,
    .step_state = profiler_step_state,
    .step_stop = profiler_proxy_stop,
};
