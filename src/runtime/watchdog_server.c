/*
 * The watchdog's wire (watchdog_server.h).
 *
 * The server reads requests from up to WD_SERVER_CONNS connections at once,
 * each with WD_QUERY_TIMEOUT_S to deliver its request, so a client that
 * connects and sends nothing (or the wrong secret) delays nobody; when every
 * slot is taken the oldest connection makes room. A real rank's query sends
 * its request as soon as it connects.
 *
 * The queries of a verdict run side by side in one poll() loop under one
 * deadline: a dead rank (its port refuses) ends at once, and a silent host or
 * a peer that never answers costs that deadline once, not once per rank.
 */
#include "runtime/watchdog_server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/debug.h"
#include "base/socket.h"
#include "base/utils.h"

#define WD_REFUSAL_WARN_S 10.0 /* at most one WARN about refused requests this often */

struct wd_conn {
  int fd;
  size_t got;
  double deadline;
  struct wd_request req;
  union braid_sockaddr peer;
};

struct wd_server {
  int listen_fd;
  uint8_t secret[WD_SECRET_BYTES];
  wd_summary_fn summary;
  wd_notice_fn notice;
  void* summary_arg;
  volatile uint32_t* stop;
  struct wd_conn conns[WD_SERVER_CONNS];
  int n;
  unsigned long refused; /* since the last WARN */
  double warned_t;
};

struct wd_server* wd_server_new(int listen_fd, const uint8_t* secret, wd_summary_fn summary,
                                void* arg, volatile uint32_t* stop) {
  struct wd_server* sv = calloc(1, sizeof *sv);
  if (sv == NULL) return NULL;
  sv->listen_fd = listen_fd;
  memcpy(sv->secret, secret, sizeof sv->secret);
  sv->summary = summary;
  sv->summary_arg = arg;
  sv->stop = stop;
  sv->warned_t = -WD_REFUSAL_WARN_S;
  return sv;
}

void wd_server_on_notice(struct wd_server* sv, wd_notice_fn notice) { sv->notice = notice; }

void wd_server_free(struct wd_server* sv) {
  if (sv == NULL) return;
  for (int i = 0; i < sv->n; i++) socket_close(&sv->conns[i].fd);
  free(sv);
}

/* Counts a refused connection; WARNs now and then with how many (a flood must not flood it). */
static void wd_refused(struct wd_server* sv, const union braid_sockaddr* peer, const char* why) {
  double now = braid_time_sec();
  sv->refused++;
  if (now - sv->warned_t < WD_REFUSAL_WARN_S) return;
  char text[64];
  WARN("watchdog: dropped a connection from %s %s (%lu dropped in the last %.0f s)",
       socket_addr_str(peer, text, sizeof text), why, sv->refused, WD_REFUSAL_WARN_S);
  sv->refused = 0;
  sv->warned_t = now;
}

/* Answers a complete request, or refuses one without the job's secret. */
static void wd_answer(struct wd_server* sv, struct wd_conn* c) {
  if (c->req.magic != BRAID_LEDGER_MAGIC ||
      !braid_equal_ct(c->req.secret, sv->secret, sizeof c->req.secret)) {
    wd_refused(sv, &c->peer, "without the job's secret");
    return;
  }
  if ((c->req.flags & (WD_REQ_FAILING | WD_REQ_BYE)) && sv->notice)
    sv->notice(sv->summary_arg, c->req.flags, c->req.rank, c->req.gone);
  if (c->req.flags & (WD_REQ_PING | WD_REQ_BYE)) return; /* no reply */
  struct wd_reply reply = {.magic = WD_REPLY_MAGIC};
  memcpy(reply.secret, sv->secret, sizeof reply.secret);
  sv->summary(sv->summary_arg, &reply.summary);
  (void)socket_send_all(c->fd, &reply, sizeof reply, WD_QUERY_TIMEOUT_S, sv->stop);
}

/* Reads what pending connection i (polled as `revents`) sent; 1 when it is done with. */
static int wd_serve_conn(struct wd_server* sv, struct wd_conn* c, short revents, double now) {
  if (revents) {
    size_t got = 0;
    if (socket_recv_some(c->fd, (char*)&c->req + c->got, sizeof c->req - c->got, &got) !=
        ncclSuccess)
      return 1; /* closed or failed: a query that gave up */
    c->got += got;
    if (c->got == sizeof c->req) {
      wd_answer(sv, c);
      return 1;
    }
  }
  if (now >= c->deadline) {
    wd_refused(sv, &c->peer, "that sent no request in time");
    return 1;
  }
  return 0;
}

/* Takes the connections waiting on the listener. */
static void wd_accept(struct wd_server* sv, double now) {
  for (;;) {
    int fd = -1;
    union braid_sockaddr peer;
    if (socket_accept_some(sv->listen_fd, &fd, &peer) != ncclSuccess) {
      socket_accept_failed("watchdog");
      return;
    }
    if (fd < 0) return;
    if (sv->n == WD_SERVER_CONNS) {
      int oldest = 0;
      for (int i = 1; i < sv->n; i++)
        if (sv->conns[i].deadline < sv->conns[oldest].deadline) oldest = i;
      wd_refused(sv, &sv->conns[oldest].peer, "crowded out by newer connections");
      socket_close(&sv->conns[oldest].fd);
      sv->conns[oldest] = sv->conns[--sv->n];
    }
    struct wd_conn* c = &sv->conns[sv->n++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->deadline = now + WD_QUERY_TIMEOUT_S;
    c->peer = peer;
  }
}

int wd_server_pollfds(const struct wd_server* sv, struct pollfd* pfd) {
  pfd[0] = (struct pollfd){.fd = sv->listen_fd, .events = POLLIN};
  for (int i = 0; i < sv->n; i++)
    pfd[1 + i] = (struct pollfd){.fd = sv->conns[i].fd, .events = POLLIN};
  return 1 + sv->n;
}

void wd_server_serve(struct wd_server* sv, struct pollfd* pfd, double now) {
  for (int i = 0; i < sv->n;) {
    if (!wd_serve_conn(sv, &sv->conns[i], pfd[1 + i].revents, now)) {
      i++;
      continue;
    }
    socket_close(&sv->conns[i].fd);
    sv->conns[i] = sv->conns[--sv->n]; /* the last one moves here, with its poll result */
    pfd[1 + i] = pfd[1 + sv->n];
  }
  if (pfd[0].revents & POLLIN) wd_accept(sv, now);
}

/* ---- the queries of a verdict -------------------------------------------------------------- */

#define WD_QUERY_SLICE_MS 50 /* the longest poll(), so that `stop` is seen soon */

/* One open query (a slot of wd_query_all's). */
struct wd_query {
  int fd;
  int rank;
  int connected;
  size_t sent, got; /* of the request; of the reply */
  struct wd_reply reply;
};

struct wd_query_run {
  const union braid_sockaddr* addrs;
  const uint8_t* secret;
  struct wd_request req;
  struct braid_ledger_summary* out;
  struct wd_query_status* st;
  struct wd_query* q; /* [cap] open queries, the first n in use */
  struct pollfd* pfd; /* [cap] */
  int n, cap;
};

static void wd_query_end(struct wd_query_run* run, int i, enum wd_query_why why, int err) {
  struct wd_query* q = &run->q[i];
  run->st[q->rank] = (struct wd_query_status){.why = why, .err = err};
  if (why == WD_QUERY_ANSWERED) {
    run->out[q->rank] = q->reply.summary;
    run->out[q->rank].host[sizeof q->reply.summary.host - 1] = '\0'; /* never trust the wire */
  }
  socket_close(&q->fd);
  *q = run->q[--run->n]; /* the last one moves here, with its poll result */
  run->pfd[i] = run->pfd[run->n];
}

/* Why a connect that failed with `err` ended: a reset one was taken, then dropped. */
static enum wd_query_why wd_connect_why(int err) {
  if (err == ECONNREFUSED) return WD_QUERY_REFUSED;
  if (err == ECONNRESET || err == EPIPE) return WD_QUERY_CLOSED;
  return WD_QUERY_UNREACHABLE;
}

/* What the reply read so far says: ANSWERED once whole, NO_ANSWER while it may still be one. */
static enum wd_query_why wd_reply_check(const struct wd_query_run* run, const struct wd_query* q) {
  const struct wd_reply* r = &q->reply;
  if (q->got >= sizeof r->magic && r->magic != WD_REPLY_MAGIC) return WD_QUERY_GARBAGE;
  if (q->got < offsetof(struct wd_reply, summary)) return WD_QUERY_NO_ANSWER;
  if (!braid_equal_ct(r->secret, run->secret, WD_SECRET_BYTES)) return WD_QUERY_WRONG_SECRET;
  if (q->got < sizeof *r) return WD_QUERY_NO_ANSWER;
  if (r->summary.magic != BRAID_LEDGER_MAGIC || r->summary.rank != q->rank)
    return WD_QUERY_GARBAGE;
  return WD_QUERY_ANSWERED;
}

/* Moves open query i on after poll() said something of it (`revents`); 1 when it ended. */
static int wd_query_step(struct wd_query_run* run, int i, short revents) {
  struct wd_query* q = &run->q[i];
  int err = 0;
  if (!q->connected) {
    int c = socket_connect_step(&run->addrs[q->rank], &q->fd, &err);
    if (c == 0) return 0;
    if (c < 0) {
      wd_query_end(run, i, wd_connect_why(err), err);
      return 1;
    }
    q->connected = 1;
    revents = POLLOUT;
  }
  if (q->sent < sizeof run->req && (revents & (POLLOUT | POLLERR | POLLHUP))) {
    size_t sent = 0;
    if (socket_send_some(q->fd, (const char*)&run->req + q->sent, sizeof run->req - q->sent,
                         &sent) != ncclSuccess) {
      wd_query_end(run, i, WD_QUERY_CLOSED, errno);
      return 1;
    }
    q->sent += sent;
  }
  if (revents & (POLLIN | POLLERR | POLLHUP)) { /* a reply may come before the request is out */
    size_t got = 0;
    ncclResult_t res = socket_recv_some(q->fd, (char*)&q->reply + q->got,
                                        sizeof q->reply - q->got, &got);
    err = errno; /* 0 when closed, as socket_recv_some leaves it */
    q->got += got;
    enum wd_query_why why = wd_reply_check(run, q);
    if (why == WD_QUERY_NO_ANSWER && res != ncclSuccess) why = WD_QUERY_CLOSED;
    if (why != WD_QUERY_NO_ANSWER) {
      wd_query_end(run, i, why, why == WD_QUERY_CLOSED ? err : 0);
      return 1;
    }
  }
  return 0;
}

/* Opens the query of `rank` in the next slot; 0 when the descriptors ran out (try again later). */
static int wd_query_start(struct wd_query_run* run, int rank) {
  struct wd_query* q = &run->q[run->n];
  memset(q, 0, sizeof *q);
  q->fd = -1;
  q->rank = rank;
  run->pfd[run->n] = (struct pollfd){.fd = -1};
  run->n++;
  int err = 0, c = socket_connect_step(&run->addrs[rank], &q->fd, &err);
  if (c < 0 && (err == EMFILE || err == ENFILE) && run->n > 1) {
    run->n--; /* other queries hold descriptors: this one starts when one of them ends */
    return 0;
  }
  if (c < 0)
    wd_query_end(run, run->n - 1, wd_connect_why(err), err);
  else
    q->connected = c; /* at once (loopback may): the request goes at the first poll */
  return 1;
}

/* The events each open query waits for: the connect, its request's room, its reply. */
static void wd_query_pollfds(struct wd_query_run* run) {
  for (int i = 0; i < run->n; i++) {
    const struct wd_query* q = &run->q[i];
    short events = POLLIN;
    if (!q->connected || q->sent < sizeof run->req) events |= POLLOUT;
    run->pfd[i] = (struct pollfd){.fd = q->fd, .events = events};
  }
}

/* The queries still open at the end: each gets why it ended there; the others were never open. */
static void wd_query_finish(struct wd_query_run* run, int next, int nranks, int me, int stopped) {
  while (run->n > 0) {
    const struct wd_query* q = &run->q[0];
    enum wd_query_why why =
        stopped ? WD_QUERY_STOPPED : q->connected ? WD_QUERY_NO_ANSWER : WD_QUERY_NO_CONNECTION;
    wd_query_end(run, 0, why, 0);
  }
  const enum wd_query_why never = stopped ? WD_QUERY_STOPPED : WD_QUERY_NOT_ASKED;
  for (int r = next; r < nranks; r++)
    if (r != me) run->st[r] = (struct wd_query_status){.why = never};
}

ncclResult_t wd_query_all(const union braid_sockaddr* addrs, int nranks, int me,
                          const uint8_t* secret, int gone, double timeout_s,
                          volatile uint32_t* stop, struct braid_ledger_summary* out,
                          struct wd_query_status* st) {
  struct wd_query_run run = {.addrs = addrs, .secret = secret, .out = out, .st = st};
  run.req.magic = BRAID_LEDGER_MAGIC;
  run.req.flags = gone >= 0 ? WD_REQ_FAILING : 0;
  run.req.rank = me;
  run.req.gone = gone;
  memcpy(run.req.secret, secret, sizeof run.req.secret);
  run.cap = BRAID_MIN(nranks, WD_QUERY_INFLIGHT);
  run.q = calloc((size_t)run.cap, sizeof *run.q);
  run.pfd = calloc((size_t)run.cap, sizeof *run.pfd);
  if (run.q == NULL || run.pfd == NULL) {
    free(run.q);
    free(run.pfd);
    return ncclSystemError;
  }
  for (int r = 0; r < nranks; r++) {
    if (r != me) memset(&out[r], 0, sizeof out[r]);
    st[r] = (struct wd_query_status){.why = r == me ? WD_QUERY_SELF : WD_QUERY_NOT_ASKED};
  }
  const double deadline = braid_time_sec() + timeout_s;
  int next = 0, stopped = 0;
  for (;;) {
    stopped = stop != NULL && __atomic_load_n(stop, __ATOMIC_ACQUIRE);
    if (stopped) break;
    while (next < nranks && run.n < run.cap && (next == me || wd_query_start(&run, next))) next++;
    const double left = deadline - braid_time_sec();
    if ((run.n == 0 && next == nranks) || left <= 0) break;
    wd_query_pollfds(&run);
    int ms = BRAID_MIN(WD_QUERY_SLICE_MS, (int)(left * 1000.0) + 1);
    if (poll(run.pfd, (nfds_t)run.n, ms) <= 0) continue; /* nothing yet, or a signal */
    for (int i = 0; i < run.n;)
      if (run.pfd[i].revents == 0 || !wd_query_step(&run, i, run.pfd[i].revents)) i++;
  }
  wd_query_finish(&run, next, nranks, me, stopped);
  free(run.q);
  free(run.pfd);
  return ncclSuccess;
}

int wd_notice_send(const union braid_sockaddr* addr, int me, const uint8_t* secret,
                   uint32_t flags, double timeout_s, volatile uint32_t* stop, int* err) {
  struct wd_request req = {.magic = BRAID_LEDGER_MAGIC, .flags = flags, .rank = me, .gone = -1};
  memcpy(req.secret, secret, sizeof req.secret);
  const double deadline = braid_time_sec() + timeout_s;
  int fd = -1, e = 0, c = socket_connect_step(addr, &fd, &e);
  while (c == 0) {
    const double left = deadline - braid_time_sec();
    if (left <= 0 || (stop != NULL && __atomic_load_n(stop, __ATOMIC_ACQUIRE))) break;
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    if (poll(&pfd, 1, BRAID_MIN(WD_QUERY_SLICE_MS, (int)(left * 1000.0) + 1)) < 0 &&
        errno != EINTR)
      break;
    c = socket_connect_step(addr, &fd, &e);
  }
  int sent = 0;
  if (c < 0) {
    *err = e;
    sent = e == ECONNREFUSED || e == ECONNRESET ? -1 : 0;
  } else if (c > 0) {
    /* A whole request is 32 bytes: a connected socket takes it at once, or the peer reset. */
    ssize_t n = send(fd, &req, sizeof req, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == (ssize_t)sizeof req) {
      sent = 1;
    } else if (n < 0 && (errno == ECONNRESET || errno == EPIPE)) {
      *err = errno;
      sent = -1;
    }
  }
  socket_close(&fd);
  return sent;
}

void wd_query_describe(const struct wd_query_status* st, double timeout_s, char* out, size_t len) {
  switch (st->why) {
  case WD_QUERY_ANSWERED: snprintf(out, len, "answered"); break;
  case WD_QUERY_SELF: snprintf(out, len, "not asked (itself)"); break;
  case WD_QUERY_REFUSED: snprintf(out, len, "connection refused"); break;
  case WD_QUERY_UNREACHABLE: snprintf(out, len, "cannot connect: %s", strerror(st->err)); break;
  case WD_QUERY_NO_CONNECTION:
    snprintf(out, len, "no connection within %.1f s", timeout_s);
    break;
  case WD_QUERY_NO_ANSWER: snprintf(out, len, "connected, no answer within %.1f s", timeout_s); break;
  case WD_QUERY_CLOSED:
    if (st->err == 0)
      snprintf(out, len, "closed the connection without an answer");
    else
      snprintf(out, len, "connection lost before an answer: %s", strerror(st->err));
    break;
  case WD_QUERY_GARBAGE: snprintf(out, len, "answered something that is not its summary"); break;
  case WD_QUERY_WRONG_SECRET: snprintf(out, len, "answered without this job's secret"); break;
  case WD_QUERY_NOT_ASKED:
    snprintf(out, len, "not asked within %.1f s (%d queries open at once at most)", timeout_s,
             WD_QUERY_INFLIGHT);
    break;
  case WD_QUERY_STOPPED: snprintf(out, len, "not asked to the end (the watchdog stopped)"); break;
  default: snprintf(out, len, "unknown (%d)", (int)st->why); break;
  }
}
