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
 * unreachable, and learns for each rank that gave no summary why not.
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

/* What a querying rank sends as soon as it connects (wire form, fixed size). */
struct wd_request {
  uint32_t magic; /* BRAID_LEDGER_MAGIC */
  uint32_t pad;
  uint8_t secret[WD_SECRET_BYTES];
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
 * Asks every rank but `me` of `addrs[nranks]` for its summary, all at once: a
 * nonblocking connect to each (at most WD_QUERY_INFLIGHT open together), one
 * poll() loop over all of them, the request sent as each connects and the
 * reply read as it arrives, everything within `timeout_s` of the call. out[r]:
 * rank r's summary, magic 0 when none (out[me] is not touched); st[r]: why not.
 * `stop` (may be NULL) ends the wait early. Every socket is closed on return.
 * ncclSystemError when out of memory, before any connect.
 */
ncclResult_t wd_query_all(const union braid_sockaddr* addrs, int nranks, int me,
                          const uint8_t* secret, double timeout_s, volatile uint32_t* stop,
                          struct braid_ledger_summary* out, struct wd_query_status* st);
/* What `st` says, in a few words ("connection refused"), for a log line. */
void wd_query_describe(const struct wd_query_status* st, double timeout_s, char* out, size_t len);

#endif
