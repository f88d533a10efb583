/*
 * BRAID_CHECK's exchange (check_group) between processes on loopback, on communicators made of
 * the host parts only (comm_alloc and a bootstrap, no GPU): each rank puts collectives into its
 * group state as the API would and calls the check as a group end does.
 *
 *   agree      three ranks, the same AllReduce: the check passes
 *   mismatch   two ranks, counts that differ: ncclInvalidUsage naming both calls, at once
 *   missing    three ranks, rank 1 skips the AllReduce (BRAID_TIMEOUT=2): ranks 0 and 2 fail
 *              within the deadline with ncclRemoteError naming rank 1, their own call and the
 *              rank that did arrive; it is their comm's last error and its async error
 *   abort      rank 1 skips, BRAID_TIMEOUT=60: ncclCommAbort from another thread of rank 0
 *              ends the wait within a second
 *   failed     rank 1 skips, BRAID_TIMEOUT=60: the comm of rank 0 fails asynchronously as a
 *              hang verdict fails it (another thread); the wait ends within a second with that
 *              error and reason
 *   lost       rank 1 closes its bootstrap instead: rank 0's wait ends at once with
 *              ncclRemoteError naming rank 1, and the comm is failed
 *
 *   check_test agree | mismatch | missing | abort | failed | lost
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot_util.h"
#include "bootstrap/bootstrap.h"
#include "base/error.h"
#include "base/utils.h"
#include "mp_runner.h"
#include "runtime/check.h"
#include "runtime/comm.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "test.h"

#define COUNT 1024

struct shared {
  struct boot_id_slot slot;
  int done; /* ranks through their check (the ranks that skip wait for it) */
};

static int child_result(void) { return test_failures ? 1 : 0; }

/* A communicator of `nranks` with its bootstrap up and one AllReduce float sum of `count` pending.
 */
static struct ncclComm* check_comm(struct shared* sh, const struct mp_child* c, const char* timeout,
                                   volatile uint32_t* flag, size_t count) {
  struct braid_config cfg;
  struct ncclComm* comm = NULL;
  test_failures = 0;
  test_checks = 0;
  boot_loopback("30");
  boot_env("BRAID_CHECK", "1");
  boot_env("BRAID_TIMEOUT", timeout);
  if (config_resolve(NULL, &cfg) != ncclSuccess ||
      comm_alloc(&comm, c->index, c->nprocs, 0, &cfg) != ncclSuccess)
    return NULL;
  comm->abort_flag = flag;
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0 ||
      bootstrap_init(&sh->slot.id, 1, c->index, c->nprocs, flag, &comm->bootstrap) != ncclSuccess)
    return NULL;
  bootstrap_init_done(comm->bootstrap);
  comm->state = BRAID_COMM_READY;
  comm->async_error = ncclSuccess;
  comm->group = calloc(1, sizeof *comm->group);
  if (comm->group == NULL) return NULL;
  comm->group->ops = calloc(1, sizeof *comm->group->ops);
  if (comm->group->ops == NULL) return NULL;
  comm->group->cap = comm->group->nops = 1;
  comm->group->ops[0] = (struct braid_op){.coll = BRAID_COLL_ALLREDUCE,
                                          .dtype = ncclFloat32,
                                          .devop = BRAID_DEVOP_SUM,
                                          .count = count,
                                          .peer = -1};
  return comm;
}

/* The check as a group end runs it (in_group_end held, so an abort waits for it); its time. */
static ncclResult_t check_run(struct ncclComm* comm, double* seconds) {
  const double t0 = boot_now();
  __atomic_add_fetch(&comm->in_group_end, 1, __ATOMIC_ACQ_REL);
  ncclResult_t res = check_group(comm);
  __atomic_sub_fetch(&comm->in_group_end, 1, __ATOMIC_ACQ_REL);
  *seconds = boot_now() - t0;
  return res;
}

static ncclResult_t async_of(struct ncclComm* comm) {
  ncclResult_t async = ncclInternalError;
  if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) return ncclInternalError;
  return async;
}

/* ------------------------------------------------------------ agree, mismatch */

static int agree_child(const struct mp_child* c) {
  struct shared* sh = c->arg;
  volatile uint32_t flag = 0;
  double dt = 0;
  struct ncclComm* comm = check_comm(sh, c, "30", &flag, COUNT);
  if (comm == NULL) return 1;
  TEST_EXPECT_RES(check_run(comm, &dt), ncclSuccess);
  TEST_CHECK(dt < 5.0, "the check took %.2f s", dt);
  TEST_CHECK(async_of(comm) == ncclSuccess, "async error %d", (int)async_of(comm));
  return child_result();
}

static int mismatch_child(const struct mp_child* c) {
  struct shared* sh = c->arg;
  volatile uint32_t flag = 0;
  double dt = 0;
  struct ncclComm* comm = check_comm(sh, c, "30", &flag, c->index == 0 ? COUNT : 2 * COUNT);
  if (comm == NULL) return 1;
  TEST_EXPECT_RES(check_run(comm, &dt), ncclInvalidUsage);
  const char* msg = ncclGetLastError(comm);
  TEST_CHECK(strstr(msg, "AllReduce float sum count=1024") && strstr(msg, "count=2048"),
             "message: %s", msg);
  TEST_CHECK(dt < 5.0, "the check took %.2f s", dt);
  /* Every rank saw the difference and launched nothing: the comm stays usable. */
  TEST_CHECK(async_of(comm) == ncclSuccess, "async error %d", (int)async_of(comm));
  return child_result();
}

/* ------------------------------------------------------------------- missing */

/* A rank that skips the collective: it stays alive, in no bootstrap call, until the others are
 * done. */
static int skip(struct shared* sh, int waiting) {
  TEST_CHECK(boot_wait_flag(&sh->done, waiting, 60.0) == 0, "the other ranks never finished");
  return child_result();
}

static int missing_child(const struct mp_child* c) {
  struct shared* sh = c->arg;
  volatile uint32_t flag = 0;
  double dt = 0;
  struct ncclComm* comm = check_comm(sh, c, "2", &flag, COUNT);
  if (comm == NULL) return 1;
  if (c->index == 1) return skip(sh, c->nprocs - 1);
  TEST_EXPECT_RES(check_run(comm, &dt), ncclRemoteError);
  TEST_CHECK(dt >= 1.9 && dt < 4.0, "the check gave up after %.2f s (BRAID_TIMEOUT=2)", dt);
  const char* msg = ncclGetLastError(comm);
  char other[64];
  snprintf(other, sizeof other, "rank(s) %d arrived with the same call", 2 - c->index);
  TEST_CHECK(strstr(msg, "for rank(s) 1, which did not reach") != NULL, "message: %s", msg);
  TEST_CHECK(strstr(msg, "AllReduce float sum count=1024") != NULL, "message: %s", msg);
  TEST_CHECK(strstr(msg, "BRAID_TIMEOUT") != NULL, "message: %s", msg);
  TEST_CHECK(strstr(msg, other) != NULL, "message: %s", msg);
  TEST_CHECK(async_of(comm) == ncclRemoteError, "async error %d", (int)async_of(comm));
  TEST_CHECK(flag != 0, "the failed comm's abort flag is down");
  boot_add_flag(&sh->done, 1);
  return child_result();
}

/* -------------------------------------------------------------- abort, failed */

struct later {
  struct ncclComm* comm;
  int abort; /* 1: ncclCommAbort; 0: fail the comm as a hang verdict does */
  ncclResult_t res;
};

static void* later_main(void* arg) {
  struct later* l = arg;
  usleep(300 * 1000);
  if (l->abort) {
    l->res = ncclCommAbort(l->comm);
  } else {
    braid_err(ncclRemoteError, "rank 0 waits in AllReduce #7 for rank 1 (a verdict of the test)");
    comm_fail_async(l->comm, ncclRemoteError);
    comm_stop(l->comm, "stopped by a hang verdict");
  }
  return NULL;
}

static int interrupt_child(const struct mp_child* c, int abort) {
  struct shared* sh = c->arg;
  volatile uint32_t flag = 0;
  double dt = 0;
  struct ncclComm* comm = check_comm(sh, c, "60", &flag, COUNT);
  if (comm == NULL) return 1;
  if (c->index == 1) return skip(sh, 1);
  struct later l = {.comm = comm, .abort = abort};
  pthread_t th;
  pthread_create(&th, NULL, later_main, &l);
  ncclResult_t res = check_run(comm, &dt);
  char msg[BRAID_ERROR_MAX];
  snprintf(msg, sizeof msg, "%s", braid_err_last());
  if (!abort) {
    TEST_CHECK(async_of(comm) == ncclRemoteError, "async error %d", (int)async_of(comm));
    TEST_CHECK(strstr(ncclGetLastError(comm), "a verdict of the test") != NULL, "last error: %s",
               ncclGetLastError(comm));
  }
  pthread_join(th, NULL); /* an abort frees the comm once the check is out */
  TEST_EXPECT_RES(res, ncclRemoteError);
  TEST_CHECK(dt < 1.3, "the wait ended %.2f s after it began (the interruption came at 0.3 s)", dt);
  TEST_CHECK(strstr(msg, "BRAID_CHECK: rank 0 stopped waiting for rank 1 at AllReduce") != NULL,
             "message: %s", msg);
  if (abort) {
    TEST_EXPECT_RES(l.res, ncclSuccess);
    TEST_CHECK(strstr(msg, "aborted") != NULL, "message: %s", msg);
  } else {
    TEST_CHECK(strstr(msg, "the communicator failed: rank 0 waits in AllReduce #7") != NULL,
               "message: %s", msg);
  }
  boot_add_flag(&sh->done, 1);
  return child_result();
}

static int abort_child(const struct mp_child* c) { return interrupt_child(c, 1); }
static int failed_child(const struct mp_child* c) { return interrupt_child(c, 0); }

/* ---------------------------------------------------------------------- lost */

static int lost_child(const struct mp_child* c) {
  struct shared* sh = c->arg;
  volatile uint32_t flag = 0;
  double dt = 0;
  struct ncclComm* comm = check_comm(sh, c, "60", &flag, COUNT);
  if (comm == NULL) return 1;
  if (c->index == 1) {
    bootstrap_close(comm->bootstrap); /* as a process that exits */
    comm->bootstrap = NULL;
    return skip(sh, 1);
  }
  TEST_EXPECT_RES(check_run(comm, &dt), ncclRemoteError);
  TEST_CHECK(dt < 5.0, "the wait ended after %.2f s", dt);
  const char* msg = ncclGetLastError(comm);
  TEST_CHECK(strstr(msg, "BRAID_CHECK: rank 0 stopped waiting for rank 1") != NULL &&
                 strstr(msg, "rank 1") != NULL,
             "message: %s", msg);
  TEST_CHECK(async_of(comm) == ncclRemoteError, "async error %d", (int)async_of(comm));
  boot_add_flag(&sh->done, 1);
  return child_result();
}

/* ---------------------------------------------------------------------- main */

static int run(const char* name, int nprocs, mp_child_fn fn) {
  return boot_run(name, nprocs, 40, sizeof(struct shared), fn);
}

static int case_agree(void) { return run("agree", 3, agree_child); }
static int case_mismatch(void) { return run("mismatch", 2, mismatch_child); }
static int case_missing(void) { return run("missing", 3, missing_child); }
static int case_abort(void) { return run("abort", 2, abort_child); }
static int case_failed(void) { return run("failed", 2, failed_child); }
static int case_lost(void) { return run("lost", 2, lost_child); }

int main(int argc, char** argv) {
  static const struct {
    const char* name;
    int (*run)(void);
  } cases[] = {{"agree", case_agree}, {"mismatch", case_mismatch}, {"missing", case_missing},
               {"abort", case_abort}, {"failed", case_failed},     {"lost", case_lost}};
  for (size_t i = 0; argc > 1 && i < sizeof cases / sizeof cases[0]; i++) {
    if (strcmp(argv[1], cases[i].name) != 0) continue;
    int rc = cases[i].run();
    test_summary();
    return mp_verdict_exit(rc, test_failures);
  }
  fprintf(stderr, "usage: %s agree|mismatch|missing|abort|failed|lost\n", argv[0]);
  return 2;
}
