/*
 * The bootstrap with several unique ids (ncclCommInitRankScalable), over
 * loopback. Each id comes from bootstrap_get_unique_id in the process of the
 * first rank of its block, so the roots listen in different processes.
 *
 *   scalable_ranks      2..8 ranks with 1, 2, 4 and nranks ids (nranks not
 *                       divisible by the ids included): every rank's init
 *                       succeeds, the all-gather, barrier and send/recv work
 *                       across the blocks, every root thread ends, and no fd
 *                       is left behind
 *   scalable_nid        a rank 0 that passes one id where the others pass two,
 *                       or two where they pass one, is refused at once by the
 *                       root it shares with them, naming its nId; the others
 *                       fail at the timeout, naming it missing and the refusal
 *   scalable_order      a rank 0 with the same ids in another order is refused
 *                       at once, saying its ids differ; the others fail at the
 *                       timeout; an id given twice is refused before any
 *                       connection
 *   scalable_timeout    a rank never comes: every other rank, in its block or
 *                       not, fails within the timeout (and its grace) naming it
 *   scalable_strangers  each root refuses a hello with a wrong secret (saying
 *                       so) and garbage, and holds a silent connection; the
 *                       ranks then complete
 *   scalable_commid     with BRAID_COMM_ID only the first id counts (one root,
 *                       rank 0's), as NCCL does with NCCL_COMM_ID
 *
 *   bootstrap_scalable_test scalable_ranks | scalable_nid | scalable_order |
 *                           scalable_timeout | scalable_strangers | scalable_commid
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot_util.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_internal.h"
#include "base/error.h"
#include "base/socket.h"
#include "mp_runner.h"
#include "test.h"

#define MAX_RANKS 8
#define MAX_IDS 8
/* A child that is not a rank (a stranger) has this index and up. */
#define ROLE_STRANGER 100

struct scal_shared {
  int nranks, nids; /* ranks, and ids made (by the first rank of each block of nids) */
  int use_nids;     /* ids a rank passes unless nid_of says otherwise (0: nids) */
  struct boot_id_slot slot[MAX_IDS];
  int done;         /* ranks through their checks: the makers of ids wait for all */
  int strangers_in; /* the stranger has tested every root and holds its silent connections */
  /* Per child: how it deviates (see each case), and what it must see. */
  int nid_of[MAX_RANKS + 1];
  int swap[MAX_RANKS + 1];
  int late[MAX_RANKS + 1];    /* joins after the others' joins are in */
  int missing[MAX_RANKS + 1]; /* never joins */
  int started;                /* children inside bootstrap_init, on time */
  char expect_late[160];      /* what a late child's message must say */
  char expect_other[160];     /* what the others' messages must say */
  double timeout_s;
};

static void child_reset(const char* timeout) {
  test_failures = 0;
  test_checks = 0;
  boot_loopback(timeout);
}

/* The first rank of block `i` of nids (bootstrap_root_first with nids roots). */
static int block_first(int i, int nranks, int nids) {
  return bootstrap_root_first(i, nranks, bootstrap_roots_used(nids, nranks));
}

/*
 * Child `index` makes the ids whose blocks it starts; every child then waits for all ids.
 * 0 on success.
 */
static int scal_ids(struct scal_shared* sh, int index, ncclUniqueId* ids) {
  for (int i = 0; i < sh->nids; i++) {
    int maker = block_first(i, sh->nranks, sh->nids);
    if (maker == index && boot_id_share(&sh->slot[i], 0, 20.0) != 0) return -1;
  }
  for (int i = 0; i < sh->nids; i++) {
    if (boot_id_share(&sh->slot[i], 1, 20.0) != 0) {
      fprintf(stderr, "child %d: id %d never came\n", index, i);
      return -1;
    }
    ids[i] = sh->slot[i].id;
  }
  return 0;
}

/* A maker of ids stays until every rank is through: its roots live in it. */
static void scal_linger(struct scal_shared* sh, int nchildren) {
  boot_add_flag(&sh->done, 1);
  TEST_CHECK(boot_wait_flag(&sh->done, nchildren, 30.0) == 0, "not every child finished");
}

/* ---------------------------------------------------------------- ranks */

static int ranks_child(const struct mp_child* c) {
  struct scal_shared* sh = c->arg;
  ncclUniqueId ids[MAX_IDS];
  struct bootstrap* b = NULL;
  child_reset("20");
  int fds = boot_fd_count(), threads = boot_thread_count();
  if (scal_ids(sh, c->index, ids) != 0) return 1;
  TEST_EXPECT_RES(bootstrap_init(ids, sh->nids, c->index, sh->nranks, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  TEST_CHECK(bootstrap_rank(b) == c->index && bootstrap_nranks(b) == sh->nranks, "rank/nranks");
  for (int r = 0; r < sh->nranks; r++)
    TEST_CHECK(bootstrap_peer_addr(b, r) != NULL && bootstrap_peer_host(b, r)[0], "no address for %d", r);
  TEST_CHECK(boot_allgather_check(b, 100, 1) == 0, "allgather");
  TEST_CHECK(boot_allgather_check(b, 70000, 2) == 0, "70 KB allgather");
  TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
  TEST_CHECK(boot_ring_tags_check(b, 3) == 0, "send/recv around the ring");
  /* Every rank to every rank: the addresses learnt across the blocks are right. */
  for (int d = 1; d < sh->nranks; d++) {
    int to = (c->index + d) % sh->nranks, from = (c->index - d + sh->nranks) % sh->nranks;
    int v = c->index * 100 + d, got = -1;
    TEST_EXPECT_RES(bootstrap_send(b, to, 50 + d, &v, sizeof v), ncclSuccess);
    TEST_EXPECT_RES(bootstrap_recv(b, from, 50 + d, &got, sizeof got), ncclSuccess);
    TEST_CHECK(got == from * 100 + d, "rank %d sent %d", from, got);
  }
  TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  scal_linger(sh, sh->nranks);
  /* The roots this process started served their rendezvous and ended. */
  TEST_CHECK(boot_settle(fds, threads, 3.0) == 0, "fds or threads left behind");
  return test_failures ? 1 : 0;
}

static int case_ranks(void) {
  int rc = MP_PASSED;
  for (int n = 2; n <= MAX_RANKS && rc != MP_FAILED; n++) {
    const int choices[4] = {1, 2, 4, n};
    for (int k = 0; k < 4; k++) {
      int nids = choices[k];
      if (nids > n || (k == 3 && (n == 1 || n == 2 || n == 4))) continue; /* tried already */
      struct scal_shared* sh = mp_shared_alloc(sizeof *sh);
      sh->nranks = n;
      sh->nids = nids;
      char name[48];
      snprintf(name, sizeof name, "%d ranks, %d ids", n, nids);
      struct mp_opts opts = {.name = name, .nprocs = n, .timeout_sec = 40, .arg = sh};
      int r = mp_run(&opts, ranks_child);
      if (r != MP_PASSED) fprintf(stderr, "%s: failed\n", name);
      rc = mp_verdict_merge(rc, r);
      mp_shared_free(sh, sizeof *sh);
    }
  }
  return rc;
}

/* --------------------------------------------- joins that disagree, missing */

/*
 * A rank of a job that goes wrong: one that deviates (late: after the others joined; another
 * nId, swapped ids) fails within 3 s with sh->expect_late; the others, and a rank that never
 * comes, fail within the timeout and its grace with sh->expect_other.
 */
static int wrong_child(const struct mp_child* c) {
  struct scal_shared* sh = c->arg;
  ncclUniqueId ids[MAX_IDS], mine[MAX_IDS];
  struct bootstrap* b = NULL;
  child_reset("3");
  if (scal_ids(sh, c->index, ids) != 0) return 1;
  int nids = sh->nid_of[c->index] ? sh->nid_of[c->index] : sh->use_nids ? sh->use_nids : sh->nids;
  for (int i = 0; i < nids; i++) mine[i] = ids[i];
  if (sh->swap[c->index]) {
    mine[0] = ids[1];
    mine[1] = ids[0];
  }
  if (sh->missing[c->index]) {
    scal_linger(sh, sh->nranks);
    return 0;
  }
  if (sh->late[c->index]) {
    TEST_CHECK(boot_wait_flag(&sh->started, sh->nranks - 1, 20.0) == 0, "the others never started");
    mp_sleep(1.0); /* their joins are in */
  } else {
    boot_add_flag(&sh->started, 1);
  }
  braid_err_clear();
  double t0 = boot_now();
  ncclResult_t res = bootstrap_init(mine, nids, c->index, sh->nranks, NULL, &b);
  double dt = boot_now() - t0;
  const char* msg = braid_err_last();
  const char* expect = sh->late[c->index] ? sh->expect_late : sh->expect_other;
  TEST_CHECK(res != ncclSuccess && b == NULL, "rank %d: init succeeded", c->index);
  TEST_CHECK(strstr(msg, expect) != NULL, "rank %d: \"%s\" lacks \"%s\"", c->index, msg, expect);
  TEST_CHECK(sh->late[c->index] ? dt < 3.0 : dt < 3.0 + 2.0 + 1.5,
             "rank %d failed after %.2f s (3 s timeout)", c->index, dt);
  if (c->index <= 1 || sh->late[c->index]) fprintf(stderr, "rank %d: %s\n", c->index, msg);
  bootstrap_close(b);
  scal_linger(sh, sh->nranks);
  return test_failures ? 1 : 0;
}

static int wrong_run(const char* name, int nranks, int nids, int use_nids, int odd, int late,
                     int odd_nids, int swap, const char* expect_late, const char* expect_other) {
  struct scal_shared* sh = mp_shared_alloc(sizeof *sh);
  sh->nranks = nranks;
  sh->nids = nids;
  sh->use_nids = use_nids;
  if (odd >= 0) {
    sh->late[odd] = late;
    sh->nid_of[odd] = odd_nids;
    sh->swap[odd] = swap;
    sh->missing[odd] = !late;
  }
  snprintf(sh->expect_late, sizeof sh->expect_late, "%s", expect_late);
  snprintf(sh->expect_other, sizeof sh->expect_other, "%s", expect_other);
  struct mp_opts opts = {.name = name, .nprocs = nranks, .timeout_sec = 30, .arg = sh};
  int rc = mp_run(&opts, wrong_child);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

/*
 * The odd rank is rank 0, late: the root it shares with the others is still waiting for it
 * when it comes (a root whose ranks are all in has answered and closed).
 */
static int case_nid(void) {
  /* Rank 0 passes one id of the two: it joins the first root (ranks 0, 1 and 2) alone. */
  int rc = wrong_run("nId 1 among nId 2", 4, 2, 2, 0, 1, 1, 0, "passed nId 1 ",
                     "rank 0 of 4 never joined");
  /* Rank 0 passes two ids where the others pass the first alone. */
  rc = mp_verdict_merge(rc, wrong_run("nId 2 among nId 1", 3, 2, 1, 0, 1, 2, 0, "passed nId 2 ",
                                      "rank 0 of 3 never joined"));
  return rc;
}

static int order_dup_child(const struct mp_child* c) {
  struct scal_shared* sh = c->arg;
  ncclUniqueId ids[2];
  struct bootstrap* b = NULL;
  child_reset("3");
  if (scal_ids(sh, c->index, ids) != 0) return 1;
  int fds = boot_fd_count();
  ncclUniqueId twice[3] = {ids[0], ids[1], ids[0]};
  braid_err_clear();
  TEST_EXPECT_RES(bootstrap_init(twice, 3, c->index, 3, NULL, &b), ncclInvalidArgument);
  TEST_CHECK(strstr(braid_err_last(), "commIds[0] and commIds[2] are the same id") != NULL,
             "message: %s", braid_err_last());
  TEST_CHECK(boot_fd_count() == fds, "a refused id list left an fd open");
  scal_linger(sh, 3);
  return test_failures ? 1 : 0;
}

static int case_order(void) {
  /* Rank 0 has ids {B, A}: it joins B as its commIds[0], where the others have commIds[1]. */
  int rc = wrong_run("ids swapped", 4, 2, 2, 0, 1, 0, 1, "passed commIds that differ",
                     "rank 0 of 4 never joined");
  struct scal_shared* sh = mp_shared_alloc(sizeof *sh);
  sh->nranks = 3;
  sh->nids = 2;
  struct mp_opts opts = {.name = "an id twice", .nprocs = 3, .timeout_sec = 20, .arg = sh};
  rc = mp_verdict_merge(rc, mp_run(&opts, order_dup_child));
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

static int case_timeout(void) {
  /* 5 ranks, 2 ids: blocks {0, 1, 2} and {3, 4}; rank 4, then rank 1, never comes. */
  int rc = wrong_run("rank 4 missing", 5, 2, 2, 4, 0, 0, 0, "", "rank 4 of 5 never joined");
  rc = mp_verdict_merge(rc, wrong_run("rank 1 missing", 5, 2, 2, 1, 0, 0, 0, "",
                                      "rank 1 of 5 never joined"));
  /* 6 ranks, 4 ids: blocks {0, 1}, {2, 3}, {4}, {5}; rank 2 made an id, and lingers. */
  rc = mp_verdict_merge(rc, wrong_run("rank 2 of 4 ids missing", 6, 4, 4, 2, 0, 0, 0, "",
                                      "rank 2 of 6 never joined"));
  return rc;
}

/* ------------------------------------------------------------ strangers */

/* Whether `fd` ends within `sec` (a refusal's reply read and skipped); the reply's status in *status. */
static int stranger_ended(int fd, double sec, int* status) {
  char buf[sizeof(struct bootstrap_reply) + BOOTSTRAP_MAX_REPLY_TEXT];
  size_t got = 0;
  *status = 0;
  for (double end = boot_now() + sec; boot_now() < end;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t n = read(fd, buf + (got < sizeof buf ? got : 0), got < sizeof buf ? sizeof buf - got : sizeof buf);
    if (n <= 0) return 1;
    got += (size_t)n;
    if (got >= sizeof(struct bootstrap_reply)) {
      struct bootstrap_reply reply;
      memcpy(&reply, buf, sizeof reply);
      *status = reply.status;
    }
  }
  return 0;
}

static int stranger_connect(const struct bootstrap_id_layout* id) {
  union braid_sockaddr to;
  int fd = -1, err = 0;
  if (bootstrap_wire_addr_unpack(&id->root, &to) != 0) return -1;
  if (socket_connect_quiet(&to, 2.0, NULL, &fd, &err) != ncclSuccess) {
    fprintf(stderr, "stranger: cannot connect to a root: %s\n", strerror(err));
    return -1;
  }
  return fd;
}

static int strangers_child(const struct mp_child* c) {
  struct scal_shared* sh = c->arg;
  ncclUniqueId ids[MAX_IDS];
  struct bootstrap* b = NULL;
  const int stranger = c->index == sh->nranks;
  child_reset("15");
  if (scal_ids(sh, stranger ? ROLE_STRANGER : c->index, ids) != 0) return 1;
  if (stranger) {
    int silent[MAX_IDS];
    for (int i = 0; i < sh->nids; i++) {
      struct bootstrap_id_layout id;
      struct bootstrap_hello h;
      int status = 0;
      memcpy(&id, &ids[i], sizeof id);
      int fd = stranger_connect(&id);
      boot_hello_wrong_secret(&h, &id, BOOTSTRAP_HELLO_JOIN, sh->nranks, i, 0x10, "stranger");
      h.nids = sh->nids;
      h.iroot = i;
      TEST_CHECK(fd >= 0 && write(fd, &h, sizeof h) == (ssize_t)sizeof h, "root %d: no connection", i);
      TEST_CHECK(fd >= 0 && stranger_ended(fd, 3.0, &status) && status == ncclInvalidArgument,
                 "root %d kept a hello with a wrong secret (status %d)", i, status);
      close(fd);
      fd = stranger_connect(&id);
      TEST_CHECK(fd >= 0 && write(fd, "GET / HTTP/1.0\r\n\r\n", 18) == 18, "root %d: no connection", i);
      TEST_CHECK(fd >= 0 && stranger_ended(fd, 3.0, &status), "root %d kept garbage", i);
      close(fd);
      silent[i] = stranger_connect(&id);
    }
    boot_set_flag(&sh->strangers_in, 1);
    scal_linger(sh, sh->nranks + 1);
    for (int i = 0; i < sh->nids; i++) close(silent[i]);
    return test_failures ? 1 : 0;
  }
  TEST_CHECK(boot_wait_flag(&sh->strangers_in, 1, 20.0) == 0, "the stranger never finished");
  TEST_EXPECT_RES(bootstrap_init(ids, sh->nids, c->index, sh->nranks, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  TEST_CHECK(boot_allgather_check(b, 64, 7) == 0, "allgather with strangers at the roots");
  TEST_CHECK(boot_ring_tags_check(b, 8) == 0, "send/recv");
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  scal_linger(sh, sh->nranks + 1);
  return test_failures ? 1 : 0;
}

static int case_strangers(void) {
  struct scal_shared* sh = mp_shared_alloc(sizeof *sh);
  sh->nranks = 5;
  sh->nids = 2;
  struct mp_opts opts = {.name = "strangers", .nprocs = 6, .timeout_sec = 40, .arg = sh};
  int rc = mp_run(&opts, strangers_child);
  mp_shared_free(sh, sizeof *sh);
  return rc;
}

/* --------------------------------------------------------------- commid */

static int commid_child(const struct mp_child* c) {
  const char* comm_id = c->arg;
  ncclUniqueId id, ids[3];
  int found = 0;
  struct bootstrap* b = NULL;
  child_reset("10");
  boot_env("BRAID_COMM_ID", comm_id);
  int threads = boot_thread_count();
  for (int i = 0; i < 3; i++) TEST_EXPECT_RES(bootstrap_get_unique_id(&ids[i]), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_id_from_env(&id, &found), ncclSuccess);
  TEST_CHECK(found && memcmp(&ids[2], &id, sizeof id) == 0, "BRAID_COMM_ID's id differs");
  TEST_CHECK(boot_thread_count() == threads, "ncclGetUniqueId started roots with BRAID_COMM_ID");
  TEST_EXPECT_RES(bootstrap_init(ids, 3, c->index, c->nprocs, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  TEST_CHECK(boot_allgather_check(b, 64, 9) == 0, "allgather");
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  return test_failures ? 1 : 0;
}

static int case_commid(void) {
  char* comm_id = mp_shared_alloc(64);
  int port = boot_free_port("127.0.0.1");
  if (port < 0) TEST_SKIP("no free port on loopback");
  snprintf(comm_id, 64, "127.0.0.1:%d", port);
  struct mp_opts opts = {.name = "commid", .nprocs = 4, .timeout_sec = 30, .arg = comm_id};
  int rc = mp_run(&opts, commid_child);
  mp_shared_free(comm_id, 64);
  return rc;
}

int main(int argc, char** argv) {
  static const struct {
    const char* name;
    int (*run)(void);
  } cases[] = {{"scalable_ranks", case_ranks},         {"scalable_nid", case_nid},
               {"scalable_order", case_order},         {"scalable_timeout", case_timeout},
               {"scalable_strangers", case_strangers}, {"scalable_commid", case_commid}};
  for (size_t i = 0; argc > 1 && i < sizeof cases / sizeof cases[0]; i++) {
    if (strcmp(argv[1], cases[i].name) != 0) continue;
    int rc = cases[i].run();
    test_summary();
    return mp_verdict_exit(rc, test_failures);
  }
  fprintf(stderr, "usage: %s scalable_ranks|scalable_nid|scalable_order|scalable_timeout|"
                  "scalable_strangers|scalable_commid\n", argv[0]);
  return 2;
}
