/*
 * The bootstrap when things go wrong, with several processes on loopback:
 *
 *   secret     a rogue process connects to the root and to a rank's listener
 *              with a wrong secret, garbage, nothing at all, and as a stale
 *              job; each connection is refused, each listener logs one WARN
 *              for the burst naming the first address, and the job completes
 *              undisturbed
 *   timeout    ranks that never start: the others fail after
 *              BRAID_BOOTSTRAP_TIMEOUT with ncclSystemError naming them
 *   abort      the abort flag ends a wait in init; bootstrap_abort ends a
 *              recv; a peer that closes ends a recv waiting on it
 *   duplicate  two processes claim one rank: ncclInvalidArgument naming both,
 *              for every rank (a JOIN with another nranks: bootstrap_guard_test)
 *
 *   bootstrap_fault_test secret | timeout | abort | duplicate
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot_util.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_internal.h"
#include "base/error.h"
#include "base/socket.h"
#include "base/utils.h"
#include "mp_runner.h"
#include "test.h"

#define SECRET_RANKS 4
#define ROGUE_ADDRS 8
#define MAX_CHILDREN 8

static void child_reset(const char* timeout) {
  test_failures = 0;
  test_checks = 0;
  boot_loopback(timeout);
}

static int child_result(void) { return test_failures ? 1 : 0; }

/* ------------------------------------------------------------ secret */

struct secret_shared {
  struct boot_id_slot slot;
  int phase; /* 1: root attacked; 2: rank 0's listener published; 3: rogue done */
  union braid_sockaddr rank0;
  int naddrs;
  char addrs[ROGUE_ADDRS][64]; /* the rogue's refused connections, as their victims see them */
  char log_path[256];
};

/* A rogue connection to `to`; records its address as the victim will log it. */
static int rogue_connect(const union braid_sockaddr* to, struct secret_shared* sh) {
  int fd = -1;
  union braid_sockaddr self;
  socklen_t len = sizeof self;
  if (socket_connect(to, 3.0, NULL, &fd) != ncclSuccess) return -1;
  if (getsockname(fd, &self.sa, &len) == 0 && sh->naddrs < ROGUE_ADDRS)
    socket_addr_str(&self, sh->addrs[sh->naddrs++], sizeof sh->addrs[0]);
  return fd;
}

/* Whether the other side closes `fd` (end of file or reset) within `sec`. */
static int rogue_closed_within(int fd, double sec) {
  double end = boot_now() + sec;
  while (fd >= 0 && boot_now() < end) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, 50);
    char buf[256];
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 1;
  }
  return 0;
}

/* Sends a hello of `kind` that is right in every way but the secret; refused if closed in time. */
static void rogue_wrong_secret(const union braid_sockaddr* to, const struct bootstrap_id_layout* id,
                               int kind, struct secret_shared* sh) {
  struct bootstrap_hello h;
  boot_hello_wrong_secret(&h, id, kind, SECRET_RANKS, 5, 0x5a, "rogue");
  int fd = rogue_connect(to, sh);
  TEST_CHECK(fd >= 0 && send(fd, &h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h, "rogue hello not sent");
  TEST_CHECK(rogue_closed_within(fd, 3.0), "a hello with a wrong secret was not refused (kind %d)", kind);
  socket_close(&fd);
}

/* Wrong secret, garbage, a scanner's connect-and-close; returns a silent connection left open. */
static int rogue_attack(const union braid_sockaddr* to, const struct bootstrap_id_layout* id, int kind,
                        struct secret_shared* sh) {
  rogue_wrong_secret(to, id, kind, sh);
  unsigned char junk[200];
  braid_random_bytes(junk, sizeof junk);
  int fd = rogue_connect(to, sh);
  TEST_CHECK(fd >= 0 && send(fd, junk, sizeof junk, MSG_NOSIGNAL) > 0, "garbage not sent");
  TEST_CHECK(rogue_closed_within(fd, 3.0), "garbage was not refused");
  socket_close(&fd);
  fd = rogue_connect(to, sh);
  socket_close(&fd);
  return rogue_connect(to, sh);
}

/* A stale job: same root, another secret, through the library itself. */
static void rogue_stale_job(const struct bootstrap_id_layout* id) {
  struct bootstrap_id_layout forged = *id;
  ncclUniqueId fake;
  struct bootstrap* b = NULL;
  forged.secret[0] ^= 1;
  forged.check = (uint32_t)braid_hash(&forged, offsetof(struct bootstrap_id_layout, check));
  memcpy(&fake, &forged, sizeof fake);
  double t0 = boot_now();
  ncclResult_t res = bootstrap_init(&fake, 1, 2, SECRET_RANKS, NULL, &b);
  TEST_CHECK(res != ncclSuccess && b == NULL, "a stale job's rank joined (%d)", (int)res);
  TEST_CHECK(boot_now() - t0 < 6.0, "the stale rank waited %.1f s to be refused", boot_now() - t0);
  bootstrap_close(b);
}

static int secret_rogue(struct secret_shared* sh) {
  struct bootstrap_id_layout id;
  union braid_sockaddr root;
  TEST_CHECK(boot_wait_flag(&sh->slot.state, 1, 20.0) == 0, "no id");
  memcpy(&id, &sh->slot.id, sizeof id);
  TEST_CHECK(bootstrap_wire_addr_unpack(&id.root, &root) == 0, "id without root");
  int silent_root = rogue_attack(&root, &id, BOOTSTRAP_HELLO_JOIN, sh);
  rogue_stale_job(&id);
  boot_set_flag(&sh->phase, 1);
  TEST_CHECK(boot_wait_flag(&sh->phase, 2, 20.0) == 0, "rank 0 never published its listener");
  int silent_rank = rogue_attack(&sh->rank0, &id, BOOTSTRAP_HELLO_PEER, sh);
  /* The root ends once everyone joined; rank 0 drops its silent visitor after the hello limit. */
  TEST_CHECK(rogue_closed_within(silent_root, 3.0), "the root kept a silent connection");
  TEST_CHECK(rogue_closed_within(silent_rank, BOOTSTRAP_HELLO_SEC + 3.0), "rank 0 kept a silent connection");
  socket_close(&silent_root);
  socket_close(&silent_rank);
  boot_set_flag(&sh->phase, 3);
  return child_result();
}

/*
 * Rank 0's log (its root's and its listener's): one WARN per listener for the burst, naming the
 * first rogue connection each refused, not one per connection.
 */
static void secret_check_log(struct secret_shared* sh) {
  const int found = access(sh->log_path, R_OK) == 0;
  TEST_CHECK(found, "no log at %s", sh->log_path);
  if (!found) return;
  const char* text = boot_slurp(sh->log_path);
  TEST_CHECK(sh->naddrs == ROGUE_ADDRS, "rogue made %d connections", sh->naddrs);
  for (int i = 0; i < sh->naddrs; i += ROGUE_ADDRS / 2) {
    char needle[96];
    snprintf(needle, sizeof needle, "rejected connection from %s:", sh->addrs[i]);
    TEST_CHECK(strstr(text, needle) != NULL, "no WARN names the rogue connection %s", sh->addrs[i]);
  }
  const int warned = boot_count_lines(text, "rejected connection from");
  TEST_CHECK(warned == 2, "%d WARN lines about rejected connections, expected one per listener",
             warned);
}

static int secret_rank(const struct mp_child* c, struct secret_shared* sh) {
  struct bootstrap* b = NULL;
  int me = c->index;
  if (me == 0) boot_log_to(sh->log_path, NULL);
  if (boot_id_share(&sh->slot, me, 20.0) != 0) return 1;
  TEST_CHECK(boot_wait_flag(&sh->phase, 1, 20.0) == 0, "the rogue never attacked the root");
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, me, SECRET_RANKS, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  if (me == 0) {
    sh->rank0 = *bootstrap_peer_addr(b, 0);
    boot_set_flag(&sh->phase, 2);
  }
  /* Keep working while the rogue visits rank 0; rank 0 says when to stop. */
  double t0 = boot_now();
  for (int it = 0;; it++) {
    int blocks[SECRET_RANKS][2];
    blocks[me][0] = it;
    blocks[me][1] = me != 0 || (__atomic_load_n(&sh->phase, __ATOMIC_ACQUIRE) < 3 && boot_now() - t0 < 25.0);
    if (bootstrap_allgather(b, blocks, sizeof blocks[0]) != ncclSuccess) {
      TEST_CHECK(0, "allgather %d failed", it);
      break;
    }
    int bad = 0;
    for (int r = 0; r < SECRET_RANKS; r++) bad += blocks[r][0] != it;
    TEST_CHECK(bad == 0, "iteration %d: %d bad blocks", it, bad);
    if (!blocks[0][1]) break;
    mp_sleep(0.002);
  }
  TEST_CHECK(__atomic_load_n(&sh->phase, __ATOMIC_ACQUIRE) == 3, "the rogue did not finish");
  TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
  TEST_CHECK(boot_ring_tags_check(b, 3) == 0, "send/recv after the attack");
  TEST_CHECK(boot_allgather_check(b, 5000, 9) == 0, "allgather after the attack");
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  if (me == 0) secret_check_log(sh);
  return child_result();
}

static int secret_child(const struct mp_child* c) {
  child_reset("20");
  struct secret_shared* sh = c->arg;
  return c->index == SECRET_RANKS ? secret_rogue(sh) : secret_rank(c, sh);
}

static int case_secret(void) {
  struct secret_shared* sh = mp_shared_alloc(sizeof *sh);
  snprintf(sh->log_path, sizeof sh->log_path, "/tmp/braid_secret_test.%d.log", (int)getpid());
  struct mp_opts opts = {.name = "secret", .nprocs = SECRET_RANKS + 1, .timeout_sec = 45, .arg = sh};
  int rc = mp_run(&opts, secret_child);
  unlink(sh->log_path);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

/* ----------------------------------------------------------- timeout */

struct timeout_shared {
  struct boot_id_slot slot;
  unsigned missing; /* bit i: child i never starts */
  char expect[128]; /* what every message must say */
};

static int timeout_child(const struct mp_child* c) {
  struct timeout_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  if (sh->missing & (1u << c->index)) return 0; /* this rank never arrives */
  child_reset("3");
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  double t0 = boot_now();
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, c->nprocs, NULL, &b), ncclSystemError);
  double dt = boot_now() - t0;
  TEST_CHECK(b == NULL, "a bootstrap came back");
  TEST_CHECK(dt >= 2.5 && dt <= 7.0, "rank %d failed after %.2f s with a 3 s timeout", c->index, dt);
  TEST_CHECK(strstr(braid_err_last(), sh->expect) != NULL && strstr(braid_err_last(), "(root ") != NULL,
             "rank %d: message \"%s\" lacks \"%s\" or the root", c->index, braid_err_last(), sh->expect);
  return child_result();
}

static int timeout_run(int nprocs, unsigned missing, const char* expect) {
  struct timeout_shared* sh = mp_shared_alloc(sizeof *sh);
  sh->missing = missing;
  snprintf(sh->expect, sizeof sh->expect, "%s", expect);
  struct mp_opts opts = {.name = "timeout", .nprocs = nprocs, .timeout_sec = 20, .arg = sh};
  int rc = mp_run(&opts, timeout_child);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

static int case_timeout(void) {
  int rc = timeout_run(4, 1u << 2, "bootstrap: rank 2 of 4 never joined within 3 s");
  rc = mp_verdict_merge(rc, timeout_run(5, (1u << 1) | (1u << 3),
                                       "bootstrap: ranks 1, 3 of 5 never joined within 3 s"));
  return rc;
}

/* ------------------------------------------------------------- abort */

struct abort_shared {
  struct boot_id_slot slot;
  int done;
  int ready; /* cut: rank 1 is out of bootstrap_init (so it reads nothing more) */
};

struct delayed_abort {
  double delay;
  volatile uint32_t* flag;  /* set this, or */
  struct bootstrap* b;      /* call bootstrap_abort on this */
};

static void* delayed_abort_main(void* arg) {
  struct delayed_abort* d = arg;
  mp_sleep(d->delay);
  if (d->flag) __atomic_store_n(d->flag, 1, __ATOMIC_RELAXED);
  if (d->b) bootstrap_abort(d->b);
  return NULL;
}

/* Rank 2 never comes; ranks 0 and 1 are aborted half a second into the wait. */
static int abort_init_child(const struct mp_child* c) {
  struct abort_shared* sh = c->arg;
  if (c->index == 2) return 0;
  child_reset("30");
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  volatile uint32_t flag = 0;
  struct delayed_abort d = {.delay = 0.5, .flag = &flag};
  struct bootstrap* b = NULL;
  pthread_t th;
  pthread_create(&th, NULL, delayed_abort_main, &d);
  double t0 = boot_now();
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, 3, &flag, &b), ncclRemoteError);
  double dt = boot_now() - t0;
  pthread_join(th, NULL);
  TEST_CHECK(b == NULL && dt < 2.0, "abort took %.2f s", dt);
  return child_result();
}

/* After init: rank 0's recv ends by bootstrap_abort; rank 1's recv ends when rank 0 closes. */
static int abort_recv_child(const struct mp_child* c) {
  struct abort_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  child_reset("30");
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, 2, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  int v = 0;
  double t0 = boot_now();
  if (c->index == 0) {
    struct delayed_abort d = {.delay = 0.3, .b = b};
    pthread_t th;
    pthread_create(&th, NULL, delayed_abort_main, &d);
    TEST_EXPECT_RES(bootstrap_recv(b, 1, 99, &v, sizeof v), ncclRemoteError);
    pthread_join(th, NULL);
    TEST_CHECK(boot_now() - t0 < 2.0, "bootstrap_abort took %.2f s", boot_now() - t0);
  } else {
    braid_err_clear();
    TEST_EXPECT_RES(bootstrap_recv(b, 0, 5, &v, sizeof v), ncclRemoteError);
    TEST_CHECK(boot_now() - t0 < 5.0, "noticing a closed peer took %.2f s", boot_now() - t0);
    TEST_CHECK(strstr(braid_err_last(), "rank 0") && strstr(braid_err_last(), "closed its connection"),
               "message: %s", braid_err_last());
  }
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return child_result();
}

static int case_abort(void) {
  int rc = boot_run("abort-init", 3, 20, sizeof(struct abort_shared), abort_init_child);
  return mp_verdict_merge(rc, boot_run("abort-recv", 2, 20, sizeof(struct abort_shared),
                                       abort_recv_child));
}

/* --------------------------------------------------------------- cut */

/*
 * A send stopped part-way by the abort flag (rank 1 reads nothing, so 64 MB cannot all go):
 * the flag then drops again, as comm_quiesce does, and the next send to rank 1 must fail
 * saying why instead of appending a frame to half of one; rank 1 sees the connection end.
 */
#define CUT_BYTES (64u << 20)

static int cut_child(const struct mp_child* c) {
  struct abort_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  volatile uint32_t flag = 0;
  child_reset("30");
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, 2, &flag, &b), ncclSuccess);
  if (b == NULL) return 1;
  if (c->index == 0) {
    char* big = calloc(1, CUT_BYTES);
    struct delayed_abort d = {.delay = 0.3, .flag = &flag};
    /* Rank 1 still inside its init would read the message into its queue as it arrives. */
    TEST_CHECK(boot_wait_flag(&sh->ready, 1, 10.0) == 0, "rank 1 never left its init");
    pthread_t th;
    int v = 7;
    pthread_create(&th, NULL, delayed_abort_main, &d);
    TEST_EXPECT_RES(bootstrap_send(b, 1, 1, big, CUT_BYTES), ncclRemoteError);
    pthread_join(th, NULL);
    __atomic_store_n(&flag, 0, __ATOMIC_RELAXED);
    braid_err_clear();
    TEST_EXPECT_RES(bootstrap_send(b, 1, 2, &v, sizeof v), ncclRemoteError);
    TEST_CHECK(strstr(braid_err_last(), "cut off mid-way") != NULL, "message: %s",
               braid_err_last());
    free(big);
    boot_add_flag(&sh->done, 1);
  } else {
    char* big = malloc(CUT_BYTES);
    boot_add_flag(&sh->ready, 1);
    TEST_CHECK(boot_wait_flag(&sh->done, 1, 10.0) == 0, "rank 0 never got through its sends");
    TEST_EXPECT_RES(bootstrap_recv(b, 0, 1, big, CUT_BYTES), ncclRemoteError);
    free(big);
  }
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return child_result();
}

static int case_cut(void) { return boot_run("cut", 2, 30, sizeof(struct abort_shared), cut_child); }

/* --------------------------------------------------------- failure notice */

/*
 * Rank 2's init fails after the bootstrap is up (bootstrap_report_failure, as comm_init_failed
 * calls it), and it stays alive: ranks 0 and 1, waiting in the next allgather, must fail at once
 * with its reason, not when it closes.
 */
static int notice_child(const struct mp_child* c) {
  struct abort_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  child_reset("30");
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, 3, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  if (c->index == 2) {
    bootstrap_report_failure(b, "BRAID_TOPO_FILE /nowhere.xml: no such file");
    TEST_CHECK(boot_wait_flag(&sh->done, 2, 20.0) == 0, "the others never gave up");
  } else {
    int data[3] = {0};
    double start = boot_now();
    TEST_EXPECT_RES(bootstrap_allgather(b, data, sizeof data[0]), ncclRemoteError);
    double took = boot_now() - start;
    const char* msg = braid_err_last();
    TEST_CHECK(took < 3.0, "rank %d gave up after %.1f s", c->index, took);
    TEST_CHECK(strstr(msg, "rank 2") && strstr(msg, "failed its initialization") &&
                   strstr(msg, "/nowhere.xml: no such file"),
               "message: %s", msg);
    fprintf(stderr, "rank %d after %.3f s: %s\n", c->index, took, msg);
    bootstrap_report_failure(b, msg); /* as comm_init_failed does: passes rank 2's notice on */
    boot_add_flag(&sh->done, 1);
  }
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return child_result();
}

/*
 * After every rank's init is through (bootstrap_init_done), a failure concerns its own rank:
 * rank 2's report sends nothing, and the next allgather of all three works.
 */
static int notice_late_child(const struct mp_child* c) {
  struct abort_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  int data[3] = {0};
  child_reset("30");
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, 3, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  bootstrap_init_done(b);
  if (c->index == 2) bootstrap_report_failure(b, "a failure after init");
  data[c->index] = 10 + c->index;
  TEST_EXPECT_RES(bootstrap_allgather(b, data, sizeof data[0]), ncclSuccess);
  TEST_CHECK(data[0] == 10 && data[1] == 11 && data[2] == 12, "allgather: %d %d %d", data[0],
             data[1], data[2]);
  TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return child_result();
}

static int case_notice_late(void) {
  return boot_run("notice_late", 3, 40, sizeof(struct abort_shared), notice_late_child);
}

static int case_notice(void) {
  return boot_run("notice", 3, 40, sizeof(struct abort_shared), notice_child);
}

/* --------------------------------------------------------- duplicate */

struct dup_shared {
  struct boot_id_slot slot;
  int rank_of[MAX_CHILDREN];
  int nranks_of[MAX_CHILDREN];
  int pids[MAX_CHILDREN];
  int arrived;
  int answered;
  char expect[96];
  int name_pids[2]; /* children whose pids the message must name, -1 for none */
};

static int dup_child(const struct mp_child* c) {
  struct dup_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  child_reset("20");
  sh->pids[c->index] = getpid();
  boot_add_flag(&sh->arrived, 1);
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  boot_wait_flag(&sh->arrived, c->nprocs, 10.0);
  double t0 = boot_now();
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, sh->rank_of[c->index], sh->nranks_of[c->index], NULL, &b),
                  ncclInvalidArgument);
  TEST_CHECK(b == NULL && boot_now() - t0 < 5.0, "refusal took %.2f s", boot_now() - t0);
  const char* msg = braid_err_last();
  TEST_CHECK(strstr(msg, sh->expect) != NULL, "child %d: \"%s\" lacks \"%s\"", c->index, msg, sh->expect);
  for (int i = 0; i < 2; i++) {
    char pid[32];
    snprintf(pid, sizeof pid, "pid %d ", sh->pids[sh->name_pids[i]]);
    TEST_CHECK(strstr(msg, pid) != NULL, "child %d: \"%s\" does not name %s", c->index, msg, pid);
  }
  /*
   * The root lives in child 0 (it called ncclGetUniqueId). A conflict can be
   * found before the last rank arrives, which then still needs the root to
   * hear about it: like an application, child 0 stays until all are answered.
   */
  boot_add_flag(&sh->answered, 1);
  if (c->index == 0) TEST_CHECK(boot_wait_flag(&sh->answered, c->nprocs, 10.0) == 0, "not all answered");
  return child_result();
}

static int dup_run(const int* ranks, const int* nranks, int nprocs, const char* expect, int a, int b) {
  struct dup_shared* sh = mp_shared_alloc(sizeof *sh);
  for (int i = 0; i < nprocs; i++) {
    sh->rank_of[i] = ranks[i];
    sh->nranks_of[i] = nranks[i];
  }
  snprintf(sh->expect, sizeof sh->expect, "%s", expect);
  sh->name_pids[0] = a;
  sh->name_pids[1] = b;
  struct mp_opts opts = {.name = "duplicate", .nprocs = nprocs, .timeout_sec = 20, .arg = sh};
  int rc = mp_run(&opts, dup_child);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

static int case_duplicate(void) {
  static const int twice[3] = {0, 1, 1}, three[3] = {3, 3, 3};
  return dup_run(twice, three, 3, "rank 1 of 3 claimed twice", 1, 2);
}

int main(int argc, char** argv) {
  static const struct {
    const char* name;
    int (*run)(void);
  } cases[] = {{"secret", case_secret},
               {"timeout", case_timeout},
               {"abort", case_abort},
               {"cut", case_cut},
               {"duplicate", case_duplicate},
               {"notice", case_notice},
               {"notice_late", case_notice_late}};
  for (size_t i = 0; argc > 1 && i < sizeof cases / sizeof cases[0]; i++) {
    if (strcmp(argv[1], cases[i].name) != 0) continue;
    int rc = cases[i].run();
    test_summary();
    return mp_verdict_exit(rc, test_failures);
  }
  fprintf(stderr, "usage: %s secret|timeout|abort|duplicate\n", argv[0]);
  return 2;
}
