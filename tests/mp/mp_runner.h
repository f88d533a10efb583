/*
 * A multi-process test runner: forks N children that each run one function,
 * with a time limit, and turns their exit statuses into one verdict. Shared
 * by the mp suites (bootstrap, net backends, abort).
 *
 * Children are plain fork()s of the test process: they see the parent's
 * memory as it was at fork time, plus any memory from mp_shared_alloc(),
 * which stays shared (use it to pass ids, addresses and results). A child's
 * return value is its exit status: MP_PASSED, MP_SKIPPED, anything else
 * failed. Children leave with _exit(), so atexit handlers of the parent
 * (cleanups of namespaces, temp files) run only in the parent.
 *
 * When a child fails (non-zero exit or a signal), the others get a short
 * grace period to finish on their own and are then killed, since they are
 * likely waiting for the one that failed. When the time limit passes, every
 * child still running is killed and reported.
 */
#ifndef BRAID_TESTS_MP_RUNNER_H
#define BRAID_TESTS_MP_RUNNER_H

#include <stddef.h>

/*
 * Verdicts: what a child returns, what mp_run returns, and what an mp case
 * exits with (CTest's SKIP_RETURN_CODE is MP_SKIPPED).
 *
 * One rule turns several verdicts into one, for the children of a run
 * (mp_run) and for the runs of a case (mp_verdict_merge), so that nothing
 * reads "passed" unless all of it ran and passed:
 *   - any failure (an exit status other than 0 and 77, a signal other than
 *     a planned SIGKILL, the time limit) fails the whole;
 *   - all skipped: skipped;
 *   - all passed (a planned SIGKILL counts as passed): passed;
 *   - some skipped, the others passed (a partial skip): FAILED, with
 *     "PARTIAL: k of n ... skipped" on stderr. The children of a run are the
 *     ranks of one test, and the runs of a case its parts: when they disagree
 *     about whether the test can run here, part of it did not run: neither
 *     "passed" (which would hide the skip) nor "skipped" (which would hide
 *     the parts that went ahead without the others) is true.
 * A case's own checks in the parent come on top (mp_verdict_exit): a failed
 * check fails the case even when its runs skipped.
 */
#define MP_PASSED 0
#define MP_FAILED 1
#define MP_SKIPPED 77

struct mp_child {
  int index;  /* 0 .. nprocs-1 */
  int nprocs;
  void* arg;  /* mp_opts.arg */
};

typedef int (*mp_child_fn)(const struct mp_child* child);

struct mp_opts {
  const char* name;    /* shown in the runner's messages */
  int nprocs;
  double timeout_sec;  /* for the whole run */
  void* arg;           /* passed to every child */
  unsigned sigkill_ok; /* children (bit i: child i) whose death by SIGKILL is the planned end */
};

/*
 * Runs `fn` in opts->nprocs children and returns their verdict by the rule
 * above: MP_PASSED, MP_SKIPPED or MP_FAILED (the reasons are on stderr:
 * which child, exit status or signal, the time limit, or a partial skip).
 */
int mp_run(const struct mp_opts* opts, mp_child_fn fn);

/* The verdict of two runs of one case (or of the verdict so far and one more run), by that rule. */
int mp_verdict_merge(int a, int b);

/*
 * The exit status of an mp case from its runs' verdict `rc` and the number of
 * checks that failed in the parent (test_failures): MP_FAILED when either
 * failed, else `rc` (MP_PASSED or MP_SKIPPED).
 */
int mp_verdict_exit(int rc, int failed_checks);

/* Zeroed memory shared by the parent and every child forked after this call; aborts on failure. */
void* mp_shared_alloc(size_t size);
void mp_shared_free(void* ptr, size_t size);

/* Sleeps `sec` seconds (fractions allowed). */
void mp_sleep(double sec);

#endif
