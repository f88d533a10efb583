/*
 * The launch helpers (runtime/launch_pool.h) without a GPU: stand-in communicators on four
 * "devices" and a job that records where it ran and waits until every job of its call has
 * started (so only jobs run side by side get through in time; no clock decides). One call runs
 * the first job on the calling thread and each other one on its device's helper, all at once;
 * results and failure messages come back per job, and the caller's context to each; the
 * helpers stay (the same thread a device, call after call), wake from their sleep, survive a
 * thousand back-to-back calls, let two callers share them
 * (a busy helper's job runs on its caller), and are started afresh in a forked child.
 */
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/utils.h"
#include "runtime/comm.h"
#include "runtime/launch_pool.h"
#include "test.h"

#define NDEV 4
#define MEET_S 5.0 /* how long a job waits for the others of its call to start */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t moved = PTHREAD_COND_INITIALIZER;
static int active, max_active, started, runs[2 * NDEV + 1];
static pthread_t ran_on[2 * NDEV + 1];
static int meet = 1;       /* a job waits until NDEV jobs have started (side by side or never) */
static int failing = -1;   /* this comm index fails */
static int meet_timeouts;  /* jobs that gave up waiting for the others */
static struct ncclComm comms[2 * NDEV + 1];

static ncclResult_t job(struct ncclComm* c, const void* ctx) {
  const int i = (int)(c - comms);
  pthread_mutex_lock(&lock); /* the checks' counters too: jobs run on several threads */
  TEST_CHECK(ctx == (const void*)&meet, "job %d got ctx %p, not the caller's", i, ctx);
  if (++active > max_active) max_active = active;
  runs[i]++;
  ran_on[i] = pthread_self();
  started++;
  pthread_cond_broadcast(&moved);
  if (__atomic_load_n(&meet, __ATOMIC_RELAXED)) {
    /* Only jobs that run at the same time all get past here in time. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)MEET_S;
    while (started % NDEV != 0)
      if (pthread_cond_timedwait(&moved, &lock, &until) != 0) {
        meet_timeouts++;
        break;
      }
  }
  active--;
  pthread_mutex_unlock(&lock);
  if (i == __atomic_load_n(&failing, __ATOMIC_RELAXED))
    return braid_err(ncclInvalidUsage, "stand-in launch %d failed", i);
  return ncclSuccess;
}
static void jobs_for(struct launch_job* jobs, int first) {
  for (int i = 0; i < NDEV; i++) jobs[i].comm = &comms[first + i];
}

static void reset_counts(void) {
  pthread_mutex_lock(&lock);
  memset(runs, 0, sizeof runs);
  max_active = started = meet_timeouts = 0;
  pthread_mutex_unlock(&lock);
}

/* One call: all at once (every job met the others), the first here, the rest on helpers. */
static void check_one_call(pthread_t helpers[NDEV]) {
  struct launch_job jobs[NDEV];
  jobs_for(jobs, 0);
  reset_counts();
  __atomic_store_n(&failing, 2, __ATOMIC_RELAXED);
  launch_pool_run(jobs, NDEV, job, &meet);
  __atomic_store_n(&failing, -1, __ATOMIC_RELAXED);
  TEST_CHECK(meet_timeouts == 0 && max_active == NDEV,
             "the jobs did not run side by side (%d waited in vain; at most %d at once)",
             meet_timeouts, max_active);
  TEST_CHECK(pthread_equal(ran_on[0], pthread_self()), "the first job did not run on the caller");
  for (int i = 0; i < NDEV; i++) {
    TEST_CHECK(runs[i] == 1, "job %d ran %d times", i, runs[i]);
    if (i > 0)
      TEST_CHECK(!pthread_equal(ran_on[i], pthread_self()), "job %d ran on the caller", i);
    for (int j = 1; j < i; j++)
      TEST_CHECK(!pthread_equal(ran_on[i], ran_on[j]), "jobs %d and %d shared a thread", i, j);
    helpers[i] = ran_on[i];
  }
  TEST_CHECK(jobs[2].res == ncclInvalidUsage && strstr(jobs[2].msg, "stand-in launch 2 failed"),
             "the failed job: result %d, message '%s'", jobs[2].res, jobs[2].msg);
  for (int i = 0; i < NDEV; i++)
    if (i != 2)
      TEST_CHECK(jobs[i].res == ncclSuccess && jobs[i].msg[0] == '\0',
                 "job %d: result %d, message '%s'", i, jobs[i].res, jobs[i].msg);
}

/* After the spin (0.2 ms) the helpers sleep; a call wakes them, on the same threads. */
static void check_wake(const pthread_t helpers[NDEV]) {
  struct launch_job jobs[NDEV];
  usleep(20000);
  jobs_for(jobs, 0);
  reset_counts();
  launch_pool_run(jobs, NDEV, job, &meet);
  for (int i = 1; i < NDEV; i++)
    TEST_CHECK(runs[i] == 1 && pthread_equal(ran_on[i], helpers[i]) && jobs[i].res == ncclSuccess,
               "after a sleep job %d ran %d times, on its helper %d", i, runs[i],
               pthread_equal(ran_on[i], helpers[i]));
}

/* Back-to-back calls: every job once a call, none lost or run twice. */
static void check_many(void) {
  struct launch_job jobs[NDEV];
  __atomic_store_n(&meet, 0, __ATOMIC_RELAXED);
  reset_counts();
  const int calls = 1000;
  for (int k = 0; k < calls; k++) {
    jobs_for(jobs, 0);
    launch_pool_run(jobs, NDEV, job, &meet);
  }
  for (int i = 0; i < NDEV; i++)
    TEST_CHECK(runs[i] == calls, "job %d ran %d times in %d calls", i, runs[i], calls);
}

/* Two callers on the same devices at once: each job once, a busy helper's on its caller. */
static void* other_caller(void* arg) {
  struct launch_job* jobs = arg;
  launch_pool_run(jobs, NDEV, job, &meet);
  return NULL;
}

static void check_two_callers(void) {
  struct launch_job a[NDEV], b[NDEV];
  jobs_for(a, 0);
  jobs_for(b, NDEV); /* comms NDEV.. on the same devices 0..NDEV-1 */
  reset_counts();
  pthread_t t;
  TEST_CHECK(pthread_create(&t, NULL, other_caller, b) == 0, "cannot start the second caller");
  launch_pool_run(a, NDEV, job, &meet);
  pthread_join(t, NULL);
  for (int i = 0; i < 2 * NDEV; i++) TEST_CHECK(runs[i] == 1, "job %d ran %d times", i, runs[i]);
  for (int i = 0; i < NDEV; i++)
    TEST_CHECK(a[i].res == ncclSuccess && b[i].res == ncclSuccess, "device %d: results %d, %d", i,
               a[i].res, b[i].res);
}

/* A device beyond the pool's table runs on the caller. */
static void check_far_device(void) {
  struct launch_job jobs[2] = {{.comm = &comms[0]}, {.comm = &comms[2 * NDEV]}};
  reset_counts();
  launch_pool_run(jobs, 2, job, &meet);
  TEST_CHECK(runs[2 * NDEV] == 1 && pthread_equal(ran_on[2 * NDEV], pthread_self()),
             "the job of device %d ran %d times, on the caller %d", comms[2 * NDEV].cuda_dev,
             runs[2 * NDEV], pthread_equal(ran_on[2 * NDEV], pthread_self()));
}

/*
 * A forked child has no helpers: it starts its own and the call runs side by side. Not under
 * ThreadSanitizer, which stops a child of a threaded process that starts threads.
 */
#if defined(__SANITIZE_THREAD__)
#define LAUNCH_TEST_FORK 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LAUNCH_TEST_FORK 0
#endif
#endif
#ifndef LAUNCH_TEST_FORK
#define LAUNCH_TEST_FORK 1
#endif

static void check_fork(void) {
  if (!LAUNCH_TEST_FORK) return;
  pid_t pid = fork();
  if (pid == 0) {
    struct launch_job jobs[NDEV];
    jobs_for(jobs, 0);
    reset_counts();
    __atomic_store_n(&meet, 1, __ATOMIC_RELAXED);
    launch_pool_run(jobs, NDEV, job, &meet);
    int ok = max_active == NDEV && meet_timeouts == 0;
    for (int i = 0; i < NDEV; i++) ok &= runs[i] == 1 && jobs[i].res == ncclSuccess;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  TEST_CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork or wait failed");
  TEST_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
             "the forked child's call did not run its jobs side by side (status 0x%x)", status);
}

int main(void) {
  for (int i = 0; i < 2 * NDEV; i++) comms[i].cuda_dev = i % NDEV;
  comms[2 * NDEV].cuda_dev = 300;
  pthread_t helpers[NDEV];
  check_one_call(helpers);
  check_wake(helpers);
  check_many();
  check_two_callers();
  check_far_device();
  check_fork();
  return test_summary();
}
