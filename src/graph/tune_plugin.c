/*
 * NCCL tuner plugins (NCCL_TUNER_PLUGIN): finding the library, reading
 * whichever interface version it exports (ncclTunerPlugin_v5 down to _v2, as
 * NCCL 2.28 does), and calling each version in one shape for the tuning model.
 *
 * The library belongs to the process: loaded when the first topology opens a
 * tuner, closed when the last one closes it, and not looked for again while
 * the setting that found nothing stays the same. Each topology (each
 * communicator) gets an instance of its own: the plugin's init, context and
 * finalize. tune.c hands tune_plugin_cost its predicted times; this file
 * lays them out as NCCL's cost table and reads the plugin's edits back.
 */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/plugin_lib.h"
#include "base/utils.h"
#include "graph/topo.h"
#include "graph/tune_plugin.h"
#include "graph/tune_plugin_abi.h"

/* What a plugin's init is given. */
struct tune_plugin_init_args {
  uint64_t comm_id;
  size_t nranks, nnodes;
  tuner_nvl_domain_info_v5_t nvl_domains;
  tuner_constants_v5_t constants;
};

/* One interface version: its symbol, and its calls in v5's shape. */
struct tune_plugin_ops {
  int version;
  const char* symbol;
  /* Starts an instance; *ctx receives the plugin's context. */
  ncclResult_t (*init)(const void* sym, struct tune_plugin_init_args* args, void** ctx);
  /* Lets the plugin edit `table` (NCCL's layout); *nchannels as it set it (0: not asked). */
  ncclResult_t (*cost)(const void* sym, void* ctx, int coll, size_t bytes,
                       float (*table)[TUNER_NUM_PROTOS], int* nchannels);
  /* Ends the instance; the context is the plugin's to free. */
  ncclResult_t (*fini)(const void* sym, void* ctx);
};

/* The process's tuner library, while any topology uses it. */
struct tune_plugin_lib {
  void* handle;
  const struct tune_plugin_ops* ops;
  const void* sym; /* the exported ncclTunerPlugin_vN struct */
  const char* name;
  char path[PATH_MAX];
  int users;
};

/*
 * The flags say that a message was logged for this instance; they are set
 * atomically, so that tuning calls from two threads on one topology still
 * log it once.
 */
struct tune_plugin {
  const struct tune_plugin_lib* lib;
  void* ctx;
  int cost_failed;        /* a failed getCollInfo was reported */
  unsigned picks_ignored; /* bit a * TUNER_NUM_PROTOS + p: that pick was reported ignored */
  char label[128];
};

static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tune_plugin_lib lib;
/* What the last search that found nothing looked for ("<setting>\n<net library>"). */
static char lib_not_found[2 * PATH_MAX + 2];

/* A plugin's result by its name in nccl.h: its errors are not Braid's to explain. */
static const char* tune_plugin_result(ncclResult_t res) {
  static const char* names[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                "ncclRemoteError",   "ncclInProgress"};
  return (int)res >= 0 && (int)res < (int)(sizeof names / sizeof names[0]) ? names[res]
                                                                           : "an unknown result";
}

/* ---- the plugin's logger: NCCL's levels and subsystems to Braid's ---- */

static void tune_plugin_log(int level, unsigned long flags, const char* file, int line,
                            const char* fmt, ...) {
  braid_log_level_t lv = level == 2 || level == 4 ? BRAID_LOG_WARN
                         : level == 3             ? BRAID_LOG_INFO
                         : level == 5             ? BRAID_LOG_TRACE
                                                  : BRAID_LOG_VERSION;
  uint32_t subsys = (uint32_t)(flags & TUNER_LOG_SAME_BITS);
  if (flags & TUNER_LOG_BOOTSTRAP) subsys |= BRAID_LOG_BOOTSTRAP;
  if (flags & TUNER_LOG_REG) subsys |= BRAID_LOG_REG;
  if (subsys == 0) subsys = BRAID_LOG_TUNING;
  if (level <= 0 || !braid_log_enabled(lv, subsys)) return;
  /* The line names one subsystem: TUNING when among them, else the first. */
  uint32_t named = (subsys & BRAID_LOG_TUNING) ? BRAID_LOG_TUNING : subsys & (~subsys + 1u);
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  braid_log_emit(lv, named, file ? file : "tuner", line, "%s", text);
}

/* ---- the four versions ---- */

static ncclResult_t tune_v5_init(const void* sym, struct tune_plugin_init_args* a, void** ctx) {
  const tuner_v5_t* t = sym;
  return t->init(ctx, a->comm_id, a->nranks, a->nnodes, tune_plugin_log, &a->nvl_domains,
                 &a->constants);
}
static ncclResult_t tune_v5_cost(const void* sym, void* ctx, int coll, size_t bytes,
                                 float (*table)[TUNER_NUM_PROTOS], int* nch) {
  const tuner_v5_t* t = sym;
  return t->get_coll_info(ctx, coll, bytes, 1, (float**)table, TUNER_NUM_ALGOS, TUNER_NUM_PROTOS, 0,
                          nch);
}
static ncclResult_t tune_v5_fini(const void* sym, void* ctx) {
  return ((const tuner_v5_t*)sym)->finalize(ctx);
}

/* v2 to v4 share init and destroy (the first three members lie alike). */
static ncclResult_t tune_v4_init(const void* sym, struct tune_plugin_init_args* a, void** ctx) {
  return ((const tuner_v4_t*)sym)->init(a->nranks, a->nnodes, tune_plugin_log, ctx);
}
static ncclResult_t tune_v4_cost(const void* sym, void* ctx, int coll, size_t bytes,
                                 float (*table)[TUNER_NUM_PROTOS], int* nch) {
  const tuner_v4_t* t = sym;
  return t->get_coll_info(ctx, coll, bytes, 1, (float**)table, TUNER_NUM_ALGOS, TUNER_NUM_PROTOS, 0,
                          nch);
}
static ncclResult_t tune_v4_fini(const void* sym, void* ctx) {
  return ((const tuner_v4_t*)sym)->destroy(ctx);
}

static ncclResult_t tune_v3_cost(const void* sym, void* ctx, int coll, size_t bytes,
                                 float (*table)[TUNER_NUM_PROTOS], int* nch) {
  const tuner_v3_t* t = sym;
  return t->get_coll_info(ctx, coll, bytes, 1, (float**)table, TUNER_NUM_ALGOS, TUNER_NUM_PROTOS,
                          nch);
}

/*
 * v2 names an algorithm and protocol (NCCL's numbers) instead of editing the
 * table; that entry's cost becomes 0, so that it wins as with NCCL. NCCL
 * leaves an entry that was not a candidate alone; here it becomes 0 too, so
 * that tune_plugin_cost sees the pick, reports it and leaves it out all the
 * same. Braid has neither CollNet nor NVLS to offer (both supports 0).
 */
static ncclResult_t tune_v2_cost(const void* sym, void* ctx, int coll, size_t bytes,
                                 float (*table)[TUNER_NUM_PROTOS], int* nch) {
  const tuner_v2_t* t = sym;
  int algo = -1, proto = -1;
  ncclResult_t res = t->get_coll_info(ctx, coll, bytes, 0, 0, 1, &algo, &proto, nch);
  if (res == ncclSuccess && algo >= 0 && algo < TUNER_NUM_ALGOS && proto >= 0 &&
      proto < TUNER_NUM_PROTOS)
    table[algo][proto] = 0.0f;
  return res;
}

/* Newest first: a library exporting several is read at its newest. */
static const struct tune_plugin_ops tune_plugin_versions[] = {
    {.version = 5,
     .symbol = "ncclTunerPlugin_v5",
     .init = tune_v5_init,
     .cost = tune_v5_cost,
     .fini = tune_v5_fini},
    {.version = 4,
     .symbol = "ncclTunerPlugin_v4",
     .init = tune_v4_init,
     .cost = tune_v4_cost,
     .fini = tune_v4_fini},
    {.version = 3,
     .symbol = "ncclTunerPlugin_v3",
     .init = tune_v4_init,
     .cost = tune_v3_cost,
     .fini = tune_v4_fini},
    {.version = 2,
     .symbol = "ncclTunerPlugin_v2",
     .init = tune_v4_init,
     .cost = tune_v2_cost,
     .fini = tune_v4_fini},
};
#define TUNE_PLUGIN_NVERSIONS (int)(sizeof tune_plugin_versions / sizeof tune_plugin_versions[0])

/* ---- finding the library ---- */

/* Fills lib from an opened library; 0 (and a message) when it exports no version Braid reads. */
static int tune_plugin_lib_resolve(void* handle, const char* opened, int quiet) {
  for (int i = 0; i < TUNE_PLUGIN_NVERSIONS; i++) {
    const void* sym = dlsym(handle, tune_plugin_versions[i].symbol);
    if (sym == NULL) continue;
    lib.handle = handle;
    lib.ops = &tune_plugin_versions[i];
    lib.sym = sym;
    lib.name = ((const tuner_v4_t*)sym)->name ? ((const tuner_v4_t*)sym)->name : "unnamed";
    braid_plugin_path(handle, opened, lib.path, sizeof lib.path);
    return 1;
  }
  char others[128] = "";
  size_t len = 0;
  for (int v = 1; v <= 9; v++) {
    char symbol[32];
    snprintf(symbol, sizeof symbol, "ncclTunerPlugin_v%d", v);
    if ((v < 2 || v > 5) && dlsym(handle, symbol) && len < sizeof others)
      len += (size_t)snprintf(others + len, sizeof others - len, "%s %s", len ? "," : "; it has",
                              symbol);
  }
  if (quiet)
    INFO(BRAID_LOG_INIT, "TUNER/Plugin: %s has no ncclTunerPlugin_v5 to _v2%s: no tuner", opened,
         others);
  else
    WARN(
        "%s: %s has no ncclTunerPlugin_v5 to _v2 (the versions NCCL 2.28 reads)%s: not loaded; "
        "the tuning model decides",
        braid_param_var(BRAID_P_TUNER_PLUGIN), opened, others);
  return 0;
}

/*
 * Loads the process's tuner unless it is loaded already; 1 when there is
 * one. Called with lib_lock held.
 */
static int tune_plugin_lib_load(const char* net_lib) {
  if (lib.users > 0) return 1;
  const struct braid_plugin_search search = {
      .kind = "tuner", .label = "TUNER", .param = BRAID_P_TUNER_PLUGIN,
      .log_subsys = BRAID_LOG_TUNING, .without = "the tuning model decides", .net_lib = net_lib,
      .not_found = lib_not_found, .not_found_size = sizeof lib_not_found};
  char opened[PATH_MAX];
  int from_net = 0, quiet = 0;
  void* handle = braid_plugin_find(&search, opened, sizeof opened, &from_net, &quiet);
  if (handle == NULL) return 0;
  if (!tune_plugin_lib_resolve(handle, opened, quiet)) {
    dlclose(handle);
    return 0;
  }
  lib_not_found[0] = '\0';
  INFO(BRAID_LOG_INIT, "TUNER/Plugin: loaded tuner '%s' (%s) from %s%s", lib.name, lib.ops->symbol,
       lib.path, from_net ? ", the net plugin's library" : "");
  return 1;
}

static void tune_plugin_lib_release(void) {
  pthread_mutex_lock(&lib_lock);
  if (--lib.users == 0) {
    INFO(BRAID_LOG_INIT, "TUNER/Plugin: closing tuner '%s'", lib.name);
    dlclose(lib.handle);
    memset(&lib, 0, sizeof lib);
  }
  pthread_mutex_unlock(&lib_lock);
}

/* ---- instances ---- */

/*
 * What init is given: the rank and host counts, the comm id, hosts as the
 * NVLink domains (Braid joins no hosts by NVLink), and NCCL's constants
 * where Braid's model has a counterpart (per-call and per-hop latencies of
 * Ring and Tree), 0 elsewhere.
 */
static void tune_plugin_init_args_fill(const struct braid_topo* topo, uint64_t comm_id,
                                       struct tune_plugin_init_args* a) {
  static const int algos[][2] = {{BRAID_ALGO_RING, TUNER_ALGO_RING},
                                 {BRAID_ALGO_TREE, TUNER_ALGO_TREE}};
  static const int protos[][2] = {{BRAID_PROTO_SIMPLE, TUNER_PROTO_SIMPLE},
                                  {BRAID_PROTO_LL, TUNER_PROTO_LL},
                                  {BRAID_PROTO_LL128, TUNER_PROTO_LL128}};
  memset(a, 0, sizeof *a);
  a->comm_id = comm_id;
  a->nranks = (size_t)topo->nranks;
  a->nnodes = (size_t)topo->nhosts;
  a->nvl_domains.n_nvl_domains = topo->nhosts;
  a->nvl_domains.min_ranks_per_nvl_domain = topo->nranks;
  for (int h = 0; h < topo->nhosts; h++) {
    a->nvl_domains.min_ranks_per_nvl_domain =
        BRAID_MIN(a->nvl_domains.min_ranks_per_nvl_domain, topo->hosts[h].nranks);
    a->nvl_domains.max_ranks_per_nvl_domain =
        BRAID_MAX(a->nvl_domains.max_ranks_per_nvl_domain, topo->hosts[h].nranks);
  }
  /* Braid's link classes (NVLink, PCI, network) are NCCL's hardware links, in its order. */
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) {
      a->constants.base_latencies[algos[i][1]][protos[j][1]] =
          tune_table.base_lat[algos[i][0]][protos[j][0]];
      for (int l = 0; l < TUNER_NUM_HW_LINKS; l++)
        a->constants.hw_latencies[l][algos[i][1]][protos[j][1]] =
            tune_table.hop_lat[l][protos[j][0]];
    }
}

/* Whether BRAID_ALGO / BRAID_PROTO narrow any collective. */
static int tune_plugin_overridden(const struct tune_model* m) {
  for (int c = 0; c < BRAID_COLL_COUNT; c++)
    if (m->algo_override[c] != ~0u || m->proto_override[c] != ~0u) return 1;
  return 0;
}

ncclResult_t tune_plugin_open(struct braid_topo* topo, const struct tune_plugin_args* args) {
  ncclResult_t res = ncclSuccess;
  struct tune_plugin* tp = NULL;
  if (topo == NULL || topo->tune.plugin != NULL)
    return braid_err(ncclInternalError, "tune_plugin_open: no topology, or its tuner is open");
  pthread_mutex_lock(&lib_lock);
  int loaded = tune_plugin_lib_load(args ? args->net_lib : NULL);
  if (loaded) lib.users++;
  pthread_mutex_unlock(&lib_lock);
  if (!loaded) return ncclSuccess;
  BRAID_TRY(BRAID_CALLOC(&tp, 1, "tuner plugin instance"));
  tp->lib = &lib;
  snprintf(tp->label, sizeof tp->label, "'%s' (v%d)", lib.name, lib.ops->version);
  struct tune_plugin_init_args a;
  tune_plugin_init_args_fill(topo, args ? args->comm_id : 0, &a);
  tuner_constants_v5_t given = a.constants;
  ncclResult_t init = lib.ops->init(lib.sym, &a, &tp->ctx);
  /*
   * As NCCL, a failing init fails the communicator: were this rank to go on
   * with the model's choices while its peers follow the tuner, their
   * algorithms would not match.
   */
  BRAID_CHECK(init == ncclSuccess, ncclInternalError,
              "tuner plugin %s from %s: init for %d ranks on %d host%s returned %s", tp->label,
              lib.path, topo->nranks, topo->nhosts, topo->nhosts == 1 ? "" : "s",
              tune_plugin_result(init));
  if (memcmp(&given, &a.constants, sizeof given) != 0)
    INFO(BRAID_LOG_TUNING,
         "tuner %s changed the tuning constants init gave it; Braid's model does not read them "
         "back (the cost tables it edits count)",
         tp->label);
  if (tune_plugin_overridden(&topo->tune))
    INFO(BRAID_LOG_TUNING,
         "BRAID_ALGO/BRAID_PROTO set: they win over tuner %s, which chooses only among what "
         "they allow",
         tp->label);
  topo->tune.plugin = tp;
  return ncclSuccess;
fail: /* the instance was not started: nothing of the plugin's to finalize */
  free(tp);
  tune_plugin_lib_release();
  return res;
}

void tune_plugin_close(struct braid_topo* topo) {
  if (topo == NULL || topo->tune.plugin == NULL) return;
  struct tune_plugin* tp = topo->tune.plugin;
  topo->tune.plugin = NULL;
  ncclResult_t res = tp->lib->ops->fini(tp->lib->sym, tp->ctx);
  if (res != ncclSuccess)
    WARN("tuner plugin %s: finalize returned %s", tp->label, tune_plugin_result(res));
  free(tp);
  tune_plugin_lib_release();
}

const char* tune_plugin_label(const struct tune_plugin* tp) { return tp ? tp->label : "none"; }

/* ---- the cost table ---- */

/* Braid's collectives are numbered as NCCL's ncclFunc_t: the plugin gets them as they are. */
_Static_assert((int)BRAID_COLL_BROADCAST == (int)TUNER_FUNC_BROADCAST &&
                   (int)BRAID_COLL_REDUCE == (int)TUNER_FUNC_REDUCE &&
                   (int)BRAID_COLL_ALLGATHER == (int)TUNER_FUNC_ALLGATHER &&
                   (int)BRAID_COLL_REDUCESCATTER == (int)TUNER_FUNC_REDUCESCATTER &&
                   (int)BRAID_COLL_ALLREDUCE == (int)TUNER_FUNC_ALLREDUCE,
               "braid_coll_t and ncclFunc_t number the collectives alike");

/* Braid's algorithm and protocol numbers in NCCL's; -1: NCCL has none (Direct). */
static const int tuner_algo_of[BRAID_ALGO_COUNT] = {[BRAID_ALGO_RING] = TUNER_ALGO_RING,
                                                    [BRAID_ALGO_TREE] = TUNER_ALGO_TREE,
                                                    [BRAID_ALGO_DIRECT] = -1};
static const int tuner_proto_of[BRAID_PROTO_COUNT] = {[BRAID_PROTO_SIMPLE] = TUNER_PROTO_SIMPLE,
                                                      [BRAID_PROTO_LL] = TUNER_PROTO_LL,
                                                      [BRAID_PROTO_LL128] = TUNER_PROTO_LL128};
static const char* const tuner_algo_names[TUNER_NUM_ALGOS] = {
    "Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"};
static const char* const tuner_proto_names[TUNER_NUM_PROTOS] = {"LL", "LL128", "Simple"};

/*
 * The entry NCCL would run after the plugin: the least cost of 0 or more.
 * When that is one Braid did not offer (an algorithm Braid lacks, or one the
 * caller, the topology or BRAID_ALGO / BRAID_PROTO leave out), one INFO per
 * instance and entry says so; the caller then takes the least entry it can
 * run.
 */
_Static_assert(TUNER_NUM_ALGOS* TUNER_NUM_PROTOS <= 32, "one bit per entry in picks_ignored");
static void tune_plugin_check_pick(struct tune_plugin* tp, braid_coll_t coll, size_t bytes,
                                   float (*table)[TUNER_NUM_PROTOS],
                                   float (*given)[TUNER_NUM_PROTOS]) {
  int pa = -1, pp = -1;
  float least = INFINITY;
  for (int a = 0; a < TUNER_NUM_ALGOS; a++)
    for (int p = 0; p < TUNER_NUM_PROTOS; p++)
      if (table[a][p] >= 0.0f && table[a][p] < least) least = table[a][p], pa = a, pp = p;
  if (pa < 0 || given[pa][pp] != TUNER_COST_IGNORE) return;
  const unsigned bit = 1u << (pa * TUNER_NUM_PROTOS + pp);
  if (__atomic_fetch_or(&tp->picks_ignored, bit, __ATOMIC_RELAXED) & bit) return;
  int braid_has = pa == TUNER_ALGO_RING || pa == TUNER_ALGO_TREE;
  INFO(BRAID_LOG_TUNING,
       "tuner %s picked %s/%s for %s of %zu B: %s; ignored, the least cost Braid can run wins "
       "(said once)",
       tp->label, tuner_algo_names[pa], tuner_proto_names[pp], braid_coll_name(coll), bytes,
       braid_has ? "not a candidate here (the caller, the topology or BRAID_ALGO/BRAID_PROTO "
                   "leave it out)"
                 : "an algorithm Braid does not have");
}

ncclResult_t tune_plugin_cost(struct tune_plugin* tp, braid_coll_t coll, size_t bytes,
                              float cost[BRAID_ALGO_COUNT][BRAID_PROTO_COUNT], int* nchannels,
                              int* changed) {
  float table[TUNER_NUM_ALGOS][TUNER_NUM_PROTOS], given[TUNER_NUM_ALGOS][TUNER_NUM_PROTOS];
  for (int a = 0; a < TUNER_NUM_ALGOS; a++)
    for (int p = 0; p < TUNER_NUM_PROTOS; p++) table[a][p] = TUNER_COST_IGNORE;
  for (int a = 0; a < BRAID_ALGO_COUNT; a++)
    for (int p = 0; p < BRAID_PROTO_COUNT && tuner_algo_of[a] >= 0; p++)
      table[tuner_algo_of[a]][tuner_proto_of[p]] =
          cost[a][p] >= 0.0f ? cost[a][p] : TUNER_COST_IGNORE;
  memcpy(given, table, sizeof table);
  int nch = 0;
  *changed = 0;
  *nchannels = 0;
  ncclResult_t res = tp->lib->ops->cost(tp->lib->sym, tp->ctx, (int)coll, bytes, table, &nch);
  if (res != ncclSuccess) {
    if (!__atomic_exchange_n(&tp->cost_failed, 1, __ATOMIC_RELAXED))
      WARN(
          "tuner plugin %s: getCollInfo returned %s for %s of %zu B; the tuning model decides "
          "(said once)",
          tp->label, tune_plugin_result(res), braid_coll_name(coll), bytes);
    return res;
  }
  tune_plugin_check_pick(tp, coll, bytes, table, given);
  /* Only entries that were candidates come back; the plugin cannot add one. */
  for (int a = 0; a < BRAID_ALGO_COUNT; a++)
    for (int p = 0; p < BRAID_PROTO_COUNT; p++) {
      const int ta = tuner_algo_of[a], tq = tuner_proto_of[p];
      if (ta < 0 || given[ta][tq] == TUNER_COST_IGNORE) {
        cost[a][p] = TUNE_PLUGIN_IGNORE;
        continue;
      }
      if (memcmp(&table[ta][tq], &given[ta][tq], sizeof(float)) != 0) *changed = 1;
      cost[a][p] = table[ta][tq];
    }
  *nchannels = nch;
  return ncclSuccess;
}
