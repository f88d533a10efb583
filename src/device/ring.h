/*
 * Ring algorithms over the primitives. Each channel (block) takes a
 * contiguous share of the buffer and pipelines it around its ring in steps
 * of at most `chunk_bytes`.
 *
 * Segments are named by rank: in AllReduce and ReduceScatter, segment c is
 * the part whose reduction completes at rank c; in AllGather it is rank c's
 * contribution. `ring_ranks[i]` is the rank i positions ahead of this one, so
 * ring_ranks[n-1] is the previous rank and ring_ranks[1] the next.
 */
#ifndef BRAID_DEVICE_RING_H
#define BRAID_DEVICE_RING_H

#include "device/prims_ll128.h"
#include "device/prims_simple.h"

namespace braid {

struct elem_range {
  int64_t begin;
  int64_t count;
};

/* Channel `ch` of `nch` gets a contiguous range; boundaries fall on 16-byte multiples. */
template <typename T>
__device__ __forceinline__ elem_range channel_range(int64_t count, int nch, int ch) {
  const int64_t align = sizeof(T) >= 16 ? 1 : 16 / sizeof(T);
  int64_t per = (count + nch - 1) / nch;
  per = (per + align - 1) / align * align;
  int64_t begin = per * ch < count ? per * ch : count;
  int64_t end = begin + per < count ? begin + per : count;
  return {begin, end - begin};
}

template <typename T>
__device__ __forceinline__ int64_t chunk_elems(uint32_t chunk_bytes) {
  int64_t c = chunk_bytes / sizeof(T);
  return c > 0 ? c : 1;
}

/* Splits [0, rem) into n segments of `seg` elements (the last ones may be short or empty). */
struct segments {
  int64_t off, seg, rem;
  __device__ int64_t at(int c) const { return off + (int64_t)c * seg; }
  __device__ int64_t len(int c) const {
    int64_t o = (int64_t)c * seg;
    int64_t l = rem - o;
    return l <= 0 ? 0 : (l < seg ? l : seg);
  }
};

template <typename T>
__device__ __forceinline__ segments ring_segments(int64_t off, int64_t total, int n, int64_t chunk) {
  const int64_t align = sizeof(T) >= 16 ? 1 : 16 / sizeof(T);
  int64_t rem = total - off;
  int64_t seg = (rem + n - 1) / n;
  seg = (seg + align - 1) / align * align;
  if (seg > chunk) seg = chunk;
  return {off, seg, rem};
}

/* A single rank: out = post(pre(in)). Also the copies of byte-moving collectives. */
template <typename T, typename Op>
__device__ void local_reduce_copy(const Op& op, const T* in, T* out, int64_t n) {
  reduce_copy<BRAID_UNROLL, T, Op, 1, 1, Op::has_pre, Op::has_post>(threadIdx.x, blockDim.x, op, in,
                                                                    nullptr, out, nullptr, n);
}

template <typename T, typename P>
__device__ void ring_allreduce(P& p, const struct braid_work& w, int n,
                               const int* rr, int ch) {
  elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  if (n == 1) {
    local_reduce_copy(p.op, in, out, r.count);
    return;
  }
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  for (int64_t off = 0; off < r.count; off += (int64_t)n * chunk) {
    segments s = ring_segments<T>(off, r.count, n, chunk);
    int c = rr[n - 1];
    if (!p.send_from(in + s.at(c), s.len(c))) return;
    for (int j = 2; j < n; j++) {
      c = rr[n - j];
      if (!p.recv_reduce_send(in + s.at(c), s.len(c))) return;
    }
    c = rr[0];
    if (!p.recv_reduce_copy_send(in + s.at(c), out + s.at(c), s.len(c))) return;
    for (int j = 1; j < n - 1; j++) {
      c = rr[n - j];
      if (!p.recv_copy_send(out + s.at(c), s.len(c))) return;
    }
    c = rr[1];
    if (!p.recv_to(out + s.at(c), s.len(c))) return;
  }
}

/*
 * All-reduce of two ranks with LL: each sends its whole share and reduces
 * the peer's with its own in one step, where the ring needs two hops (the
 * bytes on the link are the same). Both ranks combine in rank order, so
 * they hold identical results.
 */
template <typename T, typename Op>
__device__ void pair_allreduce_ll(prims_ll<T, Op>& p, const struct braid_work& w, int rank,
                                  int peer, int ch) {
  elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  for (int64_t off = 0; off < r.count; off += chunk) {
    int64_t len = r.count - off < chunk ? r.count - off : chunk;
    if (!p.exchange_reduce(in + off, out + off, len, rank < peer)) return;
  }
}

/*
 * All-reduce of two ranks with LL128 (works flagged BRAID_WORK_PAIR): the
 * one-hop exchange, as with LL, with the next chunk sent before this one is
 * received. In a ring of two each step waits for lines the peer writes in
 * its step before, at the same moment, line group by line group; here a
 * receive waits only on a send the peer made a whole step earlier. From
 * 32 KB to 512 KB that is a fifth less time, at 2 MB the same; from 8 MB it
 * streams slower than the ring (each rank reads its data twice), hence the
 * host's BRAID_LL128_PAIR_MAX (docs/tuning.md, BRAID_LL128_PAIR_MAX). Both
 * ranks combine in rank order (MINE_FIRST on the lower). In place is safe:
 * chunk k is written after chunk k + 1 was read for sending, and each thread
 * rereads only the words it then writes.
 */
template <typename T, bool MINE_FIRST, typename P>
__device__ void pair_allreduce_ll128(P& p, const struct braid_work& w, int ch) {
  typedef typename P::op_type Op;
  elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  if (r.count > 0 && !p.send_from(in, r.count < chunk ? r.count : chunk)) return;
  for (int64_t off = 0; off < r.count; off += chunk) {
    const int64_t next = off + chunk;
    if (next < r.count && !p.send_from(in + next, r.count - next < chunk ? r.count - next : chunk))
      return;
    if (!p.template step<true, false, true, true, Op::has_pre, Op::has_post, MINE_FIRST>(
            in + off, out + off, r.count - off < chunk ? r.count - off : chunk))
      return;
  }
}

template <typename T, typename P>
__device__ void ring_reducescatter(P& p, const struct braid_work& w, int n,
                                   const int* rr, int ch) {
  elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int64_t stride = (int64_t)w.count; /* elements between two ranks' segments */
  if (n == 1) {
    local_reduce_copy(p.op, in, out, r.count);
    return;
  }
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  for (int64_t off = 0; off < r.count; off += chunk) {
    int64_t len = r.count - off < chunk ? r.count - off : chunk;
    int c = rr[n - 1];
    if (!p.send_from(in + c * stride + off, len)) return;
    for (int j = 2; j < n; j++) {
      c = rr[n - j];
      if (!p.recv_reduce_send(in + c * stride + off, len)) return;
    }
    c = rr[0];
    if (!p.recv_reduce_copy(in + c * stride + off, out + off, len)) return;
  }
}

template <typename T, typename P>
__device__ void ring_allgather(P& p, const struct braid_work& w, int n,
                               const int* rr, int ch) {
  elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int64_t stride = (int64_t)w.count;
  const int me = rr[0];
  const bool in_place = in == out + me * stride;
  if (n == 1) {
    if (!in_place) local_reduce_copy(p.op, in, out, r.count);
    return;
  }
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  for (int64_t off = 0; off < r.count; off += chunk) {
    int64_t len = r.count - off < chunk ? r.count - off : chunk;
    bool ok = in_place ? p.send_from(out + me * stride + off, len)
                       : p.copy_send(in + off, out + me * stride + off, len);
    if (!ok) return;
    for (int j = 1; j < n - 1; j++) {
      int c = rr[n - j];
      if (!p.recv_copy_send(out + c * stride + off, len)) return;
    }
    if (!p.recv_to(out + rr[1] * stride + off, len)) return;
  }
}

template <typename T, typename P>
__device__ void ring_broadcast(P& p, const struct braid_work& w, int n,
                               const int* rr, int ch) {
  elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int me = rr[0], next = rr[1 % n];
  if (n == 1) {
    if (in != out) local_reduce_copy(p.op, in, out, r.count);
    return;
  }
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  for (int64_t off = 0; off < r.count; off += chunk) {
    int64_t len = r.count - off < chunk ? r.count - off : chunk;
    bool ok;
    if (me == w.root)
      ok = in == out ? p.send_from(in + off, len) : p.copy_send(in + off, out + off, len);
    else if (next == w.root)
      ok = p.recv_to(out + off, len);
    else
      ok = p.recv_copy_send(out + off, len);
    if (!ok) return;
  }
}

template <typename T, typename P>
__device__ void ring_reduce(P& p, const struct braid_work& w, int n,
                            const int* rr, int ch) {
  elem_range r = channel_range<T>(w.count, w.nchannels, ch);
  const T* in = (const T*)w.sendbuff + r.begin;
  T* out = (T*)w.recvbuff + r.begin;
  const int me = rr[0], prev = rr[n - 1];
  if (n == 1) {
    local_reduce_copy(p.op, in, out, r.count);
    return;
  }
  const int64_t chunk = chunk_elems<T>(w.chunk_bytes);
  for (int64_t off = 0; off < r.count; off += chunk) {
    int64_t len = r.count - off < chunk ? r.count - off : chunk;
    bool ok;
    if (me == w.root)
      ok = p.recv_reduce_copy(in + off, out + off, len);
    else if (prev == w.root)
      ok = p.send_from(in + off, len);
    else
      ok = p.recv_reduce_send(in + off, len);
    if (!ok) return;
  }
}

}  // namespace braid

#endif
