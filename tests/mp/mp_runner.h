/*
 * A multi-process test runner: forks N children that each run one function,
 * with a time limit, and turns their exit statuses into one verdict. Shared
 * by the mp suites (bootstrap, net backends, abort).
 *
 * Children are plain fork()s of the test process: they see the parent's
 * memory as it was at fork time, plus any memory from mp_shared_alloc(),
 * which stays shared (use it to pass ids, addresses and results). A child's
 * return value is its exit status: 0 passed, TEST_SKIP_CODE skipped, anything
 * else failed. Children leave with _exit(), so atexit handlers of the parent
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
 * Runs `fn` in opts->nprocs children. Returns 0 when every child returned 0,
 * TEST_SKIP_CODE (77) when every child skipped, 1 otherwise (the reasons are
 * on stderr: which child, exit status or signal, or the time limit).
 */
int mp_run(const struct mp_opts* opts, mp_child_fn fn);

/* Zeroed memory shared by the parent and every child forked after this call; aborts on failure. */
void* mp_shared_alloc(size_t size);
void mp_shared_free(void* ptr, size_t size);

/* Sleeps `sec` seconds (fractions allowed). */
void mp_sleep(double sec);

#endif
