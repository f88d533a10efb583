/*
 * The watchdog's server (internal to the watchdog): what it reads from the
 * connections other ranks open to its listener, a request with the job's
 * secret, and the summary it answers with. It knows the listener, the secret
 * and how to fill a summary, nothing of the communicator, so that a harness
 * can drive it with arbitrary bytes (tests/unit/fuzz_watchdog.c).
 *
 * One thread runs it: wd_server_pollfds, poll(), wd_server_serve, again
 * until the watchdog stops.
 */
#ifndef BRAID_RUNTIME_WATCHDOG_SERVER_H
#define BRAID_RUNTIME_WATCHDOG_SERVER_H

#include <poll.h>
#include <stdint.h>

#include "runtime/watchdog.h"

#define WD_SECRET_BYTES 16
#define WD_QUERY_TIMEOUT_S 2.0 /* a query's connect, request and answer each get this long */
#define WD_SERVER_CONNS 32     /* connections read at once; the oldest makes room for a new one */

/* What a querying rank sends as soon as it connects (wire form, fixed size). */
struct wd_request {
  uint32_t magic; /* BRAID_LEDGER_MAGIC */
  uint32_t pad;
  uint8_t secret[WD_SECRET_BYTES];
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

#endif
