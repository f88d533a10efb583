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
 * With several ids (ncclCommInitRankScalable), a root serves one block of
 * consecutive ranks and the first rank of the next block, so that it can give
 * its last rank that one's listener (bootstrap_root_of, bootstrap_internal.h);
 * roots never talk to each other. Which block is this root's, the JOINs say:
 * each carries the number of ids, which of them it was sent to, and a digest
 * of the list.
 *
 * The first JOIN fixes the number of ranks and the ids; a JOIN that says
 * another number, another nId or other ids (another order) is refused (saying
 * both sides) and the rendezvous goes on without it, so a stray process
 * cannot spoil it. If every rank that joined leaves again, the next JOIN fixes
 * them anew.
 *
 * Failures are answered to every joined rank, which reports them:
 * - two ranks claim one rank number: at once, with ncclInvalidArgument naming
 *   both processes; later arrivals get the same answer until the deadline;
 * - a joined rank sends a failure notice (it joined a second root, as the
 *   first rank of the next block, and its own root failed): at once, with
 *   that rank's reason;
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
#include <stdarg.h>
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
  struct bootstrap_incoming first; /* copy of the first JOIN, to name it in a conflict */
  /* What the first JOIN said of its ids, which every later one must say too. */
  int nids, iroot;
  uint64_t ids_digest;
  /*
   * The ranks this root serves (bootstrap_root_of): its block first_rank .. first_rank+count-1,
   * and with several roots the next block's first rank, in slot `count`.
   */
  int first_rank, count, slots;
  /* Connections to listen_fd; rank: the slot a valid JOIN took, else -1. */
  struct bootstrap_listener listener;
  struct bootstrap_incoming** joined; /* [slots] */
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

/* The rank in slot `slot` (see struct bootstrap_root). */
static int root_slot_rank(const struct bootstrap_root* root, int slot) {
  return slot < root->count ? root->first_rank + slot : (root->first_rank + root->count) % root->nranks;
}

/* The slot of `rank`, or -1 when this root does not serve it. */
static int root_slot_of(const struct bootstrap_root* root, int rank) {
  if (rank >= root->first_rank && rank < root->first_rank + root->count) return rank - root->first_rank;
  if (root->slots > root->count && rank == root_slot_rank(root, root->count)) return root->count;
  return -1;
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
    for (int s = 0; s < root->slots; s++) {
      struct bootstrap_incoming* c = root->joined[s];
      if (c && (c->hello.pid == self) == ours) root_reply(root, c, status, text, NULL);
    }
    if (also && (also->hello.pid == self) == ours) root_reply(root, also, status, text, NULL);
  }
}

/*
 * Everyone is in: each rank of the block gets the listener of the next one (the last one that
 * of the next block's first rank, or with one root rank 0's), the next block's first rank a
 * plain yes.
 */
static void root_finish(struct bootstrap_root* root) {
  INFO(BRAID_LOG_BOOTSTRAP, "bootstrap root %s: all %d ranks joined in %.3f s", root->addr_text,
       root->slots, braid_time_sec() - root->first_join);
  /* Each reply closes its connection and clears joined[s]: keep slot 0's listener for the last. */
  struct bootstrap_wire_addr slot0 = root->joined[0]->hello.listen;
  for (int s = 0; s < root->count; s++) {
    struct bootstrap_wire_addr next = s + 1 < root->slots ? root->joined[s + 1]->hello.listen : slot0;
    root_reply(root, root->joined[s], ncclSuccess, NULL, &next);
  }
  if (root->slots > root->count) root_reply(root, root->joined[root->count], ncclSuccess, NULL, NULL);
  root->done = 1;
}

/*
 * The first JOIN fixes nranks and the ids, hence the ranks this root serves, and starts the
 * clock: the timeout counts from the first arrival.
 */
static int root_first_join(struct bootstrap_root* root, struct bootstrap_incoming* c) {
  const struct bootstrap_hello* h = &c->hello;
  const int nroots = bootstrap_roots_used(h->nids, h->nranks);
  root->nranks = h->nranks;
  root->nids = h->nids;
  root->iroot = h->iroot;
  root->ids_digest = h->ids_digest;
  root->first_rank = bootstrap_root_first(h->iroot, h->nranks, nroots);
  root->count = bootstrap_root_count(h->iroot, h->nranks, nroots);
  root->slots = root->count + (nroots > 1);
  root->joined = calloc((size_t)root->slots, sizeof *root->joined);
  if (root->joined == NULL) {
    root->nranks = 0;
    root_reply(root, c, ncclSystemError, "bootstrap: the root is out of memory", NULL);
    return -1;
  }
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

/*
 * A JOIN that disagrees with the first about nranks or the ids: refused alone with `what`
 * (both sides), and the rendezvous goes on, so that a stray process cannot spoil it. A rank
 * that was refused is named again if the others time out waiting.
 */
static void root_refuse(struct bootstrap_root* root, struct bootstrap_incoming* c, const char* what) {
  char who[160], first[160];
  snprintf(root->refused_text, sizeof root->refused_text,
           "bootstrap: rank %d (%s) %s, as rank %d (%s) said when it joined the root at %s first; "
           "every rank must pass the same nranks, nId and commIds, in the same order (this join "
           "is refused, the others wait on)",
           (int)c->hello.rank, root_conn_describe(c, who, sizeof who), what,
           (int)root->first.hello.rank, root_conn_describe(&root->first, first, sizeof first),
           root->addr_text);
  INFO(BRAID_LOG_BOOTSTRAP, "%s", root->refused_text);
  root_reply(root, c, ncclInvalidArgument, root->refused_text, NULL);
}

/* Why a JOIN disagrees with the first one (NULL: it agrees), into `buf`. */
static const char* root_join_disagrees(const struct bootstrap_root* root, const struct bootstrap_hello* h,
                                       char* buf, size_t size) {
  if (h->nranks != root->nranks)
    snprintf(buf, size, "passed nranks %d, but the rendezvous is for %d ranks", (int)h->nranks,
             root->nranks);
  else if (h->nids != root->nids)
    snprintf(buf, size, "passed nId %d (%d unique ids), but the rendezvous is for nId %d",
             (int)h->nids, (int)h->nids, root->nids);
  else if (h->ids_digest != root->ids_digest || h->iroot != root->iroot)
    snprintf(buf, size, "passed commIds that differ (this root's id is its commIds[%d], and "
             "commIds[%d] of the rank that joined first): the same %d ids in another order, or "
             "other ids", (int)h->iroot, root->iroot, root->nids);
  else
    return NULL;
  return buf;
}

/* Checks a JOIN against the ones before it; a rank claimed twice fails the whole rendezvous. */
static void root_handle_join(struct bootstrap_root* root, struct bootstrap_incoming* c) {
  const struct bootstrap_hello* h = &c->hello;
  char text[BOOTSTRAP_MAX_REPLY_TEXT], who[160], other[160], why[300];
  union braid_sockaddr listen;
  if (root->failure != ncclSuccess) {
    root_reply(root, c, root->failure, root->failure_text, NULL);
    return;
  }
  if (h->nranks < 1 || h->nranks > BOOTSTRAP_MAX_RANKS || h->rank < 0 || h->rank >= h->nranks ||
      h->nids < 1 || h->iroot < 0 || h->iroot >= bootstrap_roots_used(h->nids, h->nranks) ||
      bootstrap_wire_addr_unpack(&h->listen, &listen) != 0) {
    snprintf(text, sizeof text, "bootstrap: %s sent an invalid join (rank %d of %d, id %d of %d)",
             root_conn_describe(c, who, sizeof who), (int)h->rank, (int)h->nranks, (int)h->iroot,
             (int)h->nids);
    root_reply(root, c, ncclInvalidArgument, text, NULL);
    return;
  }
  if (root->nranks == 0 && root_first_join(root, c) != 0) return;
  if (root_join_disagrees(root, h, why, sizeof why) != NULL) {
    root_refuse(root, c, why);
    return;
  }
  const int slot = root_slot_of(root, h->rank);
  if (slot < 0) { /* only a process that is not Braid's own rank logic gets here */
    snprintf(text, sizeof text, "bootstrap: %s joined as rank %d of %d the root of commIds[%d], "
             "which serves ranks %d to %d", root_conn_describe(c, who, sizeof who), (int)h->rank,
             root->nranks, root->iroot, root->first_rank, root->first_rank + root->count - 1);
    root_reply(root, c, ncclInvalidArgument, text, NULL);
    return;
  }
  if (root->joined[slot] != NULL) {
    snprintf(text, sizeof text,
             "bootstrap: rank %d of %d claimed twice: by %s and by %s; every process needs its "
             "own rank", (int)h->rank, root->nranks,
             root_conn_describe(root->joined[slot], other, sizeof other),
             root_conn_describe(c, who, sizeof who));
    root_fail(root, ncclInvalidArgument, text, c);
    return;
  }
  c->rank = slot;
  root->joined[slot] = c;
  root->njoined++;
  if (root->njoined == root->slots) root_finish(root);
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
/*
 * A joined rank's failure notice (a bootstrap_reply with a nonzero status and its text, in
 * `buf`, `n` bytes): the rank failed while joining, for good, so the rendezvous cannot complete
 * and fails now, with its reason. 0 when buf holds no such notice.
 */
static int root_conn_failed(struct bootstrap_root* root, struct bootstrap_incoming* c,
                            const char* buf, size_t n) {
  struct bootstrap_reply head;
  char text[2 * BOOTSTRAP_MAX_REPLY_TEXT], who[160], why[BOOTSTRAP_MAX_REPLY_TEXT + 1]; /* the reply keeps what fits */
  if (n < sizeof head) return 0;
  memcpy(&head, buf, sizeof head);
  if (head.magic != BOOTSTRAP_WIRE_MAGIC || head.status <= 0 || head.status >= ncclNumResults ||
      head.status == ncclInProgress || head.text_len > n - sizeof head || head.text_len >= sizeof why)
    return 0;
  for (uint32_t i = 0; i < head.text_len; i++) {
    const char ch = buf[sizeof head + i];
    why[i] = ch >= 0x20 && ch < 0x7f ? ch : '?';
  }
  why[head.text_len] = '\0';
  snprintf(text, sizeof text, "bootstrap: rank %d of %d (%s) failed its initialization: %s",
           (int)c->hello.rank, root->nranks, root_conn_describe(c, who, sizeof who), why);
  root_conn_kill(root, c);
  root_fail(root, (ncclResult_t)head.status, text, NULL);
  root->done = 1;
  return 1;
}

/* Reads a connection: its hello, or a joined rank leaving. Returns whether the rendezvous is over. */
static int root_conn_read(void* owner, struct bootstrap_incoming* c) {
  struct bootstrap_root* root = owner;
  char addr[ROOT_ADDR_TEXT];
  size_t got = 0;
  if (c->rank >= 0) {
    /*
     * A joined rank only waits for our answer: input here is its failure notice (it failed,
     * for good), or it left (or misbehaves). A notice comes whole, in one small send before
     * the close; one that does not is taken for a plain leave.
     */
    char buf[sizeof(struct bootstrap_reply) + BOOTSTRAP_MAX_REPLY_TEXT];
    if (socket_recv_some(c->fd, buf, sizeof buf, &got) == ncclSuccess && got == 0) return root->done;
    if (root->failure == ncclSuccess && !root->done && root_conn_failed(root, c, buf, got))
      return root->done;
    INFO(BRAID_LOG_BOOTSTRAP, "bootstrap root %s: rank %d (%s) left before everyone joined",
         root->addr_text, (int)c->hello.rank, socket_addr_str(&c->remote, addr, sizeof addr));
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

/* Appends to the text in buf (*used bytes so far), keeping what fits. */
static void root_append(char* buf, size_t size, size_t* used, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void root_append(char* buf, size_t size, size_t* used, const char* fmt, ...) {
  va_list ap;
  if (*used >= size - 1) return;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *used, size - *used, fmt, ap);
  va_end(ap);
  if (n > 0) *used = BRAID_MIN(*used + (size_t)n, size - 1);
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
  int missing = root->slots - root->njoined, listed = 0;
  size_t used = 0;
  root_append(text, sizeof text, &used, "bootstrap: rank%s ", missing > 1 ? "s" : "");
  for (int s = 0; s < root->slots && listed < ROOT_MISSING_LISTED; s++) {
    if (root->joined[s]) continue;
    root_append(text, sizeof text, &used, "%s%d", listed ? ", " : "", root_slot_rank(root, s));
    listed++;
  }
  if (listed < missing) root_append(text, sizeof text, &used, " and %d more", missing - listed);
  root_append(text, sizeof text, &used, " of %d never joined within %.0f s (root %s", root->nranks,
              root->timeout, root->addr_text);
  if (root->slots > root->count)
    root_append(text, sizeof text, &used, ", commIds[%d] of %d, for ranks %d to %d and rank %d",
                root->iroot, root->nids, root->first_rank, root->first_rank + root->count - 1,
                root_slot_rank(root, root->count));
  root_append(text, sizeof text, &used, ")");
  if (root->refused_text[0]) root_append(text, sizeof text, &used, "; refused meanwhile: %s", root->refused_text);
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
