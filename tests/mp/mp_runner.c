/*
 * The multi-process runner (see mp_runner.h): fork, watch with a time limit,
 * reap, kill stragglers, report.
 */
#include "mp_runner.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How long the others may run on after one child failed before they are killed. */
#define MP_GRACE_SEC 2.0

static double mp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void mp_sleep(double sec) {
  struct timespec ts = {.tv_sec = (time_t)sec, .tv_nsec = (long)((sec - (double)(time_t)sec) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void* mp_shared_alloc(size_t size) {
  void* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "mp: cannot map %zu bytes of shared memory: %s\n", size, strerror(errno));
    abort();
  }
  return p; /* anonymous mappings are zeroed */
}

void mp_shared_free(void* ptr, size_t size) {
  if (ptr) munmap(ptr, size);
}

static void mp_child_main(const struct mp_opts* opts, mp_child_fn fn, int index) {
  /* If the runner dies, its children must not linger holding ports. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) _exit(1);
  struct mp_child child = {.index = index, .nprocs = opts->nprocs, .arg = opts->arg};
  int rc = fn(&child);
  fflush(stdout);
  fflush(stderr);
  _exit(rc & 0xff);
}

/* Records one child's end; returns 1 when it counts as a failure. */
static int mp_child_ended(const struct mp_opts* opts, int index, int status, int* skips) {
  if (WIFEXITED(status)) {
    int code = WEXITSTATUS(status);
    if (code == 0) return 0;
    if (code == MP_SKIPPED) {
      (*skips)++;
      return 0;
    }
    fprintf(stderr, "mp[%s]: child %d of %d exited with status %d\n", opts->name, index, opts->nprocs, code);
  } else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && index < 32 &&
             (opts->sigkill_ok & (1u << index))) {
    fprintf(stderr, "mp[%s]: child %d of %d ended by SIGKILL, as planned\n", opts->name, index,
            opts->nprocs);
    return 0;
  } else if (WIFSIGNALED(status)) {
    fprintf(stderr, "mp[%s]: child %d of %d was killed by signal %d (%s)\n", opts->name, index,
            opts->nprocs, WTERMSIG(status), strsignal(WTERMSIG(status)));
  }
  return 1;
}

/* Kills and reaps every child still running; `why` says why, for the report. */
static void mp_kill_rest(const struct mp_opts* opts, pid_t* pids, const char* why) {
  for (int i = 0; i < opts->nprocs; i++) {
    if (pids[i] <= 0) continue;
    fprintf(stderr, "mp[%s]: child %d of %d (pid %d) %s: killed\n", opts->name, i, opts->nprocs,
            (int)pids[i], why);
    kill(pids[i], SIGKILL);
    waitpid(pids[i], NULL, 0);
    pids[i] = 0;
  }
}

int mp_run(const struct mp_opts* opts, mp_child_fn fn) {
  pid_t* pids = calloc((size_t)opts->nprocs, sizeof *pids);
  int failures = 0, skips = 0, running = 0;
  double start = mp_now(), give_up = start + opts->timeout_sec;
  fflush(stdout);
  fflush(stderr);
  for (int i = 0; i < opts->nprocs; i++) {
    pid_t pid = fork();
    if (pid == 0) mp_child_main(opts, fn, i);
    if (pid < 0) {
      fprintf(stderr, "mp[%s]: fork of child %d failed: %s\n", opts->name, i, strerror(errno));
      failures++;
      break;
    }
    pids[i] = pid;
    running++;
  }
  while (running > 0) {
    int progressed = 0;
    for (int i = 0; i < opts->nprocs; i++) {
      int status = 0;
      if (pids[i] <= 0 || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      pids[i] = 0;
      running--;
      progressed = 1;
      if (mp_child_ended(opts, i, status, &skips) && failures++ == 0 && mp_now() + MP_GRACE_SEC < give_up)
        give_up = mp_now() + MP_GRACE_SEC;
    }
    if (running > 0 && mp_now() >= give_up) {
      mp_kill_rest(opts, pids, failures ? "still running after another child failed"
                                        : "still running at the time limit");
      if (!failures) fprintf(stderr, "mp[%s]: time limit of %.0f s reached\n", opts->name, opts->timeout_sec);
      failures++;
      running = 0;
    }
    if (!progressed && running > 0) mp_sleep(0.002);
  }
  free(pids);
  /* The rule of mp_runner.h: a failure wins; a partial skip fails too. */
  int partial = !failures && skips > 0 && skips < opts->nprocs;
  if (partial)
    fprintf(stderr, "mp[%s]: PARTIAL: %d of %d children skipped, the rest passed\n", opts->name,
            skips, opts->nprocs);
  int verdict = failures || partial ? MP_FAILED : skips > 0 ? MP_SKIPPED : MP_PASSED;
  fprintf(stderr, "mp[%s]: %d children, %.2f s, %s\n", opts->name, opts->nprocs, mp_now() - start,
          verdict == MP_FAILED ? "FAILED" : verdict == MP_SKIPPED ? "skipped" : "passed");
  return verdict;
}

int mp_verdict_merge(int a, int b) {
  if ((a != MP_PASSED && a != MP_SKIPPED) || (b != MP_PASSED && b != MP_SKIPPED)) return MP_FAILED;
  if (a == b) return a;
  fprintf(stderr, "mp: PARTIAL: one run of this case skipped, another passed: FAILED\n");
  return MP_FAILED;
}

int mp_verdict_exit(int rc, int failed_checks) {
  if (failed_checks > 0 || (rc != MP_PASSED && rc != MP_SKIPPED)) return MP_FAILED;
  return rc;
}
