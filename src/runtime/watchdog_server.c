/*
 * The watchdog's server (watchdog_server.h). Requests are read from up to
 * WD_SERVER_CONNS connections at once, each with WD_QUERY_TIMEOUT_S to
 * deliver its request, so a client that connects and sends nothing (or the
 * wrong secret) delays nobody; when every slot is taken the oldest connection
 * makes room. A real rank's query sends its request as soon as it connects.
 */
#include "runtime/watchdog_server.h"

#include <stdlib.h>
#include <string.h>

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
  struct braid_ledger_summary s;
  sv->summary(sv->summary_arg, &s);
  (void)socket_send_all(c->fd, &s, sizeof s, WD_QUERY_TIMEOUT_S, sv->stop);
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
