/*
 * What every transport shares: the choice of transport for a pair of ranks,
 * and the FIFO layout and sizes of the transports whose receiver owns plain
 * memory (p2p, shm).
 */
#include "transport/transport.h"

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"
#include "base/utils.h"

/* In order of preference; NET, the last, only connects ranks on different hosts. */
static const struct braid_transport_ops* const transports[] = {
    &braid_transport_p2p, &braid_transport_shm, &braid_transport_net};

ncclResult_t transport_select(const struct braid_transport_comm* comm, int peer,
                              const struct braid_transport_ops** out) {
  const struct braid_peer_info* me = &comm->peers[comm->rank];
  const struct braid_peer_info* other = &comm->peers[peer];
  for (size_t i = 0; i < BRAID_ARRAY_LEN(transports); i++) {
    int ok = 0;
    ncclResult_t res = transports[i]->can_connect(comm, me, other, &ok);
    if (res != ncclSuccess) return res;
    if (ok) {
      *out = transports[i];
      return ncclSuccess;
    }
  }
  /*
   * Two GPUs of one host that neither P2P nor shared memory can join (both disabled, or
   * processes without a common /dev/shm) talk through the network transport, over the host's
   * own interfaces, as NCCL does.
   */
  int p2p_off = braid_param_int(BRAID_P_P2P_DISABLE) != 0;
  int shm_off = braid_param_int(BRAID_P_SHM_DISABLE) != 0;
  if (me->host_hash == other->host_hash) {
    static int told;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
      INFO(BRAID_LOG_INIT | BRAID_LOG_NET,
           "ranks %d and %d share host %s but P2P is %s and shared memory is %s: they connect "
           "through the network transport",
           comm->rank, peer, me->hostname, p2p_off ? "disabled" : "not possible",
           shm_off ? "disabled" : "not possible (different /dev/shm)");
    *out = &braid_transport_net;
    return ncclSuccess;
  }
  return braid_err(ncclInternalError, "no transport between rank %d and rank %d (hosts %s and %s)",
                   comm->rank, peer, me->hostname, other->hostname);
}

void transport_fifo_fill_dev(struct braid_connector* conn, char* base, int ll128) {
  conn->dev.tail = (uint64_t*)(base + BRAID_FIFO_TAIL_OFFSET);
  conn->dev.head = (uint64_t*)(base + BRAID_FIFO_HEAD_OFFSET);
  conn->dev.buff = base + BRAID_FIFO_BUFF_OFFSET;
  conn->dev.slot_bytes = (uint32_t)(conn->buff_bytes / BRAID_STEPS);
  conn->dev.ll_buff = base + BRAID_FIFO_BUFF_OFFSET + conn->buff_bytes;
  conn->dev.ll_slot_bytes = BRAID_LL_SLOT_BYTES;
  conn->dev.ll128_buff = ll128 ? conn->dev.ll_buff + BRAID_LL_BYTES : NULL;
  conn->dev.ll128_slot_bytes = ll128 ? (uint32_t)transport_ll128_slot_bytes() : 0;
  conn->dev.step = 0;
  conn->dev.seen_head = 0;
}

size_t transport_buff_bytes(braid_param_id_t id) {
  int64_t bytes = braid_param_int(id);
  int64_t min_bytes = BRAID_STEPS * 4096;
  if (bytes < min_bytes) bytes = min_bytes;
  return (size_t)BRAID_ALIGN_UP(bytes, BRAID_STEPS * 128);
}

size_t transport_ll128_slot_bytes(void) {
  int64_t slot = braid_param_int(BRAID_P_LL128_BUFFSIZE) / BRAID_STEPS;
  slot = BRAID_MAX(slot, (int64_t)4 << 10);
  slot = BRAID_MIN(slot, (int64_t)4 << 20);
  return (size_t)slot / BRAID_LL128_LINE_BYTES * BRAID_LL128_LINE_BYTES;
}

uint32_t transport_p2p_slot_bytes(void) {
  return (uint32_t)(transport_buff_bytes(BRAID_P_P2P_BUFFSIZE) / BRAID_STEPS);
}
