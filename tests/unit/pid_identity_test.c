/*
 * braid_pid_hash names a process, which host and pid alone do not: two
 * processes in different pid namespaces (containers sharing the host's
 * network and boot id) can both be pid 1. Each child here makes its own pid
 * namespace and forks its pid 1 there, which reports its braid_pid_hash; the
 * two must differ, as must a forked child's and its parent's, while repeated
 * calls in one process agree. Making pid namespaces needs CAP_SYS_ADMIN: that
 * part is skipped without it (and says so), the rest always runs.
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/utils.h"
#include "test.h"

/* Runs in a fresh pid namespace as its pid 1; writes its pid and hash to `fd`. */
static int ns_child(int fd) {
  if (unshare(CLONE_NEWPID) != 0) {
    int e = errno;
    if (write(fd, &e, sizeof e) != sizeof e) return 2;
    return 1;
  }
  pid_t inner = fork();
  if (inner < 0) return 2;
  if (inner == 0) {
    int zero = 0;
    struct { int pid; uint64_t hash; } r = {(int)getpid(), braid_pid_hash()};
    if (write(fd, &zero, sizeof zero) != sizeof zero || write(fd, &r, sizeof r) != sizeof r) _exit(2);
    _exit(0);
  }
  int st = 0;
  waitpid(inner, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 2;
}

int main(void) {
  uint64_t mine = braid_pid_hash();
  TEST_CHECK(braid_pid_hash() == mine, "repeated calls agree");

  int p[2];
  TEST_CHECK(pipe(p) == 0, "pipe");
  pid_t c = fork();
  if (c == 0) {
    uint64_t h = braid_pid_hash();
    _exit(write(p[1], &h, sizeof h) == sizeof h ? 0 : 1);
  }
  uint64_t theirs = 0;
  TEST_CHECK(read(p[0], &theirs, sizeof theirs) == sizeof theirs, "the child's hash");
  waitpid(c, NULL, 0);
  TEST_CHECK(theirs != mine, "a forked child is another process");
  TEST_CHECK(braid_pid_hash() == mine, "and the parent keeps its own");

  struct { int pid; uint64_t hash; } got[2];
  int made = 0, denied = 0;
  for (int i = 0; i < 2; i++) {
    pid_t k = fork();
    if (k == 0) _exit(ns_child(p[1]));
    int status = -1;
    if (read(p[0], &status, sizeof status) != sizeof status) status = -1;
    if (status == 0 && read(p[0], &got[i], sizeof got[i]) == sizeof got[i]) made++;
    else if (status == EPERM || status == EINVAL || status == ENOSPC) denied = status;
    waitpid(k, NULL, 0);
  }
  if (made == 2) {
    TEST_CHECK(got[0].pid == 1 && got[1].pid == 1, "both are pid 1 in their namespaces (%d, %d)",
               got[0].pid, got[1].pid);
    TEST_CHECK(got[0].hash != got[1].hash, "two pid 1s of different namespaces differ");
  } else {
    TEST_CHECK(denied != 0, "pid namespaces: %d made, no refusal either", made);
    printf("note: no pid namespace here (%s): the two-namespace check did not run\n",
           strerror(denied));
  }
  return test_summary();
}
