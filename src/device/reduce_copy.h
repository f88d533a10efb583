/*
 * The inner loop of every collective: read one or two sources, reduce them,
 * write one or two destinations. Every primitive of every protocol ends up
 * here, so this is where bandwidth is won or lost.
 *
 * When every pointer is 16-byte aligned, each thread moves 16-byte packs,
 * UNROLL of them in flight at once (all loads issued before any store) to
 * cover the latency of NVLink and HBM. Otherwise it falls back to element
 * loads (correct for any alignment, slower); the tail that does not fill a
 * pack is done element-wise too.
 *
 * Loads are volatile: a FIFO slot is rewritten by a peer every BRAID_STEPS
 * steps and must never be served from a stale L1 line. Data is read once,
 * so bypassing L1 costs nothing.
 *
 * Sources: s0 and, if NSRC == 2, s1. With one source the value is s0
 * (passed through `pre` if PRE). With two, the value is combine(s0, s1),
 * where s1 is this rank's own input (passed through `pre` if PRE). POST
 * applies `post` to the result (the final step of a reduction).
 */
#ifndef BRAID_DEVICE_REDUCE_COPY_H
#define BRAID_DEVICE_REDUCE_COPY_H

#include "device/reduce_ops.h"

namespace braid {

__device__ __forceinline__ uint4 load_pack(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void store_pack(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

/* The unsigned integer of T's size, so element loads can be volatile whatever T is. */
template <int N> struct uint_of_size;
template <> struct uint_of_size<1> { typedef uint8_t type; };
template <> struct uint_of_size<2> { typedef uint16_t type; };
template <> struct uint_of_size<4> { typedef uint32_t type; };
template <> struct uint_of_size<8> { typedef uint64_t type; };

/* One element, volatile; byte by byte where the pointer is not naturally aligned. */
template <typename T>
__device__ __forceinline__ T load_one(const T* p) {
  typedef typename uint_of_size<sizeof(T)>::type U;
  T v;
  if (((uintptr_t)p & (sizeof(T) - 1)) == 0) {
    U bits = *(const volatile U*)p;
    memcpy(&v, &bits, sizeof(T));
  } else {
    const volatile unsigned char* src = (const volatile unsigned char*)p;
    unsigned char* dst = (unsigned char*)&v;
#pragma unroll
    for (int i = 0; i < (int)sizeof(T); i++) dst[i] = src[i];
  }
  return v;
}

template <typename T, typename Op, int NSRC, bool PRE, bool POST>
__device__ __forceinline__ T combine_one(const Op& op, T a, T b) {
  T v;
  if (NSRC == 1) {
    v = PRE ? op.pre(a) : a;
  } else {
    v = op.combine(a, PRE ? op.pre(b) : b);
  }
  return POST ? op.post(v) : v;
}

template <typename T, typename Op, int NSRC, bool PRE, bool POST>
__device__ __forceinline__ uint4 combine_pack(const Op& op, uint4 a, uint4 b) {
  uint4 v;
  if (NSRC == 1) {
    v = PRE ? pack_pre<T>(op, a) : a;
  } else {
    v = pack_combine<T>(op, a, PRE ? pack_pre<T>(op, b) : b);
  }
  return POST ? pack_post<T>(op, v) : v;
}

/* Element-wise loop over [begin, end), strided across the threads. */
template <typename T, typename Op, int NSRC, int NDST, bool PRE, bool POST>
__device__ __forceinline__ void reduce_copy_elems(int tid, int nthreads, const Op& op,
                                                  const T* s0, const T* s1, T* d0, T* d1,
                                                  int64_t begin, int64_t end) {
  for (int64_t i = begin + tid; i < end; i += nthreads) {
    T a = load_one(s0 + i);
    T b = NSRC == 2 ? load_one(s1 + i) : a;
    T v = combine_one<T, Op, NSRC, PRE, POST>(op, a, b);
    d0[i] = v;
    if (NDST == 2) d1[i] = v;
  }
}

template <int UNROLL, typename T, typename Op, int NSRC, int NDST, bool PRE, bool POST>
__device__ __forceinline__ void reduce_copy(int tid, int nthreads, const Op& op, const T* s0,
                                            const T* s1, T* d0, T* d1, int64_t nelem) {
  uintptr_t align = (uintptr_t)s0 | (uintptr_t)d0;
  if (NSRC == 2) align |= (uintptr_t)s1;
  if (NDST == 2) align |= (uintptr_t)d1;
  int64_t npacks = (align & 15) == 0 ? (nelem * (int64_t)sizeof(T)) / 16 : 0;

  const uint4* p0 = (const uint4*)s0;
  const uint4* p1 = (const uint4*)s1;
  uint4* q0 = (uint4*)d0;
  uint4* q1 = (uint4*)d1;
  const int64_t stride = (int64_t)nthreads * UNROLL;
  int64_t i = tid;
  /* Full rounds: every thread has UNROLL packs, no bounds checks. */
  for (; i + (UNROLL - 1) * nthreads < npacks; i += stride) {
    uint4 a[UNROLL], b[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) a[u] = load_pack(p0 + i + u * nthreads);
    if (NSRC == 2) {
#pragma unroll
      for (int u = 0; u < UNROLL; u++) b[u] = load_pack(p1 + i + u * nthreads);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      uint4 v = combine_pack<T, Op, NSRC, PRE, POST>(op, a[u], NSRC == 2 ? b[u] : a[u]);
      store_pack(q0 + i + u * nthreads, v);
      if (NDST == 2) store_pack(q1 + i + u * nthreads, v);
    }
  }
  /* The last partial round. */
  for (; i < npacks; i += nthreads) {
    uint4 a = load_pack(p0 + i);
    uint4 b = NSRC == 2 ? load_pack(p1 + i) : a;
    uint4 v = combine_pack<T, Op, NSRC, PRE, POST>(op, a, b);
    store_pack(q0 + i, v);
    if (NDST == 2) store_pack(q1 + i, v);
  }
  int64_t done = npacks * 16 / (int64_t)sizeof(T);
  if (done < nelem)
    reduce_copy_elems<T, Op, NSRC, NDST, PRE, POST>(tid, nthreads, op, s0, s1, d0, d1, done, nelem);
}

}  // namespace braid

#endif
