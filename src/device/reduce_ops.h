/*
 * Reduction operators for every element type, applied element by element or
 * to a 16-byte pack of elements at once.
 *
 * Precision follows NCCL: each type is reduced in its own precision
 * (half with half arithmetic, bfloat16 with bfloat16 arithmetic), except fp8,
 * which is widened to half, combined, and rounded back to fp8 with saturation
 * to the largest finite value. The pack and element forms give bit-identical
 * results, so where a buffer's tail falls does not change the answer.
 *
 * An operator may also carry a `pre` step (PreMulSum multiplies each rank's
 * own input by a scalar before it enters the reduction) and a `post` step
 * (SumPostDiv divides the final sum by nranks: ncclAvg on integers).
 */
#ifndef BRAID_DEVICE_REDUCE_OPS_H
#define BRAID_DEVICE_REDUCE_OPS_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <type_traits>

#include "abi/dev_comm.h"

namespace braid {

/* ---- Element arithmetic per type ------------------------------------------------------------ */

/* Integer arithmetic wraps (computed unsigned, so signed overflow is defined). */
template <typename T>
struct int_math {
  typedef typename std::make_unsigned<T>::type U;
  static __device__ __forceinline__ T add(T a, T b) { return (T)((U)a + (U)b); }
  static __device__ __forceinline__ T mul(T a, T b) { return (T)((U)a * (U)b); }
  static __device__ __forceinline__ T max(T a, T b) { return a > b ? a : b; }
  static __device__ __forceinline__ T min(T a, T b) { return a < b ? a : b; }
  static __device__ __forceinline__ T div(T a, int n) { return (T)(a / (T)n); }
};

template <typename T>
struct math : int_math<T> {};

/*
 * Floating add and multiply round each result (__fadd_rn, __fmul_rn): the compiler may not fuse
 * PreMulSum's `acc + x * scalar` into one FMA. Fused, a rank that reduces the inputs itself
 * (direct and symmetric all-reduce) would get fma(x1, s, x0 * s) where its peer gets
 * fma(x0, s, x1 * s): results that differ between ranks in the last bit.
 */
template <>
struct math<float> {
  static __device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
  static __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
  static __device__ __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
  static __device__ __forceinline__ float min(float a, float b) { return fminf(a, b); }
  static __device__ __forceinline__ float div(float a, int n) { return a / (float)n; }
};

template <>
struct math<double> {
  static __device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
  static __device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
  static __device__ __forceinline__ double max(double a, double b) { return fmax(a, b); }
  static __device__ __forceinline__ double min(double a, double b) { return fmin(a, b); }
  static __device__ __forceinline__ double div(double a, int n) { return a / (double)n; }
};

template <>
struct math<__half> {
  static __device__ __forceinline__ __half add(__half a, __half b) { return __hadd(a, b); }
  static __device__ __forceinline__ __half mul(__half a, __half b) { return __hmul(a, b); }
  static __device__ __forceinline__ __half max(__half a, __half b) { return __hmax(a, b); }
  static __device__ __forceinline__ __half min(__half a, __half b) { return __hmin(a, b); }
  static __device__ __forceinline__ __half div(__half a, int n) {
    return __float2half(__half2float(a) / (float)n);
  }
};

template <>
struct math<__nv_bfloat16> {
  typedef __nv_bfloat16 T;
  static __device__ __forceinline__ T add(T a, T b) { return __hadd(a, b); }
  static __device__ __forceinline__ T mul(T a, T b) { return __hmul(a, b); }
  static __device__ __forceinline__ T max(T a, T b) { return __hmax(a, b); }
  static __device__ __forceinline__ T min(T a, T b) { return __hmin(a, b); }
  static __device__ __forceinline__ T div(T a, int n) {
    return __float2bfloat16(__bfloat162float(a) / (float)n);
  }
};

/* fp8: widen to half, combine, round back with saturation to the largest finite value. */
template <typename F8, __nv_fp8_interpretation_t KIND>
struct fp8_math {
  static __device__ __forceinline__ __half up(F8 x) {
    return __half(__nv_cvt_fp8_to_halfraw(x.__x, KIND));
  }
  static __device__ __forceinline__ F8 down(__half h) {
    F8 r;
    r.__x = __nv_cvt_halfraw_to_fp8(__half_raw(h), __NV_SATFINITE, KIND);
    return r;
  }
  static __device__ __forceinline__ F8 add(F8 a, F8 b) { return down(__hadd(up(a), up(b))); }
  static __device__ __forceinline__ F8 mul(F8 a, F8 b) { return down(__hmul(up(a), up(b))); }
  static __device__ __forceinline__ F8 max(F8 a, F8 b) { return down(__hmax(up(a), up(b))); }
  static __device__ __forceinline__ F8 min(F8 a, F8 b) { return down(__hmin(up(a), up(b))); }
  static __device__ __forceinline__ F8 div(F8 a, int n) {
    return down(__float2half(__half2float(up(a)) / (float)n));
  }
};
template <>
struct math<__nv_fp8_e4m3> : fp8_math<__nv_fp8_e4m3, __NV_E4M3> {};
template <>
struct math<__nv_fp8_e5m2> : fp8_math<__nv_fp8_e5m2, __NV_E5M2> {};

/* Loads a scalar of type T from the 64-bit value the host packed (low bytes first). */
template <typename T>
__device__ __forceinline__ T scalar_from_bits(uint64_t bits) {
  T v;
  memcpy(&v, &bits, sizeof(T));
  return v;
}

/* ---- Operators ------------------------------------------------------------------------------ */

/* Every operator: combine(a, b); pre(x) for a rank's own input; post(x) for the final value. */
template <typename T>
struct op_sum {
  static constexpr bool has_pre = false, has_post = false;
  __device__ op_sum(uint64_t, int) {}
  __device__ __forceinline__ T combine(T a, T b) const { return math<T>::add(a, b); }
  __device__ __forceinline__ T pre(T x) const { return x; }
  __device__ __forceinline__ T post(T x) const { return x; }
};

template <typename T>
struct op_prod {
  static constexpr bool has_pre = false, has_post = false;
  __device__ op_prod(uint64_t, int) {}
  __device__ __forceinline__ T combine(T a, T b) const { return math<T>::mul(a, b); }
  __device__ __forceinline__ T pre(T x) const { return x; }
  __device__ __forceinline__ T post(T x) const { return x; }
};

template <typename T>
struct op_max {
  static constexpr bool has_pre = false, has_post = false;
  __device__ op_max(uint64_t, int) {}
  __device__ __forceinline__ T combine(T a, T b) const { return math<T>::max(a, b); }
  __device__ __forceinline__ T pre(T x) const { return x; }
  __device__ __forceinline__ T post(T x) const { return x; }
};

template <typename T>
struct op_min {
  static constexpr bool has_pre = false, has_post = false;
  __device__ op_min(uint64_t, int) {}
  __device__ __forceinline__ T combine(T a, T b) const { return math<T>::min(a, b); }
  __device__ __forceinline__ T pre(T x) const { return x; }
  __device__ __forceinline__ T post(T x) const { return x; }
};

/* The scalar is resolved by the kernel before the op is built (device pointers dereferenced). */
template <typename T>
struct op_premulsum {
  static constexpr bool has_pre = true, has_post = false;
  T scalar;
  __device__ op_premulsum(uint64_t bits, int) : scalar(scalar_from_bits<T>(bits)) {}
  __device__ __forceinline__ T combine(T a, T b) const { return math<T>::add(a, b); }
  __device__ __forceinline__ T pre(T x) const { return math<T>::mul(x, scalar); }
  __device__ __forceinline__ T post(T x) const { return x; }
};

template <typename T>
struct op_sumpostdiv {
  static constexpr bool has_pre = false, has_post = true;
  int nranks;
  __device__ op_sumpostdiv(uint64_t, int n) : nranks(n) {}
  __device__ __forceinline__ T combine(T a, T b) const { return math<T>::add(a, b); }
  __device__ __forceinline__ T pre(T x) const { return x; }
  __device__ __forceinline__ T post(T x) const { return math<T>::div(x, nranks); }
};

/* A copy has nothing to combine; used by the collectives that only move bytes. */
template <typename T>
struct op_copy {
  static constexpr bool has_pre = false, has_post = false;
  __device__ op_copy(uint64_t = 0, int = 0) {}
  __device__ __forceinline__ T combine(T a, T) const { return a; }
  __device__ __forceinline__ T pre(T x) const { return x; }
  __device__ __forceinline__ T post(T x) const { return x; }
};

/*
 * Whether the protocols' pipeline steps are compiled inline for this operator. Inline, a step
 * keeps the primitives' state in registers from one step to the next; out of line, each step
 * is compiled once per kernel instead of at every call site of the algorithms, which cuts a
 * kernel's compile time by a sixth (float) to over a third (int8) (docs/tuning.md, Steps out of
 * line). Inline for the operators frameworks run on their hot paths: sum, PreMulSum on
 * floating types (ncclAvg), and the copies of the byte-moving collectives; out of line for
 * prod, max, min and the integer averages and PreMulSums.
 */
template <typename T>
struct is_floating {
  static constexpr bool value = std::is_floating_point<T>::value;
};
template <> struct is_floating<__half> { static constexpr bool value = true; };
template <> struct is_floating<__nv_bfloat16> { static constexpr bool value = true; };
template <> struct is_floating<__nv_fp8_e4m3> { static constexpr bool value = true; };
template <> struct is_floating<__nv_fp8_e5m2> { static constexpr bool value = true; };

template <typename T, typename Op>
struct steps_inline { static constexpr bool value = false; };
template <typename T>
struct steps_inline<T, op_sum<T>> { static constexpr bool value = true; };
template <typename T>
struct steps_inline<T, op_copy<T>> { static constexpr bool value = true; };
template <typename T>
struct steps_inline<T, op_premulsum<T>> { static constexpr bool value = is_floating<T>::value; };

/* ---- 16-byte packs -------------------------------------------------------------------------- */

template <typename T>
struct pack {
  static constexpr int N = 16 / sizeof(T);
  union {
    uint4 u;
    T e[N];
  };
};

/* Applies f element-wise to the lanes of two packs. The compiler keeps the lanes in registers. */
template <typename T, typename F>
__device__ __forceinline__ uint4 pack_map2(uint4 a, uint4 b, F f) {
  pack<T> x, y, r;
  x.u = a;
  y.u = b;
#pragma unroll
  for (int i = 0; i < pack<T>::N; i++) r.e[i] = f(x.e[i], y.e[i]);
  return r.u;
}

template <typename T, typename F>
__device__ __forceinline__ uint4 pack_map1(uint4 a, F f) {
  pack<T> x, r;
  x.u = a;
#pragma unroll
  for (int i = 0; i < pack<T>::N; i++) r.e[i] = f(x.e[i]);
  return r.u;
}

template <typename T, typename Op>
__device__ __forceinline__ uint4 pack_combine(const Op& op, uint4 a, uint4 b) {
  return pack_map2<T>(a, b, [&](T x, T y) { return op.combine(x, y); });
}
template <typename T, typename Op>
__device__ __forceinline__ uint4 pack_pre(const Op& op, uint4 a) {
  return pack_map1<T>(a, [&](T x) { return op.pre(x); });
}
template <typename T, typename Op>
__device__ __forceinline__ uint4 pack_post(const Op& op, uint4 a) {
  return pack_map1<T>(a, [&](T x) { return op.post(x); });
}

}  // namespace braid

#endif
