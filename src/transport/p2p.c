/*
 * P2P transport: the receiver's FIFO lives in its GPU's memory and the
 * sender's kernel writes into it directly over NVLink or PCIe.
 *
 * The FIFO is shared as transport/ipc.h says: between processes through cuMem
 * handles passed over a Unix socket (neither process needs to see the other's
 * GPU) or legacy CUDA IPC handles; inside one process (ncclCommInitAll, or
 * several GPUs per thread) the sender uses the pointer itself after enabling
 * peer access. Two ranks on one GPU (only under BRAID_TOPO_BUSID, for testing
 * on one GPU) connect the same way.
 * FIFO layout: transport.h's (counters, Simple, LL and LL128 slots).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cuda_runtime.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"
#include "graph/graph.h"
#include "transport/ipc.h"
#include "transport/transport.h"

struct p2p_info {
  struct ipc_desc fifo; /* the receiver's FIFO, as the sender maps it */
  size_t buff_bytes;
  size_t ll128_slot_bytes;
};

_Static_assert(sizeof(struct p2p_info) <= BRAID_CONN_INFO_BYTES, "p2p info must fit");

struct p2p_state {
  struct ipc_mem owned;  /* receiver: the FIFO it allocated */
  struct ipc_map opened; /* sender: its mapping of the receiver's FIFO */
};

/*
 * The farthest path over which GPUs talk peer to peer: NCCL_P2P_LEVEL, by
 * name (LOC, NVL, NVB, PIX, PXB, PHB, SYS) or NCCL's older numbers (0 LOC,
 * 1 PIX, 2 PXB, 3 PHB, 4 SYS). Unset: NVLink always, PCIe as far as switches
 * below one host bridge (PXB), as NCCL does on most hosts.
 */
static braid_path_type_t p2p_level(int* user_set) {
  static const struct { const char* name; braid_path_type_t type; } names[] = {
      {"LOC", BRAID_PATH_LOC}, {"NVL", BRAID_PATH_NVL}, {"NVB", BRAID_PATH_NVB},
      {"PIX", BRAID_PATH_PIX}, {"PXB", BRAID_PATH_PXB}, {"PHB", BRAID_PATH_PHB},
      {"SYS", BRAID_PATH_SYS}};
  static const braid_path_type_t numbers[] = {BRAID_PATH_LOC, BRAID_PATH_PIX, BRAID_PATH_PXB,
                                              BRAID_PATH_PHB, BRAID_PATH_SYS};
  const char* v = braid_param_str(BRAID_P_P2P_LEVEL);
  *user_set = 0;
  if (v == NULL || v[0] == '\0') return BRAID_PATH_PXB;
  for (size_t i = 0; i < BRAID_ARRAY_LEN(names); i++) {
    if (strcasecmp(v, names[i].name) == 0) {
      *user_set = 1;
      return names[i].type;
    }
  }
  char* end = NULL;
  long n = strtol(v, &end, 10);
  if (end != v && *end == '\0' && n >= 0) {
    *user_set = 1;
    return n < (long)BRAID_ARRAY_LEN(numbers) ? numbers[n] : BRAID_PATH_SYS;
  }
  static int warned;
  if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    WARN("NCCL_P2P_LEVEL=%s is not one of LOC, NVL, NVB, PIX, PXB, PHB, SYS (or 0-4); using the "
         "default (NVLink, and PCIe up to PXB)", v);
  return BRAID_PATH_PXB;
}

/* The local CUDA device index of a GPU, or -1 when it is not visible in this process. */
static int p2p_local_device(int64_t bus_id) {
  char busid[32];
  int dev = -1;
  braid_busid_to_str(bus_id, busid, sizeof busid);
  if (cudaDeviceGetByPCIBusId(&dev, busid) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return dev;
}

/*
 * P2P needs the two GPUs close enough (the topology's path, which both ranks
 * compute alike from the physical machine, whatever CUDA_VISIBLE_DEVICES
 * shows) and a way to share their memory (ipc_choose, from what both sent at
 * init). Inside one process CUDA must also allow peer access.
 */
/* The topology part: same host, GPUs close enough for NCCL_P2P_LEVEL; `quiet`: no INFO. */
static int p2p_close(const struct braid_transport_comm* comm, const struct braid_peer_info* me,
                     const struct braid_peer_info* peer, int quiet) {
  if (braid_param_int(BRAID_P_P2P_DISABLE)) return 0;
  if (me->host_hash != peer->host_hash) return 0;
  if (me->dev_bus_id == peer->dev_bus_id) return 1; /* ranks sharing one GPU (BRAID_TOPO_BUSID) */
  int user_set = 0;
  braid_path_type_t level = p2p_level(&user_set);
  braid_path_type_t path = comm->topo ? topo_path(comm->topo, me->rank, peer->rank, NULL)
                                      : BRAID_PATH_SYS;
  /* NVLink is always close enough unless the user asks for less. */
  int near = path <= level || (!user_set && (path == BRAID_PATH_NVL || path == BRAID_PATH_NVB));
  if (!near && !quiet)
    INFO(BRAID_LOG_INIT | BRAID_LOG_P2P, "no P2P between ranks %d and %d: their GPUs are %s "
         "apart, farther than NCCL_P2P_LEVEL (%s)", me->rank, peer->rank,
         topo_path_type_name(path), topo_path_type_name(level));
  return near;
}

int p2p_pair_close(const struct braid_transport_comm* comm, int a, int b) {
  return p2p_close(comm, &comm->peers[a], &comm->peers[b], 1);
}

static ncclResult_t p2p_can_connect(const struct braid_transport_comm* comm, const struct braid_peer_info* me,
                                    const struct braid_peer_info* peer, int* ok) {
  char why[512] = "";
  *ok = 0;
  if (!p2p_close(comm, me, peer, 0)) return ncclSuccess;
  int same_gpu = me->dev_bus_id == peer->dev_bus_id;
  ipc_kind_t kind = ipc_choose(me, peer, why, sizeof why);
  if (kind == IPC_NONE) {
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
      WARN("no P2P between ranks %d and %d although their GPUs are close: %s. They go through "
           "host memory (SHM) instead, several times slower over NVLink", me->rank, peer->rank,
           why);
    return ncclSuccess;
  }
  if (kind == IPC_LOCAL && !same_gpu) {
    int a = p2p_local_device(me->dev_bus_id), b = p2p_local_device(peer->dev_bus_id);
    int ab = 0, ba = 0;
    if (a < 0 || b < 0 || cudaDeviceCanAccessPeer(&ab, a, b) != cudaSuccess ||
        cudaDeviceCanAccessPeer(&ba, b, a) != cudaSuccess) {
      (void)cudaGetLastError();
      return ncclSuccess;
    }
    if (!ab || !ba) return ncclSuccess; /* both ends compute this, in the same process */
  }
  *ok = 1;
  return ncclSuccess;
}

static ncclResult_t p2p_state_new(struct braid_connector* conn) {
  ncclResult_t res = BRAID_CALLOC((struct p2p_state**)&conn->state, 1, "p2p connection");
  if (res == ncclSuccess) ((struct p2p_state*)conn->state)->owned.fd = -1;
  return res;
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
  char why[512];
  size_t bytes = transport_fifo_bytes(conn, 1);
  ipc_kind_t kind = ipc_choose(&comm->peers[conn->peer], &comm->peers[comm->rank], why, sizeof why);
  BRAID_TRY(p2p_state_new(conn));
  st = conn->state;
  BRAID_CHECK(kind != IPC_NONE, ncclInternalError, "p2p to rank %d chosen but %s", conn->peer, why);
  /* Zeroed before the info goes out (ipc_mem_alloc): the sender's kernel may write its first
   * steps as soon as it maps the FIFO, and a late zeroing would erase them. */
  BRAID_TRY(ipc_mem_alloc(kind, comm->rank, bytes, &st->owned, &pi->fifo));
  pi->buff_bytes = conn->buff_bytes;
  pi->ll128_slot_bytes = transport_ll128_slot_bytes();
  INFO(BRAID_LOG_ALLOC, "p2p FIFO for channel %d from rank %d: %zu bytes at %p (%s)", conn->channel,
       conn->peer, st->owned.bytes, st->owned.ptr, ipc_kind_name(kind));
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
  BRAID_TRY(ipc_mem_map(&pi->fifo, comm->rank, comm->abort_flag, &st->opened));
  base = st->opened.ptr;
  transport_fifo_fill_dev(conn, base, 1);
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t p2p_recv_connect(const struct braid_transport_comm* comm, struct braid_connector* conn,
                                     const struct braid_conn_info* peer_info) {
  struct p2p_state* st = conn->state;
  transport_fifo_fill_dev(conn, st->owned.ptr, 1);
  return ncclSuccess;
}

static ncclResult_t p2p_free(struct braid_connector* conn) {
  struct p2p_state* st = conn->state;
  if (st == NULL) return ncclSuccess;
  if (conn->kept != NULL) {
    /* Kernels may still run: freeing or unmapping would wait for them. Both stay, and so does
       the export's descriptor (the memory's handle). */
    *conn->kept += st->owned.ptr ? st->owned.bytes : 0;
  } else {
    ipc_mem_unmap(&st->opened);
    ipc_mem_free(&st->owned);
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
