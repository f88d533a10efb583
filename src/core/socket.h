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
 */
ncclResult_t socket_find_interfaces(struct braid_netif* out, int max, int* count);

/* "10.0.0.1:5000", "[fe80::1%eth0]:5000", "host:5000" (resolved). */
ncclResult_t socket_addr_parse(const char* text, union braid_sockaddr* out);
/* "10.0.0.1:5000" or "[::1]:5000" into buf; returns buf. */
const char* socket_addr_str(const union braid_sockaddr* addr, char* buf, size_t size);
socklen_t socket_addr_len(const union braid_sockaddr* addr);

/* Listens on `addr` (port 0 picks one); on return `addr` holds the bound port. */
ncclResult_t socket_listen(union braid_sockaddr* addr, int* fd);
/* Connects, retrying refused/unreachable attempts until `timeout_sec` passes or *abort is set. */
ncclResult_t socket_connect(const union braid_sockaddr* addr, double timeout_sec,
                            volatile uint32_t* abort, int* fd);
/* Accepts one connection, waiting at most `timeout_sec` (negative: forever, abort still honoured). */
ncclResult_t socket_accept(int listen_fd, double timeout_sec, volatile uint32_t* abort, int* fd,
                           union braid_sockaddr* peer);
/* Sends/receives exactly `size` bytes. */
ncclResult_t socket_send_all(int fd, const void* data, size_t size, double timeout_sec,
                             volatile uint32_t* abort);
ncclResult_t socket_recv_all(int fd, void* data, size_t size, double timeout_sec,
                             volatile uint32_t* abort);
void socket_close(int* fd);

#endif
