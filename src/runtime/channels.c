/*
 * Connection setup common to every transport: choosing the transport for a
 * pair of ranks, the two-phase exchange of connection infos through the
 * bootstrap (set up and send everything first, then receive and connect, so
 * a thread driving several communicators never waits on itself), the ring
 * connections made at init and the send/recv connections made the first
 * time a group needs them.
 *
 * Connecting an end takes three phases, each run over every end before the
 * next: (1) set up and send the info, or, in a child sharing its parent's
 * connections (runtime/share.h), send an offer to borrow the parent's; (2) read
 * the peer's message: two offers mean both ends borrow; an offer met by an
 * info means the offering end sets up a real end now and sends its info late;
 * (3) connect (reading a late info first), or borrow. Every late info is
 * sent in phase 2, before anyone waits for one, so no order of ends can
 * deadlock.
 */
#include "runtime/channels.h"

#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "runtime/comm.h"
#include "base/debug.h"
#include "runtime/dev_state.h"
#include "base/param.h"
#include "runtime/share.h"
#include "base/utils.h"
#include "graph/graph.h"

/* Bootstrap tags: kind in the high bits, channel in the low ones. */
enum { TAG_RING_SEND_INFO = 1, TAG_RING_RECV_INFO = 2, TAG_P2P_SEND_INFO = 3, TAG_P2P_RECV_INFO = 4 };
#define CONN_TAG(kind, channel) (0x40000000 | ((kind) << 16) | (channel))
#define CONN_TAG_LATE(tag) ((tag) ^ 0x20000000) /* an info sent after an offer was refused */

/* What one end sends the other in phase 1 (and late, phase 2). */
struct conn_msg {
  uint32_t borrow; /* 1: an offer to borrow the parent's connection; `info` unused */
  uint32_t pad;
  struct braid_conn_info info;
};

/* Chooses the transport and sets up this end: what the peer needs goes into *info. */
static ncclResult_t conn_setup_end(struct ncclComm* comm, struct braid_connector* conn,
                                   struct braid_conn_info* info) {
  ncclResult_t res = ncclSuccess;
  BRAID_TRY(transport_select(&comm->xport, conn->peer, &conn->transport));
  if (conn->is_send)
    BRAID_TRY(conn->transport->send_setup(&comm->xport, conn, info));
  else
    BRAID_TRY(conn->transport->recv_setup(&comm->xport, conn, info));
  return ncclSuccess;
fail:
  return res;
}

/* Phase 1 for one end: an offer to borrow (`ring`: a ring end), or set up; sent to the peer. */
static ncclResult_t conn_setup(struct ncclComm* comm, struct braid_connector* conn, int tag,
                               int ring) {
  ncclResult_t res = ncclSuccess;
  struct conn_msg msg;
  memset(&msg, 0, sizeof msg);
  conn->setup_tag = tag;
  conn->offer = share_lender_conn(comm, conn, ring);
  if (conn->offer)
    msg.borrow = 1;
  else
    BRAID_TRY(conn_setup_end(comm, conn, &msg.info));
  BRAID_TRY(bootstrap_send(comm->bootstrap, conn->peer, tag, &msg, sizeof msg));
  conn->phase = 1;
  return ncclSuccess;
fail:
  return res;
}

/* Phase 2 for one end: the peer's message; an offer of ours it did not match becomes a real end. */
static ncclResult_t conn_answer(struct ncclComm* comm, struct braid_connector* conn, int tag) {
  ncclResult_t res = ncclSuccess;
  free(conn->answer); /* one left by a failed attempt */
  conn->answer = NULL;
  BRAID_TRY(BRAID_CALLOC(&conn->answer, 1, "connection answer"));
  BRAID_TRY(bootstrap_recv(comm->bootstrap, conn->peer, tag, conn->answer, sizeof *conn->answer));
  if (conn->offer && !conn->answer->borrow) {
    struct conn_msg late;
    memset(&late, 0, sizeof late);
    conn->offer = NULL;
    BRAID_TRY(conn_setup_end(comm, conn, &late.info));
    BRAID_TRY(bootstrap_send(comm->bootstrap, conn->peer, CONN_TAG_LATE(conn->setup_tag), &late,
                             sizeof late));
  }
  conn->phase = 2;
  return ncclSuccess;
fail:
  return res;
}

/* Phase 3 for one end: borrow (both offered), or connect with the peer's info (late or not). */
static ncclResult_t conn_connect(struct ncclComm* comm, struct braid_connector* conn, int tag,
                                 int ring) {
  ncclResult_t res = ncclSuccess;
  struct conn_msg* m = conn->answer;
  if (conn->offer) {
    share_borrow(comm, conn, conn->offer, ring);
    conn->offer = NULL;
  } else {
    if (m->borrow)
      BRAID_TRY(bootstrap_recv(comm->bootstrap, conn->peer, CONN_TAG_LATE(tag), m, sizeof *m));
    if (conn->is_send)
      BRAID_TRY(conn->transport->send_connect(&comm->xport, conn, &m->info));
    else
      BRAID_TRY(conn->transport->recv_connect(&comm->xport, conn, &m->info));
  }
  conn->dev.connected = 1;
  const int64_t post_warp = braid_param_int(BRAID_P_SIMPLE_POST_WARP);
  conn->dev.post_warp =
      post_warp == 1 || (post_warp == 2 && !ring && conn->transport == &braid_transport_p2p);
  conn->phase = 3;
fail:
  free(conn->answer);
  conn->answer = NULL;
  return res;
}

static void conn_init(struct braid_connector* conn, int peer, int channel, int is_send,
                      size_t buff_bytes) {
  memset(conn, 0, sizeof *conn);
  conn->peer = peer;
  conn->channel = channel;
  conn->is_send = is_send;
  conn->buff_bytes = buff_bytes;
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

/*
 * Bytes of each ring FIFO: BRAID_BUFFSIZE when set; otherwise 8 MiB on a comm of 3 or more
 * ranks whose every ring hop is NVLink, 4 MiB elsewhere. A ring step's chunk is an eighth of
 * it, and on four GPUs 1 MiB chunks run the large rings 1-9% faster than 512 KiB ones
 * (docs/tuning.md, BRAID_BUFFSIZE). Every rank reads the same rings and paths, so all agree.
 */
static size_t channels_ring_buff_bytes(const struct ncclComm* comm,
                                       const struct braid_rings* rings) {
  if (braid_param_int(BRAID_P_BUFFSIZE) > 0) return transport_buff_bytes(BRAID_P_BUFFSIZE);
  int nvlink = comm->nranks >= 3 && rings->nranks == comm->nranks;
  for (int c = 0; nvlink && c < rings->nchannels; c++) {
    const int* order = rings->order + (size_t)c * (size_t)rings->nranks;
    for (int i = 0; nvlink && i < rings->nranks; i++) {
      braid_path_type_t t = topo_path(comm->topo, order[i], order[(i + 1) % rings->nranks], NULL);
      nvlink = t == BRAID_PATH_NVL || t == BRAID_PATH_NVB;
    }
  }
  return (size_t)(nvlink ? 8 : 4) << 20;
}

ncclResult_t channels_rings_connect(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  const struct braid_rings* rings = topo_rings(comm->topo);
  BRAID_TRY(channels_alloc(comm, rings));
  struct braid_channels* ch = comm->channels;
  int n = comm->nranks;
  if (n == 1) return ncclSuccess;
  size_t bytes = channels_ring_buff_bytes(comm, rings);
  int nborrowed = 0;
  for (int c = 0; c < ch->nchannels; c++) {
    int next = ch->ring_ranks_host[c * n + 1], prev = ch->ring_ranks_host[c * n + n - 1];
    conn_init(&ch->ring_send[c], next, c, 1, bytes);
    conn_init(&ch->ring_recv[c], prev, c, 0, bytes);
    BRAID_TRY(conn_setup(comm, &ch->ring_recv[c], CONN_TAG(TAG_RING_RECV_INFO, c), 1));
    BRAID_TRY(conn_setup(comm, &ch->ring_send[c], CONN_TAG(TAG_RING_SEND_INFO, c), 1));
  }
  /* Every end, whatever fails: the peer may wait for a late info from a later one. */
  for (int c = 0; c < ch->nchannels; c++) {
    ncclResult_t r = conn_answer(comm, &ch->ring_recv[c], CONN_TAG(TAG_RING_SEND_INFO, c));
    if (res == ncclSuccess) res = r;
    r = conn_answer(comm, &ch->ring_send[c], CONN_TAG(TAG_RING_RECV_INFO, c));
    if (res == ncclSuccess) res = r;
  }
  if (res != ncclSuccess) goto fail;
  ch->ll_ok = ch->ll128_ok = 1;
  for (int c = 0; c < ch->nchannels; c++) {
    BRAID_TRY(conn_connect(comm, &ch->ring_recv[c], CONN_TAG(TAG_RING_SEND_INFO, c), 1));
    BRAID_TRY(conn_connect(comm, &ch->ring_send[c], CONN_TAG(TAG_RING_RECV_INFO, c), 1));
    nborrowed += ch->ring_recv[c].borrowed + ch->ring_send[c].borrowed;
    if (!ch->ring_recv[c].dev.ll_buff || !ch->ring_send[c].dev.ll_buff) ch->ll_ok = 0;
    if (!ch->ring_recv[c].dev.ll128_buff || !ch->ring_send[c].dev.ll128_buff) ch->ll128_ok = 0;
  }
  INFO(BRAID_LOG_INIT, "%d ring channels connected via %s (next rank %d), %zu KiB per FIFO%s",
       ch->nchannels, ch->ring_send[0].transport->name, ch->ring_send[0].peer, bytes >> 10,
       nborrowed == 2 * ch->nchannels ? "; all borrowed from the parent (splitShare)"
       : nborrowed > 0                ? "; some borrowed from the parent (splitShare)"
                                      : "");
  return ncclSuccess;
fail:
  return res;
}

static struct braid_connector* p2p_conn(struct braid_channels* ch, int n, int c, int peer,
                                        int is_send) {
  return (is_send ? ch->p2p_send : ch->p2p_recv) + (size_t)c * n + peer;
}

void channels_p2p_need_channel(struct ncclComm* comm, int peer, int is_send, int c) {
  if (peer == comm->rank || peer < 0) return; /* self-exchange is a local copy */
  struct braid_connector* conn = p2p_conn(comm->channels, comm->nranks, c, peer, is_send);
  if (conn->transport == NULL && conn->buff_bytes == 0) {
    conn_init(conn, peer, c, is_send, transport_buff_bytes(BRAID_P_P2P_BUFFSIZE));
    comm->channels->p2p_marked++;
  }
}

int channels_p2p_pending(const struct ncclComm* comm) { return comm->channels->p2p_marked > 0; }

void channels_p2p_need(struct ncclComm* comm, int peer, int is_send, int nchannels) {
  for (int c = 0; c < nchannels; c++) channels_p2p_need_channel(comm, peer, is_send, c);
}

/* Marked (buff_bytes set) but not yet set up (nor half set up by a failed attempt). */
static int p2p_pending_setup(const struct braid_connector* conn) {
  return conn->buff_bytes != 0 && conn->phase == 0 && conn->transport == NULL;
}

ncclResult_t channels_p2p_setup(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_channels* ch = comm->channels;
  int n = comm->nranks;
  if (ch->p2p_marked == 0) return ncclSuccess;
  for (int c = 0; c < ch->p2p_nchannels; c++) {
    for (int peer = 0; peer < n; peer++) {
      struct braid_connector* rc = p2p_conn(ch, n, c, peer, 0);
      struct braid_connector* sc = p2p_conn(ch, n, c, peer, 1);
      if (p2p_pending_setup(rc)) BRAID_TRY(conn_setup(comm, rc, CONN_TAG(TAG_P2P_RECV_INFO, c), 0));
      if (p2p_pending_setup(sc)) BRAID_TRY(conn_setup(comm, sc, CONN_TAG(TAG_P2P_SEND_INFO, c), 0));
    }
  }
  return ncclSuccess;
fail:
  return res;
}

/* Phase 3 for a send/recv end: connect (or borrow), then the kernels get it. */
static ncclResult_t p2p_connect_one(struct ncclComm* comm, struct braid_connector* conn, int tag) {
  ncclResult_t res = ncclSuccess;
  comm->channels->p2p_marked--; /* not looked at again, even if what follows fails */
  BRAID_TRY(conn_connect(comm, conn, tag, 0));
  BRAID_TRY(dev_state_upload_p2p(comm, conn->channel, conn->peer, conn->is_send, &conn->dev));
  /*
   * Its kernels have it now, with their own step word: without its pair, that word is stale
   * and the connection would run on it (never retried: the comm must not be used again).
   */
  if (conn->borrowed) {
    res = dev_state_borrowed(comm, conn->channel, conn->peer, conn->is_send, 0, conn->step_home);
    if (res != ncclSuccess) {
      comm_fail_async(comm, res);
      goto fail;
    }
  }
  if (conn->transport != &braid_transport_net) /* a child may borrow it from now on */
    __atomic_store_n(&conn->lendable, 1, __ATOMIC_RELEASE);
  TRACE(BRAID_LOG_P2P, "channel %d %s rank %d %s %s", conn->channel,
        conn->is_send ? "send to" : "recv from", conn->peer,
        conn->borrowed ? "borrowed from the parent:" : "connected via", conn->transport->name);
  return ncclSuccess;
fail:
  return res;
}

/*
 * Phase 2 (answers) or 3 (connects) over the marked send/recv ends, in one order on every
 * rank. Answers go on whatever fails: the peer may wait for a late info from a later one.
 */
static ncclResult_t p2p_phase(struct ncclComm* comm, int phase) {
  ncclResult_t res = ncclSuccess;
  struct braid_channels* ch = comm->channels;
  int n = comm->nranks;
  if (ch->p2p_marked == 0) return ncclSuccess;
  for (int c = 0; c < ch->p2p_nchannels; c++) {
    for (int peer = 0; peer < n; peer++) {
      for (int is_send = 0; is_send <= 1; is_send++) {
        struct braid_connector* conn = p2p_conn(ch, n, c, peer, is_send);
        if (conn->phase != phase - 1) continue;
        int tag = CONN_TAG(is_send ? TAG_P2P_RECV_INFO : TAG_P2P_SEND_INFO, c);
        ncclResult_t r =
            phase == 2 ? conn_answer(comm, conn, tag) : p2p_connect_one(comm, conn, tag);
        if (res == ncclSuccess) res = r;
        if (res != ncclSuccess && phase == 3) return res;
      }
    }
  }
  return res;
}

ncclResult_t channels_p2p_answer(struct ncclComm* comm) { return p2p_phase(comm, 2); }

ncclResult_t channels_p2p_connect(struct ncclComm* comm) { return p2p_phase(comm, 3); }

static void conn_free(struct braid_connector* conn) {
  if (conn->transport && !conn->borrowed) conn->transport->free(conn);
  free(conn->answer);
  memset(conn, 0, sizeof *conn);
}

/* Calls fn on every connector of `ch` (ring and send/recv). */
static void channels_each(struct braid_channels* ch, int nranks,
                          void (*fn)(struct braid_connector*)) {
  for (int c = 0; c < BRAID_MAX_CHANNELS; c++) {
    fn(&ch->ring_send[c]);
    fn(&ch->ring_recv[c]);
  }
  size_t np = (size_t)BRAID_MAX_CHANNELS * nranks;
  for (size_t i = 0; ch->p2p_send && i < np; i++) fn(&ch->p2p_send[i]);
  for (size_t i = 0; ch->p2p_recv && i < np; i++) fn(&ch->p2p_recv[i]);
}

void channels_release(struct braid_channels* ch, int nranks) {
  if (ch == NULL) return;
  channels_each(ch, nranks, conn_free);
  free(ch->p2p_send);
  free(ch->p2p_recv);
  free(ch->ring_ranks_host);
  free(ch);
}

void channels_free(struct ncclComm* comm) {
  channels_release(comm->channels, comm->nranks);
  comm->channels = NULL;
}

void channels_free_keeping(struct ncclComm* comm, size_t* kept) {
  struct braid_channels* ch = comm->channels;
  if (ch == NULL) return;
  for (int c = 0; c < BRAID_MAX_CHANNELS; c++) ch->ring_send[c].kept = ch->ring_recv[c].kept = kept;
  size_t np = (size_t)BRAID_MAX_CHANNELS * comm->nranks;
  for (size_t i = 0; ch->p2p_send && i < np; i++) ch->p2p_send[i].kept = kept;
  for (size_t i = 0; ch->p2p_recv && i < np; i++) ch->p2p_recv[i].kept = kept;
  channels_free(comm);
}

/*
 * Frees a connector no child may borrow, leaving `lendable` (0) alone: a child of the departing
 * comm may be reading it on another thread.
 */
static void conn_keep_lendable(struct braid_connector* conn) {
  if (conn->transport == &braid_transport_p2p || conn->transport == &braid_transport_shm) return;
  if (conn->transport && !conn->borrowed) conn->transport->free(conn);
  conn->transport = NULL;
  conn->state = NULL;
  free(conn->answer);
  conn->answer = NULL;
}

void channels_keep_lendable(struct braid_channels* ch, int nranks) {
  channels_each(ch, nranks, conn_keep_lendable);
}
