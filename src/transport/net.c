/*
 * NET transport: connections between ranks on different hosts, carried by
 * the proxy thread over a net backend (net.h). The kernels see an ordinary
 * FIFO (dev_comm.h) on their own host; the proxies are the peers:
 *
 *   sender's kernel -> sender's FIFO -> sender's proxy -> network ->
 *   receiver's proxy -> receiver's FIFO -> receiver's kernel
 *
 * Each end owns its FIFO: counters (tail, head) and per-slot sizes in
 * pinned host memory mapped into the GPU (cudaHostAllocMapped), where the
 * kernel's ld.acquire.sys / st.release.sys and the proxy's C11 atomics meet;
 * the slots in the same host memory, or in GPU memory when GPUDirect RDMA
 * pays (a backend that reaches GPU memory: IB, OFI with FI_HMEM, a plugin
 * that says so; GPU and NIC no farther apart than BRAID_NET_GDR_LEVEL).
 *
 * Setup: the receiver listens (recv_setup) and sends the handle through the
 * bootstrap; the sender hands the handle to its proxy (send_connect), which
 * connects while the receiver's proxy accepts, so no rank ever blocks on a
 * peer that has not reached its connect phase. Both present the job's
 * secret (bootstrap_secret) as the backend's key.
 *
 * A failure on a connection (peer died, connect timed out) becomes the
 * communicator's async error and raises its abort flag, so kernels waiting
 * on the connection return instead of hanging.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include "bootstrap/bootstrap.h"
#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "transport/proxy.h"
#include "base/utils.h"
#include "graph/graph.h"
#include "transport/net.h"
#include "transport/transport.h"

#define NET_INFO_MAGIC 0x5445454eu /* "NEET" */
#define NET_TAIL_OFFSET 0
#define NET_HEAD_OFFSET 128
#define NET_SIZES_OFFSET 256
#define NET_BUFF_OFFSET 4096 /* page-aligned slots register well with every backend */
#define NET_DRAIN_SEC 10.0   /* how long a closing sender waits for its last steps to leave */

struct net_info {
  uint32_t magic;
  int32_t gdr;         /* receiver: slots in GPU memory (informational) */
  uint64_t slot_bytes;
  char backend[16];
  uint8_t handle[BRAID_NET_HANDLE_BYTES] __attribute__((aligned(8)));
};
_Static_assert(sizeof(struct net_info) <= BRAID_CONN_INFO_BYTES, "net info must fit");

struct net_state {
  const struct braid_transport_comm* comm;
  const struct braid_net_ops* net;
  int dev;
  int gdr;                       /* slots in GPU memory */
  char* host;                    /* pinned, mapped: counters, sizes (and slots without GDR) */
  size_t host_bytes;
  char* gpu_slots;               /* GDR: cudaMalloc'ed slots */
  int dmabuf_fd;                 /* GDR through dma-buf: the slots' export, else -1 */
  void* listen_comm;             /* receiver, until the proxy takes it */
  struct braid_proxy* proxy;
  struct braid_proxy_conn* pconn;
};

/* ------------------------------------------------ GPU-specific memory */

/* Pinned host memory the GPU can address; *dev is its device address. */
static ncclResult_t net_host_alloc(size_t bytes, char** host, char** dev) {
  ncclResult_t res = ncclSuccess;
  *host = NULL;
  BRAID_CUDA_TRY(cudaHostAlloc((void**)host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  memset(*host, 0, bytes);
  BRAID_CUDA_TRY(cudaHostGetDevicePointer((void**)dev, *host, 0));
  return ncclSuccess;
fail:
  if (*host) cudaFreeHost(*host);
  *host = NULL;
  return res;
}

/* A dma-buf of GPU memory for the NIC, or -1 when the driver cannot export one. */
static int net_dmabuf_export(void* ptr, size_t bytes) {
  typedef CUresult (*get_handle_fn)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
  get_handle_fn get_handle = (get_handle_fn)braid_driver_fn("cuMemGetHandleForAddressRange");
  int fd = -1;
  if (get_handle == NULL) return -1;
  if (get_handle(&fd, (CUdeviceptr)ptr, bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) != CUDA_SUCCESS)
    return -1;
  return fd;
}

/* ----------------------------------------------------------- choices */

static ncclResult_t net_can_connect(const struct braid_transport_comm* comm, const struct braid_peer_info* me,
                                    const struct braid_peer_info* peer, int* ok) {
  *ok = me->host_hash != peer->host_hash;
  return ncclSuccess;
}

/* The backend device for `channel`: the NIC the topology routes it through, else round robin. */
static int net_pick_dev(const struct braid_transport_comm* comm, const struct braid_net_ops* net, int ndev, int channel) {
  const char* want = NULL;
  if (topo_channel_net(comm->topo, channel, comm->rank, &want) >= 0 && want) {
    for (int d = 0; d < ndev; d++) {
      struct braid_net_props props;
      char name[sizeof props.name];
      if (net->get_properties(d, &props) != ncclSuccess) continue;
      net_topo_name(props.name, strcmp(net->name, "IB") == 0, name, sizeof name);
      if (strcmp(name, want) == 0) return d;
    }
  }
  return channel % ndev;
}

static braid_path_type_t net_gdr_level(void) {
  static const char* const names[] = {"LOC", "NVL", "NVB", "PIX", "PXB", "PHB", "SYS"};
  const char* text = braid_param_str(BRAID_P_NET_GDR_LEVEL);
  for (int i = 0; text && i < (int)BRAID_ARRAY_LEN(names); i++)
    if (strcasecmp(text, names[i]) == 0) return (braid_path_type_t)i;
  return BRAID_PATH_PIX;
}

/* Whether the slots go to GPU memory; logged once per GPU/NIC pair with the reason. */
static int net_gdr_decide(const struct braid_transport_comm* comm, struct net_state* st) {
  static unsigned char logged[64][BRAID_NET_MAX_DEVS];
  struct braid_net_props props;
  char why[192];
  int use = 0;
  if (st->net->get_properties(st->dev, &props) != ncclSuccess) return 0;
  char name[sizeof props.name];
  net_topo_name(props.name, strcmp(st->net->name, "IB") == 0, name, sizeof name);
  snprintf(props.name, sizeof props.name, "%s", name);
  if (!(props.ptr_support & (BRAID_NET_PTR_CUDA | BRAID_NET_PTR_DMABUF))) {
    snprintf(why, sizeof why, "NET/%s cannot reach GPU memory", st->net->name);
  } else {
    float bw = 0;
    braid_path_type_t path = topo_net_path(comm->topo, comm->rank, props.name, &bw);
    braid_path_type_t level = net_gdr_level();
    use = path <= level;
    snprintf(why, sizeof why, "path %s, BRAID_NET_GDR_LEVEL %s", topo_path_type_name(path),
             topo_path_type_name(level));
  }
  int d = comm->cuda_dev & 63;
  if (!logged[d][st->dev]) {
    logged[d][st->dev] = 1;
    INFO(BRAID_LOG_INIT, "NET/%s: GPU %d / NIC %s: GPUDirect RDMA %s (%s)%s", st->net->name,
         comm->cuda_dev, props.name, use ? "on" : "off", why, use ? "" : "; staging through host memory");
  }
  return use;
}

/* ------------------------------------------------------------ setup */

static ncclResult_t net_state_new(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                  struct net_state** out) {
  ncclResult_t res = ncclSuccess;
  struct net_state* st = NULL;
  int ndev = 0;
  BRAID_TRY(BRAID_CALLOC(&st, 1, "a net connection"));
  conn->state = st; /* from here, net_free releases whatever was made */
  st->comm = comm;
  st->dmabuf_fd = -1;
  BRAID_TRY(net_backend_select(&st->net, &ndev));
  st->dev = net_pick_dev(comm, st->net, ndev, conn->channel);
  *out = st;
  return ncclSuccess;
fail:
  return res;
}

/*
 * GPU memory for the slots when GPUDirect RDMA was chosen: exported as a
 * dma-buf when the backend takes one, else registered through peer memory.
 * When neither can work the connection falls back to host staging (st->gdr = 0).
 */
static ncclResult_t net_gpu_slots(struct braid_connector* conn, struct net_state* st) {
  ncclResult_t res = ncclSuccess;
  struct braid_net_props props;
  BRAID_TRY(st->net->get_properties(st->dev, &props));
  BRAID_CUDA_TRY(cudaMalloc((void**)&st->gpu_slots, conn->buff_bytes));
  if (props.ptr_support & BRAID_NET_PTR_DMABUF) st->dmabuf_fd = net_dmabuf_export(st->gpu_slots, conn->buff_bytes);
  if (st->dmabuf_fd < 0 && !(props.ptr_support & BRAID_NET_PTR_CUDA)) {
    INFO(BRAID_LOG_NET, "NET/%s: GPU %d cannot export its memory as a dma-buf and %s has no peer "
         "memory: staging through host memory", st->net->name, st->comm->cuda_dev, props.name);
    cudaFree(st->gpu_slots);
    st->gpu_slots = NULL;
    st->gdr = 0;
  }
  return ncclSuccess;
fail:
  return res;
}

/* The FIFO of this end: host counters (and host slots, or GPU slots with GDR); fills conn->dev. */
static ncclResult_t net_fifo_make(struct braid_connector* conn, struct net_state* st) {
  ncclResult_t res = ncclSuccess;
  char* dev = NULL;
  if (st->gdr) BRAID_TRY(net_gpu_slots(conn, st));
  st->host_bytes = NET_BUFF_OFFSET + (st->gdr ? 0 : conn->buff_bytes);
  BRAID_TRY(net_host_alloc(st->host_bytes, &st->host, &dev));
  conn->dev.tail = (uint64_t*)(dev + NET_TAIL_OFFSET);
  conn->dev.head = (uint64_t*)(dev + NET_HEAD_OFFSET);
  conn->dev.sizes = (uint32_t*)(dev + NET_SIZES_OFFSET);
  conn->dev.buff = st->gdr ? st->gpu_slots : dev + NET_BUFF_OFFSET;
  conn->dev.slot_bytes = (uint32_t)(conn->buff_bytes / BRAID_STEPS);
  conn->dev.step = 0;
  conn->dev.seen_head = 0;
  return ncclSuccess;
fail:
  return res;
}

static void net_info_fill(struct net_info* ni, const struct net_state* st,
                          const struct braid_connector* conn) {
  ni->magic = NET_INFO_MAGIC;
  ni->gdr = st->gdr;
  ni->slot_bytes = conn->dev.slot_bytes;
  snprintf(ni->backend, sizeof ni->backend, "%s", st->net->name);
}

static ncclResult_t net_send_setup(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                   struct braid_conn_info* info) {
  ncclResult_t res = ncclSuccess;
  struct net_state* st = NULL;
  BRAID_TRY(net_state_new(comm, conn, &st));
  st->gdr = net_gdr_decide(comm, st);
  BRAID_TRY(net_fifo_make(conn, st));
  net_info_fill((struct net_info*)info->data, st, conn);
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t net_recv_setup(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                   struct braid_conn_info* info) {
  ncclResult_t res = ncclSuccess;
  struct net_info* ni = (struct net_info*)info->data;
  struct net_state* st = NULL;
  BRAID_TRY(net_state_new(comm, conn, &st));
  st->gdr = net_gdr_decide(comm, st);
  BRAID_TRY(net_fifo_make(conn, st));
  BRAID_TRY(st->net->listen(st->dev, bootstrap_secret(comm->bootstrap), ni->handle, &st->listen_comm));
  net_info_fill(ni, st, conn);
  return ncclSuccess;
fail:
  return res;
}

/* ---------------------------------------------------------- connect */

/* The proxy's report of a failed connection: the comm fails and its kernels stop waiting. */
static void net_on_error(void* arg, ncclResult_t res) {
  const struct braid_transport_comm* comm = arg;
  comm->fail(comm->owner, res); /* the proxy's message, for ncclGetLastError(comm) */
}

static ncclResult_t net_info_check(const struct braid_transport_comm* comm, const struct braid_connector* conn,
                                   const struct net_info* ni, const struct net_state* st) {
  ncclResult_t res = ncclSuccess;
  BRAID_CHECK(ni->magic == NET_INFO_MAGIC, ncclInternalError,
              "malformed net connection info from rank %d", conn->peer);
  BRAID_CHECK(strncmp(ni->backend, st->net->name, sizeof ni->backend) == 0, ncclInvalidUsage,
              "rank %d (%s) uses network backend %.16s but rank %d uses %s; set the same "
              "BRAID_NET/NCCL_NET on every rank", conn->peer, comm->peers[conn->peer].hostname,
              ni->backend, comm->rank, st->net->name);
  BRAID_CHECK(ni->slot_bytes == conn->dev.slot_bytes, ncclInvalidUsage,
              "rank %d uses %llu-byte net FIFO slots but rank %d uses %u; set the same "
              "BRAID_BUFFSIZE on every rank", conn->peer, (unsigned long long)ni->slot_bytes,
              comm->rank, conn->dev.slot_bytes);
  return ncclSuccess;
fail:
  return res;
}

/* Hands the connection to the proxy of this GPU, which connects (send) or accepts (receive). */
static ncclResult_t net_proxy_start(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                    struct net_state* st, const struct net_info* ni) {
  ncclResult_t res = ncclSuccess;
  struct braid_proxy_conn_desc d;
  memset(&d, 0, sizeof d);
  d.is_send = conn->is_send;
  d.net = st->net;
  d.dev = st->dev;
  memcpy(d.key, bootstrap_secret(comm->bootstrap), BRAID_NET_KEY_BYTES);
  if (conn->is_send) memcpy(d.handle, ni->handle, sizeof d.handle);
  d.fifo.buff = st->gdr ? st->gpu_slots : st->host + NET_BUFF_OFFSET;
  d.fifo.tail = (_Atomic uint64_t*)(st->host + NET_TAIL_OFFSET);
  d.fifo.head = (_Atomic uint64_t*)(st->host + NET_HEAD_OFFSET);
  /* The sending kernel publishes each step's bytes (prims_simple.h), so a small
     operation puts only its bytes on the wire; the receiving proxy records them. */
  d.fifo.sizes = (_Atomic uint32_t*)(st->host + NET_SIZES_OFFSET);
  d.fifo.slot_bytes = conn->dev.slot_bytes;
  d.fifo.nsteps = BRAID_STEPS;
  d.buff_is_cuda = st->gdr;
  d.dmabuf_fd = st->dmabuf_fd;
  d.connect_timeout = (double)braid_param_int(BRAID_P_BOOTSTRAP_TIMEOUT);
  snprintf(d.peer, sizeof d.peer, "rank %d (%s) channel %d", conn->peer,
           comm->peers[conn->peer].hostname, conn->channel);
  d.on_error = net_on_error;
  d.error_arg = (void*)comm;
  d.abort_flag = comm->abort_flag;
  d.events = comm->proxy_events;
  d.events_ctx = comm->proxy_events_ctx;
  d.peer_rank = conn->peer;
  d.channel = conn->channel;
  BRAID_TRY(proxy_acquire(comm->cuda_dev, comm->peers[comm->rank].dev_bus_id, &st->proxy));
  d.listen_comm = st->listen_comm;
  BRAID_TRY(proxy_conn_add(st->proxy, &d, &st->pconn));
  st->listen_comm = NULL; /* the proxy owns the listener now */
  return ncclSuccess;
fail:
  return res;
}

/*
 * Both ends connect the same way: check the peer's info, then hand the
 * connection to the proxy, which connects (send) or accepts (receive).
 */
static ncclResult_t net_connect(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                const struct braid_conn_info* peer_info) {
  ncclResult_t res = ncclSuccess;
  const struct net_info* ni = (const struct net_info*)peer_info->data;
  struct net_state* st = conn->state;
  BRAID_TRY(net_info_check(comm, conn, ni, st));
  BRAID_TRY(net_proxy_start(comm, conn, st, ni));
  return ncclSuccess;
fail:
  return res;
}

/*
 * A kernel that finished may have left its last steps in the sender's FIFO,
 * not yet on the wire: give the proxy the time to send them before the
 * connection goes (not when aborting, nor on a connection that failed).
 */
static void net_send_drain(struct braid_connector* conn, struct net_state* st) {
  const uint64_t* tail = (const uint64_t*)(st->host + NET_TAIL_OFFSET);
  double end = braid_time_sec() + NET_DRAIN_SEC;
  while (proxy_conn_steps(st->pconn) < __atomic_load_n(tail, __ATOMIC_ACQUIRE)) {
    volatile uint32_t* abort = st->comm->abort_flag;
    if ((abort && __atomic_load_n(abort, __ATOMIC_RELAXED)) || proxy_conn_state(st->pconn, NULL) < 0)
      return;
    if (braid_time_sec() > end) {
      WARN("NET: %llu steps to rank %d (channel %d) were still unsent after %.0f s; dropping them",
           (unsigned long long)(__atomic_load_n(tail, __ATOMIC_ACQUIRE) - proxy_conn_steps(st->pconn)),
           conn->peer, conn->channel, NET_DRAIN_SEC);
      return;
    }
    usleep(50);
  }
}

static ncclResult_t net_free(struct braid_connector* conn) {
  struct net_state* st = conn->state;
  if (st == NULL) return ncclSuccess;
  if (st->pconn && conn->is_send && conn->kept == NULL) net_send_drain(conn, st);
  if (st->pconn) proxy_conn_remove(st->proxy, st->pconn);
  if (st->proxy) proxy_release(st->proxy);
  if (st->listen_comm) st->net->close_listen(st->listen_comm);
  if (st->dmabuf_fd >= 0) close(st->dmabuf_fd);
  if (conn->kept != NULL) {
    /* Kernels may still run (the proxy is stopped): cudaFree and cudaFreeHost would wait for
       them. Both FIFOs stay. */
    *conn->kept += (st->gpu_slots ? conn->buff_bytes : 0) + (st->host ? st->host_bytes : 0);
  } else {
    if (st->gpu_slots && cudaFree(st->gpu_slots) != cudaSuccess)
      WARN("cudaFree of a net FIFO failed: %s", cudaGetErrorString(cudaGetLastError()));
    if (st->host && cudaFreeHost(st->host) != cudaSuccess)
      WARN("cudaFreeHost of a net FIFO failed: %s", cudaGetErrorString(cudaGetLastError()));
  }
  free(st);
  conn->state = NULL;
  return ncclSuccess;
}

const struct braid_transport_ops braid_transport_net = {
  .size = sizeof(struct braid_transport_ops),
  .name = "NET",
  .can_connect = net_can_connect,
  .send_setup = net_send_setup,
  .recv_setup = net_recv_setup,
  .send_connect = net_connect,
  .recv_connect = net_connect,
  .free = net_free,
};
