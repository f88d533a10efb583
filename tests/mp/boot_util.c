/*
 * Helpers of the bootstrap mp tests (see boot_util.h).
 */
#include "boot_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/param.h"
#include "base/socket.h"
#include "base/utils.h"
#include "bootstrap/bootstrap_internal.h"
#include "mp_runner.h"

void boot_env(const char* name, const char* value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
  braid_param_reload();
}

void boot_loopback(const char* timeout) {
  boot_env("BRAID_SOCKET_IFNAME", "lo");
  boot_env("BRAID_BOOTSTRAP_TIMEOUT", timeout);
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

int boot_run(const char* name, int nprocs, double timeout_sec, size_t size, mp_child_fn fn) {
  void* shared = mp_shared_alloc(size);
  struct mp_opts opts = {.name = name, .nprocs = nprocs, .timeout_sec = timeout_sec, .arg = shared};
  int rc = mp_run(&opts, fn);
  mp_shared_free(shared, size);
  return rc;
}

void boot_log_to(const char* path, const char* level) {
  FILE* f = fopen(path, "w");
  if (f) fclose(f);
  setenv("BRAID_DEBUG_FILE", path, 1);
  if (level) setenv("BRAID_DEBUG", level, 1);
  braid_param_reload();
  braid_log_reset();
}

const char* boot_slurp(const char* path) {
  static char text[1 << 18];
  FILE* f = fopen(path, "r");
  size_t n = 0;
  if (f) {
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
  }
  text[n] = '\0';
  return text;
}

int boot_count_lines(const char* text, const char* needle) {
  int n = 0;
  for (const char* line = text; line && *line;) {
    const char* end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    const char* hit = strstr(line, needle);
    if (hit && hit < line + len) n++;
    line = end ? end + 1 : NULL;
  }
  return n;
}

void boot_hello_wrong_secret(struct bootstrap_hello* h, const struct bootstrap_id_layout* id,
                             int kind, int nranks, int at, uint8_t flip, const char* host) {
  memset(h, 0, sizeof *h);
  h->magic = BOOTSTRAP_WIRE_MAGIC;
  h->version = BOOTSTRAP_WIRE_VERSION;
  h->kind = (uint8_t)kind;
  memcpy(h->secret, id->secret, sizeof h->secret);
  h->secret[at % BOOTSTRAP_SECRET_BYTES] ^= flip;
  h->rank = 1;
  h->nranks = nranks;
  h->pid = getpid();
  h->listen = id->root;
  snprintf(h->host, sizeof h->host, "%s", host);
}

/* The namespaces to remove at exit (in the parent: children leave with _exit). */
static struct boot_netns* boot_netns_made;

void boot_netns_remove(void) {
  char cmd[128];
  for (int i = 0; boot_netns_made && i < 2; i++) {
    snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null", boot_netns_made->ns[i]);
    if (system(cmd) != 0) fprintf(stderr, "note: %s failed\n", cmd);
  }
  boot_netns_made = NULL;
}

const char* boot_netns_unavailable(void) {
  if (geteuid() != 0) return "network namespaces need root";
  if (system("ip -V >/dev/null 2>&1") != 0) return "no `ip` command";
  return NULL;
}

int boot_netns_setup(struct boot_netns* n, const char* ns_prefix, const char* dev_prefix,
                     int subnet) {
  int id = (int)getpid() % 100000, net = 1 + (int)getpid() % 250;
  char cmd[1024];
  for (int i = 0; i < 2; i++) {
    snprintf(n->ns[i], sizeof n->ns[i], "%s%c%d", ns_prefix, "AB"[i], id);
    snprintf(n->dev[i], sizeof n->dev[i], "%s%c%d", dev_prefix, "ab"[i], id);
    snprintf(n->addr[i], sizeof n->addr[i], "10.%d.%d.%d", subnet, net, i + 1);
  }
  boot_netns_made = n;
  atexit(boot_netns_remove);
  snprintf(cmd, sizeof cmd,
           "ip netns add %1$s && ip netns add %2$s && "
           "ip link add %3$s netns %1$s type veth peer name %4$s netns %2$s && "
           "ip -n %1$s addr add %5$s/24 dev %3$s && ip -n %2$s addr add %6$s/24 dev %4$s && "
           "ip -n %1$s link set %3$s up && ip -n %2$s link set %4$s up && "
           /* Traffic to a namespace's own address goes through its loopback, down by default. */
           "ip -n %1$s link set lo up && ip -n %2$s link set lo up",
           n->ns[0], n->ns[1], n->dev[0], n->dev[1], n->addr[0], n->addr[1]);
  return system(cmd) == 0 ? 0 : -1;
}

int boot_netns_enter(const struct boot_netns* n, int side) {
  char path[96];
  snprintf(path, sizeof path, "/var/run/netns/%s", n->ns[side]);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  int rc = fd >= 0 && setns(fd, CLONE_NEWNET) == 0 ? 0 : -1;
  if (rc != 0) fprintf(stderr, "cannot enter %s\n", path);
  if (fd >= 0) close(fd);
  return rc;
}
