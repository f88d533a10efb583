/*
 * Conversions between float and the narrow floating types (half, bfloat16,
 * fp8 e4m3 and e5m2) on the host, in plain C: round to nearest even, fp8
 * saturating to the largest finite value as the kernels do. Used to prepare
 * scalars (ncclAvg, PreMulSum) and by tests to compute reference results.
 */
#ifndef BRAID_CORE_FPCONV_H
#define BRAID_CORE_FPCONV_H

#include <stdint.h>

uint16_t fpconv_half_from_float(float f);
float fpconv_float_from_half(uint16_t h);
uint16_t fpconv_bf16_from_float(float f);
float fpconv_float_from_bf16(uint16_t b);
uint8_t fpconv_e4m3_from_float(float f);
float fpconv_float_from_e4m3(uint8_t v);
uint8_t fpconv_e5m2_from_float(float f);
float fpconv_float_from_e5m2(uint8_t v);

#endif
