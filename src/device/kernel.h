/*
 * The kernel: one block per channel walks the launch's work list in order
 * and runs the works that include its channel. Reductions are compiled per
 * (type, operator); the collectives that only move bytes (AllGather,
 * Broadcast, send/recv) are compiled once, in copy kernels of their own
 * (copy.h: one per family that runs them, rings and LL128). A launch holds
 * reductions or copies, never both (runtime/enqueue.c): a group mixing them
 * takes one launch more, and the byte movers are not compiled again with
 * every reduction kernel, which took a third of the build (docs/tuning.md,
 * Copy kernels of their own).
 *
 * The work list lives in the kernel's parameter space (__grid_constant__),
 * so a launch needs no host-to-device copy and is captured by CUDA graphs
 * as is.
 */
#ifndef BRAID_DEVICE_KERNEL_H
#define BRAID_DEVICE_KERNEL_H

#include "device/direct.h"
#include "device/pair.h"
#include "device/sendrecv.h"
#include "device/sym.h"
#include "device/tree.h"

namespace braid {

/* A reduction over the channel's ring, with protocol P. */
template <typename T, typename P>
__device__ __forceinline__ void reduce_coll_ring(P& p, const struct braid_work& w,
                                                 struct braid_dev_comm* comm,
                                                 struct braid_dev_channel* chan, int ch) {
  switch (w.coll) {
    case BRAID_COLL_ALLREDUCE: ring_allreduce<T>(p, w, comm->nranks, chan->ring_ranks, ch); break;
    case BRAID_COLL_REDUCESCATTER: ring_reducescatter<T>(p, w, comm->nranks, chan->ring_ranks, ch); break;
    default: ring_reduce<T>(p, w, comm->nranks, chan->ring_ranks, ch); break;
  }
  p.save();
}

/* The work's operator, with a PreMulSum scalar read from device memory where it lives there. */
template <typename T, typename Op>
__device__ __forceinline__ Op work_op(const struct braid_work& w, struct braid_dev_comm* comm) {
  uint64_t scalar = w.scalar;
  if (w.flags & BRAID_WORK_SCALAR_DEVICE) {
    T v = *(const T*)(uintptr_t)w.scalar;
    scalar = 0;
    memcpy(&scalar, &v, sizeof(T));
  }
  return Op(scalar, comm->nranks);
}

template <typename T, typename Op>
__device__ void reduce_coll_run(const struct braid_work& w, struct braid_dev_comm* comm,
                                struct braid_dev_channel* chan, int ch, volatile int* aborted) {
  Op op = work_op<T, Op>(w, comm);
  if (w.proto == BRAID_PROTO_LL) {
    prims_ll<T, Op> p(threadIdx.x, blockDim.x, BRAID_BARRIER_BLOCK, op, &chan->ring_recv,
                      &chan->ring_send, comm->abort_flag, aborted);
    if (w.coll == BRAID_COLL_ALLREDUCE && comm->nranks == 2) {
      pair_allreduce_ll(p, w, comm->rank, chan->ring_next, ch);
      p.save();
    } else {
      reduce_coll_ring<T>(p, w, comm, chan, ch);
    }
  } else if (w.flags & BRAID_WORK_PAIR) {
    pair_allreduce_simple<T, Op>(op, w, comm, chan, ch, aborted);
  } else {
    prims_simple<T, Op> p(threadIdx.x, blockDim.x, BRAID_BARRIER_BLOCK, op, &chan->ring_recv,
                          &chan->ring_send, comm->abort_flag, aborted);
    reduce_coll_ring<T>(p, w, comm, chan, ch);
  }
}

/* A reduction (the host never puts another work in a reduction kernel's launch). */
template <typename T, typename Op>
__device__ __forceinline__ void work_run(const struct braid_work& w, struct braid_dev_comm* comm,
                                         volatile int* aborted) {
  const int ch = blockIdx.x - w.channel_lo;
  reduce_coll_run<T, Op>(w, comm, &comm->channels[blockIdx.x], ch, aborted);
}

/*
 * Each block tells the host ledger that the launch's operations up to `seq`
 * are complete as far as it goes: one store to its own word of device
 * memory, which the watchdog copies out while launches are pending. Every
 * thread of the block is through its works (the loop's last __syncthreads).
 * Diagnostics only (hang verdicts), so nothing here may make the launch end
 * later: no fence, no atomic, nothing in host memory. The report it replaces
 * (a counting atomic per block, then a store to host-mapped memory) made
 * every launch 2-3.5 µs longer (docs/tuning.md, Ledger report).
 */
__device__ __forceinline__ void ledger_report(struct braid_dev_comm* comm, uint64_t seq) {
  if (threadIdx.x == 0) *(volatile uint64_t*)&comm->ledger_done[blockIdx.x] = seq;
}

/*
 * What every kernel does around its works: each block runs, in order, the
 * works that include its channel (RUN), and stops at the first abort; then
 * every block reports to the ledger.
 */
typedef void (*work_fn)(const struct braid_work& w, struct braid_dev_comm* comm,
                        volatile int* aborted);

/*
 * A captured launch (replayed from a graph) marks this block as in it, then as through, with
 * its clock (dev_comm.h: `graph`): thread 0 only, one store each (the high half of the word,
 * little-endian, then the whole), no load (one would hold thread 0 up until it returned). An
 * eager launch costs one untaken branch.
 */
__device__ __forceinline__ void graph_begin(struct braid_dev_comm* comm, uint32_t op) {
  if (op != 0 && threadIdx.x == 0) ((volatile uint32_t*)&comm->graph.word[blockIdx.x])[1] = op;
}

__device__ __forceinline__ void graph_end(struct braid_dev_comm* comm, uint32_t op) {
  if (op != 0 && threadIdx.x == 0)
    *(volatile uint64_t*)&comm->graph.word[blockIdx.x] = (uint32_t)clock64();
}

/*
 * A borrowing comm's kernel (dev_comm.h: struct braid_borrows): each block takes its channel's
 * borrowed steps from their lenders' words as it starts, and puts them back as it ends; the
 * works in between use the comm's own words, as on any other connection. Thread 0 reads how
 * many pairs there are, once (the host may append one while the kernel runs: a connection a
 * later launch needs), while each thread reads its pair: one round trip; then the steps, a
 * second. The first BRAID_BORROWS_HELD pairs stay in shared memory for the way back, so that
 * costs one more (the own words the works saved). One pair per thread, no loop (the host keeps
 * per_channel within the block: share_join): with a loop here, ptxas spilled more in the LL128
 * and tree kernels of every comm (docs/tuning.md, Borrowed connections: step copy without a
 * loop). Every other comm's kernel passes over both
 * with one untaken branch.
 */
#define BRAID_BORROWS_HELD 32

struct borrows_state {
  struct braid_borrow held[BRAID_BORROWS_HELD];
  uint32_t n; /* pairs copied in, so copied back */
};

/* A pair, from L2 (ld.cg): an L1 line of this SM may predate a pair appended since. */
__device__ __forceinline__ struct braid_borrow borrow_load(const struct braid_borrow* p) {
  struct braid_borrow q;
  q.own = (uint64_t*)__ldcg((const unsigned long long*)&p->own);
  q.home = (uint64_t*)__ldcg((const unsigned long long*)&p->home);
  return q;
}

static __device__ __noinline__ void borrows_in(const struct braid_borrows* b, uint32_t per,
                                               struct borrows_state* s) {
  if (blockIdx.x >= BRAID_MAX_CHANNELS) return;
  const struct braid_borrow* p = BRAID_BORROW_PAIRS(b) + (size_t)blockIdx.x * per;
  struct braid_borrow mine = {nullptr, nullptr};
  if (threadIdx.x < per) mine = borrow_load(&p[threadIdx.x]);
  if (threadIdx.x == 0)
    *(volatile uint32_t*)&s->n = *(const volatile uint32_t*)&b->count[blockIdx.x];
  __syncthreads();
  const uint32_t n = *(volatile uint32_t*)&s->n;
  if (threadIdx.x < n) {
    const uint32_t i = threadIdx.x;
    /* A pair read before the count may predate its append (still zero): read it again. */
    const struct braid_borrow q = mine.own ? mine : borrow_load(&p[i]);
    *(volatile uint64_t*)q.own = *(const volatile uint64_t*)q.home;
    if (i < BRAID_BORROWS_HELD) s->held[i] = q;
  }
}

/* After the block's last __syncthreads: the works' saved steps go back to the lenders' words. */
static __device__ __noinline__ void borrows_out(const struct braid_borrows* b, uint32_t per,
                                                struct borrows_state* s) {
  if (blockIdx.x >= BRAID_MAX_CHANNELS) return;
  const struct braid_borrow* p = BRAID_BORROW_PAIRS(b) + (size_t)blockIdx.x * per;
  const uint32_t n = *(volatile uint32_t*)&s->n;
  if (threadIdx.x < n) {
    const uint32_t i = threadIdx.x;
    const struct braid_borrow q = i < BRAID_BORROWS_HELD ? s->held[i] : borrow_load(&p[i]);
    *(volatile uint64_t*)q.home = *(const volatile uint64_t*)q.own;
  }
}

template <work_fn RUN>
__device__ __forceinline__ void kernel_works(const struct braid_kernel_args& args) {
  __shared__ volatile int aborted[2];
  __shared__ struct borrows_state borrowed;
  graph_begin(args.comm, args.graph_op);
  if (args.borrows != nullptr) borrows_in(args.borrows, args.borrows_per, &borrowed);
  for (int i = 0; i < args.nwork; i++) {
    const struct braid_work& w = args.work[i];
    if ((int)blockIdx.x < w.channel_lo || (int)blockIdx.x >= w.channel_lo + w.nchannels) continue;
    if (threadIdx.x < 2) aborted[threadIdx.x] = 0;
    __syncthreads();
    RUN(w, args.comm, aborted);
    __syncthreads();
    if (aborted[0] || aborted[1]) return;
  }
  if (args.borrows != nullptr) borrows_out(args.borrows, args.borrows_per, &borrowed);
  if (args.ledger_seq != 0) ledger_report(args.comm, args.ledger_seq);
  graph_end(args.comm, args.graph_op);
}

template <typename T, typename Op>
__global__ void __launch_bounds__(BRAID_MAX_NTHREADS)
    braid_kernel(const __grid_constant__ struct braid_kernel_args args) {
  kernel_works<work_run<T, Op>>(args);
}

/* A tree or direct all-reduce, or a symmetric all-reduce or reduce-scatter (sym.h). */
template <typename T, typename Op>
__device__ __forceinline__ void tree_work_run(const struct braid_work& w,
                                              struct braid_dev_comm* comm, volatile int* aborted) {
  struct braid_dev_channel* chan = &comm->channels[blockIdx.x];
  const int ch = blockIdx.x - w.channel_lo;
  Op op = work_op<T, Op>(w, comm);
  if ((w.flags & BRAID_WORK_SYM) && w.proto == BRAID_PROTO_LL)
    sym_allreduce_ll<T, Op>(op, w, comm, ch, aborted);
  else if (w.flags & BRAID_WORK_SYM)
    sym_allreduce<T, Op>(op, w, comm, ch, aborted);
  else if (w.algo == BRAID_ALGO_DIRECT)
    direct_allreduce<T, Op>(op, w, comm, chan, ch, aborted);
  else if (w.proto == BRAID_PROTO_LL)
    tree_allreduce<T, Op, prims_ll>(op, w, comm, chan, ch, aborted);
  else
    tree_allreduce<T, Op, prims_simple>(op, w, comm, chan, ch, aborted);
}

/*
 * Launches of tree and direct all-reduces only (the host never mixes them
 * with ring works). Kept apart from braid_kernel so that the ring kernels
 * compile as if these did not exist (their registers and local memory), and
 * their code is compiled once per type and operator, not with every
 * collective.
 */
template <typename T, typename Op>
__global__ void __launch_bounds__(BRAID_MAX_NTHREADS)
    braid_tree_kernel(const __grid_constant__ struct braid_kernel_args args) {
  kernel_works<tree_work_run<T, Op>>(args);
}

/*
 * The tree with LL128 (only ever forced: within a host the model keeps to
 * rings). Out of line: inlined, its six connections' state made the ring
 * steps of the same kernel spill.
 */
template <typename T, typename Op>
__device__ __noinline__ void tree_ll128(const Op& op, const struct braid_work& w,
                                        struct braid_dev_comm* comm, struct braid_dev_channel* chan,
                                        int ch, volatile int* aborted) {
  tree_allreduce<T, Op, prims_ll128>(op, w, comm, chan, ch, aborted);
}

/*
 * The two-rank exchange with LL128 (BRAID_WORK_PAIR). Out of line, as the
 * tree: inlined, its two instantiations took the ring's spills from 32 to
 * 144 bytes of loads per thread (ptxas -v, float sum).
 */
template <typename T, typename Op>
__device__ __noinline__ void pair_ll128(const Op& op, const struct braid_work& w,
                                        struct braid_dev_comm* comm, struct braid_dev_channel* chan,
                                        int ch, volatile int* aborted) {
  prims_ll128<T, Op> p(threadIdx.x, blockDim.x, BRAID_BARRIER_BLOCK, op, &chan->ring_recv,
                       &chan->ring_send, comm->abort_flag, aborted);
  if (comm->rank < chan->ring_next)
    pair_allreduce_ll128<T, true>(p, w, ch);
  else
    pair_allreduce_ll128<T, false>(p, w, ch);
  p.save();
}

/* Every LL128 reduction: ring collectives, the two-rank exchange and the tree's all-reduce. */
template <typename T, typename Op>
__device__ __forceinline__ void ll128_work_run(const struct braid_work& w,
                                               struct braid_dev_comm* comm, volatile int* aborted) {
  struct braid_dev_channel* chan = &comm->channels[blockIdx.x];
  const int ch = blockIdx.x - w.channel_lo;
  Op op = work_op<T, Op>(w, comm);
  if (w.algo == BRAID_ALGO_TREE) {
    tree_ll128<T, Op>(op, w, comm, chan, ch, aborted);
    return;
  }
  if (w.flags & BRAID_WORK_PAIR) {
    pair_ll128<T, Op>(op, w, comm, chan, ch, aborted);
    return;
  }
  prims_ll128<T, Op> p(threadIdx.x, blockDim.x, BRAID_BARRIER_BLOCK, op, &chan->ring_recv,
                       &chan->ring_send, comm->abort_flag, aborted);
  reduce_coll_ring<T>(p, w, comm, chan, ch);
}

/*
 * Launches of LL128 works only (the host keeps them apart). LL128's loop
 * keeps more live values than the others' (a warp's lines in flight, the
 * user's words loaded ahead); inside braid_kernel, next to every other
 * protocol at 128 registers per thread, it spilled ~1.5 KB per thread to
 * local memory. On its own it spills nothing (docs/tuning.md, LL128 kernels split out).
 */
template <typename T, typename Op>
__global__ void __launch_bounds__(BRAID_MAX_NTHREADS)
    braid_ll128_kernel(const __grid_constant__ struct braid_kernel_args args) {
  kernel_works<ll128_work_run<T, Op>>(args);
}

}  // namespace braid

/* The kernels of one element type, indexed by braid_devop_t: rings, trees (and direct), LL128. */
#define BRAID_KERNEL_ROW(K, T)                                    \
  {(const void*)braid::K<T, braid::op_sum<T>>,                    \
   (const void*)braid::K<T, braid::op_prod<T>>,                   \
   (const void*)braid::K<T, braid::op_max<T>>,                    \
   (const void*)braid::K<T, braid::op_min<T>>,                    \
   (const void*)braid::K<T, braid::op_premulsum<T>>,              \
   (const void*)braid::K<T, braid::op_sumpostdiv<T>>}
/*
 * The same for a floating type, without SumPostDiv: ncclAvg on floating types is a PreMulSum
 * by 1/nranks (runtime/redop.c), so no floating SumPostDiv kernel is ever launched.
 */
#define BRAID_KERNEL_ROW_FLOATING(K, T)                           \
  {(const void*)braid::K<T, braid::op_sum<T>>,                    \
   (const void*)braid::K<T, braid::op_prod<T>>,                   \
   (const void*)braid::K<T, braid::op_max<T>>,                    \
   (const void*)braid::K<T, braid::op_min<T>>,                    \
   (const void*)braid::K<T, braid::op_premulsum<T>>,              \
   nullptr}
/*
 * One kernel table row: TABLE_NAME[devop] for element type T, of kernel K (ROW: the row
 * macro above that fits the type). Each row is a translation unit of its own
 * (src/device/CMakeLists.txt), so a build spreads over its cores.
 */
#define BRAID_DEFINE_KERNEL_ROW(TABLE_NAME, ROW, K, T) \
  extern "C" const void* const TABLE_NAME[BRAID_DEVOP_COUNT] = ROW(K, T);

#endif
