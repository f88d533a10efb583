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
 *
 * All-gather of two ranks already takes one hop on the ring, but there the
 * whole block sends a chunk, then receives one: each wait on the peer holds up
 * both directions. Split into the same two halves it moves the ring's bytes,
 * its send and receive halves overlapping as send/recv's do (BRAID_P2P_PAIR_MIN
 * and _MAX say from which size). The halves touch disjoint memory, in place
 * too: no progress counter between them. (Reduce-scatter split so measured
 * 5-18% slower than its ring over NVLink: docs/tuning.md, Reduce-scatter
 * stays on the ring.)
 */
#ifndef BRAID_DEVICE_PAIR_H
#define BRAID_DEVICE_PAIR_H

#include "device/ring.h"
#include "device/sendrecv.h"

namespace braid {

/* The block's two halves: threads [0, half) send, [half, 2 half) receive; tid within the half. */
struct pair_roles {
  int half, tid;
  bool sender;
  __device__ __forceinline__ pair_roles()
      : half(blockDim.x / 2),
        tid(threadIdx.x < blockDim.x / 2 ? threadIdx.x : threadIdx.x - blockDim.x / 2),
        sender(threadIdx.x < blockDim.x / 2) {}
};

template <typename T, typename Op>
__device__ void pair_allreduce_simple(const Op& op, const struct braid_work& w,
                                      struct braid_dev_comm* comm, struct braid_dev_channel* chan,
                                      int ch, volatile int* aborted) {
  __shared__ volatile long long sent; /* chunks the send half has copied out */
  if (threadIdx.x == 0) sent = 0;
  __syncthreads();
  const pair_roles role;
  const int half = role.half, tid = role.tid;
  const elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  const bool inplace = w.sendbuff == w.recvbuff;
  if (role.sender) {
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

/*
 * Two-rank all-gather (bytes): the send half copies this rank's share into its
 * place in the output (out of place) and into the send FIFO; the receive half
 * writes the peer's share into its place.
 */
__device__ __forceinline__ void pair_allgather_simple(const struct braid_work& w,
                                                      struct braid_dev_comm* comm,
                                                      struct braid_dev_channel* chan, int ch,
                                                      volatile int* aborted) {
  typedef uint8_t T;
  typedef op_copy<T> Op;
  const pair_roles role;
  const int half = role.half, tid = role.tid;
  const elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int64_t stride = (int64_t)w.count;
  const int me = chan->ring_ranks[0], peer = chan->ring_ranks[1];
  const bool in_place = in == out + me * stride;
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  if (role.sender) {
    prims_simple<T, Op> p(tid, half, BRAID_BARRIER_SEND, Op(), nullptr, &chan->ring_send,
                          comm->abort_flag, aborted);
    for (int64_t off = 0; off < r.count; off += chunk) {
      int64_t len = r.count - off < chunk ? r.count - off : chunk;
      bool ok = in_place ? p.send_from(out + me * stride + off, len)
                         : p.copy_send(in + off, out + me * stride + off, len);
      if (!ok) return;
    }
    p.save();
  } else {
    prims_simple<T, Op> p(tid, half, BRAID_BARRIER_RECV, Op(), &chan->ring_recv, nullptr,
                          comm->abort_flag, aborted + 1);
    for (int64_t off = 0; off < r.count; off += chunk) {
      int64_t len = r.count - off < chunk ? r.count - off : chunk;
      if (!p.recv_to(out + peer * stride + off, len)) return;
    }
    p.save();
  }
}

}  // namespace braid

#endif
