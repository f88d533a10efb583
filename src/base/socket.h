/*
 * TCP sockets for the bootstrap and, later, the socket net backend:
 * interface selection (BRAID_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, BRAID_SOCKET_FAMILY),
 * IPv4 and IPv6 addresses, listen/connect/accept with time limits, and
 * whole-buffer send/recv that never return short.
 *
 * Every blocking function takes a deadline in seconds and an optional abort
 * flag; it fails with ncclSystemError (peer, address and errno text in the
 * message) or ncclRemoteError (the peer closed the connection) rather than
 * hang.
 */
#ifndef BRAID_CORE_SOCKET_H
#define BRAID_CORE_SOCKET_H

#include <net/if.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "nccl.h"

union braid_sockaddr {
  struct sockaddr sa;
  struct sockaddr_in sin;
  struct sockaddr_in6 sin6;
};

struct braid_netif {
  char name[IF_NAMESIZE];
  union braid_sockaddr addr;
};

/*
 * Whether interface `ifname` is selected by `spec` (BRAID_SOCKET_IFNAME syntax):
 * "eth,ib" prefixes; "^docker,lo" excludes prefixes; "=eth0,eth1" exact names;
 * "^=eth0" excludes exact names. A NULL/empty spec selects everything.
 */
int socket_ifname_match(const char* spec, const char* ifname);

/*
 * Lists usable interfaces in preference order. Without a spec: every
 * interface that is up, except loopback and docker/virtual bridges (docker*,
 * veth*, virbr*, br-*, cni*, flannel*); loopback only when nothing else
 * exists. `family` is AF_INET, AF_INET6 or AF_UNSPEC (from BRAID_SOCKET_FAMILY).
 * One address per interface: IPv4, else global IPv6, else link-local IPv6.
 * Finding none is an error (ncclSystemError) whose message lists the
 * interfaces that do exist, with their addresses.
 */
ncclResult_t socket_find_interfaces(struct braid_netif* out, int max, int* count);

/* "10.0.0.1:5000", "[fe80::1%eth0]:5000", "host:5000" (resolved). */
ncclResult_t socket_addr_parse(const char* text, union braid_sockaddr* out);
/* The same, for text from `origin` (e.g. "BRAID_COMM_ID"), which error messages name. */
ncclResult_t socket_addr_parse_named(const char* text, const char* origin, union braid_sockaddr* out);
/* "10.0.0.1:5000" or "[::1]:5000" into buf; returns buf. */
const char* socket_addr_str(const union braid_sockaddr* addr, char* buf, size_t size);
socklen_t socket_addr_len(const union braid_sockaddr* addr);

/*
 * Timeouts below are in seconds; a negative one waits as long as it takes
 * (the abort flag is still honoured). An abort returns ncclRemoteError and is
 * logged at INFO only: it is what the caller asked for, not a fault.
 */

/* The port of an IPv4 or IPv6 address, host order. */
int socket_port(const union braid_sockaddr* a);
/* Listens on `addr` (port 0 picks one); on return `addr` holds the bound port. */
ncclResult_t socket_listen(union braid_sockaddr* addr, int* fd);
/*
 * The same, port 0 never picking `avoid_port` (another process's fixed port, e.g. the root's
 * with BRAID_COMM_ID; 0: none): a pick of it is held bound, not listening, while another is
 * bound, so nobody connects to it meanwhile. Tries three picks.
 */
ncclResult_t socket_listen_avoiding(union braid_sockaddr* addr, int avoid_port, int* fd);
/* Connects, retrying refused/unreachable attempts until `timeout_sec` passes or *abort is set. */
ncclResult_t socket_connect(const union braid_sockaddr* addr, double timeout_sec,
                            volatile uint32_t* abort, int* fd);
/*
 * socket_connect without the log line, for callers that can say what the
 * address was for: on failure *err holds the last attempt's errno
 * (ECANCELED: aborted, which returns ncclRemoteError; else ncclSystemError).
 */
ncclResult_t socket_connect_quiet(const union braid_sockaddr* addr, double timeout_sec,
                                  volatile uint32_t* abort, int* fd, int* err);
/*
 * A connect that never blocks, for a thread serving other connections meanwhile: call with
 * *fd = -1 to start an attempt, then with the same *fd until it settles. 1: connected (*fd is
 * the socket); 0: in progress (*fd open); -1: failed, *fd closed and -1, *err the errno.
 */
int socket_connect_step(const union braid_sockaddr* addr, int* fd, int* err);
/* Whether a connect that failed with `err` may work when tried again (refused, unreachable, ...). */
int socket_connect_retryable(int err);
/* Accepts one connection, waiting at most `timeout_sec` (negative: forever, abort still honoured). */
ncclResult_t socket_accept(int listen_fd, double timeout_sec, volatile uint32_t* abort, int* fd,
                           union braid_sockaddr* peer);
/* Sends/receives exactly `size` bytes. */
ncclResult_t socket_send_all(int fd, const void* data, size_t size, double timeout_sec,
                             volatile uint32_t* abort);
ncclResult_t socket_recv_all(int fd, void* data, size_t size, double timeout_sec,
                             volatile uint32_t* abort);
/* Closes `*fd` if open and sets it to -1. */
void socket_close(int* fd);

/*
 * Lost hosts. A peer whose process dies is noticed at once (its kernel resets or closes the
 * connection), but one whose host stops or whose network is cut answers nothing at all, and a
 * plain TCP connection then waits for many minutes. socket_keepalive makes a connected socket
 * fail with ETIMEDOUT within about `sec` seconds of the peer's host falling silent: keepalive
 * probes start after sec/2 idle seconds and come every sec/6 seconds (at least 1), three of them
 * unanswered end the connection, and data sent but unacknowledged for `sec` seconds ends it too
 * (TCP_USER_TIMEOUT). A live peer's kernel answers the probes even when its process is stopped
 * or busy, so a slow peer is never taken for a lost one, with one exception that
 * socket_keepalive_relax covers. sec <= 0 leaves the socket as it is. Best effort: 0, or the
 * errno of the option that could not be set (the socket still works without it).
 */
int socket_keepalive(int fd, int sec);
/* BRAID_SOCKET_KEEPALIVE_SEC: what every bootstrap connection gets (and the net backends may use). */
int socket_keepalive_sec(void);
/*
 * For a sender whose send has been blocked for a while: when the peer has acknowledged every byte
 * sent (it is alive, but its application does not read, so its receive window is closed), lifts
 * the unacknowledged-data limit, which Linux also applies to a window that stays closed, and
 * returns 1; 0 otherwise. socket_keepalive restores the limit once the send has moved on.
 */
int socket_keepalive_relax(int fd);

/*
 * Non-blocking steps for callers that serve many connections from one poll()
 * loop. They never wait and never log (only the caller knows whether a
 * failure is the job's error or a stray connection to drop): errno is left
 * as the system set it, and 0 when the peer closed the connection.
 */
/* Accepts one pending connection (*fd = -1 when none is pending); ncclSystemError on failure. */
ncclResult_t socket_accept_some(int listen_fd, int* fd, union braid_sockaddr* peer);
/*
 * After socket_accept_some failed (errno as it left it) for a listener that
 * a poll loop serves: WARNs (at most every few seconds per process, naming
 * `who`) and sleeps a little, since the listener stays readable and the loop
 * would otherwise spin (out of file descriptors, say).
 */
void socket_accept_failed(const char* who);
/* Sends what fits now (*sent may be 0); ncclRemoteError when the peer is gone. */
ncclResult_t socket_send_some(int fd, const void* data, size_t size, size_t* sent);
/* Receives what is there now (*got may be 0); ncclRemoteError when the peer closed or reset. */
ncclResult_t socket_recv_some(int fd, void* data, size_t size, size_t* got);

#endif
