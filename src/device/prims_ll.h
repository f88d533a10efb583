/*
 * The LL (low-latency) protocol: every 8 bytes of data travel with two
 * copies of a 4-byte flag in one 16-byte store (dev_comm.h), so a receiver
 * polls the line itself instead of a tail counter, and neither side needs a
 * fence. Half of every line is flag, so LL moves data at half the link's
 * rate: it wins where latency dominates (small messages).
 *
 * Each thread owns whole lines (line i = bytes [8i, 8i+8) of a step's data)
 * and carries a value from the line it receives to the line it sends without
 * waiting for the other threads: a recv-reduce-send step costs one poll and
 * one store per line. Barriers remain only at the ends of a step: before
 * sending (one thread checked the receiver has freed the slot) and after
 * receiving (every thread has read the slot before `head` frees it).
 *
 * User buffers need no alignment: a line is read and written with one
 * 8-byte access where the address allows it, byte by byte otherwise and for
 * the tail of a buffer that does not fill its last line.
 */
#ifndef BRAID_DEVICE_PRIMS_LL_H
#define BRAID_DEVICE_PRIMS_LL_H

#include "device/prims_common.h"

namespace braid {

/* 8 bytes as elements of T, for reductions on a line's data. */
template <typename T>
union pack8 {
  static constexpr int N = 8 / sizeof(T);
  uint64_t u;
  T e[N];
  __device__ pack8() : u(0) {}
};

template <typename T, typename Op, bool PRE>
__device__ __forceinline__ uint64_t pack8_pre(const Op& op, uint64_t a) {
  if (!PRE) return a;
  pack8<T> x;
  x.u = a;
#pragma unroll
  for (int i = 0; i < pack8<T>::N; i++) x.e[i] = op.pre(x.e[i]);
  return x.u;
}

template <typename T, typename Op>
__device__ __forceinline__ uint64_t pack8_combine(const Op& op, uint64_t a, uint64_t b) {
  pack8<T> x, y;
  x.u = a;
  y.u = b;
#pragma unroll
  for (int i = 0; i < pack8<T>::N; i++) x.e[i] = op.combine(x.e[i], y.e[i]);
  return x.u;
}

template <typename T, typename Op, bool POST>
__device__ __forceinline__ uint64_t pack8_post(const Op& op, uint64_t a) {
  if (!POST) return a;
  pack8<T> x;
  x.u = a;
#pragma unroll
  for (int i = 0; i < pack8<T>::N; i++) x.e[i] = op.post(x.e[i]);
  return x.u;
}

/*
 * The byte-wise paths of the two below: unaligned buffers and a buffer's
 * last word. Kept apart and entered only when rem > 0: written inline as one
 * loop, the kernels spilled more (ptxas, float sum: the LL128 kernel 48/92 B
 * against 12/32, the ring kernel 124/476 against 80/292).
 */
__device__ __forceinline__ uint64_t ll_user_load_bytes(const unsigned char* p, int rem) {
  uint64_t v = 0;
  for (int b = 0; b < 8 && b < rem; b++) v |= (uint64_t)p[b] << (8 * b);
  return v;
}

__device__ __forceinline__ void ll_user_store_bytes(unsigned char* p, int rem, uint64_t v) {
  for (int b = 0; b < 8 && b < rem; b++) p[b] = (unsigned char)(v >> (8 * b));
}

/*
 * Word i (8 bytes) of a user buffer of `nbytes`; bytes past the end read as 0.
 * A step's data is at most one slot, so 32-bit indices do.
 */
__device__ __forceinline__ uint64_t ll_user_load(const void* base, int i, int nbytes) {
  const unsigned char* p = (const unsigned char*)base + 8 * i;
  int rem = nbytes - 8 * i;
  if (rem >= 8 && ((uintptr_t)p & 7) == 0) return *(const uint64_t*)p;
  return rem > 0 ? ll_user_load_bytes(p, rem) : 0;
}

/* Stores word i into a user buffer of `nbytes`, never past its end. */
__device__ __forceinline__ void ll_user_store(void* base, int i, int nbytes, uint64_t v) {
  unsigned char* p = (unsigned char*)base + 8 * i;
  int rem = nbytes - 8 * i;
  if (rem >= 8 && ((uintptr_t)p & 7) == 0) {
    *(uint64_t*)p = v;
    return;
  }
  if (rem > 0) ll_user_store_bytes(p, rem, v);
}

__device__ __forceinline__ void ll_line_store(char* slot, int64_t i, uint64_t v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(slot + 16 * i),
               "r"((uint32_t)v), "r"(flag), "r"((uint32_t)(v >> 32)), "r"(flag)
               : "memory");
}

/* Polls line i until both flags read `flag`; false when the communicator aborted. */
__device__ __forceinline__ bool ll_line_load(const char* slot, int64_t i, uint32_t flag,
                                             volatile uint32_t* abort_flag, uint64_t* out) {
  uint32_t d0, f0, d1, f1;
  int spins = 0;
  for (;;) {
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                 : "l"(slot + 16 * i)
                 : "memory");
    if (f0 == flag && f1 == flag) break;
    if (++spins == BRAID_ABORT_CHECK_SPINS) {
      spins = 0;
      if (*abort_flag) return false;
    }
  }
  *out = (uint64_t)d0 | ((uint64_t)d1 << 32);
  return true;
}

/* A group of threads running LL steps over up to one recv and one send connection. */
template <typename T, typename Op>
struct prims_ll : prims_base<T, Op>, prims_named<prims_ll<T, Op>, T, Op> {
  BRAID_PRIMS_BASE(T, Op);

  __device__ char* ll_slot(const conn_end& c) const {
    return slot_at(c.ll_buff, c.ll_slot_bytes, c.step);
  }

  /*
   * One pipeline step of nelem elements: value = [received line] combined
   * with [pre(src line)], then post() if POST, to dst and/or the send slot.
   */
  template <bool RECV, bool SEND, bool SRC, bool DST, bool PRE, bool POST>
  __device__ __forceinline__ bool step(const T* src, T* dst, int64_t nelem) {
    if constexpr (steps_inline<T, Op>::value)
      return step_body<RECV, SEND, SRC, DST, PRE, POST>(src, dst, nelem);
    else
      return step_outline<RECV, SEND, SRC, DST, PRE, POST>(src, dst, nelem);
  }

  /* The step of the operators whose steps are out of line (reduce_ops.h, steps_inline). */
  template <bool RECV, bool SEND, bool SRC, bool DST, bool PRE, bool POST>
  __device__ __noinline__ bool step_outline(const T* src, T* dst, int64_t nelem) {
    return step_body<RECV, SEND, SRC, DST, PRE, POST>(src, dst, nelem);
  }

  /* The members the loop reads are copied to locals first (prims_simple.h says why). */
  template <bool RECV, bool SEND, bool SRC, bool DST, bool PRE, bool POST>
  __device__ __forceinline__ bool step_body(const T* src, T* dst, int64_t nelem) {
    if (SEND && !begin_send()) return false;
    const Op op = this->op;
    const int tid = this->tid, nthreads = this->nthreads;
    volatile uint32_t* const abort_flag = this->abort_flag;
    const int64_t nbytes = nelem * (int64_t)sizeof(T);
    const int64_t nlines = (nbytes + 7) / 8;
    const char* rslot = RECV ? ll_slot(recv) : nullptr;
    char* sslot = SEND ? ll_slot(send) : nullptr;
    const uint32_t rflag = RECV ? BRAID_LL_FLAG(recv.step) : 0;
    const uint32_t sflag = SEND ? BRAID_LL_FLAG(send.step) : 0;
    bool ok = true;
    for (int64_t i = tid; i < nlines; i += nthreads) {
      /* The user's word first: its load overlaps the wait for the peer's line. */
      const uint64_t s = SRC ? pack8_pre<T, Op, PRE>(op, ll_user_load(src, i, nbytes)) : 0;
      uint64_t v = 0;
      if (RECV && !ll_line_load(rslot, i, rflag, abort_flag, &v)) {
        ok = false;
        break;
      }
      if (SRC) v = RECV ? pack8_combine<T, Op>(op, v, s) : s;
      v = pack8_post<T, Op, POST>(op, v);
      if (DST) ll_user_store(dst, i, nbytes, v);
      if (SEND) ll_line_store(sslot, i, v, sflag);
    }
    if (RECV && !end_recv(ok)) return false;
    if (SEND) send.step++;
    if (RECV) recv.step++;
    return true;
  }

  /*
   * Two ranks exchange whole buffers in one step: send pre(src), receive the
   * peer's, write combine(...) in rank order (`mine_first`) to dst. Every
   * line is sent before any is awaited, so the two sides never wait on each
   * other. In place (src == dst) is safe: a thread rereads its own lines only.
   */
  __device__ bool exchange_reduce(const T* src, T* dst, int64_t nelem, bool mine_first) {
    if (!begin_send()) return false;
    const int64_t nbytes = nelem * (int64_t)sizeof(T);
    const int64_t nlines = (nbytes + 7) / 8;
    char* sslot = ll_slot(send);
    const char* rslot = ll_slot(recv);
    const uint32_t rflag = BRAID_LL_FLAG(recv.step), sflag = BRAID_LL_FLAG(send.step);
    for (int64_t i = tid; i < nlines; i += nthreads)
      ll_line_store(sslot, i, pack8_pre<T, Op, Op::has_pre>(op, ll_user_load(src, i, nbytes)), sflag);
    bool ok = true;
    for (int64_t i = tid; i < nlines; i += nthreads) {
      const uint64_t mine = pack8_pre<T, Op, Op::has_pre>(op, ll_user_load(src, i, nbytes));
      uint64_t theirs;
      if (!ll_line_load(rslot, i, rflag, abort_flag, &theirs)) {
        ok = false;
        break;
      }
      uint64_t v = mine_first ? pack8_combine<T, Op>(op, mine, theirs)
                              : pack8_combine<T, Op>(op, theirs, mine);
      ll_user_store(dst, i, nbytes, pack8_post<T, Op, Op::has_post>(op, v));
    }
    if (!end_recv(ok)) return false;
    send.step++;
    recv.step++;
    return true;
  }
};

}  // namespace braid

#endif
