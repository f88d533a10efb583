/*
 * The socket backend: TCP over the interfaces BRAID_SOCKET_IFNAME selects
 * (the same list the bootstrap uses), one device per interface. This file
 * holds devices, listen/connect/accept and the ops table; the data path is
 * in net_socket_data.c, the wire layout in net_socket.h.
 *
 * Handshake: the sender opens the control stream and the data streams to
 * the listener's address; each starts with a sock_hello carrying the job's
 * key, a random connection id and the stream's index. The listener groups
 * streams by connection id and hands out a connection once all of its
 * streams are in. A connection that presents a wrong key, garbage or nothing
 * within SOCK_HELLO_SEC is closed and logged with its address.
 *
 * The handle a sender gets holds the listener's address only; the sender's
 * progress (the streams opened so far) is in its own connect state.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "transport/net_socket.h"

#define SOCK_MAX_PENDING 64 /* connections with their hello not yet read */
#define SOCK_MAX_GROUPS 16  /* connections partly assembled */

/* What travels to the sender: where the listener is. Nothing else. */
struct sock_handle {
  uint32_t magic;
  uint32_t version;
  union braid_sockaddr addr;
};
_Static_assert(sizeof(struct sock_handle) <= BRAID_NET_HANDLE_BYTES, "socket handle must fit");

/* A connect in progress: the sender's own, never in a handle (net.h, connect). */
struct sock_connecting {
  union braid_sockaddr addr; /* the listener's, from the checked handle */
  char peer[80];             /* the same as text */
  struct sock_comm* comm;    /* its fds fill up as streams open */
  uint64_t conn_id;
  int opened;                /* streams connected so far, the control stream first */
};

struct sock_pending {
  int fd;
  double deadline;
  size_t got;
  struct sock_hello hello;
  union braid_sockaddr remote;
};

struct sock_group {
  uint64_t conn_id; /* 0: slot unused */
  int nstreams;
  int have;
  int ctrl_fd;
  int fds[SOCK_MAX_STREAMS];
  char peer[80];
};

struct sock_listen {
  int fd;
  uint8_t key[BRAID_NET_KEY_BYTES];
  char addr[80];
  struct sock_pending pending[SOCK_MAX_PENDING];
  struct sock_group groups[SOCK_MAX_GROUPS];
};

/* ------------------------------------------------------------- devices */

static struct {
  pthread_mutex_t lock;
  int loaded;
  int ndev;
  struct braid_netif ifs[BRAID_NET_MAX_DEVS];
} sock_devs = {.lock = PTHREAD_MUTEX_INITIALIZER};

static ncclResult_t sock_init(int* ndev, char* why, size_t why_size) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&sock_devs.lock);
  if (!sock_devs.loaded) {
    res = socket_find_interfaces(sock_devs.ifs, BRAID_NET_MAX_DEVS, &sock_devs.ndev);
    if (res == ncclSuccess) sock_devs.loaded = 1;
  }
  *ndev = sock_devs.ndev;
  pthread_mutex_unlock(&sock_devs.lock);
  if (res != ncclSuccess) {
    snprintf(why, why_size, "no usable network interface (see the error above)");
    *ndev = 0;
    return ncclSuccess;
  }
  return ncclSuccess;
}

static int sock_sysfs_int(const char* ifname, const char* file, int fallback) {
  char path[128];
  snprintf(path, sizeof path, "/sys/class/net/%s/%s", ifname, file);
  FILE* f = fopen(path, "r");
  int v = fallback;
  if (f) {
    if (fscanf(f, "%d", &v) != 1 || v <= 0) v = fallback;
    fclose(f);
  }
  return v;
}

static ncclResult_t sock_get_properties(int dev, struct braid_net_props* props) {
  ncclResult_t res = ncclSuccess;
  BRAID_CHECK(dev >= 0 && dev < sock_devs.ndev, ncclInternalError, "net Socket: no device %d", dev);
  memset(props, 0, sizeof *props);
  const char* ifname = sock_devs.ifs[dev].name;
  snprintf(props->name, sizeof props->name, "%s", ifname);
  char link[128], real[PATH_MAX];
  snprintf(link, sizeof link, "/sys/class/net/%s/device", ifname);
  if (realpath(link, real) != NULL && strlen(real) < sizeof props->pci_path)
    memcpy(props->pci_path, real, strlen(real) + 1);
  props->speed_mbps = sock_sysfs_int(ifname, "speed", 10000);
  props->latency_us = 0;
  props->ptr_support = BRAID_NET_PTR_HOST;
  props->max_requests = SOCK_MAX_REQS;
  props->max_bytes = SIZE_MAX;
  return ncclSuccess;
fail:
  return res;
}

/* ------------------------------------------------------- listen, accept */

ncclResult_t net_socket_listen_alloc(const uint8_t* key, struct sock_listen** out) {
  ncclResult_t res = ncclSuccess;
  struct sock_listen* l = NULL;
  *out = NULL;
  BRAID_TRY(BRAID_CALLOC(&l, 1, "a socket listener"));
  l->fd = -1;
  for (int i = 0; i < SOCK_MAX_PENDING; i++) l->pending[i].fd = -1;
  memcpy(l->key, key, BRAID_NET_KEY_BYTES);
  snprintf(l->addr, sizeof l->addr, "(not listening)");
  *out = l;
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t sock_close_listen(void* listen_comm);

void net_socket_listen_free(struct sock_listen* l) { sock_close_listen(l); }

static ncclResult_t sock_listen(int dev, const uint8_t* key, void* handle, void** listen_comm) {
  ncclResult_t res = ncclSuccess;
  struct sock_listen* l = NULL;
  struct sock_handle* h = handle;
  *listen_comm = NULL;
  BRAID_CHECK(dev >= 0 && dev < sock_devs.ndev, ncclInternalError, "net Socket: no device %d", dev);
  BRAID_TRY(net_socket_listen_alloc(key, &l));
  memset(h, 0, BRAID_NET_HANDLE_BYTES);
  h->addr = sock_devs.ifs[dev].addr;
  h->addr.sin.sin_port = 0; /* same offset for IPv6: pick any port */
  BRAID_TRY(socket_listen(&h->addr, &l->fd));
  socket_addr_str(&h->addr, l->addr, sizeof l->addr);
  h->magic = SOCK_MAGIC;
  h->version = SOCK_VERSION;
  *listen_comm = l;
  return ncclSuccess;
fail:
  free(l);
  return res;
}

static void sock_drop(struct sock_listen* l, struct sock_pending* p, const char* why) {
  char text[80];
  WARN("net Socket: listener %s dropped a connection from %s: %s", l->addr,
       socket_addr_str(&p->remote, text, sizeof text), why);
  socket_close(&p->fd);
}

/* Why a hello must be refused, or NULL. */
static const char* sock_hello_check(const struct sock_listen* l, const struct sock_hello* h) {
  uint8_t diff = 0;
  for (int i = 0; i < BRAID_NET_KEY_BYTES; i++) diff |= (uint8_t)(h->key[i] ^ l->key[i]);
  if (h->magic != SOCK_MAGIC) return "not a Braid socket connection (bad magic)";
  if (h->version != SOCK_VERSION) return "another version of Braid's socket protocol";
  if (diff != 0) return "wrong key (a process of another job, or a stale one)";
  if (h->nstreams < 1 || h->nstreams > SOCK_MAX_STREAMS || h->index > h->nstreams)
    return "stream numbers out of range";
  if (h->conn_id == 0) return "connection id 0 (it marks a free slot here)";
  return NULL;
}

/* Files an accepted hello's fd under its connection; returns the group when it is complete. */
static struct sock_group* sock_group_add(struct sock_listen* l, struct sock_pending* p) {
  struct sock_group* g = NULL;
  for (int i = 0; i < SOCK_MAX_GROUPS && !g; i++)
    if (l->groups[i].conn_id == p->hello.conn_id) g = &l->groups[i];
  for (int i = 0; i < SOCK_MAX_GROUPS && !g; i++) {
    if (l->groups[i].conn_id != 0) continue;
    g = &l->groups[i];
    memset(g, 0, sizeof *g);
    g->conn_id = p->hello.conn_id;
    g->nstreams = (int)p->hello.nstreams;
    g->ctrl_fd = -1;
    for (int s = 0; s < SOCK_MAX_STREAMS; s++) g->fds[s] = -1;
    socket_addr_str(&p->remote, g->peer, sizeof g->peer);
  }
  if (g == NULL) {
    sock_drop(l, p, "too many connections being assembled at once");
    return NULL;
  }
  int* slot = p->hello.index == 0 ? &g->ctrl_fd : &g->fds[p->hello.index - 1];
  if (*slot >= 0 || (int)p->hello.nstreams != g->nstreams) {
    sock_drop(l, p, "a stream that does not fit its connection");
    return NULL;
  }
  *slot = p->fd;
  p->fd = -1;
  g->have++;
  return g->have == g->nstreams + 1 ? g : NULL;
}

/* Reads what is there of a pending connection's hello; returns a complete group or NULL. */
static struct sock_group* sock_pending_progress(struct sock_listen* l, struct sock_pending* p,
                                                double now) {
  size_t n = 0;
  ncclResult_t r = socket_recv_some(p->fd, (char*)&p->hello + p->got, sizeof p->hello - p->got, &n);
  p->got += n;
  if (r != ncclSuccess) {
    sock_drop(l, p, "it closed before presenting its hello");
    return NULL;
  }
  if (p->got < sizeof p->hello) {
    if (now >= p->deadline) sock_drop(l, p, "no hello within 5 s");
    return NULL;
  }
  const char* why = sock_hello_check(l, &p->hello);
  if (why) {
    sock_drop(l, p, why);
    return NULL;
  }
  return sock_group_add(l, p);
}

static ncclResult_t sock_comm_alloc(struct sock_comm** out, int is_send, int nstreams, int nthreads,
                                    const char* peer) {
  ncclResult_t res = ncclSuccess;
  struct sock_comm* c = NULL;
  BRAID_TRY(BRAID_CALLOC(&c, 1, "a socket connection"));
  c->is_send = is_send;
  c->ctrl_fd = -1;
  net_connect_try_init(&c->connect_try);
  c->nstreams = nstreams;
  c->nthreads = nthreads;
  for (int s = 0; s < SOCK_MAX_STREAMS; s++) c->streams[s].fd = -1;
  for (int i = 0; i < SOCK_MAX_THREADS; i++) c->helpers[i].efd = -1;
  pthread_mutex_init(&c->err_lock, NULL);
  snprintf(c->peer, sizeof c->peer, "%s", peer);
  *out = c;
  return ncclSuccess;
fail:
  return res;
}

/* Turns a complete group into a receiving comm (the comm owns the fds then). */
static ncclResult_t sock_group_finish(struct sock_group* g, void** recv_comm) {
  ncclResult_t res = ncclSuccess;
  struct sock_comm* c = NULL;
  int nstreams = 0, nthreads = 0;
  net_socket_stream_counts(&nstreams, &nthreads);
  BRAID_TRY(sock_comm_alloc(&c, 0, g->nstreams, nthreads, g->peer));
  c->ctrl_fd = g->ctrl_fd;
  for (int s = 0; s < g->nstreams; s++) c->streams[s].fd = g->fds[s];
  g->conn_id = 0;
  BRAID_TRY(net_socket_comm_start(c));
  INFO(BRAID_LOG_NET, "net Socket: accepted a connection from %s: %d data streams, %d helper threads",
       c->peer, c->nstreams, c->nthreads);
  *recv_comm = c;
  return ncclSuccess;
fail:
  if (c) net_socket_comm_free(c);
  else {
    socket_close(&g->ctrl_fd);
    for (int s = 0; s < g->nstreams; s++) socket_close(&g->fds[s]);
    g->conn_id = 0;
  }
  return res;
}

/* A new connection in pending slot `p`: its hello is due by now + SOCK_HELLO_SEC. */
static void sock_pending_start(struct sock_pending* p, double now) {
  p->got = 0;
  p->deadline = now + SOCK_HELLO_SEC;
  memset(&p->hello, 0, sizeof p->hello);
}

/* Takes new connections off the listening socket into free pending slots. */
static ncclResult_t sock_accept_new(struct sock_listen* l, double now) {
  for (int i = 0; l->fd >= 0 && i < SOCK_MAX_PENDING; i++) {
    struct sock_pending* p = &l->pending[i];
    if (p->fd >= 0) continue;
    if (socket_accept_some(l->fd, &p->fd, &p->remote) != ncclSuccess)
      return braid_err(ncclSystemError, "net Socket: accept on %s failed: %s", l->addr,
                       strerror(errno));
    if (p->fd < 0) return ncclSuccess;
    sock_pending_start(p, now);
  }
  return ncclSuccess;
}

int net_socket_pending_add(struct sock_listen* l, int fd, const union braid_sockaddr* remote,
                           double now) {
  for (int i = 0; i < SOCK_MAX_PENDING; i++) {
    struct sock_pending* p = &l->pending[i];
    if (p->fd >= 0) continue;
    p->fd = fd;
    p->remote = *remote;
    sock_pending_start(p, now);
    return 0;
  }
  close(fd);
  return -1;
}

ncclResult_t net_socket_handshake_step(struct sock_listen* l, double now, void** recv_comm) {
  *recv_comm = NULL;
  for (int i = 0; i < SOCK_MAX_PENDING; i++) {
    struct sock_pending* p = &l->pending[i];
    if (p->fd < 0) continue;
    struct sock_group* g = sock_pending_progress(l, p, now);
    if (g) return sock_group_finish(g, recv_comm);
  }
  return ncclSuccess;
}

static ncclResult_t sock_accept(void* listen_comm, void** recv_comm) {
  struct sock_listen* l = listen_comm;
  double now = braid_time_sec();
  *recv_comm = NULL;
  ncclResult_t res = sock_accept_new(l, now);
  if (res != ncclSuccess) return res;
  return net_socket_handshake_step(l, now, recv_comm);
}

static ncclResult_t sock_close_listen(void* listen_comm) {
  struct sock_listen* l = listen_comm;
  if (l == NULL) return ncclSuccess;
  for (int i = 0; i < SOCK_MAX_PENDING; i++) socket_close(&l->pending[i].fd);
  for (int i = 0; i < SOCK_MAX_GROUPS; i++) {
    struct sock_group* g = &l->groups[i];
    if (g->conn_id == 0) continue;
    socket_close(&g->ctrl_fd);
    for (int s = 0; s < g->nstreams; s++) socket_close(&g->fds[s]);
  }
  socket_close(&l->fd);
  free(l);
  return ncclSuccess;
}

/* ------------------------------------------------------------- connect */

/* Why a handle that came from a peer cannot be used, or NULL. */
static const char* sock_handle_check(const struct sock_handle* h) {
  if (h->magic != SOCK_MAGIC)
    return "not a socket backend's (both ends must use the same BRAID_NET)";
  if (h->version != SOCK_VERSION) return "another version of Braid's socket protocol";
  if (h->addr.sa.sa_family != AF_INET && h->addr.sa.sa_family != AF_INET6)
    return "its address is neither IPv4 nor IPv6";
  if (socket_port(&h->addr) == 0) return "its address has no port";
  return NULL;
}

/* Opens stream `index` (0: control) and sends its hello; *fd stays -1 while not connected yet. */
static ncclResult_t sock_open_stream(struct sock_connecting* s, const uint8_t* key, int index,
                                     int* fd) {
  ncclResult_t res = ncclSuccess;
  struct sock_hello hello;
  BRAID_TRY(net_connect_try_step(&s->comm->connect_try, &s->addr, "Socket", s->peer, fd));
  if (*fd < 0) return ncclSuccess;
  memset(&hello, 0, sizeof hello);
  hello.magic = SOCK_MAGIC;
  hello.version = SOCK_VERSION;
  hello.index = (uint16_t)index;
  memcpy(hello.key, key, BRAID_NET_KEY_BYTES);
  hello.conn_id = s->conn_id;
  hello.nstreams = (uint32_t)s->comm->nstreams;
  BRAID_TRY(socket_send_all(*fd, &hello, sizeof hello, SOCK_HELLO_SEC, NULL));
  return ncclSuccess;
fail:
  socket_close(fd);
  return res;
}

static void sock_connect_abandon(void* state) {
  struct sock_connecting* s = state;
  if (s == NULL) return;
  net_socket_comm_free(s->comm);
  free(s);
}

/* A connect's state, from a handle that passed its check. */
static ncclResult_t sock_connecting_new(const struct sock_handle* h, struct sock_connecting** out) {
  ncclResult_t res = ncclSuccess;
  struct sock_connecting* s = NULL;
  int nstreams = 0, nthreads = 0;
  *out = NULL;
  BRAID_TRY(BRAID_CALLOC(&s, 1, "a socket connection in progress"));
  s->addr = h->addr;
  socket_addr_str(&s->addr, s->peer, sizeof s->peer);
  net_socket_stream_counts(&nstreams, &nthreads);
  BRAID_TRY(sock_comm_alloc(&s->comm, 1, nstreams, nthreads, s->peer));
  do {
    BRAID_TRY(braid_random_bytes(&s->conn_id, sizeof s->conn_id));
  } while (s->conn_id == 0);
  *out = s;
  return ncclSuccess;
fail:
  sock_connect_abandon(s);
  return res;
}

static ncclResult_t sock_connect(int dev, const uint8_t* key, const void* handle, void** state,
                                 void** send_comm) {
  ncclResult_t res = ncclSuccess;
  struct sock_connecting* s = *state;
  struct sock_comm* c = NULL;
  *send_comm = NULL;
  if (s == NULL) {
    struct sock_handle h;
    memcpy(&h, handle, sizeof h);
    const char* why = sock_handle_check(&h);
    if (why)
      return braid_err(ncclInternalError, "net Socket: cannot use the connection handle: %s", why);
    BRAID_TRY(sock_connecting_new(&h, &s));
    *state = s;
  }
  c = s->comm;
  while (s->opened <= c->nstreams) {
    int* fd = s->opened == 0 ? &c->ctrl_fd : &c->streams[s->opened - 1].fd;
    BRAID_TRY(sock_open_stream(s, key, s->opened, fd));
    if (*fd < 0) return ncclSuccess; /* not yet: call again */
    s->opened++;
  }
  s->comm = NULL; /* the comm is on its own from here */
  sock_connect_abandon(s);
  *state = NULL;
  res = net_socket_comm_start(c);
  if (res != ncclSuccess) {
    net_socket_comm_free(c);
    return res;
  }
  INFO(BRAID_LOG_NET, "net Socket: connected to %s: %d data streams, %d helper threads", c->peer,
       c->nstreams, c->nthreads);
  *send_comm = c;
  return ncclSuccess;
fail:
  sock_connect_abandon(*state);
  *state = NULL;
  return res;
}

/* --------------------------------------------------------- the rest */

static ncclResult_t sock_reg_mr(void* comm, void* data, size_t size, int is_cuda, void** mhandle) {
  *mhandle = NULL;
  if (is_cuda) return net_unsupported("Socket", "registering GPU memory");
  return ncclSuccess;
}

static ncclResult_t sock_reg_mr_dmabuf(void* comm, void* data, size_t size, uint64_t offset, int fd,
                                       void** mhandle) {
  *mhandle = NULL;
  return net_unsupported("Socket", "registering a dma-buf");
}

static ncclResult_t sock_dereg_mr(void* comm, void* mhandle) { return ncclSuccess; }

static ncclResult_t sock_iflush(void* recv_comm, void* data, size_t size, void* mhandle,
                                void** request) {
  *request = NULL; /* host memory: nothing to flush */
  return ncclSuccess;
}

static ncclResult_t sock_close_comm(void* comm) {
  net_socket_comm_free(comm);
  return ncclSuccess;
}

static ncclResult_t sock_close_abort(void* comm) {
  net_socket_comm_abandon(comm);
  return ncclSuccess;
}

const struct braid_net_ops braid_net_socket = {
  .size = sizeof(struct braid_net_ops),
  .name = "Socket",
  .init = sock_init,
  .get_properties = sock_get_properties,
  .listen = sock_listen,
  .connect = sock_connect,
  .connect_abandon = sock_connect_abandon,
  .accept = sock_accept,
  .reg_mr = sock_reg_mr,
  .reg_mr_dmabuf = sock_reg_mr_dmabuf,
  .dereg_mr = sock_dereg_mr,
  .isend = net_socket_isend,
  .irecv = net_socket_irecv,
  .iflush = sock_iflush,
  .test = net_socket_test,
  .close_send = sock_close_comm,
  .close_recv = sock_close_comm,
  .close_listen = sock_close_listen,
  .recv_fd = net_socket_recv_fd,
  .recv_busy = net_socket_recv_busy,
  .close_abort = sock_close_abort,
};
