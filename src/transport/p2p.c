/*
 * P2P transport: the receiver's FIFO lives in its GPU's memory and the
 * sender's kernel writes into it directly over NVLink or PCIe.
 *
 * Between processes the FIFO is exported with a CUDA IPC handle and opened
 * by the sender; inside one process (ncclCommInitAll, or several GPUs per
 * thread) the sender uses the pointer itself after enabling peer access.
 * Two ranks on one GPU (only under BRAID_TOPO_BUSID, for testing on one GPU)
 * connect the same way, without peer access.
 * FIFO layout: transport.h's (counters, Simple, LL and LL128 slots).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "transport/transport.h"

struct p2p_info {
  uint64_t pid_hash;  /* the owner's process */
  int cuda_dev;       /* the owner's device, as numbered in its process */
  void* ptr;          /* valid in the owner's process */
  cudaIpcMemHandle_t handle;
  size_t buff_bytes;
  size_t ll128_slot_bytes;
};

_Static_assert(sizeof(struct p2p_info) <= BRAID_CONN_INFO_BYTES, "p2p info must fit");

struct p2p_state {
  void* owned;   /* receiver: the FIFO it allocated */
  void* opened;  /* sender: an IPC mapping to close */
};

/* The local CUDA device index of a peer's GPU, or -1 when it is not visible here. */
static int p2p_local_device(const struct braid_peer_info* peer) {
  char busid[32];
  int dev = -1;
  braid_busid_to_str(peer->dev_bus_id, busid, sizeof busid);
  if (cudaDeviceGetByPCIBusId(&dev, busid) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return dev;
}

static ncclResult_t p2p_can_connect(const struct braid_transport_comm* comm, const struct braid_peer_info* me,
                                    const struct braid_peer_info* peer, int* ok) {
  *ok = 0;
  if (braid_param_int(BRAID_P_P2P_DISABLE)) return ncclSuccess;
  if (me->host_hash != peer->host_hash) return ncclSuccess;
  int a = p2p_local_device(me), b = p2p_local_device(peer);
  if (a < 0 || b < 0) return ncclSuccess;
  if (a == b) { /* ranks sharing one GPU (BRAID_TOPO_BUSID): its own memory, no peer access */
    *ok = 1;
    return ncclSuccess;
  }
  int ab = 0, ba = 0;
  if (cudaDeviceCanAccessPeer(&ab, a, b) != cudaSuccess ||
      cudaDeviceCanAccessPeer(&ba, b, a) != cudaSuccess) {
    (void)cudaGetLastError();
    return ncclSuccess;
  }
  *ok = ab && ba; /* both ends must reach the same verdict */
  return ncclSuccess;
}

static ncclResult_t p2p_state_new(struct braid_connector* conn) {
  return BRAID_CALLOC((struct p2p_state**)&conn->state, 1, "p2p connection");
}

static ncclResult_t p2p_send_setup(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                   struct braid_conn_info* info) {
  return p2p_state_new(conn);
}

static ncclResult_t p2p_recv_setup(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                   struct braid_conn_info* info) {
  ncclResult_t res = ncclSuccess;
  struct p2p_info* pi = (struct p2p_info*)info->data;
  struct p2p_state* st;
  size_t bytes = transport_fifo_bytes(conn, 1);
  BRAID_TRY(p2p_state_new(conn));
  st = conn->state;
  BRAID_CUDA_TRY(cudaMalloc(&st->owned, bytes));
  /*
   * Zero before the handle goes out: the sender's kernel may write its first steps as soon as
   * it has it, and a late zeroing would erase them (its counters too: a hang); this rank's own
   * kernels must not read a freed FIFO's counters either.
   */
  BRAID_TRY(braid_cuda_zero(st->owned, bytes));
  pi->pid_hash = comm->peers[comm->rank].pid_hash;
  pi->cuda_dev = comm->cuda_dev;
  pi->ptr = st->owned;
  pi->buff_bytes = conn->buff_bytes;
  pi->ll128_slot_bytes = transport_ll128_slot_bytes();
  BRAID_CUDA_TRY(cudaIpcGetMemHandle(&pi->handle, st->owned));
  INFO(BRAID_LOG_ALLOC, "p2p FIFO for channel %d from rank %d: %zu bytes at %p", conn->channel,
       conn->peer, bytes, st->owned);
  return ncclSuccess;
fail:
  return res;
}

/*
 * Lets this thread's current device reach `peer_dev`. Peer access is a
 * process-wide property of a device pair; the pairs this process enabled are
 * remembered, so the call is made once per pair (asking again returns an
 * error, which tools like compute-sanitizer report even when it is expected).
 */
#define P2P_MAX_DEVS 64
static pthread_mutex_t p2p_peer_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t p2p_peer_enabled[P2P_MAX_DEVS]; /* bit p of [d]: d reaches p */

static ncclResult_t p2p_enable_peer_access(int peer_dev) {
  ncclResult_t res = ncclSuccess;
  int dev = -1;
  BRAID_CUDA_TRY(cudaGetDevice(&dev));
  int known = dev >= 0 && dev < P2P_MAX_DEVS && peer_dev >= 0 && peer_dev < P2P_MAX_DEVS;
  pthread_mutex_lock(&p2p_peer_lock);
  if (!known || !(p2p_peer_enabled[dev] >> peer_dev & 1)) {
    cudaError_t err = cudaDeviceEnablePeerAccess(peer_dev, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError(); /* enabled by the application itself */
      err = cudaSuccess;
    }
    if (err == cudaSuccess && known) p2p_peer_enabled[dev] |= 1ull << peer_dev;
    pthread_mutex_unlock(&p2p_peer_lock);
    BRAID_CUDA_TRY(err);
    return ncclSuccess;
  }
  pthread_mutex_unlock(&p2p_peer_lock);
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t p2p_send_connect(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                     const struct braid_conn_info* peer_info) {
  ncclResult_t res = ncclSuccess;
  const struct p2p_info* pi = (const struct p2p_info*)peer_info->data;
  struct p2p_state* st = conn->state;
  char* base;
  BRAID_CHECK(pi->buff_bytes == conn->buff_bytes, ncclInternalError,
              "p2p FIFO size mismatch with rank %d: %zu vs %zu bytes", conn->peer, pi->buff_bytes,
              conn->buff_bytes);
  BRAID_CHECK(pi->ll128_slot_bytes == transport_ll128_slot_bytes(), ncclInvalidUsage,
              "rank %d uses %zu-byte LL128 slots but rank %d uses %zu; set the same "
              "BRAID_LL128_BUFFSIZE (NCCL_LL128_BUFFSIZE) on every rank",
              conn->peer, pi->ll128_slot_bytes, comm->rank, transport_ll128_slot_bytes());
  if (pi->pid_hash == comm->peers[comm->rank].pid_hash) {
    if (pi->cuda_dev != comm->cuda_dev) BRAID_TRY(p2p_enable_peer_access(pi->cuda_dev));
    base = pi->ptr;
  } else {
    cudaError_t err = cudaIpcOpenMemHandle(&st->opened, pi->handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      res = braid_err(ncclUnhandledCudaError,
                      "rank %d cannot map rank %d's GPU buffer (cudaIpcOpenMemHandle: %s). Both "
                      "processes must see both GPUs (check CUDA_VISIBLE_DEVICES), or set "
                      "BRAID_P2P_DISABLE=1 to go through host memory",
                      comm->rank, conn->peer, cudaGetErrorString(err));
      goto fail;
    }
    base = st->opened;
  }
  transport_fifo_fill_dev(conn, base, 1);
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t p2p_recv_connect(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                     const struct braid_conn_info* peer_info) {
  struct p2p_state* st = conn->state;
  transport_fifo_fill_dev(conn, st->owned, 1);
  return ncclSuccess;
}

static ncclResult_t p2p_free(struct braid_connector* conn) {
  struct p2p_state* st = conn->state;
  if (st == NULL) return ncclSuccess;
  if (st->opened && cudaIpcCloseMemHandle(st->opened) != cudaSuccess) {
    WARN("cudaIpcCloseMemHandle failed for rank %d's buffer: %s", conn->peer,
         cudaGetErrorString(cudaGetLastError()));
  }
  if (st->owned && cudaFree(st->owned) != cudaSuccess) {
    WARN("cudaFree of a p2p FIFO failed: %s", cudaGetErrorString(cudaGetLastError()));
  }
  free(st);
  conn->state = NULL;
  return ncclSuccess;
}

const struct braid_transport_ops braid_transport_p2p = {
  .size = sizeof(struct braid_transport_ops),
  .name = "P2P",
  .can_connect = p2p_can_connect,
  .send_setup = p2p_send_setup,
  .recv_setup = p2p_recv_setup,
  .send_connect = p2p_send_connect,
  .recv_connect = p2p_recv_connect,
  .free = p2p_free,
};
