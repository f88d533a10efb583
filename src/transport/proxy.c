/*
 * The proxy progress thread (see proxy.h for the FIFO protocol and who owns
 * what). One per GPU per process, shared by every communicator on that GPU,
 * started by the first net connection and stopped with the last.
 *
 * The loop, one screen: apply connections added or removed; give each
 * connection one turn (connect it, or move its steps); when a whole pass
 * moved nothing, yield for a while, then nap, so an idle proxy costs
 * little and a busy one answers within microseconds.
 *
 * Receive ends whose backend offers an event fd (net.h: recv_fd, recv_busy)
 * sit in one epoll set: each pass asks it once which of them got bytes, and
 * tests only those and the ones with requests under way. Otherwise a pass
 * would make a recv() per receive connection, and a communicator has many
 * (channels x peers) of which a small collective uses one: each idle one
 * added ~1 µs to every hop (tests/mp/proxy_latency).
 *
 * Ends with no request under way get the backend's idle() turn every
 * NET_IDLE_TURN_S, busy pass or not (OFI needs it to answer liveness probes).
 */
#include "transport/proxy.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/utils.h"

#define PROXY_MAX_DEVS 64
#define PROXY_SPIN_SEC 0.01   /* yield (stay hot) this long after the last step moved */
#define PROXY_NAP_NS 50000    /* then sleep this long between passes */

enum { CONN_CONNECTING = 0, CONN_READY = 1, CONN_FAILED = -1 };

struct braid_proxy_conn {
  struct braid_proxy_conn_desc d;
  struct braid_proxy_conn* next;        /* in the proxy's `adds` or `conns` list */
  struct braid_proxy_conn* remove_next; /* in its `removes` list: `next` stays the thread's */
  void* comm;                  /* the backend's send or recv comm */
  void* connect_state;         /* send end: the backend's unfinished connect (never in the handle) */
  void* mhandle;               /* the slots' registration */
  double deadline;             /* for connecting */
  uint64_t posted;             /* steps isent / irecv posted */
  uint64_t done;               /* steps whose send completed / whose data was released */
  void* req[BRAID_PROXY_MAX_STEPS];
  void* flush_req;             /* receive end: the flush of step `done`, when one is running */
  int fd;                      /* receive end: its event fd in the proxy's epoll set, or -1 */
  uint64_t ready_pass;         /* the last pass in which that fd polled readable */
  int removed;                 /* the thread let go (under the proxy's lock) */
  atomic_int state;
  atomic_uint_fast64_t steps;  /* `done`, for other threads */
  ncclResult_t error;
  /* With a profiler (d.events): the open operation and its steps' handles, by slot. */
  void* ev_op;
  void* ev_step[BRAID_PROXY_MAX_STEPS];
};

struct braid_proxy {
  int cuda_dev;
  int64_t bus_id;
  int refs;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct braid_proxy_conn* conns;   /* the thread's */
  struct braid_proxy_conn* adds;    /* handed over, not yet picked up */
  struct braid_proxy_conn* removes; /* to let go of */
  atomic_int changes;
  atomic_int stop;
  /* The thread's: receive ends' event fds, and what the last epoll_wait said. */
  int epfd;                         /* -1: none (could not create one: every end is tested) */
  int nfds;                         /* fds in the set */
  struct epoll_event* events;       /* [events_cap] */
  int events_cap;
  uint64_t pass;                    /* passes so far */
  unsigned long reports_seen;       /* reports made (braid_report_gen) */
  int polled;                       /* this pass's epoll_wait succeeded */
  double idle_turns_at;             /* when the ends without requests last had idle() */
};

static pthread_mutex_t proxies_lock = PTHREAD_MUTEX_INITIALIZER;
static struct braid_proxy* proxies[PROXY_MAX_DEVS];

/* ------------------------------------------------------------ one connection */

/* Stops the connection and reports once; returns 0 (nothing moved) for the callers' convenience. */
static int proxy_conn_fail(struct braid_proxy_conn* c, ncclResult_t res, const char* what) {
  c->error = res;
  atomic_store(&c->state, CONN_FAILED);
  /* The backend's message names an address; the comm's error should name the rank too. */
  char why[BRAID_ERROR_MAX];
  snprintf(why, sizeof why, "%s", braid_err_last());
  braid_err(res, "proxy: %s connection with %s failed while %s: %s",
            c->d.is_send ? "send" : "receive", c->d.peer, what, why[0] ? why : braid_result_str(res));
  if (c->d.on_error) c->d.on_error(c->d.error_arg, res);
  return 0;
}

/* Puts a ready receive end's event fd into the epoll set, when its backend has one. */
static void proxy_fd_add(struct braid_proxy* p, struct braid_proxy_conn* c) {
  const struct braid_net_ops* net = c->d.net;
  c->fd = -1;
  if (p->epfd < 0 || net->size < sizeof *net || net->recv_fd == NULL || net->recv_busy == NULL)
    return;
  int fd = net->recv_fd(c->comm);
  if (fd < 0) return;
  if (p->nfds == p->events_cap) {
    int cap = p->events_cap ? 2 * p->events_cap : 16;
    struct epoll_event* ev = realloc(p->events, (size_t)cap * sizeof *ev);
    if (ev == NULL) return; /* then this end is tested on every pass */
    p->events = ev;
    p->events_cap = cap;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
  if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    INFO(BRAID_LOG_PROXY,
         "proxy: epoll_ctl(ADD) for %s failed (%s); its end is tested on every pass", c->d.peer,
         strerror(errno));
    return;
  }
  c->fd = fd;
  p->nfds++;
}

static void proxy_fd_remove(struct braid_proxy* p, struct braid_proxy_conn* c) {
  if (c->fd < 0) return;
  if (epoll_ctl(p->epfd, EPOLL_CTL_DEL, c->fd, NULL) != 0)
    WARN("proxy: epoll_ctl(DEL) for %s failed: %s", c->d.peer, strerror(errno));
  c->fd = -1;
  p->nfds--;
}

/* Once per pass: which receive ends got bytes. */
static void proxy_fd_poll(struct braid_proxy* p) {
  p->pass++;
  p->polled = 0;
  if (p->nfds == 0) return;
  int n = epoll_wait(p->epfd, p->events, p->events_cap, 0);
  if (n < 0) return; /* EINTR: this pass tests every end */
  for (int i = 0; i < n; i++)
    ((struct braid_proxy_conn*)p->events[i].data.ptr)->ready_pass = p->pass;
  p->polled = 1;
}

/* A receive end whose test() can only say "not done" in this pass. */
static int proxy_recv_quiet(const struct braid_proxy* p, const struct braid_proxy_conn* c) {
  return c->fd >= 0 && p->polled && c->ready_pass != p->pass && c->flush_req == NULL &&
         !c->d.net->recv_busy(c->comm);
}

static ncclResult_t proxy_conn_register(struct braid_proxy_conn* c) {
  const struct braid_net_ops* net = c->d.net;
  size_t bytes = c->d.fifo.slot_bytes * (size_t)c->d.fifo.nsteps;
  if (c->d.dmabuf_fd >= 0)
    return net->reg_mr_dmabuf(c->comm, c->d.fifo.buff, bytes, c->d.dmabuf_offset, c->d.dmabuf_fd,
                              &c->mhandle);
  return net->reg_mr(c->comm, c->d.fifo.buff, bytes, c->d.buff_is_cuda, &c->mhandle);
}

/* One connect/accept attempt; 1 when the connection became ready. */
static int proxy_conn_connect(struct braid_proxy* p, struct braid_proxy_conn* c) {
  const struct braid_net_ops* net = c->d.net;
  ncclResult_t res =
      c->d.is_send ? net->connect(c->d.dev, c->d.key, c->d.handle, &c->connect_state, &c->comm)
                   : net->accept(c->d.listen_comm, &c->comm);
  if (res != ncclSuccess) return proxy_conn_fail(c, res, "connecting");
  if (c->comm == NULL) {
    if (braid_time_sec() < c->deadline) return 0;
    return proxy_conn_fail(c, braid_err(ncclRemoteError,
                                 "proxy: no %s connection with %s within %.0f s over NET/%s (is "
                                 "the peer alive, and can it reach this host?)",
                                 c->d.is_send ? "send" : "receive", c->d.peer,
                                 c->d.connect_timeout, net->name),
                    "connecting");
  }
  if (!c->d.is_send) {
    net->close_listen(c->d.listen_comm); /* one connection per listener */
    c->d.listen_comm = NULL;
  }
  res = proxy_conn_register(c);
  if (res != ncclSuccess) return proxy_conn_fail(c, res, "registering the FIFO");
  if (!c->d.is_send) proxy_fd_add(p, c);
  atomic_store(&c->state, CONN_READY);
  INFO(BRAID_LOG_PROXY, "proxy: %s connection with %s ready over NET/%s (%d steps of %zu bytes)",
       c->d.is_send ? "send" : "receive", c->d.peer, net->name, c->d.fifo.nsteps,
       c->d.fifo.slot_bytes);
  return 1;
}

static char* proxy_slot(const struct braid_proxy_conn* c, uint64_t step) {
  return c->d.fifo.buff + (size_t)(step % (uint64_t)c->d.fifo.nsteps) * c->d.fifo.slot_bytes;
}

/* ---- profiler events (proxy_events.h); called only when the connection has a sink ---- */

/* A step enters the FIFO's slot `slot`: opens the operation if none is, starts the step. */
static void proxy_ev_step_begin(struct braid_proxy_conn* c, int slot, uint64_t step, int nsteps) {
  const struct braid_proxy_events* ev = c->d.events;
  if (c->ev_op == NULL)
    c->ev_op = ev->op_start(c->d.events_ctx, c->d.is_send, c->d.peer_rank, c->d.channel, nsteps,
                            (int)c->d.fifo.slot_bytes);
  c->ev_step[slot] = c->ev_op ? ev->step_start(c->d.events_ctx, c->ev_op, (int)step) : NULL;
}

static void proxy_ev_step_state(struct braid_proxy_conn* c, int slot, braid_proxy_step_state_t st,
                                size_t bytes) {
  if (c->ev_step[slot]) c->d.events->step_state(c->d.events_ctx, c->ev_step[slot], st, bytes);
}

static void proxy_ev_step_end(struct braid_proxy_conn* c, int slot) {
  if (c->ev_step[slot]) c->d.events->step_stop(c->d.events_ctx, c->ev_step[slot]);
  c->ev_step[slot] = NULL;
}

/* Closes the open operation (its steps first: a connection that failed leaves some open). */
static void proxy_ev_op_end(struct braid_proxy_conn* c) {
  for (int s = 0; s < BRAID_PROXY_MAX_STEPS; s++) proxy_ev_step_end(c, s);
  if (c->ev_op) c->d.events->op_stop(c->d.events_ctx, c->ev_op);
  c->ev_op = NULL;
}

/* Send end: isend every filled slot, release `head` over completed sends. 1 when something moved. */
static int proxy_send_progress(struct braid_proxy_conn* c) {
  const struct braid_proxy_fifo* f = &c->d.fifo;
  uint64_t tail = atomic_load_explicit(f->tail, memory_order_acquire);
  int moved = 0;
  while (c->posted < tail && c->posted - c->done < (uint64_t)f->nsteps) {
    int slot = (int)(c->posted % (uint64_t)f->nsteps);
    size_t bytes = f->sizes ? atomic_load_explicit(&f->sizes[slot], memory_order_relaxed) : f->slot_bytes;
    ncclResult_t res = c->d.net->isend(c->comm, proxy_slot(c, c->posted), BRAID_MIN(bytes, f->slot_bytes),
                                       c->mhandle, &c->req[slot]);
    if (res != ncclSuccess) return proxy_conn_fail(c, res, "sending");
    if (c->req[slot] == NULL) break;
    if (__builtin_expect(c->d.events != NULL, 0)) {
      proxy_ev_step_begin(c, slot, c->posted, (int)(tail - c->posted));
      proxy_ev_step_state(c, slot, BRAID_PROXY_STEP_SEND_WAIT, BRAID_MIN(bytes, f->slot_bytes));
    }
    c->posted++;
    moved = 1;
  }
  while (c->done < c->posted) {
    int done = 0;
    ncclResult_t res = c->d.net->test(c->req[c->done % (uint64_t)f->nsteps], &done, NULL);
    if (res != ncclSuccess) return proxy_conn_fail(c, res, "sending");
    if (!done) break;
    if (__builtin_expect(c->d.events != NULL, 0)) proxy_ev_step_end(c, (int)(c->done % (uint64_t)f->nsteps));
    c->done++;
    /* The count first: whoever sees the step published sees it counted too. */
    atomic_store_explicit(&c->steps, c->done, memory_order_relaxed);
    atomic_store_explicit(f->head, c->done, memory_order_release);
    moved = 1;
  }
  if (__builtin_expect(c->d.events != NULL, 0) && c->ev_op && c->done == c->posted &&
      c->posted == atomic_load_explicit(f->tail, memory_order_acquire))
    proxy_ev_op_end(c);
  return moved;
}

/* Receive end, oldest step: 1 when its data (flushed, if needed) may go to the kernel. */
static int proxy_recv_complete(struct braid_proxy_conn* c, int slot) {
  const struct braid_proxy_fifo* f = &c->d.fifo;
  int done = 0;
  size_t size = 0;
  if (c->flush_req == NULL) {
    ncclResult_t res = c->d.net->test(c->req[slot], &done, &size);
    if (res != ncclSuccess) return proxy_conn_fail(c, res, "receiving");
    if (!done) return 0;
    if (f->sizes) atomic_store_explicit(&f->sizes[slot], (uint32_t)size, memory_order_relaxed);
    if (__builtin_expect(c->d.events != NULL, 0))
      proxy_ev_step_begin(c, slot, c->done, (int)(c->posted - c->done));
    if (!c->d.buff_is_cuda) return 1;
    if (__builtin_expect(c->d.events != NULL, 0))
      proxy_ev_step_state(c, slot, BRAID_PROXY_STEP_RECV_FLUSH, size);
    res = c->d.net->iflush(c->comm, proxy_slot(c, c->done), size, c->mhandle, &c->flush_req);
    if (res != ncclSuccess) return proxy_conn_fail(c, res, "flushing");
    if (c->flush_req == NULL) return 1;
  }
  ncclResult_t res = c->d.net->test(c->flush_req, &done, NULL);
  if (res != ncclSuccess) return proxy_conn_fail(c, res, "flushing");
  if (done) c->flush_req = NULL;
  return done;
}

/* Receive end: keep an irecv on every free slot, release `tail` over completed ones. */
static int proxy_recv_progress(struct braid_proxy* p, struct braid_proxy_conn* c) {
  const struct braid_proxy_fifo* f = &c->d.fifo;
  uint64_t head = atomic_load_explicit(f->head, memory_order_acquire);
  int moved = 0;
  while (c->posted < head + (uint64_t)f->nsteps) {
    int slot = (int)(c->posted % (uint64_t)f->nsteps);
    ncclResult_t res = c->d.net->irecv(c->comm, proxy_slot(c, c->posted), f->slot_bytes, c->mhandle,
                                       &c->req[slot]);
    if (res != ncclSuccess) return proxy_conn_fail(c, res, "receiving");
    if (c->req[slot] == NULL) break;
    c->posted++;
    moved = 1;
  }
  int arrived = 0;
  if (proxy_recv_quiet(p, c)) goto out;
  while (c->done < c->posted && atomic_load(&c->state) == CONN_READY) {
    const int slot = (int)(c->done % (uint64_t)f->nsteps);
    if (!proxy_recv_complete(c, slot)) break;
    if (__builtin_expect(c->d.events != NULL, 0)) {
      proxy_ev_step_state(c, slot, BRAID_PROXY_STEP_RECV_GPU,
                          f->sizes ? atomic_load_explicit(&f->sizes[slot], memory_order_relaxed)
                                   : f->slot_bytes);
      proxy_ev_step_end(c, slot);
    }
    c->done++;
    atomic_store_explicit(&c->steps, c->done, memory_order_relaxed); /* before the publication */
    atomic_store_explicit(f->tail, c->done, memory_order_release);
    moved = arrived = 1;
  }
out:
  /* The kernel read every step delivered, and none arrived since: the operation is over. */
  if (__builtin_expect(c->d.events != NULL, 0) && c->ev_op && !arrived &&
      atomic_load_explicit(f->head, memory_order_acquire) == c->done)
    proxy_ev_op_end(c);
  return moved;
}

static int proxy_conn_progress(struct braid_proxy* p, struct braid_proxy_conn* c) {
  switch (atomic_load_explicit(&c->state, memory_order_relaxed)) {
    case CONN_CONNECTING: return proxy_conn_connect(p, c);
    case CONN_READY: return c->d.is_send ? proxy_send_progress(c) : proxy_recv_progress(p, c);
    default:
      proxy_fd_remove(p, c); /* failed: a closed socket would poll readable on every pass */
      return 0;
  }
}

/* The backend's idle() for every ready end with no request under way (net.h). */
static void proxy_idle_turns(struct braid_proxy* p) {
  for (struct braid_proxy_conn* c = p->conns; c; c = c->next) {
    const struct braid_net_ops* net = c->d.net;
    if (net->size <= offsetof(struct braid_net_ops, idle) || net->idle == NULL ||
        c->posted != c->done || atomic_load_explicit(&c->state, memory_order_relaxed) != CONN_READY)
      continue;
    ncclResult_t res = net->idle(c->comm);
    if (res != ncclSuccess) proxy_conn_fail(c, res, "waiting for work");
  }
}

/* ------------------------------------------------------------- the thread */

/*
 * On SIGUSR1 or a watchdog's early warning (with its verdict): every connection's steps as this
 * thread sees them, so a hang between the kernels and the network shows on which side a step
 * stopped. A thread stuck in the backend says nothing: its silence tells that too.
 */
static void proxy_report(struct braid_proxy* p) {
  int n = 0;
  for (struct braid_proxy_conn* c = p->conns; c; c = c->next) n++;
  WARN("proxy of GPU %d (report asked): %d connection%s, pass %llu", p->cuda_dev, n,
       n == 1 ? "" : "s", (unsigned long long)p->pass);
  for (struct braid_proxy_conn* c = p->conns; c; c = c->next) {
    const struct braid_proxy_fifo* f = &c->d.fifo;
    int state = atomic_load(&c->state);
    WARN("proxy: %s %s over NET/%s: %s; steps posted %llu, done %llu; FIFO tail %llu, head %llu",
         c->d.is_send ? "send to" : "receive from", c->d.peer, c->d.net->name,
         state == CONN_READY ? "ready" : state == CONN_CONNECTING ? "connecting" : "failed",
         (unsigned long long)c->posted, (unsigned long long)c->done,
         (unsigned long long)atomic_load(f->tail), (unsigned long long)atomic_load(f->head));
  }
}

/* Picks up added connections and lets go of removed ones (under the lock). */
static void proxy_apply_changes(struct braid_proxy* p) {
  pthread_mutex_lock(&p->lock);
  while (p->adds) {
    struct braid_proxy_conn* c = p->adds;
    p->adds = c->next;
    c->next = p->conns;
    p->conns = c;
  }
  for (struct braid_proxy_conn* r = p->removes; r; r = p->removes) {
    p->removes = r->remove_next;
    for (struct braid_proxy_conn** at = &p->conns; *at; at = &(*at)->next) {
      if (*at == r) {
        *at = r->next;
        break;
      }
    }
    proxy_fd_remove(p, r);
    r->removed = 1;
  }
  atomic_store(&p->changes, 0);
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
}

/* Nothing moved in this pass: stay hot for a while after the last step, then nap. */
static void proxy_idle(struct braid_proxy* p, double now, double last_busy) {
  if (p->conns == NULL) {
    pthread_mutex_lock(&p->lock);
    if (!atomic_load(&p->changes) && !atomic_load(&p->stop)) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += 1;
      pthread_cond_timedwait(&p->cond, &p->lock, &ts);
    }
    pthread_mutex_unlock(&p->lock);
  } else if (now - last_busy < PROXY_SPIN_SEC) {
    sched_yield();
  } else {
    struct timespec nap = {0, PROXY_NAP_NS};
    nanosleep(&nap, NULL);
  }
}

static void* proxy_main(void* arg) {
  struct braid_proxy* p = arg;
  char name[16];
  snprintf(name, sizeof name, "braid-proxy%d", p->cuda_dev);
  pthread_setname_np(pthread_self(), name);
  braid_log_context_set(-1, p->cuda_dev);
  double last_busy = braid_time_sec();
  p->reports_seen = braid_report_gen();
  while (!atomic_load(&p->stop)) {
    if (atomic_load(&p->changes)) proxy_apply_changes(p);
    if (braid_report_gen() != p->reports_seen) {
      p->reports_seen = braid_report_gen();
      proxy_report(p);
    }
    int moved = 0;
    proxy_fd_poll(p);
    for (struct braid_proxy_conn* c = p->conns; c; c = c->next) moved |= proxy_conn_progress(p, c);
    double now = braid_time_sec();
    if (now - p->idle_turns_at >= NET_IDLE_TURN_S) {
      proxy_idle_turns(p);
      p->idle_turns_at = now;
    }
    if (moved)
      last_busy = now;
    else
      proxy_idle(p, now, last_busy);
  }
  return NULL;
}

/* "0-15,32-47" into a CPU set; 0 on success. */
static int proxy_cpulist_parse(const char* text, cpu_set_t* set) {
  CPU_ZERO(set);
  for (const char* p = text; *p && *p != '\n';) {
    char* end = NULL;
    long lo = strtol(p, &end, 10), hi = lo;
    if (end == p || lo < 0) return -1;
    if (*end == '-') {
      p = end + 1;
      hi = strtol(p, &end, 10);
      if (end == p || hi < lo) return -1;
    }
    for (long cpu = lo; cpu <= hi && cpu < CPU_SETSIZE; cpu++) CPU_SET((int)cpu, set);
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0' && *end != '\n') return -1;
  }
  return 0;
}

/* Pins the thread to the CPUs near the GPU (its NUMA node), within the process's own CPU set. */
static void proxy_pin(struct braid_proxy* p) {
  char busid[32], path[96], list[1024];
  cpu_set_t near, allowed;
  if (p->bus_id < 0) return;
  braid_busid_to_str(p->bus_id, busid, sizeof busid);
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/local_cpulist", busid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return;
  int ok = fgets(list, sizeof list, f) != NULL;
  fclose(f);
  if (!ok || proxy_cpulist_parse(list, &near) != 0) return;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  CPU_AND(&near, &near, &allowed);
  if (CPU_COUNT(&near) == 0) return; /* the process was confined elsewhere: respect that */
  int err = pthread_setaffinity_np(p->thread, sizeof near, &near);
  list[strcspn(list, "\n")] = '\0';
  INFO(BRAID_LOG_INIT, "proxy of GPU %d (%s): %s CPUs %s", p->cuda_dev, busid,
       err == 0 ? "pinned to" : "could not be pinned to", list);
}

ncclResult_t proxy_acquire(int cuda_dev, int64_t bus_id, struct braid_proxy** out) {
  ncclResult_t res = ncclSuccess;
  struct braid_proxy* p = NULL;
  *out = NULL;
  if (cuda_dev < 0 || cuda_dev >= PROXY_MAX_DEVS)
    return braid_err(ncclInternalError, "proxy: device %d out of range", cuda_dev);
  pthread_mutex_lock(&proxies_lock);
  p = proxies[cuda_dev];
  if (p == NULL) {
    BRAID_TRY(BRAID_CALLOC(&p, 1, "the proxy"));
    p->cuda_dev = cuda_dev;
    p->bus_id = bus_id;
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (p->epfd < 0)
      INFO(BRAID_LOG_PROXY,
           "proxy: epoll_create1 failed (%s); every receive end is tested on every pass",
           strerror(errno));
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    int err = pthread_create(&p->thread, NULL, proxy_main, p);
    if (err != 0) {
      res = braid_err(ncclSystemError, "proxy: cannot start the progress thread of GPU %d: %s",
                      cuda_dev, strerror(err));
      pthread_cond_destroy(&p->cond);
      pthread_mutex_destroy(&p->lock);
      if (p->epfd >= 0) close(p->epfd);
      free(p);
      goto fail;
    }
    proxy_pin(p);
    proxies[cuda_dev] = p;
  }
  p->refs++;
  *out = p;
fail:
  pthread_mutex_unlock(&proxies_lock);
  return res;
}

void proxy_release(struct braid_proxy* p) {
  if (p == NULL) return;
  pthread_mutex_lock(&proxies_lock);
  int last = --p->refs == 0;
  if (last) proxies[p->cuda_dev] = NULL;
  pthread_mutex_unlock(&proxies_lock);
  if (!last) return;
  pthread_mutex_lock(&p->lock);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  pthread_join(p->thread, NULL);
  if (p->conns || p->adds) WARN("proxy of GPU %d stopped with connections still attached", p->cuda_dev);
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->lock);
  if (p->epfd >= 0) close(p->epfd);
  free(p->events);
  free(p);
}

ncclResult_t proxy_conn_add(struct braid_proxy* p, const struct braid_proxy_conn_desc* desc,
                            struct braid_proxy_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct braid_proxy_conn* c = NULL;
  *out = NULL;
  BRAID_CHECK(desc->fifo.nsteps > 0 && desc->fifo.nsteps <= BRAID_PROXY_MAX_STEPS, ncclInternalError,
              "proxy: a FIFO of %d steps (at most %d)", desc->fifo.nsteps, BRAID_PROXY_MAX_STEPS);
  BRAID_TRY(BRAID_CALLOC(&c, 1, "a proxy connection"));
  c->d = *desc;
  c->fd = -1;
  c->deadline = braid_time_sec() + desc->connect_timeout;
  atomic_store(&c->state, CONN_CONNECTING);
  pthread_mutex_lock(&p->lock);
  c->next = p->adds;
  p->adds = c;
  atomic_store(&p->changes, 1);
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  *out = c;
  return ncclSuccess;
fail:
  return res;
}

/* Closes what the connection holds of the backend (after the thread let go of it). */
static void proxy_conn_close(struct braid_proxy_conn* c) {
  const struct braid_net_ops* net = c->d.net;
  if (c->comm && c->mhandle) net->dereg_mr(c->comm, c->mhandle);
  /* An aborted comm's peers must see a failure, not a clean close they would wait past. */
  const int aborted = c->d.abort_flag && __atomic_load_n(c->d.abort_flag, __ATOMIC_ACQUIRE);
  if (c->comm && aborted && net->size > offsetof(struct braid_net_ops, close_abort) &&
      net->close_abort)
    net->close_abort(c->comm);
  else if (c->comm)
    (c->d.is_send ? net->close_send : net->close_recv)(c->comm);
  if (c->connect_state) net->connect_abandon(c->connect_state);
  c->connect_state = NULL;
  if (c->d.listen_comm) net->close_listen(c->d.listen_comm);
}

void proxy_conn_remove(struct braid_proxy* p, struct braid_proxy_conn* c) {
  if (c == NULL) return;
  pthread_mutex_lock(&p->lock);
  /* Still in the adds list: the thread never saw it. */
  int found = 0;
  for (struct braid_proxy_conn** at = &p->adds; *at; at = &(*at)->next) {
    if (*at == c) {
      *at = c->next;
      found = 1;
      break;
    }
  }
  if (!found) {
    /*
     * In the thread's list, which it walks without the lock: leave c->next
     * alone (cutting it would drop every connection behind c) and let the
     * thread unlink c itself.
     */
    c->remove_next = p->removes;
    p->removes = c;
    atomic_store(&p->changes, 1);
    pthread_cond_broadcast(&p->cond);
    while (!c->removed) pthread_cond_wait(&p->cond, &p->lock);
  }
  pthread_mutex_unlock(&p->lock);
  if (c->d.events) proxy_ev_op_end(c); /* the thread let go: its open events end here */
  proxy_conn_close(c);
  free(c);
}

int proxy_conn_state(const struct braid_proxy_conn* c, ncclResult_t* error) {
  int state = atomic_load(&c->state);
  if (error) *error = state == CONN_FAILED ? c->error : ncclSuccess;
  return state;
}

uint64_t proxy_conn_steps(const struct braid_proxy_conn* c) {
  return atomic_load_explicit(&c->steps, memory_order_relaxed);
}
