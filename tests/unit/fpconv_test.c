/*
 * Host conversions of narrow floating types against known encodings:
 * rounding to nearest even, subnormals, overflow (infinity for half,
 * saturation for fp8), and that every fp8 value survives a round trip.
 */
#include <math.h>

#include "base/fpconv.h"
#include "test.h"

static void test_half(void) {
  TEST_CHECK(fpconv_half_from_float(1.0f) == 0x3c00, "1.0");
  TEST_CHECK(fpconv_half_from_float(-2.0f) == 0xc000, "-2.0");
  TEST_CHECK(fpconv_half_from_float(65504.0f) == 0x7bff, "max");
  TEST_CHECK(fpconv_half_from_float(65520.0f) == 0x7c00, "rounds to inf");
  TEST_CHECK(fpconv_half_from_float(65519.0f) == 0x7bff, "just below the tie stays finite");
  TEST_CHECK(fpconv_half_from_float(5.9604645e-8f) == 0x0001, "smallest subnormal");
  TEST_CHECK(fpconv_half_from_float(1.0f + 1.0f / 2048) == 0x3c00, "tie to even (down)");
  TEST_CHECK(fpconv_half_from_float(1.0f + 3.0f / 2048) == 0x3c02, "tie to even (up)");
  TEST_CHECK(isnan(fpconv_float_from_half(fpconv_half_from_float(NAN))), "nan");
  for (unsigned h = 0; h < 0x7c00; h++) /* every finite positive half round-trips */
    if (fpconv_half_from_float(fpconv_float_from_half((uint16_t)h)) != h) {
      TEST_CHECK(0, "half 0x%04x does not round-trip", h);
      break;
    }
}

static void test_bf16(void) {
  TEST_CHECK(fpconv_bf16_from_float(1.0f) == 0x3f80, "1.0");
  TEST_CHECK(fpconv_bf16_from_float(-1.5f) == 0xbfc0, "-1.5");
  TEST_CHECK(fpconv_float_from_bf16(0x4049) == 3.140625f, "decode");
  TEST_CHECK(fpconv_bf16_from_float(1.00390625f) == 0x3f80, "tie to even");
}

static void test_fp8(void) {
  TEST_CHECK(fpconv_e4m3_from_float(1.0f) == 0x38, "e4m3 1.0");
  TEST_CHECK(fpconv_e4m3_from_float(448.0f) == 0x7e, "e4m3 max");
  TEST_CHECK(fpconv_e4m3_from_float(1000.0f) == 0x7e, "e4m3 saturates");
  TEST_CHECK(fpconv_e4m3_from_float(-1000.0f) == 0xfe, "e4m3 saturates negative");
  TEST_CHECK(fpconv_e4m3_from_float(INFINITY) == 0x7e, "e4m3 inf saturates");
  TEST_CHECK(fpconv_float_from_e4m3(0x01) == ldexpf(1.0f, -9), "e4m3 smallest subnormal");
  TEST_CHECK(fpconv_e5m2_from_float(1.0f) == 0x3c, "e5m2 1.0");
  TEST_CHECK(fpconv_e5m2_from_float(57344.0f) == 0x7b, "e5m2 max");
  TEST_CHECK(fpconv_e5m2_from_float(1e9f) == 0x7b, "e5m2 saturates");
  for (unsigned v = 0; v < 256; v++) {
    float f = fpconv_float_from_e4m3((uint8_t)v);
    if (!isnan(f)) TEST_CHECK(fpconv_e4m3_from_float(f) == v || f == 0.0f, "e4m3 0x%02x round trip", v);
    float g = fpconv_float_from_e5m2((uint8_t)v);
    if (!isnan(g) && !isinf(g)) TEST_CHECK(fpconv_e5m2_from_float(g) == v || g == 0.0f, "e5m2 0x%02x round trip", v);
  }
}

int main(void) {
  test_half();
  test_bf16();
  test_fp8();
  return test_summary();
}
