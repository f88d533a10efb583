/*
 * The bootstrap's service, over loopback, with 2, 4, 8 and 16 processes:
 * all-gather checked byte by byte (small, large, empty, repeated), barrier,
 * send/recv (tags out of order, FIFO within a tag, ping-pong, to self, size
 * mismatch, a large two-way exchange that deadlocks unless send keeps
 * draining), split into halves and into reverse order, and no fd or thread
 * left behind. Case "ids": what the unique id accepts and rejects.
 *
 *   bootstrap_test basic | ids
 */
#include <stdint.h>
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

#define MAX_RANKS 16
/* Bigger than what loopback socket buffers hold in flight both ways (~10 MB). */
#define EXCHANGE_BYTES (24u << 20)

struct basic_shared {
  struct boot_id_slot slot;
  int counter;      /* barrier check */
  int pids[MAX_RANKS];
  double allgather_us;
};

static void child_reset(void) {
  test_failures = 0;
  test_checks = 0;
}

static void check_peers(struct bootstrap* b, struct basic_shared* sh) {
  int n = bootstrap_nranks(b);
  for (int r = 0; r < n; r++) {
    const union braid_sockaddr* a = bootstrap_peer_addr(b, r);
    char text[80];
    TEST_CHECK(a != NULL && a->sa.sa_family == AF_INET &&
               strncmp(socket_addr_str(a, text, sizeof text), "127.0.0.1:", 10) == 0,
               "rank %d listens at %s, expected loopback", r, a ? text : "(none)");
    TEST_CHECK(bootstrap_peer_host(b, r) && bootstrap_peer_host(b, r)[0], "rank %d has no host name", r);
  }
  TEST_CHECK(bootstrap_peer_addr(b, n) == NULL && bootstrap_peer_addr(b, -1) == NULL, "out of range");
  (void)sh;
}

static void check_allgather(struct bootstrap* b, struct basic_shared* sh) {
  TEST_CHECK(boot_allgather_check(b, 8, 1) == 0, "8-byte allgather");
  TEST_CHECK(boot_allgather_check(b, 1000, 2) == 0, "1000-byte allgather");
  TEST_CHECK(boot_allgather_check(b, 300000, 3) == 0, "300 KB allgather");
  TEST_EXPECT_RES(bootstrap_allgather(b, NULL, 0), ncclSuccess);
  /* Many in a row: sequence numbers keep consecutive calls apart. Rank 0 times them. */
  int n = bootstrap_nranks(b), me = bootstrap_rank(b), iters = 50, bad = 0;
  int64_t vals[MAX_RANKS];
  double t0 = boot_now();
  for (int it = 0; it < iters; it++) {
    vals[me] = (int64_t)it * 100 + me;
    if (bootstrap_allgather(b, vals, sizeof vals[0]) != ncclSuccess) bad++;
    for (int r = 0; r < n; r++) bad += vals[r] != (int64_t)it * 100 + r;
  }
  TEST_CHECK(bad == 0, "%d bad values in %d small allgathers", bad, iters);
  if (me == 0) sh->allgather_us = (boot_now() - t0) / iters * 1e6;
}

static void check_barrier(struct bootstrap* b, struct basic_shared* sh) {
  int n = bootstrap_nranks(b), me = bootstrap_rank(b);
  for (int it = 0; it < 4; it++) {
    /* One rank is late: a barrier that lets anyone through early sees a short count. */
    if (me == it % n) mp_sleep(0.05);
    boot_add_flag(&sh->counter, 1);
    TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
    int seen = __atomic_load_n(&sh->counter, __ATOMIC_ACQUIRE);
    TEST_CHECK(seen >= n * (it + 1) && seen <= n * (it + 2), "barrier %d: counter %d with %d ranks", it,
               seen, n);
  }
}

/* Both ranks of a pair send EXCHANGE_BYTES before receiving: only works if send drains incoming. */
static void check_exchange(struct bootstrap* b, int partner) {
  unsigned char* out = malloc(EXCHANGE_BYTES);
  unsigned char* in = calloc(1, EXCHANGE_BYTES);
  int me = bootstrap_rank(b);
  for (size_t i = 0; i < EXCHANGE_BYTES; i++) out[i] = (unsigned char)(i * 13 + (size_t)me);
  TEST_EXPECT_RES(bootstrap_send(b, partner, 42, out, EXCHANGE_BYTES), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_recv(b, partner, 42, in, EXCHANGE_BYTES), ncclSuccess);
  size_t bad = 0;
  for (size_t i = 0; i < EXCHANGE_BYTES; i++) bad += in[i] != (unsigned char)(i * 13 + (size_t)partner);
  TEST_CHECK(bad == 0, "%zu bytes of the exchange with rank %d are wrong", bad, partner);
  free(out);
  free(in);
}

static void check_sendrecv(struct bootstrap* b) {
  int n = bootstrap_nranks(b), me = bootstrap_rank(b);
  int next = (me + 1) % n, prev = (me + n - 1) % n, partner = me ^ 1;
  TEST_CHECK(boot_ring_tags_check(b, 5) == 0, "tags received out of order");
  /* Same tag: FIFO. */
  for (int i = 0; i < 5; i++) TEST_EXPECT_RES(bootstrap_send(b, next, 9, &i, sizeof i), ncclSuccess);
  for (int i = 0; i < 5; i++) {
    int v = -1;
    TEST_EXPECT_RES(bootstrap_recv(b, prev, 9, &v, sizeof v), ncclSuccess);
    TEST_CHECK(v == i, "message %d of tag 9 carried %d", i, v);
  }
  /* Ping-pong between pairs. */
  if (partner < n) {
    int v = me & 1 ? -1 : 0;
    for (int i = 0; i < 20; i++) {
      if (!(me & 1)) TEST_EXPECT_RES(bootstrap_send(b, partner, 7, &v, sizeof v), ncclSuccess);
      TEST_EXPECT_RES(bootstrap_recv(b, partner, 7, &v, sizeof v), ncclSuccess);
      TEST_CHECK(v == 2 * i + (me & 1 ? 0 : 1), "ping-pong %d: got %d", i, v);
      v++;
      if (me & 1) TEST_EXPECT_RES(bootstrap_send(b, partner, 7, &v, sizeof v), ncclSuccess);
    }
    if (me < 2) check_exchange(b, partner);
  }
  /* To ourselves. */
  double x = 3.25, y = 0;
  TEST_EXPECT_RES(bootstrap_send(b, me, 11, &x, sizeof x), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_recv(b, me, 11, &y, sizeof y), ncclSuccess);
  TEST_CHECK(y == x, "self message carried %g", y);
  /* A size mismatch is reported, not truncated. */
  int64_t small = 1;
  char big[16];
  TEST_EXPECT_RES(bootstrap_send(b, next, 13, &small, sizeof small), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_recv(b, prev, 13, big, sizeof big), ncclInternalError);
  TEST_EXPECT_RES(bootstrap_send(b, n, 1, &small, sizeof small), ncclInvalidArgument);
  TEST_EXPECT_RES(bootstrap_recv(b, -1, 1, &small, sizeof small), ncclInvalidArgument);
}

static void check_split_group(struct bootstrap* parent, const int* ranks, int count, int new_rank) {
  struct bootstrap* child = NULL;
  TEST_EXPECT_RES(bootstrap_split(parent, ranks, count, new_rank, NULL, &child), ncclSuccess);
  if (child == NULL) return;
  TEST_CHECK(bootstrap_rank(child) == new_rank && bootstrap_nranks(child) == count,
             "split gave rank %d of %d, expected %d of %d", bootstrap_rank(child),
             bootstrap_nranks(child), new_rank, count);
  int64_t vals[MAX_RANKS];
  vals[new_rank] = (int64_t)bootstrap_rank(parent) * 3 + 1;
  TEST_EXPECT_RES(bootstrap_allgather(child, vals, sizeof vals[0]), ncclSuccess);
  for (int i = 0; i < count; i++)
    TEST_CHECK(vals[i] == (int64_t)ranks[i] * 3 + 1, "split member %d carried %lld", i, (long long)vals[i]);
  TEST_EXPECT_RES(bootstrap_barrier(child), ncclSuccess);
  TEST_CHECK(boot_ring_tags_check(child, 8) == 0, "send/recv in the split group");
  TEST_EXPECT_RES(bootstrap_close(child), ncclSuccess);
}

static void check_split(struct bootstrap* b) {
  int n = bootstrap_nranks(b), me = bootstrap_rank(b), half = n / 2;
  int ranks[MAX_RANKS];
  int base = me < half ? 0 : half, count = me < half ? half : n - half;
  for (int i = 0; i < count; i++) ranks[i] = base + i;
  check_split_group(b, ranks, count, me - base);
  for (int i = 0; i < n; i++) ranks[i] = n - 1 - i;
  check_split_group(b, ranks, n, n - 1 - me);
  /* A list that does not name us where we claim to be. */
  struct bootstrap* child = NULL;
  TEST_EXPECT_RES(bootstrap_split(b, ranks, n, me, NULL, &child), ncclInvalidArgument); /* n is even */
  bootstrap_close(child);
}

static int basic_child(const struct mp_child* c) {
  struct basic_shared* sh = c->arg;
  struct bootstrap* b = NULL;
  child_reset();
  boot_env("BRAID_SOCKET_IFNAME", "lo");
  int fds = boot_fd_count(), threads = boot_thread_count();
  sh->pids[c->index] = getpid();
  if (boot_id_share(&sh->slot, c->index, 20.0) != 0) return 1;
  TEST_EXPECT_RES(bootstrap_init(&sh->slot.id, 1, c->index, c->nprocs, NULL, &b), ncclSuccess);
  if (b == NULL) return 1;
  TEST_CHECK(bootstrap_rank(b) == c->index && bootstrap_nranks(b) == c->nprocs, "rank/nranks");
  check_peers(b, sh);
  check_allgather(b, sh);
  check_barrier(b, sh);
  check_sendrecv(b);
  check_split(b);
  TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  /* Rank 0's root thread has exited too: it served its one rendezvous. */
  TEST_CHECK(boot_settle(fds, threads, 3.0) == 0, "fds or threads left behind");
  return test_failures ? 1 : 0;
}

static int case_basic(void) {
  static const int sizes[] = {2, 4, 8, 16};
  int rc = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    struct basic_shared* sh = mp_shared_alloc(sizeof *sh);
    char name[32];
    snprintf(name, sizeof name, "basic-%d", sizes[i]);
    struct mp_opts opts = {.name = name, .nprocs = sizes[i], .timeout_sec = 30, .arg = sh};
    int r = mp_run(&opts, basic_child);
    if (r == MP_PASSED)
      fprintf(stderr, "%d ranks: %.1f us per 8-byte allgather\n", sizes[i], sh->allgather_us);
    rc = mp_verdict_merge(rc, r);
    mp_shared_free(sh, sizeof *sh);
    if (r == MP_FAILED) break; /* larger runs would fail the same way, only slower */
  }
  return rc;
}

/* An id damaged in transit is refused before any connection, with a message saying how. */
static void check_id_rejected(const ncclUniqueId* id, const char* expect, const char* what) {
  struct bootstrap* b = NULL;
  braid_err_clear();
  TEST_EXPECT_RES(bootstrap_init(id, 1, 0, 1, NULL, &b), ncclInvalidArgument);
  TEST_CHECK(b == NULL, "%s: a bootstrap came back", what);
  TEST_CHECK(strstr(braid_err_last(), expect) != NULL, "%s: message \"%s\" lacks \"%s\"", what,
             braid_err_last(), expect);
}

static int case_ids(void) {
  boot_env("BRAID_SOCKET_IFNAME", "lo");
  boot_env("BRAID_BOOTSTRAP_TIMEOUT", "2");
  int fds = boot_fd_count(), threads = boot_thread_count();
  ncclUniqueId id, other, bad;
  TEST_EXPECT_RES(bootstrap_get_unique_id(&id), ncclSuccess);
  TEST_EXPECT_RES(bootstrap_get_unique_id(&other), ncclSuccess);
  struct bootstrap_id_layout a, o;
  memcpy(&a, &id, sizeof a);
  memcpy(&o, &other, sizeof o);
  TEST_CHECK(memcmp(a.secret, o.secret, sizeof a.secret) != 0, "two ids share a secret");
  TEST_CHECK(bootstrap_id_hash(&id) != bootstrap_id_hash(&other), "two ids, one hash");
  TEST_CHECK(boot_settle(-1, threads + 2, 1.0) == 0, "each id runs a root thread");

  for (size_t i = 0; i < sizeof bad; i++) bad.internal[i] = (char)(rand() & 0xff);
  check_id_rejected(&bad, "not a Braid id", "random bytes");
  memset(&bad, 0, sizeof bad);
  check_id_rejected(&bad, "not a Braid id", "zeros");
  bad = id;
  bad.internal[offsetof(struct bootstrap_id_layout, root) + 4] ^= 1;
  check_id_rejected(&bad, "corrupt", "a flipped address bit");
  bad = id;
  bad.internal[offsetof(struct bootstrap_id_layout, version)] += 1;
  check_id_rejected(&bad, "version", "another version");
  bad = id;
  bad.internal[NCCL_UNIQUE_ID_BYTES - 1] ^= 0x40;
  check_id_rejected(&bad, "corrupt", "a flipped checksum bit");

  struct bootstrap* b = NULL;
  TEST_EXPECT_RES(bootstrap_init(&id, 1, 1, 1, NULL, &b), ncclInvalidArgument);
  TEST_EXPECT_RES(bootstrap_init(&id, 1, 0, 0, NULL, &b), ncclInvalidArgument);
  TEST_EXPECT_RES(bootstrap_init(&id, 0, 0, 1, NULL, &b), ncclInvalidArgument);
  /*
   * One rank with two ids, as ncclCommInitRankScalable passes them: it joins
   * the first root and dismisses the second, so both root threads end now,
   * long before their 2 s timeout.
   */
  ncclUniqueId both[2] = {id, other};
  double t0 = boot_now();
  TEST_EXPECT_RES(bootstrap_init(both, 2, 0, 1, NULL, &b), ncclSuccess);
  if (b) {
    TEST_CHECK(boot_allgather_check(b, 100, 4) == 0, "one-rank allgather");
    TEST_EXPECT_RES(bootstrap_barrier(b), ncclSuccess);
    TEST_CHECK(boot_ring_tags_check(b, 6) == 0, "one-rank send/recv to itself");
    TEST_EXPECT_RES(bootstrap_close(b), ncclSuccess);
  }
  TEST_CHECK(boot_settle(fds, threads, 1.0) == 0 && boot_now() - t0 < 1.5,
             "roots did not end when served and dismissed");
  /* An id nobody uses: its root waits past the timeout (as NCCL's), until stopped. */
  TEST_EXPECT_RES(bootstrap_get_unique_id(&id), ncclSuccess);
  TEST_CHECK(boot_settle(-1, threads + 1, 1.0) == 0, "root thread started");
  mp_sleep(3.0);
  TEST_CHECK(boot_settle(-1, threads + 1, 0.1) == 0, "an unused root gave up at the timeout");
  bootstrap_roots_stop();
  TEST_CHECK(boot_settle(fds, threads, 1.0) == 0, "bootstrap_roots_stop left the root running");
  return 0;
}

int main(int argc, char** argv) {
  const char* which = argc > 1 ? argv[1] : "basic";
  int rc;
  if (strcmp(which, "basic") == 0)
    rc = case_basic();
  else if (strcmp(which, "ids") == 0)
    rc = case_ids();
  else {
    fprintf(stderr, "usage: %s basic|ids\n", argv[0]);
    return 2;
  }
  test_summary();
  return mp_verdict_exit(rc, test_failures);
}
