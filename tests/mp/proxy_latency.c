/*
 * One network hop through the proxies, measured without a GPU: two
 * processes, each with its proxy thread and host-memory FIFOs, the test
 * standing in for the kernels (as in proxy_fifo_test). Process 0 fills a
 * step on its send connection; process 1 waits for it, copies it into its
 * own send connection; process 0 waits for the echo and checks it. Half a
 * round trip is the hop: kernel's tail -> proxy -> backend -> proxy ->
 * kernel's tail, the path every small collective crosses between hosts.
 *
 * Each process also holds `idle` connections in each direction that carry
 * nothing, as the other channels of a communicator do during a small
 * collective: a proxy that gives every connection a turn on every pass pays
 * for them on every hop.
 *
 *   proxy_latency <backend>_pingpong           the CTest case: a short run, data checked
 *   proxy_latency <backend> [idle] [iters] [bytes] [bare]
 *                                              the measurement: prints min, median, p90 (µs);
 *                                              "bare": the same ping-pong straight on the
 *                                              backend (isend/irecv/test from the test's own
 *                                              thread, no proxy, no FIFO), for comparison
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot_util.h"
#include "transport/proxy.h"
#include "base/utils.h"
#include "mp_runner.h"
#include "net_util.h"
#include "test.h"

#define NSTEPS NET_UTIL_FIFO_STEPS
#define MAX_IDLE 64
#define NCONN (MAX_IDLE + 1)
#define WAIT_SEC 20.0
#define WARMUP 200

struct lat_shared {
  int ready[2];
  int done;
  int idle, iters, bare;
  size_t bytes;
  uint8_t key[BRAID_NET_KEY_BYTES];
  /* handle[p][k]: process p's listener for connection k (0: the active one) */
  uint8_t handle[2][NCONN][BRAID_NET_HANDLE_BYTES] __attribute__((aligned(8)));
  double hop_us[3]; /* min, median, p90 */
};

static char backend[16];
static atomic_int errors_seen;
static int small_machine; /* fewer CPUs than spinning threads: yield while waiting */

static void on_error(void* arg, ncclResult_t res) { atomic_fetch_add(&errors_seen, 1); }

static void* page_alloc(size_t size) { return aligned_alloc(4096, (size + 4095) & ~(size_t)4095); }

/* Spins until *counter >= value; 0 when it happened in time. */
static int wait_counter(_Atomic uint64_t* counter, uint64_t value) {
  if (atomic_load_explicit(counter, memory_order_acquire) >= value) return 0;
  double end = boot_now() + WAIT_SEC;
  for (unsigned spin = 0; atomic_load_explicit(counter, memory_order_acquire) < value; spin++) {
    if ((spin & 1023) == 0 && (boot_now() > end || atomic_load(&errors_seen))) return -1;
    if (small_machine) sched_yield(); /* let the proxy run */
  }
  return 0;
}

struct end {
  struct net_fifo_mem* f;
  char* slots;
  struct braid_proxy_conn* conn;
};

static int end_open(struct lat_shared* sh, const struct braid_net_ops* ops,
                    struct braid_proxy* proxy, int me, int k, int is_send, size_t slot_bytes,
                    struct end* e) {
  struct braid_proxy_conn_desc d;
  e->f = page_alloc(sizeof *e->f);
  e->slots = page_alloc(NSTEPS * slot_bytes);
  if (e->f == NULL || e->slots == NULL) return -1;
  memset(e->f, 0, sizeof *e->f);
  memset(&d, 0, sizeof d);
  d.is_send = is_send;
  d.net = ops;
  memcpy(d.key, sh->key, sizeof d.key);
  d.fifo = (struct braid_proxy_fifo){.buff = e->slots,
                                     .tail = &e->f->tail,
                                     .head = &e->f->head,
                                     .sizes = e->f->sizes,
                                     .slot_bytes = slot_bytes,
                                     .nsteps = NSTEPS};
  d.dmabuf_fd = -1;
  d.connect_timeout = WAIT_SEC;
  d.on_error = on_error;
  snprintf(d.peer, sizeof d.peer, "process %d connection %d", 1 - me, k);
  if (is_send) {
    memcpy(d.handle, sh->handle[1 - me][k], sizeof d.handle);
  } else if (ops->listen(0, sh->key, sh->handle[me][k], &d.listen_comm) != ncclSuccess) {
    return -1;
  }
  return proxy_conn_add(proxy, &d, &e->conn) == ncclSuccess ? 0 : -1;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* Tests until done, spinning (yielding on a small machine); 0 when done in time. */
static int bare_wait(const struct braid_net_ops* ops, void* req) {
  double end = boot_now() + WAIT_SEC;
  for (unsigned spin = 0;; spin++) {
    int done = 0;
    if (ops->test(req, &done, NULL) != ncclSuccess) return -1;
    if (done) return 0;
    if ((spin & 1023) == 0 && boot_now() > end) return -1;
    if (small_machine) sched_yield();
  }
}

/* The ping-pong straight on the backend: one connection each way, the test's thread drives them. */
static int bare_child(const struct mp_child* c) {
  struct lat_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  void *listen = NULL, *rx = NULL, *tx = NULL, *rmh = NULL, *smh = NULL;
  int ndev, me = c->index;
  test_failures = 0;
  int rc = net_util_open(backend, &ops, &ndev);
  if (rc) return rc;
  size_t bytes = BRAID_MAX(sh->bytes, (size_t)8);
  char* in = page_alloc(bytes);
  char* out = page_alloc(bytes);
  double* rtt = calloc((size_t)(WARMUP + sh->iters), sizeof *rtt);
  if (in == NULL || out == NULL || rtt == NULL) return 1;
  TEST_EXPECT_RES(ops->listen(0, sh->key, sh->handle[me][0], &listen), ncclSuccess);
  boot_set_flag(&sh->ready[me], 1);
  if (boot_wait_flag(&sh->ready[1 - me], 1, WAIT_SEC) != 0) return 1;
  /* Process 0 connects first, then accepts; process 1 the other way round. */
  for (int step = 0; step < 2 && !test_failures; step++) {
    if ((step == 0) == (me == 0))
      TEST_EXPECT_RES(net_util_connect(ops, 0, sh->key, sh->handle[1 - me][0], &tx, WAIT_SEC),
                      ncclSuccess);
    else
      TEST_EXPECT_RES(net_util_accept(ops, listen, &rx, WAIT_SEC), ncclSuccess);
  }
  if (test_failures) return 1;
  TEST_EXPECT_RES(ops->reg_mr(rx, in, bytes, 0, &rmh), ncclSuccess);
  TEST_EXPECT_RES(ops->reg_mr(tx, out, bytes, 0, &smh), ncclSuccess);
  int bad = 0;
  for (int i = 0; i < WARMUP + sh->iters && !test_failures; i++) {
    void *sreq = NULL, *rreq = NULL;
    double t0 = boot_now();
    if (me == 0) net_util_fill(out, sh->bytes, (uint64_t)i);
    TEST_EXPECT_RES(net_util_post(ops, rx, 0, in, bytes, &rreq, WAIT_SEC), ncclSuccess);
    if (me == 0) {
      TEST_EXPECT_RES(net_util_post(ops, tx, 1, out, sh->bytes, &sreq, WAIT_SEC), ncclSuccess);
      TEST_CHECK(sreq && bare_wait(ops, sreq) == 0, "send %d", i);
    }
    TEST_CHECK(rreq && bare_wait(ops, rreq) == 0, "receive %d", i);
    if (net_util_check(in, sh->bytes, (uint64_t)i) != 0) bad++;
    if (me == 1) {
      memcpy(out, in, sh->bytes);
      TEST_EXPECT_RES(net_util_post(ops, tx, 1, out, sh->bytes, &sreq, WAIT_SEC), ncclSuccess);
      TEST_CHECK(sreq && bare_wait(ops, sreq) == 0, "send %d", i);
    }
    rtt[i] = boot_now() - t0;
  }
  TEST_CHECK(bad == 0, "%d echoes arrived wrong", bad);
  if (me == 0 && !test_failures) {
    qsort(rtt + WARMUP, (size_t)sh->iters, sizeof *rtt, cmp_double);
    sh->hop_us[0] = rtt[WARMUP] / 2 * 1e6;
    sh->hop_us[1] = rtt[WARMUP + sh->iters / 2] / 2 * 1e6;
    sh->hop_us[2] = rtt[WARMUP + sh->iters * 9 / 10] / 2 * 1e6;
  }
  boot_add_flag(&sh->done, 1);
  boot_wait_flag(&sh->done, 2, WAIT_SEC);
  if (rmh) ops->dereg_mr(rx, rmh);
  if (smh) ops->dereg_mr(tx, smh);
  if (tx) ops->close_send(tx);
  if (rx) ops->close_recv(rx);
  if (listen) ops->close_listen(listen);
  free(rtt), free(in), free(out);
  return test_failures ? 1 : 0;
}

static int lat_child(const struct mp_child* c) {
  struct lat_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  struct braid_proxy* proxy = NULL;
  struct end rx[NCONN], tx[NCONN];
  int ndev, me = c->index, nconn = sh->idle + 1;
  size_t slot_bytes = BRAID_ALIGN_UP(BRAID_MAX(sh->bytes, (size_t)64), (size_t)4096);
  test_failures = 0;
  int rc = net_util_open(backend, &ops, &ndev);
  if (rc) return rc;
  TEST_EXPECT_RES(proxy_acquire(0, -1, &proxy), ncclSuccess);
  if (proxy == NULL) return 1;
  for (int k = 0; k < nconn; k++)
    if (end_open(sh, ops, proxy, me, k, 0, slot_bytes, &rx[k]) != 0) return 1;
  boot_set_flag(&sh->ready[me], 1);
  if (boot_wait_flag(&sh->ready[1 - me], 1, WAIT_SEC) != 0) return 1;
  for (int k = 0; k < nconn; k++)
    if (end_open(sh, ops, proxy, me, k, 1, slot_bytes, &tx[k]) != 0) return 1;
  for (int k = 0; k < nconn; k++) {
    double end = boot_now() + WAIT_SEC;
    while (proxy_conn_state(rx[k].conn, NULL) == 0 || proxy_conn_state(tx[k].conn, NULL) == 0) {
      if (boot_now() > end) return 1;
      sched_yield();
    }
    TEST_CHECK(proxy_conn_state(rx[k].conn, NULL) == 1 && proxy_conn_state(tx[k].conn, NULL) == 1,
               "connection %d failed", k);
  }
  int total = WARMUP + sh->iters, bad = 0;
  double* rtt = calloc((size_t)total, sizeof *rtt);
  if (rtt == NULL) return 1;
  struct end* in = &rx[0];
  struct end* out = &tx[0];
  for (int i = 0; i < total && !test_failures; i++) {
    uint64_t s = (uint64_t)i;
    char* in_slot = in->slots + (s % NSTEPS) * slot_bytes;
    char* out_slot = out->slots + (s % NSTEPS) * slot_bytes;
    double t0 = boot_now();
    if (me == 0) {
      TEST_CHECK(wait_counter(&out->f->head, s + 1 > NSTEPS ? s + 1 - NSTEPS : 0) == 0,
                 "slot never freed");
      net_util_fill(out_slot, sh->bytes, s);
      atomic_store_explicit(&out->f->sizes[s % NSTEPS], (uint32_t)sh->bytes, memory_order_relaxed);
      atomic_store_explicit(&out->f->tail, s + 1, memory_order_release);
    }
    TEST_CHECK(wait_counter(&in->f->tail, s + 1) == 0, "step %d never arrived", i);
    if (test_failures) break;
    if (atomic_load(&in->f->sizes[s % NSTEPS]) != sh->bytes ||
        net_util_check(in_slot, sh->bytes, s) != 0)
      bad++;
    if (me == 1) {
      TEST_CHECK(wait_counter(&out->f->head, s + 1 > NSTEPS ? s + 1 - NSTEPS : 0) == 0,
                 "slot never freed");
      memcpy(out_slot, in_slot, sh->bytes);
      atomic_store_explicit(&out->f->sizes[s % NSTEPS], (uint32_t)sh->bytes, memory_order_relaxed);
      atomic_store_explicit(&out->f->tail, s + 1, memory_order_release);
    }
    atomic_store_explicit(&in->f->head, s + 1, memory_order_release);
    rtt[i] = boot_now() - t0;
  }
  TEST_CHECK(bad == 0, "%d of %d echoes arrived wrong", bad, total);
  TEST_CHECK(atomic_load(&errors_seen) == 0, "a connection failed");
  if (me == 0 && !test_failures) {
    qsort(rtt + WARMUP, (size_t)sh->iters, sizeof *rtt, cmp_double);
    sh->hop_us[0] = rtt[WARMUP] / 2 * 1e6;
    sh->hop_us[1] = rtt[WARMUP + sh->iters / 2] / 2 * 1e6;
    sh->hop_us[2] = rtt[WARMUP + sh->iters * 9 / 10] / 2 * 1e6;
  }
  free(rtt);
  /* Both are done before either side closes. */
  boot_add_flag(&sh->done, 1);
  boot_wait_flag(&sh->done, 2, WAIT_SEC);
  for (int k = 0; k < nconn; k++) {
    proxy_conn_remove(proxy, tx[k].conn);
    proxy_conn_remove(proxy, rx[k].conn);
    free(tx[k].slots);
    free(tx[k].f);
    free(rx[k].slots);
    free(rx[k].f);
  }
  proxy_release(proxy);
  return test_failures ? 1 : 0;
}

int main(int argc, char** argv) {
  const char* arg = argc > 1 ? argv[1] : "";
  const char* sep = strchr(arg, '_');
  size_t blen = sep ? (size_t)(sep - arg) : strlen(arg);
  int is_case = sep != NULL;
  if (blen == 0 || blen >= sizeof backend || (is_case && strcmp(sep + 1, "pingpong") != 0)) {
    fprintf(stderr, "usage: %s <socket|ofi|ib>_pingpong | <backend> [idle 0-%d] [iters] [bytes]\n",
            argv[0], MAX_IDLE);
    return 2;
  }
  memcpy(backend, arg, blen);
  small_machine = sysconf(_SC_NPROCESSORS_ONLN) < 8;
  struct lat_shared* sh = mp_shared_alloc(sizeof *sh);
  braid_random_bytes(sh->key, sizeof sh->key);
  sh->idle = is_case ? 8 : argc > 2 ? atoi(argv[2]) : 0;
  sh->iters = is_case ? 500 : argc > 3 ? atoi(argv[3]) : 5000;
  sh->bytes = is_case ? 8 : argc > 4 ? (size_t)atoll(argv[4]) : 8;
  sh->bare = !is_case && argc > 5 && strcmp(argv[5], "bare") == 0;
  if (sh->idle < 0 || sh->idle > MAX_IDLE || sh->iters < 1 || sh->bytes > (64u << 20)) {
    fprintf(stderr, "%s: idle 0-%d, iters >= 1, bytes <= 64 MiB\n", argv[0], MAX_IDLE);
    return 2;
  }
  struct mp_opts opts = {.name = arg, .nprocs = 2, .timeout_sec = 120, .arg = sh};
  int rc = mp_run(&opts, sh->bare ? bare_child : lat_child);
  if (rc == 0 && sh->bare)
    printf(
        "%s: straight on the backend, no proxy, %zu bytes: one hop min %.2f  median %.2f  p90 %.2f "
        "us\n",
        backend, sh->bytes, sh->hop_us[0], sh->hop_us[1], sh->hop_us[2]);
  else if (rc == 0)
    printf(
        "%s: %d idle connections each way, %zu bytes: one hop min %.2f  median %.2f  p90 %.2f us\n",
        backend, sh->idle, sh->bytes, sh->hop_us[0], sh->hop_us[1], sh->hop_us[2]);
  mp_shared_free(sh, sizeof *sh);
  return mp_verdict_exit(rc, test_failures);
}
