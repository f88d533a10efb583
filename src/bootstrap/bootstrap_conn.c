/*
 * The bootstrap's message engine: a rank's incoming connections, its queue of
 * unexpected messages, and sending over connections made on first use.
 *
 * Connections between ranks are one-way: to send to rank p we connect to p's
 * listener once, present a PEER hello with the job's secret, and keep the
 * connection for every later message. Whatever arrives on our listener is
 * read into a queue, matched later by (peer, channel, tag).
 *
 * There is no helper thread. Every wait (for a message, for room in a full
 * socket buffer) is a poll() over the listener and every incoming
 * connection, so a rank keeps draining its peers while it waits: send never
 * waits for the matching recv, two ranks sending large messages to each other
 * cannot deadlock, and a stray connection is dropped (WARN with its address)
 * without holding up anyone. Incoming traffic is served only while the owner
 * is inside a bootstrap call; that is enough, because a peer that needs us to
 * read is itself waiting for us to reach the matching call.
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

static const char* const bootstrap_channel_names[BOOTSTRAP_CH_COUNT] = {
    "send/recv", "init exchange", "allgather", "barrier", "split", "failure notice"};

const char* bootstrap_peer_describe(const struct bootstrap* b, int peer, char* buf, size_t size) {
  char addr[BOOTSTRAP_TEXT];
  if (peer < 0) {
    snprintf(buf, size, "the root at %s", b->root_text);
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
  if (b->failed_peer >= 0 && !b->reporting)
    return braid_err(ncclRemoteError,
                     "bootstrap: rank %d stopped waiting for %s from rank %d: %s failed its "
                     "initialization: %s",
                     b->rank, what, peer,
                     bootstrap_peer_describe(b, b->failed_peer, who, sizeof who), b->failed_why);
  if (b->deadline >= 0 && braid_time_sec() >= b->deadline)
    return braid_err(ncclSystemError, "bootstrap: rank %d of %d timed out after %.0f s waiting for %s "
                     "from %s", b->rank, b->nranks, b->timeout, what,
                     bootstrap_peer_describe(b, peer, who, sizeof who));
  return ncclSuccess;
}

/* ------------------------------------------------- incoming connections */

void bootstrap_in_close(struct bootstrap_in* c) {
  socket_close(&c->fd);
  free(c->msg);
  c->msg = NULL;
}

/* Drops a connection that is not a rank of this job (scanner, stale job, garbage): WARN, close. */
static void bootstrap_in_reject(struct bootstrap* b, struct bootstrap_in* c, const char* why) {
  char addr[BOOTSTRAP_TEXT], self[BOOTSTRAP_TEXT];
  WARN("bootstrap: rank %d (listener %s) rejected connection from %s: %s", b->rank,
       socket_addr_str(&b->listen_addr, self, sizeof self),
       socket_addr_str(&c->remote, addr, sizeof addr), why);
  bootstrap_in_close(c);
}

/* The connection of an accepted rank ended: later waits on that rank fail instead of hanging. */
static void bootstrap_in_lost(struct bootstrap* b, struct bootstrap_in* c, const char* why) {
  char who[160];
  if (why) WARN("bootstrap: rank %d closes the connection of %s: %s", b->rank,
                bootstrap_peer_describe(b, c->rank, who, sizeof who), why);
  else TRACE(BRAID_LOG_BOOTSTRAP, "bootstrap: rank %d: rank %d closed its connection", b->rank, c->rank);
  b->peers[c->rank].closed = 1;
  bootstrap_in_close(c);
}

static void bootstrap_in_hello(struct bootstrap* b, struct bootstrap_in* c) {
  const char* why = bootstrap_hello_check(&c->hello, b->secret);
  int rank = c->hello.rank;
  if (why == NULL && c->hello.kind != BOOTSTRAP_HELLO_PEER) why = "not a rank-to-rank hello";
  if (why == NULL && (c->hello.nranks != b->nranks || rank < 0 || rank >= b->nranks || rank == b->rank))
    why = "rank or number of ranks does not fit this job";
  for (int i = 0; why == NULL && i < b->nin; i++)
    if (b->in[i] != c && b->in[i]->fd >= 0 && b->in[i]->rank == rank)
      why = "a second connection claiming the same rank";
  if (why == NULL && b->peers[rank].closed) why = "a rank whose connection already ended";
  if (why != NULL) {
    bootstrap_in_reject(b, c, why);
    return;
  }
  c->rank = rank;
  c->got = 0;
}

/* A complete header: check it and make room for the payload. Returns -1 if the stream is bad. */
static int bootstrap_in_header(struct bootstrap* b, struct bootstrap_in* c) {
  char why[128];
  const struct bootstrap_msg_header* h = &c->header;
  if (h->magic != BOOTSTRAP_WIRE_MAGIC || h->channel >= BOOTSTRAP_CH_COUNT || h->size > BOOTSTRAP_MAX_MSG) {
    snprintf(why, sizeof why, "malformed message header (magic 0x%08x, channel %u, %llu bytes)",
             h->magic, h->channel, (unsigned long long)h->size);
    bootstrap_in_lost(b, c, why);
    return -1;
  }
  c->msg = malloc(sizeof *c->msg + (size_t)h->size);
  if (c->msg == NULL) {
    snprintf(why, sizeof why, "out of memory for a message of %llu bytes", (unsigned long long)h->size);
    bootstrap_in_lost(b, c, why);
    return -1;
  }
  c->msg->next = NULL;
  c->msg->peer = c->rank;
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
  for (int budget = 64; budget > 0 && c->fd >= 0; budget--) {
    void* dst;
    size_t want;
    if (c->rank < 0) {
      dst = (char*)&c->hello + c->got;
      want = sizeof c->hello - c->got;
    } else if (c->msg == NULL) {
      dst = (char*)&c->header + c->got;
      want = sizeof c->header - c->got;
    } else {
      dst = c->msg->data + c->got;
      want = c->msg->size - c->got;
    }
    size_t got = 0;
    if (want > 0 && socket_recv_some(c->fd, dst, want, &got) != ncclSuccess) {
      snprintf(why, sizeof why, "connection ended: %s", errno ? strerror(errno) : "closed by the peer");
      if (c->rank < 0) {
        snprintf(why, sizeof why, "it closed after %zu of the %zu bytes of a hello", c->got, sizeof c->hello);
        bootstrap_in_reject(b, c, why);
      } else {
        bootstrap_in_lost(b, c, c->msg || c->got ? why : NULL);
      }
      return;
    }
    if (want > 0 && got == 0) return;
    c->got += got;
    if (c->rank < 0) {
      if (c->got == sizeof c->hello) bootstrap_in_hello(b, c);
    } else if (c->msg == NULL) {
      if (c->got == sizeof c->header && bootstrap_in_header(b, c) != 0) return;
    }
    if (c->rank >= 0 && c->msg != NULL && c->got == c->msg->size) {
      if (c->msg->channel == BOOTSTRAP_CH_FAIL) /* not for any recv: every wait fails now */
        bootstrap_failure_note(b, c->msg);
      else
        bootstrap_enqueue(b, c->msg);
      c->msg = NULL;
      c->got = 0;
    }
  }
}

/* Appends a connection in its hello phase; -1 when out of memory. */
int bootstrap_in_add(struct bootstrap* b, int fd, const union braid_sockaddr* remote) {
  if (b->nin == b->in_cap) {
    int cap = b->in_cap ? 2 * b->in_cap : 16;
    struct bootstrap_in** grown = realloc(b->in, (size_t)cap * sizeof *grown);
    if (grown == NULL) return -1;
    b->in = grown;
    b->in_cap = cap;
  }
  struct bootstrap_in* c = calloc(1, sizeof *c);
  if (c == NULL) return -1;
  c->fd = fd;
  c->rank = -1;
  c->remote = *remote;
  c->hello_deadline = braid_time_sec() + BOOTSTRAP_HELLO_SEC;
  b->in[b->nin++] = c;
  return 0;
}

/* Takes every connection waiting on the listener; refuses them past BOOTSTRAP_MAX_PENDING. */
static void bootstrap_accept(struct bootstrap* b) {
  char addr[BOOTSTRAP_TEXT];
  for (;;) {
    int fd = -1, pending = 0;
    union braid_sockaddr remote;
    if (socket_accept_some(b->listen_fd, &fd, &remote) != ncclSuccess) {
      char who[48];
      snprintf(who, sizeof who, "bootstrap: rank %d", b->rank);
      socket_accept_failed(who);
      return;
    }
    if (fd < 0) return;
    for (int i = 0; i < b->nin; i++) pending += b->in[i]->fd >= 0 && b->in[i]->rank < 0;
    const char* why = NULL;
    if (pending >= BOOTSTRAP_MAX_PENDING) why = "too many connections already wait to present a hello";
    else if (bootstrap_in_add(b, fd, &remote) != 0) why = "out of memory";
    if (why == NULL) continue;
    WARN("bootstrap: rank %d refused connection from %s: %s", b->rank,
         socket_addr_str(&remote, addr, sizeof addr), why);
    close(fd);
  }
}

/* Drops connections that sat without a hello too long, and forgets closed ones. */
static void bootstrap_in_sweep(struct bootstrap* b) {
  char why[96];
  double now = braid_time_sec();
  int kept = 0;
  for (int i = 0; i < b->nin; i++) {
    struct bootstrap_in* c = b->in[i];
    if (c->fd >= 0 && c->rank < 0 && now >= c->hello_deadline) {
      snprintf(why, sizeof why, "no hello within %.0f s (%zu of %zu bytes)", BOOTSTRAP_HELLO_SEC,
               c->got, sizeof c->hello);
      bootstrap_in_reject(b, c, why);
    }
    if (c->fd >= 0)
      b->in[kept++] = c;
    else
      free(c);
  }
  b->nin = kept;
}

/*
 * One turn of every wait: polls the listener, every incoming connection and,
 * when fd >= 0, `fd` for `events`, for at most one slice; serves whatever is
 * ready. The caller then retries what it waits for.
 */
static void bootstrap_progress(struct bootstrap* b, int fd, short events) {
  int n = b->nin, total = n + 1 + (fd >= 0);
  if (total > b->pfd_cap) {
    struct pollfd* grown = realloc(b->pfds, (size_t)total * sizeof *grown);
    if (grown == NULL) { /* serve nothing this turn; the caller's wait still ends on time */
      poll(NULL, 0, BOOTSTRAP_SLICE_MS);
      return;
    }
    b->pfds = grown;
    b->pfd_cap = total;
  }
  b->pfds[0] = (struct pollfd){.fd = b->listen_fd, .events = POLLIN};
  for (int i = 0; i < n; i++) b->pfds[1 + i] = (struct pollfd){.fd = b->in[i]->fd, .events = POLLIN};
  if (fd >= 0) b->pfds[n + 1] = (struct pollfd){.fd = fd, .events = events};
  if (poll(b->pfds, (nfds_t)total, BOOTSTRAP_SLICE_MS) > 0) {
    for (int i = 0; i < n; i++)
      if (b->pfds[1 + i].revents && b->in[i]->fd >= 0) bootstrap_in_read(b, b->in[i]);
    /* Accept after reading: new connections go past the end, so index i still names pfds[1 + i]. */
    if (b->pfds[0].revents) bootstrap_accept(b);
  }
  bootstrap_in_sweep(b);
}

/* --------------------------------------------------------- sending */

/*
 * bootstrap_fd_move, telling in *moved how many bytes went through (also on failure). With
 * `reset` set, a send to the root on a connection it reset, or a receive from it reset before
 * its first byte, fails quietly (no message) with *reset = 1: see bootstrap_root_move.
 */
static ncclResult_t bootstrap_fd_move_counted(struct bootstrap* b, int fd, void* buf, size_t size,
                                              int sending, int peer, size_t* moved, int* reset) {
  ncclResult_t res = ncclSuccess;
  char who[160];
  *moved = 0;
  while (*moved < size) {
    const size_t done = *moved;
    size_t n = 0;
    res = sending ? socket_send_some(fd, (char*)buf + done, size - done, &n)
                  : socket_recv_some(fd, (char*)buf + done, size - done, &n);
    if (res != ncclSuccess) {
      int e = errno;
      if (reset && (sending ? e == ECONNRESET || e == EPIPE : *moved == 0 && e == ECONNRESET)) {
        *reset = 1;
        return ncclRemoteError;
      }
      bootstrap_peer_describe(b, peer, who, sizeof who);
      if (peer < 0 && !sending)
        return braid_err(ncclRemoteError, "bootstrap: %s closed the connection before answering rank %d "
                         "(%s): it refuses a hello with another job's secret, or its process exited",
                         who, b->rank, e ? strerror(e) : "closed");
      return braid_err(res, "bootstrap: rank %d lost its connection to %s while %s: %s", b->rank, who,
                       sending ? "sending" : "receiving", e ? strerror(e) : "closed by the peer");
    }
    *moved += n;
    if (*moved == size || n > 0) continue;
    res = bootstrap_wait_check(b, peer, sending ? "room to send" : "an answer");
    if (res != ncclSuccess) return res;
    bootstrap_progress(b, fd, sending ? POLLOUT : POLLIN);
  }
  return ncclSuccess;
}

/* Logs its own failures, naming the peer. */
ncclResult_t bootstrap_fd_move(struct bootstrap* b, int fd, void* buf, size_t size, int sending,
                               int peer) {
  size_t moved;
  return bootstrap_fd_move_counted(b, fd, buf, size, sending, peer, &moved, NULL);
}

ncclResult_t bootstrap_root_move(struct bootstrap* b, int fd, void* buf, size_t size, int sending,
                                 int* reset) {
  size_t moved;
  *reset = 0;
  return bootstrap_fd_move_counted(b, fd, buf, size, sending, -1, &moved, reset);
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

/* Our connection to `peer`, made on first use and kept. */
static ncclResult_t bootstrap_out_connect(struct bootstrap* b, int peer) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_peer* p = &b->peers[peer];
  struct bootstrap_hello hello;
  char who[160];
  int fd = -1, err = 0;
  if (p->out_fd >= 0) return ncclSuccess;
  BRAID_CHECK(p->addr.sa.sa_family != 0, ncclInternalError,
              "bootstrap: rank %d has no address for rank %d yet", b->rank, peer);
  double limit = b->deadline >= 0 ? BRAID_MAX(0.0, b->deadline - braid_time_sec()) : b->timeout;
  res = socket_connect_quiet(&p->addr, limit, b->abort_flag ? b->abort_flag : &b->aborted, &fd, &err);
  if (res != ncclSuccess && err == ECANCELED) {
    INFO(BRAID_LOG_BOOTSTRAP, "bootstrap: rank %d stopped connecting to rank %d: aborted", b->rank, peer);
    goto fail;
  }
  BRAID_CHECK(res == ncclSuccess, ncclSystemError,
              "bootstrap: rank %d cannot connect to %s within %.0f s: %s (it must be reachable over "
              "the interface BRAID_SOCKET_IFNAME selects there)", b->rank,
              bootstrap_peer_describe(b, peer, who, sizeof who), limit, strerror(err));
  bootstrap_hello_fill(b, BOOTSTRAP_HELLO_PEER, b->secret, &hello);
  BRAID_TRY(bootstrap_fd_move(b, fd, &hello, sizeof hello, 1, peer));
  p->out_fd = fd;
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
  char who[160];
  BRAID_CHECK(!b->peers[peer].send_cut, ncclRemoteError,
              "bootstrap: rank %d cannot send to %s: an earlier message to it was cut off mid-way "
              "(by an abort or a lost connection), so the connection carries no more",
              b->rank, bootstrap_peer_describe(b, peer, who, sizeof who));
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
  while ((msg = bootstrap_queue_take(b, peer, channel, tag, any_tag)) == NULL) {
    /* First: a failure notice says why better than the connection its sender then closed. */
    BRAID_TRY(bootstrap_wait_check(b, peer, what));
    /* A peer that closed may have done so on another rank's failure notice, on its way here. */
    for (double until = braid_time_sec() + BOOTSTRAP_NOTICE_GRACE_S;
         b->peers[peer].closed && b->failed_peer < 0 && braid_time_sec() < until;)
      bootstrap_progress(b, -1, 0);
    BRAID_TRY(bootstrap_wait_check(b, peer, what));
    BRAID_CHECK(!b->peers[peer].closed, ncclRemoteError,
                "bootstrap: %s closed its connection while rank %d waited for its %s message "
                "(tag %d): did it exit or abort?",
                bootstrap_peer_describe(b, peer, who, sizeof who), b->rank, what, tag);
    bootstrap_progress(b, -1, 0);
    /* After init there is no deadline: a peer that died before it ever connected, or whose
       host vanished, would leave this wait silent. */
    double now = braid_time_sec();
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
  for (int i = 0; i < b->nin; i++) {
    if (b->in[i]->fd >= 0 && b->in[i]->rank < 0)
      bootstrap_in_reject(b, b->in[i], "the bootstrap closed before it presented a hello");
    bootstrap_in_close(b->in[i]);
    free(b->in[i]);
  }
  b->nin = 0;
  while (b->queue) {
    struct bootstrap_msg* m = b->queue;
    b->queue = m->next;
    free(m);
  }
  b->queue_tail = &b->queue;
}
