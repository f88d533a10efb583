/*
 * The ranks of the GPU suite, and the bookkeeping of its cases.
 *
 * threads: one process drives every GPU. ncclCommInitAll creates the
 * communicators; each call is issued for every rank inside one
 * ncclGroupStart/End.
 *
 * procs: one process per GPU, forked by mp_run (tests/mp) with a time limit.
 * Child 0 (or, for an id of world_id_from, the child of the rank it names)
 * calls ncclGetUniqueId and publishes the ids through memory mapped before the
 * fork; the others wait for them. The parent never touches CUDA: a
 * CUDA context does not survive fork(), and the parent must stay able to fork.
 *
 * hosts: procs where every child sets BRAID_HOSTID and NCCL_HOSTID to a name
 * of its own before its first call, so the library takes each rank for a
 * separate host and connects them through the network transport (kernels ->
 * proxy -> socket -> proxy -> kernels). The ranks share the visible GPUs
 * (rank % count), so one GPU is enough; with GPU_COLL_GPU_PER_RANK=1 every
 * rank needs a GPU of its own (the run skips with 77 when fewer are visible),
 * as on hosts of one GPU each.
 *
 * sharegpu: procs on the visible GPUs (rank % count) where child i sets
 * BRAID_TOPO_BUSID to the i-th bus id of GPU_COLL_BUSIDS, so with a
 * BRAID_TOPO_FILE of a multi-GPU node the ranks take themselves for that
 * node's GPUs and connect through P2P and SHM: the intra-node path, run on
 * one GPU. Braid only (NCCL has no such override).
 *
 * isolated: procs where child i, before its first CUDA call, sets
 * CUDA_VISIBLE_DEVICES to its own GPU alone (the i-th entry of the parent's
 * CUDA_VISIBLE_DEVICES, or i when that is unset) and drives device 0, as
 * under a scheduler that hands each process one GPU (SLURM's
 * --gpus-per-task=1, a Kubernetes pod): no process can name another's GPU.
 * mixed: the even ranks isolated so, the odd ones seeing every GPU of the
 * parent and driving GPU i, as in procs.
 *
 * In every mode of one process per rank, the children agree on whether the
 * run can go ahead before any of them starts its init: a child without its
 * GPU makes every child skip (77), where the others would wait for it until
 * the time limit (isolated and mixed children see different GPUs). In
 * isolated and mixed mode they also check that no two ranks got one GPU.
 *
 * In procs, hosts, sharegpu, isolated and mixed, GPU_COLL_RANK_ENV="I:NAME=VALUE"
 * sets NAME in child I only, before its first call (a setting that differs
 * between ranks).
 *
 * Every process runs the same sequence of cases (same options, same filter),
 * so the ordinal of a case is the same everywhere; a failure seen by any
 * process marks that ordinal in the tally, which the procs parent shares with
 * its children. A watchdog (SIGALRM) names the case that hangs.
 *
 * The verdict (world_verdict): a failure fails the run; so does a run in
 * which no case ran nor skipped (a --filter that matches nothing), unless
 * --no-cases declared that the init is the test; a run whose every case
 * skipped exits 77, as one without enough GPUs does.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_test.h"
#include "mp_runner.h"

#define GPU_MAX_CASES (1 << 17)
#define GPU_ID_WAIT_S 120.0 /* how long a procs child waits for child 0's unique ids */

struct gpu_tally {
  int ncases;   /* cases begun (or listed), as counted by the process of rank 0 */
  int nskipped; /* cases skipped before they began (world_case_skip), counted by the same */
  int overflow; /* failures past GPU_MAX_CASES (counted, not deduplicated) */
  unsigned char failed[GPU_MAX_CASES];  /* by ordinal: some process saw the case fail */
  unsigned char skipped[GPU_MAX_CASES]; /* by ordinal: some process ended it skipped */
};

/* procs mode: what the children share, mapped by the parent before the fork. */
struct gpu_shared {
  /*
   * The child that makes id slot s (child 0, or the one world_id_from names)
   * raises ids_ready[s] once ids[s] holds it: 0 the first
   * communicator's, then the others' (world_id), each made when first
   * needed: a root nobody joins gives up after BRAID_BOOTSTRAP_TIMEOUT.
   */
  int ids_ready[GPU_ID_SLOTS];
  ncclUniqueId ids[GPU_ID_SLOTS];
  double stamps[4]; /* world_stamp */
  /* world_gpus_agree: each child's GPU check (WORLD_GPU_*), then the bus id of its GPU */
  int gpu_check[GPU_MAX_RANKS];
  char busid[GPU_MAX_RANKS][32];
  struct gpu_tally tally;
};

/* A child's GPU check, as world_gpus_agree publishes it (0: not yet). */
enum { WORLD_GPU_OK = 1, WORLD_GPU_SKIP = 2, WORLD_GPU_FAILED = 3 };

struct world_procs_arg {
  const struct gpu_opts* opts;
  void (*suites)(struct gpu_world* w);
  struct gpu_shared* shared;
};

/* ---- the watchdog ---------------------------------------------------------------------------- */

static char watchdog_case[256];

static void watchdog_write(const char* s) {
  ssize_t rc = write(STDERR_FILENO, s, strlen(s));
  (void)rc;
}

static void watchdog_fire(int sig) {
  (void)sig;
  watchdog_write("FAIL gpu_coll: the case '");
  watchdog_write(watchdog_case);
  watchdog_write("' did not finish within --case-timeout (hung?); giving up\n");
  _exit(1);
}

static void watchdog_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = watchdog_fire;
  sigaction(SIGALRM, &sa, NULL);
}

/* ---- cases ----------------------------------------------------------------------------------- */

int world_case_begin(struct gpu_world* w, const char* name) {
  if (w->opts->filter && !strstr(name, w->opts->filter)) return 0;
  if (w->opts->list) {
    if (w->rank0 == 0) printf("%s\n", name);
    w->tally->ncases = ++w->ordinal;
    return 0;
  }
  snprintf(w->case_name, sizeof w->case_name, "%s", name);
  snprintf(watchdog_case, sizeof watchdog_case, "%s", name);
  w->case_failed = 0;
  if (w->opts->verbose) fprintf(stderr, "RUN  %s\n", name);
  alarm(w->opts->case_timeout_s);
  return 1;
}

void world_case_skip(struct gpu_world* w, const char* name, const char* why) {
  if (w->opts->list || (w->opts->filter && !strstr(name, w->opts->filter))) return;
  if (w->rank0 != 0) return; /* one line and one count for the run, from rank 0's process */
  fprintf(stderr, "SKIP %s: %s\n", name, why);
  w->tally->nskipped++;
}

int world_case_fits(struct gpu_world* w, const char* name, int fits, const char* why) {
  if (!fits) world_case_skip(w, name, why);
  return fits;
}

void world_case_end_skipped(struct gpu_world* w, const char* why) {
  if (!w->case_failed) {
    if (w->nlocal < w->nranks)
      fprintf(stderr, "SKIP %s [process of rank %d]: %s\n", w->case_name, w->rank0, why);
    else
      fprintf(stderr, "SKIP %s: %s\n", w->case_name, why);
    if (w->ordinal < GPU_MAX_CASES) w->tally->skipped[w->ordinal] = 1;
  }
  world_case_end(w);
}

void world_case_end(struct gpu_world* w) {
  alarm(0);
  int ordinal = w->ordinal++;
  if (w->rank0 == 0) w->tally->ncases = w->ordinal;
  if (!w->case_failed) return;
  w->failures++;
  w->case_failed = 0;
  if (ordinal < GPU_MAX_CASES)
    w->tally->failed[ordinal] = 1;
  else
    __atomic_add_fetch(&w->tally->overflow, 1, __ATOMIC_RELAXED);
}

void world_case_fail(struct gpu_world* w, const char* fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (w->nlocal < w->nranks)
    fprintf(stderr, "FAIL %s [process of rank %d]: %s\n", w->case_name, w->rank0, msg);
  else
    fprintf(stderr, "FAIL %s: %s\n", w->case_name, msg);
  w->case_failed = 1;
}

int world_cuda(struct gpu_world* w, cudaError_t err, const char* what) {
  if (err == cudaSuccess) return 0;
  world_case_fail(w, "%s: CUDA error %d: %s", what, (int)err, cudaGetErrorString(err));
  return -1;
}

int world_nccl(struct gpu_world* w, ncclResult_t res, ncclComm_t comm, const char* what) {
  if (res == ncclSuccess) return 0;
  const char* last = ncclGetLastError(comm);
  world_case_fail(w, "%s returned %d (%s); ncclGetLastError: %s", what, (int)res,
                  ncclGetErrorString(res), last && *last ? last : "(empty)");
  return -1;
}

int world_group_start(struct gpu_world* w) {
  return world_nccl(w, ncclGroupStart(), NULL, "ncclGroupStart");
}

int world_group_end(struct gpu_world* w) {
  return world_nccl(w, ncclGroupEnd(), NULL, "ncclGroupEnd");
}

int world_sync(struct gpu_world* w) {
  int rc = 0;
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0) return -1;
    rc |= world_cuda(w, cudaStreamSynchronize(w->stream[l]), "cudaStreamSynchronize");
    rc |= world_cuda(w, cudaStreamSynchronize(w->stream2[l]),
                     "cudaStreamSynchronize (second stream)");
    ncclComm_t comms[2] = {w->comm[l], w->comm2[l]};
    for (int i = 0; i < 2; i++) {
      ncclResult_t async = ncclSuccess;
      if (comms[i] == NULL) continue;
      rc |=
          world_nccl(w, ncclCommGetAsyncError(comms[i], &async), comms[i], "ncclCommGetAsyncError");
      rc |= world_nccl(w, async, comms[i], "the communicator's asynchronous error");
    }
  }
  return rc ? -1 : 0;
}

uint64_t world_seed(const struct gpu_world* w, unsigned suite, size_t index, int rank) {
  uint64_t z = w->opts->seed ^ ((uint64_t)suite << 56) ^ ((uint64_t)index << 8) ^ (uint64_t)rank;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* procs: the child of rank `maker` makes an id in ids[slot] and raises *ready; the others wait. */
static int world_id_share(struct gpu_world* w, ncclUniqueId* ids, int slot, int maker, int* ready) {
  if (maker >= w->rank0 && maker < w->rank0 + w->nlocal) {
    if (world_nccl(w, ncclGetUniqueId(&ids[slot]), NULL, "ncclGetUniqueId") != 0) return -1;
    __atomic_store_n(ready, 1, __ATOMIC_RELEASE);
    return 0;
  }
  for (double waited = 0; !__atomic_load_n(ready, __ATOMIC_ACQUIRE); waited += 0.001) {
    if (waited > GPU_ID_WAIT_S) {
      world_case_fail(w, "no unique id from rank %d after %.0f s", maker, waited);
      return -1;
    }
    mp_sleep(0.001);
  }
  return 0;
}

int world_id_from(struct gpu_world* w, int slot, int maker, ncclUniqueId* id) {
  if (w->nlocal == w->nranks) return world_nccl(w, ncclGetUniqueId(id), NULL, "ncclGetUniqueId");
  if (world_id_share(w, w->shared->ids, slot, maker, &w->shared->ids_ready[slot]) != 0) return -1;
  *id = w->shared->ids[slot];
  return 0;
}

int world_id(struct gpu_world* w, int slot, ncclUniqueId* id) { return world_id_from(w, slot, 0, id); }

volatile double* world_stamp(struct gpu_world* w, int i) {
  static double local[4]; /* threads mode: nobody to share with */
  return w->shared ? &w->shared->stamps[i] : &local[i];
}

int world_comm2(struct gpu_world* w) {
  if (w->comm2[0] != NULL) return 0;
  if (w->nlocal == w->nranks)
    return world_nccl(w, ncclCommInitAll(w->comm2, w->nranks, w->dev), NULL,
                      "ncclCommInitAll (second communicator)");
  if (world_id_share(w, w->shared->ids, 1, 0, &w->shared->ids_ready[1]) != 0) return -1;
  if (world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") != 0) return -1;
  return world_nccl(w, ncclCommInitRank(&w->comm2[0], w->nranks, w->ids[1], w->rank0), NULL,
                    "ncclCommInitRank (second communicator)");
}

/* ---- set-up and tear-down ---------------------------------------------------------------------
 */

/* 0 when at least `nranks` GPUs are visible; otherwise says why and returns GPU_SKIP_CODE. */
static int world_check_gpus(int nranks) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    fprintf(stderr, "SKIP: no usable GPU (cudaGetDeviceCount: %s)\n", cudaGetErrorString(err));
    return GPU_SKIP_CODE;
  }
  if (count < nranks) {
    fprintf(stderr, "SKIP: %d GPU(s) visible, %d needed\n", count, nranks);
    return GPU_SKIP_CODE;
  }
  return 0;
}

static int world_streams_create(struct gpu_world* w) {
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0 ||
        world_cuda(w, cudaStreamCreateWithFlags(&w->stream[l], cudaStreamNonBlocking),
                   "cudaStreamCreate") != 0 ||
        world_cuda(w, cudaStreamCreateWithFlags(&w->stream2[l], cudaStreamNonBlocking),
                   "cudaStreamCreate") != 0)
      return -1;
  }
  return 0;
}

static void world_teardown(struct gpu_world* w) {
  snprintf(w->case_name, sizeof w->case_name, "teardown");
  for (int l = 0; l < w->nlocal; l++) {
    if (cudaSetDevice(w->dev[l]) != cudaSuccess) continue;
    if (w->stream[l]) cudaStreamSynchronize(w->stream[l]);
    if (w->stream2[l]) cudaStreamSynchronize(w->stream2[l]);
  }
  for (int l = 0; l < w->nlocal; l++) {
    if (w->comm[l]) world_nccl(w, ncclCommDestroy(w->comm[l]), NULL, "ncclCommDestroy");
    if (w->comm2[l]) world_nccl(w, ncclCommDestroy(w->comm2[l]), NULL, "ncclCommDestroy (second)");
  }
  for (int l = 0; l < w->nlocal; l++) {
    if (cudaSetDevice(w->dev[l]) != cudaSuccess) continue;
    if (w->stream[l]) cudaStreamDestroy(w->stream[l]);
    if (w->stream2[l]) cudaStreamDestroy(w->stream2[l]);
  }
}

static int world_failures(const struct gpu_tally* t) {
  int n = t->overflow;
  for (int i = 0; i < t->ncases && i < GPU_MAX_CASES; i++) n += t->failed[i];
  return n;
}

/* Cases that began and ended skipped (and did not fail). */
static int world_begun_skips(const struct gpu_tally* t) {
  int n = 0;
  for (int i = 0; i < t->ncases && i < GPU_MAX_CASES; i++) n += t->skipped[i] && !t->failed[i];
  return n;
}

/*
 * --init-fails: the init (`what`, which returned `res`) had to fail. Prints the error and
 * returns 0 when it did; 1 when it succeeded, or when the teardown after it failed.
 */
static int world_init_refused(struct gpu_world* w, ncclResult_t res, const char* what) {
  if (res == ncclSuccess) {
    world_case_fail(w, "%s succeeded, but --init-fails expects it to return an error", what);
  } else {
    const char* last = ncclGetLastError(NULL);
    fprintf(stderr, "setup [rank %d]: %s returned %d (%s), as --init-fails expects; "
            "ncclGetLastError: %s\n", w->rank0, what, (int)res, ncclGetErrorString(res),
            last && *last ? last : "(empty)");
  }
  world_teardown(w);
  return w->case_failed ? 1 : 0;
}

static void world_init(struct gpu_world* w, const struct gpu_opts* o, struct gpu_tally* tally) {
  memset(w, 0, sizeof *w);
  w->opts = o;
  w->nranks = o->nranks;
  w->nlocal = o->nranks;
  w->tally = tally;
  for (int r = 0; r < o->nranks; r++) w->dev[r] = r;
  snprintf(w->case_name, sizeof w->case_name, "setup");
}

static int world_threads(const struct gpu_opts* o, void (*suites)(struct gpu_world* w),
                         struct gpu_tally* tally) {
  struct gpu_world w;
  int rc = world_check_gpus(o->nranks);
  if (rc != 0) return rc;
  world_init(&w, o, tally);
  watchdog_install();
  ncclResult_t init = ncclCommInitAll(w.comm, w.nranks, w.dev);
  if (o->init_fails) return world_init_refused(&w, init, "ncclCommInitAll");
  if (world_nccl(&w, init, NULL, "ncclCommInitAll") != 0 || world_streams_create(&w) != 0) {
    world_teardown(&w);
    return 1;
  }
  if (!o->no_cases) suites(&w);
  world_teardown(&w);
  return w.failures || w.case_failed ? 1 : 0;
}

/* sharegpu: BRAID_TOPO_BUSID = the index-th entry of GPU_COLL_BUSIDS; 0 on success. */
static int world_share_busid(int index) {
  const char* list = getenv("GPU_COLL_BUSIDS");
  char busid[64];
  const char* p = list;
  for (int i = 0; p && i < index; i++) {
    p = strchr(p, ',');
    if (p) p++;
  }
  size_t len = p ? strcspn(p, ",") : 0;
  if (len == 0 || len >= sizeof busid ||
      (getenv("BRAID_TOPO_FILE") == NULL && getenv("NCCL_TOPO_FILE") == NULL)) {
    fprintf(stderr, "--mode sharegpu: rank %d needs BRAID_TOPO_FILE and a bus id in "
            "GPU_COLL_BUSIDS (comma-separated, one per rank; have \"%s\")\n", index,
            list ? list : "");
    return -1;
  }
  memcpy(busid, p, len);
  busid[len] = '\0';
  if (setenv("BRAID_TOPO_BUSID", busid, 1) != 0) {
    perror("setenv");
    return -1;
  }
  return 0;
}

/* GPU_COLL_RANK_ENV="I:NAME=VALUE": child I sets NAME; 0 on success (or when unset). */
static int world_rank_env(int index) {
  const char* spec = getenv("GPU_COLL_RANK_ENV");
  char name[128];
  int who = -1, used = 0;
  if (spec == NULL || spec[0] == '\0') return 0;
  const char* eq = strchr(spec, '=');
  if (sscanf(spec, "%d:%n", &who, &used) != 1 || used == 0 || eq == NULL || eq <= spec + used ||
      (size_t)(eq - spec - used) >= sizeof name) {
    fprintf(stderr, "GPU_COLL_RANK_ENV=\"%s\": expected I:NAME=VALUE\n", spec);
    return -1;
  }
  if (who != index) return 0;
  memcpy(name, spec + used, (size_t)(eq - spec - used));
  name[eq - spec - used] = '\0';
  if (setenv(name, eq + 1, 1) != 0) {
    perror("setenv");
    return -1;
  }
  return 0;
}

/*
 * The entries of the parent's CUDA_VISIBLE_DEVICES (comma-separated), or -1
 * when it is unset (every GPU visible). No CUDA call: the parent makes none.
 */
static int world_visible_count(void) {
  const char* list = getenv("CUDA_VISIBLE_DEVICES");
  int n = 0;
  if (list == NULL) return -1;
  for (const char* p = list; *p; p++) n += *p == ',';
  return list[0] ? n + 1 : 0;
}

/* isolated, and the even ranks of mixed: rank `index` sees its own GPU alone. */
static int world_isolates(const struct gpu_opts* o, int index) {
  return strcmp(o->mode, "isolated") == 0 || (strcmp(o->mode, "mixed") == 0 && index % 2 == 0);
}

/*
 * Sets CUDA_VISIBLE_DEVICES to GPU `index` of the parent's (the index-th entry of its list,
 * or `index` when it has none), before this child's first CUDA call: CUDA reads the
 * variable once, when it initializes. 0; GPU_SKIP_CODE when the list has no such entry.
 */
static int world_isolate(int index, char* entry, size_t len) {
  const char* p = getenv("CUDA_VISIBLE_DEVICES");
  if (p == NULL) {
    snprintf(entry, len, "%d", index);
  } else {
    for (int i = 0; p && i < index; i++) {
      p = strchr(p, ',');
      if (p) p++;
    }
    size_t n = p ? strcspn(p, ",") : 0;
    if (n == 0 || n >= len) {
      fprintf(stderr, "SKIP: rank %d has no GPU of its own: CUDA_VISIBLE_DEVICES=\"%s\" has no "
              "usable entry %d\n", index, getenv("CUDA_VISIBLE_DEVICES"), index);
      return GPU_SKIP_CODE;
    }
    memcpy(entry, p, n);
    entry[n] = '\0';
  }
  if (setenv("CUDA_VISIBLE_DEVICES", entry, 1) != 0) {
    perror("setenv");
    return 1;
  }
  return 0;
}

/*
 * An isolated child's GPU check: exactly one GPU visible (more would mean CUDA was
 * initialized before CUDA_VISIBLE_DEVICES was set). 0, GPU_SKIP_CODE or 1.
 */
static int world_check_isolated(int index, const char* entry) {
  int count = 0;
  int rc = world_check_gpus(1);
  if (rc != 0) {
    fprintf(stderr, "SKIP [rank %d]: no GPU with CUDA_VISIBLE_DEVICES=%s\n", index, entry);
    return rc;
  }
  if (cudaGetDeviceCount(&count) != cudaSuccess || count != 1) {
    fprintf(stderr, "FAIL gpu_coll: rank %d sees %d GPUs with CUDA_VISIBLE_DEVICES=%s (1 "
            "expected)\n", index, count, entry);
    return 1;
  }
  return 0;
}

/*
 * Publishes this child's GPU check `rc` (0, GPU_SKIP_CODE or another failure) and waits
 * for every child's: returns 0 when all can run, GPU_SKIP_CODE when one cannot (it
 * said why), 1 on a failure. With `distinct`, the bus ids of the ranks' devices (`dev` here)
 * are compared too: two ranks on one GPU fail.
 */
static int world_gpus_agree(struct gpu_shared* sh, const struct mp_child* ch, int rc, int dev,
                            int distinct) {
  int me = ch->index, verdict = 0;
  if (rc == 0 && distinct &&
      cudaDeviceGetPCIBusId(sh->busid[me], (int)sizeof sh->busid[me], dev) != cudaSuccess) {
    fprintf(stderr, "FAIL gpu_coll: rank %d cannot read the bus id of its device %d\n", me, dev);
    rc = 1;
  }
  int mine = rc == 0 ? WORLD_GPU_OK : rc == GPU_SKIP_CODE ? WORLD_GPU_SKIP : WORLD_GPU_FAILED;
  __atomic_store_n(&sh->gpu_check[me], mine, __ATOMIC_RELEASE);
  if (rc != 0) return rc;
  for (int i = 0; i < ch->nprocs; i++) {
    int v;
    for (double waited = 0; (v = __atomic_load_n(&sh->gpu_check[i], __ATOMIC_ACQUIRE)) == 0;
         waited += 0.001) {
      if (waited > GPU_ID_WAIT_S) {
        fprintf(stderr, "FAIL gpu_coll: rank %d: no GPU check from rank %d after %.0f s\n", me,
                i, waited);
        return 1;
      }
      mp_sleep(0.001);
    }
    if (v == WORLD_GPU_FAILED) verdict = 1;
    if (v == WORLD_GPU_SKIP && verdict == 0) verdict = GPU_SKIP_CODE;
    if (v == WORLD_GPU_OK && distinct && i != me && strcmp(sh->busid[i], sh->busid[me]) == 0) {
      if (i < me) /* one line for the pair */
        fprintf(stderr, "FAIL gpu_coll: ranks %d and %d both drive GPU %s (--mode %s needs a GPU "
                "per rank: does CUDA_VISIBLE_DEVICES list one twice?)\n", i, me, sh->busid[me],
                ((const struct world_procs_arg*)ch->arg)->opts->mode);
      verdict = 1;
    }
  }
  return verdict;
}

/*
 * procs: child `ch->index` drives GPU `ch->index` as that rank; isolated, and the even ranks
 * of mixed: device 0, the one GPU it sees.
 */
static int world_child(const struct mp_child* ch) {
  const struct world_procs_arg* a = ch->arg;
  struct gpu_shared* sh = a->shared;
  struct gpu_world w;
  char entry[64] = "";
  int hosts = strcmp(a->opts->mode, "hosts") == 0;
  int share = strcmp(a->opts->mode, "sharegpu") == 0;
  int alone = world_isolates(a->opts, ch->index);
  int distinct = strcmp(a->opts->mode, "isolated") == 0 || strcmp(a->opts->mode, "mixed") == 0;
  if (share && world_share_busid(ch->index) != 0) return 1;
  if (world_rank_env(ch->index) != 0) return 1;
  if (hosts) {
    /* Before any call into the library: it reads its parameters once. */
    char id[64];
    snprintf(id, sizeof id, "gpu_coll-host%d", ch->index / a->opts->ranks_per_host);
    if (setenv("BRAID_HOSTID", id, 1) != 0 || setenv("NCCL_HOSTID", id, 1) != 0) {
      perror("setenv");
      return 1;
    }
  }
  int rc = alone ? world_isolate(ch->index, entry, sizeof entry) : 0;
  if (rc == 1) return 1;
  /* hosts: the ranks of one emulated host need a GPU each (no two on one GPU in a host);
     with GPU_COLL_GPU_PER_RANK=1 every rank does. */
  const char* per_rank = getenv("GPU_COLL_GPU_PER_RANK");
  int hosts_need = per_rank && strcmp(per_rank, "1") == 0 ? ch->nprocs : a->opts->ranks_per_host;
  if (rc == 0)
    rc = alone ? world_check_isolated(ch->index, entry)
               : world_check_gpus(hosts ? hosts_need : share ? 1 : ch->nprocs);
  int ngpus = 1;
  if (rc == 0 && (hosts || share) && cudaGetDeviceCount(&ngpus) != cudaSuccess) rc = 1;
  int dev = alone ? 0 : hosts || share ? ch->index % ngpus : ch->index;
  rc = world_gpus_agree(sh, ch, rc, dev, distinct);
  if (rc != 0) return rc;
  if (alone)
    printf("%s [rank %d]: CUDA_VISIBLE_DEVICES=%s, device 0 = GPU %s\n", a->opts->mode,
           ch->index, entry, sh->busid[ch->index]);
  else if (distinct)
    printf("%s [rank %d]: every GPU visible, device %d = GPU %s\n", a->opts->mode, ch->index,
           dev, sh->busid[ch->index]);
  world_init(&w, a->opts, &sh->tally);
  w.nlocal = 1;
  w.rank0 = ch->index;
  w.dev[0] = dev;
  w.ids = sh->ids;
  w.shared = sh;
  watchdog_install();
  if (world_id_share(&w, sh->ids, 0, 0, &sh->ids_ready[0]) != 0) return 1;
  if (world_cuda(&w, cudaSetDevice(w.dev[0]), "cudaSetDevice") != 0) return 1;
  ncclResult_t init = ncclCommInitRank(&w.comm[0], w.nranks, sh->ids[0], w.rank0);
  if (a->opts->init_fails) return world_init_refused(&w, init, "ncclCommInitRank");
  if (world_nccl(&w, init, NULL, "ncclCommInitRank") != 0 || world_streams_create(&w) != 0) {
    world_teardown(&w);
    return 1;
  }
  if (!a->opts->no_cases) a->suites(&w);
  world_teardown(&w);
  fflush(stdout);
  return w.failures || w.case_failed ? 1 : 0;
}

static int world_procs(const struct gpu_opts* o, void (*suites)(struct gpu_world* w),
                       struct gpu_shared* sh) {
  struct world_procs_arg a = {.opts = o, .suites = suites, .shared = sh};
  int listed = world_visible_count();
  if ((strcmp(o->mode, "isolated") == 0 || strcmp(o->mode, "mixed") == 0) && listed >= 0 &&
      listed < o->nranks) {
    fprintf(stderr, "SKIP: CUDA_VISIBLE_DEVICES=\"%s\" lists %d GPU(s), --mode %s needs %d (one "
            "per rank)\n", getenv("CUDA_VISIBLE_DEVICES"), listed, o->mode, o->nranks);
    return GPU_SKIP_CODE;
  }
  struct mp_opts mo = {
      .name = "gpu_coll", .nprocs = o->nranks, .timeout_sec = o->timeout_s, .arg = &a};
  if (strcmp(o->suite, "deadpeer") == 0) mo.sigkill_ok = 1u << (o->nranks - 1); /* the victim */
  return mp_run(&mo, world_child);
}

/* --list: the suites print their case names; no GPU is touched. */
static int world_list(const struct gpu_opts* o, void (*suites)(struct gpu_world* w),
                      struct gpu_tally* tally) {
  struct gpu_world w;
  world_init(&w, o, tally);
  suites(&w);
  printf("%d cases\n", tally->ncases);
  return 0;
}

/* The summary line, and the exit status by the rule at the top of this file. */
static int world_verdict(const struct gpu_opts* o, const struct gpu_tally* t, int rc) {
  int failed = world_failures(t), begun_skips = world_begun_skips(t);
  int skipped = t->nskipped + begun_skips, passed = t->ncases - failed - begun_skips;
  if (passed < 0) passed = 0; /* failures past GPU_MAX_CASES are counted, not deduplicated */
  printf("%d cases: %d passed, %d failed, %d skipped (mode=%s nranks=%d seed=%llu)\n",
         t->ncases + t->nskipped, passed, failed, skipped, o->mode, o->nranks,
         (unsigned long long)o->seed);
  if (failed || rc != 0) return 1;
  if (o->no_cases) {
    printf("no case run, as %s declares: %s\n", o->init_fails ? "--init-fails" : "--no-cases",
           o->init_fails ? "every rank's init returned an error" : "the init and teardown passed");
    return 0;
  }
  if (passed == 0 && skipped == 0) {
    if (o->filter)
      printf("FAIL: no case ran: --filter \"%s\" matches none\n", o->filter);
    else
      printf("FAIL: no case ran (a run without cases on purpose says --no-cases)\n");
    return 1;
  }
  if (passed == 0) {
    printf("every case skipped\n");
    return GPU_SKIP_CODE;
  }
  return 0;
}

int world_main(const struct gpu_opts* o, void (*suites)(struct gpu_world* w)) {
  int procs = strcmp(o->mode, "procs") == 0 || strcmp(o->mode, "hosts") == 0 ||
              strcmp(o->mode, "sharegpu") == 0 || strcmp(o->mode, "isolated") == 0 ||
              strcmp(o->mode, "mixed") == 0;
  /* Shared with the children in procs mode; ordinary memory would do otherwise. */
  struct gpu_shared* sh = mp_shared_alloc(sizeof *sh);
  int rc;
  if (o->list)
    rc = world_list(o, suites, &sh->tally);
  else if (procs)
    rc = world_procs(o, suites, sh);
  else
    rc = world_threads(o, suites, &sh->tally);
  /* Not enough GPUs (77 before any case) needs no summary. */
  if (!o->list && rc != GPU_SKIP_CODE) rc = world_verdict(o, &sh->tally, rc);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

double world_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
