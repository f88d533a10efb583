/*
 * The watchdog's wire (internal to the watchdog), both ends of it.
 *
 * The server: what it reads from the connections other ranks open to its
 * listener, a request with the job's secret, and the reply it answers with,
 * the same secret and its summary. It knows the listener, the secret and how
 * to fill a summary, nothing of the communicator, so that a harness can drive
 * it with arbitrary bytes (tests/unit/fuzz_watchdog.c). One thread runs it:
 * wd_server_pollfds, poll(), wd_server_serve, again until the watchdog stops.
 *
 * The query (wd_query_all): a rank giving a verdict asks every other rank at
 * once, so that the verdict takes one query's time however many ranks are
 * unreachable, and learns for each rank that gave no summary why not. A rank
 * that fails its communicator because a rank is gone says so in those requests
 * (WD_REQ_FAILING, naming that rank), and every rank that reads one fails too.
 *
 * Notices (wd_notice_send): a request with WD_REQ_PING or WD_REQ_BYE gets no
 * reply. A ping proves that the peer's listener is there (each rank pings the
 * next, so that a rank whose process or sockets are gone is found refusing);
 * a bye tells the rank that pings this one that it leaves on purpose (a
 * destroy or an abort), so that its listener closing is no failure.
 */
#ifndef BRAID_RUNTIME_WATCHDOG_SERVER_H
#define BRAID_RUNTIME_WATCHDOG_SERVER_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "base/socket.h"
#include "runtime/watchdog.h"

#define WD_SECRET_BYTES 16
#define WD_QUERY_TIMEOUT_S 2.0 /* all queries of a verdict together, and a request's delivery */
#define WD_SERVER_CONNS 32     /* connections read at once; the oldest makes room for a new one */
#define WD_QUERY_INFLIGHT 512  /* queries open at once; the other ranks are asked as they end */
#define WD_REPLY_MAGIC 0x52445742u /* "BWDR" (unlike a request's, so an echo is no reply) */

/* What a request's flags say besides asking for the summary. */
#define WD_REQ_FAILING 1u /* the asking rank fails its communicator: rank `gone` is gone */
#define WD_REQ_PING 2u    /* a liveness probe: no reply */
#define WD_REQ_BYE 4u     /* the sender leaves on purpose (destroy, abort): no reply */

/* What a querying rank sends as soon as it connects (wire form, fixed size). */
struct wd_request {
  uint32_t magic; /* BRAID_LEDGER_MAGIC */
  uint32_t flags; /* WD_REQ_* */
  uint8_t secret[WD_SECRET_BYTES];
  int32_t rank;   /* the sender's */
  int32_t gone;   /* WD_REQ_FAILING: the rank found gone */
};

/*
 * What the server answers a request with (wire form, fixed size). It carries the
 * job's secret as the request does (as every bootstrap connection's hello does):
 * only a watchdog of this job can hand a querying rank a summary, not a process
 * that took over a gone rank's port, nor one that answers anything.
 */
struct wd_reply {
  uint32_t magic; /* WD_REPLY_MAGIC */
  uint32_t pad;
  uint8_t secret[WD_SECRET_BYTES];
  struct braid_ledger_summary summary;
};

/* Fills `out` with this rank's summary (called on the server's thread). */
typedef void (*wd_summary_fn)(void* arg, struct braid_ledger_summary* out);
/*
 * A request with the job's secret and WD_REQ_FAILING or WD_REQ_BYE came from `rank`, the first
 * naming `gone` (as the request says: check the ranges). Called on the server's thread, with
 * the summary's `arg`.
 */
typedef void (*wd_notice_fn)(void* arg, uint32_t flags, int rank, int gone);

struct wd_server;

/*
 * A server for `listen_fd` (a nonblocking listener, still the caller's),
 * answering requests that carry `secret` (copied) with `summary(arg)`;
 * `stop` ends a send that waits. NULL when out of memory.
 */
struct wd_server* wd_server_new(int listen_fd, const uint8_t* secret, wd_summary_fn summary,
                                void* arg, volatile uint32_t* stop);
/* Closes the connections it holds and frees it. */
void wd_server_free(struct wd_server* sv);
/* Where the notices of requests go (none until set). */
void wd_server_on_notice(struct wd_server* sv, wd_notice_fn notice);
/* Fills `pfd` (room for 1 + WD_SERVER_CONNS) with the listener and the connections; the count. */
int wd_server_pollfds(const struct wd_server* sv, struct pollfd* pfd);
/*
 * After poll() on what wd_server_pollfds filled: reads the connections that
 * have something (answering a complete request, refusing a wrong one), drops
 * those past their deadline at `now` (braid_time_sec), and accepts the new ones.
 */
void wd_server_serve(struct wd_server* sv, struct pollfd* pfd, double now);

/* Why wd_query_all has no summary of a rank. */
enum wd_query_why {
  WD_QUERY_ANSWERED = 0,
  WD_QUERY_SELF,          /* not asked: the asking rank */
  WD_QUERY_REFUSED,       /* nothing listens there (the process is gone) */
  WD_QUERY_UNREACHABLE,   /* the connect failed otherwise (err) */
  WD_QUERY_NO_CONNECTION, /* not connected by the deadline (a silent host, a full backlog) */
  WD_QUERY_NO_ANSWER,     /* connected, but no whole reply by the deadline */
  WD_QUERY_CLOSED,        /* closed or reset before a whole reply (err; 0: closed) */
  WD_QUERY_GARBAGE,       /* a reply that is not a watchdog's, or a summary of another rank */
  WD_QUERY_WRONG_SECRET,  /* a watchdog's reply without this job's secret */
  WD_QUERY_NOT_ASKED,     /* never started: queries open (or no free descriptor) until the end */
  WD_QUERY_STOPPED        /* `stop` was set before it ended */
};

struct wd_query_status {
  enum wd_query_why why;
  int err; /* the errno, where `why` says it has one */
};

/*
 * Asks every rank but `me` of `addrs[nranks]` for its summary (`gone` >= 0: telling them that
 * this rank fails its communicator because rank `gone` is gone), all at once: a
 * nonblocking connect to each (at most WD_QUERY_INFLIGHT open together), one
 * poll() loop over all of them, the request sent as each connects and the
 * reply read as it arrives, everything within `timeout_s` of the call. out[r]:
 * rank r's summary, magic 0 when none (out[me] is not touched); st[r]: why not.
 * `stop` (may be NULL) ends the wait early. Every socket is closed on return.
 * ncclSystemError when out of memory, before any connect.
 */
ncclResult_t wd_query_all(const union braid_sockaddr* addrs, int nranks, int me,
                          const uint8_t* secret, int gone, double timeout_s,
                          volatile uint32_t* stop, struct braid_ledger_summary* out,
                          struct wd_query_status* st);
/*
 * Sends rank `me`'s request with `flags` (WD_REQ_PING or WD_REQ_BYE) to the listener at
 * `addr`, and closes. 1: sent; 0: no connection or no room within `timeout_s` (or `stop`);
 * -1: refused or reset, *err the errno (nothing listens there).
 */
int wd_notice_send(const union braid_sockaddr* addr, int me, const uint8_t* secret,
                   uint32_t flags, double timeout_s, volatile uint32_t* stop, int* err);
/* What `st` says, in a few words ("connection refused"), for a log line. */
void wd_query_describe(const struct wd_query_status* st, double timeout_s, char* out, size_t len);

#endif
