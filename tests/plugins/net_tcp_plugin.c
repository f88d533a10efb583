/*
 * A net plugin for the tests, written against NCCL's net plugin interface
 * alone (no Braid code, no Braid header): plain TCP over one interface, host
 * memory only, a framing of its own. Built once per interface version
 * (BRAIDTEST_NET_VERSION, 6 to 11; the library exports ncclNetPlugin_v<N>).
 * The v11 build also exports a CollNet table, which a loader should report
 * and leave alone.
 *
 * Its device is the first IPv4 interface that is up and not loopback (in a
 * network namespace with a veth pair: the veth), else the loopback.
 *
 * Wire: each message is a frame {magic, kind, size} and `size` bytes. A send
 * comm closed cleanly sends a BYE frame first: the receiver's pending
 * receives then neither complete nor fail (a plugin whose peer does not
 * notice a close). A connection that ends without one fails the
 * receives (ncclRemoteError); a send to a gone peer fails too.
 * BRAIDTEST_NET_BYE=0 leaves the BYE out, so that every close shows at the
 * peer as the end of the connection, as with NCCL's socket plugin.
 *
 * Like NCCL's own plugins it keeps a connect's progress in the handle, which
 * NCCL passes again on every call; a handle whose state it did not write is
 * refused.
 *
 * What it checks of its loader: every buffer it sends from or receives into
 * must lie within a registration of host memory; a v11 context must come
 * back to listen and connect; a v10 connect must get a comm config.
 * BRAIDTEST_NET_FAIL_INIT=1 makes init fail (ncclSystemError);
 * BRAIDTEST_NET_NDEV=0 makes devices() report none; BRAIDTEST_NET_NO_TEST=1
 * leaves the table's test slot empty (from the moment the library loads). The
 * v11 build logs its finalize (INFO "BraidTest: finalize").
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef BRAIDTEST_NET_VERSION
#define BRAIDTEST_NET_VERSION 11
#endif
#define V BRAIDTEST_NET_VERSION

/* ----------------------------------------------------- NCCL's interface */

#include "nccl_common.h"

typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle,
                                               int64_t pluginId, void* extData);

#define NCCL_PTR_HOST 0x1
#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_NET_MAX_DEVS_PER_NIC 4
typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_t;
typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC];
} ncclNetVDeviceProps_t;
typedef struct {
  int trafficClass;
} ncclNetCommConfig_t;

/* The properties of version V, member for member. */
typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
#if V >= 8
  int regIsGlobal;
#endif
#if V >= 9
  int forceFlush;
#endif
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
#if V >= 7
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
#endif
#if V >= 9
  ncclNetVDeviceProps_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
#endif
#if V >= 11
  int maxMultiRequestSize;
#endif
} test_props_t;

#if V >= 8
typedef size_t reg_size_t;
#else
typedef int reg_size_t;
#endif
#if V >= 9
typedef size_t msg_size_t;
#else
typedef int msg_size_t;
#endif

/* The table of version V, slot for slot. */
typedef struct {
  const char* name;
#if V >= 11
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
#elif V == 10
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
#else
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
#endif
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, test_props_t* props);
#if V >= 11
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_t** sendDevComm);
#elif V == 10
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_t** sendDevComm);
#elif V >= 7
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_t** sendDevComm);
#else
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm);
#endif
#if V >= 7
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_t** recvDevComm);
#else
  ncclResult_t (*accept)(void* listenComm, void** recvComm);
#endif
  ncclResult_t (*regMr)(void* comm, void* data, reg_size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
#if V >= 10
  ncclResult_t (*isend)(void* sendComm, void* data, msg_size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, msg_size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
#else
  ncclResult_t (*isend)(void* sendComm, void* data, msg_size_t size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, msg_size_t* sizes, int* tags,
                        void** mhandles, void** request);
#endif
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
#if V >= 7
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
#endif
#if V >= 9
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_t* props);
#endif
#if V >= 11
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, void* netAttr);
#endif
} test_net_t;

/* ------------------------------------------------------------ state */

#define MAX_REQS (V == 6 ? 8 : 32)
#define FRAME_MAGIC 0x54435042u /* "BPCT" */
#define HANDLE_MAGIC 0x4e544342u
#define HANDLE_VERSION 1u
#define STAGE_CONNECTING 0x434f4e4eu
#define MR_MAGIC 0x4d52u
#define REFUSED_GIVE_UP_S 3.0

enum { KIND_DATA = 1, KIND_BYE = 2 };

struct frame {
  uint32_t magic;
  uint32_t kind;
  uint64_t size;
};

union tcp_addr {
  struct sockaddr sa;
  struct sockaddr_in in;
  struct sockaddr_in6 in6;
};

/* The listener's handle: its address, then the state of a connect in progress. */
struct tcp_handle {
  uint32_t magic;
  uint32_t version;
  union tcp_addr addr;
  uint32_t stage; /* 0: not begun; STAGE_CONNECTING */
  uint32_t pad;
  struct tcp_comm* connecting;
};
_Static_assert(sizeof(struct tcp_handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large");
_Static_assert(offsetof(struct tcp_handle, stage) == 36, "net_conformance_test.c knows this");

struct tcp_mr {
  uint32_t magic;
  char* base;
  size_t size;
};

struct tcp_comm;
struct tcp_req {
  struct tcp_comm* comm;
  int used, done;
  char* data;
  size_t size; /* send: the message; receive: the most it may take */
  size_t got;  /* receive: the message's size */
  struct frame hdr;
  size_t hdr_off, data_off;
};

struct tcp_comm {
  int fd;
  int is_send;
  ncclResult_t error; /* the connection failed: every request fails */
  int bye;            /* receive: the peer closed cleanly */
  struct tcp_req reqs[32];
  struct tcp_req* queue[32]; /* posted, in order, until their bytes moved */
  unsigned qhead, qtail;
  /* connect in progress */
  double next_try, refused_since;
};

struct tcp_listen {
  int fd;
};

static ncclDebugLogger_t logger;
static int send_goodbye = 1; /* BRAIDTEST_NET_BYE */
static int ndevices = 1;     /* BRAIDTEST_NET_NDEV */
static char dev_name[IF_NAMESIZE + 1] = "lo";
static union tcp_addr dev_addr;
#if V >= 11
static int context_token; /* the context init hands out */
#endif

#define LOG(level, ...)                                                   \
  do {                                                                    \
    if (logger) logger(level, NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

static double now_sec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --------------------------------------------------------------- setup */

static void pick_device(void) {
  struct ifaddrs *list = NULL, *i;
  memset(&dev_addr, 0, sizeof dev_addr);
  dev_addr.in.sin_family = AF_INET;
  dev_addr.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (getifaddrs(&list) != 0) return;
  for (i = list; i; i = i->ifa_next) {
    if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    memcpy(&dev_addr.in, i->ifa_addr, sizeof dev_addr.in);
    snprintf(dev_name, sizeof dev_name, "%s", i->ifa_name);
    break;
  }
  freeifaddrs(list);
}

static ncclResult_t tcp_init_common(ncclDebugLogger_t log) {
  const char* fail = getenv("BRAIDTEST_NET_FAIL_INIT");
  const char* bye = getenv("BRAIDTEST_NET_BYE");
  const char* ndev = getenv("BRAIDTEST_NET_NDEV");
  logger = log;
  send_goodbye = !(bye && strcmp(bye, "0") == 0);
  ndevices = ndev && strcmp(ndev, "0") == 0 ? 0 : 1;
  if (fail && strcmp(fail, "1") == 0) {
    LOG(NCCL_LOG_WARN, "BraidTest: init fails as BRAIDTEST_NET_FAIL_INIT asks");
    return ncclSystemError;
  }
  pick_device();
  char text[INET_ADDRSTRLEN] = "";
  inet_ntop(AF_INET, &dev_addr.in.sin_addr, text, sizeof text);
  LOG(NCCL_LOG_INFO, "BraidTest: net plugin v%d on %s (%s)", V, dev_name, text);
  return ncclSuccess;
}

static ncclResult_t tcp_devices(int* ndev) {
  *ndev = ndevices;
  return ncclSuccess;
}

static ncclResult_t tcp_get_properties(int dev, test_props_t* props) {
  if (dev != 0) return ncclInvalidArgument;
  memset(props, 0, sizeof *props);
  props->name = dev_name;
  props->pciPath = NULL;
  props->guid = 0x42;
  props->ptrSupport = NCCL_PTR_HOST;
  props->speed = 10000;
  props->port = 0;
  props->latency = 0;
  props->maxComms = 65536;
  props->maxRecvs = 1;
#if V >= 7
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = 0;
#endif
#if V >= 9
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = 0;
  props->maxP2pBytes = (size_t)1 << 30;
  props->maxCollBytes = (size_t)1 << 30;
#endif
#if V >= 11
  props->maxMultiRequestSize = 1;
#endif
  return ncclSuccess;
}

static socklen_t addr_len(const union tcp_addr* a) {
  return a->sa.sa_family == AF_INET ? sizeof a->in : sizeof a->in6;
}

static ncclResult_t tcp_listen(int dev, void* handle, void** listenComm) {
  struct tcp_handle* h = handle;
  union tcp_addr a = dev_addr;
  socklen_t len = addr_len(&a);
  if (dev != 0) return ncclInvalidArgument;
  a.in.sin_port = 0;
  int fd = socket(a.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, &a.sa, len) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, &a.sa, &len) != 0) {
    LOG(NCCL_LOG_WARN, "BraidTest: cannot listen on %s: %s", dev_name, strerror(errno));
    if (fd >= 0) close(fd);
    return ncclSystemError;
  }
  struct tcp_listen* l = calloc(1, sizeof *l);
  if (l == NULL) {
    close(fd);
    return ncclSystemError;
  }
  l->fd = fd;
  memset(h, 0, sizeof *h);
  h->magic = HANDLE_MAGIC;
  h->version = HANDLE_VERSION;
  h->addr = a;
  *listenComm = l;
  return ncclSuccess;
}

static struct tcp_comm* comm_new(int fd, int is_send) {
  struct tcp_comm* c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->fd = fd;
  c->is_send = is_send;
  for (int i = 0; i < 32; i++) c->reqs[i].comm = c;
  return c;
}

/* One step of a connect whose state lives in the handle. */
static ncclResult_t tcp_connect(int dev, void* handle, void** sendComm) {
  struct tcp_handle* h = handle;
  *sendComm = NULL;
  if (dev != 0 || h->magic != HANDLE_MAGIC || h->version != HANDLE_VERSION) {
    LOG(NCCL_LOG_WARN, "BraidTest: connect to a handle that is not ours");
    return ncclInvalidArgument;
  }
  if (h->addr.sa.sa_family != AF_INET && h->addr.sa.sa_family != AF_INET6) {
    LOG(NCCL_LOG_WARN, "BraidTest: connect to address family %d", h->addr.sa.sa_family);
    return ncclInvalidArgument;
  }
  if (h->stage != 0 && (h->stage != STAGE_CONNECTING || h->connecting == NULL)) {
    LOG(NCCL_LOG_WARN, "BraidTest: the handle carries a connect state this plugin did not write");
    return ncclInvalidArgument;
  }
  struct tcp_comm* c = h->connecting;
  if (c == NULL) {
    c = comm_new(-1, 1);
    if (c == NULL) return ncclSystemError;
    h->connecting = c;
    h->stage = STAGE_CONNECTING;
  }
  double now = now_sec();
  if (c->fd < 0) {
    if (now < c->next_try) return ncclSuccess;
    c->fd = socket(h->addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) goto fail_sys;
    if (connect(c->fd, &h->addr.sa, addr_len(&h->addr)) != 0 && errno != EINPROGRESS) goto refused;
  }
  struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
  if (poll(&pfd, 1, 0) <= 0) return ncclSuccess;
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) goto fail_sys;
  if (err != 0) {
    errno = err;
    goto refused;
  }
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  h->stage = 0;
  h->connecting = NULL;
  *sendComm = c;
  return ncclSuccess;
refused:
  if (errno != ECONNREFUSED && errno != EAGAIN && errno != ETIMEDOUT) goto fail_sys;
  close(c->fd);
  c->fd = -1;
  if (c->refused_since == 0) c->refused_since = now;
  c->next_try = now + 0.01;
  if (now - c->refused_since < REFUSED_GIVE_UP_S) return ncclSuccess;
  LOG(NCCL_LOG_WARN, "BraidTest: the listener refused connections for %.0f s", REFUSED_GIVE_UP_S);
  free(c);
  h->stage = 0;
  h->connecting = NULL;
  return ncclRemoteError;
fail_sys:
  LOG(NCCL_LOG_WARN, "BraidTest: connect failed: %s", strerror(errno));
  if (c->fd >= 0) close(c->fd);
  free(c);
  h->stage = 0;
  h->connecting = NULL;
  return ncclSystemError;
}

static ncclResult_t tcp_accept(void* listenComm, void** recvComm) {
  struct tcp_listen* l = listenComm;
  *recvComm = NULL;
  int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return ncclSuccess;
    LOG(NCCL_LOG_WARN, "BraidTest: accept failed: %s", strerror(errno));
    return ncclSystemError;
  }
  struct tcp_comm* c = comm_new(fd, 0);
  if (c == NULL) {
    close(fd);
    return ncclSystemError;
  }
  *recvComm = c;
  return ncclSuccess;
}

/* ---------------------------------------------------------- memory */

static ncclResult_t tcp_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  *mhandle = NULL;
  if (type != NCCL_PTR_HOST) {
    LOG(NCCL_LOG_WARN, "BraidTest: only host memory can be registered (type %d)", type);
    return ncclInternalError;
  }
  struct tcp_mr* mr = malloc(sizeof *mr);
  if (mr == NULL) return ncclSystemError;
  mr->magic = MR_MAGIC;
  mr->base = data;
  mr->size = size;
  *mhandle = mr;
  return ncclSuccess;
}

static ncclResult_t tcp_reg_mr_v(void* comm, void* data, reg_size_t size, int type,
                                 void** mhandle) {
  return tcp_reg_mr(comm, data, (size_t)size, type, mhandle);
}

static ncclResult_t tcp_reg_mr_dmabuf(void* comm, void* data, size_t size, int type,
                                      uint64_t offset, int fd, void** mhandle) {
  return ncclInternalError;
}

static ncclResult_t tcp_dereg_mr(void* comm, void* mhandle) {
  struct tcp_mr* mr = mhandle;
  if (mr == NULL || mr->magic != MR_MAGIC) return ncclInternalError;
  mr->magic = 0;
  free(mr);
  return ncclSuccess;
}

/* A buffer must lie within the registration it comes with. */
static int mr_covers(const void* mhandle, const char* data, size_t size) {
  const struct tcp_mr* mr = mhandle;
  if (mr == NULL || mr->magic != MR_MAGIC) return 0;
  return data >= mr->base && data + size <= mr->base + mr->size;
}

/* -------------------------------------------------------- data path */

static ncclResult_t post(struct tcp_comm* c, void* data, size_t size, void* mhandle,
                         void** request) {
  *request = NULL;
  if (!mr_covers(mhandle, data, size)) {
    LOG(NCCL_LOG_WARN, "BraidTest: a %s of %zu bytes at %p outside any registration",
        c->is_send ? "send" : "receive", size, data);
    return ncclInvalidUsage;
  }
  if (c->qtail - c->qhead >= (unsigned)MAX_REQS) return ncclSuccess;
  struct tcp_req* r = NULL;
  for (int i = 0; i < MAX_REQS && r == NULL; i++)
    if (!c->reqs[i].used) r = &c->reqs[i];
  if (r == NULL) return ncclSuccess;
  memset(r, 0, sizeof *r);
  r->comm = c;
  r->used = 1;
  r->data = data;
  r->size = size;
  r->hdr = (struct frame){.magic = FRAME_MAGIC, .kind = KIND_DATA, .size = size};
  c->queue[c->qtail++ % 32] = r;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t fail_comm(struct tcp_comm* c, ncclResult_t res, const char* what) {
  if (c->error == ncclSuccess)
    LOG(NCCL_LOG_WARN, "BraidTest: %s connection failed: %s", c->is_send ? "send" : "receive",
        what);
  c->error = res;
  return res;
}

static ncclResult_t progress_send(struct tcp_comm* c) {
  while (c->qhead != c->qtail) {
    struct tcp_req* r = c->queue[c->qhead % 32];
    while (r->hdr_off < sizeof r->hdr || r->data_off < r->size) {
      int in_hdr = r->hdr_off < sizeof r->hdr;
      const char* p = in_hdr ? (const char*)&r->hdr + r->hdr_off : r->data + r->data_off;
      size_t n = in_hdr ? sizeof r->hdr - r->hdr_off : r->size - r->data_off;
      ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
      if (k <= 0) return fail_comm(c, ncclRemoteError, strerror(errno));
      if (in_hdr)
        r->hdr_off += (size_t)k;
      else
        r->data_off += (size_t)k;
    }
    r->done = 1;
    c->qhead++;
  }
  return ncclSuccess;
}

/* Reads into p what is there of n bytes; 1 when all came, 0 not yet, -1 failed. */
static int read_some(struct tcp_comm* c, char* p, size_t n, size_t* off) {
  while (*off < n) {
    ssize_t k = recv(c->fd, p + *off, n - *off, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (k == 0) {
      fail_comm(c, ncclRemoteError, "the peer closed the connection without a goodbye");
      return -1;
    }
    if (k < 0) {
      fail_comm(c, ncclRemoteError, strerror(errno));
      return -1;
    }
    *off += (size_t)k;
  }
  return 1;
}

static ncclResult_t progress_recv(struct tcp_comm* c) {
  while (c->qhead != c->qtail && !c->bye) {
    struct tcp_req* r = c->queue[c->qhead % 32];
    if (r->hdr_off < sizeof r->hdr) {
      int rc = read_some(c, (char*)&r->hdr, sizeof r->hdr, &r->hdr_off);
      if (rc <= 0) return rc < 0 ? c->error : ncclSuccess;
      if (r->hdr.magic != FRAME_MAGIC)
        return fail_comm(c, ncclRemoteError, "a frame without its magic");
      if (r->hdr.kind == KIND_BYE) {
        c->bye = 1; /* pending receives stay pending */
        return ncclSuccess;
      }
      if (r->hdr.size > r->size)
        return fail_comm(c, ncclInvalidUsage, "a message larger than its receive (truncation)");
      r->got = r->hdr.size;
    }
    int rc = read_some(c, r->data, r->got, &r->data_off);
    if (rc <= 0) return rc < 0 ? c->error : ncclSuccess;
    r->done = 1;
    c->qhead++;
  }
  return ncclSuccess;
}

static ncclResult_t tcp_isend_common(void* sendComm, void* data, size_t size, void* mhandle,
                                     void** request) {
  struct tcp_comm* c = sendComm;
  if (c->error) return c->error;
  ncclResult_t res = post(c, data, size, mhandle, request);
  if (res == ncclSuccess && *request) progress_send(c); /* errors show in test() */
  return res;
}

static ncclResult_t tcp_irecv_common(void* recvComm, int n, void** data, size_t size,
                                     void** mhandles, void** request) {
  struct tcp_comm* c = recvComm;
  if (n != 1) return ncclInvalidArgument;
  if (c->error) return c->error;
  return post(c, data[0], size, mhandles[0], request);
}

/*
 * Nothing to make visible (host memory), but like a plugin that flushes with a read it returns
 * a request, complete at its first test, for a buffer within its registration.
 */
static ncclResult_t tcp_iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                               void** request) {
  struct tcp_comm* c = recvComm;
  *request = NULL;
  if (n != 1 || sizes[0] < 0 || !mr_covers(mhandles[0], data[0], (size_t)sizes[0])) {
    LOG(NCCL_LOG_WARN, "BraidTest: a flush of %d buffers, or outside its registration", n);
    return ncclInvalidUsage;
  }
  struct tcp_req* r = NULL;
  for (int i = 0; i < MAX_REQS && r == NULL; i++)
    if (!c->reqs[i].used) r = &c->reqs[i];
  if (r == NULL) return ncclSuccess;
  memset(r, 0, sizeof *r);
  r->comm = c;
  r->used = 1;
  r->done = 1; /* not queued: no bytes to move */
  *request = r;
  return ncclSuccess;
}

static ncclResult_t tcp_test(void* request, int* done, int* sizes) {
  struct tcp_req* r = request;
  struct tcp_comm* c = r->comm;
  *done = 0;
  if (!r->done && !c->error) (c->is_send ? progress_send : progress_recv)(c);
  if (!r->done) return c->error;
  *done = 1;
  if (sizes) *sizes = (int)(c->is_send ? r->size : r->got);
  r->used = 0;
  return ncclSuccess;
}

/* A clean close of a send end: a goodbye, unless a message is half on the wire (or BYE=0). */
static void send_bye(struct tcp_comm* c) {
  if (c->error || !send_goodbye) return;
  if (c->qhead != c->qtail && c->queue[c->qhead % 32]->hdr_off > 0) return;
  struct frame bye = {.magic = FRAME_MAGIC, .kind = KIND_BYE, .size = 0};
  size_t off = 0;
  double end = now_sec() + 1.0;
  while (off < sizeof bye && now_sec() < end) {
    ssize_t k = send(c->fd, (char*)&bye + off, sizeof bye - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0)
      off += (size_t)k;
    else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return;
    else {
      struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
      poll(&pfd, 1, 10);
    }
  }
}

static ncclResult_t tcp_close_send(void* sendComm) {
  struct tcp_comm* c = sendComm;
  if (c == NULL) return ncclSuccess;
  send_bye(c);
  close(c->fd);
  free(c);
  return ncclSuccess;
}

static ncclResult_t tcp_close_recv(void* recvComm) {
  struct tcp_comm* c = recvComm;
  if (c == NULL) return ncclSuccess;
  close(c->fd);
  free(c);
  return ncclSuccess;
}

static ncclResult_t tcp_close_listen(void* listenComm) {
  struct tcp_listen* l = listenComm;
  if (l == NULL) return ncclSuccess;
  close(l->fd);
  free(l);
  return ncclSuccess;
}

/* ------------------------------------------------- version V's entries */

#if V >= 11
static ncclResult_t tcp_init_v(void** ctx, uint64_t commId, ncclNetCommConfig_t* config,
                               ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  *ctx = &context_token;
  return tcp_init_common(log);
}
static ncclResult_t tcp_listen_v(void* ctx, int dev, void* handle, void** listenComm) {
  if (ctx != &context_token) return ncclInternalError; /* the context init made must come back */
  return tcp_listen(dev, handle, listenComm);
}
static ncclResult_t tcp_connect_v(void* ctx, int dev, void* handle, void** sendComm,
                                  ncclNetDeviceHandle_t** sendDevComm) {
  if (ctx != &context_token) return ncclInternalError;
  return tcp_connect(dev, handle, sendComm);
}
#elif V == 10
static ncclResult_t tcp_init_v(ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  return tcp_init_common(log);
}
static ncclResult_t tcp_connect_v(int dev, ncclNetCommConfig_t* config, void* handle,
                                  void** sendComm, ncclNetDeviceHandle_t** sendDevComm) {
  if (config == NULL) return ncclInternalError;
  return tcp_connect(dev, handle, sendComm);
}
#define tcp_listen_v tcp_listen
#elif V >= 7
static ncclResult_t tcp_init_v(ncclDebugLogger_t log) { return tcp_init_common(log); }
static ncclResult_t tcp_connect_v(int dev, void* handle, void** sendComm,
                                  ncclNetDeviceHandle_t** sendDevComm) {
  return tcp_connect(dev, handle, sendComm);
}
#define tcp_listen_v tcp_listen
#else
static ncclResult_t tcp_init_v(ncclDebugLogger_t log) { return tcp_init_common(log); }
#define tcp_connect_v tcp_connect
#define tcp_listen_v tcp_listen
#endif

#if V >= 7
static ncclResult_t tcp_accept_v(void* listenComm, void** recvComm,
                                 ncclNetDeviceHandle_t** recvDevComm) {
  return tcp_accept(listenComm, recvComm);
}
#else
#define tcp_accept_v tcp_accept
#endif

#if V >= 10
static ncclResult_t tcp_isend_v(void* sendComm, void* data, msg_size_t size, int tag, void* mhandle,
                                void* phandle, void** request) {
  return tcp_isend_common(sendComm, data, (size_t)size, mhandle, request);
}
static ncclResult_t tcp_irecv_v(void* recvComm, int n, void** data, msg_size_t* sizes, int* tags,
                                void** mhandles, void** phandles, void** request) {
  return tcp_irecv_common(recvComm, n, data, (size_t)sizes[0], mhandles, request);
}
#else
static ncclResult_t tcp_isend_v(void* sendComm, void* data, msg_size_t size, int tag, void* mhandle,
                                void** request) {
  if ((long long)size < 0) return ncclInvalidArgument;
  return tcp_isend_common(sendComm, data, (size_t)size, mhandle, request);
}
static ncclResult_t tcp_irecv_v(void* recvComm, int n, void** data, msg_size_t* sizes, int* tags,
                                void** mhandles, void** request) {
  if ((long long)sizes[0] < 0) return ncclInvalidArgument;
  return tcp_irecv_common(recvComm, n, data, (size_t)sizes[0], mhandles, request);
}
#endif

#if V >= 9
static ncclResult_t tcp_make_vdevice(int* d, ncclNetVDeviceProps_t* props) {
  return ncclInvalidUsage;
}
#endif
#if V >= 11
static ncclResult_t tcp_finalize(void* ctx) {
  if (ctx != &context_token) return ncclInternalError;
  LOG(NCCL_LOG_INFO, "BraidTest: finalize");
  return ncclSuccess;
}
static ncclResult_t tcp_set_net_attr(void* ctx, void* netAttr) { return ncclSuccess; }
#endif

#define PASTE2(a, b) a##b
#define PASTE(a, b) PASTE2(a, b)
#define EXPORT_NAME PASTE(ncclNetPlugin_v, V)

test_net_t EXPORT_NAME = {
    .name = "BraidTest",
    .init = tcp_init_v,
    .devices = tcp_devices,
    .getProperties = tcp_get_properties,
    .listen = tcp_listen_v,
    .connect = tcp_connect_v,
    .accept = tcp_accept_v,
    .regMr = tcp_reg_mr_v,
    .regMrDmaBuf = tcp_reg_mr_dmabuf,
    .deregMr = tcp_dereg_mr,
    .isend = tcp_isend_v,
    .irecv = tcp_irecv_v,
    .iflush = tcp_iflush,
    .test = tcp_test,
    .closeSend = tcp_close_send,
    .closeRecv = tcp_close_recv,
    .closeListen = tcp_close_listen,
#if V >= 7
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
#endif
#if V >= 9
    .makeVDevice = tcp_make_vdevice,
#endif
#if V >= 11
    .finalize = tcp_finalize,
    .setNetAttr = tcp_set_net_attr,
#endif
};

/* BRAIDTEST_NET_NO_TEST=1: a table with a slot NCCL needs left empty, as a loader finds it. */
__attribute__((constructor)) static void drop_test_slot(void) {
  const char* drop = getenv("BRAIDTEST_NET_NO_TEST");
  if (drop && strcmp(drop, "1") == 0) EXPORT_NAME.test = NULL;
}

#if V >= 11
/*
 * A CollNet table (ncclCollNet_v11_t): name, init, devices, then getProperties ... finalize,
 * which no loader calls once devices() reports none.
 */
static ncclResult_t coll_init(void** ctx, uint64_t commId, ncclDebugLogger_t log) {
  return ncclSuccess;
}
static ncclResult_t coll_devices(int* ndev) {
  *ndev = 0;
  return ncclSuccess;
}
struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t log);
  ncclResult_t (*devices)(int* ndev);
  void* unused[16];
} ncclCollNetPlugin_v11 = {.name = "BraidTestColl", .init = coll_init, .devices = coll_devices};
#endif
