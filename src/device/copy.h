/*
 * The copy kernels: the collectives that only move bytes (AllGather,
 * Broadcast, send/recv), compiled once for every element type, in a
 * translation unit of their own (src/device/CMakeLists.txt): the rings' copy
 * kernel (Simple and LL, the two-rank exchange, send/recv) and LL128's.
 * A launch holds copies or reductions, never both (kernel.h).
 */
#ifndef BRAID_DEVICE_COPY_H
#define BRAID_DEVICE_COPY_H

#include "abi/kernel_table.h"
#include "device/kernel.h"

namespace braid {

/* A byte-moving collective over the channel's ring, with protocol P. */
template <typename P>
__device__ __forceinline__ void copy_coll_ring(P& p, const struct braid_work& w,
                                               struct braid_dev_comm* comm,
                                               struct braid_dev_channel* chan, int ch) {
  if (w.coll == BRAID_COLL_ALLGATHER)
    ring_allgather<uint8_t>(p, w, comm->nranks, chan->ring_ranks, ch);
  else
    ring_broadcast<uint8_t>(p, w, comm->nranks, chan->ring_ranks, ch);
  p.save();
}

static __device__ __noinline__ void copy_coll_run(const struct braid_work& w, struct braid_dev_comm* comm,
                                                  struct braid_dev_channel* chan, int ch,
                                                  volatile int* aborted) {
  typedef uint8_t T;
  typedef op_copy<T> Op;
  if (w.proto == BRAID_PROTO_LL) {
    prims_ll<T, Op> p(threadIdx.x, blockDim.x, BRAID_BARRIER_BLOCK, Op(), &chan->ring_recv,
                      &chan->ring_send, comm->abort_flag, aborted);
    copy_coll_ring(p, w, comm, chan, ch);
  } else if (w.flags & BRAID_WORK_PAIR) {
    pair_allgather_simple(w, comm, chan, ch, aborted);
  } else {
    prims_simple<T, Op> p(threadIdx.x, blockDim.x, BRAID_BARRIER_BLOCK, Op(), &chan->ring_recv,
                          &chan->ring_send, comm->abort_flag, aborted);
    copy_coll_ring(p, w, comm, chan, ch);
  }
}

/* A byte-moving work: AllGather, Broadcast, or send/recv. */
__device__ __forceinline__ void copy_work_run(const struct braid_work& w,
                                              struct braid_dev_comm* comm, volatile int* aborted) {
  const int ch = blockIdx.x - w.channel_lo;
  /* Blocks past the channels (a rank's copy to itself) have no connections. */
  struct braid_dev_channel* chan =
      blockIdx.x < BRAID_MAX_CHANNELS ? &comm->channels[blockIdx.x] : nullptr;
  if (w.coll == BRAID_COLL_SENDRECV)
    sendrecv_run(w, comm, chan, ch, aborted);
  else
    copy_coll_run(w, comm, chan, ch, aborted);
}

/* The rings' copy kernel: every byte-moving work, Simple or LL. */
__global__ void __launch_bounds__(BRAID_MAX_NTHREADS)
    braid_copy_kernel(const __grid_constant__ struct braid_kernel_args args) {
  kernel_works<copy_work_run>(args);
}

static __device__ __noinline__ void copy_coll_ll128(const struct braid_work& w,
                                                    struct braid_dev_comm* comm,
                                                    struct braid_dev_channel* chan, int ch,
                                                    volatile int* aborted) {
  prims_ll128<uint8_t, op_copy<uint8_t>> p(threadIdx.x, blockDim.x, BRAID_BARRIER_BLOCK,
                                           op_copy<uint8_t>(), &chan->ring_recv, &chan->ring_send,
                                           comm->abort_flag, aborted);
  copy_coll_ring(p, w, comm, chan, ch);
}

__device__ __forceinline__ void ll128_copy_work_run(const struct braid_work& w,
                                                    struct braid_dev_comm* comm,
                                                    volatile int* aborted) {
  copy_coll_ll128(w, comm, &comm->channels[blockIdx.x], blockIdx.x - w.channel_lo, aborted);
}

/* LL128's copy kernel: AllGather and Broadcast (send/recv does not run LL128). */
__global__ void __launch_bounds__(BRAID_MAX_NTHREADS)
    braid_ll128_copy_kernel(const __grid_constant__ struct braid_kernel_args args) {
  kernel_works<ll128_copy_work_run>(args);
}

}  // namespace braid

/* The copy kernels, by family (kernel_table.h); a translation unit of their own. */
#define BRAID_DEFINE_COPY_KERNELS()                                                         \
  static_assert(BRAID_KERNELS_RING == 0 && BRAID_KERNELS_TREE == 1 && BRAID_KERNELS_LL128 == 2, \
                "the copy kernel table's order");                                            \
  extern "C" const void* const braid_copy_kernel_table[BRAID_KERNEL_FAMILIES] = {          \
      (const void*)braid::braid_copy_kernel, nullptr, (const void*)braid::braid_ll128_copy_kernel};

#endif
