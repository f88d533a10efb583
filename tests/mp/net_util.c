/*
 * Helpers of the net backend tests (see net_util.h).
 */
#include "net_util.h"

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot_util.h"
#include "base/error.h"
#include "base/param.h"
#include "mp_runner.h"

#define NET_SKIP 77

int net_util_open(const char* name, const struct braid_net_ops** ops, int* ndev) {
  char why[256] = "";
  *ops = net_backend_find(name);
  *ndev = 0;
  if (*ops == NULL) {
    fprintf(stderr, "SKIP: no backend called %s in this build\n", name);
    return NET_SKIP;
  }
  if (strcmp(name, "ofi") == 0 && braid_param_str(BRAID_P_OFI_PROVIDER) == NULL)
    boot_env("BRAID_OFI_PROVIDER", "tcp;ofi_rxm");
  if ((*ops)->init(ndev, why, sizeof why) != ncclSuccess || *ndev == 0) {
    fprintf(stderr, "SKIP: the %s backend cannot run here: %s\n", (*ops)->name, why);
    return NET_SKIP;
  }
  return 0;
}

ncclResult_t net_util_connect(const struct braid_net_ops* ops, int dev, const uint8_t* key,
                              const void* handle, void** comm, double timeout_sec) {
  return net_util_connect_timed(ops, dev, key, handle, comm, timeout_sec, NULL);
}

ncclResult_t net_util_connect_timed(const struct braid_net_ops* ops, int dev, const uint8_t* key,
                                    const void* handle, void** comm, double timeout_sec,
                                    double* longest_call) {
  double end = boot_now() + timeout_sec;
  void* state = NULL; /* the connect's progress: ours, never in the handle */
  if (longest_call) *longest_call = 0;
  for (;;) {
    double start = boot_now();
    ncclResult_t res = ops->connect(dev, key, handle, &state, comm);
    double took = boot_now() - start;
    if (longest_call && took > *longest_call) *longest_call = took;
    if (res != ncclSuccess || *comm) {
      if (state != NULL) { /* the backend must have released it */
        fprintf(stderr, "net_util_connect: connect returned with its state still set\n");
        ops->connect_abandon(state);
        return ncclInternalError;
      }
      return res;
    }
    if (boot_now() > end) {
      ops->connect_abandon(state);
      return NET_UTIL_TIMEOUT_RES;
    }
    mp_sleep(0.0005);
  }
}

ncclResult_t net_util_accept(const struct braid_net_ops* ops, void* listen_comm, void** comm,
                             double timeout_sec) {
  double end = boot_now() + timeout_sec;
  for (;;) {
    ncclResult_t res = ops->accept(listen_comm, comm);
    if (res != ncclSuccess || *comm) return res;
    if (boot_now() > end) return NET_UTIL_TIMEOUT_RES;
    mp_sleep(0.0005);
  }
}

/* The registrations net_util_mh made (a child's own: each child is its own process). */
static struct {
  void* comm;
  char *lo, *hi;
  void* mh;
} net_util_regs[64];

void* net_util_mh(const struct braid_net_ops* ops, void* comm, void* data, size_t size) {
  char *lo = data, *hi = lo + (size ? size : 1);
  int slot = -1;
  for (int i = 0; i < (int)(sizeof net_util_regs / sizeof net_util_regs[0]); i++) {
    if (net_util_regs[i].comm == comm && net_util_regs[i].lo <= lo && hi <= net_util_regs[i].hi)
      return net_util_regs[i].mh;
    if (net_util_regs[i].comm == NULL && slot < 0) slot = i;
  }
  void* mh = NULL;
  if (slot < 0) {
    fprintf(stderr, "net_util_mh: more registrations than the table holds\n");
    return NULL;
  }
  if (ops->reg_mr(comm, data, (size_t)(hi - lo), 0, &mh) != ncclSuccess) {
    fprintf(stderr, "net_util_mh: registering %zu bytes failed: %s\n", (size_t)(hi - lo),
            braid_err_last());
    return NULL;
  }
  net_util_regs[slot].comm = comm;
  net_util_regs[slot].lo = lo;
  net_util_regs[slot].hi = hi;
  net_util_regs[slot].mh = mh;
  return mh;
}

void net_util_close(const struct braid_net_ops* ops, void* comm, int is_send) {
  for (int i = 0; i < (int)(sizeof net_util_regs / sizeof net_util_regs[0]); i++) {
    if (comm == NULL || net_util_regs[i].comm != comm) continue;
    if (net_util_regs[i].mh) ops->dereg_mr(comm, net_util_regs[i].mh);
    net_util_regs[i].comm = NULL;
  }
  if (comm) (is_send ? ops->close_send : ops->close_recv)(comm);
}

ncclResult_t net_util_post(const struct braid_net_ops* ops, void* comm, int is_send, void* data,
                           size_t size, void** req, double timeout_sec) {
  double end = boot_now() + timeout_sec;
  void* mh = net_util_mh(ops, comm, data, size);
  for (;;) {
    ncclResult_t res = is_send ? ops->isend(comm, data, size, mh, req)
                               : ops->irecv(comm, data, size, mh, req);
    if (res != ncclSuccess || *req) return res;
    if (boot_now() > end) return NET_UTIL_TIMEOUT_RES;
  }
}

ncclResult_t net_util_wait(const struct braid_net_ops* ops, void* req, size_t* size,
                           double timeout_sec) {
  double end = boot_now() + timeout_sec;
  for (;;) {
    int done = 0;
    ncclResult_t res = ops->test(req, &done, size);
    if (res != ncclSuccess || done) return res;
    if (boot_now() > end) return NET_UTIL_TIMEOUT_RES;
    sched_yield();
  }
}

static uint64_t net_util_word(uint64_t seed, size_t index) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + index * 0xbf58476d1ce4e5b9ULL + 1;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 29);
}

void net_util_fill(void* buf, size_t size, uint64_t seed) {
  unsigned char* p = buf;
  size_t words = size / 8;
  for (size_t i = 0; i < words; i++) {
    uint64_t w = net_util_word(seed, i);
    memcpy(p + 8 * i, &w, 8);
  }
  uint64_t last = net_util_word(seed, words);
  memcpy(p + 8 * words, &last, size - 8 * words);
}

size_t net_util_check(const void* buf, size_t size, uint64_t seed) {
  const unsigned char* p = buf;
  size_t words = size / 8, bad = 0;
  for (size_t i = 0; i < words; i++) {
    uint64_t w = net_util_word(seed, i);
    bad += memcmp(p + 8 * i, &w, 8) != 0;
  }
  uint64_t last = net_util_word(seed, words);
  bad += memcmp(p + 8 * words, &last, size - 8 * words) != 0;
  return bad;
}

/* ------------------------------------------------------------- netns */

int net_util_netns_setup(struct net_shared* sh) {
  int id = (int)getpid() % 100000, net = 1 + (int)getpid() % 250;
  char cmd[1024];
  snprintf(sh->ns[0], sizeof sh->ns[0], "braidNA%d", id);
  snprintf(sh->ns[1], sizeof sh->ns[1], "braidNB%d", id);
  snprintf(sh->addr[0], sizeof sh->addr[0], "10.214.%d.1", net);
  snprintf(sh->addr[1], sizeof sh->addr[1], "10.214.%d.2", net);
  snprintf(sh->ifname[0], sizeof sh->ifname[0], "nva%d", id);
  snprintf(sh->ifname[1], sizeof sh->ifname[1], "nvb%d", id);
  snprintf(cmd, sizeof cmd,
           "ip netns add %1$s && ip netns add %2$s && "
           "ip link add %5$s netns %1$s type veth peer name %6$s netns %2$s && "
           "ip -n %1$s addr add %3$s/24 dev %5$s && ip -n %2$s addr add %4$s/24 dev %6$s && "
           "ip -n %1$s link set %5$s up && ip -n %2$s link set %6$s up && "
           "ip -n %1$s link set lo up && ip -n %2$s link set lo up",
           sh->ns[0], sh->ns[1], sh->addr[0], sh->addr[1], sh->ifname[0], sh->ifname[1]);
  if (system(cmd) != 0) return -1;
  /* Some users of interfaces (libfabric's tcp provider) skip a link without carrier yet. */
  snprintf(cmd, sizeof cmd,
           "for i in $(seq 100); do ip -n %s link show %s | grep -q LOWER_UP && "
           "ip -n %s link show %s | grep -q LOWER_UP && exit 0; sleep 0.05; done; exit 1",
           sh->ns[0], sh->ifname[0], sh->ns[1], sh->ifname[1]);
  return system(cmd) == 0 ? 0 : -1;
}

void net_util_netns_cleanup(struct net_shared* sh) {
  char cmd[128];
  for (int i = 0; i < 2; i++) {
    if (sh->ns[i][0] == '\0') continue;
    snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null", sh->ns[i]);
    if (system(cmd) != 0) fprintf(stderr, "note: %s failed\n", cmd);
    sh->ns[i][0] = '\0';
  }
}

int net_util_netns_enter(const struct net_shared* sh, int side) {
  char path[96];
  snprintf(path, sizeof path, "/var/run/netns/%s", sh->ns[side]);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  if (rc != 0) return -1;
  char spec[32];
  snprintf(spec, sizeof spec, "=%s", sh->ifname[side]);
  boot_env("BRAID_SOCKET_IFNAME", spec);
  boot_env("FI_TCP_IFACE", sh->ifname[side]);
  return 0;
}
