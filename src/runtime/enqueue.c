/*
 * From pending operations to kernel launches.
 *
 * Collectives become one work each, spread over the channels the tuning
 * model picks. Send/recv operations are scheduled in rounds: in round d this
 * rank sends to rank+d and receives from rank-d, pairing the two in one work
 * so they progress together; every rank walks the rounds in the same order,
 * so matching sends and receives always meet. The messages of all-to-alls on
 * an even number of ranks (4 or more) go in pairwise rounds instead, where a
 * work sends to and receives from one partner (p2p_work.c, p2p_schedule).
 *
 * Works are packed into launches in order. A launch runs one kernel; the
 * byte-moving works (AllGather, Broadcast, send/recv) fit any kernel, so a
 * new launch starts only when a reduction needs a different (type,
 * operator) kernel or the work list is full. Every rank splits the same
 * sequence the same way, and stream order keeps the launches in sequence.
 */
#include "runtime/enqueue.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "abi/ce_args.h"
#include "abi/kernel_table.h"
#include "runtime/ce.h"
#include "runtime/ce_fan.h"
#include "runtime/comm.h"
#include "base/debug.h"
#include "runtime/dev_state.h"
#include "runtime/group.h"
#include "runtime/launch_order.h"
#include "runtime/p2p_work.h"
#include "runtime/profiler.h"
#include "base/param.h"
#include "runtime/redop.h"
#include "runtime/register.h"
#include "runtime/share.h"
#include "base/utils.h"
#include "runtime/watchdog.h"
#include "runtime/window.h"
#include "runtime/topo_comm.h"
#include "graph/tune_table.h"
#include "runtime/channels.h"

struct launch_plan {
  struct braid_kernel_args args;
  int reduces; /* its works are reductions: (dtype, devop)'s kernel; else copies: the copy kernel */
  int dtype, devop;
  int grid;
  int family; /* the kernels its works need (enq_family); a launch holds one family */
  int small;  /* every work so far fits a block of BRAID_SMALL_NTHREADS (enq_work_small) */
  int ce_ran; /* a copy-engine exchange ran in this group */
  int launched; /* something of this group went to the GPU (a failure then puts the comm out
                   of step with its peers) */
};

/*
 * The comm's plan, made once and reused by every group end (one at a time: the group's
 * thread, under the family's launch lock): a calloc of its 3.5 KB and the free took ~0.1 us
 * of an 8-byte call's ~6 on the host (docs/tuning.md, Host cost of a call). Fresh but for the
 * works past nwork, which no launch passes.
 */
static ncclResult_t enq_plan_take(struct ncclComm* comm, struct launch_plan** out) {
  ncclResult_t res = ncclSuccess;
  struct braid_dev_state* d = comm->dev;
  if (d->plan == NULL) BRAID_TRY(BRAID_CALLOC(&d->plan, 1, "launch plan"));
  struct launch_plan* p = d->plan;
  memset(&p->args, 0, offsetof(struct braid_kernel_args, work));
  p->reduces = p->dtype = p->devop = p->grid = p->ce_ran = p->launched = p->small = 0;
  p->family = BRAID_KERNELS_RING;
  *out = p;
  return ncclSuccess;
fail:
  return res;
}

/* Which kernel table a work's kernel comes from (kernel_table.h). */
static int enq_family(const struct braid_work* w) {
  if (w->proto == BRAID_PROTO_LL128) return BRAID_KERNELS_LL128;
  return w->algo == BRAID_ALGO_TREE || w->algo == BRAID_ALGO_DIRECT ? BRAID_KERNELS_TREE
                                                                    : BRAID_KERNELS_RING;
}

/*
 * Whether a work runs as well on a block of BRAID_SMALL_NTHREADS threads: an LL ring
 * collective (two ranks' pair exchange included) of at most one 8-byte line a thread of that
 * block on each channel, where a full block's extra threads would have had no line at all. A
 * smaller block starts sooner and meets at each step's barrier with fewer warps (8 B all-reduce
 * of two H100s in a CUDA graph: 3.72-3.81 us an operation with 512 threads, 3.33-3.39 with 64;
 * eager calls, paced by the host, unchanged; docs/tuning.md, BRAID_SMALL_NTHREADS). Both ends
 * of a connection may run different block sizes: an LL step's lines are by index, whichever
 * thread writes them. The symmetric all-reduce's LL variant too, when its one block's lines
 * are as few (it has no meeting, any block size will do).
 */
static int enq_work_small(const struct ncclComm* comm, const struct braid_work* w) {
  const int n = comm->dev->small_nthreads;
  if (n > 0 && (w->flags & BRAID_WORK_SYM) && w->proto == BRAID_PROTO_LL)
    return w->count * redop_type_size(w->dtype) <= (size_t)n * 8; /* one block's lines */
  if (n == 0 || w->coll == BRAID_COLL_SENDRECV || w->algo != BRAID_ALGO_RING ||
      w->proto != BRAID_PROTO_LL || w->nchannels == 0)
    return 0;
  size_t esize = redop_type_size(w->dtype);
  size_t count = w->count;
  /* Reduce-scatter's count is a rank's share; its ring moves every share, one a step. */
  size_t per_channel = (count * esize + w->nchannels - 1) / w->nchannels;
  return per_channel <= (size_t)n * 8;
}

static size_t enq_op_bytes(const struct braid_op* op) {
  return op ? op->count * redop_type_size(op->dtype) : 0;
}

/* The message size as nccl-tests reports it, which the tuning model is calibrated on. */
static size_t enq_tune_bytes(const struct ncclComm* comm, const struct braid_op* op) {
  size_t bytes = op->count * redop_type_size(op->dtype);
  if (op->coll == BRAID_COLL_ALLGATHER || op->coll == BRAID_COLL_REDUCESCATTER)
    bytes *= (size_t)comm->nranks;
  return bytes;
}

static uint32_t enq_chunk_bytes(const struct ncclComm* comm) {
  uint32_t slot = comm->channels->ring_send[0].dev.slot_bytes;
  int64_t want = braid_param_int(BRAID_P_CHUNKSIZE);
  if (slot == 0) slot = 1 << 20; /* a single rank has no FIFO; the chunk only paces local copies */
  if (want <= 0 || want > slot) return slot;
  return (uint32_t)BRAID_ALIGN_UP(want, 16);
}

/* The protocols the ring connections can run. */
static unsigned enq_ring_protos(const struct ncclComm* comm) {
  unsigned mask = 1u << BRAID_PROTO_SIMPLE;
  if (comm->channels->ll_ok) mask |= 1u << BRAID_PROTO_LL;
  if (comm->channels->ll128_ok) mask |= 1u << BRAID_PROTO_LL128;
  return mask;
}

/*
 * Two ranks joined by the network all-reduce with the one-hop exchange
 * (pair.h) up to BRAID_NET_PAIR_MAX bytes (default: all): the ring's second hop
 * costs a whole network round trip per chunk, and with each host on its own GPU
 * the exchange streams faster at every size too (20 against 14 GB/s at 512 MB;
 * only two "hosts" sharing one GPU favoured the ring; docs/tuning.md,
 * BRAID_NET_PAIR_MAX). Over NVLink/PCIe, all-reduce and all-gather with
 * Simple take the exchange from BRAID_P2P_PAIR_MIN to BRAID_P2P_PAIR_MAX
 * bytes (default: all; docs/tuning.md, BRAID_P2P_PAIR_MIN): its send and
 * receive halves overlap where the ring's block waits on the peer between them
 * (2x H100, clusters of 4 blocks: within 3% at 8-32 MB, 4-19% faster elsewhere;
 * reduce-scatter so split was slower than its ring). With LL128 all-reduce
 * takes it up to BRAID_LL128_PAIR_MAX: there the ring's second hop chains
 * each step to the peer's, line group by line group (ring.h).
 */
static int enq_pair_ok(const struct ncclComm* comm, const struct braid_op* op, int proto) {
  size_t bytes = enq_tune_bytes(comm, op);
  int allreduce = op->coll == BRAID_COLL_ALLREDUCE;
  if (comm->nranks != 2 || comm->channels->nchannels == 0) return 0;
  if (!allreduce && op->coll != BRAID_COLL_ALLGATHER) return 0;
  if (proto == BRAID_PROTO_LL128)
    return allreduce && bytes <= (size_t)braid_param_int(BRAID_P_LL128_PAIR_MAX);
  if (proto != BRAID_PROTO_SIMPLE) return 0;
  if (comm->channels->ring_send[0].transport == &braid_transport_net)
    return allreduce && bytes <= (size_t)braid_param_int(BRAID_P_NET_PAIR_MAX);
  int64_t min = braid_param_int(BRAID_P_P2P_PAIR_MIN);
  return min >= 0 && bytes >= (size_t)min &&
         bytes <= (size_t)braid_param_int(BRAID_P_P2P_PAIR_MAX);
}

/*
 * The pair exchange over P2P: chunks of the size (as nccl-tests counts it) per
 * channel / tune_table.pair_chunks, at least pair_chunk_min and at most the
 * ring's chunk (a FIFO slot); BRAID_CHUNKSIZE, when set, wins.
 */
static uint32_t enq_pair_chunk(const struct ncclComm* comm, const struct braid_op* op, int nch,
                               uint32_t ring_chunk) {
  if (braid_param_int(BRAID_P_CHUNKSIZE) > 0 || nch <= 0) return ring_chunk;
  size_t per_channel = enq_tune_bytes(comm, op) / (size_t)nch;
  size_t want = BRAID_ALIGN_UP(per_channel / (size_t)tune_table.pair_chunks, 4096);
  if (want < (size_t)tune_table.pair_chunk_min) want = (size_t)tune_table.pair_chunk_min;
  return want < ring_chunk ? (uint32_t)want : ring_chunk;
}

/* The collectives the copy-engine exchange runs (runtime/ce.c). */
static int enq_ce_coll(int coll) {
  return coll == BRAID_COLL_ALLREDUCE || coll == BRAID_COLL_REDUCESCATTER ||
         coll == BRAID_COLL_ALLGATHER || coll == BRAID_COLL_BROADCAST;
}

/*
 * The exchange sends raw data and the receiver applies `pre`: a PreMulSum
 * goes only where every rank's scalar is the same (ncclAvg's 1/nranks); a
 * user's scalar may differ from rank to rank.
 */
static int enq_ce_scalar_ok(const struct braid_op* op) {
  return op->devop != BRAID_DEVOP_PREMULSUM || op->same_scalar;
}

/*
 * `op` as the copy-engine exchange of two ranks, when it goes that way:
 * all-reduce sends everything and reduces what comes; reduce-scatter sends
 * the peer's part and reduces into its own; all-gather sends its part and
 * copies what comes into the peer's place (its own part goes to its place in
 * the kernel meanwhile); broadcast's root sends (its own copy is the
 * caller's, enq_ce_root_copy), the other rank receives.
 */
static int enq_ce_op(const struct ncclComm* comm, const struct braid_op* op, int capturing,
                     struct braid_ce_op* ce) {
  if (!enq_ce_coll(op->coll) || op->count == 0 || !enq_ce_scalar_ok(op) ||
      !(op->reg_direct ? ce_on(comm, capturing)
                       : ce_ready(comm, op->coll, enq_tune_bytes(comm, op), capturing)))
    return 0;
  const size_t bytes = op->count * redop_type_size(op->dtype);
  const int me = comm->rank, peer = 1 - comm->rank;
  memset(ce, 0, sizeof *ce);
  ce->count = ce->send_count = op->count;
  ce->dtype = op->dtype;
  ce->devop = op->devop;
  ce->scalar = op->scalar;
  ce->scalar_device = (op->work_flags & BRAID_WORK_SCALAR_DEVICE) != 0;
  ce->reduce = op->coll == BRAID_COLL_ALLREDUCE || op->coll == BRAID_COLL_REDUCESCATTER;
  if (op->coll == BRAID_COLL_ALLREDUCE) {
    ce->send = ce->own = op->sendbuff;
    ce->out = op->recvbuff;
  } else if (op->coll == BRAID_COLL_REDUCESCATTER) {
    ce->send = (const char*)op->sendbuff + peer * bytes;
    ce->own = (const char*)op->sendbuff + me * bytes;
    ce->out = op->recvbuff;
  } else if (op->coll == BRAID_COLL_ALLGATHER) {
    ce->send = ce->own = op->sendbuff;
    ce->out = (char*)op->recvbuff + peer * bytes;
    char* mine = (char*)op->recvbuff + me * bytes;
    ce->own_out = mine == op->sendbuff ? NULL : mine; /* in place: already there */
  } else { /* broadcast: the root sends, the other receives */
    ce->dtype = ncclUint8;
    ce->count = ce->send_count = bytes;
    if (op->root == me) {
      ce->send = op->sendbuff;
      ce->count = 0;
    } else {
      ce->out = op->recvbuff;
      ce->send_count = 0;
    }
  }
  ce->peer_out = op->reg_peer_out;
  ce->landed = op->reg_direct;
  return 1;
}

/* Broadcast's root keeps its own data: recvbuff from sendbuff, unless in place. */
static ncclResult_t enq_ce_root_copy(const struct ncclComm* comm, const struct braid_op* op,
                                     cudaStream_t stream) {
  ncclResult_t res = ncclSuccess;
  if (op->coll == BRAID_COLL_BROADCAST && op->root == comm->rank && op->sendbuff != op->recvbuff)
    BRAID_CUDA_TRY(cudaMemcpyAsync(op->recvbuff, op->sendbuff, enq_op_bytes(op),
                                   cudaMemcpyDeviceToDevice, stream));
  return ncclSuccess;
fail:
  return res;
}

/* Whether `op` is an all-gather that the fan runs (register.c's exchange agreed on it). */
static int enq_fan_op(const struct ncclComm* comm, const struct braid_op* op, int capturing) {
  return comm->nranks > 2 && op->coll == BRAID_COLL_ALLGATHER && op->reg_direct &&
         op->count > 0 && fan_on(comm, capturing);
}

static int enq_is_reduction(int coll) {
  return coll == BRAID_COLL_ALLREDUCE || coll == BRAID_COLL_REDUCESCATTER || coll == BRAID_COLL_REDUCE;
}

/*
 * BRAID_DETERMINISTIC=1. Two ranks reduce a+b whatever the path (IEEE
 * addition and multiplication are commutative), so nothing changes there.
 * From three ranks on, the order in which a ring adds up an element depends
 * on where the element falls: on the channel that carries it (channels may
 * have rings of their own) and, in all-reduce, on the segment of the
 * channel's share, which moves with the channel count and the chunk size.
 * In deterministic mode:
 *  - reductions run only on the leading channels whose ring is channel 0's;
 *  - an all-reduce becomes a reduce to the rank before rank 0 on that ring
 *    (every element adds up in ring order from rank 0: in rank order when
 *    the ring is 0, 1, 2, ...) and a broadcast from that rank.
 * Reduce-scatter and reduce then add in an order set by the ring and the
 * element's output rank (or the root) alone. The cost: docs/tuning.md,
 * BRAID_DETERMINISTIC.
 */
static int enq_deterministic(const struct ncclComm* comm) {
  return comm->nranks >= 3 && braid_param_int(BRAID_P_DETERMINISTIC) == 1;
}

/* How many leading channels have channel 0's ring (each rank sees the same rings, so agrees). */
static int enq_det_channels(const struct ncclComm* comm) {
  const int n = comm->nranks, *rr = comm->channels->ring_ranks_host;
  int c = 1;
  while (c < comm->channels->nchannels && memcmp(rr + (size_t)c * n, rr, n * sizeof *rr) == 0) c++;
  return c;
}

int enqueue_expand(const struct ncclComm* comm, const struct braid_op* op, struct braid_op out[2]) {
  out[0] = *op;
  if (op->coll != BRAID_COLL_ALLREDUCE || !enq_deterministic(comm) || op->count == 0) return 1;
  const int n = comm->nranks, *rr = comm->channels->ring_ranks_host; /* rr[i]: i ahead of me */
  int at0 = 0;
  while (rr[at0] != 0) at0++;
  int root = rr[(at0 + n - 1) % n]; /* rank 0's predecessor: the chain starts at rank 0 */
  out[0].coll = BRAID_COLL_REDUCE;
  out[0].root = root;
  out[1] = *op;
  out[1].coll = BRAID_COLL_BROADCAST;
  out[1].root = root;
  out[1].sendbuff = op->recvbuff; /* the root sends the reduced result; the others receive */
  out[1].devop = 0;
  out[1].scalar = 0;
  out[1].work_flags = 0;
  out[1].scratch = NULL;
  out[1].after_prev = 1; /* its blocks read what other blocks of the reduce wrote */
  return 2;
}

/*
 * The algorithms a collective may use: for all-reduce, trees where the
 * topology has them and the direct exchange up to BRAID_DIRECT_MAX_RANKS
 * (the model itself keeps both to several hosts unless BRAID_ALGO asks),
 * except in deterministic mode, where even and odd channels' trees would
 * add in different orders, and the direct exchange's rank order is not the
 * ring's.
 */
static unsigned enq_algos(const struct ncclComm* comm, int coll) {
  const struct braid_trees* trees = topo_trees(comm->topo);
  unsigned mask = 1u << BRAID_ALGO_RING;
  if (coll != BRAID_COLL_ALLREDUCE || comm->nranks < 2 || enq_deterministic(comm)) return mask;
  if (trees && trees->nchannels > 0) mask |= 1u << BRAID_ALGO_TREE;
  if (comm->nranks <= BRAID_DIRECT_MAX_RANKS) mask |= 1u << BRAID_ALGO_DIRECT;
  return mask;
}

/*
 * What a collective runs as: the model's choice, on as many channels as the
 * connections allow. Every rank computes the same from the same call.
 * A tree's protocols are the ring's: LL only where every ring link has LL
 * buffers (within a host), LL128 only where every ring link is P2P. Within
 * a host the tree is a chain along the ring, so its edges are P2P too.
 */
static ncclResult_t enq_coll_choose(struct ncclComm* comm, const struct braid_op* op,
                                    struct braid_tune_choice* choice) {
  ncclResult_t res = ncclSuccess;
  BRAID_TRY(tune_choose(comm, op->coll, enq_tune_bytes(comm, op), enq_algos(comm, op->coll),
                        enq_ring_protos(comm), choice));
  int nch = BRAID_MAX(1, BRAID_MIN(choice->nchannels, comm->channels->nchannels));
  if (choice->algo == BRAID_ALGO_TREE)
    nch = BRAID_MIN(nch, BRAID_MIN(topo_trees(comm->topo)->nchannels, comm->channels->p2p_nchannels));
  if (choice->algo == BRAID_ALGO_DIRECT) {
    nch = BRAID_MIN(nch, comm->channels->p2p_nchannels);
    choice->proto = BRAID_PROTO_SIMPLE; /* its steps are Simple's, on any link */
  }
  if (enq_is_reduction(op->coll) && enq_deterministic(comm)) nch = BRAID_MIN(nch, enq_det_channels(comm));
  choice->nchannels = nch;
  return ncclSuccess;
fail:
  return res;
}

/*
 * An all-reduce or reduce-scatter whose input lies in a symmetric window, up to
 * BRAID_SYM_MAX_BYTES of input (or, on a comm of 3 or more ranks that made the sync window at
 * init, in any buffer up to BRAID_ONESHOT_MAX_BYTES: the LL variant only), as the symmetric
 * work (device/sym.h: through the windows, no connection): *w filled, 1; else 0. Every rank
 * decides alike: the windows (the sync window too) are made collectively, the size and the
 * settings (agreed at init) are the same. Its fields carry the window's addresses as sym.h reads them. Outputs that
 * BRAID_SYM_LL_BYTES a block covers on at most BRAID_SYM_LL_GRID of the comm's channels take
 * the LL variant (one block per BRAID_SYM_LL_BYTES); larger ones, with BRAID_SYM_PULL=1, the
 * pull variant: one block per BRAID_SYM_ROUND_BYTES (what a block holds in a round), at most
 * the comm's channels. `log`: say so (once per operation, at its launch).
 */
static int enq_sym_work(struct ncclComm* comm, const struct braid_op* op, struct braid_work* w,
                        int log) {
  if (op->coll != BRAID_COLL_ALLREDUCE && op->coll != BRAID_COLL_REDUCESCATTER) return 0;
  const int64_t max = braid_param_int(BRAID_P_SYM_MAX_BYTES);
  const int64_t oneshot_max = braid_param_int(BRAID_P_ONESHOT_MAX_BYTES);
  if (max <= 0 && oneshot_max <= 0) return 0;
  const size_t bytes = enq_op_bytes(op);         /* this rank's output */
  const size_t input = enq_tune_bytes(comm, op); /* every rank's input (reduce-scatter: n parts) */
  if (op->count == 0 || comm->nranks < 2 || !enq_ce_scalar_ok(op)) return 0;
  /* In a symmetric window; else, on comms that made the sync window at init, one-shot. */
  struct window_sym ws;
  const int windowed =
      max > 0 && input <= (uint64_t)max && window_sym_input(comm, op->sendbuff, input, &ws);
  const int oneshot = !windowed && oneshot_max > 0 && input <= (uint64_t)oneshot_max &&
                      comm->nranks >= 3 && window_sync(comm, &ws);
  if (!windowed && !oneshot) return 0;
  if (oneshot) ws.input = (char*)op->sendbuff; /* read by this rank alone: stride 0 */
  /* The LL variant where its blocks hold the whole output, else (if asked) the pull variant. */
  const int nch = comm->channels->nchannels;
  const int ll = bytes <= (size_t)BRAID_MIN(nch, BRAID_SYM_LL_GRID) * BRAID_SYM_LL_BYTES;
  if (!ll && (oneshot || braid_param_int(BRAID_P_SYM_PULL) != 1)) return 0;
  const size_t per_block = ll ? BRAID_SYM_LL_BYTES : BRAID_SYM_ROUND_BYTES;
  int nb = (int)BRAID_MIN((bytes + per_block - 1) / per_block, (size_t)nch);
  if (nb < 1) nb = 1;
  memset(w, 0, sizeof *w);
  w->coll = (uint8_t)op->coll;
  w->devop = (uint8_t)op->devop;
  w->dtype = (uint8_t)op->dtype;
  w->proto = ll ? BRAID_PROTO_LL : BRAID_PROTO_SIMPLE;
  w->algo = BRAID_ALGO_DIRECT; /* the tree family's kernels run it */
  w->channel_lo = 0;
  w->nchannels = (uint8_t)nb;
  w->flags = (uint8_t)(op->work_flags | BRAID_WORK_SYM);
  w->root = comm->rank;
  w->peer_send = (int32_t)ws.sync_stride4g;
  w->peer_recv = -1;
  w->chunk_bytes = ws.stride4g;
  w->sendbuff = ws.input;
  w->recvbuff = op->recvbuff;
  w->count = op->count;
  w->recv_count = (size_t)(uintptr_t)ws.sync;
  w->scalar = op->scalar;
  if (log)
    INFO(BRAID_LOG_TUNING, "%s %zu elements %s: %s, %d blocks", braid_coll_name(op->coll),
         op->count, oneshot ? "one-shot" : "from a symmetric window",
         ll ? "pushed to every rank as LL lines" : "read from every rank's window", nb);
  return 1;
}

/*
 * Three or more ranks: the all-gathers whose parts the copy engines may write straight into
 * every peer's registered output (ce_fan.c), both of this rank's buffers registered whole.
 */
static void enq_reg_needs_fan(struct ncclComm* comm) {
  struct braid_group_comm* g = comm->group;
  int nwant = 0;
  for (int i = 0; i < g->nops; i++) {
    struct braid_op* op = &g->ops[i];
    const size_t bytes = op->count * redop_type_size(op->dtype);
    const size_t out_bytes = bytes * (size_t)comm->nranks;
    if (op->coll != BRAID_COLL_ALLGATHER || op->count == 0 ||
        !fan_candidate(comm, enq_tune_bytes(comm, op)) ||
        !register_covers(comm, op->sendbuff, bytes) ||
        !register_covers(comm, op->recvbuff, out_bytes))
      continue;
    struct reg_want w = {op, op, op->recvbuff, out_bytes, op->sendbuff, bytes, NULL, 0,
                         (char*)op->recvbuff + (size_t)comm->rank * bytes};
    nwant += register_want(comm, &w);
  }
  if (nwant > 0) ce_want(comm);
}

/*
 * The group's operations that may move through the copy engines straight into the peer's
 * registered buffers (register.h): two ranks joined by P2P, at least BRAID_CE_REG_MIN_BYTES,
 * this rank's buffers registered (NCCL's rule: then the peer's are too), no stream capturing.
 * All-reduce, reduce-scatter and all-gather, and send/receive pairs; register.c's exchange then
 * decides, alike on both ranks, which go in place.
 */
static void enq_reg_needs(struct ncclComm* comm) {
  struct braid_group_comm* g = comm->group;
  const int64_t min = braid_param_int(BRAID_P_CE_REG_MIN_BYTES);
  if (comm->regs == NULL || !register_possible(comm)) return;
  for (int i = 0; i < g->nops; i++) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(g->ops[i].stream, &cs) != cudaSuccess ||
        cs != cudaStreamCaptureStatusNone) {
      (void)cudaGetLastError();
      return;
    }
  }
  const int me = comm->rank, peer = 1 - comm->rank;
  int nwant = 0;
  if (comm->nranks > 2) {
    enq_reg_needs_fan(comm);
    return;
  }
  for (int i = 0; i < g->nops; i++) {
    struct braid_op* op = &g->ops[i];
    const size_t bytes = op->count * redop_type_size(op->dtype);
    if (op->coll == BRAID_COLL_SENDRECV || op->count == 0 || !enq_ce_scalar_ok(op) ||
        (op->coll != BRAID_COLL_ALLREDUCE && op->coll != BRAID_COLL_REDUCESCATTER &&
         op->coll != BRAID_COLL_ALLGATHER) ||
        enq_tune_bytes(comm, op) < (size_t)min)
      continue;
    struct reg_want w = {op, op, op->recvbuff, bytes, op->sendbuff, bytes, op->sendbuff, bytes, NULL};
    if (op->coll == BRAID_COLL_REDUCESCATTER) {
      w.send = (const char*)op->sendbuff + peer * bytes;
      w.own = (const char*)op->sendbuff + me * bytes;
    } else if (op->coll == BRAID_COLL_ALLGATHER) {
      w.land = (char*)op->recvbuff + peer * bytes;
      w.own_bytes = 0; /* its own part goes to its own place, away from the peer's */
    }
    /* NCCL's rule: both of this rank's buffers registered, whole. */
    const size_t in_bytes = op->coll == BRAID_COLL_REDUCESCATTER ? 2 * bytes : bytes;
    const size_t out_bytes = op->coll == BRAID_COLL_ALLGATHER ? 2 * bytes : bytes;
    if (!register_covers(comm, op->sendbuff, in_bytes) ||
        !register_covers(comm, op->recvbuff, out_bytes))
      continue;
    nwant += register_want(comm, &w);
  }
  for (int i = 0;; i++) {
    struct braid_op* s = (struct braid_op*)p2p_find(g, peer, 1, i);
    struct braid_op* r = (struct braid_op*)p2p_find(g, peer, 0, i);
    if (s == NULL && r == NULL) break;
    const size_t out_bytes = enq_op_bytes(s), in_bytes = enq_op_bytes(r);
    if (BRAID_MAX(out_bytes, in_bytes) < (size_t)min ||
        (s && out_bytes && !register_covers(comm, s->sendbuff, out_bytes)) ||
        (r && in_bytes && !register_covers(comm, r->recvbuff, in_bytes)))
      continue;
    struct reg_want w = {s, r, r ? r->recvbuff : NULL, in_bytes, s ? s->sendbuff : NULL,
                         out_bytes, NULL, 0, NULL};
    nwant += register_want(comm, &w);
  }
  if (nwant > 0) ce_want(comm);
}

void enqueue_p2p_needs(struct ncclComm* comm) {
  struct braid_group_comm* g = comm->group;
  const int n = comm->nranks;
  for (int i = 0; i < g->nops; i++) {
    g->ops[i].reg_direct = 0;
    g->ops[i].reg_peer_out = NULL;
    memset(g->ops[i].reg_peer_outs, 0, sizeof g->ops[i].reg_peer_outs);
  }
  register_wants_clear(comm);
  enq_reg_needs(comm);
  for (int i = 0; i < g->nops; i++) {
    struct braid_op* op = &g->ops[i];
    struct braid_tune_choice choice;
    if (op->coll == BRAID_COLL_SENDRECV) {
      channels_p2p_need(comm, op->peer, op->is_send, comm->channels->p2p_nchannels);
      if (op->peer != comm->rank && ce_candidate(comm, BRAID_COLL_SENDRECV, enq_op_bytes(op)))
        ce_want(comm);
      continue;
    }
    struct braid_work sym;
    if (enq_sym_work(comm, op, &sym, 0)) continue; /* reads the windows: no connection */
    /* The copy-engine exchange's scratch; the kernels' connections too, should it be off. */
    if (enq_ce_coll(op->coll) && op->count > 0 && enq_ce_scalar_ok(op) &&
        ce_candidate(comm, op->coll, enq_tune_bytes(comm, op)))
      ce_want(comm);
    /*
     * A tree's edges, or the direct exchange's connections to every peer,
     * both ways, on the channels it will run on. The choice is kept for the
     * launch (made once per call); a failed one fails later.
     */
    if (op->count == 0 || enq_algos(comm, op->coll) == 1u << BRAID_ALGO_RING ||
        enq_coll_choose(comm, op, &choice) != ncclSuccess)
      continue;
    op->chosen.valid = 1;
    op->chosen.algo = choice.algo;
    op->chosen.proto = choice.proto;
    op->chosen.nchannels = choice.nchannels;
    if (choice.algo == BRAID_ALGO_DIRECT) {
      for (int c = 0; c < choice.nchannels; c++) {
        for (int peer = 0; peer < n; peer++) {
          channels_p2p_need_channel(comm, peer, 1, c);
          channels_p2p_need_channel(comm, peer, 0, c);
        }
      }
      continue;
    }
    if (choice.algo != BRAID_ALGO_TREE) continue;
    const struct braid_trees* trees = topo_trees(comm->topo);
    for (int c = 0; c < choice.nchannels; c++) {
      const struct braid_tree_node* node = &trees->nodes[(size_t)c * n + comm->rank];
      int peers[4] = {node->up, node->down[0], node->down[1], node->down[2]};
      for (int j = 0; j < 4; j++) {
        channels_p2p_need_channel(comm, peers[j], 1, c);
        channels_p2p_need_channel(comm, peers[j], 0, c);
      }
    }
  }
}

static ncclResult_t enq_coll_work(struct ncclComm* comm, const struct braid_op* op,
                                  struct braid_work* w) {
  ncclResult_t res = ncclSuccess;
  struct braid_tune_choice choice;
  if (op->chosen.valid) {
    choice.algo = (braid_algo_t)op->chosen.algo;
    choice.proto = (braid_proto_t)op->chosen.proto;
    choice.nchannels = op->chosen.nchannels;
  } else {
    BRAID_TRY(enq_coll_choose(comm, op, &choice));
  }
  const int nch = choice.nchannels;
  memset(w, 0, sizeof *w);
  w->coll = (uint8_t)op->coll;
  w->devop = (uint8_t)op->devop;
  w->dtype = (uint8_t)op->dtype;
  w->proto = (uint8_t)choice.proto;
  w->algo = (uint8_t)choice.algo;
  w->channel_lo = 0;
  w->nchannels = (uint8_t)nch;
  w->flags = op->work_flags;
  if (choice.algo == BRAID_ALGO_RING && enq_pair_ok(comm, op, choice.proto)) {
    w->flags |= BRAID_WORK_PAIR;
    INFO(BRAID_LOG_TUNING, "%s %zu elements on 2 ranks: as the one-hop pair exchange",
         braid_coll_name(op->coll), op->count);
  }
  w->root = op->root;
  w->peer_send = w->peer_recv = -1;
  w->chunk_bytes = choice.proto == BRAID_PROTO_LL ? BRAID_LL_SLOT_BYTES / 2
                   : choice.proto == BRAID_PROTO_LL128
                       ? (uint32_t)(transport_ll128_slot_bytes() / BRAID_LL128_LINE_BYTES *
                                    BRAID_LL128_LINE_WORDS * 8)
                   : choice.algo != BRAID_ALGO_RING
                       ? BRAID_MIN(enq_chunk_bytes(comm), transport_p2p_slot_bytes())
                       : enq_chunk_bytes(comm);
  if ((w->flags & BRAID_WORK_PAIR) && choice.proto == BRAID_PROTO_SIMPLE &&
      comm->channels->ring_send[0].transport != &braid_transport_net)
    w->chunk_bytes = enq_pair_chunk(comm, op, nch, w->chunk_bytes);
  w->sendbuff = op->sendbuff;
  w->recvbuff = op->recvbuff;
  w->count = op->count;
  w->scalar = op->scalar;
  if (op->coll == BRAID_COLL_ALLGATHER || op->coll == BRAID_COLL_BROADCAST) {
    /* Pure data movement: the kernel moves bytes, whatever the type. */
    w->dtype = ncclUint8;
    w->count = op->count * redop_type_size(op->dtype);
  }
  TRACE(BRAID_LOG_COLL, "%s count %zu %s on %d channels, %s, chunk %u", braid_coll_name(op->coll),
        op->count, redop_type_name(op->dtype), nch, braid_proto_name(choice.proto), w->chunk_bytes);
  return ncclSuccess;
fail:
  return res;
}

/*
 * Runs a copy-engine exchange (`ce`) or an all-gather fan (`fan`, ce_fan.c: the peers write
 * this rank's output once its kernel runs) in this comm's order of launches (as enq_launch;
 * never captured), or with both NULL only the exchange's ledger report.
 */
static ncclResult_t enq_ce_run(struct ncclComm* comm, struct launch_plan* plan,
                               const struct braid_ce_op* ce, const struct fan_op* fan,
                               cudaStream_t stream, uint64_t ledger_seq) {
  ncclResult_t res = ncclSuccess;
  struct enq_order o;
  BRAID_TRY(enq_order_wait(comm, stream, 0, &o));
  plan->launched = 1;
  if (fan) {
    res = fan_all_gather(comm, fan, stream, ledger_seq);
  } else if (ce) {
    plan->ce_ran = 1;
    res = ce_exchange(comm, ce, stream, ledger_seq);
  } else {
    res = ce_ledger_report(comm, stream, ledger_seq);
  }
  /* Also after a failure, for whatever was queued: an abort waits for it before it frees. */
  ncclResult_t rec = enq_order_record(comm, stream, &o);
  if (res == ncclSuccess) res = rec;
  (void)cudaGetLastError();
  return res;
fail:
  return res;
}

/* Makes `to` wait for what `from` holds now (another op's stream of the group, either way). */
static ncclResult_t enq_launch_stream_sync(cudaStream_t from, cudaStream_t to) {
  ncclResult_t res = ncclSuccess;
  cudaEvent_t ev = NULL;
  if (from == to) return ncclSuccess;
  BRAID_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  BRAID_CUDA_TRY(cudaEventRecord(ev, from));
  BRAID_CUDA_TRY(cudaStreamWaitEvent(to, ev, 0));
fail: /* a stream of another device than the comm's, say: the ops' order would be lost */
  if (ev) (void)cudaEventDestroy(ev);
  return res;
}

/* `capture`: the stream's capture status (a captured launch is ordered within its capture). */
static ncclResult_t enq_launch(struct ncclComm* comm, struct launch_plan* plan, cudaStream_t stream,
                               enum cudaStreamCaptureStatus capture) {
  ncclResult_t res = ncclSuccess;
  struct enq_order o;
  if (plan->args.nwork == 0) return ncclSuccess;
  BRAID_TRY(enq_order_wait(comm, stream, capture != cudaStreamCaptureStatusNone, &o));
  BRAID_TRY(dev_state_launch(comm, plan->family, plan->reduces ? plan->dtype : DEV_COPY_KERNEL,
                             plan->reduces ? plan->devop : BRAID_DEVOP_SUM, plan->grid, plan->small,
                             &plan->args, stream));
  plan->launched = 1;
  BRAID_TRY(enq_order_record(comm, stream, &o));
  plan->args.nwork = 0;
  plan->reduces = 0;
  plan->grid = 0;
  plan->small = 0;
  plan->family = BRAID_KERNELS_RING;
  return ncclSuccess;
fail:
  return res;
}

/* Adds a work to the plan, launching first when it cannot join. */
static ncclResult_t enq_add_work(struct ncclComm* comm, struct launch_plan* plan,
                                 const struct braid_work* w, cudaStream_t stream,
                                 enum cudaStreamCaptureStatus capture) {
  ncclResult_t res = ncclSuccess;
  const int family = enq_family(w);
  const int reduces = enq_is_reduction(w->coll);
  /* A launch runs one kernel: reductions of one type and operator, or copies (kernel.h). */
  if (plan->args.nwork == BRAID_MAX_WORK ||
      (reduces && plan->reduces && (w->dtype != plan->dtype || w->devop != plan->devop)) ||
      (plan->args.nwork > 0 && (family != plan->family || reduces != plan->reduces)))
    BRAID_TRY(enq_launch(comm, plan, stream, capture));
  if (reduces) {
    plan->reduces = 1;
    plan->dtype = w->dtype;
    plan->devop = w->devop;
  }
  plan->family = family;
  plan->small = (plan->args.nwork == 0 || plan->small) && enq_work_small(comm, w);
  plan->args.work[plan->args.nwork++] = *w;
  plan->grid = BRAID_MAX(plan->grid, w->channel_lo + w->nchannels);
  return ncclSuccess;
fail:
  return res;
}

/*
 * Two ranks joined by P2P: the i-th send to the peer and the i-th receive
 * from it (either may be missing) go as a copy-engine exchange (runtime/ce.c)
 * where it is on for the larger; the i-th self send/receive of the received size rides along
 * (the exchange's kernel copies it while the peer's data travels: the shape
 * of a two-rank all-to-all). Both ranks see the same pairs, so they agree.
 * Marks the pairs taken in taken[2 * i] (to the peer) and taken[2 * i + 1]
 * (to itself).
 */
static ncclResult_t enq_p2p_ce(struct ncclComm* comm, struct launch_plan* plan, cudaStream_t stream,
                               enum cudaStreamCaptureStatus capture, unsigned char* taken) {
  ncclResult_t res = ncclSuccess;
  const struct braid_group_comm* g = comm->group;
  const int me = comm->rank, peer = 1 - comm->rank;
  for (int i = 0;; i++) {
    const struct braid_op* s = p2p_find(g, peer, 1, i);
    const struct braid_op* r = p2p_find(g, peer, 0, i);
    if (s == NULL && r == NULL) break;
    /* The peer sees the same two sizes, swapped: the larger decides on both ranks. */
    const size_t out_bytes = enq_op_bytes(s), in_bytes = enq_op_bytes(r);
    const int capturing = capture != cudaStreamCaptureStatusNone;
    const int direct = (s && s->reg_direct) || (r && r->reg_direct);
    if (!(direct ? ce_on(comm, capturing)
                 : ce_ready(comm, BRAID_COLL_SENDRECV, BRAID_MAX(out_bytes, in_bytes), capturing)))
      continue;
    struct braid_ce_op ce;
    memset(&ce, 0, sizeof ce);
    ce.send = s ? s->sendbuff : NULL;
    ce.send_count = out_bytes;
    ce.out = r ? r->recvbuff : NULL;
    ce.count = in_bytes;
    ce.dtype = ncclUint8;
    ce.peer_out = s ? s->reg_peer_out : NULL;
    ce.landed = r ? r->reg_direct : 0;
    const struct braid_op* s0 = p2p_find(g, me, 1, i);
    const struct braid_op* r0 = p2p_find(g, me, 0, i);
    if (in_bytes > 0 && s0 && r0 && enq_op_bytes(s0) == in_bytes && enq_op_bytes(r0) == in_bytes &&
        !braid_ranges_overlap(r0->recvbuff, in_bytes, ce.send, out_bytes)) {
      ce.own = s0->sendbuff;
      ce.own_out = r0->recvbuff == s0->sendbuff ? NULL : r0->recvbuff;
      taken[2 * i + 1] = 1;
    }
    if (plan->args.nwork > 0) BRAID_TRY(enq_launch(comm, plan, stream, capture));
    INFO(BRAID_LOG_TUNING,
         "SendRecv %zu bytes out, %zu in on 2 ranks%s: through the copy engines%s", out_bytes,
         in_bytes, ce.own ? " with the self copy" : "",
         direct ? ", straight into the registered buffers" : "");
    BRAID_TRY(enq_ce_run(comm, plan, &ce, NULL, stream, 0));
    taken[2 * i] = 1;
  }
  return ncclSuccess;
fail:
  return res;
}

/*
 * The works of the send s and the receive r of round d (p2p_work_pair) into the plan. Where
 * they are one peer's messages over one block of an in-place all-to-all (api.c), the work's two
 * halves must split the bytes alike (same size, same channels: one connection type joins two
 * ranks both ways), as the receive half then waits for the send half's progress (sendrecv.h).
 */
static ncclResult_t enq_p2p_add_pair(struct ncclComm* comm, struct launch_plan* plan,
                                     const struct braid_op* s, const struct braid_op* r, int d,
                                     cudaStream_t stream, enum cudaStreamCaptureStatus capture) {
  ncclResult_t res = ncclSuccess;
  struct braid_work w[2];
  int nw = 0;
  BRAID_TRY(p2p_work_pair(comm, s, r, d, w, &nw));
  BRAID_CHECK(!(s && r && s->uniform && r->uniform && s->peer == r->peer &&
                s->sendbuff == r->recvbuff) ||
                  (nw == 1 && w[0].nch_send == w[0].nch_recv && w[0].count == w[0].recv_count),
              ncclInternalError,
              "in place, the send to rank %d and the receive from it do not split alike (%d works, "
              "%d and %d channels)",
              s ? s->peer : -1, nw, w[0].nch_send, w[0].nch_recv);
  for (int j = 0; j < nw; j++) {
    if (w[j].nchannels == 0) continue; /* only empty messages: nothing moves */
    BRAID_TRY(enq_add_work(comm, plan, &w[j], stream, capture));
  }
  return ncclSuccess;
fail:
  return res;
}

/* What p2p_schedule's pairs go into: the plan, and the pairs the copy engines took. */
struct enq_p2p_ctx {
  struct ncclComm* comm;
  struct launch_plan* plan;
  cudaStream_t stream;
  enum cudaStreamCaptureStatus capture;
  const unsigned char* taken; /* enq_p2p_ce's, or NULL */
};

static ncclResult_t enq_p2p_pair(void* arg, const struct braid_op* s, const struct braid_op* r,
                                 int d, int index) {
  const struct enq_p2p_ctx* c = arg;
  if (c->taken && c->taken[2 * index + (d == 0)]) return ncclSuccess; /* copy engines' */
  return enq_p2p_add_pair(c->comm, c->plan, s, r, d, c->stream, c->capture);
}

static ncclResult_t enq_p2p_works(struct ncclComm* comm, struct launch_plan* plan,
                                  cudaStream_t stream, enum cudaStreamCaptureStatus capture) {
  ncclResult_t res = ncclSuccess;
  const struct braid_group_comm* g = comm->group;
  unsigned char* taken = NULL; /* enq_p2p_ce's pairs (two ranks: no pairwise rounds) */
  if (comm->nranks == 2 && comm->ce_wanted) {
    BRAID_TRY(BRAID_CALLOC(&taken, 2 * (size_t)g->nops + 2, "copy-engine pairs"));
    BRAID_TRY(enq_p2p_ce(comm, plan, stream, capture, taken));
  }
  struct enq_p2p_ctx ctx = {comm, plan, stream, capture, taken};
  BRAID_TRY(p2p_schedule(g, comm->rank, comm->nranks, enq_p2p_pair, &ctx));
  free(taken);
  return ncclSuccess;
fail:
  free(taken);
  return res;
}

/*
 * A collective of a one-rank communicator is a copy from sendbuff to
 * recvbuff (nothing in place), which the copy engine does at full memory
 * speed; a kernel's few blocks moved 16 MB at 47 GB/s. PreMulSum keeps the
 * kernel: its scalar applies even to one rank.
 */
static int enq_one_rank_copy(const struct ncclComm* comm, const struct braid_op* op) {
  return comm->nranks == 1 && op->coll != BRAID_COLL_SENDRECV && op->devop != BRAID_DEVOP_PREMULSUM;
}

static ncclResult_t enqueue_launch_locked(struct ncclComm* comm, int* spoilt) {
  ncclResult_t res = ncclSuccess;
  struct braid_group_comm* g = comm->group;
  struct launch_plan* plan = NULL;
  int ce_group = 0; /* an operation of the group goes through the copy engines */
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (g == NULL || g->nops == 0) return ncclSuccess;
  cudaStream_t stream = g->ops[0].stream;
  BRAID_TRY(ce_check_intact(comm));
  BRAID_TRY(fan_check_intact(comm));
  for (int i = 0; i < g->nops; i++) watchdog_issue(comm, &g->ops[i]);
  BRAID_TRY(enq_plan_take(comm, &plan));
  plan->args.comm = comm->dev->comm;
  for (int i = 1; i < g->nops; i++) BRAID_TRY(enq_launch_stream_sync(g->ops[i].stream, stream));
  /*
   * After the joins (one from a capturing stream makes this one capture too). The group end
   * made the comm's device's primary context current (group_use_device): the driver's calls
   * here and the launch work in it.
   */
  BRAID_TRY(dev_state_stream_capturing(stream, &capture));
  const int capturing = capture != cudaStreamCaptureStatusNone;
  /* Before watchdog_launch_seq: it takes the operations issued since the last launch. */
  if (capturing) plan->args.graph_op = watchdog_capture_register(comm);
  /* The op whose copy-engine exchange is the group's last launch (it reports to the ledger). */
  int ce_last = -1, has_p2p = 0;
  struct braid_ce_op ce;
  for (int i = 0; i < g->nops; i++) {
    const struct braid_op* op = &g->ops[i];
    if (op->coll == BRAID_COLL_SENDRECV) {
      has_p2p |= op->count > 0;
      /* A pair goes through the copy engines when its larger message would alone. */
      const size_t bytes = enq_op_bytes(op);
      ce_group |= op->peer != comm->rank &&
                  (op->reg_direct ? ce_on(comm, capturing)
                                  : ce_ready(comm, BRAID_COLL_SENDRECV, bytes, capturing));
    } else if (op->count > 0) {
      struct braid_work sym;
      ce_last = !enq_sym_work(comm, op, &sym, 0) &&
                        (enq_fan_op(comm, op, capturing) || enq_ce_op(comm, op, capturing, &ce))
                    ? i
                    : -1;
      ce_group |= ce_last == i;
    }
  }
  if (has_p2p) ce_last = -1;
  for (int i = 0; i < g->nops; i++) {
    const struct braid_op* op = &g->ops[i];
    if (op->coll == BRAID_COLL_SENDRECV || op->count == 0) continue;
    struct braid_work w;
    if (enq_sym_work(comm, op, &w, 1)) {
      if (op->after_prev && plan->args.nwork > 0) BRAID_TRY(enq_launch(comm, plan, stream, capture));
      BRAID_TRY(enq_add_work(comm, plan, &w, stream, capture));
      continue;
    }
    if (enq_fan_op(comm, op, capturing)) {
      if (plan->args.nwork > 0) BRAID_TRY(enq_launch(comm, plan, stream, capture));
      INFO(BRAID_LOG_TUNING, "%s %zu elements on %d ranks: through the copy engines, straight "
           "into the registered buffers", braid_coll_name(op->coll), op->count, comm->nranks);
      /* In the comm's launch order: the peers write this output once the kernel runs. */
      struct fan_op f;
      memset(&f, 0, sizeof f);
      f.send = op->sendbuff;
      f.recv = op->recvbuff;
      f.bytes = op->count * redop_type_size(op->dtype);
      memcpy(f.peer_out, op->reg_peer_outs, sizeof f.peer_out);
      uint64_t seq = i == ce_last ? watchdog_launch_seq(comm, 0, fan_nblocks()) : 0;
      res = enq_ce_run(comm, plan, NULL, &f, stream, seq);
      if (res != ncclSuccess) {
        watchdog_forget_pending(comm);
        goto fail;
      }
      continue;
    }
    if (enq_ce_op(comm, op, capturing, &ce)) {
      if (plan->args.nwork > 0) BRAID_TRY(enq_launch(comm, plan, stream, capture));
      INFO(BRAID_LOG_TUNING, "%s %zu elements on 2 ranks: through the copy engines%s",
           braid_coll_name(op->coll), op->count,
           op->reg_direct ? ", straight into the registered buffers" : "");
      uint64_t seq = i == ce_last ? watchdog_launch_seq(comm, 0, ce_nblocks()) : 0;
      res = enq_ce_root_copy(comm, op, stream);
      if (res == ncclSuccess) res = enq_ce_run(comm, plan, &ce, NULL, stream, seq);
      if (res != ncclSuccess) {
        watchdog_forget_pending(comm);
        goto fail;
      }
      continue;
    }
    if (enq_one_rank_copy(comm, op)) {
      /* In call order: a PreMulSum before it may write what it copies. */
      if (plan->args.nwork > 0) BRAID_TRY(enq_launch(comm, plan, stream, capture));
      if (op->sendbuff != op->recvbuff)
        BRAID_CUDA_TRY(cudaMemcpyAsync(op->recvbuff, op->sendbuff,
                                       op->count * redop_type_size(op->dtype), cudaMemcpyDefault,
                                       stream));
      continue;
    }
    if (op->after_prev && plan->args.nwork > 0) BRAID_TRY(enq_launch(comm, plan, stream, capture));
    BRAID_TRY(enq_coll_work(comm, op, &w));
    BRAID_TRY(enq_add_work(comm, plan, &w, stream, capture));
  }
  BRAID_TRY(enq_p2p_works(comm, plan, stream, capture));
  /*
   * The last launch of the group tells the ledger when the group's operations are done: the
   * kernels', or the last collective exchange's (ce_last), or a report of its own after
   * exchanges that did not report (send/receive pairs).
   */
  if (plan->args.nwork > 0)
    plan->args.ledger_seq =
        watchdog_launch_seq(comm, capture != cudaStreamCaptureStatusNone, plan->grid);
  else if (ce_last < 0 && plan->ce_ran)
    res = enq_ce_run(comm, plan, NULL, NULL, stream, watchdog_launch_seq(comm, 0, 1));
  else if (ce_last < 0)
    watchdog_nothing_launched(comm);
  if (res == ncclSuccess) res = enq_launch(comm, plan, stream, capture);
  if (res != ncclSuccess) {
    watchdog_forget_pending(comm); /* it will never report: no false hang verdict later */
    goto fail;
  }
  /* Everything went out: what fails from here on leaves the comm in step with its peers. */
  ce_group = 0;
  register_mark_used(comm, stream);
  plan->launched = 0;
  for (int i = 1; i < g->nops; i++) BRAID_TRY(enq_launch_stream_sync(stream, g->ops[i].stream));
  /* Staging copies (in-place all-to-all) are released behind the kernel that reads them. */
  for (int i = 0; i < g->nops; i++) {
    if (g->ops[i].scratch == NULL) continue;
    void* scratch = g->ops[i].scratch;
    g->ops[i].scratch = NULL; /* freed here, not again when the group lets go of its operations */
    BRAID_CUDA_TRY(cudaFreeAsync(scratch, stream));
  }
  return ncclSuccess;
fail:
  /* The peer ran its side of the group's exchanges; this rank did not, or not all of it. */
  if (ce_group) {
    ce_fail(comm, res);
    fan_fail(comm, res);
  }
  if (plan && plan->launched && capture == cudaStreamCaptureStatusNone) {
    /* Part of the group went out: the peers' step counts and this rank's no longer agree. */
    comm_fail_async(comm, res);
    *spoilt = 1;
    for (int i = 1; i < g->nops; i++) (void)enq_launch_stream_sync(stream, g->ops[i].stream);
  }
  return res;
}

/*
 * The profiler's events of one launch (runtime/profiler.h): the group, then each operation
 * with the algorithm, protocol and channels the launch will take (the connect-time choice,
 * else the tuning model's, asked again here). *handles: [nops], freed by enq_profile_stop.
 */
static void enq_profile_start(struct ncclComm* comm, void** group, void*** handles) {
  const struct braid_group_comm* g = comm->group;
  *group = NULL;
  *handles = NULL;
  if (g == NULL || g->nops == 0) return;
  *group = profiler_group_start(comm->profiler);
  *handles = calloc((size_t)g->nops, sizeof **handles);
  for (int i = 0; *handles && i < g->nops; i++) {
    const struct braid_op* op = &g->ops[i];
    struct braid_profiler_task t = {.coll = op->coll, .is_send = op->is_send,
                                    .sendbuff = op->sendbuff, .recvbuff = op->recvbuff,
                                    .count = op->count, .root = op->root, .peer = op->peer,
                                    .dtype = op->dtype, .algo = -1, .proto = -1};
    struct braid_tune_choice choice;
    if (op->chosen.valid) {
      t.algo = op->chosen.algo;
      t.proto = op->chosen.proto;
      t.nchannels = op->chosen.nchannels;
    } else if (op->coll != BRAID_COLL_SENDRECV && op->count > 0 && !enq_one_rank_copy(comm, op) &&
               enq_coll_choose(comm, op, &choice) == ncclSuccess) {
      t.algo = choice.algo;
      t.proto = choice.proto;
      t.nchannels = choice.nchannels;
    }
    (*handles)[i] = profiler_task_start(comm->profiler, *group, &t);
  }
}

static void enq_profile_stop(struct ncclComm* comm, int nops, void* group, void** handles) {
  for (int i = 0; handles && i < nops; i++) profiler_event_stop(comm->profiler, handles[i]);
  free(handles);
  profiler_event_stop(comm->profiler, group);
}

/* A family's groups launch one at a time (share.h): their kernels go out in one order. */
ncclResult_t enqueue_launch(struct ncclComm* comm) {
  int spoilt = 0;
  void *pgroup = NULL, **ptasks = NULL;
  const int nops = comm->group ? comm->group->nops : 0;
  share_lock(comm);
  if (__builtin_expect(comm->profiler != NULL, 0)) enq_profile_start(comm, &pgroup, &ptasks);
  ncclResult_t res = enqueue_launch_locked(comm, &spoilt);
  if (__builtin_expect(comm->profiler != NULL, 0)) enq_profile_stop(comm, nops, pgroup, ptasks);
  share_unlock(comm);
  /* The connections the family shares are out of step too. */
  if (spoilt) share_break(comm, "left with part of a group launched");
  return res;
}

ncclResult_t enqueue_estimate(struct ncclComm* comm, float* time_us) {
  ncclResult_t res = ncclSuccess;
  const struct braid_group_comm* g = comm->group;
  float total = 0.0f;
  for (int i = 0; g && i < g->nops; i++) {
    const struct braid_op* op = &g->ops[i];
    struct braid_tune_choice choice;
    if (op->count == 0) continue;
    unsigned protos = enq_ring_protos(comm);
    if (op->coll == BRAID_COLL_SENDRECV) protos |= 1u << BRAID_PROTO_LL;
    /* The algorithms the launch would choose from (enq_coll_choose): trees and direct too. */
    unsigned algos =
        op->coll == BRAID_COLL_SENDRECV ? 1u << BRAID_ALGO_RING : enq_algos(comm, op->coll);
    BRAID_TRY(tune_choose(comm, op->coll, enq_tune_bytes(comm, op), algos, protos, &choice));
    total += choice.time_us;
  }
  *time_us = total;
  return ncclSuccess;
fail:
  return res;
}
