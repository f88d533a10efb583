/*
 * The bootstrap's message engine: a rank's incoming connections, its queue of
 * unexpected messages, and sending over connections made on first use.
 *
 * Connections between ranks are one-way: to send to rank p we connect to p's
 * listener once, present a PEER hello with the job's secret, wait for p's
 * reply, and keep the connection for every later message. Whatever arrives on
 * our listener is read into a queue, matched later by (peer, channel, tag).
 *
 * There is no helper thread. Every wait (for a message, for room in a full
 * socket buffer, for a connection or a reply) is a poll() over the listener,
 * every incoming connection and every outgoing one, so a rank keeps draining
 * its peers while it waits: send never waits for the matching recv, two ranks
 * sending large messages to each other cannot deadlock, and a stray
 * connection is dropped without holding up anyone. Incoming traffic is served
 * only while the owner is inside a bootstrap call; that is enough, because a
 * peer that needs us to read (or to answer its hello) is itself waiting for us
 * to reach the matching call.
 *
 * Dead peers: every connection has TCP keepalive (BRAID_SOCKET_KEEPALIVE_SEC),
 * an outgoing connection that ends or errs marks its peer gone, and a wait for
 * a peer with no connection either way connects to it after
 * BOOTSTRAP_PROBE_S, so that a wait after init, which has no deadline, still
 * ends with ncclRemoteError naming the peer once it is gone.
 *
 * Every length read from the wire is checked before use: a hello is fixed
 * size, a message header's size is bounded by BOOTSTRAP_MAX_MSG.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap_internal.h"
#include "base/debug.h"
#include "base/error.h"
#include "base/socket.h"
#include "base/utils.h"

/* Messages up to this size leave in one send() with their header (one TCP segment). */
#define BOOTSTRAP_COALESCE 1024
/* Longest single poll(): an abort is noticed within this time. */
#define BOOTSTRAP_SLICE_MS 100
#define BOOTSTRAP_NOTICE_GRACE_S 0.25 /* a closed peer: how long a failure notice may trail it */
/* A wait after init for a peer with no connection either way connects to it after this long. */
#define BOOTSTRAP_PROBE_S 2.0
/* A send blocked this long, on a peer that acknowledged every byte, is a slow reader's. */
#define BOOTSTRAP_SEND_STALL_S 1.0

static const char* const bootstrap_channel_names[BOOTSTRAP_CH_COUNT] = {
    "send/recv", "init exchange", "allgather", "barrier", "split", "failure notice"};

const char* bootstrap_peer_describe(const struct bootstrap* b, int peer, char* buf, size_t size) {
  char addr[BOOTSTRAP_TEXT];
  if (peer < 0) {
    snprintf(buf, size, "the root at %s", peer == -2 ? b->prev_root_text : b->root_text);
  } else if (b->peers[peer].pid != 0) {
    snprintf(buf, size, "rank %d (pid %d on %s, %s)", peer, b->peers[peer].pid, b->peers[peer].host,
             socket_addr_str(&b->peers[peer].addr, addr, sizeof addr));
  } else {
    snprintf(buf, size, "rank %d", peer);
  }
  return buf;
}

ncclResult_t bootstrap_wait_check(struct bootstrap* b, int peer, const char* what) {
  char who[160];
  if (bootstrap_aborted(b)) {
    INFO(BRAID_LOG_BOOTSTRAP, "bootstrap: rank %d stopped waiting for %s: aborted", b->rank, what);
    return ncclRemoteError;
  }
  if (b->failed_peer >= 0 && !b->reporting) {
    char from[BOOTSTRAP_TEXT + 16];
    if (peer >= 0) snprintf(from, sizeof from, "rank %d", peer);
    else bootstrap_peer_describe(b, peer, from, sizeof from);
    return braid_err(ncclRemoteError,
                     "bootstrap: rank %d stopped waiting for %s from %s: %s failed its "
                     "initialization: %s",
                     b->rank, what, from,
                     bootstrap_peer_describe(b, b->failed_peer, who, sizeof who), b->failed_why);
  }
  if (b->call_deadline >= 0 && braid_time_sec() >= b->call_deadline) {
    b->call_late = 1; /* quietly: the caller knows what it waited for and says so */
    return ncclRemoteError;
  }
  if (b->deadline >= 0 && braid_time_sec() >= b->deadline)
    return braid_err(ncclSystemError, "bootstrap: rank %d of %d timed out after %.0f s waiting for %s "
                     "from %s", b->rank, b->nranks, b->timeout, what,
                     bootstrap_peer_describe(b, peer, who, sizeof who));
  return ncclSuccess;
}

/* ------------------------------------------------- incoming connections */

void bootstrap_in_close(struct bootstrap_in* c) {
  socket_close(&c->base.fd);
  free(c->msg);
  c->msg = NULL;
}

/* "bootstrap: rank 3 (listener 10.0.0.3:41234)", for the log of rejected connections. */
static const char* bootstrap_in_name(const void* owner, char* buf, size_t size) {
  const struct bootstrap* b = owner;
  char self[BOOTSTRAP_TEXT];
  snprintf(buf, size, "bootstrap: rank %d (listener %s)", b->rank,
           socket_addr_str(&b->listen_addr, self, sizeof self));
  return buf;
}

/* The connection of an accepted rank ended (err: why, 0 closed): waits on that rank fail. */
static void bootstrap_in_lost(struct bootstrap* b, struct bootstrap_in* c, const char* why, int err) {
  char who[160];
  if (why) WARN("bootstrap: rank %d closes the connection of %s: %s", b->rank,
                bootstrap_peer_describe(b, c->base.rank, who, sizeof who), why);
  else TRACE(BRAID_LOG_BOOTSTRAP, "bootstrap: rank %d: rank %d closed its connection", b->rank, c->base.rank);
  b->peers[c->base.rank].closed = 1;
  if (b->peers[c->base.rank].lost_errno == 0) b->peers[c->base.rank].lost_errno = err;
  bootstrap_in_close(c);
}

/* A complete hello: take the connection (and say so), or refuse it with the reason. */
static void bootstrap_in_hello(struct bootstrap* b, struct bootstrap_in* c) {
  char text[BOOTSTRAP_MAX_REPLY_TEXT], self[BOOTSTRAP_TEXT];
  const struct bootstrap_hello* h = &c->base.hello;
  const char* why = bootstrap_hello_check(&c->base.hello, b->secret);
  int rank = h->rank;
  if (why == NULL && h->kind != BOOTSTRAP_HELLO_PEER) why = "not a rank-to-rank hello";
  if (why == NULL && (h->nranks != b->nranks || rank < 0 || rank >= b->nranks || rank == b->rank))
    why = "rank or number of ranks does not fit this job";
  for (int i = 0; why == NULL && i < b->listener.n; i++) {
    const struct bootstrap_incoming* other = b->listener.conns[i];
    if (other != &c->base && other->fd >= 0 && other->rank == rank)
      why = "a second connection claiming the same rank";
  }
  if (why == NULL && b->peers[rank].closed) why = "a rank whose connection already ended";
  if (why != NULL) { /* refused: a Braid process is told why */
    snprintf(text, sizeof text,
             "bootstrap: rank %d of %d (pid %d on %s, listener %s) refused the connection of "
             "rank %d of %d (pid %d on %s): %s",
             b->rank, b->nranks, (int)getpid(), braid_log_hostname(),
             socket_addr_str(&b->listen_addr, self, sizeof self), (int)h->rank, (int)h->nranks,
             (int)h->pid, h->host, why);
    bootstrap_listener_refuse(&b->listener, &c->base, ncclRemoteError, text, why);
    return;
  }
  bootstrap_reply_now(c->base.fd, ncclSuccess, NULL);
  c->base.rank = rank;
}

/* A complete header: check it and make room for the payload. Returns -1 if the stream is bad. */
static int bootstrap_in_header(struct bootstrap* b, struct bootstrap_in* c) {
  char why[128];
  const struct bootstrap_msg_header* h = &c->header;
  if (h->magic != BOOTSTRAP_WIRE_MAGIC || h->channel >= BOOTSTRAP_CH_COUNT || h->size > BOOTSTRAP_MAX_MSG) {
    snprintf(why, sizeof why, "malformed message header (magic 0x%08x, channel %u, %llu bytes)",
             h->magic, h->channel, (unsigned long long)h->size);
    bootstrap_in_lost(b, c, why, EPROTO);
    return -1;
  }
  c->msg = malloc(sizeof *c->msg + (size_t)h->size);
  if (c->msg == NULL) {
    snprintf(why, sizeof why, "out of memory for a message of %llu bytes", (unsigned long long)h->size);
    bootstrap_in_lost(b, c, why, ENOMEM);
    return -1;
  }
  c->msg->next = NULL;
  c->msg->peer = c->base.rank;
  c->msg->channel = h->channel;
  c->msg->tag = h->tag;
  c->msg->size = (size_t)h->size;
  c->got = 0;
  return 0;
}

static void bootstrap_enqueue(struct bootstrap* b, struct bootstrap_msg* msg) {
  msg->next = NULL;
  *b->queue_tail = msg;
  b->queue_tail = &msg->next;
}

/*
 * A failure notice (an int32 origin rank, then its text): the first one is kept, its text made
 * printable; none after the caller's init is through (it concerns an init, and a healthy
 * comm's later waits must not fail on it). The message is freed.
 */
static void bootstrap_failure_note(struct bootstrap* b, struct bootstrap_msg* msg) {
  int32_t origin = -1;
  if (msg->size >= sizeof origin) memcpy(&origin, msg->data, sizeof origin);
  if (origin < 0 || origin >= b->nranks || origin == b->rank) origin = msg->peer;
  if (b->init_done) {
    INFO(BRAID_LOG_BOOTSTRAP,
         "bootstrap: rank %d ignores rank %d's failure notice: its init "
         "is through",
         b->rank, origin);
  } else if (b->failed_peer < 0 && msg->size >= sizeof origin) {
    const unsigned char* text = msg->data + sizeof origin;
    size_t n = BRAID_MIN(msg->size - sizeof origin, sizeof b->failed_why - 1);
    for (size_t i = 0; i < n; i++) {
      if (text[i] == '\0') {
        n = i;
        break;
      }
      b->failed_why[i] = text[i] >= 0x20 && text[i] < 0x7f ? (char)text[i] : '?';
    }
    b->failed_why[n] = '\0';
    b->failed_peer = origin;
  }
  free(msg);
}

/* Reads what is there: the hello, then header/payload pairs, queueing each message whole. */
void bootstrap_in_read(struct bootstrap* b, struct bootstrap_in* c) {
  char why[128];
  for (int budget = 64; budget > 0 && c->base.fd >= 0; budget--) {
    void* dst;
    size_t want;
    if (c->base.rank < 0) {
      if (bootstrap_listener_hello_read(&b->listener, &c->base) <= 0) return;
      bootstrap_in_hello(b, c); /* accepted: its messages follow */
      continue;
    }
    if (c->msg == NULL) {
      dst = (char*)&c->header + c->got;
      want = sizeof c->header - c->got;
    } else {
      dst = c->msg->data + c->got;
      want = c->msg->size - c->got;
    }
    size_t got = 0;
    if (want > 0 && socket_recv_some(c->base.fd, dst, want, &got) != ncclSuccess) {
      const int err = errno;
      snprintf(why, sizeof why, "connection ended: %s", err ? strerror(err) : "closed by the peer");
      bootstrap_in_lost(b, c, c->msg || c->got ? why : NULL, err);
      return;
    }
    if (want > 0 && got == 0) return;
    c->got += got;
    if (c->msg == NULL && c->got == sizeof c->header && bootstrap_in_header(b, c) != 0) return;
    if (c->msg != NULL && c->got == c->msg->size) {
      if (c->msg->channel == BOOTSTRAP_CH_FAIL) /* not for any recv: every wait fails now */
        bootstrap_failure_note(b, c->msg);
      else
        bootstrap_enqueue(b, c->msg);
      c->msg = NULL;
      c->got = 0;
    }
  }
}

static int bootstrap_in_read_op(void* owner, struct bootstrap_incoming* c) {
  bootstrap_in_read(owner, bootstrap_in_of(c));
  return 0; /* a rank's listener takes connections as long as it lives */
}

static void bootstrap_in_close_op(void* owner, struct bootstrap_incoming* c) {
  (void)owner;
  bootstrap_in_close(bootstrap_in_of(c));
}

static const struct bootstrap_listener_ops bootstrap_in_ops = {
    .conn_size = sizeof(struct bootstrap_in),
    .read = bootstrap_in_read_op,
    .close = bootstrap_in_close_op,
    .name = bootstrap_in_name,
};

void bootstrap_conn_init(struct bootstrap* b) {
  b->queue = NULL;
  b->queue_tail = &b->queue;
  b->call_deadline = -1.0;
  bootstrap_listener_init(&b->listener, &bootstrap_in_ops, b);
}

/* Whether `peer`'s connection to us is open (messages may still come over it). */
static int bootstrap_in_alive(const struct bootstrap* b, int peer) {
  for (int i = 0; i < b->listener.n; i++)
    if (b->listener.conns[i]->rank == peer && b->listener.conns[i]->fd >= 0) return 1;
  return 0;
}

/*
 * Something happened on our connection to `peer`, which carries nothing to us after the
 * reply to our hello: it ended (the peer's bootstrap closed, or its process died), its host
 * stopped answering (keepalive: ETIMEDOUT), or the peer broke the protocol. It is gone.
 */
static void bootstrap_out_check(struct bootstrap* b, int peer) {
  struct bootstrap_peer* p = &b->peers[peer];
  char sink[64], who[160];
  ssize_t n = recv(p->out_fd, sink, sizeof sink, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  const int err = n > 0 ? EPROTO : n == 0 ? 0 : errno;
  p->gone = 1;
  if (p->lost_errno == 0) p->lost_errno = err;
  INFO(BRAID_LOG_BOOTSTRAP, "bootstrap: rank %d's connection to %s ended: %s", b->rank,
       bootstrap_peer_describe(b, peer, who, sizeof who),
       n > 0 ? "it sent bytes where none are due" : err ? strerror(err) : "closed by the peer");
}

/*
 * One turn of every wait: polls the listener, every incoming and outgoing
 * connection and, when fd >= 0, `fd` for `events`, for at most wait_ms;
 * serves whatever is ready. The caller then retries what it waits for.
 */
static void bootstrap_progress_for(struct bootstrap* b, int fd, short events, int wait_ms) {
  const int n = b->listener.n, nout = b->nout, total = 1 + n + nout + (fd >= 0);
  if (total > b->pfd_cap) {
    struct pollfd* grown = realloc(b->pfds, (size_t)total * sizeof *grown);
    if (grown == NULL) { /* serve nothing this turn; the caller's wait still ends on time */
      poll(NULL, 0, wait_ms);
      return;
    }
    b->pfds = grown;
    b->pfd_cap = total;
  }
  struct pollfd* in = b->pfds + 1;
  struct pollfd* out = in + n;
  b->pfds[0] = (struct pollfd){.fd = b->listen_fd, .events = POLLIN};
  bootstrap_listener_poll_fill(&b->listener, in);
  for (int j = 0; j < nout; j++) {
    const struct bootstrap_peer* p = &b->peers[b->out_peers[j]];
    out[j] = (struct pollfd){.fd = p->gone ? -1 : p->out_fd, .events = POLLIN};
  }
  if (fd >= 0) out[nout] = (struct pollfd){.fd = fd, .events = events};
  if (poll(b->pfds, (nfds_t)total, wait_ms) > 0) {
    bootstrap_listener_poll_read(&b->listener, in, n);
    for (int j = 0; j < nout; j++) {
      const int peer = b->out_peers[j];
      if (out[j].revents && out[j].fd >= 0 && b->peers[peer].out_fd == out[j].fd && !b->peers[peer].gone)
        bootstrap_out_check(b, peer);
    }
    /* Accept last: new connections go past the end, so index i still names in[i]. */
    if (b->pfds[0].revents && bootstrap_listener_accept(&b->listener, b->listen_fd) != 0) {
      char who[48];
      snprintf(who, sizeof who, "bootstrap: rank %d", b->rank);
      socket_accept_failed(who);
    }
  }
  bootstrap_listener_sweep(&b->listener);
}

static void bootstrap_progress(struct bootstrap* b, int fd, short events) {
  bootstrap_progress_for(b, fd, events, BOOTSTRAP_SLICE_MS);
}

/* --------------------------------------------------------- sending */

/*
 * bootstrap_fd_move, telling in *moved how many bytes went through (also on failure). With
 * `reset` set, a send on a connection the other side reset, or a receive that ends before its
 * first byte, fails quietly (no message) with *reset = 1: the connection was dropped unread,
 * and the caller makes it again (see bootstrap_dial).
 */
static ncclResult_t bootstrap_fd_move_counted(struct bootstrap* b, int fd, void* buf, size_t size,
                                              int sending, int peer, size_t* moved, int* reset) {
  ncclResult_t res = ncclSuccess;
  char who[160];
  double stalled = -1.0;
  int relaxed = 0;
  *moved = 0;
  while (*moved < size) {
    const size_t done = *moved;
    size_t n = 0;
    res = sending ? socket_send_some(fd, (char*)buf + done, size - done, &n)
                  : socket_recv_some(fd, (char*)buf + done, size - done, &n);
    if (res != ncclSuccess) {
      int e = errno;
      if (reset && (sending ? e == ECONNRESET || e == EPIPE : *moved == 0 && (e == ECONNRESET || e == 0))) {
        *reset = 1;
        res = ncclRemoteError;
        goto out;
      }
      bootstrap_peer_describe(b, peer, who, sizeof who);
      res = braid_err(res, "bootstrap: rank %d lost its connection to %s while %s: %s", b->rank, who,
                      sending ? "sending" : "receiving",
                      e == ETIMEDOUT ? "its host stopped answering (BRAID_SOCKET_KEEPALIVE_SEC)"
                      : e            ? strerror(e)
                                     : "closed by the peer");
      goto out;
    }
    *moved += n;
    if (n > 0) {
      stalled = -1.0;
      continue;
    }
    /* A peer that takes nothing but acknowledges everything is alive: do not time it out. */
    if (sending && !relaxed) {
      const double now = braid_time_sec();
      if (stalled < 0) stalled = now;
      else if (now - stalled >= BOOTSTRAP_SEND_STALL_S) relaxed = socket_keepalive_relax(fd);
    }
    res = bootstrap_wait_check(b, peer, sending ? "room to send" : "an answer");
    if (res != ncclSuccess) goto out;
    bootstrap_progress(b, fd, sending ? POLLOUT : POLLIN);
  }
out:
  if (relaxed) socket_keepalive(fd, socket_keepalive_sec());
  return res;
}

/* Logs its own failures, naming the peer. */
ncclResult_t bootstrap_fd_move(struct bootstrap* b, int fd, void* buf, size_t size, int sending,
                               int peer) {
  size_t moved;
  return bootstrap_fd_move_counted(b, fd, buf, size, sending, peer, &moved, NULL);
}

void bootstrap_hello_fill(const struct bootstrap* b, int kind, const uint8_t* secret,
                          struct bootstrap_hello* h) {
  memset(h, 0, sizeof *h);
  h->magic = BOOTSTRAP_WIRE_MAGIC;
  h->version = BOOTSTRAP_WIRE_VERSION;
  h->kind = (uint8_t)kind;
  memcpy(h->secret, secret, BOOTSTRAP_SECRET_BYTES);
  h->rank = b ? b->rank : 0;
  h->nranks = b ? b->nranks : 0;
  h->pid = (int32_t)getpid();
  if (b) bootstrap_wire_addr_pack(&b->listen_addr, &h->listen);
  snprintf(h->host, sizeof h->host, "%s", braid_log_hostname());
}

/*
 * Whether a failed connect is worth another attempt. During init the peer's listener may not be
 * up yet (a refusal), or its host still booting (unreachable). After init its listener has been
 * up all along: a refusal means its bootstrap is gone, and a host that does not answer within
 * BRAID_SOCKET_KEEPALIVE_SEC is as silent as keepalive would find it.
 */
static int bootstrap_dial_retryable(const struct bootstrap* b, int err) {
  if (b->deadline >= 0) return socket_connect_retryable(err);
  return err == ECONNRESET || err == ECONNABORTED || err == EAGAIN || err == EINTR;
}

ncclResult_t bootstrap_dial_answer(struct bootstrap* b, int fd, int peer,
                                   struct bootstrap_reply* reply, int* again) {
  ncclResult_t res = ncclSuccess;
  char who[160];
  size_t moved = 0;
  int reset = 0;
  *again = 0;
  res = bootstrap_fd_move_counted(b, fd, reply, sizeof *reply, 0, peer, &moved, &reset);
  if (res != ncclSuccess) {
    *again = reset;
    return res;
  }
  BRAID_CHECK(reply->magic == BOOTSTRAP_WIRE_MAGIC && reply->text_len <= BOOTSTRAP_MAX_REPLY_TEXT,
              ncclSystemError, "bootstrap: %s sent rank %d a malformed reply to its hello",
              bootstrap_peer_describe(b, peer, who, sizeof who), b->rank);
fail:
  return res;
}

ncclResult_t bootstrap_dial(struct bootstrap* b, const union braid_sockaddr* addr, int peer,
                            const struct bootstrap_hello* hello, struct bootstrap_reply* reply,
                            int* out, int* again, int* err) {
  ncclResult_t res = ncclSuccess;
  int fd = -1, state, reset = 0;
  size_t moved = 0;
  const int silent_s = socket_keepalive_sec();
  const double started = braid_time_sec();
  *out = -1;
  *again = 0;
  *err = 0;
  while ((state = socket_connect_step(addr, &fd, err)) == 0) {
    BRAID_TRY(bootstrap_wait_check(b, peer, "a connection"));
    if (silent_s > 0 && braid_time_sec() - started >= silent_s) { /* as keepalive would judge */
      socket_close(&fd);
      *err = ETIMEDOUT;
      state = -1;
      break;
    }
    bootstrap_progress(b, fd, POLLOUT);
  }
  if (state < 0) { /* not logged: the caller knows whether to try again */
    *again = bootstrap_dial_retryable(b, *err);
    return ncclSystemError;
  }
  socket_keepalive(fd, socket_keepalive_sec());
  res = bootstrap_fd_move_counted(b, fd, (void*)hello, sizeof *hello, 1, peer, &moved, &reset);
  if (res != ncclSuccess) {
    *again = reset;
    goto fail;
  }
  if (reply != NULL) BRAID_TRY(bootstrap_dial_answer(b, fd, peer, reply, again));
  *out = fd;
  return ncclSuccess;
fail:
  socket_close(&fd);
  return res;
}

ncclResult_t bootstrap_reply_fail(struct bootstrap* b, int fd, int peer,
                                  const struct bootstrap_reply* reply) {
  char text[BOOTSTRAP_MAX_REPLY_TEXT + 1];
  const uint32_t len = BRAID_MIN(reply->text_len, (uint32_t)BOOTSTRAP_MAX_REPLY_TEXT);
  ncclResult_t res = bootstrap_fd_move(b, fd, text, len, 0, peer);
  if (res != ncclSuccess) return res;
  text[len] = '\0';
  for (uint32_t i = 0; i < len; i++)
    if (text[i] < 0x20 || text[i] > 0x7e) text[i] = '?';
  int status = reply->status > 0 && reply->status < ncclNumResults && reply->status != ncclInProgress
                   ? reply->status : ncclInternalError;
  return braid_err((ncclResult_t)status, "%s", len ? text : "bootstrap: refused, with no reason given");
}

ncclResult_t bootstrap_retry_pause(struct bootstrap* b, int peer, double* pause) {
  const uint64_t salt[2] = {braid_time_ns(), (uint64_t)getpid()};
  const double jitter = 0.5 + (double)(braid_hash(salt, sizeof salt) % 1000) / 1000.0;
  double until = braid_time_sec() + *pause * jitter;
  if (b->deadline >= 0) until = BRAID_MIN(until, b->deadline); /* the caller says why it gives up */
  *pause = BRAID_MIN(*pause * 2.0, BOOTSTRAP_RETRY_MAX_S);
  for (double now = braid_time_sec(); now < until; now = braid_time_sec()) {
    ncclResult_t res = bootstrap_wait_check(b, peer, "a new connection attempt");
    if (res != ncclSuccess) return res;
    bootstrap_progress_for(b, -1, 0, (int)BRAID_MIN((until - now) * 1000.0 + 1, BOOTSTRAP_SLICE_MS));
  }
  return ncclSuccess;
}

/* Whether a connect that failed with `err` after init says the peer is gone (not a hiccup). */
static int bootstrap_lost_errno(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH ||
         err == EHOSTDOWN;
}

/* Why connections to `peer` ended, as the end of a sentence naming it. */
static const char* bootstrap_lost_reason(const struct bootstrap_peer* p, char* buf, size_t size) {
  switch (p->lost_errno) {
    case 0:
      snprintf(buf, size, "closed its connection: did it exit or abort?");
      break;
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EHOSTDOWN:
      snprintf(buf, size, "stopped answering (%s): its host acknowledged nothing for %d s "
               "(BRAID_SOCKET_KEEPALIVE_SEC); is the host down or the network cut?",
               strerror(p->lost_errno), socket_keepalive_sec());
      break;
    case ECONNREFUSED:
      snprintf(buf, size, "refuses connections: its process is gone, or its bootstrap closed");
      break;
    case EPROTO:
      snprintf(buf, size, "broke the bootstrap protocol, and its connection was closed");
      break;
    default:
      snprintf(buf, size, "lost its connection (%s): is its process gone?", strerror(p->lost_errno));
      break;
  }
  return buf;
}

/* Whether `peer` is gone (with no connection of its left that may still deliver messages). */
static int bootstrap_peer_lost(const struct bootstrap* b, int peer) {
  const struct bootstrap_peer* p = &b->peers[peer];
  return peer != b->rank && (p->closed || (p->gone && !bootstrap_in_alive(b, peer)));
}

/* Registers `fd` as our connection to `peer`, watched from now on for its end. */
static ncclResult_t bootstrap_out_keep(struct bootstrap* b, int peer, int fd) {
  if (b->out_peers == NULL) {
    b->out_peers = calloc((size_t)b->nranks, sizeof *b->out_peers);
    if (b->out_peers == NULL)
      return braid_err(ncclSystemError, "bootstrap: out of memory for the connection table");
  }
  b->peers[peer].out_fd = fd;
  for (int j = 0; j < b->nout; j++)
    if (b->out_peers[j] == peer) return ncclSuccess;
  b->out_peers[b->nout++] = peer;
  return ncclSuccess;
}

/*
 * Our connection to `peer`, made on first use and kept: connect, present a PEER hello, and
 * take the peer's reply (it answers from inside any bootstrap call; we serve ours meanwhile).
 * A connection dropped before the reply, or refused during init, is made again with backoff
 * until the init deadline (after init: BRAID_BOOTSTRAP_TIMEOUT). After init a refusal means
 * the peer's listener is closed: it is gone.
 */
static ncclResult_t bootstrap_out_connect(struct bootstrap* b, int peer) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_peer* p = &b->peers[peer];
  struct bootstrap_reply reply;
  char who[160], how[200];
  int fd = -1, again = 0, tries = 0, err = 0;
  if (p->out_fd >= 0) return ncclSuccess;
  bootstrap_peer_describe(b, peer, who, sizeof who);
  BRAID_CHECK(p->addr.sa.sa_family != 0, ncclInternalError,
              "bootstrap: rank %d has no address for rank %d yet", b->rank, peer);
  BRAID_CHECK(!p->gone, ncclRemoteError, "bootstrap: rank %d cannot connect to %s, which %s",
              b->rank, who, bootstrap_lost_reason(p, how, sizeof how));
  const double start = braid_time_sec();
  const double give_up = b->deadline >= 0 ? b->deadline : start + b->timeout;
  double pause = BOOTSTRAP_RETRY_MIN_S;
  struct bootstrap_hello hello;
  bootstrap_hello_fill(b, BOOTSTRAP_HELLO_PEER, b->secret, &hello);
  for (;;) {
    res = bootstrap_dial(b, &p->addr, peer, &hello, &reply, &fd, &again, &err);
    if (res == ncclSuccess || !again) break;
    if (++tries == 1)
      INFO(BRAID_LOG_BOOTSTRAP, "bootstrap: rank %d's connection to %s %s; connecting again",
           b->rank, who, err ? strerror(err) : "ended before its reply");
    if (braid_time_sec() >= give_up) {
      res = braid_err(ncclSystemError,
                      "bootstrap: rank %d cannot connect to %s within %.0f s (%d attempts; the last "
                      "one: %s); it must be reachable over the interface BRAID_SOCKET_IFNAME selects "
                      "there", b->rank, who, braid_time_sec() - start, tries,
                      err ? strerror(err) : "dropped before the reply");
      goto fail;
    }
    BRAID_TRY(bootstrap_retry_pause(b, peer, &pause));
  }
  if (res != ncclSuccess && b->deadline < 0 && bootstrap_lost_errno(err)) {
    p->gone = 1;
    p->lost_errno = err;
    res = braid_err(ncclRemoteError, "bootstrap: rank %d cannot connect to %s, which %s", b->rank, who,
                    bootstrap_lost_reason(p, how, sizeof how));
  } else if (res != ncclSuccess && err != 0) {
    res = braid_err(ncclSystemError, "bootstrap: rank %d cannot connect to %s: %s (it must be "
                    "reachable over the interface BRAID_SOCKET_IFNAME selects there)", b->rank, who,
                    strerror(err));
  }
  if (res != ncclSuccess) goto fail;
  if (reply.status != ncclSuccess) {
    res = bootstrap_reply_fail(b, fd, peer, &reply);
    goto fail;
  }
  BRAID_TRY(bootstrap_out_keep(b, peer, fd));
  return ncclSuccess;
fail:
  socket_close(&fd);
  return res;
}

ncclResult_t bootstrap_connect_next(struct bootstrap* b) {
  if (b->nranks < 2) return ncclSuccess;
  return bootstrap_out_connect(b, (b->rank + 1) % b->nranks);
}

ncclResult_t bootstrap_msg_send(struct bootstrap* b, int peer, int channel, int tag,
                                const void* data, size_t size) {
  ncclResult_t res = ncclSuccess;
  if (peer == b->rank) { /* to ourselves: straight into the queue */
    struct bootstrap_msg* msg = malloc(sizeof *msg + size);
    BRAID_CHECK(msg != NULL, ncclSystemError, "bootstrap: out of memory queueing %zu bytes", size);
    *msg = (struct bootstrap_msg){.peer = peer, .channel = channel, .tag = tag, .size = size};
    if (size) memcpy(msg->data, data, size);
    bootstrap_enqueue(b, msg);
    return ncclSuccess;
  }
  char who[160], how[200];
  BRAID_CHECK(!b->peers[peer].send_cut, ncclRemoteError,
              "bootstrap: rank %d cannot send to %s: an earlier message to it was cut off mid-way "
              "(by an abort or a lost connection), so the connection carries no more",
              b->rank, bootstrap_peer_describe(b, peer, who, sizeof who));
  BRAID_CHECK(!b->peers[peer].gone, ncclRemoteError, "bootstrap: rank %d cannot send to %s, which %s",
              b->rank, bootstrap_peer_describe(b, peer, who, sizeof who),
              bootstrap_lost_reason(&b->peers[peer], how, sizeof how));
  BRAID_TRY(bootstrap_out_connect(b, peer));
  struct {
    struct bootstrap_msg_header header;
    unsigned char payload[BOOTSTRAP_COALESCE];
  } out;
  memset(&out.header, 0, sizeof out.header);
  out.header.magic = BOOTSTRAP_WIRE_MAGIC;
  out.header.channel = (uint8_t)channel;
  out.header.tag = tag;
  out.header.size = size;
  int fd = b->peers[peer].out_fd;
  size_t moved = 0, header_moved = 0;
  if (size <= BOOTSTRAP_COALESCE) {
    if (size) memcpy(out.payload, data, size);
    res = bootstrap_fd_move_counted(b, fd, &out, sizeof out.header + size, 1, peer, &moved, NULL);
  } else {
    res = bootstrap_fd_move_counted(b, fd, &out.header, sizeof out.header, 1, peer, &header_moved,
                                    NULL);
    if (res == ncclSuccess)
      res = bootstrap_fd_move_counted(b, fd, (void*)data, size, 1, peer, &moved, NULL);
    moved += header_moved;
  }
  if (res != ncclSuccess && moved > 0) {
    /* Half a frame is on the wire: whatever followed it would be read as a header. */
    socket_close(&b->peers[peer].out_fd);
    b->peers[peer].send_cut = 1;
  }
fail:
  return res;
}

/* --------------------------------------------------------- receiving */

/* Unlinks the oldest queued message from `peer` on `channel` (with `tag`, unless any_tag). */
static struct bootstrap_msg* bootstrap_queue_take(struct bootstrap* b, int peer, int channel, int tag,
                                                  int any_tag) {
  for (struct bootstrap_msg** link = &b->queue; *link != NULL; link = &(*link)->next) {
    struct bootstrap_msg* m = *link;
    if (m->peer != peer || m->channel != channel || (!any_tag && m->tag != tag)) continue;
    *link = m->next;
    if (b->queue_tail == &m->next) b->queue_tail = link;
    return m;
  }
  return NULL;
}

/*
 * `peer` is gone while we wait for its message: a failure notice (a better reason than the
 * closed connection its sender then left behind), or messages still on their way over its other
 * connection, may trail that news a little. The message, if it came; else NULL and the error.
 */
static struct bootstrap_msg* bootstrap_recv_lost(struct bootstrap* b, int peer, int channel, int tag,
                                                 int any_tag, const char* what, ncclResult_t* res) {
  char who[160], how[200];
  struct bootstrap_msg* msg = NULL;
  for (double until = braid_time_sec() + BOOTSTRAP_NOTICE_GRACE_S;
       msg == NULL && b->failed_peer < 0 && braid_time_sec() < until;
       msg = bootstrap_queue_take(b, peer, channel, tag, any_tag))
    bootstrap_progress(b, -1, 0);
  if (msg != NULL) return msg;
  *res = bootstrap_wait_check(b, peer, what);
  if (*res == ncclSuccess)
    *res = braid_err(ncclRemoteError, "bootstrap: rank %d stopped waiting for the %s message (tag %d) "
                     "of %s, which %s", b->rank, what, tag,
                     bootstrap_peer_describe(b, peer, who, sizeof who),
                     bootstrap_lost_reason(&b->peers[peer], how, sizeof how));
  return NULL;
}

/*
 * Receives the next message from `peer` on `channel`. Collectives (any_tag)
 * take messages in arrival order and then check that the tag, their sequence
 * number, is the expected one: a mismatch means ranks called them in
 * different orders, which is reported instead of waiting forever.
 */
ncclResult_t bootstrap_msg_recv(struct bootstrap* b, int peer, int channel, int tag, int any_tag,
                                void* data, size_t size) {
  ncclResult_t res = ncclSuccess;
  char who[160];
  const char* what = bootstrap_channel_names[channel];
  struct bootstrap_msg* msg;
  const double start = braid_time_sec();
  double warn_t = start + BOOTSTRAP_STILL_WAITING_S;
  int probed = 0;
  while ((msg = bootstrap_queue_take(b, peer, channel, tag, any_tag)) == NULL) {
    /* First: a failure notice says why better than the connection its sender then closed. */
    BRAID_TRY(bootstrap_wait_check(b, peer, what));
    if (bootstrap_peer_lost(b, peer)) {
      msg = bootstrap_recv_lost(b, peer, channel, tag, any_tag, what, &res);
      if (msg != NULL) break;
      goto fail;
    }
    double now = braid_time_sec();
    /*
     * After init there is no deadline, and no connection either way to watch: connect to the
     * peer, so that a dead one is found out (its listener refuses, or keepalive ends it).
     */
    if (!probed && b->deadline < 0 && peer != b->rank && now - start >= BOOTSTRAP_PROBE_S &&
        b->peers[peer].out_fd < 0 && !b->peers[peer].send_cut && !bootstrap_in_alive(b, peer)) {
      probed = 1;
      BRAID_TRY(bootstrap_out_connect(b, peer));
      continue;
    }
    bootstrap_progress(b, -1, 0);
    now = braid_time_sec();
    if (now >= warn_t) {
      WARN(
          "bootstrap: rank %d has waited %.0f s for the %s message (tag %d) from %s: is that "
          "rank alive, and making the same calls?",
          b->rank, now - start, what, tag, bootstrap_peer_describe(b, peer, who, sizeof who));
      warn_t = now + BOOTSTRAP_STILL_WAITING_S;
    }
  }
  BRAID_CHECK(msg->tag == tag, ncclInternalError,
              "bootstrap: rank %d and %s are out of step: %s #%d arrived while #%d was expected "
              "(every rank must make the same bootstrap calls in the same order)", b->rank,
              bootstrap_peer_describe(b, peer, who, sizeof who), what, msg->tag, tag);
  BRAID_CHECK(msg->size == size, ncclInternalError,
              "bootstrap: %s sent %zu bytes (%s, tag %d) but rank %d expected %zu",
              bootstrap_peer_describe(b, peer, who, sizeof who), msg->size, what, tag, b->rank, size);
  if (size) memcpy(data, msg->data, size);
fail:
  free(msg);
  return res;
}

void bootstrap_conn_release(struct bootstrap* b) {
  for (int r = 0; b->peers && r < b->nranks; r++) socket_close(&b->peers[r].out_fd);
  b->nout = 0;
  bootstrap_listener_close(&b->listener, "the bootstrap closed before it presented a hello");
  while (b->queue) {
    struct bootstrap_msg* m = b->queue;
    b->queue = m->next;
    free(m);
  }
  b->queue_tail = &b->queue;
}
