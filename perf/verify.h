/*
 * What the perf tools put in buffers and what they expect back, element by
 * element. Compiled twice: as host C (unit tests, the mulsum scalar) and as
 * CUDA (verify_kernels.cu fills and checks device buffers with it), so the
 * kernels and the tests share one definition of "right".
 *
 * Inputs are a pseudo-random function of (seed, rank, element index), drawn
 * so that every result is either exact or has a provable error bound:
 *   - integers lie in [-R, R] (unsigned: [0, R]) with R = max / (4 * nranks),
 *     so sums, averages and the premultiplied sums never overflow; products
 *     wrap, and are compared modulo 2^bits, which is order-independent;
 *   - floats for sum/avg/max/min/mulsum are m * 2^-p with |m| < 2^p, p chosen
 *     so each is exactly representable in the type; products use +-2^e with
 *     e in {-1, 0, 1} (only the first K ranks; the rest give +-1), so every
 *     partial product of any subset is exact in the type;
 *   - copies (gather, broadcast, ...) and max/min/prod must match exactly;
 *     float sums must lie within nranks * eps(type) * sum(|x|) of the exact
 *     sum (the classic bound for any summation order is (n-1) * eps/2 * sum|x|
 *     plus a final rounding), averages within (n+2) * eps * sum(|x|) / n.
 * Signed integer averages truncate toward zero, as NCCL's SumPostDiv does.
 */
#ifndef BRAID_PERF_VERIFY_H
#define BRAID_PERF_VERIFY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define PERF_HD __host__ __device__
#else
#define PERF_HD
#endif

/* Type and op codes are NCCL's (ncclInt8 = 0 ... ncclFloat8e5m2 = 11;
   ncclSum = 0 ... ncclAvg = 4) plus mulsum = 5; spelled out so this header
   needs no NCCL or CUDA header. tests/unit/perf_unit_test.c checks them. */
enum {
  PERF_T_INT8 = 0, PERF_T_UINT8, PERF_T_INT32, PERF_T_UINT32, PERF_T_INT64, PERF_T_UINT64,
  PERF_T_HALF, PERF_T_FLOAT, PERF_T_DOUBLE, PERF_T_BF16, PERF_T_E4M3, PERF_T_E5M2,
  PERF_T_COUNT
};
enum { PERF_O_SUM = 0, PERF_O_PROD, PERF_O_MAX, PERF_O_MIN, PERF_O_AVG, PERF_O_MULSUM };

/* What determines every value of one checked run. */
typedef struct perf_value_desc {
  int type;
  int op;
  int nranks;
  uint64_t seed;
} perf_value_desc_t;

/* A small float format: sign, ebits of exponent, mbits of mantissa. */
typedef struct perf_minifloat {
  int ebits, mbits, bias, has_inf;
} perf_minifloat_t;

static inline PERF_HD int perf_type_size(int t) {
  switch (t) {
    case PERF_T_INT8: case PERF_T_UINT8: case PERF_T_E4M3: case PERF_T_E5M2: return 1;
    case PERF_T_HALF: case PERF_T_BF16: return 2;
    case PERF_T_INT32: case PERF_T_UINT32: case PERF_T_FLOAT: return 4;
    default: return 8;
  }
}

static inline PERF_HD int perf_type_is_float(int t) { return t >= PERF_T_HALF; }

static inline PERF_HD int perf_type_is_signed(int t) {
  return t == PERF_T_INT8 || t == PERF_T_INT32 || t == PERF_T_INT64 || perf_type_is_float(t);
}

/* The byte outputs are poisoned with before a checked run: NaN for every
   float type, and for integers 0x80.., which lies outside every input range. */
static inline PERF_HD unsigned char perf_poison_byte(int t) {
  return perf_type_is_float(t) ? 0xFF : 0x80;
}

static inline PERF_HD perf_minifloat_t perf_minifloat_of(int t) {
  perf_minifloat_t f = {5, 10, 15, 1}; /* half */
  if (t == PERF_T_BF16) { f.ebits = 8; f.mbits = 7; f.bias = 127; }
  if (t == PERF_T_E4M3) { f.ebits = 4; f.mbits = 3; f.bias = 7; f.has_inf = 0; }
  if (t == PERF_T_E5M2) { f.ebits = 5; f.mbits = 2; f.bias = 15; }
  return f;
}

/* Mantissa bits: eps(type) = 2^-bits. */
static inline PERF_HD int perf_mantissa_bits(int t) {
  switch (t) {
    case PERF_T_FLOAT: return 23;
    case PERF_T_DOUBLE: return 52;
    default: return perf_minifloat_of(t).mbits;
  }
}

/* Fraction bits of sum-style float inputs: each is m * 2^-p, |m| < 2^p. */
static inline PERF_HD int perf_input_bits(int t) {
  int m = perf_mantissa_bits(t);
  return m > 20 ? 20 : m;
}

/* How many ranks contribute a factor 2^+-1 to products (the rest give 1), so
   that any partial product stays inside the type's normal range. */
static inline PERF_HD int perf_prod_ranks(int t) {
  switch (t) {
    case PERF_T_HALF: case PERF_T_E5M2: return 14;
    case PERF_T_E4M3: return 6;
    case PERF_T_DOUBLE: return 1022;
    default: return 126; /* float, bfloat16 */
  }
}

static inline PERF_HD double perf_double_from_bits(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof(d));
  return d;
}

static inline PERF_HD uint64_t perf_double_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof(u));
  return u;
}

static inline PERF_HD double perf_nan(void) { return perf_double_from_bits(0x7ff8000000000000ull); }

static inline PERF_HD double perf_minifloat_decode(uint32_t bits, perf_minifloat_t f) {
  uint32_t emax = (1u << f.ebits) - 1, mmask = (1u << f.mbits) - 1;
  uint32_t e = (bits >> f.mbits) & emax, m = bits & mmask;
  int negative = (bits >> (f.ebits + f.mbits)) & 1;
  double v;
  if (f.has_inf && e == emax)
    v = m ? perf_nan() : perf_double_from_bits(0x7ff0000000000000ull);
  else if (!f.has_inf && e == emax && m == mmask)
    v = perf_nan();
  else if (e == 0)
    v = ldexp((double)m, 1 - f.bias - f.mbits);
  else
    v = ldexp((double)((1u << f.mbits) | m), (int)e - f.bias - f.mbits);
  return negative ? -v : v;
}

/* Round to nearest even; overflow gives inf (NaN where the format has none). */
static inline PERF_HD uint32_t perf_minifloat_encode(double v, perf_minifloat_t f) {
  uint32_t emax = (1u << f.ebits) - 1, mmask = (1u << f.mbits) - 1;
  uint32_t sign = (uint32_t)(perf_double_bits(v) >> 63) << (f.ebits + f.mbits);
  uint32_t nan_bits = f.has_inf ? (emax << f.mbits) | (1u << (f.mbits - 1)) : (emax << f.mbits) | mmask;
  if (v != v) return sign | nan_bits;
  double a = fabs(v);
  if (a == 0) return sign;
  int exp = (int)((perf_double_bits(a) >> 52) & 0x7ff) - 1023;
  if (exp < 1 - f.bias) { /* subnormal in the target; may round up to the smallest normal */
    uint32_t m = (uint32_t)rint(ldexp(a, f.bias - 1 + f.mbits));
    return sign | m;
  }
  double q = rint(ldexp(a, f.mbits - exp));
  if (q >= ldexp(1.0, f.mbits + 1)) {
    q = ldexp(1.0, f.mbits);
    exp++;
  }
  int64_t e = (int64_t)exp + f.bias;
  uint32_t m = (uint32_t)q - (1u << f.mbits);
  if (f.has_inf && e >= (int64_t)emax) return sign | (emax << f.mbits);
  if (!f.has_inf && (e > (int64_t)emax || (e == (int64_t)emax && m == mmask))) return sign | nan_bits;
  return sign | ((uint32_t)e << f.mbits) | m;
}

/* Raw bits of element i, zero-extended. */
static inline PERF_HD uint64_t perf_load_bits(int t, const void* base, size_t i) {
  const unsigned char* p = (const unsigned char*)base + i * (size_t)perf_type_size(t);
  switch (perf_type_size(t)) {
    case 1: return p[0];
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { uint64_t v; memcpy(&v, p, 8); return v; }
  }
}

static inline PERF_HD void perf_store_bits(int t, void* base, size_t i, uint64_t bits) {
  unsigned char* p = (unsigned char*)base + i * (size_t)perf_type_size(t);
  switch (perf_type_size(t)) {
    case 1: p[0] = (unsigned char)bits; break;
    case 2: { uint16_t v = (uint16_t)bits; memcpy(p, &v, 2); break; }
    case 4: { uint32_t v = (uint32_t)bits; memcpy(p, &v, 4); break; }
    default: memcpy(p, &bits, 8); break;
  }
}

/* A float type's bits as a double (exact for every type here). */
static inline PERF_HD double perf_float_from_bits(int t, uint64_t bits) {
  if (t == PERF_T_DOUBLE) return perf_double_from_bits(bits);
  if (t == PERF_T_FLOAT) {
    float f;
    uint32_t u = (uint32_t)bits;
    memcpy(&f, &u, 4);
    return (double)f;
  }
  return perf_minifloat_decode((uint32_t)bits, perf_minifloat_of(t));
}

static inline PERF_HD uint64_t perf_float_to_bits(int t, double v) {
  if (t == PERF_T_DOUBLE) return perf_double_bits(v);
  if (t == PERF_T_FLOAT) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
  }
  return perf_minifloat_encode(v, perf_minifloat_of(t));
}

static inline PERF_HD uint64_t perf_type_mask(int t) {
  int bits = 8 * perf_type_size(t);
  return bits == 64 ? ~0ull : (1ull << bits) - 1;
}

/* Largest integer input magnitude, max / (4 * nranks). */
static inline PERF_HD uint64_t perf_int_range(int t, int nranks) {
  uint64_t max = perf_type_is_signed(t) ? perf_type_mask(t) >> 1 : perf_type_mask(t);
  return max / (4ull * (uint64_t)(nranks > 0 ? nranks : 1));
}

/* splitmix64: cheap, and every bit depends on every input bit. */
static inline PERF_HD uint64_t perf_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline PERF_HD uint64_t perf_hash(const perf_value_desc_t* d, int rank, size_t index) {
  uint64_t h = perf_mix(d->seed * 0x100000001b3ull + (uint64_t)(rank + 1) * 0xd6e8feb86659fd93ull);
  return perf_mix(h ^ (uint64_t)index);
}

static inline PERF_HD int64_t perf_input_int(const perf_value_desc_t* d, int rank, size_t index) {
  uint64_t h = perf_hash(d, rank, index), r = perf_int_range(d->type, d->nranks);
  if (!perf_type_is_signed(d->type)) return (int64_t)(h % (r + 1));
  return (int64_t)(h % (2 * r + 1)) - (int64_t)r;
}

static inline PERF_HD double perf_input_float(const perf_value_desc_t* d, int rank, size_t index) {
  uint64_t h = perf_hash(d, rank, index);
  if (d->op == PERF_O_PROD) {
    double mag = 1.0;
    if (rank < perf_prod_ranks(d->type)) {
      int pick = (int)((h >> 8) & 3); /* 0,3: 2^0; 1: 2^-1; 2: 2^1 */
      mag = pick == 1 ? 0.5 : pick == 2 ? 2.0 : 1.0;
    }
    return (h & 1) ? -mag : mag;
  }
  int p = perf_input_bits(d->type);
  int64_t m = (int64_t)(h % (2ull << p)) - ((int64_t)1 << p);
  return ldexp((double)m, -p);
}

/* mulsum's per-rank scalar: 1 or 2 for integers, 1 or 1/2 for floats. */
static inline PERF_HD int64_t perf_premul_int(int rank) { return 1 + (rank & 1); }
static inline PERF_HD double perf_premul_float(int rank) { return (rank & 1) ? 0.5 : 1.0; }

/* The bits to store for input element index of rank. */
static inline PERF_HD uint64_t perf_input_bits_of(const perf_value_desc_t* d, int rank, size_t index) {
  if (perf_type_is_float(d->type)) return perf_float_to_bits(d->type, perf_input_float(d, rank, index));
  return (uint64_t)perf_input_int(d, rank, index) & perf_type_mask(d->type);
}

/* Expected bits of the integer reduction of input element index. */
static inline PERF_HD uint64_t perf_reduce_int(const perf_value_desc_t* d, size_t index) {
  int64_t acc = 0;
  uint64_t prod = 1;
  for (int r = 0; r < d->nranks; r++) {
    int64_t x = perf_input_int(d, r, index);
    switch (d->op) {
      case PERF_O_PROD: prod *= (uint64_t)x; break;
      case PERF_O_MAX: acc = (r == 0 || x > acc) ? x : acc; break;
      case PERF_O_MIN: acc = (r == 0 || x < acc) ? x : acc; break;
      case PERF_O_MULSUM: acc += perf_premul_int(r) * x; break;
      default: acc += x; break; /* sum, avg */
    }
  }
  if (d->op == PERF_O_PROD) return prod & perf_type_mask(d->type);
  if (d->op == PERF_O_AVG) acc /= d->nranks; /* C division truncates toward zero */
  return (uint64_t)acc & perf_type_mask(d->type);
}

/* The exact float reduction of input element index, and the distance from it
   a correct library may land (0: must be exact). */
static inline PERF_HD double perf_tolerance(int type, int op, int nranks, double sum_abs) {
  double eps = ldexp(1.0, -perf_mantissa_bits(type));
  if (op == PERF_O_SUM || op == PERF_O_MULSUM) return nranks * eps * sum_abs;
  if (op == PERF_O_AVG) return (nranks + 2) * eps * sum_abs / nranks;
  return 0.0;
}

static inline PERF_HD double perf_reduce_float(const perf_value_desc_t* d, size_t index, double* tol) {
  double acc = d->op == PERF_O_PROD ? 1.0 : 0.0, sum_abs = 0.0;
  for (int r = 0; r < d->nranks; r++) {
    double x = perf_input_float(d, r, index);
    if (d->op == PERF_O_MULSUM) x *= perf_premul_float(r);
    switch (d->op) {
      case PERF_O_PROD: acc *= x; break;
      case PERF_O_MAX: acc = (r == 0 || x > acc) ? x : acc; break;
      case PERF_O_MIN: acc = (r == 0 || x < acc) ? x : acc; break;
      default: acc += x; sum_abs += fabs(x); break; /* sum, avg, mulsum */
    }
  }
  if (d->op == PERF_O_AVG) acc /= d->nranks;
  *tol = perf_tolerance(d->type, d->op, d->nranks, sum_abs);
  return acc;
}

/* 1 when output element out_index differs from what src_rank's input element
   src_index (or, for src_rank < 0, the reduction of that element) says. */
static inline PERF_HD int perf_element_wrong(const perf_value_desc_t* d, int src_rank,
                                             size_t src_index, const void* out, size_t out_index) {
  uint64_t got = perf_load_bits(d->type, out, out_index);
  if (src_rank == -2) { /* common.h's PERF_SEG_POISON: still the poison */
    uint64_t want = 0;
    for (int b = 0; b < perf_type_size(d->type); b++) want = want << 8 | perf_poison_byte(d->type);
    return got != want;
  }
  if (!perf_type_is_float(d->type)) {
    uint64_t want = src_rank >= 0 ? perf_input_bits_of(d, src_rank, src_index)
                                  : perf_reduce_int(d, src_index);
    return got != want;
  }
  double tol = 0.0;
  double want = src_rank >= 0 ? perf_input_float(d, src_rank, src_index)
                              : perf_reduce_float(d, src_index, &tol);
  double value = perf_float_from_bits(d->type, got);
  return !(fabs(value - want) <= tol); /* NaN (the poison) is always wrong */
}

#endif
