/*
 * The bootstrap root: the one address every rank of a new communicator
 * knows (from the unique id) and contacts first.
 *
 * One thread serves one rendezvous from a single poll() loop, so a slow or
 * hostile connection never holds up the others: each new connection has
 * BOOTSTRAP_HELLO_SEC to present a hello with the job's secret, at most
 * BOOTSTRAP_MAX_PENDING wait for theirs at once (the oldest makes room for a
 * newcomer), and what fails is closed and logged (one WARN per burst). A
 * valid JOIN registers the rank's listener. When all ranks are in, each gets
 * the listener of the next rank (ranks then gather everything else over that
 * ring, so the root sends O(N) bytes, not O(N^2)) and the thread exits.
 *
 * The first JOIN fixes the number of ranks; a JOIN that says another number
 * is refused (with both numbers) and the rendezvous goes on without it, so a
 * stray process cannot spoil it. If every rank that joined leaves again, the
 * next JOIN fixes the number anew.
 *
 * Failures are answered to every joined rank, which reports them:
 * - two ranks claim one rank number: at once, with ncclInvalidArgument naming
 *   both processes; later arrivals get the same answer until the deadline;
 * - not everyone arrived within BRAID_BOOTSTRAP_TIMEOUT of the first arrival:
 *   ncclSystemError naming the missing ranks (and a JOIN refused meanwhile).
 *   The root then exits, so a thread never outlives its rendezvous by more
 *   than the timeout.
 * Before the first JOIN there is no deadline: an id may be used long after
 * ncclGetUniqueId made it. Such a root lasts until the process ends, the
 * library is unloaded, or bootstrap_roots_stop is called.
 * The root logs failures at INFO only: the ranks log them as their own errors.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_internal.h"
#include "base/debug.h"
#include "base/error.h"
#include "base/socket.h"
#include "base/utils.h"

#define ROOT_ADDR_TEXT 80
/* Missing ranks listed by number before the list is cut short. */
#define ROOT_MISSING_LISTED 32
/* How long bootstrap_roots_stop waits for the threads it stopped. */
#define ROOT_STOP_WAIT_S 2

struct bootstrap_root {
  int listen_fd;
  char addr_text[ROOT_ADDR_TEXT];
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  double timeout;
  double deadline;             /* negative until the first JOIN */
  double first_join;
  int detached;
  pthread_t thread;
  uint32_t stop;               /* set by bootstrap_root_join or bootstrap_roots_stop (atomic) */
  int done;
  int nranks;                  /* 0 until the first JOIN */
  struct bootstrap_incoming first; /* copy of the first JOIN, to name it in a nranks conflict */
  /* Connections to listen_fd; rank: the one a valid JOIN claimed, else -1. */
  struct bootstrap_listener listener;
  struct bootstrap_incoming** joined; /* [nranks] */
  int njoined;
  ncclResult_t failure;
  char failure_text[BOOTSTRAP_MAX_REPLY_TEXT];
  char refused_text[BOOTSTRAP_MAX_REPLY_TEXT]; /* the last JOIN refused for its nranks */
  struct pollfd* pfds;
  int pfd_cap;
  struct bootstrap_root* next_live; /* in roots_live, while a detached root's thread runs */
};

/* ------------------------------------------------------ detached roots */

/*
 * The detached roots whose thread runs, so that bootstrap_roots_stop can end them. Their
 * listeners are closed under roots_lock, so that the stopper's shutdown() never meets an fd
 * number that was closed and given to something else.
 */
static pthread_mutex_t roots_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t roots_cond = PTHREAD_COND_INITIALIZER;
static struct bootstrap_root* roots_live;
static pthread_once_t roots_fork_once = PTHREAD_ONCE_INIT;

static void roots_fork_prepare(void) { pthread_mutex_lock(&roots_lock); }
static void roots_fork_parent(void) { pthread_mutex_unlock(&roots_lock); }

/* A forked child has none of the root threads: its copies of their listeners must not hold the ports. */
static void roots_fork_child(void) {
  for (struct bootstrap_root* r = roots_live; r != NULL; r = r->next_live)
    if (r->listen_fd >= 0) close(r->listen_fd);
  roots_live = NULL;
  pthread_mutex_unlock(&roots_lock);
}

static void roots_fork_register(void) {
  pthread_atfork(roots_fork_prepare, roots_fork_parent, roots_fork_child);
}

static void roots_add(struct bootstrap_root* root) {
  pthread_once(&roots_fork_once, roots_fork_register);
  pthread_mutex_lock(&roots_lock);
  root->next_live = roots_live;
  roots_live = root;
  pthread_mutex_unlock(&roots_lock);
}

/* Unlinks a detached root and closes its listener; it is then the caller's alone to free. */
static void roots_remove(struct bootstrap_root* root) {
  pthread_mutex_lock(&roots_lock);
  socket_close(&root->listen_fd);
  for (struct bootstrap_root** link = &roots_live; *link != NULL; link = &(*link)->next_live) {
    if (*link != root) continue;
    *link = root->next_live;
    break;
  }
  pthread_cond_broadcast(&roots_cond);
  pthread_mutex_unlock(&roots_lock);
}

/* Waits, with roots_lock held, until no detached root runs or ROOT_STOP_WAIT_S passed. */
static void roots_wait_locked(void) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ROOT_STOP_WAIT_S;
  while (roots_live != NULL && pthread_cond_timedwait(&roots_cond, &roots_lock, &until) == 0) {
  }
}

void bootstrap_roots_stop(void) {
  pthread_mutex_lock(&roots_lock);
  for (struct bootstrap_root* r = roots_live; r != NULL; r = r->next_live) {
    __atomic_store_n(&r->stop, 1, __ATOMIC_RELEASE);
    if (r->listen_fd >= 0) shutdown(r->listen_fd, SHUT_RDWR); /* wakes its poll() at once */
  }
  roots_wait_locked();
  pthread_mutex_unlock(&roots_lock);
}

/*
 * The library is unloaded (or the process exits): a root thread must not run on in code that is
 * gone. Skipped if the lock is taken, rather than risk hanging the exit.
 */
__attribute__((destructor)) static void roots_unload(void) {
  if (pthread_mutex_trylock(&roots_lock) != 0) return;
  int any = roots_live != NULL;
  pthread_mutex_unlock(&roots_lock);
  if (any) bootstrap_roots_stop();
}

/* ------------------------------------------------------- connections */

/* "pid 4242 on node1 (10.0.0.1:41234)": who a joined connection is. */
static const char* root_conn_describe(const struct bootstrap_incoming* c, char* buf, size_t size) {
  char addr[ROOT_ADDR_TEXT];
  snprintf(buf, size, "pid %d on %s at %s", (int)c->hello.pid, c->hello.host,
           socket_addr_str(&c->remote, addr, sizeof addr));
  return buf;
}

/* Closes a connection; a joined rank's leaves the table of joined ranks. */
static void root_conn_kill(struct bootstrap_root* root, struct bootstrap_incoming* c) {
  if (c->rank >= 0 && root->joined && root->joined[c->rank] == c) {
    root->joined[c->rank] = NULL;
    root->njoined--;
  }
  socket_close(&c->fd);
}

static void root_conn_close_op(void* owner, struct bootstrap_incoming* c) { root_conn_kill(owner, c); }

static const char* root_name(const void* owner, char* buf, size_t size) {
  const struct bootstrap_root* root = owner;
  snprintf(buf, size, "bootstrap root %s", root->addr_text);
  return buf;
}

static void root_reply(struct bootstrap_root* root, struct bootstrap_incoming* c, ncclResult_t status,
                       const char* text, const struct bootstrap_wire_addr* next) {
  struct bootstrap_reply reply;
  memset(&reply, 0, sizeof reply);
  reply.magic = BOOTSTRAP_WIRE_MAGIC;
  reply.status = (int32_t)status;
  if (next) reply.next = *next;
  size_t len = text ? BRAID_MIN(strlen(text), (size_t)BOOTSTRAP_MAX_REPLY_TEXT) : 0;
  reply.text_len = (uint32_t)len;
  /* The rank is waiting for exactly this, so a short timeout only guards against a dead one. */
  if (socket_send_all(c->fd, &reply, sizeof reply, BOOTSTRAP_HELLO_SEC, &root->stop) == ncclSuccess &&
      len > 0)
    socket_send_all(c->fd, text, len, BOOTSTRAP_HELLO_SEC, &root->stop);
  root_conn_kill(root, c);
}

/*
 * Ends the rendezvous with an error that every joined rank, `also` (a
 * connection not yet joined, may be NULL) and every later arrival receive.
 * Ranks of our own process are answered last: once answered they may exit,
 * and this thread with them.
 */
static void root_fail(struct bootstrap_root* root, ncclResult_t status, const char* text,
                      struct bootstrap_incoming* also) {
  INFO(BRAID_LOG_BOOTSTRAP, "bootstrap root %s: rendezvous failed: %s", root->addr_text, text);
  root->failure = status;
  snprintf(root->failure_text, sizeof root->failure_text, "%s", text);
  int self = (int)getpid();
  for (int ours = 0; ours <= 1; ours++) {
    for (int r = 0; r < root->nranks; r++) {
      struct bootstrap_incoming* c = root->joined[r];
      if (c && (c->hello.pid == self) == ours) root_reply(root, c, status, text, NULL);
    }
    if (also && (also->hello.pid == self) == ours) root_reply(root, also, status, text, NULL);
  }
}

static void root_finish(struct bootstrap_root* root) {
  INFO(BRAID_LOG_BOOTSTRAP, "bootstrap root %s: all %d ranks joined in %.3f s", root->addr_text,
       root->nranks, braid_time_sec() - root->first_join);
  /* Each reply closes its connection and clears joined[r]: keep rank 0's listener for the last rank. */
  struct bootstrap_wire_addr rank0 = root->joined[0]->hello.listen;
  const int n = root->nranks;
  for (int r = 0; r < n; r++) {
    struct bootstrap_wire_addr next = r + 1 < n ? root->joined[r + 1]->hello.listen : rank0;
    root_reply(root, root->joined[r], ncclSuccess, NULL, &next);
  }
  root->done = 1;
}

/* The first JOIN fixes nranks and starts the clock: the timeout counts from the first arrival. */
static int root_first_join(struct bootstrap_root* root, struct bootstrap_incoming* c) {
  root->joined = calloc((size_t)c->hello.nranks, sizeof *root->joined);
  if (root->joined == NULL) {
    root_reply(root, c, ncclSystemError, "bootstrap: the root is out of memory", NULL);
    return -1;
  }
  root->nranks = c->hello.nranks;
  root->first = *c;
  if (root->deadline < 0) {
    root->first_join = braid_time_sec();
    root->deadline = root->first_join + root->timeout;
  }
  return 0;
}

/* Every rank that joined left again: the next JOIN fixes the number of ranks anew. */
static void root_forget_nranks(struct bootstrap_root* root) {
  INFO(BRAID_LOG_BOOTSTRAP, "bootstrap root %s: every rank that joined left; the next join sets the "
       "number of ranks again", root->addr_text);
  free(root->joined);
  root->joined = NULL;
  root->nranks = 0;
}

/* A JOIN that says another nranks than the first: refused alone, the rendezvous goes on. */
static void root_refuse_nranks(struct bootstrap_root* root, struct bootstrap_incoming* c) {
  char who[160], first[160];
  const struct bootstrap_hello* h = &c->hello;
  snprintf(root->refused_text, sizeof root->refused_text,
           "bootstrap: rank %d (%s) passed nranks %d, but the rendezvous at %s is for %d ranks, "
           "as rank %d (%s) said when it joined first; every rank must pass the same nranks "
           "(this join is refused, the others wait on)",
           (int)h->rank, root_conn_describe(c, who, sizeof who), (int)h->nranks, root->addr_text,
           root->nranks, (int)root->first.hello.rank,
           root_conn_describe(&root->first, first, sizeof first));
  INFO(BRAID_LOG_BOOTSTRAP, "%s", root->refused_text);
  root_reply(root, c, ncclInvalidArgument, root->refused_text, NULL);
}

/* Checks a JOIN against the ones before it; a rank claimed twice fails the whole rendezvous. */
static void root_handle_join(struct bootstrap_root* root, struct bootstrap_incoming* c) {
  const struct bootstrap_hello* h = &c->hello;
  char text[BOOTSTRAP_MAX_REPLY_TEXT], who[160], other[160];
  union braid_sockaddr listen;
  if (root->failure != ncclSuccess) {
    root_reply(root, c, root->failure, root->failure_text, NULL);
    return;
  }
  if (h->nranks < 1 || h->nranks > BOOTSTRAP_MAX_RANKS || h->rank < 0 || h->rank >= h->nranks ||
      bootstrap_wire_addr_unpack(&h->listen, &listen) != 0) {
    snprintf(text, sizeof text, "bootstrap: %s sent an invalid join (rank %d of %d)",
             root_conn_describe(c, who, sizeof who), (int)h->rank, (int)h->nranks);
    root_reply(root, c, ncclInvalidArgument, text, NULL);
    return;
  }
  if (root->nranks == 0 && root_first_join(root, c) != 0) return;
  if (h->nranks != root->nranks) {
    root_refuse_nranks(root, c);
    return;
  }
  if (root->joined[h->rank] != NULL) {
    snprintf(text, sizeof text,
             "bootstrap: rank %d of %d claimed twice: by %s and by %s; every process needs its "
             "own rank", (int)h->rank, root->nranks,
             root_conn_describe(root->joined[h->rank], other, sizeof other),
             root_conn_describe(c, who, sizeof who));
    root_fail(root, ncclInvalidArgument, text, c);
    return;
  }
  c->rank = h->rank;
  root->joined[c->rank] = c;
  root->njoined++;
  if (root->njoined == root->nranks) root_finish(root);
}

static void root_handle_hello(struct bootstrap_root* root, struct bootstrap_incoming* c) {
  char text[BOOTSTRAP_MAX_REPLY_TEXT];
  const char* why = bootstrap_hello_check(&c->hello, root->secret);
  if (why == NULL && c->hello.kind == BOOTSTRAP_HELLO_PEER) why = "a rank-to-rank hello sent to the root";
  if (why != NULL) { /* refused: a Braid process is told why */
    snprintf(text, sizeof text,
             "bootstrap: the root at %s refused the hello of rank %d (pid %d on %s): %s",
             root->addr_text, (int)c->hello.rank, (int)c->hello.pid, c->hello.host, why);
    bootstrap_listener_refuse(&root->listener, c, ncclInvalidArgument, text, why);
    return;
  }
  if (c->hello.kind == BOOTSTRAP_HELLO_DISMISS) {
    INFO(BRAID_LOG_BOOTSTRAP, "bootstrap root %s: dismissed by rank 0", root->addr_text);
    root_conn_kill(root, c);
    root->done = 1;
    return;
  }
  root_handle_join(root, c);
}

/* Reads a connection: its hello, or a joined rank leaving. Returns whether the rendezvous is over. */
static int root_conn_read(void* owner, struct bootstrap_incoming* c) {
  struct bootstrap_root* root = owner;
  char addr[ROOT_ADDR_TEXT];
  size_t got = 0;
  if (c->rank >= 0) {
    /* A joined rank only waits for our answer: input here means it left (or misbehaves). */
    char byte;
    if (socket_recv_some(c->fd, &byte, 1, &got) == ncclSuccess && got == 0) return root->done;
    INFO(BRAID_LOG_BOOTSTRAP, "bootstrap root %s: rank %d (%s) left before everyone joined",
         root->addr_text, c->rank, socket_addr_str(&c->remote, addr, sizeof addr));
    root_conn_kill(root, c);
    if (root->njoined == 0 && root->failure == ncclSuccess && !root->done) root_forget_nranks(root);
    return root->done;
  }
  if (bootstrap_listener_hello_read(&root->listener, c) > 0) root_handle_hello(root, c);
  return root->done;
}

static const struct bootstrap_listener_ops root_listener_ops = {
    .conn_size = sizeof(struct bootstrap_incoming),
    .read = root_conn_read,
    .close = root_conn_close_op,
    .name = root_name,
};

int bootstrap_root_add(struct bootstrap_root* root, int fd, const union braid_sockaddr* remote) {
  return bootstrap_listener_add(&root->listener, fd, remote) != NULL ? 0 : -1;
}

/* One poll round over the listener and every connection, of at most wait_ms. */
static void root_poll(struct bootstrap_root* root, int wait_ms) {
  const int n = root->listener.n;
  if (n + 1 > root->pfd_cap) {
    struct pollfd* grown = realloc(root->pfds, (size_t)(n + 1) * sizeof *grown);
    if (grown == NULL) {
      root_fail(root, ncclSystemError, "bootstrap: the root is out of memory", NULL);
      root->done = 1;
      return;
    }
    root->pfds = grown;
    root->pfd_cap = n + 1;
  }
  root->pfds[0] = (struct pollfd){.fd = root->listen_fd, .events = POLLIN};
  bootstrap_listener_poll_fill(&root->listener, root->pfds + 1);
  if (poll(root->pfds, (nfds_t)(n + 1), wait_ms) <= 0) return;
  bootstrap_listener_poll_read(&root->listener, root->pfds + 1, n);
  /* A stopped root's listener is shut down (to wake this poll): nothing to accept there. */
  if (root->pfds[0].revents && !root->done && !__atomic_load_n(&root->stop, __ATOMIC_ACQUIRE) &&
      bootstrap_listener_accept(&root->listener, root->listen_fd) != 0) {
    char who[ROOT_ADDR_TEXT + 32];
    socket_accept_failed(root_name(root, who, sizeof who));
  }
}

/* Ends the rendezvous at the timeout, telling every joined rank who is missing. */
static void root_expire(struct bootstrap_root* root) {
  char text[2 * BOOTSTRAP_MAX_REPLY_TEXT]; /* the reply keeps what fits */
  double now = braid_time_sec();
  if (root->done || root->deadline < 0 || now < root->deadline) return;
  root->done = 1;
  if (root->failure != ncclSuccess) return;
  if (root->nranks == 0) {
    INFO(BRAID_LOG_BOOTSTRAP, "bootstrap root %s: the ranks that joined left, and none came back "
         "within %.0f s; closing", root->addr_text, root->timeout);
    return;
  }
  int missing = root->nranks - root->njoined, listed = 0;
  size_t used = (size_t)snprintf(text, sizeof text, "bootstrap: rank%s ", missing > 1 ? "s" : "");
  for (int r = 0; r < root->nranks && listed < ROOT_MISSING_LISTED; r++) {
    if (root->joined[r]) continue;
    used += (size_t)snprintf(text + used, sizeof text - used, "%s%d", listed ? ", " : "", r);
    listed++;
  }
  if (listed < missing)
    used += (size_t)snprintf(text + used, sizeof text - used, " and %d more", missing - listed);
  used += (size_t)snprintf(text + used, sizeof text - used, " of %d never joined within %.0f s (root %s)",
                           root->nranks, root->timeout, root->addr_text);
  if (root->refused_text[0] && used < sizeof text)
    snprintf(text + used, sizeof text - used, "; refused meanwhile: %s", root->refused_text);
  root_fail(root, ncclSystemError, text, NULL);
}

static void root_free(struct bootstrap_root* root) {
  bootstrap_listener_close(&root->listener, NULL);
  socket_close(&root->listen_fd);
  free(root->joined);
  free(root->pfds);
  free(root);
}

int bootstrap_root_serve(struct bootstrap_root* root, int wait_ms) {
  root_poll(root, wait_ms);
  bootstrap_listener_sweep(&root->listener);
  root_expire(root);
  return root->done;
}

ncclResult_t bootstrap_root_create(const uint8_t* secret, double timeout_sec,
                                   struct bootstrap_root** out) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_root* root = NULL;
  *out = NULL;
  BRAID_TRY(BRAID_CALLOC(&root, 1, "the bootstrap root"));
  root->listen_fd = -1;
  root->timeout = timeout_sec;
  root->deadline = -1.0;
  memcpy(root->secret, secret, BOOTSTRAP_SECRET_BYTES);
  snprintf(root->addr_text, sizeof root->addr_text, "(no listener)");
  bootstrap_listener_init(&root->listener, &root_listener_ops, root);
  *out = root;
fail:
  return res;
}

void bootstrap_root_destroy(struct bootstrap_root* root) {
  if (root) root_free(root);
}

static void* root_thread_main(void* arg) {
  struct bootstrap_root* root = arg;
  pthread_setname_np(pthread_self(), "braid-bootroot");
  while (!root->done && !__atomic_load_n(&root->stop, __ATOMIC_ACQUIRE)) bootstrap_root_serve(root, 100);
  /* Close the listener now: a joinable root is freed later, but its port must not linger. */
  bootstrap_listener_close(&root->listener, "the rendezvous ended before it presented a hello");
  if (root->detached) {
    roots_remove(root); /* closes the listener */
    root_free(root);
  } else {
    socket_close(&root->listen_fd);
  }
  return NULL;
}

ncclResult_t bootstrap_root_start(union braid_sockaddr* addr, const uint8_t* secret,
                                  double timeout_sec, int detached, struct bootstrap_root** out) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_root* root = NULL;
  pthread_attr_t attr;
  int attr_ok = 0, listed = 0;
  if (out) *out = NULL;
  BRAID_TRY(bootstrap_root_create(secret, timeout_sec, &root));
  root->detached = detached;
  BRAID_TRY(socket_listen(addr, &root->listen_fd));
  socket_addr_str(addr, root->addr_text, sizeof root->addr_text);
  BRAID_CHECK(pthread_attr_init(&attr) == 0, ncclSystemError, "bootstrap: pthread_attr_init failed");
  attr_ok = 1;
  if (detached) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    roots_add(root);
    listed = 1;
  }
  int err = pthread_create(&root->thread, &attr, root_thread_main, root);
  BRAID_CHECK(err == 0, ncclSystemError, "bootstrap: cannot start the root thread: %s", strerror(err));
  pthread_attr_destroy(&attr);
  /* A detached root now belongs to its thread, which frees it: do not touch it past this point. */
  if (out && !detached) *out = root;
  char text[ROOT_ADDR_TEXT];
  INFO(BRAID_LOG_BOOTSTRAP, "bootstrap root listening on %s", socket_addr_str(addr, text, sizeof text));
  return ncclSuccess;
fail:
  if (attr_ok) pthread_attr_destroy(&attr);
  if (listed) roots_remove(root);
  if (root) root_free(root);
  return res;
}

void bootstrap_root_join(struct bootstrap_root* root, int stop_now) {
  if (root == NULL) return;
  if (stop_now) __atomic_store_n(&root->stop, 1, __ATOMIC_RELEASE);
  pthread_join(root->thread, NULL);
  root_free(root);
}
