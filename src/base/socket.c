/*
 * TCP sockets for the bootstrap and the socket net backend: which interface
 * to use, address text in and out, and connections that never hang.
 *
 * Every socket is close-on-exec (a child the application execs must not hold
 * our ports), non-blocking (waits are poll() with a deadline, sliced so that
 * the abort flag is seen within SOCKET_SLICE_MS), TCP_NODELAY (bootstrap and
 * control messages are small and latency-bound), and sends with MSG_NOSIGNAL
 * (a dead peer is an error code, never a SIGPIPE that kills the application).
 *
 * The blocking helpers (*_all, connect, accept) log their failures through
 * braid_err(). The *_some helpers do not log: their callers serve several
 * connections at once and alone know whether a failure is the job's error or
 * a stray connection to drop.
 */
#include "base/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"

/* Longest single poll(): an abort is noticed within this time. */
#define SOCKET_SLICE_MS 100
/* Interfaces getifaddrs may report that we consider at once. */
#define SOCKET_MAX_IFS 128

/* The flag is set by another thread (ncclCommAbort): read it atomically, not just volatile. */
static int socket_aborted(volatile uint32_t* abort) {
  return abort != NULL && __atomic_load_n(abort, __ATOMIC_RELAXED) != 0;
}

/* Absolute deadline for a relative timeout; negative means none. */
static double socket_deadline(double timeout_sec) {
  return timeout_sec < 0 ? -1.0 : braid_time_sec() + timeout_sec;
}

/* Milliseconds to poll before the next look at the abort flag and the deadline. */
static int socket_slice_ms(double deadline) {
  if (deadline < 0) return SOCKET_SLICE_MS;
  double left = deadline - braid_time_sec();
  if (left <= 0) return 0;
  if (left * 1000.0 >= SOCKET_SLICE_MS) return SOCKET_SLICE_MS; /* before the cast: no overflow */
  return (int)(left * 1000.0) + 1;
}

static int socket_expired(double deadline) { return deadline >= 0 && braid_time_sec() >= deadline; }

/* An abort is requested, not a failure: it is reported at INFO and returned as ncclRemoteError. */
static ncclResult_t socket_abort_result(const char* what) {
  INFO(BRAID_LOG_NET, "socket: %s interrupted by abort", what);
  return ncclRemoteError;
}

/* The peer of a connected socket, as text, for error messages. */
static const char* socket_peer_str(int fd, char* buf, size_t size) {
  union braid_sockaddr peer;
  socklen_t len = sizeof peer;
  memset(&peer, 0, sizeof peer);
  if (getpeername(fd, &peer.sa, &len) != 0) {
    snprintf(buf, size, "a peer already gone (fd %d)", fd);
    return buf;
  }
  return socket_addr_str(&peer, buf, size);
}

/* ------------------------------------------------------------------ names */

/* One comma-separated token of an interface spec against an interface name. */
static int socket_token_match(const char* token, size_t len, int exact, const void* arg) {
  const char* ifname = arg;
  if (exact) return strlen(ifname) == len && strncmp(ifname, token, len) == 0;
  return strncmp(ifname, token, len) == 0;
}

int socket_ifname_match(const char* spec, const char* ifname) {
  return braid_spec_match(spec, socket_token_match, ifname);
}

/* -------------------------------------------------------------- addresses */

socklen_t socket_addr_len(const union braid_sockaddr* addr) {
  if (addr->sa.sa_family == AF_INET) return sizeof(struct sockaddr_in);
  if (addr->sa.sa_family == AF_INET6) return sizeof(struct sockaddr_in6);
  return 0;
}

const char* socket_addr_str(const union braid_sockaddr* addr, char* buf, size_t size) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  socklen_t len = socket_addr_len(addr);
  if (len == 0 || getnameinfo(&addr->sa, len, host, sizeof host, port, sizeof port,
                              NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    snprintf(buf, size, "(no address)");
    return buf;
  }
  /* Using the length keeps GCC's truncation warning quiet; a short buffer just truncates. */
  int n = addr->sa.sa_family == AF_INET6 ? snprintf(buf, size, "[%s]:%s", host, port)
                                         : snprintf(buf, size, "%s:%s", host, port);
  if (n < 0 && size > 0) buf[0] = '\0';
  return buf;
}

/* Splits "host:port" / "[v6]:port" into host and port text; returns why it cannot, or NULL. */
static const char* socket_addr_split(const char* text, char* host, size_t host_size,
                                     const char** port, int* bracketed) {
  const char* host_start = text;
  size_t host_len;
  *bracketed = text[0] == '[';
  if (*bracketed) {
    const char* close = strchr(text, ']');
    if (close == NULL) return "missing ']' after the IPv6 address";
    if (close[1] != ':') return "missing ':port' after ']'";
    host_start = text + 1;
    host_len = (size_t)(close - host_start);
    *port = close + 2;
  } else {
    const char* colon = strrchr(text, ':');
    if (colon == NULL) return "missing ':port'";
    if (memchr(text, ':', (size_t)(colon - text)) != NULL)
      return "an IPv6 address needs brackets, as in [fe80::1%eth0]:5000";
    host_len = (size_t)(colon - text);
    *port = colon + 1;
  }
  if (host_len == 0) return "empty host";
  if (host_len >= host_size) return "host name too long";
  memcpy(host, host_start, host_len);
  host[host_len] = '\0';
  size_t digits = strspn(*port, "0123456789");
  if (digits == 0 || digits > 5 || (*port)[digits] != '\0') return "the port is not a number";
  if (atoi(*port) > 65535) return "the port is above 65535";
  return NULL;
}

ncclResult_t socket_addr_parse(const char* text, union braid_sockaddr* out) {
  return socket_addr_parse_named(text, NULL, out);
}

ncclResult_t socket_addr_parse_named(const char* text, const char* origin, union braid_sockaddr* out) {
  char host[NI_MAXHOST];
  const char* port = NULL;
  int bracketed = 0;
  memset(out, 0, sizeof *out);
  if (text == NULL) return braid_err(ncclInvalidArgument, "socket: no address given");
  const char* why = socket_addr_split(text, host, sizeof host, &port, &bracketed);
  if (why != NULL)
    return braid_err(ncclInvalidArgument,
                     "socket: cannot parse %s%s\"%s\": %s (expected host:port, a.b.c.d:port or "
                     "[ipv6]:port)", origin ? origin : "address ", origin ? "=" : "", text, why);
  struct addrinfo hints, *list = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (bracketed ? AI_NUMERICHOST : 0);
  int rc = getaddrinfo(host, port, &hints, &list);
  if (rc != 0)
    return braid_err(ncclInvalidArgument, "socket: cannot resolve \"%s\" in %s%s\"%s\": %s", host,
                     origin ? origin : "", origin ? "=" : "", text,
                     rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
  ncclResult_t res = ncclInvalidArgument;
  for (struct addrinfo* ai = list; ai != NULL; ai = ai->ai_next) {
    if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) && ai->ai_addrlen <= sizeof *out) {
      memcpy(out, ai->ai_addr, ai->ai_addrlen);
      res = ncclSuccess;
      break;
    }
  }
  freeaddrinfo(list);
  if (res != ncclSuccess)
    return braid_err(res, "socket: %s%s\"%s\" has no IPv4 or IPv6 address", origin ? origin : "",
                     origin ? "=" : "", text);
  return ncclSuccess;
}

/* ------------------------------------------------------------- interfaces */

/* Default-selection tiers: real interfaces first, then virtual bridges, loopback last. */
enum { SOCKET_TIER_REAL = 0, SOCKET_TIER_VIRTUAL = 1, SOCKET_TIER_LOOPBACK = 2 };

static int socket_if_tier(const char* name, unsigned flags) {
  static const char* const virtual_prefixes[] = {"docker", "veth", "virbr", "br-", "cni", "flannel"};
  if (flags & IFF_LOOPBACK) return SOCKET_TIER_LOOPBACK;
  for (size_t i = 0; i < BRAID_ARRAY_LEN(virtual_prefixes); i++)
    if (strncmp(name, virtual_prefixes[i], strlen(virtual_prefixes[i])) == 0)
      return SOCKET_TIER_VIRTUAL;
  return SOCKET_TIER_REAL;
}

/* Which address of an interface we prefer: IPv4, then global IPv6, then link-local IPv6. */
static int socket_addr_preference(const struct sockaddr* sa) {
  if (sa->sa_family == AF_INET) return 0;
  const struct sockaddr_in6* s6 = (const struct sockaddr_in6*)sa;
  return IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr) ? 2 : 1;
}

static ncclResult_t socket_family_from_param(int* family) {
  const char* text = braid_param_str(BRAID_P_SOCKET_FAMILY);
  *family = AF_UNSPEC;
  if (text == NULL || text[0] == '\0') return ncclSuccess;
  if (strcasecmp(text, "AF_INET") == 0 || strcasecmp(text, "inet") == 0 ||
      strcasecmp(text, "ipv4") == 0 || strcmp(text, "4") == 0) {
    *family = AF_INET;
  } else if (strcasecmp(text, "AF_INET6") == 0 || strcasecmp(text, "inet6") == 0 ||
             strcasecmp(text, "ipv6") == 0 || strcmp(text, "6") == 0) {
    *family = AF_INET6;
  } else {
    return braid_err(ncclInvalidArgument,
                     "socket: BRAID_SOCKET_FAMILY=\"%s\" is neither AF_INET nor AF_INET6", text);
  }
  return ncclSuccess;
}

struct socket_if_cand {
  struct braid_netif netif;
  int tier;
  int preference;
};

/* One candidate per interface name (its preferred address), in getifaddrs order. */
static int socket_if_collect(struct ifaddrs* list, const char* spec, int family,
                             struct socket_if_cand* cand, int max) {
  int n = 0;
  for (struct ifaddrs* ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == NULL || !(ifa->ifa_flags & IFF_UP)) continue;
    int fam = ifa->ifa_addr->sa_family;
    if ((fam != AF_INET && fam != AF_INET6) || (family != AF_UNSPEC && fam != family)) continue;
    if (!socket_ifname_match(spec, ifa->ifa_name)) continue;
    int pref = socket_addr_preference(ifa->ifa_addr);
    int i = 0;
    while (i < n && strcmp(cand[i].netif.name, ifa->ifa_name) != 0) i++;
    if (i == n) {
      if (n == max) continue;
      n++;
      memset(&cand[i], 0, sizeof cand[i]);
      snprintf(cand[i].netif.name, sizeof cand[i].netif.name, "%s", ifa->ifa_name);
      cand[i].tier = socket_if_tier(ifa->ifa_name, ifa->ifa_flags);
    } else if (pref >= cand[i].preference) {
      continue;
    }
    cand[i].preference = pref;
    memcpy(&cand[i].netif.addr, ifa->ifa_addr,
           fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
  }
  return n;
}

/* "lo (127.0.0.1, ::1), eth0 (down)": every interface there is, for the "nothing matched" error. */
static void socket_if_describe(struct ifaddrs* list, char* buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (struct ifaddrs* ifa = list; ifa != NULL && used + 1 < size; ifa = ifa->ifa_next) {
    int seen = 0;
    for (struct ifaddrs* prev = list; prev != ifa; prev = prev->ifa_next)
      if (strcmp(prev->ifa_name, ifa->ifa_name) == 0) seen = 1;
    if (seen) continue;
    int w = snprintf(buf + used, size - used, "%s%s (%s", used ? ", " : "", ifa->ifa_name,
                     (ifa->ifa_flags & IFF_UP) ? "up" : "down");
    used = w < 0 ? used : BRAID_MIN(size - 1, used + (size_t)w);
    for (struct ifaddrs* a = ifa; a != NULL && used + 1 < size; a = a->ifa_next) {
      if (strcmp(a->ifa_name, ifa->ifa_name) != 0 || a->ifa_addr == NULL) continue;
      if (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6) continue;
      union braid_sockaddr sa;
      char text[INET6_ADDRSTRLEN + 32];
      memset(&sa, 0, sizeof sa);
      memcpy(&sa, a->ifa_addr, a->ifa_addr->sa_family == AF_INET ? sizeof sa.sin : sizeof sa.sin6);
      socket_addr_str(&sa, text, sizeof text);
      char* colon = strrchr(text, ':'); /* drop the ":0" port */
      if (colon) *colon = '\0';
      w = snprintf(buf + used, size - used, ", %s", text);
      used = w < 0 ? used : BRAID_MIN(size - 1, used + (size_t)w);
    }
    w = snprintf(buf + used, size - used, ")");
    used = w < 0 ? used : BRAID_MIN(size - 1, used + (size_t)w);
  }
}

static const char* socket_ifname_param_name(void) {
  return braid_param_source(BRAID_P_SOCKET_IFNAME) == BRAID_PARAM_FROM_NCCL_ENV
             ? "NCCL_SOCKET_IFNAME" : "BRAID_SOCKET_IFNAME";
}

/* Keeps the best tier present (no spec) or every tier in order (spec given), up to `max`. */
static int socket_if_order(const struct socket_if_cand* cand, int n, int user_spec,
                           struct braid_netif* out, int max) {
  int count = 0;
  for (int tier = SOCKET_TIER_REAL; tier <= SOCKET_TIER_LOOPBACK; tier++) {
    if (!user_spec && count > 0) break;
    for (int i = 0; i < n && count < max; i++)
      if (cand[i].tier == tier) out[count++] = cand[i].netif;
  }
  return count;
}

ncclResult_t socket_find_interfaces(struct braid_netif* out, int max, int* count) {
  ncclResult_t res = ncclSuccess;
  struct ifaddrs* list = NULL;
  struct socket_if_cand* cand = NULL;
  int family = AF_UNSPEC;
  *count = 0;
  const char* spec = braid_param_str(BRAID_P_SOCKET_IFNAME);
  int user_spec = spec != NULL && spec[0] != '\0';
  BRAID_TRY(socket_family_from_param(&family));
  BRAID_SYS_TRY(getifaddrs(&list), "getifaddrs (listing network interfaces)");
  BRAID_TRY(BRAID_CALLOC(&cand, SOCKET_MAX_IFS, "the network interface list"));
  int n = socket_if_collect(list, user_spec ? spec : NULL, family, cand, SOCKET_MAX_IFS);
  *count = socket_if_order(cand, n, user_spec, out, max);
  if (*count == 0) {
    char present[768], why[384];
    socket_if_describe(list, present, sizeof present);
    if (user_spec)
      snprintf(why, sizeof why, "%s=\"%s\" matches none", socket_ifname_param_name(), spec);
    else
      snprintf(why, sizeof why, "no interface is up with an address");
    res = braid_err(ncclSystemError,
                    "socket: no usable network interface: %s%s; interfaces present: %s. "
                    "Set %s to one of them (prefixes, ^ to exclude, = for exact names)",
                    why, family == AF_UNSPEC ? "" : (family == AF_INET ? " with an IPv4 address"
                                                                       : " with an IPv6 address"),
                    present[0] ? present : "none", socket_ifname_param_name());
    goto fail;
  }
  for (int i = 0; i < *count; i++) {
    char text[INET6_ADDRSTRLEN + 32];
    INFO(BRAID_LOG_NET, "socket: interface %d: %s %s", i, out[i].name,
         socket_addr_str(&out[i].addr, text, sizeof text));
  }
fail:
  free(cand);
  if (list) freeifaddrs(list);
  return res;
}

/* ------------------------------------------------------------ connections */

/* Options every connected socket gets: no Nagle delay (messages are small and latency-bound). */
static int socket_stream_setup(int fd) {
  int one = 1;
  return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int socket_port(const union braid_sockaddr* a) {
  return ntohs(a->sa.sa_family == AF_INET ? a->sin.sin_port : a->sin6.sin6_port);
}

ncclResult_t socket_listen_avoiding(union braid_sockaddr* addr, int avoid_port, int* fd) {
  ncclResult_t res = ncclSuccess;
  char text[INET6_ADDRSTRLEN + 32];
  int s = -1, held = -1, one = 1;
  const union braid_sockaddr want = *addr;
  socklen_t len = socket_addr_len(addr);
  *fd = -1;
  BRAID_CHECK(len != 0, ncclInternalError, "socket: listen on an address of unknown family %d",
              addr->sa.sa_family);
  for (int attempt = 0;; attempt++) {
    *addr = want;
    s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    BRAID_SYS_TRY(s, "socket()");
    /* A fixed port (BRAID_COMM_ID) must be reusable while the last job's connections sit in TIME_WAIT. */
    BRAID_SYS_TRY(setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), "setsockopt(SO_REUSEADDR)");
    if (bind(s, &addr->sa, len) != 0) {
      int e = errno;
      res = braid_err(ncclSystemError, "socket: cannot listen on %s: %s%s",
                      socket_addr_str(addr, text, sizeof text), strerror(e),
                      e == EADDRNOTAVAIL ? " (not an address of this host)" : "");
      goto fail;
    }
    socklen_t got = sizeof *addr;
    BRAID_SYS_TRY(getsockname(s, &addr->sa, &got), "getsockname()");
    /*
     * Given the port to avoid: hold it bound, never listening (a listener there, closed later,
     * would reset the connections others made to it meanwhile), and bind another.
     */
    if (avoid_port == 0 || socket_port(&want) != 0 || socket_port(addr) != avoid_port ||
        attempt == 2)
      break;
    if (held >= 0) close(held);
    held = s;
    s = -1;
  }
  BRAID_SYS_TRY(listen(s, SOMAXCONN), "listen()");
  *fd = s;
  s = -1;
fail:
  if (s >= 0) close(s);
  if (held >= 0) close(held);
  return res;
}

ncclResult_t socket_listen(union braid_sockaddr* addr, int* fd) {
  return socket_listen_avoiding(addr, 0, fd);
}

/* Whether a failed connect is worth another try: the peer may not be listening yet. */
int socket_connect_retryable(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH ||
         err == ECONNRESET || err == EAGAIN || err == ECONNABORTED;
}

/*
 * A connected socket's last checks: 0, or an errno. A socket connected to itself (Linux lets a
 * connect to a free local port in the ephemeral range pick that very port) is refused: it
 * would swallow the rendezvous port before its owner can listen on it.
 */
static int socket_connect_finish(int s) {
  union braid_sockaddr self, peer;
  socklen_t l1 = sizeof self, l2 = sizeof peer;
  if (getsockname(s, &self.sa, &l1) == 0 && getpeername(s, &peer.sa, &l2) == 0 && l1 == l2 &&
      memcmp(&self, &peer, l1) == 0)
    return ECONNREFUSED;
  return socket_stream_setup(s) != 0 ? errno : 0;
}

/* One connection attempt; returns 0 or an errno (ECANCELED on abort). */
static int socket_connect_once(const union braid_sockaddr* addr, double deadline,
                               volatile uint32_t* abort, int* fd) {
  int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return errno;
  int err = 0;
  if (connect(s, &addr->sa, socket_addr_len(addr)) != 0) err = errno;
  while (err == EINPROGRESS || err == EINTR || err == EALREADY) {
    if (socket_aborted(abort)) {
      err = ECANCELED;
      break;
    }
    /* Poll before looking at the deadline, so even a zero timeout sees a refusal or a success. */
    struct pollfd p = {.fd = s, .events = POLLOUT};
    if (poll(&p, 1, socket_slice_ms(deadline)) > 0) {
      socklen_t len = sizeof err;
      if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    } else if (socket_expired(deadline)) {
      err = ETIMEDOUT;
    }
  }
  if (err == 0) err = socket_connect_finish(s);
  if (err != 0) {
    close(s);
    return err;
  }
  *fd = s;
  return 0;
}

int socket_connect_step(const union braid_sockaddr* addr, int* fd, int* err) {
  int e = 0;
  if (*fd < 0) {
    int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) {
      *err = errno;
      return -1;
    }
    if (connect(s, &addr->sa, socket_addr_len(addr)) != 0) e = errno;
    *fd = s;
    if (e == EINPROGRESS || e == EINTR || e == EALREADY) return 0;
  } else {
    struct pollfd p = {.fd = *fd, .events = POLLOUT};
    int n = poll(&p, 1, 0);
    if (n == 0 || (n < 0 && errno == EINTR)) return 0;
    socklen_t len = sizeof e;
    if (n < 0 || getsockopt(*fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
    if (e == EINPROGRESS || e == EALREADY) return 0;
  }
  if (e == 0) e = socket_connect_finish(*fd);
  if (e == 0) return 1;
  socket_close(fd);
  *err = e;
  return -1;
}

ncclResult_t socket_connect_quiet(const union braid_sockaddr* addr, double timeout_sec,
                                  volatile uint32_t* abort, int* fd, int* err) {
  double deadline = socket_deadline(timeout_sec);
  double backoff = 0.001;
  *fd = -1;
  for (;;) {
    *err = socket_connect_once(addr, deadline, abort, fd);
    if (*err == 0) return ncclSuccess;
    if (*err == ECANCELED) return ncclRemoteError;
    if (!socket_connect_retryable(*err) || socket_expired(deadline)) return ncclSystemError;
    /* Back off up to 100 ms between tries, but never sleep past the deadline or an abort. */
    double nap = backoff;
    if (deadline >= 0) nap = BRAID_MIN(nap, deadline - braid_time_sec());
    if (nap > 0) poll(NULL, 0, (int)(nap * 1000.0) + 1);
    backoff = BRAID_MIN(backoff * 2.0, 0.1);
    if (socket_aborted(abort)) {
      *err = ECANCELED;
      return ncclRemoteError;
    }
  }
}

ncclResult_t socket_connect(const union braid_sockaddr* addr, double timeout_sec,
                            volatile uint32_t* abort, int* fd) {
  char text[INET6_ADDRSTRLEN + 32];
  int err = 0;
  ncclResult_t res = socket_connect_quiet(addr, timeout_sec, abort, fd, &err);
  if (res == ncclSuccess) return ncclSuccess;
  if (err == ECANCELED) return socket_abort_result("connect");
  if (!socket_connect_retryable(err))
    return braid_err(ncclSystemError, "socket: cannot connect to %s: %s",
                     socket_addr_str(addr, text, sizeof text), strerror(err));
  return braid_err(ncclSystemError,
                   "socket: cannot connect to %s within %.0f s: %s (is the peer running, and is "
                   "this address reachable from here?)",
                   socket_addr_str(addr, text, sizeof text), timeout_sec, strerror(err));
}

ncclResult_t socket_accept_some(int listen_fd, int* fd, union braid_sockaddr* peer) {
  union braid_sockaddr local;
  union braid_sockaddr* dst = peer ? peer : &local;
  *fd = -1;
  for (;;) {
    socklen_t len = sizeof *dst;
    memset(dst, 0, sizeof *dst);
    int s = accept4(listen_fd, &dst->sa, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (s >= 0) {
      socket_stream_setup(s); /* best effort: a connection without NODELAY still works */
      *fd = s;
      return ncclSuccess;
    }
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ncclSuccess;
    return ncclSystemError;
  }
}

#define SOCKET_ACCEPT_WARN_S 10.0
#define SOCKET_ACCEPT_BACKOFF_US 10000

void socket_accept_failed(const char* who) {
  static int64_t warned_ms = INT64_MIN / 2; /* atomic: listeners of several threads */
  const int e = errno;
  const int64_t now_ms = (int64_t)(braid_time_sec() * 1000.0);
  int64_t last = __atomic_load_n(&warned_ms, __ATOMIC_RELAXED);
  if (now_ms - last >= (int64_t)(SOCKET_ACCEPT_WARN_S * 1000.0) &&
      __atomic_compare_exchange_n(&warned_ms, &last, now_ms, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    WARN("%s: accept failed: %s%s", who, strerror(e),
         e == EMFILE || e == ENFILE ? " (out of file descriptors: raise ulimit -n)" : "");
  usleep(SOCKET_ACCEPT_BACKOFF_US);
}

ncclResult_t socket_accept(int listen_fd, double timeout_sec, volatile uint32_t* abort, int* fd,
                           union braid_sockaddr* peer) {
  char text[INET6_ADDRSTRLEN + 32];
  double deadline = socket_deadline(timeout_sec);
  *fd = -1;
  for (;;) {
    if (socket_accept_some(listen_fd, fd, peer) != ncclSuccess) {
      int e = errno;
      union braid_sockaddr self;
      socklen_t len = sizeof self;
      memset(&self, 0, sizeof self);
      getsockname(listen_fd, &self.sa, &len);
      return braid_err(ncclSystemError, "socket: accept on %s failed: %s%s",
                       socket_addr_str(&self, text, sizeof text), strerror(e),
                       e == EMFILE || e == ENFILE ? " (out of file descriptors: raise ulimit -n)" : "");
    }
    if (*fd >= 0) return ncclSuccess;
    if (socket_aborted(abort)) return socket_abort_result("accept");
    if (socket_expired(deadline))
      return braid_err(ncclSystemError, "socket: no connection arrived within %.1f s", timeout_sec);
    struct pollfd p = {.fd = listen_fd, .events = POLLIN};
    poll(&p, 1, socket_slice_ms(deadline));
  }
}

ncclResult_t socket_send_some(int fd, const void* data, size_t size, size_t* sent) {
  *sent = 0;
  while (size > 0) {
    ssize_t n = send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      *sent = (size_t)n;
      return ncclSuccess;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ncclSuccess;
    return (errno == EPIPE || errno == ECONNRESET) ? ncclRemoteError : ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t socket_recv_some(int fd, void* data, size_t size, size_t* got) {
  *got = 0;
  while (size > 0) {
    ssize_t n = recv(fd, data, size, MSG_DONTWAIT);
    if (n > 0) {
      *got = (size_t)n;
      return ncclSuccess;
    }
    if (n == 0) {
      errno = 0;
      return ncclRemoteError;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ncclSuccess;
    return errno == ECONNRESET ? ncclRemoteError : ncclSystemError;
  }
  return ncclSuccess;
}

/* Shared by send_all and recv_all: move `size` bytes, polling for `events` between tries. */
static ncclResult_t socket_move_all(int fd, void* data, size_t size, double timeout_sec,
                                    volatile uint32_t* abort, int sending) {
  char text[INET6_ADDRSTRLEN + 32];
  double deadline = socket_deadline(timeout_sec);
  size_t done = 0;
  while (done < size) {
    size_t n = 0;
    ncclResult_t r = sending ? socket_send_some(fd, (char*)data + done, size - done, &n)
                             : socket_recv_some(fd, (char*)data + done, size - done, &n);
    if (r != ncclSuccess) {
      int e = errno;
      return braid_err(r, "socket: %s %s failed after %zu of %zu bytes: %s",
                       sending ? "sending to" : "receiving from", socket_peer_str(fd, text, sizeof text),
                       done, size, e == 0 ? "the peer closed the connection" : strerror(e));
    }
    done += n;
    if (done == size) break;
    if (n > 0) continue;
    if (socket_aborted(abort)) return socket_abort_result(sending ? "send" : "recv");
    if (socket_expired(deadline))
      return braid_err(ncclSystemError, "socket: %s %s timed out after %.1f s (%zu of %zu bytes)",
                       sending ? "sending to" : "receiving from",
                       socket_peer_str(fd, text, sizeof text), timeout_sec, done, size);
    struct pollfd p = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
    poll(&p, 1, socket_slice_ms(deadline));
  }
  return ncclSuccess;
}

ncclResult_t socket_send_all(int fd, const void* data, size_t size, double timeout_sec,
                             volatile uint32_t* abort) {
  return socket_move_all(fd, (void*)data, size, timeout_sec, abort, 1);
}

ncclResult_t socket_recv_all(int fd, void* data, size_t size, double timeout_sec,
                             volatile uint32_t* abort) {
  return socket_move_all(fd, data, size, timeout_sec, abort, 0);
}

/* ------------------------------------------------------------ lost hosts */

int socket_keepalive_sec(void) {
  int64_t sec = braid_param_int(BRAID_P_SOCKET_KEEPALIVE_SEC);
  return sec < 0 ? 0 : (int)BRAID_MIN(sec, (int64_t)3600);
}

int socket_keepalive(int fd, int sec) {
  if (sec <= 0) return 0;
  int on = 1, idle = BRAID_MAX(1, sec / 2), intvl = BRAID_MAX(1, sec / 6), cnt = 3;
  unsigned int user_ms = (unsigned int)sec * 1000u;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms) != 0)
    return errno;
  return 0;
}

int socket_keepalive_relax(int fd) {
  struct tcp_info info;
  socklen_t len = sizeof info;
  unsigned int off = 0;
  memset(&info, 0, sizeof info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 || info.tcpi_unacked != 0) return 0;
  return setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &off, sizeof off) == 0;
}

void socket_close(int* fd) {
  if (*fd < 0) return;
  /* No retry on EINTR: on Linux the descriptor is gone either way. */
  close(*fd);
  *fd = -1;
}
