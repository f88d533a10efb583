/*
 * The IB backend through the tests' verbs provider (tests/ibfake), where it can show what the
 * conformance suite cannot: failures of a queue pair must reach the user as errors that name
 * the peer and the problem; the attributes the backend gives its queue pairs (read back from
 * the provider's log); and the reasons it gives when no device is usable. BRAID_IB_VERBS_LIB
 * names the provider (CTest sets it).
 *
 *   remaccess  the receiver deregisters the buffer of a posted receive: the sender's write is
 *              refused ("remote access error", naming the receiver), and the receiver's queue
 *              pair, in the error state too, fails its receive ("Work Request Flushed Error",
 *              naming the sender's host and saying that the queue pair is in the error state)
 *   retry      after one message the receiver's NIC stops answering (the provider drops what
 *              arrives): the sender's next write fails once its retries are spent ("transport
 *              retry counter exceeded", naming the receiver), after retry_cnt + 1 timeouts
 *   attrs      two ranks whose ports have different MTUs (2048, 4096) connect and exchange: one
 *              queue pair per connection, path MTU 2048 on both, GID index 1 and the peer's GID,
 *              the peer's QPN, hop limit 255, timeout 20, retry_cnt 7, rnr_retry 7, access local
 *              write and remote read/write; no verbs call refused, no queue pair in error
 *   memlock    registrations count against a 64 KiB RLIMIT_MEMLOCK: registering 1 MiB fails
 *              with the advice to raise the limit
 *   killsend, killrecv
 *              the sender (killsend) or the receiver (killrecv) is killed once the first of
 *              31 messages of 16 MiB is through; the survivor's 32nd, which nothing
 *              matches, fails within seconds of the death, with an error naming the dead
 *              peer (its host; for the sender, the receiver's address)
 *   mtudrop    the sender's port comes back with a 1024-byte MTU after the backend read 4096:
 *              moving its queue pair to RTR is refused, the connect fails naming the receiver,
 *              RTR and the port's new MTU (not the GID setting), and the receiver, left waiting
 *              for "ready", gets an error naming the sender's host; the provider logged the
 *              refusal (path MTU above the port's)
 *   gidgone    the GID the receiver's backend chose is deleted before a connection comes: its
 *              RTR is refused, the accept fails naming the sender, the emptied GID entry and
 *              the GID setting, and the sender's connect fails naming the receiver and carrying
 *              the receiver's reason (its refusal), not a guess at a wrong key or an exit
 *   cqoverflow the receiver's completion queue holds 4 entries (IBFAKE_CQ_ENTRIES) and 64
 *              completions arrive unpolled: the receiver's next test fails ("polling the
 *              completion queue") naming the sender's host, within seconds
 *   rnr        the receiver's NIC answers the first 5 writes with immediate "receiver not ready"
 *              (IBFAKE_RNR): the backend's rnr_retry lets the sender resend them, all 8 messages
 *              arrive intact, and the log shows the 5 refusals and the 5 resends
 *   gdr        device memory: with no peer memory module, registering GPU memory is refused with
 *              the documented advice (nvidia-peermem or dma-buf); memory the process cannot read
 *              is refused ("Bad address"); a dma-buf (a memfd standing in for a GPU's) is
 *              registered, a 1 MiB message lands in it, and the flush (an RDMA read through a
 *              queue pair connected to itself) completes; the log shows that queue pair
 *   knobs, ibdefault, rocedefault
 *              the IB parameters reach the verbs calls (the provider's log and its count of
 *              posted writes): knobs sets timeout 14, retry count 5, 2 queue pairs, adaptive
 *              routing on, and, on the sender only, traffic class 106 (as NCCL_IB_TC) and SL 3,
 *              which the receiver's queue pairs adopt; ibdefault is InfiniBand with relaxed
 *              ordering off (no GRH, adaptive routing on by default: a 64 KiB message is a
 *              plain write and a separate write with immediate); rocedefault is RoCE's defaults
 *              (adaptive routing off, relaxed ordering on through ibv_reg_mr_iova2); both bytes
 *              and sizes of the messages are checked
 *   qps2, qps4 22 messages of 0 to 1 MiB + 13 bytes (odd sizes, sizes around the pieces'
 *              alignment), 6 in flight, striped over 2 or 4 queue pairs (4: with adaptive
 *              routing above 1000 bytes): sizes, bytes and the byte after each are checked
 *   qpsmismatch
 *              receiver 2 queue pairs, sender 1: the accept fails giving both counts and the
 *              setting, the connect fails saying the receiver refused, and why
 *   disable    NCCL_IB_DISABLE=1: no device, the reason says so, and the default network is Socket
 *   portdown, gidindex, nolib
 *              a port that is down, BRAID_IB_GID_INDEX naming no GID, BRAID_IB_VERBS_LIB naming
 *              no library: no device, and the reason says which
 *
 *   net_ibfake_test ib_<case>
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "base/socket.h"
#include "base/utils.h"
#include "boot_util.h"
#include "mp_runner.h"
#include "net_util.h"
#include "test.h"

#define WAIT_SEC 20.0

enum { F_LISTENING = 0, F_POSTED = 1, F_STEP = 2, F_DONE = 3, F_CHECKED = 4 };

/* The IB backend's handle: magic, version, the listener's address (net_ib_verbs.h). */
struct ib_handle_head {
  uint32_t magic, version;
  union braid_sockaddr addr;
};

static int open_ib(const struct braid_net_ops** ops) {
  int ndev = 0;
  test_failures = 0;
  return net_util_open("ib", ops, &ndev);
}

/* The listener's address as the sender's messages name it, and its host alone. */
static void listener_text(const struct net_shared* sh, char* addr, size_t size, char* host,
                          size_t hsize) {
  struct ib_handle_head h;
  memcpy(&h, sh->handle[0], sizeof h);
  socket_addr_str(&h.addr, addr, size);
  snprintf(host, hsize, "%s", addr);
  char* colon = strrchr(host, ':');
  if (colon) *colon = '\0';
}

/* Listens (child 0) or connects (child 1): the comm, or NULL. */
static void* pair_up(const struct mp_child* c, const struct braid_net_ops* ops, void** lcomm) {
  struct net_shared* sh = c->arg;
  void* comm = NULL;
  *lcomm = NULL;
  if (c->index == 0) {
    TEST_EXPECT_RES(ops->listen(0, sh->key, sh->handle[0], lcomm), ncclSuccess);
    if (*lcomm == NULL) return NULL;
    boot_set_flag(&sh->flags[F_LISTENING], 1);
    TEST_EXPECT_RES(net_util_accept(ops, *lcomm, &comm, WAIT_SEC), ncclSuccess);
  } else if (boot_wait_flag(&sh->flags[F_LISTENING], 1, WAIT_SEC) == 0) {
    TEST_EXPECT_RES(net_util_connect(ops, 0, sh->key, sh->handle[0], &comm, WAIT_SEC), ncclSuccess);
  }
  return comm;
}

/* Waits for `req` to fail; returns the error's text (braid_err_last) or NULL, and the time. */
static const char* wait_error(const struct braid_net_ops* ops, void* req, double sec,
                              double* took) {
  double start = boot_now();
  ncclResult_t res = net_util_wait(ops, req, NULL, sec);
  *took = boot_now() - start;
  TEST_CHECK(res != ncclSuccess && res != NET_UTIL_TIMEOUT_RES, "test() returned %d after %.1f s, "
             "expected an error", (int)res, *took);
  return res != ncclSuccess && res != NET_UTIL_TIMEOUT_RES ? braid_err_last() : NULL;
}

static void expect_text(const char* msg, const char* want, const char* what) {
  TEST_CHECK(msg && strstr(msg, want), "%s: \"%s\" does not say \"%s\"", what, msg ? msg : "",
             want);
}

/* A function the provider exports for tests (ibfake.h), or NULL. */
static void* provider_fn(const char* name) {
  void* lib = dlopen(getenv("BRAID_IB_VERBS_LIB"), RTLD_NOW | RTLD_NOLOAD);
  void* fn = lib ? dlsym(lib, name) : NULL;
  TEST_CHECK(fn != NULL, "the verbs provider has no %s", name);
  return fn;
}

/* The text of a failed call (braid_err_last), or NULL after checking that it failed. */
static const char* failed_text(ncclResult_t res, const char* what) {
  TEST_CHECK(res != ncclSuccess && res != NET_UTIL_TIMEOUT_RES, "%s returned %d, expected an error",
             what, (int)res);
  return res != ncclSuccess && res != NET_UTIL_TIMEOUT_RES ? braid_err_last() : NULL;
}

/* -------------------------------------------------------------- remaccess */

static int remaccess_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l, *comm = pair_up(c, ops, &l), *req = NULL;
  char addr[80], host[80];
  double took;
  if (comm == NULL) return 1;
  listener_text(sh, addr, sizeof addr, host, sizeof host);
  if (c->index == 0) {
    uint64_t* buf = calloc(1, 64);
    void* mh = NULL;
    TEST_EXPECT_RES(ops->reg_mr(comm, buf, 64, 0, &mh), ncclSuccess);
    for (double end = boot_now() + WAIT_SEC; req == NULL && boot_now() < end;)
      TEST_EXPECT_RES(ops->irecv(comm, buf, 64, mh, &req), ncclSuccess);
    ops->dereg_mr(comm, mh); /* the clear-to-send the sender holds names it still */
    boot_set_flag(&sh->flags[F_POSTED], 1);
    const char* msg = req ? wait_error(ops, req, WAIT_SEC, &took) : NULL;
    fprintf(stderr, "receiver: %s\n", msg ? msg : "(no error)");
    expect_text(msg, host, "the receiver's error names the sender's host");
    expect_text(msg, "Flushed", "the receiver's error says its work was flushed");
    expect_text(msg, "queue pair is in the error state", "the receiver's error explains it");
    boot_set_flag(&sh->flags[F_CHECKED], 1);
    free(buf);
  } else {
    uint64_t word = 42;
    boot_wait_flag(&sh->flags[F_POSTED], 1, WAIT_SEC);
    TEST_EXPECT_RES(net_util_post(ops, comm, 1, &word, sizeof word, &req, WAIT_SEC), ncclSuccess);
    const char* msg = req ? wait_error(ops, req, WAIT_SEC, &took) : NULL;
    fprintf(stderr, "sender: %s\n", msg ? msg : "(no error)");
    expect_text(msg, addr, "the sender's error names the receiver");
    expect_text(msg, "remote access error", "the sender's error names the problem");
    expect_text(msg, "registration", "the sender's error explains it");
    boot_wait_flag(&sh->flags[F_CHECKED], 1, WAIT_SEC); /* an abort would end the receiver's wait */
  }
  net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  return test_failures ? 1 : 0;
}

/* ------------------------------------------------------------------ retry */

static int retry_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l, *comm = pair_up(c, ops, &l), *req[2] = {NULL, NULL};
  uint64_t word[2] = {0, 0};
  char addr[80], host[80];
  double took;
  if (comm == NULL) return 1;
  listener_text(sh, addr, sizeof addr, host, sizeof host);
  if (c->index == 0) {
    void (*set_drop)(int) = (void (*)(int))provider_fn("ibfake_set_drop");
    for (int i = 0; i < 2; i++)
      TEST_EXPECT_RES(net_util_post(ops, comm, 0, &word[i], 8, &req[i], WAIT_SEC), ncclSuccess);
    if (req[0]) TEST_EXPECT_RES(net_util_wait(ops, req[0], NULL, WAIT_SEC), ncclSuccess);
    if (set_drop) set_drop(1); /* from now on, nothing that arrives is answered */
    boot_set_flag(&sh->flags[F_STEP], 1);
    boot_wait_flag(&sh->flags[F_CHECKED], 1, WAIT_SEC);
    /* The sender's comm failed, so it closes without a goodbye: this receive fails too. */
    const char* msg = req[1] ? wait_error(ops, req[1], WAIT_SEC, &took) : NULL;
    fprintf(stderr, "receiver: %s\n", msg ? msg : "(no error)");
  } else {
    for (int i = 0; i < 2; i++) {
      word[i] = 100 + (uint64_t)i;
      if (i == 1) boot_wait_flag(&sh->flags[F_STEP], 1, WAIT_SEC);
      TEST_EXPECT_RES(net_util_post(ops, comm, 1, &word[i], 8, &req[i], WAIT_SEC), ncclSuccess);
    }
    if (req[0]) TEST_EXPECT_RES(net_util_wait(ops, req[0], NULL, WAIT_SEC), ncclSuccess);
    const char* msg = req[1] ? wait_error(ops, req[1], WAIT_SEC, &took) : NULL;
    fprintf(stderr, "sender, after %.2f s: %s\n", took, msg ? msg : "(no error)");
    expect_text(msg, addr, "the sender's error names the receiver");
    expect_text(msg, "transport retry counter exceeded", "the sender's error names the problem");
    expect_text(msg, "stopped answering", "the sender's error explains it");
    /* timeout 20 is 4.3 s a try on a real port; the provider scales it to 0.27 s (8 tries). */
    TEST_CHECK(took > 1.0 && took < 12.0, "the retries took %.2f s, expected about 2.1 s", took);
    boot_set_flag(&sh->flags[F_CHECKED], 1);
  }
  net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  return test_failures ? 1 : 0;
}

/* ---------------------------------------------------------------- memlock */

static int memlock_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  struct rlimit lim = {64 << 10, 64 << 10};
  if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0) TEST_SKIP("cannot lower RLIMIT_MEMLOCK");
  setenv("IBFAKE_MEMLOCK", "1", 1); /* the provider counts registrations against the limit */
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l, *comm = pair_up(c, ops, &l), *mh = NULL;
  char* buf = malloc(1 << 20);
  if (comm == NULL || buf == NULL) return 1;
  ncclResult_t res = ops->reg_mr(comm, buf, 1 << 20, 0, &mh);
  TEST_CHECK(res != ncclSuccess && mh == NULL, "registering 1 MiB under a 64 KiB limit: %d",
             (int)res);
  fprintf(stderr, "%s\n", braid_err_last());
  expect_text(braid_err_last(), "locked-memory limit is 64 KiB", "the error gives the limit");
  expect_text(braid_err_last(), "ulimit -l unlimited", "the error says how to raise it");
  if (mh) ops->dereg_mr(comm, mh);
  free(buf);
  boot_add_flag(&sh->flags[F_DONE], 1);
  boot_wait_flag(&sh->flags[F_DONE], 2, WAIT_SEC);
  net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  return test_failures ? 1 : 0;
}

/* ------------------------------------------------------------------ attrs */

static int attrs_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  setenv("IBFAKE_MTU", c->index == 0 ? "2048" : "4096", 1);
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l, *comm = pair_up(c, ops, &l), *req = NULL;
  uint64_t word = 7;
  if (comm == NULL) return 1;
  TEST_EXPECT_RES(net_util_post(ops, comm, c->index, &word, sizeof word, &req, WAIT_SEC),
                  ncclSuccess);
  if (req) TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
  boot_add_flag(&sh->flags[F_DONE], 1);
  boot_wait_flag(&sh->flags[F_DONE], 2, WAIT_SEC);
  net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  return test_failures ? 1 : 0;
}

/* The number after " key=" in a log line (hex with 0x), or -1. */
static long log_num(const char* line, const char* key) {
  char pat[40];
  snprintf(pat, sizeof pat, " %s=", key);
  const char* at = strstr(line, pat);
  return at ? strtol(at + strlen(pat), NULL, 0) : -1;
}

/* The word after " key=" in a log line, or "". */
static void log_word(const char* line, const char* key, char* out, size_t size) {
  char pat[40];
  snprintf(pat, sizeof pat, " %s=", key);
  const char* at = strstr(line, pat);
  at = at ? at + strlen(pat) : "";
  snprintf(out, size, "%.*s", (int)strcspn(at, " \n"), at);
}

struct attrs_side {
  long pid, qpn;
  char addr[48];
  int creates, inits, rtrs, rtss;
};

/* Reads the provider's log of the attrs case and checks each rank's queue pairs. */
static void attrs_check(const char* path) {
  struct attrs_side side[2];
  char line[1024];
  int nside = 0;
  FILE* f = fopen(path, "r");
  TEST_CHECK(f != NULL, "no log at %s", path);
  if (f == NULL) return;
  memset(side, 0, sizeof side);
  while (fgets(line, sizeof line, f)) { /* who is who: addresses and queue pair numbers */
    long pid = 0;
    if (sscanf(line, "pid=%ld", &pid) != 1) continue;
    int k = nside > 0 && side[0].pid == pid ? 0 : nside > 1 && side[1].pid == pid ? 1 : -1;
    if (k < 0 && nside < 2) side[k = nside++].pid = pid;
    if (k < 0) continue;
    if (strstr(line, " open ")) log_word(line, "key", side[k].addr, sizeof side[k].addr);
    if (strstr(line, " create ")) side[k].qpn = log_num(line, "qp"), side[k].creates++;
  }
  TEST_CHECK(nside == 2, "%d processes in the log, expected 2", nside);
  rewind(f);
  while (nside == 2 && fgets(line, sizeof line, f)) {
    long pid = 0;
    char dest[48];
    if (sscanf(line, "pid=%ld", &pid) != 1) continue;
    struct attrs_side *me = &side[side[1].pid == pid], *peer = &side[side[1].pid != pid];
    TEST_CHECK(!strstr(line, "refused") && !strstr(line, " ERR "), "the provider logged: %s", line);
    if (strstr(line, " INIT ")) {
      me->inits++;
      TEST_CHECK(log_num(line, "port") == 1 && log_num(line, "access") == 7, "INIT: %s", line);
    } else if (strstr(line, " RTR ")) {
      me->rtrs++;
      log_word(line, "dest", dest, sizeof dest);
      TEST_CHECK(log_num(line, "path_mtu") == 4, "RTR: path MTU is not 2048 (4): %s", line);
      TEST_CHECK(log_num(line, "is_global") == 1 && log_num(line, "sgid_index") == 1 &&
                 log_num(line, "hop_limit") == 255, "RTR: GRH: %s", line);
      TEST_CHECK(log_num(line, "traffic_class") == 0 && log_num(line, "sl") == 0, "RTR: TC, SL: %s",
                 line);
      TEST_CHECK(log_num(line, "dest_qp") == peer->qpn && strcmp(dest, peer->addr) == 0,
                 "RTR: not the peer's QPN 0x%lx and GID %s: %s", peer->qpn, peer->addr, line);
    } else if (strstr(line, " RTS ")) {
      me->rtss++;
      TEST_CHECK(log_num(line, "timeout") == 20 && log_num(line, "retry_cnt") == 7 &&
                 log_num(line, "rnr_retry") == 7, "RTS: %s", line);
    }
  }
  for (int k = 0; k < nside; k++) {
    TEST_CHECK(
        side[k].creates == 1 && side[k].inits == 1 && side[k].rtrs == 1 && side[k].rtss == 1,
        "process %ld: %d QPs created, %d INIT, %d RTR, %d RTS; expected one QP per connection",
        side[k].pid, side[k].creates, side[k].inits, side[k].rtrs, side[k].rtss);
    fprintf(stderr, "process %ld: %s, QP 0x%lx: %d created, %d INIT, %d RTR, %d RTS\n", side[k].pid,
            side[k].addr, side[k].qpn, side[k].creates, side[k].inits, side[k].rtrs, side[k].rtss);
  }
  fclose(f);
}

/* ------------------------------------------------------- killsend, killrecv */

#define BIG_BYTES ((size_t)16 << 20)
#define NBIG 32 /* as many as the backend takes: most of 512 MiB is on its way at the death */

/* Runs `body` in a grandchild that kills itself (a crash: no close, no goodbye); 0 if it did. */
static int run_victim(const struct mp_child* c, int (*body)(const struct mp_child*)) {
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) _exit(body(c));
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 1;
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) return 0;
  fprintf(stderr, "the victim did not reach its end (status 0x%x)\n", status);
  return 1;
}

/*
 * Posts `n` messages of BIG_BYTES from or into `buf` (one registration) into req[0..n-1];
 * returns the number posted, stopping at the first failure (its result in *res).
 */
static int post_big(const struct braid_net_ops* ops, void* comm, int is_send, char* buf, void** req,
                    int n, ncclResult_t* res) {
  int i = 0;
  *res = ncclSuccess;
  for (; i < n; i++) {
    req[i] = NULL;
    *res = net_util_post(ops, comm, is_send, buf, BIG_BYTES, &req[i], WAIT_SEC);
    if (*res == ncclSuccess && req[i] == NULL) *res = ncclInternalError;
    if (*res != ncclSuccess) break;
  }
  return i;
}

/*
 * The victim: posts NBIG - 1 messages and dies once the first is through, the others on their
 * way. The survivor's NBIG-th message has no partner, so it cannot complete whatever the
 * speed of the transfer: it must fail.
 */
static int kill_victim(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  ncclResult_t res;
  if (open_ib(&ops) != 0) return 1;
  void *l, *comm = pair_up(c, ops, &l), *req[NBIG];
  char* buf = calloc(1, BIG_BYTES);
  if (comm == NULL || buf == NULL) return 1;
  if (c->index == 1) boot_wait_flag(&sh->flags[F_POSTED], 1, WAIT_SEC); /* the receives */
  if (post_big(ops, comm, c->index, buf, req, NBIG - 1, &res) != NBIG - 1) return 1;
  if (c->index == 0) boot_set_flag(&sh->flags[F_POSTED], 1);
  int first = 0, last = 0;
  for (double end = boot_now() + WAIT_SEC; !first && boot_now() < end;)
    if (ops->test(req[0], &first, NULL) != ncclSuccess) return 1;
  ops->test(req[NBIG - 2], &last, NULL);
  if (last) fprintf(stderr, "victim: all %d messages were through before it died\n", NBIG - 1);
  boot_set_flag(&sh->flags[F_DONE], 1);
  raise(SIGKILL);
  return 1;
}

/*
 * The survivor: posts the NBIG - 1 messages the victim matches, then, once the victim is
 * about to die, one more; that one (its post or its request) must fail soon after the death,
 * naming the dead peer.
 */
static int kill_child(const struct mp_child* c, int victim) {
  struct net_shared* sh = c->arg;
  if (c->index == victim) return run_victim(c, kill_victim);
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l, *comm = pair_up(c, ops, &l), *req[NBIG];
  char *buf = calloc(1, BIG_BYTES), addr[80], host[80];
  const char* msg = NULL;
  double took = 0;
  ncclResult_t res;
  if (comm == NULL || buf == NULL) return 1;
  listener_text(sh, addr, sizeof addr, host, sizeof host);
  if (c->index == 1) boot_wait_flag(&sh->flags[F_POSTED], 1, WAIT_SEC);
  int n = post_big(ops, comm, c->index, buf, req, NBIG - 1, &res);
  if (c->index == 0) boot_set_flag(&sh->flags[F_POSTED], 1);
  boot_wait_flag(&sh->flags[F_DONE], 1, WAIT_SEC); /* the victim is about to die */
  double start = boot_now();
  if (n == NBIG - 1) n += post_big(ops, comm, c->index, buf, &req[NBIG - 1], 1, &res);
  if (n < NBIG) /* a post failed: the death was seen there */
    msg = failed_text(res, "a post while the peer died");
  else
    msg = wait_error(ops, req[NBIG - 1], WAIT_SEC, &took);
  took = boot_now() - start; /* from the death's flag, the last post included */
  fprintf(stderr, "%s, %.2f s after the %s died: %s\n", c->index ? "sender" : "receiver", took,
          victim ? "sender" : "receiver", msg ? msg : "(no error)");
  expect_text(msg, c->index ? addr : host, "the error names the dead peer");
  TEST_CHECK(took < 5.0, "the error came %.2f s after the death", took);
  net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  free(buf);
  return test_failures ? 1 : 0;
}

static int killsend_child(const struct mp_child* c) { return kill_child(c, 1); }
static int killrecv_child(const struct mp_child* c) { return kill_child(c, 0); }

/* -------------------------------------------------------- mtudrop, gidgone */

/* A connection that one side's port change makes fail: the errors on both sides. */
static int refused_child(const struct mp_child* c, int gid) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l = NULL, *comm = NULL, *req = NULL;
  char addr[80], host[80];
  uint64_t word = 0;
  double start;
  if (c->index == 0) {
    if (gid) { /* the GID the backend chose (index 1, ibfake.h) is deleted */
      int (*del_gid)(int, int) = (int (*)(int, int))provider_fn("ibfake_del_gid");
      TEST_CHECK(del_gid && del_gid(0, 1) == 0, "deleting GID index 1");
    }
    TEST_EXPECT_RES(ops->listen(0, sh->key, sh->handle[0], &l), ncclSuccess);
    if (l == NULL) return 1;
    listener_text(sh, addr, sizeof addr, host, sizeof host);
    boot_set_flag(&sh->flags[F_LISTENING], 1);
    start = boot_now();
    ncclResult_t res = net_util_accept(ops, l, &comm, WAIT_SEC);
    if (gid) { /* our RTR is refused */
      const char* msg = failed_text(res, "accept");
      fprintf(stderr, "receiver, after %.2f s: %s\n", boot_now() - start, msg ? msg : "(no error)");
      expect_text(msg, host, "the accept's error names the sender's host");
      expect_text(msg, "(RTR)", "the accept's error names the transition");
      expect_text(msg, "BRAID_IB_GID_INDEX", "the accept's error names the setting");
      expect_text(msg, "GID index 1 of this port is now empty", "the accept's error says why");
    } else { /* we connected; the sender failed: our receive fails once it has closed */
      TEST_CHECK(res == ncclSuccess && comm != NULL, "accept returned %d", (int)res);
      start = boot_now();
      const char* msg =
          comm ? failed_text(net_util_post(ops, comm, 0, &word, sizeof word, &req, WAIT_SEC),
                             "a receive from the failed sender")
               : NULL;
      fprintf(stderr, "receiver, after %.2f s: %s\n", boot_now() - start, msg ? msg : "(no error)");
      expect_text(msg, host, "the receiver's error names the sender's host");
      TEST_CHECK(boot_now() - start < 5.0, "the receiver's error took %.2f s", boot_now() - start);
    }
  } else {
    if (!gid) { /* the port comes back with a smaller MTU than the backend read at init */
      int (*set_mtu)(int, int) = (int (*)(int, int))provider_fn("ibfake_set_mtu");
      TEST_CHECK(set_mtu && set_mtu(0, 1024) == 0, "setting the MTU to 1024");
    }
    if (boot_wait_flag(&sh->flags[F_LISTENING], 1, WAIT_SEC) != 0) return 1;
    listener_text(sh, addr, sizeof addr, host, sizeof host);
    start = boot_now();
    const char* msg = failed_text(net_util_connect(ops, 0, sh->key, sh->handle[0], &comm, WAIT_SEC),
                                  "connect");
    fprintf(stderr, "sender, after %.2f s: %s\n", boot_now() - start, msg ? msg : "(no error)");
    expect_text(msg, addr, "the connect's error names the receiver");
    expect_text(msg, gid ? "refused the connection" : "(RTR)",
                "the connect's error says where it failed");
    /* The receiver's refusal carries its own RTR failure, not a guess about keys or exits. */
    expect_text(msg, gid ? "GID index 1 of this port is now empty" : "the port's MTU is now 1024",
                "the connect's error gives the reason");
    if (!gid) expect_text(msg, "Invalid argument", "the connect's error gives the reason");
  }
  boot_add_flag(&sh->flags[F_DONE], 1);
  boot_wait_flag(&sh->flags[F_DONE], 2, WAIT_SEC);
  if (comm) net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  return test_failures ? 1 : 0;
}

static int mtudrop_child(const struct mp_child* c) { return refused_child(c, 0); }
static int gidgone_child(const struct mp_child* c) { return refused_child(c, 1); }

/* ------------------------------------------------------------- cqoverflow */

static int cqoverflow_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  if (c->index == 0) setenv("IBFAKE_CQ_ENTRIES", "4", 1);
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l, *comm = pair_up(c, ops, &l), *req[64] = {NULL};
  uint64_t words[64];
  char addr[80], host[80];
  const char* msg = NULL;
  struct braid_net_props props;
  if (comm == NULL || ops->get_properties(0, &props) != ncclSuccess) return 1;
  const int n = BRAID_MIN(props.max_requests, 64); /* as many in flight as the backend takes */
  listener_text(sh, addr, sizeof addr, host, sizeof host);
  memset(words, 0, sizeof words);
  if (c->index == 0) {
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < n && res == ncclSuccess; i++) /* each posts a clear-to-send */
      res = net_util_post(ops, comm, 0, &words[i], 8, &req[i], WAIT_SEC);
    boot_set_flag(&sh->flags[F_POSTED], 1);
    if (res != ncclSuccess) { /* the CQ overflowed already (this process was slow) */
      msg = failed_text(res, "posting a receive");
    } else {
      boot_wait_flag(&sh->flags[F_STEP], 1, WAIT_SEC); /* every message was sent */
      mp_sleep(0.3); /* completions pile up unpolled */
      double took;
      msg = wait_error(ops, req[0], WAIT_SEC, &took);
      TEST_CHECK(took < 5.0, "the error took %.2f s", took);
    }
    fprintf(stderr, "receiver: %s\n", msg ? msg : "(no error)");
    expect_text(msg, "completion queue", "the error names the completion queue");
    expect_text(msg, host, "the error names the sender's host");
    boot_set_flag(&sh->flags[F_CHECKED], 1);
  } else {
    boot_wait_flag(&sh->flags[F_POSTED], 1, WAIT_SEC);
    for (int i = 0; i < n; i++) { /* the receiver's failure may end this early */
      words[i] = 1000 + (uint64_t)i;
      if (net_util_post(ops, comm, 1, &words[i], 8, &req[i], 5.0) != ncclSuccess || !req[i]) break;
      net_util_wait(ops, req[i], NULL, 5.0);
    }
    boot_set_flag(&sh->flags[F_STEP], 1);
    boot_wait_flag(&sh->flags[F_CHECKED], 1, WAIT_SEC);
  }
  net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  return test_failures ? 1 : 0;
}

/* -------------------------------------------------------------------- rnr */

#define RNR_FORCED 5
#define RNR_MSGS 8

static int rnr_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const size_t stride = 64 << 10;
  char num[16];
  snprintf(num, sizeof num, "%d", RNR_FORCED);
  if (c->index == 0) setenv("IBFAKE_RNR", num, 1);
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l, *comm = pair_up(c, ops, &l);
  char* buf = calloc(RNR_MSGS, stride);
  if (comm == NULL || buf == NULL) return 1;
  for (int i = 0; i < RNR_MSGS; i++) {
    void* req = NULL;
    size_t size = stride - 1000 * (size_t)i - (size_t)i, got = 0; /* odd sizes */
    if (c->index) net_util_fill(buf + i * stride, size, 500 + (uint64_t)i);
    TEST_EXPECT_RES(net_util_post(ops, comm, c->index, buf + i * stride, c->index ? size : stride,
                                  &req, WAIT_SEC),
                    ncclSuccess);
    if (req) TEST_EXPECT_RES(net_util_wait(ops, req, &got, WAIT_SEC), ncclSuccess);
    if (c->index == 0) {
      TEST_CHECK(got == size, "message %d: %zu bytes, expected %zu", i, got, size);
      TEST_CHECK(net_util_check(buf + i * stride, size, 500 + (uint64_t)i) == 0,
                 "message %d's bytes", i);
    }
  }
  boot_add_flag(&sh->flags[F_DONE], 1);
  boot_wait_flag(&sh->flags[F_DONE], 2, WAIT_SEC);
  net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  free(buf);
  return test_failures ? 1 : 0;
}

/* Lines of the log that contain `text`. */
static int log_count(const char* path, const char* text) {
  char line[1024];
  int n = 0;
  FILE* f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f)) n += strstr(line, text) != NULL;
  if (f) fclose(f);
  return n;
}

static void rnr_check(const char* path) {
  int refused = log_count(path, "receiver not ready"), resent = log_count(path, ": resending");
  fprintf(stderr, "log: %d receiver-not-ready answers, %d resends\n", refused, resent);
  TEST_CHECK(refused == RNR_FORCED && resent == RNR_FORCED,
             "%d RNR answers and %d resends, expected %d", refused, resent, RNR_FORCED);
  TEST_CHECK(log_count(path, " ERR ") == 0 && log_count(path, "refused") == 0,
             "an error in the log");
}

/* -------------------------------------------------------------------- gdr */

#define GDR_BYTES ((size_t)1 << 20)

static void gdr_refusals(const struct braid_net_ops* ops, void* comm) {
  struct braid_net_props props;
  void* mh = NULL;
  TEST_EXPECT_RES(ops->get_properties(0, &props), ncclSuccess);
  fprintf(stderr, "ptr_support 0x%x\n", props.ptr_support);
  TEST_CHECK(props.ptr_support & BRAID_NET_PTR_DMABUF,
             "the provider has ibv_reg_dmabuf_mr: dma-buf");
  /* GPU memory without a peer memory module: the documented refusal (net.c then uses a dma-buf,
     or stages through host memory). Where nvidia-peermem is loaded there is nothing to see. */
  if (!(props.ptr_support & BRAID_NET_PTR_CUDA)) {
    char host_buf[64];
    ncclResult_t res = ops->reg_mr(comm, host_buf, sizeof host_buf, 1, &mh);
    TEST_CHECK(res == ncclInvalidUsage && mh == NULL, "registering GPU memory: %d", (int)res);
    fprintf(stderr, "GPU memory without peer memory: %s\n", braid_err_last());
    expect_text(braid_err_last(), "nvidia-peermem", "the refusal says what is missing");
    expect_text(braid_err_last(), "dma-buf", "the refusal names the other way");
  }
  /* Memory the process cannot read (as a GPU's is to a NIC without peer memory). */
  void* none = mmap(NULL, 65536, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TEST_CHECK(none != MAP_FAILED, "mmap");
  if (none != MAP_FAILED) {
    mh = NULL;
    ncclResult_t res = ops->reg_mr(comm, none, 65536, 0, &mh);
    TEST_CHECK(res == ncclSystemError && mh == NULL, "registering unreadable memory: %d", (int)res);
    fprintf(stderr, "unreadable memory: %s\n", braid_err_last());
    expect_text(braid_err_last(), "Bad address", "the refusal gives the reason");
    if (mh) ops->dereg_mr(comm, mh);
    munmap(none, 65536);
  }
}

static int gdr_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l, *comm = pair_up(c, ops, &l), *req = NULL;
  if (comm == NULL) return 1;
  if (c->index == 1) {
    char* buf = malloc(GDR_BYTES);
    if (buf == NULL) return 1;
    net_util_fill(buf, GDR_BYTES, 77);
    TEST_EXPECT_RES(net_util_post(ops, comm, 1, buf, GDR_BYTES, &req, WAIT_SEC), ncclSuccess);
    if (req) TEST_EXPECT_RES(net_util_wait(ops, req, NULL, WAIT_SEC), ncclSuccess);
    boot_wait_flag(&sh->flags[F_CHECKED], 1, WAIT_SEC);
    net_util_close(ops, comm, 1);
    free(buf);
    return test_failures ? 1 : 0;
  }
  gdr_refusals(ops, comm);
  /* A dma-buf: here a memfd, which the provider maps as a NIC maps a GPU's dma-buf. */
  int fd = memfd_create("ibfake-gdr", MFD_CLOEXEC);
  char* gbuf = MAP_FAILED;
  void *gmh = NULL, *flush = NULL;
  size_t got = 0;
  if (fd >= 0 && ftruncate(fd, (off_t)GDR_BYTES) == 0)
    gbuf = mmap(NULL, GDR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  TEST_CHECK(gbuf != MAP_FAILED, "a memfd of 1 MiB");
  if (gbuf != MAP_FAILED) {
    TEST_EXPECT_RES(ops->reg_mr_dmabuf(comm, gbuf, GDR_BYTES, 0, fd, &gmh), ncclSuccess);
    for (double end = boot_now() + WAIT_SEC; gmh && req == NULL && boot_now() < end;)
      TEST_EXPECT_RES(ops->irecv(comm, gbuf, GDR_BYTES, gmh, &req), ncclSuccess);
    if (req) TEST_EXPECT_RES(net_util_wait(ops, req, &got, WAIT_SEC), ncclSuccess);
    TEST_CHECK(got == GDR_BYTES && net_util_check(gbuf, GDR_BYTES, 77) == 0,
               "the message in the dma-buf: %zu bytes, %zu wrong", got,
               net_util_check(gbuf, GDR_BYTES, 77));
    if (gmh) TEST_EXPECT_RES(ops->iflush(comm, gbuf, got, gmh, &flush), ncclSuccess);
    TEST_CHECK(flush != NULL, "a receive into a dma-buf is flushed (a request)");
    if (flush) TEST_EXPECT_RES(net_util_wait(ops, flush, NULL, WAIT_SEC), ncclSuccess);
    if (gmh) ops->dereg_mr(comm, gmh);
    munmap(gbuf, GDR_BYTES);
  }
  if (fd >= 0) close(fd);
  boot_set_flag(&sh->flags[F_CHECKED], 1);
  net_util_close(ops, comm, 0);
  if (l) ops->close_listen(l);
  return test_failures ? 1 : 0;
}

/* The receiver made a dma-buf registration and a second queue pair connected to itself (the
   flush's: its own QPN and its own address); no queue pair went to the error state. */
static void gdr_check(const char* path) {
  char line[1024], own[2][48] = {"", ""};
  long pid[2] = {0, 0};
  int self = 0;
  FILE* f = fopen(path, "r");
  TEST_CHECK(f != NULL, "no log at %s", path);
  while (f && fgets(line, sizeof line, f)) { /* each process's address */
    long p = 0;
    if (sscanf(line, "pid=%ld", &p) != 1 || !strstr(line, " open ")) continue;
    int k = pid[0] == 0 || pid[0] == p ? 0 : 1;
    pid[k] = p;
    log_word(line, "key", own[k], sizeof own[k]);
  }
  if (f) rewind(f);
  while (f && fgets(line, sizeof line, f)) {
    char dest[48];
    long p = 0;
    if (sscanf(line, "pid=%ld", &p) != 1 || !strstr(line, " RTR ")) continue;
    log_word(line, "dest", dest, sizeof dest);
    self += log_num(line, "qp") == log_num(line, "dest_qp") && strcmp(dest, own[pid[1] == p]) == 0;
  }
  if (f) fclose(f);
  fprintf(stderr, "log: %d queue pair(s) connected to themselves\n", self);
  TEST_CHECK(self == 1, "%d queue pairs connected to themselves, expected 1 (the flush's)", self);
  TEST_CHECK(log_count(path, "reg_dmabuf_mr fd=") == 1, "no dma-buf registration in the log");
  TEST_CHECK(log_count(path, " ERR ") == 0, "a queue pair in the error state");
}

/* ------------------------------------------------------------------ knobs */

/* One setting of the IB parameters, what the provider must have seen, and the sender's writes. */
struct knob_case {
  const char* name;
  const char* both[6]; /* NAME=VALUE for both ranks */
  const char* sender[3]; /* NAME=VALUE for the sender only: the receiver must adopt its TC, SL */
  const char* link;     /* IBFAKE_LINK_LAYER */
  int timeout, retry_cnt, tc, sl, nqps, is_global, relaxed;
  long plain_writes;    /* RDMA writes without immediate for the 64 KiB message */
};

static const struct knob_case knob_cases[] = {
  /* RoCE, every knob set; TC through its NCCL name */
  {"knobs", {"BRAID_IB_TIMEOUT=14", "BRAID_IB_RETRY_CNT=5", "BRAID_IB_QPS_PER_CONNECTION=2",
             "BRAID_IB_ADAPTIVE_ROUTING=1", NULL},
   {"NCCL_IB_TC=106", "BRAID_IB_SL=3", NULL}, "roce", 14, 5, 106, 3, 2, 1, 1, 2},
  /* InfiniBand defaults (adaptive routing on), relaxed ordering off */
  {"ibdefault", {"BRAID_IB_PCI_RELAXED_ORDERING=0", NULL}, {NULL}, "ib", 20, 7, 0, 0, 1, 0, 0, 1},
  /* RoCE defaults: adaptive routing off, relaxed ordering on (the provider has reg_mr_iova2) */
  {"rocedefault", {NULL}, {NULL}, "roce", 20, 7, 0, 0, 1, 1, 1, 0},
};
static const struct knob_case* knob_now;
/* rdma-core's enum ibv_wr_opcode values (this test does not include verbs.h). */
#define WR_WRITE 0
#define WR_WRITE_IMM 1

static void knob_env(const char* const* list) {
  for (int i = 0; list[i]; i++) {
    char name[64];
    const char* eq = strchr(list[i], '=');
    snprintf(name, sizeof name, "%.*s", (int)(eq - list[i]), list[i]);
    boot_env(name, eq + 1);
  }
}

#define KNOB_BIG ((size_t)64 << 10)
#define KNOB_SMALL ((size_t)100)

static int knob_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  const struct knob_case* k = knob_now;
  setenv("IBFAKE_LINK_LAYER", k->link, 1);
  knob_env(k->both);
  if (c->index == 1) knob_env(k->sender);
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l, *comm = pair_up(c, ops, &l);
  char *big = calloc(1, KNOB_BIG), small[KNOB_SMALL];
  const size_t sizes[2] = {KNOB_BIG, KNOB_SMALL};
  char* bufs[2] = {big, small};
  if (comm == NULL || big == NULL) return 1;
  long (*posted)(int) = (long (*)(int))provider_fn("ibfake_posted");
  long before[2] = {posted ? posted(WR_WRITE) : 0, posted ? posted(WR_WRITE_IMM) : 0};
  for (int i = 0; i < 2; i++) {
    void* req = NULL;
    size_t got = 0;
    if (c->index) net_util_fill(bufs[i], sizes[i], 40 + (uint64_t)i);
    TEST_EXPECT_RES(net_util_post(ops, comm, c->index, bufs[i], sizes[i], &req, WAIT_SEC), ncclSuccess);
    if (req) TEST_EXPECT_RES(net_util_wait(ops, req, &got, WAIT_SEC), ncclSuccess);
    if (c->index == 0)
      TEST_CHECK(got == sizes[i] && net_util_check(bufs[i], sizes[i], 40 + (uint64_t)i) == 0,
                 "message %d: %zu bytes of %zu, %zu wrong", i, got, sizes[i],
                 net_util_check(bufs[i], sizes[i], 40 + (uint64_t)i));
  }
  if (c->index == 1 && posted) {
    long plain = posted(WR_WRITE) - before[0], imm = posted(WR_WRITE_IMM) - before[1];
    fprintf(stderr, "sender: %ld RDMA writes, %ld writes with immediate\n", plain, imm);
    TEST_CHECK(plain == k->plain_writes, "%ld plain RDMA writes, expected %ld", plain, k->plain_writes);
    TEST_CHECK(imm == 2L * k->nqps, "%ld writes with immediate, expected %d (one per queue pair "
               "and message)", imm, 2 * k->nqps);
  }
  boot_add_flag(&sh->flags[F_DONE], 1);
  boot_wait_flag(&sh->flags[F_DONE], 2, WAIT_SEC);
  net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  free(big);
  return test_failures ? 1 : 0;
}

/* The provider's log: every queue pair got the knobs, and the data registrations their access. */
static void knob_check(const char* path) {
  const struct knob_case* k = knob_now;
  char line[1024];
  long pid[2] = {0, 0};
  int creates[2] = {0, 0}, rtr = 0, rts = 0, data_regs = 0;
  FILE* f = fopen(path, "r");
  TEST_CHECK(f != NULL, "no log at %s", path);
  while (f && fgets(line, sizeof line, f)) {
    long p = 0;
    if (sscanf(line, "pid=%ld", &p) != 1) continue;
    int side = pid[0] == 0 || pid[0] == p ? 0 : 1;
    pid[side] = p;
    TEST_CHECK(!strstr(line, "refused") && !strstr(line, " ERR "), "the provider logged: %s", line);
    if (strstr(line, " create ")) creates[side]++;
    if (strstr(line, " RTR ")) {
      rtr++;
      TEST_CHECK(log_num(line, "traffic_class") == (k->is_global ? k->tc : 0) &&
                 log_num(line, "sl") == k->sl && log_num(line, "is_global") == k->is_global,
                 "RTR: expected traffic class %d, SL %d, is_global %d: %s", k->tc, k->sl,
                 k->is_global, line);
    }
    if (strstr(line, " RTS ")) {
      rts++;
      TEST_CHECK(log_num(line, "timeout") == k->timeout && log_num(line, "retry_cnt") == k->retry_cnt,
                 "RTS: expected timeout %d, retry_cnt %d: %s", k->timeout, k->retry_cnt, line);
    }
    if (strstr(line, " length=65536 ") || strstr(line, " length=100 ")) { /* the messages' */
      data_regs++;
      long access = log_num(line, "access");
      TEST_CHECK((strstr(line, " reg_mr_iova2 ") != NULL) == k->relaxed &&
                 access == (k->relaxed ? 0x100007 : 0x7),
                 "a data registration %s relaxed ordering: %s", k->relaxed ? "without" : "with", line);
    }
  }
  if (f) fclose(f);
  fprintf(stderr, "log: %d and %d queue pairs created, %d RTR, %d RTS, %d data registrations\n",
          creates[0], creates[1], rtr, rts, data_regs);
  TEST_CHECK(creates[0] == k->nqps && creates[1] == k->nqps, "%d and %d queue pairs, expected %d "
             "a side", creates[0], creates[1], k->nqps);
  TEST_CHECK(rtr == 2 * k->nqps && rts == 2 * k->nqps, "%d RTR and %d RTS transitions", rtr, rts);
  TEST_CHECK(data_regs == 4, "%d data registrations in the log, expected 4", data_regs);
}

/* ------------------------------------------------------------ qps2, qps4 */

static int qps_now;

/* Sizes that end inside, at and around the pieces' 128-byte alignment, odd ones, and large. */
static const size_t qps_sizes[] = {0, 1, 7, 127, 128, 129, 255, 256, 257, 383, 511, 513, 1000,
                                   4095, 4097, 8191, 8193, 65533, 65536, 100003, 1048589, 3};
#define QPS_STRIDE ((size_t)1 << 21)
#define QPS_INFLIGHT 6

static int qps_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  char num[8];
  const int n = (int)BRAID_ARRAY_LEN(qps_sizes);
  snprintf(num, sizeof num, "%d", qps_now);
  boot_env("BRAID_IB_QPS_PER_CONNECTION", num);
  if (qps_now == 4) { /* the adaptive-routing path too: data then a separate immediate */
    boot_env("BRAID_IB_ADAPTIVE_ROUTING", "1");
    boot_env("BRAID_IB_AR_THRESHOLD", "1000");
  }
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l, *comm = pair_up(c, ops, &l), *req[QPS_INFLIGHT] = {NULL};
  char* buf = malloc(QPS_STRIDE * QPS_INFLIGHT);
  if (comm == NULL || buf == NULL) return 1;
  /* Messages go QPS_INFLIGHT at a time, each in its own slot, so that several are in flight. */
  for (int base = 0; base < n; base += QPS_INFLIGHT) {
    int m = BRAID_MIN(QPS_INFLIGHT, n - base);
    for (int i = 0; i < m; i++) {
      size_t size = qps_sizes[base + i];
      char* at = buf + (size_t)i * QPS_STRIDE;
      if (c->index) net_util_fill(at, size, 900 + (uint64_t)(base + i));
      else memset(at, 0xee, QPS_STRIDE);
      TEST_EXPECT_RES(net_util_post(ops, comm, c->index, at, c->index ? size : QPS_STRIDE - 64,
                                    &req[i], WAIT_SEC), ncclSuccess);
    }
    for (int i = 0; i < m; i++) {
      size_t size = qps_sizes[base + i], got = 0;
      char* at = buf + (size_t)i * QPS_STRIDE;
      if (req[i]) TEST_EXPECT_RES(net_util_wait(ops, req[i], &got, WAIT_SEC), ncclSuccess);
      if (c->index) continue;
      TEST_CHECK(got == size, "message %d: %zu bytes, expected %zu", base + i, got, size);
      TEST_CHECK(net_util_check(at, size, 900 + (uint64_t)(base + i)) == 0,
                 "message %d (%zu bytes): %zu bytes wrong", base + i, size,
                 net_util_check(at, size, 900 + (uint64_t)(base + i)));
      TEST_CHECK((unsigned char)at[size] == 0xee, "message %d wrote past its %zu bytes", base + i,
                 size);
    }
  }
  boot_add_flag(&sh->flags[F_DONE], 1);
  boot_wait_flag(&sh->flags[F_DONE], 2, WAIT_SEC);
  net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  free(buf);
  return test_failures ? 1 : 0;
}

static int qps2_child(const struct mp_child* c) { return qps_child(c); }
static int qps4_child(const struct mp_child* c) { return qps_child(c); }

/* ------------------------------------------------------------ qpsmismatch */

/* The receiver uses 2 queue pairs a connection, the sender 1: both ends refuse, saying why. */
static int qpsmismatch_child(const struct mp_child* c) {
  struct net_shared* sh = c->arg;
  boot_env("BRAID_IB_QPS_PER_CONNECTION", c->index == 0 ? "2" : "1");
  const struct braid_net_ops* ops;
  int rc = open_ib(&ops);
  if (rc) return rc;
  void *l = NULL, *comm = NULL;
  if (c->index == 0) {
    TEST_EXPECT_RES(ops->listen(0, sh->key, sh->handle[0], &l), ncclSuccess);
    if (l == NULL) return 1;
    boot_set_flag(&sh->flags[F_LISTENING], 1);
    const char* msg = failed_text(net_util_accept(ops, l, &comm, WAIT_SEC), "accept");
    fprintf(stderr, "receiver: %s\n", msg ? msg : "(no error)");
    expect_text(msg, "uses 1 queue pair per connection and this process 2",
                "the accept's error gives both counts");
    expect_text(msg, "BRAID_IB_QPS_PER_CONNECTION", "the accept's error names the setting");
  } else if (boot_wait_flag(&sh->flags[F_LISTENING], 1, WAIT_SEC) == 0) {
    char addr[80], host[80];
    listener_text(sh, addr, sizeof addr, host, sizeof host);
    const char* msg = failed_text(net_util_connect(ops, 0, sh->key, sh->handle[0], &comm, WAIT_SEC),
                                  "connect");
    fprintf(stderr, "sender: %s\n", msg ? msg : "(no error)");
    expect_text(msg, addr, "the connect's error names the receiver");
    expect_text(msg, "refused the connection", "the connect's error says it was refused");
    expect_text(msg, "NCCL_IB_QPS_PER_CONNECTION", "the connect's error names the setting");
    expect_text(msg, "the receiver uses 2 queue pairs per connection and this sender 1",
                "the connect's error gives both counts");
  }
  boot_add_flag(&sh->flags[F_DONE], 1);
  boot_wait_flag(&sh->flags[F_DONE], 2, WAIT_SEC);
  if (comm) net_util_close(ops, comm, c->index);
  if (l) ops->close_listen(l);
  return test_failures ? 1 : 0;
}

/* -------------------------------------------------------------- no device */

/* One process: the backend finds no usable device, and says why. */
static int no_device_case(const char* name) {
  const struct braid_net_ops* ops = net_backend_find("ib");
  const char *want = NULL, *want2 = NULL;
  char why[512] = "";
  int ndev = -1;
  if (ops == NULL) TEST_SKIP("no IB backend in this build");
  if (strcmp(name, "portdown") == 0) {
    setenv("IBFAKE_PORT_STATE", "down", 1);
    want = "ibfake0:1: port is DOWN";
  } else if (strcmp(name, "disable") == 0) {
    boot_env("NCCL_IB_DISABLE", "1");
    want = "disabled (BRAID_IB_DISABLE / NCCL_IB_DISABLE is 1)";
  } else if (strcmp(name, "gidindex") == 0) {
    boot_env("BRAID_IB_GID_INDEX", "5");
    want = "BRAID_IB_GID_INDEX=5 names no valid GID";
  } else {
    boot_env("BRAID_IB_VERBS_LIB", "/nonexistent/libverbs-test.so");
    want = "/nonexistent/libverbs-test.so not found";
    want2 = "BRAID_IB_VERBS_LIB";
  }
  TEST_EXPECT_RES(ops->init(&ndev, why, sizeof why), ncclSuccess);
  fprintf(stderr, "%d devices: %s\n", ndev, why);
  TEST_CHECK(ndev == 0, "%d devices", ndev);
  expect_text(why, want, "the reason");
  if (want2) expect_text(why, want2, "the reason");
  if (strcmp(name, "disable") == 0) { /* the default network is then the next one */
    const struct braid_net_ops* chosen = NULL;
    boot_env("BRAID_SOCKET_IFNAME", "lo");
    TEST_EXPECT_RES(net_backend_select(&chosen, &ndev), ncclSuccess);
    TEST_CHECK(chosen && strcmp(chosen->name, "Socket") == 0, "the default network is %s",
               chosen ? chosen->name : "(none)");
  }
  return test_summary();
}

/* ------------------------------------------------------------------- main */

static void mtudrop_check(const char* path) {
  int n = log_count(path, "path_mtu above the port's active MTU");
  TEST_CHECK(n == 1, "%d refusals of the path MTU in the log, expected 1", n);
}

static void gidgone_check(const char* path) {
  int n = log_count(path, "sgid_index names an empty GID table entry");
  TEST_CHECK(n == 1, "%d refusals of the source GID in the log, expected 1", n);
}

int main(int argc, char** argv) {
  static const struct {
    const char* name;
    mp_child_fn fn;
    void (*check)(const char* log); /* reads the provider's log after the run */
  } cases[] = {{"remaccess", remaccess_child, NULL},
               {"retry", retry_child, NULL},
               {"attrs", attrs_child, attrs_check},
               {"memlock", memlock_child, NULL},
               {"killsend", killsend_child, NULL},
               {"killrecv", killrecv_child, NULL},
               {"mtudrop", mtudrop_child, mtudrop_check},
               {"gidgone", gidgone_child, gidgone_check},
               {"cqoverflow", cqoverflow_child, NULL},
               {"rnr", rnr_child, rnr_check},
               {"gdr", gdr_child, gdr_check},
               {"knobs", knob_child, knob_check},
               {"ibdefault", knob_child, knob_check},
               {"rocedefault", knob_child, knob_check},
               {"qps2", qps2_child, NULL},
               {"qps4", qps4_child, NULL},
               {"qpsmismatch", qpsmismatch_child, NULL},
               {"disable", NULL, NULL},
               {"portdown", NULL, NULL},
               {"gidindex", NULL, NULL},
               {"nolib", NULL, NULL}};
  const char* arg = argc > 1 ? argv[1] : "";
  if (strncmp(arg, "ib_", 3) != 0) {
    fprintf(stderr, "usage: %s ib_<case>, a case of:", argv[0]);
    for (size_t i = 0; i < BRAID_ARRAY_LEN(cases); i++) fprintf(stderr, " %s", cases[i].name);
    fprintf(stderr, "\n");
    return 2;
  }
  if (getenv("BRAID_IB_VERBS_LIB") == NULL)
    TEST_SKIP("BRAID_IB_VERBS_LIB does not name the tests' verbs provider (tests/ibfake)");
  for (size_t i = 0; i < BRAID_ARRAY_LEN(cases); i++) {
    if (strcmp(arg + 3, cases[i].name) != 0) continue;
    if (cases[i].fn == NULL) return no_device_case(cases[i].name);
    for (size_t k = 0; k < BRAID_ARRAY_LEN(knob_cases); k++)
      if (strcmp(cases[i].name, knob_cases[k].name) == 0) knob_now = &knob_cases[k];
    qps_now = strcmp(cases[i].name, "qps2") == 0 ? 2 : 4;
    char log[64] = "";
    if (cases[i].check) {
      snprintf(log, sizeof log, "/tmp/braid-ibfake-%s-%d.log", cases[i].name, (int)getpid());
      unlink(log);
      setenv("IBFAKE_LOG", log, 1);
    }
    struct net_shared* sh = mp_shared_alloc(sizeof *sh);
    braid_random_bytes(sh->key, sizeof sh->key);
    struct mp_opts opts = {.name = arg, .nprocs = 2, .timeout_sec = 45, .arg = sh};
    int rc = mp_run(&opts, cases[i].fn);
    mp_shared_free(sh, sizeof *sh);
    test_failures = 0;
    if (log[0] && rc == MP_PASSED) cases[i].check(log);
    if (log[0]) unlink(log);
    return mp_verdict_exit(rc, test_failures);
  }
  fprintf(stderr, "%s: unknown case %s\n", argv[0], arg);
  return 2;
}
