/*
 * Element types, input values and reference results for the GPU suite.
 *
 * Inputs. Values are drawn so that every reduction is meaningful and none
 * overflows: never zero; integers up to (max of the type) / nranks, a third
 * of that under PreMulSum (|scalar| <= 3), and {-2,-1,1,2} (signed) or
 * {1,2,3} (unsigned) for products; floats of magnitude below 4, and between
 * 0.5 and 2 for products. The narrow floating types draw multiples of a
 * power of two that they represent exactly (half k/256, bfloat16 k/32, e4m3
 * k/4, e5m2 k/2), so an input is never rounded and the largest sum (8 ranks)
 * stays far below the type's largest finite value (e4m3 448, e5m2 57344).
 *
 * References. Integers are exact: sums and products wrap modulo 2^bits as
 * the device computes them; ncclAvg divides the (wrapped) sum by nranks,
 * truncating toward zero (NCCL's SumPostDiv); PreMulSum is sum(s_r * x_r).
 * Floating results are computed in double, rank 0 first; a result is
 * compared with that exact value and, when not within tolerance of it, with
 * the value rounded to the type (fpconv for half, bfloat16 and fp8), which is
 * also what a failure reports. ncclAvg on floats is sum / nranks
 * (NCCL multiplies each input by 1/nranks in the type, within tolerance).
 *
 * Tolerances (floating types). The device reduces in the type's own
 * precision (fp8 through half), so each of the nranks - 1 combining steps
 * (and a PreMulSum/Avg multiplication) may round once. The allowed error is
 *
 *     nranks * rel_tol * M  +  nranks * abs_tol
 *
 * where M is the sum of |terms| for sum, avg and PreMulSum (a partial sum is
 * never larger, whatever the order), |result| for prod, and 0 for max and
 * min, which must be exact. rel_tol per type:
 *
 *     float 1e-5   double 1e-12   half 2^-9   bfloat16 2^-6   (two ulps)
 *     e4m3  2^-3   e5m2   2^-2                                 (one ulp)
 *
 * fp8 gets one ulp per rank rather than two: two (2^-1 for e5m2 with two
 * ranks) would let a result that lost one rank's contribution pass, while one
 * ulp is still twice the worst rounding (half an ulp per step). abs_tol is the
 * type's smallest subnormal, for products that end below the normal range.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/fpconv.h"
#include "gpu_test.h"

const ncclDataType_t gpu_all_types[ncclNumTypes] = {
    ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,   ncclInt64,      ncclUint64,
    ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

static const struct gpu_type ref_types[ncclNumTypes] = {
    [ncclInt8] = {"i8", 1, 0, 1, 0, 0},
    [ncclUint8] = {"u8", 1, 0, 0, 0, 0},
    [ncclInt32] = {"i32", 4, 0, 1, 0, 0},
    [ncclUint32] = {"u32", 4, 0, 0, 0, 0},
    [ncclInt64] = {"i64", 8, 0, 1, 0, 0},
    [ncclUint64] = {"u64", 8, 0, 0, 0, 0},
    [ncclFloat16] = {"f16", 2, 1, 1, 0x1p-9, 0x1p-24},
    [ncclFloat32] = {"f32", 4, 1, 1, 1e-5, 0x1p-149},
    [ncclFloat64] = {"f64", 8, 1, 1, 1e-12, 0x1p-1074},
    [ncclBfloat16] = {"bf16", 2, 1, 1, 0x1p-6, 0x1p-133},
    [ncclFloat8e4m3] = {"e4m3", 1, 1, 1, 0x1p-3, 0x1p-9},
    [ncclFloat8e5m2] = {"e5m2", 1, 1, 1, 0x1p-2, 0x1p-16},
};

/* Decoding tables for the narrow types: every bit pattern's value. */
static float half_values[65536], bf16_values[65536], e4m3_values[256], e5m2_values[256];

void ref_init(void) {
  for (uint32_t i = 0; i < 65536; i++) {
    half_values[i] = fpconv_float_from_half((uint16_t)i);
    bf16_values[i] = fpconv_float_from_bf16((uint16_t)i);
  }
  for (uint32_t i = 0; i < 256; i++) {
    e4m3_values[i] = fpconv_float_from_e4m3((uint8_t)i);
    e5m2_values[i] = fpconv_float_from_e5m2((uint8_t)i);
  }
}

const struct gpu_type* ref_type(ncclDataType_t t) { return &ref_types[t]; }

const char* ref_op_name(gpu_op_t op) {
  static const char* const names[GPU_OP_COUNT] = {
      "-", "sum", "prod", "max", "min", "avg", "premul-host", "premul-dev", "premul-same"};
  return names[op];
}

int ref_op_is_premul(gpu_op_t op) {
  return op == GPU_OP_PREMUL_HOST || op == GPU_OP_PREMUL_DEV || op == GPU_OP_PREMUL_SAME;
}

/* ---- element access -------------------------------------------------------------------------- */

/* Element i of an integer type, sign-extended (signed types) or zero-extended to 64 bits. */
static uint64_t ref_get_int(ncclDataType_t t, const void* buf, size_t i) {
  const unsigned char* p = (const unsigned char*)buf + i * ref_types[t].size;
  switch (t) {
    case ncclInt8:
      return (uint64_t)(int64_t)(int8_t)p[0];
    case ncclUint8:
      return p[0];
    case ncclInt32: {
      int32_t v;
      memcpy(&v, p, 4);
      return (uint64_t)(int64_t)v;
    }
    case ncclUint32: {
      uint32_t v;
      memcpy(&v, p, 4);
      return v;
    }
    default: {
      uint64_t v;
      memcpy(&v, p, 8);
      return v;
    }
  }
}

/* Stores the low bytes of v as element i. */
static void ref_put_int(ncclDataType_t t, void* buf, size_t i, uint64_t v) {
  size_t size = ref_types[t].size;
  unsigned char* p = (unsigned char*)buf + i * size;
  uint8_t b8 = (uint8_t)v;
  uint32_t b32 = (uint32_t)v;
  if (size == 1)
    memcpy(p, &b8, 1);
  else if (size == 4)
    memcpy(p, &b32, 4);
  else
    memcpy(p, &v, 8);
}

/* Element i of a floating type. */
static double ref_get_float(ncclDataType_t t, const void* buf, size_t i) {
  const unsigned char* p = (const unsigned char*)buf + i * ref_types[t].size;
  uint16_t h;
  switch (t) {
    case ncclFloat16:
      memcpy(&h, p, 2);
      return half_values[h];
    case ncclBfloat16:
      memcpy(&h, p, 2);
      return bf16_values[h];
    case ncclFloat8e4m3:
      return e4m3_values[p[0]];
    case ncclFloat8e5m2:
      return e5m2_values[p[0]];
    case ncclFloat32: {
      float f;
      memcpy(&f, p, 4);
      return f;
    }
    default: {
      double d;
      memcpy(&d, p, 8);
      return d;
    }
  }
}

/* Stores v, rounded to nearest even (fp8 saturating, as the device does), as element i. */
static void ref_put_float(ncclDataType_t t, void* buf, size_t i, double v) {
  unsigned char* p = (unsigned char*)buf + i * ref_types[t].size;
  uint16_t h;
  float f = (float)v;
  switch (t) {
    case ncclFloat16:
      h = fpconv_half_from_float(f);
      memcpy(p, &h, 2);
      break;
    case ncclBfloat16:
      h = fpconv_bf16_from_float(f);
      memcpy(p, &h, 2);
      break;
    case ncclFloat8e4m3:
      p[0] = fpconv_e4m3_from_float(f);
      break;
    case ncclFloat8e5m2:
      p[0] = fpconv_e5m2_from_float(f);
      break;
    case ncclFloat32:
      memcpy(p, &f, 4);
      break;
    default:
      memcpy(p, &v, 8);
      break;
  }
}

/* v rounded to type t, as a double. */
static double ref_round(ncclDataType_t t, double v) {
  unsigned char tmp[8];
  ref_put_float(t, tmp, 0, v);
  return ref_get_float(t, tmp, 0);
}

void ref_format(ncclDataType_t t, const void* buf, size_t i, char* out, size_t len) {
  const struct gpu_type* ti = &ref_types[t];
  uint64_t raw = 0;
  memcpy(&raw, (const unsigned char*)buf + i * ti->size, ti->size);
  if (!ti->is_float && ti->is_signed)
    snprintf(out, len, "%" PRId64, (int64_t)ref_get_int(t, buf, i));
  else if (!ti->is_float)
    snprintf(out, len, "%" PRIu64, ref_get_int(t, buf, i));
  else
    snprintf(out, len, "%.9g (0x%0*" PRIx64 ")", ref_get_float(t, buf, i), (int)ti->size * 2, raw);
}

/* ---- inputs ---------------------------------------------------------------------------------- */

/* splitmix64: one 64-bit draw per call, good enough and fast. */
static uint64_t rng_next(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double rng_unit(uint64_t* s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }

static void fill_int(ncclDataType_t t, gpu_op_t op, int nranks, uint64_t* s, void* buf, size_t n) {
  const struct gpu_type* ti = &ref_types[t];
  int bits = (int)ti->size * 8;
  uint64_t type_max = ti->is_signed ? (UINT64_MAX >> (65 - bits)) : (UINT64_MAX >> (64 - bits));
  uint64_t limit = type_max / (uint64_t)nranks;
  if (ref_op_is_premul(op)) limit /= 3;
  if (limit == 0) limit = 1;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rng_next(s), v;
    if (op == GPU_OP_PROD)
      v = ti->is_signed ? (uint64_t)(int64_t)((r & 1 ? 1 : 2) * (r & 2 ? -1 : 1))
                        : 1 + (r >> 8) % 3;
    else
      v = 1 + (r >> 1) % limit;
    if (op != GPU_OP_PROD && ti->is_signed && (r & 1)) v = (uint64_t)(-(int64_t)v);
    ref_put_int(t, buf, i, v);
  }
}

/* Narrow floating types: +-k/scale for k in [kmin, kmax], all exactly representable. */
struct narrow_dist {
  int kmin, kmax;
  double scale;
};

static struct narrow_dist narrow_dist_for(ncclDataType_t t, int prod) {
  switch (t) {
    case ncclFloat16:
      return prod ? (struct narrow_dist){128, 512, 256} : (struct narrow_dist){1, 1024, 256};
    case ncclBfloat16:
      return prod ? (struct narrow_dist){16, 64, 32} : (struct narrow_dist){1, 128, 32};
    case ncclFloat8e4m3:
      return prod ? (struct narrow_dist){2, 8, 4} : (struct narrow_dist){1, 16, 4};
    default:
      return prod ? (struct narrow_dist){2, 8, 4} : (struct narrow_dist){1, 8, 2};
  }
}

static void fill_narrow(ncclDataType_t t, gpu_op_t op, uint64_t* s, void* buf, size_t n) {
  struct narrow_dist d = narrow_dist_for(t, op == GPU_OP_PROD);
  int nk = d.kmax - d.kmin + 1;
  size_t size = ref_types[t].size;
  unsigned char pos[1025 * 2], neg[1025 * 2]; /* encoded +k/scale and -k/scale */
  for (int k = 0; k < nk; k++) {
    ref_put_float(t, pos, (size_t)k, (d.kmin + k) / d.scale);
    ref_put_float(t, neg, (size_t)k, -(d.kmin + k) / d.scale);
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rng_next(s);
    size_t k = (size_t)((r >> 1) % (uint64_t)nk);
    memcpy((unsigned char*)buf + i * size, (r & 1 ? neg : pos) + k * size, size);
  }
}

static void fill_wide(ncclDataType_t t, gpu_op_t op, uint64_t* s, void* buf, size_t n) {
  double lo = op == GPU_OP_PROD ? 0.5 : 1.0 / 256, hi = op == GPU_OP_PROD ? 2.0 : 4.0;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rng_next(s);
    double v = lo + (hi - lo) * rng_unit(s);
    ref_put_float(t, buf, i, r & 1 ? -v : v);
  }
}

void ref_fill(ncclDataType_t t, gpu_op_t op, int nranks, uint64_t seed, void* buf, size_t n) {
  uint64_t s = seed;
  if (!ref_types[t].is_float)
    fill_int(t, op, nranks, &s, buf, n);
  else if (t == ncclFloat32 || t == ncclFloat64)
    fill_wide(t, op, &s, buf, n);
  else
    fill_narrow(t, op, &s, buf, n);
}

/*
 * PreMulSum scalars differ per rank (each rank multiplies its own input by its own scalar),
 * except GPU_OP_PREMUL_SAME's: 1.25 or 3 on every rank.
 */
static double ref_scalar_float(gpu_op_t op, int rank) {
  static const double host[4] = {1.5, 0.75, 1.25, 1.75}, dev[4] = {-0.5, 1.25, -1.5, 0.75};
  if (op == GPU_OP_PREMUL_SAME) return 1.25;
  return op == GPU_OP_PREMUL_HOST ? host[rank % 4] : dev[rank % 4];
}

static int64_t ref_scalar_int(ncclDataType_t t, gpu_op_t op, int rank) {
  if (op == GPU_OP_PREMUL_SAME) return 3;
  if (op == GPU_OP_PREMUL_HOST) return 2 + (rank & 1);
  int64_t s = 3 - (rank & 1);
  return ref_types[t].is_signed ? -s : s;
}

void ref_premul_scalar(ncclDataType_t t, gpu_op_t op, int rank, void* out) {
  if (ref_types[t].is_float)
    ref_put_float(t, out, 0, ref_scalar_float(op, rank));
  else
    ref_put_int(t, out, 0, (uint64_t)ref_scalar_int(t, op, rank));
}

/* ---- references ------------------------------------------------------------------------------ */

void ref_ctx_init(struct ref_ctx* c, ncclDataType_t t, gpu_op_t op, int nranks) {
  memset(c, 0, sizeof *c);
  c->type = t;
  c->op = op;
  c->nranks = nranks;
  if (!ref_op_is_premul(op)) return;
  for (int r = 0; r < nranks; r++) {
    unsigned char tmp[8];
    ref_premul_scalar(t, op, r, tmp); /* as the device sees it: in the type */
    if (ref_types[t].is_float)
      c->fscalar[r] = ref_get_float(t, tmp, 0);
    else
      c->iscalar[r] = ref_get_int(t, tmp, 0);
  }
}

/* Sign-extends (signed types) the low `bits` of v, so wrapped results compare as the type's. */
static uint64_t ref_wrap(ncclDataType_t t, uint64_t v) {
  int bits = (int)ref_types[t].size * 8;
  if (bits == 64) return v;
  uint64_t mask = (1ull << bits) - 1;
  v &= mask;
  if (ref_types[t].is_signed && (v >> (bits - 1))) v |= ~mask;
  return v;
}

static uint64_t ref_reduce_int(const struct ref_ctx* c, const void* const* in, size_t idx) {
  ncclDataType_t t = c->type;
  int sgn = ref_types[t].is_signed;
  uint64_t acc = ref_get_int(t, in[0], idx);
  if (ref_op_is_premul(c->op)) acc *= c->iscalar[0];
  for (int r = 1; r < c->nranks; r++) {
    uint64_t x = ref_get_int(t, in[r], idx);
    switch (c->op) {
      case GPU_OP_PROD:
        acc *= x;
        break;
      case GPU_OP_MAX:
        acc = (sgn ? (int64_t)x > (int64_t)acc : x > acc) ? x : acc;
        break;
      case GPU_OP_MIN:
        acc = (sgn ? (int64_t)x < (int64_t)acc : x < acc) ? x : acc;
        break;
      case GPU_OP_PREMUL_HOST:
      case GPU_OP_PREMUL_DEV:
      case GPU_OP_PREMUL_SAME:
        acc += x * c->iscalar[r];
        break;
      default:
        acc += x;
        break;
    }
  }
  acc = ref_wrap(t, acc);
  if (c->op == GPU_OP_AVG) /* the wrapped sum, divided, truncating toward zero */
    acc = sgn ? (uint64_t)((int64_t)acc / c->nranks) : acc / (uint64_t)c->nranks;
  return acc;
}

/* The exact reduction in double (not rounded to the type) and how far the device may be from it. */
static double ref_reduce_float(const struct ref_ctx* c, const void* const* in, size_t idx,
                               double* tol) {
  int premul = ref_op_is_premul(c->op);
  double acc = 0, mag = 0;
  for (int r = 0; r < c->nranks; r++) {
    double x = ref_get_float(c->type, in[r], idx);
    if (premul) x *= c->fscalar[r];
    mag += fabs(x);
    if (r == 0) {
      acc = x;
      continue;
    }
    switch (c->op) {
      case GPU_OP_PROD:
        acc *= x;
        break;
      case GPU_OP_MAX:
        acc = x > acc ? x : acc;
        break;
      case GPU_OP_MIN:
        acc = x < acc ? x : acc;
        break;
      default:
        acc += x;
        break;
    }
  }
  if (c->op == GPU_OP_AVG) {
    acc /= c->nranks;
    mag /= c->nranks;
  }
  if (c->op == GPU_OP_PROD) mag = fabs(acc);
  const struct gpu_type* ti = &ref_types[c->type];
  int exact = c->op == GPU_OP_MAX || c->op == GPU_OP_MIN;
  *tol = exact ? 0 : c->nranks * (ti->rel_tol * mag + ti->abs_tol);
  return acc;
}

int ref_check_reduced(const struct ref_ctx* c, const void* const* in, size_t idx, const void* got,
                      size_t j, char* why, size_t why_len) {
  ncclDataType_t t = c->type;
  if (!ref_types[t].is_float) {
    uint64_t want = ref_reduce_int(c, in, idx);
    if (ref_get_int(t, got, j) == want) return 1;
    if (why) {
      unsigned char w[8];
      char g[64], e[64];
      ref_put_int(t, w, 0, want);
      ref_format(t, got, j, g, sizeof g);
      ref_format(t, w, 0, e, sizeof e);
      snprintf(why, why_len, "got %s, expected %s", g, e);
    }
    return 0;
  }
  double tol, exact = ref_reduce_float(c, in, idx, &tol), v = ref_get_float(t, got, j);
  /* The tolerance covers the final rounding too, so the exact value is compared first (fast);
   * the value rounded to the type (what an exact device returns) is the one reported. */
  if (fabs(v - exact) <= tol) return 1; /* false for NaN */
  double want = ref_round(t, exact);
  if (fabs(v - want) <= tol) return 1;
  if (why) {
    char g[64];
    ref_format(t, got, j, g, sizeof g);
    snprintf(why, why_len, "got %s, expected %.9g (tolerance %.3g)", g, want, tol);
  }
  return 0;
}

int ref_check_copied(ncclDataType_t t, const void* want, size_t idx, const void* got, size_t j,
                     char* why, size_t why_len) {
  size_t size = ref_types[t].size;
  if (memcmp((const char*)want + idx * size, (const char*)got + j * size, size) == 0) return 1;
  if (why) {
    char g[64], e[64];
    ref_format(t, got, j, g, sizeof g);
    ref_format(t, want, idx, e, sizeof e);
    snprintf(why, why_len, "got %s, expected %s", g, e);
  }
  return 0;
}
