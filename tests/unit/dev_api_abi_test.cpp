/*
 * Braid's C mirrors of NCCL's device-API structures (src/abi/dev_api.h)
 * against NCCL 2.28.9's own nccl_device.h. A kernel compiled against NCCL's
 * header reads these structures field by field through NCCL's inline code,
 * so every field must sit at the same offset with the same size, and every
 * structure must have the same size and alignment. The layout is checked at
 * compile time (a mismatch fails the build of this test, naming the field; the
 * list, dev_api_fields.inc, is the one dev_api_header_test checks Braid's header by);
 * the reciprocal NCCL's inline code divides by is checked at run time.
 *
 * Built only when the build finds nccl_device.h (tests/unit/CMakeLists.txt).
 */
#include <stddef.h>
#include <stdint.h>

#include <nccl_device.h>

#include <type_traits>

#include "abi/dev_api.h"
#include "test.h"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE != 22809
#error "dev_api_abi_test needs NCCL 2.28.9's nccl_device.h (NCCL_VERSION_CODE 22809)"
#endif
#ifdef BRAID_VERSION_CODE
#error "nccl.h came from Braid's include/, not from NCCL: the comparison would be with itself"
#endif

/* Every field and structure, at compile time. */
#include "dev_api_fields.inc"

/* devapi_rcp32(x) against nccl::utility::idivRcp32(x), and the division the
 * inline code does with it (idivFast32) gives the exact quotient. */
static void check_rcp(uint32_t x) {
  uint32_t ours = devapi_rcp32(x), theirs = nccl::utility::idivRcp32(x);
  TEST_CHECK(ours == theirs, "rcp32(%u): Braid %u, NCCL %u", x, ours, theirs);
  static const uint32_t numerators[] = {0, 1, 2, 3, 7, 4095, 4096, 65535, 1000003,
                                        0x7fffffffu, 0x80000000u};
  for (uint32_t n : numerators) {
    uint32_t q = nccl::utility::idivFast32(n, x, ours);
    TEST_CHECK(q == n / x, "idivFast32(%u, %u) with Braid's rcp: %u", n, x, q);
  }
}

int main() {
  int checked = 0;
  for (uint32_t x = 1; x <= 4096; x++, checked++) check_rcp(x);
  static const uint32_t large[] = {4097, 65535, 65536, 65537, 1000000, 1u << 20, (1u << 20) + 1,
                                   0x7fffffffu, 0x80000000u, 0x80000001u, 0xfffffffeu,
                                   0xffffffffu};
  for (uint32_t x : large) {
    check_rcp(x);
    checked++;
  }
  TEST_CHECK(checked == 4096 + (int)(sizeof(large) / sizeof(large[0])), "%d values checked",
             checked);
  fprintf(stderr, "dev_api.h matches NCCL %d's nccl_device.h: layouts (compile time), %d "
          "reciprocals\n", NCCL_VERSION_CODE, checked);
  return test_summary();
}
