/*
 * Helpers of the bootstrap mp tests (see boot_util.h).
 */
#include "boot_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/param.h"
#include "base/socket.h"
#include "base/utils.h"
#include "mp_runner.h"

void boot_env(const char* name, const char* value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
  braid_param_reload();
}

int boot_wait_flag(int* flag, int value, double timeout_sec) {
  double end = boot_now() + timeout_sec;
  while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < value) {
    if (boot_now() > end) return -1;
    mp_sleep(0.001);
  }
  return 0;
}

void boot_set_flag(int* flag, int value) { __atomic_store_n(flag, value, __ATOMIC_RELEASE); }
int boot_add_flag(int* flag, int delta) { return __atomic_add_fetch(flag, delta, __ATOMIC_ACQ_REL); }

int boot_id_share(struct boot_id_slot* slot, int index, double timeout_sec) {
  if (index == 0) {
    ncclResult_t res = bootstrap_get_unique_id(&slot->id);
    boot_set_flag(&slot->state, res == ncclSuccess ? 1 : -1);
    if (res != ncclSuccess) fprintf(stderr, "bootstrap_get_unique_id failed: %d\n", (int)res);
    return res == ncclSuccess ? 0 : -1;
  }
  double end = boot_now() + timeout_sec;
  for (;;) {
    int state = __atomic_load_n(&slot->state, __ATOMIC_ACQUIRE);
    if (state == 1) return 0;
    if (state < 0 || boot_now() > end) return -1;
    mp_sleep(0.001);
  }
}

/* Whether thread `tid` of this process carries a Braid name ("braid-..."). */
static int boot_task_is_braid(const char* tid) {
  char path[300], name[32] = "";
  snprintf(path, sizeof path, "/proc/self/task/%s/comm", tid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0;
  if (fgets(name, sizeof name, f) == NULL) name[0] = '\0';
  fclose(f);
  return strncmp(name, "braid-", 6) == 0;
}

/* Entries of a /proc directory, or only Braid's threads when `braid_only`. */
static int boot_dir_count(const char* path, int braid_only) {
  DIR* d = opendir(path);
  if (d == NULL) return -1;
  int n = 0;
  for (struct dirent* e = readdir(d); e != NULL; e = readdir(d))
    if (e->d_name[0] != '.' && (!braid_only || boot_task_is_braid(e->d_name))) n++;
  closedir(d);
  return n;
}

/* The directory's own fd is open while counting: the same offset every time, so counts compare. */
int boot_fd_count(void) { return boot_dir_count("/proc/self/fd", 0); }
int boot_thread_count(void) { return boot_dir_count("/proc/self/task", 1); }

int boot_settle(int fds, int threads, double timeout_sec) {
  double end = boot_now() + timeout_sec;
  while ((fds >= 0 && boot_fd_count() != fds) || boot_thread_count() != threads) {
    if (boot_now() > end) {
      fprintf(stderr, "leak: %d fds (expected %d), %d threads (expected %d)\n", boot_fd_count(), fds,
              boot_thread_count(), threads);
      return -1;
    }
    mp_sleep(0.01);
  }
  return 0;
}

int boot_free_port(const char* host) {
  char text[96];
  union braid_sockaddr addr;
  int fd = -1;
  snprintf(text, sizeof text, strchr(host, ':') ? "[%s]:0" : "%s:0", host);
  if (socket_addr_parse(text, &addr) != ncclSuccess || socket_listen(&addr, &fd) != ncclSuccess) return -1;
  int port = ntohs(addr.sa.sa_family == AF_INET ? addr.sin.sin_port : addr.sin6.sin6_port);
  socket_close(&fd);
  return port;
}

double boot_now(void) { return braid_time_sec(); }

static unsigned char boot_pattern(int rank, int salt, size_t i) {
  return (unsigned char)((size_t)rank * 37u + (size_t)salt * 101u + i * 7u + (i >> 9));
}

int boot_allgather_check(struct bootstrap* b, size_t size, int salt) {
  int n = bootstrap_nranks(b), me = bootstrap_rank(b), bad = 0;
  unsigned char* all = malloc(size * (size_t)n + 1);
  if (all == NULL) return -1;
  memset(all, 0xee, size * (size_t)n);
  for (size_t i = 0; i < size; i++) all[(size_t)me * size + i] = boot_pattern(me, salt, i);
  if (bootstrap_allgather(b, all, size) != ncclSuccess) {
    free(all);
    return -1;
  }
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < size; i++) {
      if (all[(size_t)r * size + i] == boot_pattern(r, salt, i)) continue;
      fprintf(stderr, "rank %d: allgather block %d byte %zu of %zu is wrong\n", me, r, i, size);
      bad++;
      break;
    }
  }
  free(all);
  return bad;
}

int boot_ring_tags_check(struct bootstrap* b, int salt) {
  int n = bootstrap_nranks(b), me = bootstrap_rank(b), bad = 0;
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  static const int order[3] = {3, 1, 2};
  for (int tag = 1; tag <= 3; tag++) {
    int64_t v = (int64_t)me * 1000 + tag * 10 + salt;
    if (bootstrap_send(b, next, tag, &v, sizeof v) != ncclSuccess) return -1;
  }
  for (int i = 0; i < 3; i++) {
    int64_t v = -1;
    if (bootstrap_recv(b, prev, order[i], &v, sizeof v) != ncclSuccess) return -1;
    if (v != (int64_t)prev * 1000 + order[i] * 10 + salt) {
      fprintf(stderr, "rank %d: tag %d from rank %d carried %lld\n", me, order[i], prev, (long long)v);
      bad++;
    }
  }
  return bad;
}
