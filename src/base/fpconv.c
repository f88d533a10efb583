/*
 * Host conversions for narrow floating types. Each encoder rounds to
 * nearest, ties to even, by working on the value's binary expansion: scale
 * to the target's precision, round with rint() (which rounds ties to even in
 * the default rounding mode), then pack exponent and mantissa.
 */
#include "base/fpconv.h"

#include <math.h>
#include <string.h>

/*
 * Encodes f into sign | exponent (ebits, `bias`) | mantissa (mbits).
 * Overflow (after rounding) gives the largest finite value when `saturate`,
 * infinity otherwise. `nan` is the format's quiet NaN pattern (unsigned).
 */
static uint32_t fpconv_encode(float f, int ebits, int mbits, int bias, double max_finite,
                              int saturate, uint32_t nan) {
  uint32_t sign_bit = (signbit(f) ? 1u : 0u) << (ebits + mbits);
  uint32_t inf = ((1u << ebits) - 1) << mbits;
  if (isnan(f)) return sign_bit | nan;
  double a = fabs((double)f);
  if (isinf(a)) return saturate ? fpconv_encode(signbit(f) ? -(float)max_finite : (float)max_finite,
                                                ebits, mbits, bias, max_finite, 1, nan)
                                : sign_bit | inf;
  if (a == 0.0) return sign_bit;
  int e;
  frexp(a, &e);                 /* a = m * 2^e with m in [0.5, 1) */
  int exp = e - 1;              /* a = 1.x * 2^exp */
  const int min_exp = 1 - bias; /* smallest normal exponent; below it, subnormals */
  if (exp < min_exp) exp = min_exp;
  double r = rint(ldexp(a, mbits - exp)); /* implicit bit and mantissa, rounded to even */
  if (r >= ldexp(1.0, mbits + 1)) {       /* rounding carried into the next binade */
    r /= 2;
    exp++;
  }
  uint32_t mant = (uint32_t)r, biased = 0;
  if (mant >= (1u << mbits)) {
    biased = (uint32_t)(exp + bias);
    mant -= 1u << mbits;
  }
  double back = ldexp(biased ? (double)(mant + (1u << mbits)) : (double)mant,
                      (biased ? exp : min_exp) - mbits);
  if (back > max_finite)
    return saturate ? fpconv_encode(signbit(f) ? -(float)max_finite : (float)max_finite, ebits,
                                    mbits, bias, max_finite, 1, nan)
                    : sign_bit | inf;
  return sign_bit | (biased << mbits) | mant;
}

static float fpconv_decode(uint32_t v, int ebits, int mbits, int bias, int has_inf) {
  uint32_t sign = (v >> (ebits + mbits)) & 1u;
  uint32_t exp = (v >> mbits) & ((1u << ebits) - 1);
  uint32_t mant = v & ((1u << mbits) - 1);
  uint32_t exp_all = (1u << ebits) - 1;
  double r;
  if (exp == exp_all && has_inf) {
    r = mant ? NAN : INFINITY;
  } else if (exp == exp_all && !has_inf && mant == ((1u << mbits) - 1)) {
    r = NAN;
  } else if (exp == 0) {
    r = ldexp((double)mant, 1 - bias - mbits);
  } else {
    r = ldexp(1.0 + ldexp((double)mant, -mbits), (int)exp - bias);
  }
  return (float)(sign ? -r : r);
}

uint16_t fpconv_half_from_float(float f) {
  return (uint16_t)fpconv_encode(f, 5, 10, 15, 65504.0, 0, 0x7e00);
}
float fpconv_float_from_half(uint16_t h) { return fpconv_decode(h, 5, 10, 15, 1); }

uint16_t fpconv_bf16_from_float(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
  uint32_t round = 0x7fff + ((u >> 16) & 1);
  return (uint16_t)((u + round) >> 16);
}

float fpconv_float_from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint8_t fpconv_e4m3_from_float(float f) { return (uint8_t)fpconv_encode(f, 4, 3, 7, 448.0, 1, 0x7f); }
float fpconv_float_from_e4m3(uint8_t v) { return fpconv_decode(v, 4, 3, 7, 0); }
uint8_t fpconv_e5m2_from_float(float f) { return (uint8_t)fpconv_encode(f, 5, 2, 15, 57344.0, 1, 0x7f); }
float fpconv_float_from_e5m2(uint8_t v) { return fpconv_decode(v, 5, 2, 15, 1); }
