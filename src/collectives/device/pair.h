/*
 * All-reduce of two ranks over a ring whose link has a long round trip (the
 * network: kernel -> proxy -> socket -> proxy -> kernel). The ring needs two
 * dependent hops per chunk (reduce-scatter, then all-gather of the result);
 * here each rank sends its whole share and reduces the peer's into its output,
 * one hop per chunk, with the same bytes on the wire.
 *
 * The block splits in two halves on their own named barriers: the send half
 * streams the input into the send FIFO, up to BRAID_STEPS chunks ahead, while
 * the receive half reduces what arrives. In place, the receive half must not
 * overwrite chunk i before the send half has copied it out: the send half
 * publishes its progress in shared memory and the receive half waits for it.
 *
 * Both ranks compute combine(received, own), each with the other's order, and
 * still hold identical bits: every operator here is commutative (IEEE add,
 * multiply, min and max are), and pre/post steps are applied alike.
 */
#ifndef BRAID_DEVICE_PAIR_H
#define BRAID_DEVICE_PAIR_H

#include "collectives/device/ring.h"
#include "collectives/device/sendrecv.h"

namespace braid {

template <typename T, typename Op>
__device__ void pair_allreduce_simple(const Op& op, const struct braid_work& w,
                                      struct braid_dev_comm* comm, struct braid_dev_channel* chan,
                                      int ch, volatile int* aborted) {
  __shared__ volatile long long sent; /* chunks the send half has copied out */
  if (threadIdx.x == 0) sent = 0;
  __syncthreads();
  const int half = blockDim.x / 2;
  const bool sender = threadIdx.x < half;
  const int tid = sender ? threadIdx.x : threadIdx.x - half;
  const elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  const bool inplace = w.sendbuff == w.recvbuff;
  if (sender) {
    prims_simple<T, Op> p(tid, half, BRAID_BARRIER_SEND, op, nullptr, &chan->ring_send,
                          comm->abort_flag, aborted);
    long long i = 0;
    for (int64_t off = 0; off < r.count; off += chunk, i++) {
      int64_t len = r.count - off < chunk ? r.count - off : chunk;
      if (!p.send_from(in + off, len)) return;
      if (inplace && tid == 0) sent = i + 1; /* after the step's barrier: the copy is done */
    }
    p.save();
  } else {
    prims_simple<T, Op> p(tid, half, BRAID_BARRIER_RECV, op, &chan->ring_recv, nullptr,
                          comm->abort_flag, aborted + 1);
    long long i = 0;
    for (int64_t off = 0; off < r.count; off += chunk, i++) {
      int64_t len = r.count - off < chunk ? r.count - off : chunk;
      if (inplace) {
        if (tid == 0)
          while (sent <= i && !aborted[0]) {
          }
        p.barrier();
        if (aborted[0]) return;
      }
      if (!p.recv_reduce_copy(in + off, out + off, len)) return;
    }
    p.save();
  }
}

}  // namespace braid

#endif
