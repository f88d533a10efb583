/*
 * The proxy's FIFO protocol (transport/proxy.h) end to end, without a GPU: two
 * processes, each with its proxy thread, host-memory FIFOs, and the test
 * standing in for the kernels. The sending "kernel" fills slot s % nsteps
 * with random bytes of step s and releases tail = s + 1 once head allows;
 * the receiving one waits for tail, checks the slot, releases head. Several
 * thousand steps, so the counters wrap the FIFO hundreds of times.
 *
 *   steps      whole slots (no size array), 4000 steps of 64 KiB
 *   sizes      a size array: random sizes 0..256 KiB (inline and striped), checked on arrival
 *   peerdeath  the sending process dies mid-stream: the receiver's proxy reports
 *              the error through on_error within seconds and the connection
 *              reads as failed
 *   removefirst, removelast
 *              three connections per process; after each phase of steps on
 *              every live one, both sides remove one (in the order they were
 *              added, or the reverse) and the others must keep moving. The
 *              proxy walks its list without the lock, so a removal must not
 *              cut the list behind the removed connection (it once did: a
 *              destroyed communicator took its neighbours' connections along)
 *   idle       the sender pauses 8 s mid-stream with nothing to send (its receiver's
 *              receives stay posted): the connection must not read as failed. Over
 *              OFI the receiver probes the silent peer after 1 s and gave it up
 *              after 5 more, because an idle send end's queue was never read (the
 *              proxy now gives such ends the backend's idle() turn)
 *
 *   events     the steps case with a profiler's sink on each end (transport/proxy_events.h):
 *              every step is started once, in order, under an open operation, reaches its
 *              state once with the bytes it carries, and is stopped; operations open and
 *              close in pairs and name the peer, channel, slot size and direction
 *
 *   proxy_fifo_test <backend>_<case>
 */
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot_util.h"
#include "transport/proxy.h"
#include "base/utils.h"
#include "mp_runner.h"
#include "net_util.h"
#include "test.h"

#define NSTEPS NET_UTIL_FIFO_STEPS
#define WAIT_SEC 20.0

static char backend[16];

struct proxy_case {
  size_t slot_bytes;
  int use_sizes;
  int steps;
  int die_at; /* sender dies after this many steps; 0: never */
  int pause_at;     /* sender waits pause_sec before this step; 0: never */
  double pause_sec;
  int events;       /* record the proxy's profiler events (the events case) */
};

static atomic_int errors_seen;

/* Page-aligned memory; aligned_alloc wants the size a multiple of the alignment (C11). */
static void* page_alloc(size_t size) { return aligned_alloc(4096, (size + 4095) & ~(size_t)4095); }

static void on_error(void* arg, ncclResult_t res) { atomic_fetch_add(&errors_seen, 1); }

/* The size of step s: whole slots, or a random size that covers inline and striped messages. */
static size_t step_bytes(const struct proxy_case* pc, uint64_t s) {
  if (!pc->use_sizes) return pc->slot_bytes;
  uint64_t x = s * 0x9e3779b97f4a7c15ULL;
  x ^= x >> 29;
  return (size_t)(x % (pc->slot_bytes + 1));
}

/* ---- a profiler's sink that records what the proxy reports (the events case) ---- */

#define EV_CHANNEL 5

struct ev_step {
  int started, stopped, nstates, state;
  size_t bytes;
  void* op;
};

struct ev_record {
  int is_send, peer;
  size_t chunk;
  int ops_started, ops_stopped, ops_bad, steps_started, steps_bad, next_step, nsteps_max;
  void* open_op;           /* the operation now open, or NULL */
  struct ev_step* steps;   /* [nsteps_max], by step number */
};

static struct ev_record ev_rec;

static void* ev_op_start(void* ctx, int is_send, int peer, int channel, int nsteps, int chunk) {
  struct ev_record* r = ctx;
  r->ops_bad += r->open_op != NULL || is_send != r->is_send || peer != r->peer ||
                channel != EV_CHANNEL || nsteps < 1 || (size_t)chunk != r->chunk;
  r->ops_started++;
  r->open_op = (void*)(uintptr_t)r->ops_started; /* a handle: the operation's number */
  return r->open_op;
}

static void ev_op_stop(void* ctx, void* op) {
  struct ev_record* r = ctx;
  r->ops_bad += op != r->open_op;
  r->ops_stopped++;
  r->open_op = NULL;
}

static void* ev_step_start(void* ctx, void* op, int step) {
  struct ev_record* r = ctx;
  r->steps_started++;
  if (step != r->next_step++ || step < 0 || step >= r->nsteps_max || op != r->open_op) {
    r->steps_bad++;
    return NULL;
  }
  r->steps[step].started++;
  r->steps[step].op = op;
  return &r->steps[step];
}

static void ev_step_state(void* ctx, void* step, braid_proxy_step_state_t state, size_t bytes) {
  struct ev_step* s = step;
  (void)ctx;
  s->nstates++;
  s->state = (int)state;
  s->bytes = bytes;
}

static void ev_step_stop(void* ctx, void* step) {
  struct ev_step* s = step;
  (void)ctx;
  s->stopped++;
}

static const struct braid_proxy_events ev_sink = {.op_start = ev_op_start,
                                                  .op_stop = ev_op_stop,
                                                  .step_start = ev_step_start,
                                                  .step_state = ev_step_state,
                                                  .step_stop = ev_step_stop};

/* After the connection's removal: what the sink saw of `steps` steps. */
static void ev_check(const struct proxy_case* pc, int is_send) {
  struct ev_record* r = &ev_rec;
  TEST_CHECK(r->ops_started >= 1 && r->ops_started == r->ops_stopped && r->ops_bad == 0,
             "operations: %d started, %d stopped, %d wrong", r->ops_started, r->ops_stopped,
             r->ops_bad);
  TEST_CHECK(r->steps_started == pc->steps && r->steps_bad == 0,
             "steps: %d started of %d, %d out of order or outside an operation", r->steps_started,
             pc->steps, r->steps_bad);
  int bad = 0;
  for (int s = 0; s < pc->steps && s < r->nsteps_max; s++) {
    const struct ev_step* e = &r->steps[s];
    const int want = is_send ? BRAID_PROXY_STEP_SEND_WAIT : BRAID_PROXY_STEP_RECV_GPU;
    if (e->started != 1 || e->stopped != 1 || e->nstates != 1 || e->state != want ||
        e->bytes != step_bytes(pc, (uint64_t)s)) {
      if (bad++ < 3)
        fprintf(stderr, "step %d: started %d stopped %d, %d states (last %d, want %d), %zu bytes (want %zu)\n",
                s, e->started, e->stopped, e->nstates, e->state, want, e->bytes,
                step_bytes(pc, (uint64_t)s));
    }
  }
  TEST_CHECK(bad == 0, "%d of %d steps with wrong events", bad, pc->steps);
  fprintf(stderr, "%s: %d proxy operations, %d steps reported\n", is_send ? "sender" : "receiver",
          r->ops_started, r->steps_started);
}


/* Waits until *counter >= value; 0 when it happened in time, -1 on timeout or a proxy error. */
static int wait_counter(_Atomic uint64_t* counter, uint64_t value) {
  double end = boot_now() + WAIT_SEC; /* longer than the idle case's pause */
  while (atomic_load_explicit(counter, memory_order_acquire) < value) {
    if (boot_now() > end || atomic_load(&errors_seen)) return -1;
    sched_yield(); /* a GPU would not take a CPU; on a small CI machine, let the proxy run */
  }
  return 0;
}

/* The sending kernel's part, steps [from, to). */
static int kernel_send(const struct proxy_case* pc, struct net_fifo_mem* f, char* slots,
                       struct net_shared* sh, int from, int to) {
  for (int s = from; s < to; s++) {
    if (pc->die_at && s == pc->die_at) {
      sh->result[0] = boot_now();
      boot_set_flag(&sh->flags[2], 1);
      raise(SIGKILL);
    }
    if (pc->pause_at && s == pc->pause_at) {
      fprintf(stderr, "sender: idle for %.0f s after %d steps\n", pc->pause_sec, s);
      for (double end = boot_now() + pc->pause_sec; boot_now() < end;) usleep(10000);
    }
    if (wait_counter(&f->head, (uint64_t)s + 1 > NSTEPS ? (uint64_t)s + 1 - NSTEPS : 0) != 0) {
      fprintf(stderr, "sender: slot of step %d never freed (head %llu)\n", s,
              (unsigned long long)atomic_load(&f->head));
      return -1;
    }
    size_t n = step_bytes(pc, (uint64_t)s);
    net_util_fill(slots + (size_t)(s % NSTEPS) * pc->slot_bytes, n, (uint64_t)s);
    if (pc->use_sizes) atomic_store_explicit(&f->sizes[s % NSTEPS], (uint32_t)n, memory_order_relaxed);
    atomic_store_explicit(&f->tail, (uint64_t)s + 1, memory_order_release);
  }
  return wait_counter(&f->head, (uint64_t)to); /* every send acknowledged */
}

/* The receiving kernel's part, steps [from, to); returns the number of bad steps, -1 when stuck. */
static int kernel_recv(const struct proxy_case* pc, struct net_fifo_mem* f, char* slots, int from,
                       int to) {
  int bad = 0;
  for (int s = from; s < to; s++) {
    if (wait_counter(&f->tail, (uint64_t)s + 1) != 0) {
      fprintf(stderr, "receiver: step %d never arrived (tail %llu)\n", s,
              (unsigned long long)atomic_load(&f->tail));
      return -1;
    }
    size_t n = step_bytes(pc, (uint64_t)s);
    if (pc->use_sizes && atomic_load(&f->sizes[s % NSTEPS]) != n) bad++;
    else if (net_util_check(slots + (size_t)(s % NSTEPS) * pc->slot_bytes, n, (uint64_t)s) != 0) bad++;
    atomic_store_explicit(&f->head, (uint64_t)s + 1, memory_order_release);
  }
  return bad;
}

/* A connection's description over FIFO `f` and `slots` (the handle is filled by the caller). */
static void desc_fill(struct braid_proxy_conn_desc* d, const struct braid_net_ops* ops,
                      const struct net_shared* sh, int is_send, const struct proxy_case* pc,
                      struct net_fifo_mem* f, char* slots, int peer) {
  memset(d, 0, sizeof *d);
  d->is_send = is_send;
  d->net = ops;
  memcpy(d->key, sh->key, sizeof d->key);
  d->fifo = (struct braid_proxy_fifo){.buff = slots, .tail = &f->tail, .head = &f->head,
                                      .sizes = pc->use_sizes ? f->sizes : NULL,
                                      .slot_bytes = pc->slot_bytes, .nsteps = NSTEPS};
  d->dmabuf_fd = -1;
  d->connect_timeout = WAIT_SEC;
  snprintf(d->peer, sizeof d->peer, "test child %d", peer);
}

static int proxy_child(const struct mp_child* c, const struct proxy_case* pc) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  struct braid_proxy* proxy = NULL;
  struct braid_proxy_conn* conn = NULL;
  struct braid_proxy_conn_desc d;
  int ndev, is_send = c->index == 1;
  test_failures = 0;
  int rc = net_util_open(backend, &ops, &ndev);
  if (rc) return rc;
  struct net_fifo_mem* f = page_alloc(sizeof *f);
  char* slots = page_alloc(NSTEPS * pc->slot_bytes);
  if (f == NULL || slots == NULL) return 1;
  memset(f, 0, sizeof *f);
  desc_fill(&d, ops, sh, is_send, pc, f, slots, 1 - c->index);
  d.on_error = on_error;
  if (pc->events) {
    ev_rec = (struct ev_record){.is_send = is_send, .peer = 1 - c->index, .chunk = pc->slot_bytes,
                                .nsteps_max = pc->steps};
    ev_rec.steps = calloc((size_t)pc->steps, sizeof *ev_rec.steps);
    if (ev_rec.steps == NULL) return 1;
    d.events = &ev_sink;
    d.events_ctx = &ev_rec;
    d.peer_rank = 1 - c->index;
    d.channel = EV_CHANNEL;
  }
  if (!is_send) {
    TEST_EXPECT_RES(ops->listen(0, sh->key, sh->handle[0], &d.listen_comm), ncclSuccess);
    boot_set_flag(&sh->flags[0], 1);
  } else {
    if (boot_wait_flag(&sh->flags[0], 1, WAIT_SEC) != 0) return 1;
    memcpy(d.handle, sh->handle[0], sizeof d.handle);
  }
  TEST_EXPECT_RES(proxy_acquire(0, -1, &proxy), ncclSuccess);
  TEST_EXPECT_RES(proxy_conn_add(proxy, &d, &conn), ncclSuccess);
  if (conn == NULL) return 1;
  double start = boot_now();
  if (is_send) {
    TEST_CHECK(kernel_send(pc, f, slots, sh, 0, pc->steps) == 0, "the sender's steps did not all complete");
  } else if (pc->die_at) {
    /* Steps stop coming when the sender dies; then the proxy must report, not hang. */
    int bad = kernel_recv(pc, f, slots, 0, pc->steps);
    ncclResult_t err = ncclSuccess;
    TEST_CHECK(bad == -1 && boot_wait_flag(&sh->flags[2], 1, 1.0) == 0, "the stream ended without the death");
    TEST_CHECK(atomic_load(&errors_seen) == 1, "on_error called %d times", atomic_load(&errors_seen));
    TEST_CHECK(proxy_conn_state(conn, &err) == -1 && err != ncclSuccess, "the connection does not read as failed");
    fprintf(stderr, "receiver: peer death reported %.2f s after it happened\n", boot_now() - sh->result[0]);
  } else {
    int bad = kernel_recv(pc, f, slots, 0, pc->steps);
    TEST_CHECK(bad == 0, "%d of %d steps arrived wrong", bad, pc->steps);
    double sec = boot_now() - start;
    fprintf(stderr, "%d steps of up to %zu bytes through the proxies in %.2f s (%.2f GB/s)\n",
            pc->steps, pc->slot_bytes, sec, (double)pc->steps * (double)pc->slot_bytes / sec / 1e9);
  }
  if (!pc->die_at) {
    TEST_CHECK(proxy_conn_steps(conn) == (uint64_t)pc->steps, "the proxy counted %llu steps",
               (unsigned long long)proxy_conn_steps(conn));
    TEST_CHECK(atomic_load(&errors_seen) == 0, "on_error was called");
  }
  boot_add_flag(&sh->flags[1], 1); /* both kernels are done before either side closes */
  boot_wait_flag(&sh->flags[1], pc->die_at ? 1 : 2, WAIT_SEC);
  proxy_conn_remove(proxy, conn);
  proxy_release(proxy);
  TEST_CHECK(boot_settle(-1, 0, 5.0) == 0, "Braid threads still running after the proxy's release");
  if (pc->events) {
    ev_check(pc, is_send);
    free(ev_rec.steps);
  }
  free(slots);
  free(f);
  return test_failures ? 1 : 0;
}

static const struct proxy_case case_steps = {.slot_bytes = 64 << 10, .steps = 4000};
static const struct proxy_case case_sizes = {.slot_bytes = 256 << 10, .use_sizes = 1, .steps = 3000};
static const struct proxy_case case_events = {
    .slot_bytes = 64 << 10, .use_sizes = 1, .steps = 2000, .events = 1};
static const struct proxy_case case_death = {.slot_bytes = 64 << 10, .steps = 100000, .die_at = 500};
static const struct proxy_case case_idle = {
    .slot_bytes = 64 << 10, .steps = 400, .pause_at = 200, .pause_sec = 8.0};

/* ---- removefirst / removelast ---- */

#define NCONN 3
#define PHASE_STEPS 200
static const struct proxy_case case_remove = {.slot_bytes = 16 << 10, .steps = NCONN * PHASE_STEPS};

static int remove_child(const struct mp_child* c, int last_first) {
  struct net_shared* sh = c->arg;
  const struct braid_net_ops* ops;
  struct braid_proxy* proxy = NULL;
  struct braid_proxy_conn* conn[NCONN] = {0};
  struct net_fifo_mem* f[NCONN];
  char* slots[NCONN];
  int ndev, is_send = c->index == 1, live[NCONN];
  test_failures = 0;
  int rc = net_util_open(backend, &ops, &ndev);
  if (rc) return rc;
  TEST_EXPECT_RES(proxy_acquire(0, -1, &proxy), ncclSuccess);
  if (proxy == NULL) return 1;
  if (is_send && boot_wait_flag(&sh->flags[0], 1, WAIT_SEC) != 0) return 1;
  for (int k = 0; k < NCONN; k++) {
    struct braid_proxy_conn_desc d;
    f[k] = page_alloc(sizeof *f[k]);
    slots[k] = page_alloc(NSTEPS * case_remove.slot_bytes);
    if (f[k] == NULL || slots[k] == NULL) return 1;
    memset(f[k], 0, sizeof *f[k]);
    desc_fill(&d, ops, sh, is_send, &case_remove, f[k], slots[k], 1 - c->index);
    if (is_send)
      memcpy(d.handle, sh->handle[k], sizeof d.handle);
    else
      TEST_EXPECT_RES(ops->listen(0, sh->key, sh->handle[k], &d.listen_comm), ncclSuccess);
    TEST_EXPECT_RES(proxy_conn_add(proxy, &d, &conn[k]), ncclSuccess);
    if (conn[k] == NULL) return 1;
    live[k] = 1;
  }
  if (!is_send) boot_set_flag(&sh->flags[0], 1);
  for (int phase = 0; phase < NCONN; phase++) {
    int from = phase * PHASE_STEPS, to = from + PHASE_STEPS;
    for (int k = 0; k < NCONN; k++) {
      if (!live[k]) continue;
      int bad = is_send ? kernel_send(&case_remove, f[k], slots[k], sh, from, to)
                        : kernel_recv(&case_remove, f[k], slots[k], from, to);
      TEST_CHECK(bad == 0, "phase %d: connection %d (%d removed before it) %s", phase, k, phase,
                 bad < 0 ? "stopped moving" : "delivered wrong data");
      if (bad != 0) return 1;
    }
    /* Both sides are done with the phase before either removes a connection. */
    boot_add_flag(&sh->flags[3 + phase], 1);
    if (boot_wait_flag(&sh->flags[3 + phase], 2, WAIT_SEC) != 0) return 1;
    int victim = last_first ? NCONN - 1 - phase : phase;
    proxy_conn_remove(proxy, conn[victim]);
    live[victim] = 0;
  }
  proxy_release(proxy);
  for (int k = 0; k < NCONN; k++) {
    free(slots[k]);
    free(f[k]);
  }
  return test_failures ? 1 : 0;
}

static int removefirst_child(const struct mp_child* c) { return remove_child(c, 0); }
static int removelast_child(const struct mp_child* c) { return remove_child(c, 1); }

static int steps_child(const struct mp_child* c) { return proxy_child(c, &case_steps); }
static int sizes_child(const struct mp_child* c) { return proxy_child(c, &case_sizes); }
static int idle_child(const struct mp_child* c) { return proxy_child(c, &case_idle); }
static int events_child(const struct mp_child* c) { return proxy_child(c, &case_events); }

/* The sender of peerdeath kills itself: it runs in a grandchild whose death is the expected end. */
static int death_child(const struct mp_child* c) {
  if (c->index == 0) return proxy_child(c, &case_death);
  pid_t pid = fork();
  if (pid == 0) _exit(proxy_child(c, &case_death));
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 1;
  if (WIFEXITED(status)) return WEXITSTATUS(status) ? WEXITSTATUS(status) : 1;
  return WTERMSIG(status) == SIGKILL ? 0 : 1;
}

int main(int argc, char** argv) {
  static const struct {
    const char* name;
    mp_child_fn fn;
  } cases[] = {{"steps", steps_child},
               {"sizes", sizes_child},
               {"peerdeath", death_child},
               {"removefirst", removefirst_child},
               {"removelast", removelast_child},
               {"idle", idle_child},
               {"events", events_child}};
  const char* arg = argc > 1 ? argv[1] : "";
  const char* sep = strchr(arg, '_');
  if (sep == NULL || (size_t)(sep - arg) >= sizeof backend) {
    fprintf(stderr, "usage: %s <socket|ofi|ib|plugin>_<steps|sizes|peerdeath|removefirst|removelast|idle|events>\n", argv[0]);
    return 2;
  }
  memcpy(backend, arg, (size_t)(sep - arg));
  for (size_t i = 0; i < BRAID_ARRAY_LEN(cases); i++) {
    if (strcmp(sep + 1, cases[i].name) != 0) continue;
    struct net_shared* sh = mp_shared_alloc(sizeof *sh);
    braid_random_bytes(sh->key, sizeof sh->key);
    struct mp_opts opts = {.name = arg, .nprocs = 2, .timeout_sec = 45, .arg = sh};
    int rc = mp_run(&opts, cases[i].fn);
    mp_shared_free(sh, sizeof *sh);
    return mp_verdict_exit(rc, test_failures);
  }
  fprintf(stderr, "%s: unknown case %s\n", argv[0], arg);
  return 2;
}
