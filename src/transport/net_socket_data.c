/*
 * The socket backend's data path (see net_socket.h for the wire layout and
 * who owns what): posting and testing requests, the control stream that the
 * calling thread moves itself, and the helper threads that move the pieces
 * of large messages over the data streams.
 *
 * A helper loops over its streams moving queued pieces with non-blocking
 * send/recv; when nothing moves it sleeps in poll() on the sockets it waits
 * for and on its eventfd, which the caller writes after queueing work for a
 * sleeping helper (the `sleeping` flag and the queue counters are seq_cst, so
 * a wake-up is never lost).
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "transport/net_socket.h"

void net_socket_share(size_t size, int nstreams, uint64_t seq, int stream, size_t* off,
                      size_t* len) {
  *off = 0;
  *len = 0;
  if (size <= SOCK_INLINE_BYTES || nstreams <= 0) return;
  size_t piece = BRAID_ALIGN_UP(BRAID_DIV_UP(size, (size_t)nstreams), (size_t)SOCK_PIECE_ALIGN);
  if (piece < SOCK_MIN_PIECE) piece = SOCK_MIN_PIECE;
  size_t npieces = BRAID_DIV_UP(size, piece);
  size_t k = (size_t)((stream + (uint64_t)nstreams - seq % (uint64_t)nstreams) % (uint64_t)nstreams);
  if (k >= npieces) return;
  *off = k * piece;
  *len = BRAID_MIN(piece, size - *off);
}

void net_socket_stream_counts(int* nstreams, int* nthreads) {
  int64_t t = braid_param_int(BRAID_P_SOCKET_NTHREADS);
  int64_t s = braid_param_int(BRAID_P_NSOCKS_PERTHREAD);
  t = BRAID_MAX(1, BRAID_MIN(t, SOCK_MAX_THREADS));
  s = BRAID_MAX(1, BRAID_MIN(s, SOCK_MAX_STREAMS / t));
  *nthreads = (int)t;
  *nstreams = (int)(t * s);
}

void net_socket_comm_fail(struct sock_comm* c, ncclResult_t code, const char* fmt, ...) {
  pthread_mutex_lock(&c->err_lock);
  if (!atomic_load(&c->failed)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_text, sizeof c->err_text, fmt, ap);
    va_end(ap);
    c->err_code = code;
    atomic_store(&c->failed, 1);
  }
  pthread_mutex_unlock(&c->err_lock);
}

/* The comm's error, reported (logged) once; later calls return the code quietly. */
static ncclResult_t sock_comm_error(struct sock_comm* c) {
  ncclResult_t code;
  pthread_mutex_lock(&c->err_lock);
  code = c->err_code;
  int first = !c->err_reported;
  c->err_reported = 1;
  pthread_mutex_unlock(&c->err_lock);
  if (!first) return code;
  return braid_err(code, "net Socket: %s", c->err_text);
}

/* ------------------------------------------------------------ helpers */

static void sock_helper_wake(struct sock_helper* h) {
  if (!atomic_load(&h->sleeping)) return;
  uint64_t one = 1;
  if (write(h->efd, &one, sizeof one) < 0 && errno != EAGAIN)
    WARN("net Socket: cannot wake a helper thread: %s", strerror(errno));
}

static void sock_move_failed(struct sock_comm* c, int stream, size_t done, size_t len, ssize_t n) {
  int e = n == 0 ? 0 : errno;
  net_socket_comm_fail(c, (n == 0 || e == EPIPE || e == ECONNRESET) ? ncclRemoteError : ncclSystemError,
                       "%s %s on data stream %d failed after %zu of %zu bytes of a piece: %s",
                       c->is_send ? "sending to" : "receiving from", c->peer, stream, done, len,
                       n == 0 ? "the peer closed the connection" : strerror(e));
}

/*
 * Moves queued pieces of one stream until it would block. Returns 1 when
 * bytes moved, 0 when not, -1 on error; *events: what to poll for (0: idle).
 */
static int sock_stream_progress(struct sock_comm* c, int s, short* events) {
  struct sock_stream* st = &c->streams[s];
  int moved = 0;
  *events = 0;
  for (;;) {
    uint64_t popped = atomic_load_explicit(&st->popped, memory_order_relaxed);
    if (popped == atomic_load(&st->pushed)) return moved;
    struct sock_task* t = &st->tasks[popped % SOCK_MAX_REQS];
    while (st->done < t->len) {
      ssize_t n = c->is_send
                      ? send(st->fd, t->ptr + st->done, t->len - st->done, MSG_DONTWAIT | MSG_NOSIGNAL)
                      : recv(st->fd, t->ptr + st->done, t->len - st->done, MSG_DONTWAIT);
      if (n > 0) {
        st->done += (size_t)n;
        moved = 1;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        *events = c->is_send ? POLLOUT : POLLIN;
        return moved;
      }
      sock_move_failed(c, s, st->done, t->len, n);
      return -1;
    }
    st->done = 0;
    atomic_fetch_sub(&t->req->streams_left, 1);
    atomic_store(&st->popped, popped + 1);
    moved = 1;
  }
}

/* One pass over the helper's streams; then, if nothing moved, a sleep in poll(). */
static int sock_helper_pass(struct sock_helper* h) {
  struct sock_comm* c = h->comm;
  struct pollfd pfd[SOCK_MAX_STREAMS + 1];
  int n = 0, moved = 0;
  for (int s = h->index; s < c->nstreams; s += c->nthreads) {
    short events = 0;
    int r = sock_stream_progress(c, s, &events);
    if (r < 0) return -1;
    moved |= r;
    if (events) pfd[n++] = (struct pollfd){.fd = c->streams[s].fd, .events = events};
  }
  if (moved) {
    h->idle_since = 0;
    return 0;
  }
  /* Stay awake a little while: the next message usually follows within microseconds. */
  double now = braid_time_sec();
  if (h->idle_since == 0) h->idle_since = now;
  if (n == 0 && now - h->idle_since < SOCK_HELPER_SPIN_SEC) {
    sched_yield();
    return 0;
  }
  atomic_store(&h->sleeping, 1);
  /* Work queued on an idle stream between our pass and the flag found us awake: look again. */
  for (int s = h->index, i = 0; s < c->nstreams; s += c->nthreads) {
    struct sock_stream* st = &c->streams[s];
    int blocked = i < n && pfd[i].fd == st->fd;
    i += blocked;
    if (!blocked && atomic_load(&st->pushed) != atomic_load(&st->popped)) {
      atomic_store(&h->sleeping, 0);
      return 0;
    }
  }
  pfd[n++] = (struct pollfd){.fd = h->efd, .events = POLLIN};
  if (!atomic_load(&c->closing) && poll(pfd, (nfds_t)n, 1000) > 0 && (pfd[n - 1].revents & POLLIN)) {
    uint64_t count;
    if (read(h->efd, &count, sizeof count) < 0 && errno != EAGAIN)
      WARN("net Socket: reading a helper's eventfd failed: %s", strerror(errno));
  }
  atomic_store(&h->sleeping, 0);
  return 0;
}

static void* sock_helper_main(void* arg) {
  struct sock_helper* h = arg;
  struct sock_comm* c = h->comm;
  char name[16];
  snprintf(name, sizeof name, "braid-sock%d", h->index);
  pthread_setname_np(pthread_self(), name);
  while (!atomic_load(&c->closing) && !atomic_load(&c->failed)) {
    if (sock_helper_pass(h) < 0) break;
  }
  return NULL;
}

ncclResult_t net_socket_comm_start(struct sock_comm* c) {
  ncclResult_t res = ncclSuccess;
  c->nthreads = BRAID_MIN(c->nthreads, c->nstreams);
  for (int i = 0; i < c->nthreads; i++) {
    struct sock_helper* h = &c->helpers[i];
    h->comm = c;
    h->index = i;
    h->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    BRAID_SYS_TRY(h->efd, "eventfd() for a socket helper thread");
  }
  for (int i = 0; i < c->nthreads; i++) {
    int err = pthread_create(&c->helpers[i].thread, NULL, sock_helper_main, &c->helpers[i]);
    BRAID_CHECK(err == 0, ncclSystemError, "net Socket: cannot start helper thread %d for %s: %s",
                i, c->peer, strerror(err));
    c->helpers[i].started = 1;
  }
  return ncclSuccess;
fail:
  return res;
}

/*
 * The sender's last header: goodbye, unless a message is still going out (then the end is an
 * error). All of it or nothing: half a header and then the end would read as a broken stream,
 * so a short send waits (briefly) for room.
 */
#define SOCK_BYE_WAIT_S 0.5
static void sock_say_bye(struct sock_comm* c) {
  if (!c->is_send || c->ctrl_fd < 0 || atomic_load(&c->failed) || c->ctrl_moved != 0 ||
      c->ctrl_seq != c->posted)
    return;
  struct sock_header bye = {.magic = SOCK_MAGIC, .flags = SOCK_FLAG_BYE};
  if (socket_send_all(c->ctrl_fd, &bye, sizeof bye, SOCK_BYE_WAIT_S, NULL) != ncclSuccess)
    INFO(BRAID_LOG_NET, "net Socket: could not say goodbye to %s", c->peer);
}

static void sock_comm_release(struct sock_comm* c);

void net_socket_comm_free(struct sock_comm* c) {
  if (c == NULL) return;
  sock_say_bye(c);
  sock_comm_release(c);
}

void net_socket_comm_abandon(struct sock_comm* c) {
  if (c == NULL) return;
  sock_comm_release(c);
}

static void sock_comm_release(struct sock_comm* c) {
  atomic_store(&c->closing, 1);
  for (int i = 0; i < c->nthreads; i++) {
    struct sock_helper* h = &c->helpers[i];
    if (!h->started) continue;
    uint64_t one = 1;
    if (write(h->efd, &one, sizeof one) < 0) { /* the helper also wakes within a second */ }
    pthread_join(h->thread, NULL);
  }
  for (int i = 0; i < c->nthreads; i++)
    if (c->helpers[i].efd >= 0) close(c->helpers[i].efd);
  for (int s = 0; s < c->nstreams; s++) socket_close(&c->streams[s].fd);
  socket_close(&c->ctrl_fd);
  net_connect_try_close(&c->connect_try);
  pthread_mutex_destroy(&c->err_lock);
  free(c);
}

/* ------------------------------------------------------- control stream */

/* Queues the pieces of request `r` on their streams and wakes their helpers. */
static void sock_req_dispatch(struct sock_comm* c, struct sock_req* r) {
  struct sock_stream* targets[SOCK_MAX_STREAMS];
  int n = 0;
  for (int s = 0; s < c->nstreams; s++) {
    size_t off, len;
    net_socket_share(r->nbytes, c->nstreams, r->seq, s, &off, &len);
    if (len > 0) targets[n++] = &c->streams[s];
    (void)off;
  }
  atomic_store(&r->streams_left, n);
  for (int i = 0; i < n; i++) {
    struct sock_stream* st = targets[i];
    int s = (int)(st - c->streams);
    size_t off, len;
    net_socket_share(r->nbytes, c->nstreams, r->seq, s, &off, &len);
    uint64_t pushed = atomic_load_explicit(&st->pushed, memory_order_relaxed);
    st->tasks[pushed % SOCK_MAX_REQS] = (struct sock_task){.req = r, .ptr = r->data + off, .len = len};
    atomic_store(&st->pushed, pushed + 1);
    sock_helper_wake(&c->helpers[s % c->nthreads]);
  }
}

/* Sends what fits of request r's header and inline payload; 1 when all of it went. */
static int sock_ctrl_send(struct sock_comm* c, struct sock_req* r) {
  size_t inline_bytes = r->nbytes <= SOCK_INLINE_BYTES ? r->nbytes : 0;
  size_t total = sizeof c->ctrl_hdr + inline_bytes;
  while (c->ctrl_moved < total) {
    struct iovec iov[2];
    int n = 0;
    if (c->ctrl_moved < sizeof c->ctrl_hdr)
      iov[n++] = (struct iovec){(char*)&c->ctrl_hdr + c->ctrl_moved, sizeof c->ctrl_hdr - c->ctrl_moved};
    size_t pay_done = c->ctrl_moved > sizeof c->ctrl_hdr ? c->ctrl_moved - sizeof c->ctrl_hdr : 0;
    if (inline_bytes > pay_done) iov[n++] = (struct iovec){r->data + pay_done, inline_bytes - pay_done};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t sent = sendmsg(c->ctrl_fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent > 0) {
      c->ctrl_moved += (size_t)sent;
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    int e = errno;
    net_socket_comm_fail(c, (e == EPIPE || e == ECONNRESET) ? ncclRemoteError : ncclSystemError,
                         "sending to %s on the control stream failed: %s", c->peer, strerror(e));
    return -1;
  }
  return 1;
}

/* Reads `want` bytes into buf+*got; 1 when complete, 0 when it would block, -1 on error/EOF. */
static int sock_ctrl_read(struct sock_comm* c, char* buf, size_t want, size_t* got) {
  while (*got < want) {
    ssize_t n = recv(c->ctrl_fd, buf + *got, want - *got, MSG_DONTWAIT);
    if (n > 0) {
      *got += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    int e = n == 0 ? 0 : errno;
    net_socket_comm_fail(c, (n == 0 || e == ECONNRESET) ? ncclRemoteError : ncclSystemError,
                         "receiving from %s: %s", c->peer,
                         n == 0 ? "the connection ended without a goodbye (the peer's process died?)"
                                : strerror(e));
    return -1;
  }
  return 1;
}

/* Receives request r's header (then inline payload); 1 when the control part is complete. */
static int sock_ctrl_recv(struct sock_comm* c, struct sock_req* r) {
  size_t hdr = sizeof c->ctrl_hdr;
  if (c->ctrl_moved < hdr) {
    size_t got = c->ctrl_moved;
    int rc = sock_ctrl_read(c, (char*)&c->ctrl_hdr, hdr, &got);
    c->ctrl_moved = got;
    if (rc <= 0) return rc;
    if (c->ctrl_hdr.magic != SOCK_MAGIC) {
      net_socket_comm_fail(c, ncclSystemError, "corrupt message header from %s (magic 0x%x)",
                           c->peer, c->ctrl_hdr.magic);
      return -1;
    }
    if (c->ctrl_hdr.flags & SOCK_FLAG_BYE) {
      INFO(BRAID_LOG_NET, "net Socket: %s closed the connection", c->peer);
      c->peer_done = 1;
      return 0;
    }
    if (c->ctrl_hdr.size > r->size) {
      net_socket_comm_fail(c, ncclInternalError,
                           "%s sent a %llu-byte message into a %zu-byte receive (truncation)",
                           c->peer, (unsigned long long)c->ctrl_hdr.size, r->size);
      return -1;
    }
    r->nbytes = (size_t)c->ctrl_hdr.size;
    if (r->nbytes > SOCK_INLINE_BYTES) sock_req_dispatch(c, r);
  }
  if (r->nbytes > SOCK_INLINE_BYTES) return 1;
  size_t got = c->ctrl_moved - hdr;
  int rc = sock_ctrl_read(c, r->data, r->nbytes, &got);
  c->ctrl_moved = hdr + got;
  return rc;
}

/* Moves the control stream as far as it goes without blocking; ncclSuccess unless it failed. */
static ncclResult_t sock_ctrl_progress(struct sock_comm* c) {
  while (c->ctrl_seq < c->posted && !c->peer_done) {
    struct sock_req* r = &c->reqs[c->ctrl_seq % SOCK_MAX_REQS];
    if (c->ctrl_moved == 0 && c->is_send)
      c->ctrl_hdr = (struct sock_header){.magic = SOCK_MAGIC, .size = r->nbytes};
    int rc = c->is_send ? sock_ctrl_send(c, r) : sock_ctrl_recv(c, r);
    if (rc < 0) return sock_comm_error(c);
    if (rc == 0) break;
    r->ctrl_done = 1;
    c->ctrl_seq++;
    c->ctrl_moved = 0;
  }
  if (atomic_load(&c->failed)) return sock_comm_error(c);
  return ncclSuccess;
}

/* ------------------------------------------------------------ requests */

static ncclResult_t sock_post(struct sock_comm* c, void* data, size_t size, void** request) {
  *request = NULL;
  if (atomic_load(&c->failed)) return sock_comm_error(c);
  struct sock_req* r = &c->reqs[c->posted % SOCK_MAX_REQS];
  if (r->used) return ncclSuccess; /* SOCK_MAX_REQS outstanding: call again */
  r->comm = c;
  r->seq = c->posted;
  r->data = data;
  r->size = size;
  r->nbytes = c->is_send ? size : 0;
  r->ctrl_done = 0;
  atomic_store(&r->streams_left, 0);
  r->used = 1;
  if (c->is_send && size > SOCK_INLINE_BYTES) sock_req_dispatch(c, r);
  c->posted++;
  *request = r;
  return sock_ctrl_progress(c);
}

ncclResult_t net_socket_isend(void* send_comm, void* data, size_t size, void* mhandle, void** request) {
  return sock_post(send_comm, data, size, request);
}

ncclResult_t net_socket_irecv(void* recv_comm, void* data, size_t size, void* mhandle, void** request) {
  return sock_post(recv_comm, data, size, request);
}

ncclResult_t net_socket_test(void* request, int* done, size_t* size) {
  struct sock_req* r = request;
  struct sock_comm* c = r->comm;
  *done = 0;
  ncclResult_t res = sock_ctrl_progress(c);
  if (res != ncclSuccess) return res;
  if (!r->ctrl_done || atomic_load(&r->streams_left) != 0) return ncclSuccess;
  *done = 1;
  if (size) *size = r->nbytes;
  r->used = 0;
  c->freed++;
  return ncclSuccess;
}

int net_socket_recv_fd(void* recv_comm) { return ((struct sock_comm*)recv_comm)->ctrl_fd; }

/*
 * Past the control stream, a request whose header (and inline payload) came
 * waits only on the helpers, or on nothing at all if it was not tested yet:
 * the comm is busy from the header of a request until test() frees it.
 */
int net_socket_recv_busy(void* recv_comm) {
  struct sock_comm* c = recv_comm;
  return c->ctrl_seq != c->freed || c->ctrl_moved != 0 ||
         atomic_load_explicit(&c->failed, memory_order_relaxed);
}
