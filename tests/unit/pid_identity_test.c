/*
 * braid_pid_hash names a process, which host and pid alone do not: two
 * processes in different pid namespaces (containers sharing the host's
 * network and boot id) can both be pid 1. Each child here makes its own pid
 * namespace and forks its pid 1 there, which reports its braid_pid_hash; the
 * two must differ, as must a forked child's and its parent's, while repeated
 * calls in one process agree. Making pid namespaces needs CAP_SYS_ADMIN: that
 * part is skipped without it (and says so), the rest always runs.
 *
 * And braid_process_gone, what the watchdog asks about a peer of this host: a
 * live process is not gone; one that exited is, reaped or not (a zombie, when
 * its parent does not wait for it); a pid whose start time is not the one the
 * peer announced belongs to another process.
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

static void test_gone(void) {
  int hold[2];
  TEST_CHECK(pipe(hold) == 0, "pipe");
  pid_t c = fork();
  if (c == 0) {
    char b;
    close(hold[1]);
    _exit(read(hold[0], &b, 1) < 0 ? 1 : 0); /* lives until the parent closes its end */
  }
  close(hold[0]);
  uint64_t start = braid_process_start((int)c);
  TEST_CHECK(start != 0, "the child's start time is known");
  TEST_CHECK(braid_process_start((int)getpid()) != 0, "this process's start time is known");
  TEST_CHECK(!braid_process_gone((int)c, start), "a live child is not gone");
  TEST_CHECK(!braid_process_gone((int)c, 0), "nor without its start time");
  TEST_CHECK(braid_process_gone((int)c, start + 1), "a pid with another start time is another process");
  close(hold[1]); /* the child exits; not reaped yet */
  int zombie = 0;
  for (int i = 0; i < 500 && !zombie; i++) {
    char path[64], st[512] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)c);
    FILE* f = fopen(path, "r");
    if (f) {
      size_t n = fread(st, 1, sizeof st - 1, f);
      st[n] = '\0';
      fclose(f);
    }
    char* p = strrchr(st, ')');
    zombie = p && p[1] == ' ' && p[2] == 'Z';
    if (!zombie) usleep(2000);
  }
  TEST_CHECK(zombie, "the exited child is a zombie");
  TEST_CHECK(braid_process_gone((int)c, start), "a zombie is gone");
  TEST_CHECK(braid_process_gone((int)c, 0), "a zombie is gone without the start time too");
  waitpid(c, NULL, 0);
  TEST_CHECK(braid_process_gone((int)c, start), "a reaped child is gone");
}

int main(void) {
  test_gone();
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
