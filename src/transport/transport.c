/*
 * Connection setup common to every transport: choosing the transport for a
 * pair of ranks, the two-phase exchange of connection infos through the
 * bootstrap (set up and send everything first, then receive and connect, so
 * a thread driving several communicators never waits on itself), the ring
 * connections made at init and the send/recv connections made the first
 * time a group needs them.
 */
#include "transport/transport.h"

#include <stdlib.h>
#include <string.h>

#include "core/bootstrap.h"
#include "core/comm.h"
#include "core/debug.h"
#include "core/dev_state.h"
#include "core/param.h"
#include "core/utils.h"
#include "graph/graph.h"

/* Bootstrap tags: kind in the high bits, channel in the low ones. */
enum { TAG_RING_SEND_INFO = 1, TAG_RING_RECV_INFO = 2, TAG_P2P_SEND_INFO = 3, TAG_P2P_RECV_INFO = 4 };
#define CONN_TAG(kind, channel) (0x40000000 | ((kind) << 16) | (channel))

/* In order of preference; NET, the last, only connects ranks on different hosts. */
static const struct braid_transport_ops* const transports[] = {
    &braid_transport_p2p, &braid_transport_shm, &braid_transport_net};

static ncclResult_t transport_select(struct ncclComm* comm, int peer,
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
  int p2p_off = braid_param_int(BRAID_P_P2P_DISABLE) != 0;
  int shm_off = braid_param_int(BRAID_P_SHM_DISABLE) != 0;
  return braid_err(ncclInvalidUsage,
                   "no transport between rank %d (GPU %d) and rank %d (GPU %d) on host %s: "
                   "P2P is %s and shared memory is %s; unset BRAID_P2P_DISABLE/NCCL_P2P_DISABLE "
                   "or BRAID_SHM_DISABLE/NCCL_SHM_DISABLE",
                   comm->rank, me->cuda_dev, peer, other->cuda_dev, me->hostname,
                   p2p_off ? "disabled" : "not possible between these GPUs",
                   shm_off ? "disabled" : "not possible (different /dev/shm)");
}

/* Phase 1 for one end: choose the transport, set up, send the info to the peer. */
static ncclResult_t conn_setup(struct ncclComm* comm, struct braid_connector* conn, int tag) {
  ncclResult_t res = ncclSuccess;
  struct braid_conn_info info;
  memset(&info, 0, sizeof info);
  BRAID_TRY(transport_select(comm, conn->peer, &conn->transport));
  if (conn->is_send)
    BRAID_TRY(conn->transport->send_setup(comm, conn, &info));
  else
    BRAID_TRY(conn->transport->recv_setup(comm, conn, &info));
  BRAID_TRY(bootstrap_send(comm->bootstrap, conn->peer, tag, &info, sizeof info));
  return ncclSuccess;
fail:
  return res;
}

/* Phase 2 for one end: receive the peer's info and connect. */
static ncclResult_t conn_connect(struct ncclComm* comm, struct braid_connector* conn, int tag) {
  ncclResult_t res = ncclSuccess;
  struct braid_conn_info info;
  BRAID_TRY(bootstrap_recv(comm->bootstrap, conn->peer, tag, &info, sizeof info));
  if (conn->is_send)
    BRAID_TRY(conn->transport->send_connect(comm, conn, &info));
  else
    BRAID_TRY(conn->transport->recv_connect(comm, conn, &info));
  conn->dev.connected = 1;
  return ncclSuccess;
fail:
  return res;
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

static void conn_init(struct braid_connector* conn, int peer, int channel, int is_send,
                      size_t buff_bytes) {
  memset(conn, 0, sizeof *conn);
  conn->peer = peer;
  conn->channel = channel;
  conn->is_send = is_send;
  conn->buff_bytes = buff_bytes;
}

static size_t transport_buff_bytes(braid_param_id_t id) {
  int64_t bytes = braid_param_int(id);
  int64_t min_bytes = BRAID_STEPS * 4096;
  if (bytes < min_bytes) bytes = min_bytes;
  return (size_t)BRAID_ALIGN_UP(bytes, BRAID_STEPS * 128);
}

static ncclResult_t channels_alloc(struct ncclComm* comm, const struct braid_rings* rings) {
  ncclResult_t res = ncclSuccess;
  struct braid_channels* ch = NULL;
  int n = comm->nranks;
  BRAID_TRY(BRAID_CALLOC(&ch, 1, "channels"));
  comm->channels = ch;
  ch->nchannels = rings->nchannels;
  ch->p2p_nchannels = rings->nchannels;
  BRAID_TRY(BRAID_CALLOC(&ch->p2p_send, (size_t)BRAID_MAX_CHANNELS * n, "send/recv connectors"));
  BRAID_TRY(BRAID_CALLOC(&ch->p2p_recv, (size_t)BRAID_MAX_CHANNELS * n, "send/recv connectors"));
  BRAID_TRY(BRAID_CALLOC(&ch->ring_ranks_host, (size_t)rings->nchannels * n, "ring order"));
  for (int c = 0; c < rings->nchannels; c++) {
    const int* order = rings->order + (size_t)c * n;
    int pos = 0;
    while (pos < n && order[pos] != comm->rank) pos++;
    BRAID_CHECK(pos < n, ncclInternalError, "rank %d missing from ring %d", comm->rank, c);
    for (int i = 0; i < n; i++) ch->ring_ranks_host[c * n + i] = order[(pos + i) % n];
  }
  return ncclSuccess;
fail:
  return res;
}

ncclResult_t transport_rings_connect(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  const struct braid_rings* rings = topo_comm_rings(comm);
  BRAID_TRY(channels_alloc(comm, rings));
  struct braid_channels* ch = comm->channels;
  int n = comm->nranks;
  if (n == 1) return ncclSuccess;
  size_t bytes = transport_buff_bytes(BRAID_P_BUFFSIZE);
  for (int c = 0; c < ch->nchannels; c++) {
    int next = ch->ring_ranks_host[c * n + 1], prev = ch->ring_ranks_host[c * n + n - 1];
    conn_init(&ch->ring_send[c], next, c, 1, bytes);
    conn_init(&ch->ring_recv[c], prev, c, 0, bytes);
    BRAID_TRY(conn_setup(comm, &ch->ring_recv[c], CONN_TAG(TAG_RING_RECV_INFO, c)));
    BRAID_TRY(conn_setup(comm, &ch->ring_send[c], CONN_TAG(TAG_RING_SEND_INFO, c)));
  }
  ch->ll_ok = ch->ll128_ok = 1;
  for (int c = 0; c < ch->nchannels; c++) {
    BRAID_TRY(conn_connect(comm, &ch->ring_recv[c], CONN_TAG(TAG_RING_SEND_INFO, c)));
    BRAID_TRY(conn_connect(comm, &ch->ring_send[c], CONN_TAG(TAG_RING_RECV_INFO, c)));
    if (!ch->ring_recv[c].dev.ll_buff || !ch->ring_send[c].dev.ll_buff) ch->ll_ok = 0;
    if (!ch->ring_recv[c].dev.ll128_buff || !ch->ring_send[c].dev.ll128_buff) ch->ll128_ok = 0;
  }
  INFO(BRAID_LOG_INIT, "%d ring channels connected via %s (next rank %d), %zu KiB per FIFO",
       ch->nchannels, ch->ring_send[0].transport->name, ch->ring_send[0].peer, bytes >> 10);
  return ncclSuccess;
fail:
  return res;
}

static struct braid_connector* p2p_conn(struct braid_channels* ch, int n, int c, int peer,
                                        int is_send) {
  return (is_send ? ch->p2p_send : ch->p2p_recv) + (size_t)c * n + peer;
}

void transport_p2p_need_channel(struct ncclComm* comm, int peer, int is_send, int c) {
  if (peer == comm->rank || peer < 0) return; /* self-exchange is a local copy */
  struct braid_connector* conn = p2p_conn(comm->channels, comm->nranks, c, peer, is_send);
  if (conn->transport == NULL && conn->buff_bytes == 0) {
    conn_init(conn, peer, c, is_send, transport_buff_bytes(BRAID_P_P2P_BUFFSIZE));
    comm->channels->p2p_marked++;
  }
}

int transport_p2p_pending(const struct ncclComm* comm) { return comm->channels->p2p_marked > 0; }

void transport_p2p_need(struct ncclComm* comm, int peer, int is_send, int nchannels) {
  for (int c = 0; c < nchannels; c++) transport_p2p_need_channel(comm, peer, is_send, c);
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

/* Marked (buff_bytes set) but not yet set up (no transport). */
static int p2p_pending_setup(const struct braid_connector* conn) {
  return conn->buff_bytes != 0 && conn->transport == NULL;
}

ncclResult_t transport_p2p_setup(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_channels* ch = comm->channels;
  int n = comm->nranks;
  if (ch->p2p_marked == 0) return ncclSuccess;
  for (int c = 0; c < ch->p2p_nchannels; c++) {
    for (int peer = 0; peer < n; peer++) {
      struct braid_connector* rc = p2p_conn(ch, n, c, peer, 0);
      struct braid_connector* sc = p2p_conn(ch, n, c, peer, 1);
      if (p2p_pending_setup(rc)) BRAID_TRY(conn_setup(comm, rc, CONN_TAG(TAG_P2P_RECV_INFO, c)));
      if (p2p_pending_setup(sc)) BRAID_TRY(conn_setup(comm, sc, CONN_TAG(TAG_P2P_SEND_INFO, c)));
    }
  }
  return ncclSuccess;
fail:
  return res;
}

ncclResult_t transport_p2p_connect(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_channels* ch = comm->channels;
  int n = comm->nranks;
  if (ch->p2p_marked == 0) return ncclSuccess;
  for (int c = 0; c < ch->p2p_nchannels; c++) {
    for (int peer = 0; peer < n; peer++) {
      for (int is_send = 0; is_send <= 1; is_send++) {
        struct braid_connector* conn = p2p_conn(ch, n, c, peer, is_send);
        if (conn->transport == NULL || conn->dev.connected) continue;
        int tag = CONN_TAG(is_send ? TAG_P2P_RECV_INFO : TAG_P2P_SEND_INFO, c);
        BRAID_TRY(conn_connect(comm, conn, tag));
        ch->p2p_marked--; /* connected: not looked at again, even if the upload fails */
        BRAID_TRY(dev_state_upload_p2p(comm, c, peer, is_send, &conn->dev));
        TRACE(BRAID_LOG_P2P, "channel %d %s rank %d connected via %s", c,
              is_send ? "send to" : "recv from", peer, conn->transport->name);
      }
    }
  }
  return ncclSuccess;
fail:
  return res;
}

static void conn_free(struct braid_connector* conn) {
  if (conn->transport) conn->transport->free(conn);
  memset(conn, 0, sizeof *conn);
}

void transport_channels_free(struct ncclComm* comm) {
  struct braid_channels* ch = comm->channels;
  if (ch == NULL) return;
  for (int c = 0; c < BRAID_MAX_CHANNELS; c++) {
    conn_free(&ch->ring_send[c]);
    conn_free(&ch->ring_recv[c]);
  }
  size_t np = (size_t)BRAID_MAX_CHANNELS * comm->nranks;
  for (size_t i = 0; ch->p2p_send && i < np; i++) conn_free(&ch->p2p_send[i]);
  for (size_t i = 0; ch->p2p_recv && i < np; i++) conn_free(&ch->p2p_recv[i]);
  free(ch->p2p_send);
  free(ch->p2p_recv);
  free(ch->ring_ranks_host);
  free(ch);
  comm->channels = NULL;
}
