/*
 * The jobs run at a group's end (group_run_jobs, group.h), without a GPU: jobs that share a
 * `serial` key (collective calls deferred on one communicator: window registrations, device
 * communicators) run one at a time, in the order they were added, on one thread; jobs of
 * different keys, and jobs without one, run side by side; every job's result is kept and the
 * first failure is returned.
 */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "base/utils.h"
#include "runtime/group.h"
#include "test.h"

#define NJOBS 7
#define JOB_S 0.15 /* each job's run */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int active[3], max_active[3], active_all, max_active_all;
static int order[3][NJOBS], norder[3];
static pthread_t thread_of[NJOBS];

struct job_arg {
  int index, key;
  ncclResult_t result;
};

static ncclResult_t job_run(struct braid_init_job* job) {
  const struct job_arg* a = job->arg;
  pthread_mutex_lock(&lock);
  if (++active[a->key] > max_active[a->key]) max_active[a->key] = active[a->key];
  if (++active_all > max_active_all) max_active_all = active_all;
  order[a->key][norder[a->key]++] = a->index;
  thread_of[a->index] = pthread_self();
  pthread_mutex_unlock(&lock);
  usleep((useconds_t)(JOB_S * 1e6));
  pthread_mutex_lock(&lock);
  active[a->key]--;
  active_all--;
  pthread_mutex_unlock(&lock);
  return a->result;
}

int main(void) {
  static int key_a, key_b; /* two communicators' addresses, as serial keys */
  /* Added in index order: keys A, B, none, A, B, A, none; job 3 fails. */
  const int keys[NJOBS] = {0, 1, 2, 0, 1, 0, 2};
  struct job_arg args[NJOBS];
  struct braid_init_job jobs[NJOBS];
  struct braid_init_job* list = NULL;
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < NJOBS; i++) {
    args[i] = (struct job_arg){i, keys[i], i == 3 ? ncclInvalidUsage : ncclSuccess};
    jobs[i].run = job_run;
    jobs[i].arg = &args[i];
    jobs[i].serial = keys[i] == 0 ? (const void*)&key_a : keys[i] == 1 ? (const void*)&key_b : NULL;
    jobs[i].next = list; /* as group_init_add: the last added first */
    list = &jobs[i];
  }
  double t0 = braid_time_sec();
  ncclResult_t res = group_run_jobs(list);
  double took = braid_time_sec() - t0;
  TEST_CHECK(res == ncclInvalidUsage, "the group's result is %d, expected the failed job's", res);
  for (int i = 0; i < NJOBS; i++)
    TEST_CHECK(jobs[i].result == args[i].result, "job %d's result %d", i, jobs[i].result);
  TEST_CHECK(max_active[0] == 1 && max_active[1] == 1, "jobs of one key overlapped (%d, %d at once)",
             max_active[0], max_active[1]);
  TEST_CHECK(norder[0] == 3 && order[0][0] == 0 && order[0][1] == 3 && order[0][2] == 5,
             "key A's jobs ran as %d %d %d, not in the order added", order[0][0], order[0][1],
             order[0][2]);
  TEST_CHECK(norder[1] == 2 && order[1][0] == 1 && order[1][1] == 4,
             "key B's jobs ran as %d %d, not in the order added", order[1][0], order[1][1]);
  TEST_CHECK(pthread_equal(thread_of[0], thread_of[3]) && pthread_equal(thread_of[3], thread_of[5]),
             "key A's jobs ran on more than one thread");
  TEST_CHECK(max_active_all >= 2, "no two jobs ran side by side");
  /* Key A's chain is the longest: 3 jobs one after another, the rest beside it. */
  TEST_CHECK(took >= 3 * JOB_S - 0.01, "the group took %.2f s, less than key A's chain", took);
  printf("%d jobs in %.2f s, at most %d at once\n", NJOBS, took, max_active_all);
  return test_summary();
}
