/*
 * Direct all-reduce: every rank sends its input to every other rank over
 * the channel's send/recv connections and reduces what arrives, one hop
 * per chunk whatever the number of ranks. A latency algorithm for hosts
 * joined by the network, where a hop costs a trip through two proxies: a
 * ring takes 2(n-1) dependent hops, a tree 2 log2(hosts); here each rank
 * puts (n-1) times its bytes on the wire, so the model picks it for small
 * sizes only.
 *
 * The block splits in two halves on their own named barriers (as pair.h):
 *   send half:    per chunk, waits for a free slot on the connection to
 *                 every peer, writes pre(own) into all of them in one pass
 *                 (pre: this rank's PreMulSum scalar), publishes them;
 *   receive half: per chunk, waits until every peer's slot has arrived,
 *                 then each element is combined in rank order 0, 1, ...,
 *                 n-1 (own: pre(own)), post applied, written to recvbuff.
 * Every rank adds up every element in the same order from the same bits,
 * so all ranks hold identical results, independent of channels and chunk
 * sizes. In place, the receive half overwrites chunk i only after the send
 * half has copied it out (shared counter, as pair.h).
 *
 * One thread of each half runs the connections, straight on their
 * braid_dev_conn in global memory: no per-peer state in registers or local
 * memory, so the number of ranks costs nothing in the kernel's frame.
 */
#ifndef BRAID_DEVICE_DIRECT_H
#define BRAID_DEVICE_DIRECT_H

#include "device/sendrecv.h"

namespace braid {

/* Thread 0 of the send half: slots to every peer free; their addresses in `dst`. False: abort. */
__device__ __forceinline__ bool direct_send_wait(struct braid_dev_channel* chan, int rank, int n,
                                                 void* volatile* dst,
                                                 volatile uint32_t* abort_flag) {
  for (int d = 1; d < n; d++) {
    int peer = rank + d < n ? rank + d : rank + d - n;
    struct braid_dev_conn* c = &chan->p2p_send[peer];
    conn_end e;
    conn_end_load(&e, c);
    if (!conn_wait_credit(&e, abort_flag)) return false;
    c->seen_head = e.seen_head;
    dst[d] = conn_slot<char>(e);
  }
  return true;
}

/*
 * Thread 0 of the send half: publishes the step on every connection (sizes
 * first, then the tails, all behind one fence: a release per connection
 * would cost a fence each).
 */
__device__ __forceinline__ void direct_send_post(struct braid_dev_channel* chan, int rank, int n,
                                                 uint32_t bytes) {
  for (int d = 1; d < n; d++) {
    int peer = rank + d < n ? rank + d : rank + d - n;
    struct braid_dev_conn* c = &chan->p2p_send[peer];
    if (c->sizes) *(volatile uint32_t*)&c->sizes[c->step % BRAID_STEPS] = bytes;
  }
  fence_acq_rel_sys();
  for (int d = 1; d < n; d++) {
    int peer = rank + d < n ? rank + d : rank + d - n;
    struct braid_dev_conn* c = &chan->p2p_send[peer];
    const uint64_t step = c->step;
    st_relaxed_sys(c->tail, step + 1);
    c->step = step + 1;
  }
}

/* Thread 0 of the receive half: every peer's step arrived; slot addresses in `src[peer]`. */
__device__ __forceinline__ bool direct_recv_wait(struct braid_dev_channel* chan, int rank, int n,
                                                 const void* volatile* src,
                                                 volatile uint32_t* abort_flag) {
  for (int d = 1; d < n; d++) {
    int peer = rank - d >= 0 ? rank - d : rank - d + n;
    struct braid_dev_conn* c = &chan->p2p_recv[peer];
    const uint64_t step = c->step;
    if (!conn_wait_tail(c->tail, step, abort_flag)) return false;
    src[peer] = c->buff + (size_t)(step % BRAID_STEPS) * c->slot_bytes;
  }
  return true;
}

/* Thread 0 of the receive half: frees every peer's slot (one fence for all). */
__device__ __forceinline__ void direct_recv_done(struct braid_dev_channel* chan, int rank, int n) {
  fence_acq_rel_sys();
  for (int d = 1; d < n; d++) {
    int peer = rank - d >= 0 ? rank - d : rank - d + n;
    struct braid_dev_conn* c = &chan->p2p_recv[peer];
    st_relaxed_sys(c->head, c->step + 1);
    c->step = c->step + 1;
  }
}

/*
 * The receive half's combination of one chunk: out = v_0 + v_1 + ... in rank
 * order, v_rank = pre(own), the others from src[k]; post at the end. In
 * 16-byte packs where own and out allow (the slots always do), four
 * sources' loads in flight at a time; the rest element by element. A
 * thread reads its own input before writing the same place, so in place is
 * safe.
 */
template <typename T, typename Op>
__device__ __forceinline__ void direct_combine(const Op& op, int tid, int nthreads, int rank, int n,
                                               const T* own, T* out, const void* volatile* src,
                                               int64_t len) {
  const int64_t npacks =
      (((uintptr_t)own | (uintptr_t)out) & 15) == 0 ? len * (int64_t)sizeof(T) / 16 : 0;
  for (int64_t i = tid; i < npacks; i += nthreads) {
    uint4 mine = load_pack((const uint4*)own + i);
    if (Op::has_pre) mine = pack_pre<T>(op, mine);
    uint4 acc = mine;
    for (int k0 = 0; k0 < n; k0 += 4) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; u++)
        v[u] = k0 + u < n && k0 + u != rank ? load_pack((const uint4*)src[k0 + u] + i) : mine;
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int k = k0 + u;
        if (k >= n) break;
        const uint4 x = k == rank ? mine : v[u];
        acc = k == 0 ? x : pack_combine<T>(op, acc, x);
      }
    }
    if (Op::has_post) acc = pack_post<T>(op, acc);
    store_pack((uint4*)out + i, acc);
  }
  for (int64_t j = npacks * 16 / (int64_t)sizeof(T) + tid; j < len; j += nthreads) {
    const T mine = Op::has_pre ? op.pre(load_one(own + j)) : load_one(own + j);
    T acc = rank == 0 ? mine : load_one((const T*)src[0] + j);
    for (int k = 1; k < n; k++)
      acc = op.combine(acc, k == rank ? mine : load_one((const T*)src[k] + j));
    out[j] = Op::has_post ? op.post(acc) : acc;
  }
}

/* The send half's copy of one chunk: pre(own) into the slot of every peer (dst[1..n-1]). */
template <typename T, typename Op>
__device__ __forceinline__ void direct_scatter(const Op& op, int tid, int nthreads, int n,
                                               const T* own, void* volatile* dst, int64_t len) {
  const int64_t npacks = ((uintptr_t)own & 15) == 0 ? len * (int64_t)sizeof(T) / 16 : 0;
  for (int64_t i = tid; i < npacks; i += nthreads) {
    uint4 v = load_pack((const uint4*)own + i);
    if (Op::has_pre) v = pack_pre<T>(op, v);
    for (int d = 1; d < n; d++) store_pack((uint4*)dst[d] + i, v);
  }
  for (int64_t j = npacks * 16 / (int64_t)sizeof(T) + tid; j < len; j += nthreads) {
    const T v = Op::has_pre ? op.pre(load_one(own + j)) : load_one(own + j);
    for (int d = 1; d < n; d++) ((T*)dst[d])[j] = v;
  }
}

template <typename T, typename Op>
__device__ __noinline__ void direct_allreduce(const Op& op, const struct braid_work& w,
                                              struct braid_dev_comm* comm,
                                              struct braid_dev_channel* chan, int ch,
                                              volatile int* aborted) {
  __shared__ volatile long long sent;                    /* chunks the send half has copied out */
  __shared__ void* volatile dst[BRAID_DIRECT_MAX_RANKS]; /* send slots, by distance */
  __shared__ const void* volatile src[BRAID_DIRECT_MAX_RANKS]; /* received slots, by rank */
  const int n = comm->nranks, rank = comm->rank;
  if (threadIdx.x == 0) sent = 0;
  __syncthreads();
  const int half = blockDim.x / 2;
  const bool sender = threadIdx.x < half;
  const int tid = sender ? threadIdx.x : threadIdx.x - half;
  const int bar = sender ? BRAID_BARRIER_SEND : BRAID_BARRIER_RECV;
  const elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  const bool inplace = w.sendbuff == w.recvbuff;
  volatile int* my_abort = sender ? aborted : aborted + 1;
  long long i = 0;
  for (int64_t off = 0; off < r.count; off += chunk, i++) {
    const int64_t len = r.count - off < chunk ? r.count - off : chunk;
    if (sender) {
      if (tid == 0 && !direct_send_wait(chan, rank, n, dst, comm->abort_flag)) *my_abort = 1;
      group_barrier(bar, half);
      if (*my_abort) return;
      direct_scatter<T, Op>(op, tid, half, n, in + off, dst, len);
      group_barrier(bar,
                    half); /* then thread 0's release of `tail` publishes every thread's writes */
      if (tid == 0) {
        direct_send_post(chan, rank, n, (uint32_t)(len * (int64_t)sizeof(T)));
        if (inplace) sent = i + 1;
      }
    } else {
      if (tid == 0) {
        if (!direct_recv_wait(chan, rank, n, src, comm->abort_flag)) *my_abort = 1;
        while (inplace && sent <= i && !aborted[0] && !*my_abort) {
        }
        if (aborted[0]) *my_abort = 1; /* decided by thread 0 alone: the half leaves together */
      }
      group_barrier(bar, half);
      if (*my_abort) return;
      direct_combine<T, Op>(op, tid, half, rank, n, in + off, out + off, src, len);
      group_barrier(bar, half);
      if (tid == 0) direct_recv_done(chan, rank, n);
    }
  }
}

}  // namespace braid

#endif
