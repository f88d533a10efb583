/*
 * The launch helpers (launch_pool.h says what they are for).
 *
 * Hand-off: the caller writes the job, then bumps `posted`; the helper runs it and sets
 * `finished` to the same count. A helper that has spun LAUNCH_POOL_SPIN_NS without work
 * sleeps on its condition variable, saying so in `sleeping` first; the caller signals only a
 * sleeper. Both sides store their word, then read the other's (sequentially consistent), so
 * either the helper sees the job before it waits or the caller sees it asleep and wakes it.
 */
#include "runtime/launch_pool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/debug.h"
#include "runtime/comm.h"

#define LAUNCH_POOL_DEVS 256
/*
 * How long a helper spins after its last launch before it sleeps: a loop of calls hands it
 * the next one within tens of microseconds; waking a sleeper costs a futex call on each side.
 */
#define LAUNCH_POOL_SPIN_NS 200000ll
/* Spins between two sched_yield() calls: a thread that shares its CPU lets the other run. */
#define LAUNCH_POOL_YIELD_SPINS 256

struct pool_helper {
  int dev;
  int busy; /* claimed by a caller for one group end */
  uint64_t posted, finished;
  int sleeping;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  struct launch_job* job;
  launch_pool_fn fn;
  const void* ctx;
};

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool_helper* pool[LAUNCH_POOL_DEVS];
static int pool_start_failed[LAUNCH_POOL_DEVS]; /* said once; such a device's launches stay here */
static pthread_once_t pool_fork_once = PTHREAD_ONCE_INIT;

/* One spin of a wait; the i-th of it yields the CPU every LAUNCH_POOL_YIELD_SPINS. */
static inline void pool_relax(unsigned i) {
  if (i % LAUNCH_POOL_YIELD_SPINS == LAUNCH_POOL_YIELD_SPINS - 1) {
    sched_yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

static int64_t pool_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000ll + t.tv_nsec;
}

/* Runs the posted job `seq` and says it is done. */
static void pool_helper_serve(struct pool_helper* h, uint64_t seq) {
  struct launch_job* job = h->job;
  braid_err_clear();
  job->res = h->fn(job->comm, h->ctx);
  if (job->res != ncclSuccess) snprintf(job->msg, sizeof job->msg, "%s", braid_err_last());
  __atomic_store_n(&h->finished, seq, __ATOMIC_RELEASE);
}

/* Waits for a job after `seen`: spins, then sleeps. Returns its count. */
static uint64_t pool_helper_wait(struct pool_helper* h, uint64_t seen) {
  int64_t since = pool_now_ns();
  for (unsigned i = 1;; i++) {
    uint64_t p = __atomic_load_n(&h->posted, __ATOMIC_ACQUIRE);
    if (p != seen) return p;
    pool_relax(i);
    if ((i & 63) == 0 && pool_now_ns() - since > LAUNCH_POOL_SPIN_NS) break;
  }
  pthread_mutex_lock(&h->lock);
  __atomic_store_n(&h->sleeping, 1, __ATOMIC_SEQ_CST);
  uint64_t p;
  while ((p = __atomic_load_n(&h->posted, __ATOMIC_SEQ_CST)) == seen)
    pthread_cond_wait(&h->wake, &h->lock);
  __atomic_store_n(&h->sleeping, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&h->lock);
  return p;
}

static void* pool_helper_main(void* arg) {
  struct pool_helper* h = arg;
  char name[16];
  snprintf(name, sizeof name, "braid-launch%d", h->dev);
  pthread_setname_np(pthread_self(), name);
  for (uint64_t seen = 0;;) {
    seen = pool_helper_wait(h, seen);
    pool_helper_serve(h, seen);
  }
  return NULL;
}

/*
 * Around fork: pool_lock is held across it (no other thread is starting a helper then), and
 * in the child, where the helpers are gone (threads do not survive fork), the table starts
 * afresh; the parent's helpers stay allocated, the parent owns them.
 */
static void pool_fork_prepare(void) { pthread_mutex_lock(&pool_lock); }
static void pool_fork_parent(void) { pthread_mutex_unlock(&pool_lock); }
static void pool_fork_child(void) {
  memset(pool, 0, sizeof pool);
  memset(pool_start_failed, 0, sizeof pool_start_failed);
  pthread_mutex_unlock(&pool_lock);
}

static void pool_fork_register(void) {
  pthread_atfork(pool_fork_prepare, pool_fork_parent, pool_fork_child);
}

static struct pool_helper* pool_helper_start(int dev) {
  struct pool_helper* h = calloc(1, sizeof *h);
  if (h == NULL) return NULL;
  h->dev = dev;
  pthread_mutex_init(&h->lock, NULL);
  pthread_cond_init(&h->wake, NULL);
  /* Signals go to the application's threads, never to a helper. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  int err = pthread_create(&thread, &attr, pool_helper_main, h);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (err == 0) {
    INFO(BRAID_LOG_TUNING, "GPU %d: a launch helper thread started: a group on several GPUs "
         "launches on them at once (BRAID_LAUNCH_THREADS)", dev);
    return h;
  }
  WARN("cannot start the launch helper of GPU %d (%s): a group's launches on it run on the "
       "calling thread, one after another",
       dev, strerror(err));
  pthread_cond_destroy(&h->wake);
  pthread_mutex_destroy(&h->lock);
  free(h);
  return NULL;
}

/* The helper of `dev`, claimed for this call, or NULL (busy, or none can start). */
static struct pool_helper* pool_claim(int dev) {
  if (dev < 0 || dev >= LAUNCH_POOL_DEVS) return NULL;
  struct pool_helper* h = __atomic_load_n(&pool[dev], __ATOMIC_ACQUIRE);
  if (h == NULL) {
    pthread_once(&pool_fork_once, pool_fork_register);
    pthread_mutex_lock(&pool_lock);
    if (pool[dev] == NULL && !pool_start_failed[dev]) {
      h = pool_helper_start(dev);
      pool_start_failed[dev] = h == NULL;
      __atomic_store_n(&pool[dev], h, __ATOMIC_RELEASE);
    }
    h = pool[dev];
    pthread_mutex_unlock(&pool_lock);
    if (h == NULL) return NULL;
  }
  int idle = 0;
  return __atomic_compare_exchange_n(&h->busy, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)
             ? h
             : NULL;
}

/* After pool_wait_done: the next claimer sees `finished` as it is now. */
static void pool_release(struct pool_helper* h) { __atomic_store_n(&h->busy, 0, __ATOMIC_RELEASE); }

static void pool_post(struct pool_helper* h, struct launch_job* job, launch_pool_fn fn,
                      const void* ctx) {
  h->job = job;
  h->fn = fn;
  h->ctx = ctx;
  /* The claimer alone posts, and finished == posted here. */
  uint64_t seq = __atomic_load_n(&h->finished, __ATOMIC_RELAXED) + 1;
  __atomic_store_n(&h->posted, seq, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&h->sleeping, __ATOMIC_SEQ_CST)) {
    pthread_mutex_lock(&h->lock);
    pthread_cond_signal(&h->wake);
    pthread_mutex_unlock(&h->lock);
  }
}

static void pool_wait_done(struct pool_helper* h) {
  const uint64_t seq = __atomic_load_n(&h->posted, __ATOMIC_RELAXED);
  for (unsigned i = 1; __atomic_load_n(&h->finished, __ATOMIC_ACQUIRE) != seq; i++) pool_relax(i);
}

static void pool_run_here(struct launch_job* job, launch_pool_fn fn, const void* ctx) {
  braid_err_clear(); /* a failure's message is its own, not an earlier job's */
  job->res = fn(job->comm, ctx);
  if (job->res != ncclSuccess) snprintf(job->msg, sizeof job->msg, "%s", braid_err_last());
}

void launch_pool_run(struct launch_job* jobs, int n, launch_pool_fn fn, const void* ctx) {
  struct pool_helper* helpers[LAUNCH_POOL_MAX_JOBS] = {NULL};
  for (int i = 1; i < n && i < LAUNCH_POOL_MAX_JOBS; i++) {
    jobs[i].msg[0] = '\0';
    helpers[i] = pool_claim(jobs[i].comm->cuda_dev);
    if (helpers[i] != NULL) pool_post(helpers[i], &jobs[i], fn, ctx);
  }
  jobs[0].msg[0] = '\0';
  pool_run_here(&jobs[0], fn, ctx);
  for (int i = 1; i < n; i++) {
    struct pool_helper* h = i < LAUNCH_POOL_MAX_JOBS ? helpers[i] : NULL;
    if (h == NULL) {
      jobs[i].msg[0] = '\0';
      pool_run_here(&jobs[i], fn, ctx);
      continue;
    }
    pool_wait_done(h);
    pool_release(h);
  }
}

static pthread_once_t cpus_once = PTHREAD_ONCE_INIT;
static int cpus_allowed;

static void pool_cpus_read(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    cpus_allowed = CPU_COUNT(&set);
    return;
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN); /* more CPUs than a cpu_set_t holds */
  cpus_allowed = online > 0 ? (int)online : 1;
}

int launch_pool_cpus(void) {
  pthread_once(&cpus_once, pool_cpus_read);
  return cpus_allowed;
}
