/*
 * Send/recv works (p2p_work.h). enqueue.c walks the schedule (p2p_schedule) and packs the
 * works this file makes into launches.
 */
#include "runtime/p2p_work.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "base/error.h"
#include "base/param.h"
#include "runtime/redop.h"
#include "base/utils.h"
#include "runtime/topo_comm.h"
#include "runtime/channels.h"

/*
 * Send/recv spreads over one more channel per BRAID_P2P_CHANNEL_BYTES, up to the
 * rings' channels. Over P2P 2 KB by default: at 32-128 KB (one LL step per
 * channel, its lines spread over more threads) send/recv and all-to-all took
 * 6.9-7.8 us against 9.0-10.0 with 16 KB, the CUDA graph's GPU time 4.9-5.7
 * against 7.0-7.4 (2x H100, NVLink; docs/tuning.md, BRAID_P2P_CHANNEL_BYTES);
 * from 512 KB both run every channel.
 * Other transports 16 KB (not measured there; at 512 KB per channel a 2 MB
 * message took 40 us against NCCL's 21). Over P2P a message may go with LL up
 * to BRAID_P2P_LL_MAX bytes (the model chooses); other transports keep LL to
 * 16 KB (not measured beyond).
 */
#define SR_P2P_CHANNEL_BYTES (2 << 10)
#define SR_OTHER_CHANNEL_BYTES (16 << 10)
#define SR_CHANNEL_BYTES_MIN 1024
#define SR_LL_MAX_OTHER (16 << 10)
/*
 * A rank's copy to itself runs on blocks of its own, beside the ones that talk to peers: one
 * per BRAID_P2P_SELF_CHANNEL_BYTES (64 KB by default: a two-rank all-to-all at 512 KB took
 * 8.9-9.0 us against 10.3-10.5 with 512 KB, at 2 MB 14.8-15.0 against 16.0-16.1; 2x H100;
 * docs/tuning.md, BRAID_P2P_SELF_CHANNEL_BYTES), at least SR_SELF_CHANNEL_BYTES_MIN.
 */
#define SR_SELF_CHANNEL_BYTES_MIN 4096

/* The connection a send (is_send) to or receive from `peer` uses: channel 0's, whose transport
   and buffers every channel's share in practice. */
static const struct braid_connector* p2p_conn(const struct ncclComm* comm, int peer, int is_send) {
  return (is_send ? comm->channels->p2p_send : comm->channels->p2p_recv) + peer;
}

/*
 * Channels of one send (is_send) or receive of `bytes` with `peer`. Both ends of a connection
 * have the same transport, so the sender and the receiver agree.
 */
static int p2p_nchannels(const struct ncclComm* comm, size_t bytes, int peer, int is_send) {
  const int self = peer == comm->rank;
  int64_t per;
  if (self) {
    per = BRAID_MAX(braid_param_int(BRAID_P_P2P_SELF_CHANNEL_BYTES), SR_SELF_CHANNEL_BYTES_MIN);
  } else {
    const struct braid_connector* conn = p2p_conn(comm, peer, is_send);
    per = braid_param_int(BRAID_P_P2P_CHANNEL_BYTES);
    if (per <= 0)
      per = conn->transport == &braid_transport_p2p ? SR_P2P_CHANNEL_BYTES : SR_OTHER_CHANNEL_BYTES;
    per = BRAID_MAX(per, SR_CHANNEL_BYTES_MIN);
  }
  int max = self ? BRAID_MAX_SELF_CHANNELS : comm->channels->p2p_nchannels;
  size_t n = (bytes + (size_t)per - 1) / (size_t)per;
  if (n < 1) return 1;
  return n > (size_t)max ? max : (int)n;
}

/*
 * The channels of a message to or from the rank at ring distance d, nch of them wanted
 * (p2p_nchannels): the first one, *lo, and how many. On three or more ranks each distance
 * d >= 1 owns the channels [base(d), base(d + 1)) of the P send/recv channels, P split evenly
 * over the n - 1 distances, and a message that fits the channels it would use there at up
 * to SR_SPLIT_CH_BYTES a channel runs there: the exchanges of an all-to-all then run side by
 * side on their own blocks, where from channel 0 each block ran all of them in turn. A
 * larger message keeps channels [0, nch). Both ends of a message derive this from what they
 * share (its bytes, d, n, P), never from the rest of their groups, so they agree.
 * A channel's share stays within what its FIFO holds (LL 128 KiB; Simple BRAID_P2P_BUFFSIZE,
 * 1 MiB by default, the same on both ends or the connection fails): such a message's send
 * completes without its receiver, so a send and a receive of one distance placed apart can
 * run one after the other on a block (p2p_work_pair) without waiting on each other.
 * A message of ncclAlltoAll (op->uniform: both ends know it from their own call, and every
 * rank's messages of it have one size) over P2P may fill its channels up to a Simple FIFO
 * less one slot: such messages go with Simple (p2p_ll, above SR_SPLIT_LL_CH_BYTES a channel;
 * not where BRAID_PROTO names send/recv's protocol), and a lone send/recv of the same size,
 * which should keep every channel, is never one of them.
 */
#define SR_SPLIT_CH_BYTES (64 << 10)
/*
 * A message placed on its distance's channels goes with Simple above this many bytes a
 * channel, whatever the model says for its size (BRAID_PROTO still forces): on 4x H100 a
 * 512 KB send/recv on 10 channels (52 KB each) took 14.7-14.8 us with Simple against
 * 16.7-16.9 with LL, a 2 MB all-to-all 17.4-17.7 against 18.3-18.5 (docs/tuning.md,
 * BRAID_P2P_PEER_SPLIT).
 */
#define SR_SPLIT_LL_CH_BYTES (32 << 10)

static int p2p_place(const struct ncclComm* comm, const struct braid_op* op, int d, size_t bytes,
                     int nch, int* lo, int* placed) {
  const int n = comm->nranks, P = comm->channels->p2p_nchannels;
  *lo = 0;
  *placed = 0;
  if (d == 0 || n < 3 || P < n - 1 || braid_param_int(BRAID_P_P2P_PEER_SPLIT) == 0) return nch;
  const int base = (d - 1) * P / (n - 1), span = d * P / (n - 1) - base;
  const size_t slot = transport_p2p_slot_bytes();
  size_t per = BRAID_MIN((size_t)SR_SPLIT_CH_BYTES, slot * BRAID_STEPS);
  if (op->uniform && p2p_conn(comm, op->peer, op->is_send)->transport == &braid_transport_p2p &&
      !tune_proto_named(comm, BRAID_COLL_SENDRECV))
    per = BRAID_MAX(per, slot * (BRAID_STEPS - 1));
  if (bytes > (size_t)BRAID_MIN(nch, span) * per) return nch; /* per channel it will use */
  *lo = base;
  *placed = 1;
  return BRAID_MIN(nch, span);
}

/*
 * Whether a message of `bytes` over nch channels to or from `peer` goes with LL (placed: on
 * its distance's channels, p2p_place). Both ends decide from the same byte count, channels and
 * connection, so they agree.
 */
static ncclResult_t p2p_ll(struct ncclComm* comm, int peer, int is_send, size_t bytes, int nch,
                           int placed, int* ll) {
  ncclResult_t res = ncclSuccess;
  struct braid_tune_choice choice;
  const struct braid_connector* conn = p2p_conn(comm, peer, is_send);
  *ll = 0;
  const size_t max = conn->transport == &braid_transport_p2p
                         ? (size_t)braid_param_int(BRAID_P_P2P_LL_MAX)
                         : SR_LL_MAX_OTHER;
  if (peer == comm->rank || conn->dev.ll_buff == NULL || bytes > max) return ncclSuccess;
  if (placed && bytes > (size_t)nch * SR_SPLIT_LL_CH_BYTES &&
      !tune_proto_named(comm, BRAID_COLL_SENDRECV))
    return ncclSuccess;
  BRAID_TRY(tune_choose(comm, BRAID_COLL_SENDRECV, bytes, 1u << BRAID_ALGO_RING,
                        (1u << BRAID_PROTO_SIMPLE) | (1u << BRAID_PROTO_LL), &choice));
  *ll = choice.proto == BRAID_PROTO_LL;
  return ncclSuccess;
fail:
  return res;
}

/* One message's share of a work: its bytes, channels, first channel and protocol. */
struct p2p_msg {
  size_t bytes;
  int nch, lo, ll;
};

static ncclResult_t p2p_msg_of(struct ncclComm* comm, const struct braid_op* op, int d,
                               struct p2p_msg* m) {
  int placed = 0;
  m->bytes = op->count * redop_type_size(op->dtype);
  m->nch = p2p_place(comm, op, d, m->bytes, p2p_nchannels(comm, m->bytes, op->peer, op->is_send),
                     &m->lo, &placed);
  return p2p_ll(comm, op->peer, op->is_send, m->bytes, m->nch, placed, &m->ll);
}

/* A work of the send s (message ms) and the receive r (mr), either NULL, starting at lo. */
static void p2p_work_init(const struct ncclComm* comm, struct braid_work* w,
                          const struct braid_op* s, const struct p2p_msg* ms,
                          const struct braid_op* r, const struct p2p_msg* mr, int lo) {
  memset(w, 0, sizeof *w);
  w->coll = BRAID_COLL_SENDRECV;
  w->dtype = ncclUint8;
  w->proto = BRAID_PROTO_SIMPLE;
  w->peer_send = s ? s->peer : -1;
  w->peer_recv = r ? r->peer : -1;
  if (s) {
    w->sendbuff = s->sendbuff;
    w->count = ms->bytes;
    w->nch_send = (uint8_t)ms->nch;
    if (ms->ll) w->flags |= BRAID_WORK_SEND_LL;
  }
  if (r) {
    w->recvbuff = r->recvbuff;
    w->recv_count = mr->bytes;
    w->nch_recv = (uint8_t)mr->nch;
    if (mr->ll) w->flags |= BRAID_WORK_RECV_LL;
  }
  w->nchannels = BRAID_MAX(w->nch_send, w->nch_recv);
  w->channel_lo = (uint8_t)lo;
  if (s && s->peer == comm->rank) w->channel_lo = BRAID_MAX_CHANNELS; /* beside the peers' blocks */
}

ncclResult_t p2p_work_pair(struct ncclComm* comm, const struct braid_op* s,
                           const struct braid_op* r, int d, struct braid_work w[2], int* nw) {
  ncclResult_t res = ncclSuccess;
  struct p2p_msg ms = {0}, mr = {0};
  *nw = 0;
  if (s) BRAID_TRY(p2p_msg_of(comm, s, d, &ms));
  if (r) BRAID_TRY(p2p_msg_of(comm, r, d, &mr));
  if (s && r && ms.lo != mr.lo) {
    /* Placed on different channels: two works, the send first (p2p_place says why). */
    p2p_work_init(comm, &w[0], s, &ms, NULL, NULL, ms.lo);
    p2p_work_init(comm, &w[1], NULL, NULL, r, &mr, mr.lo);
    *nw = 2;
  } else {
    p2p_work_init(comm, &w[0], s, &ms, r, &mr, s ? ms.lo : mr.lo);
    *nw = 1;
  }
  return ncclSuccess;
fail:
  return res;
}

/* The circle method: rank nranks - 1 stays put, the others turn around it. */
int p2p_alltoall_partner(int rank, int nranks, int k) {
  const int m = nranks - 1, r = k - 1;
  if (rank == m) return r;
  if (rank == r) return m;
  return ((2 * r - rank) % m + m) % m;
}

/* Which of the group's sends and receives a walk looks at. */
enum p2p_kind {
  P2P_ANY,
  P2P_PLAIN,   /* not of an ncclAlltoAll */
  P2P_ALLTOALL /* of an ncclAlltoAll (op->uniform) */
};

static int p2p_is(const struct braid_op* op, int peer, int is_send, enum p2p_kind kind) {
  if (op->coll != BRAID_COLL_SENDRECV || op->peer != peer || op->is_send != is_send) return 0;
  return !((kind == P2P_PLAIN && op->uniform) || (kind == P2P_ALLTOALL && !op->uniform));
}

const struct braid_op* p2p_find(const struct braid_group_comm* g, int peer, int is_send,
                                int index) {
  for (int i = 0; i < g->nops; i++)
    if (p2p_is(&g->ops[i], peer, is_send, P2P_ANY) && index-- == 0) return &g->ops[i];
  return NULL;
}

/*
 * The group's sends and receives by (peer, direction), each list in the group's order: a
 * round then reads only its two peers' lists, where a walk of the whole group for every round
 * would cost rounds x operations (an all-to-all of N ranks: ~2N rounds of ~2N operations).
 * Made for groups of more than P2P_INDEX_MIN_OPS operations; smaller ones are walked whole.
 */
#define P2P_INDEX_MIN_OPS 32
struct p2p_index {
  int* start; /* [2 * nranks + 1]: list (peer, is_send) is at[start[2 * peer + is_send]..] */
  int* at;    /* [nops]: indices into g->ops */
};

static int p2p_index_make(const struct braid_group_comm* g, int nranks, struct p2p_index* x) {
  const int nlists = 2 * nranks;
  /* start[nlists + 1], then where each list is filled up to [nlists], then at[nops]. */
  x->start = calloc((size_t)nlists * 2 + 1 + (size_t)g->nops, sizeof(int));
  if (x->start == NULL) return 0; /* the whole-group walk does the same, slower */
  int* fill = x->start + nlists + 1;
  x->at = fill + nlists;
  for (int i = 0; i < g->nops; i++) {
    const struct braid_op* op = &g->ops[i];
    if (op->coll == BRAID_COLL_SENDRECV && op->peer >= 0 && op->peer < nranks)
      x->start[2 * op->peer + (op->is_send != 0) + 1]++;
  }
  for (int l = 0; l < nlists; l++) x->start[l + 1] += x->start[l];
  for (int i = 0; i < g->nops; i++) {
    const struct braid_op* op = &g->ops[i];
    if (op->coll != BRAID_COLL_SENDRECV || op->peer < 0 || op->peer >= nranks) continue;
    const int l = 2 * op->peer + (op->is_send != 0);
    x->at[x->start[l] + fill[l]++] = i;
  }
  return 1;
}

/* Walks the sends to (or receives from) one peer of one kind, in the group's order. */
struct p2p_cursor {
  const struct braid_group_comm* g;
  const int* at; /* the peer's list, or NULL: the whole group */
  int pos, end, peer, is_send;
  enum p2p_kind kind;
};

static void p2p_cursor_init(struct p2p_cursor* c, const struct braid_group_comm* g,
                            const struct p2p_index* x, int peer, int is_send, enum p2p_kind kind) {
  c->g = g;
  c->peer = peer;
  c->is_send = is_send;
  c->kind = kind;
  c->at = x->start ? x->at : NULL;
  c->pos = x->start ? x->start[2 * peer + is_send] : 0;
  c->end = x->start ? x->start[2 * peer + is_send + 1] : g->nops;
}

static const struct braid_op* p2p_cursor_next(struct p2p_cursor* c) {
  while (c->pos < c->end) {
    const struct braid_op* op = &c->g->ops[c->at ? c->at[c->pos] : c->pos];
    c->pos++;
    if (p2p_is(op, c->peer, c->is_send, c->kind)) return op;
  }
  return NULL;
}

/* The pairs of one round: the i-th send to `to` with the i-th receive from `from`. */
static ncclResult_t p2p_round(const struct braid_group_comm* g, const struct p2p_index* x, int to,
                              int from, int d, enum p2p_kind kind, p2p_pair_fn fn, void* ctx) {
  struct p2p_cursor sends, recvs;
  p2p_cursor_init(&sends, g, x, to, 1, kind);
  p2p_cursor_init(&recvs, g, x, from, 0, kind);
  for (int i = 0;; i++) {
    const struct braid_op* s = p2p_cursor_next(&sends);
    const struct braid_op* r = p2p_cursor_next(&recvs);
    if (s == NULL && r == NULL) return ncclSuccess;
    if (d == 0 && !(s && r && s->count * redop_type_size(s->dtype) ==
                                  r->count * redop_type_size(r->dtype)))
      return braid_err(ncclInvalidUsage,
                       "rank %d sends to itself without a matching receive of the same size in "
                       "the same group (every self-send needs a self-recv)",
                       to);
    ncclResult_t res = fn(ctx, s, r, d, i);
    if (res != ncclSuccess) return res;
  }
}

ncclResult_t p2p_schedule(const struct braid_group_comm* g, int rank, int nranks, p2p_pair_fn fn,
                          void* ctx) {
  const int pairwise = p2p_alltoall_pairwise(nranks);
  struct p2p_index x = {NULL, NULL};
  if (g->nops > P2P_INDEX_MIN_OPS) (void)p2p_index_make(g, nranks, &x);
  ncclResult_t res = p2p_round(g, &x, rank, rank, 0, P2P_ANY, fn, ctx);
  for (int k = 1; pairwise && k < nranks && res == ncclSuccess; k++) {
    const int peer = p2p_alltoall_partner(rank, nranks, k);
    res = p2p_round(g, &x, peer, peer, k, P2P_ALLTOALL, fn, ctx);
  }
  for (int d = 1; d < nranks && res == ncclSuccess; d++)
    res = p2p_round(g, &x, (rank + d) % nranks, (rank - d + nranks) % nranks, d,
                    pairwise ? P2P_PLAIN : P2P_ANY, fn, ctx);
  free(x.start);
  return res;
}
