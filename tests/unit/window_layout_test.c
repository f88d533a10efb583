/*
 * Where a window maps its team's buffers (window_layout, runtime/window.c):
 * for random teams of allocations, every member's allocation lies inside its
 * own slot of the reservation, starts on its granule, and puts the member's
 * buffer at base + i * stride; the stride is a multiple of 4 GiB (the inline
 * code steps between ranks in the address's high word); offsets that
 * disagree modulo the granule are refused with a message naming the member.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utils.h"
#include "runtime/window.h"
#include "test.h"

#define GIB ((size_t)1 << 30)
#define MIB ((size_t)1 << 20)

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* Checks the invariants of a layout the function accepted. */
static void check_layout(const struct window_part* p, int n, size_t gran, size_t lead,
                         size_t stride) {
  TEST_CHECK(stride % (4 * GIB) == 0 && stride > 0, "stride %zu is not a positive multiple of 4 GiB",
             stride);
  for (int i = 0; i < n; i++) {
    /* Offsets from the reservation's start (aligned to gran by cuMemAddressReserve). */
    const size_t buffer = lead + (size_t)i * stride;
    TEST_CHECK(buffer >= p[i].offset, "member %d: its allocation would start before the reservation",
               i);
    const size_t map = buffer - p[i].offset;
    TEST_CHECK(map % gran == 0, "member %d: its mapping at %zu is not on the %zu-byte granule", i,
               map, gran);
    TEST_CHECK(map >= (size_t)i * stride, "member %d: its mapping starts in the slot before", i);
    TEST_CHECK(map + p[i].bytes <= (size_t)(i + 1) * stride,
               "member %d: its mapping (%zu + %zu) runs into the next slot (%zu)", i, map,
               p[i].bytes, (size_t)(i + 1) * stride);
  }
}

int main(void) {
  struct window_part p[8];
  size_t gran, lead, stride;

  /* ncclMemAlloc buffers of one size: no lead, a stride of 4 GiB. */
  for (int i = 0; i < 4; i++) p[i] = (struct window_part){0, 2 * MIB, 2 * MIB};
  TEST_EXPECT_RES(window_layout(p, 4, &gran, &lead, &stride), ncclSuccess);
  TEST_CHECK(gran == 2 * MIB && lead == 0 && stride == 4 * GIB, "gran %zu lead %zu stride %zu",
             gran, lead, stride);
  check_layout(p, 4, gran, lead, stride);

  /* 5 GiB buffers need 8 GiB between ranks. */
  for (int i = 0; i < 2; i++) p[i] = (struct window_part){0, 5 * GIB, 2 * MIB};
  TEST_EXPECT_RES(window_layout(p, 2, &gran, &lead, &stride), ncclSuccess);
  TEST_CHECK(stride == 8 * GIB, "stride %zu for 5 GiB buffers", stride);
  check_layout(p, 2, gran, lead, stride);

  /* Buffers inside their allocations at offsets that agree modulo the granule. */
  p[0] = (struct window_part){4096, 64 * MIB, 2 * MIB};
  p[1] = (struct window_part){6 * MIB + 4096, 8 * MIB, 2 * MIB};
  p[2] = (struct window_part){2 * MIB + 4096, 4 * GIB, 2 * MIB};
  TEST_EXPECT_RES(window_layout(p, 3, &gran, &lead, &stride), ncclSuccess);
  TEST_CHECK(lead == 6 * MIB + 4096, "lead %zu, expected the largest offset", lead);
  check_layout(p, 3, gran, lead, stride);

  /* Offsets that disagree modulo the granule cannot share one stride: refused, naming member 1. */
  p[0] = (struct window_part){0, 2 * MIB, 2 * MIB};
  p[1] = (struct window_part){4096, 2 * MIB, 2 * MIB};
  TEST_EXPECT_RES(window_layout(p, 2, &gran, &lead, &stride), ncclInvalidArgument);
  TEST_CHECK(strstr(braid_err_last(), "LSA ranks 0 and 1") != NULL &&
                 strstr(braid_err_last(), "modulo") != NULL,
             "the refusal does not name the member and the reason: %s", braid_err_last());

  /* An offset past the allocation's end is refused too. */
  p[1] = (struct window_part){2 * MIB, 2 * MIB, 2 * MIB};
  TEST_EXPECT_RES(window_layout(p, 2, &gran, &lead, &stride), ncclInvalidArgument);

  /* Random teams: granules 64 KiB or 2 MiB, offsets agreeing modulo the largest. */
  int accepted = 0;
  for (int round = 0; round < 20000; round++) {
    const int n = 1 + (int)(next_rand() % 8);
    const size_t g = next_rand() % 2 ? 2 * MIB : 64 << 10;
    const size_t rem = (next_rand() % (g / 4096)) * 4096;
    for (int i = 0; i < n; i++) {
      size_t granules = 1 + next_rand() % 3000; /* up to ~6 GiB */
      size_t off = rem + (next_rand() % granules) * g;
      size_t bytes = granules * g + (off >= granules * g ? off - granules * g + g : 0);
      if (off >= bytes) bytes = BRAID_ALIGN_UP(off + 1, g);
      p[i] = (struct window_part){off, bytes, g};
    }
    if (window_layout(p, n, &gran, &lead, &stride) != ncclSuccess) {
      TEST_CHECK(0, "round %d: a layout of agreeing offsets was refused: %s", round,
                 braid_err_last());
      break;
    }
    check_layout(p, n, gran, lead, stride);
    accepted++;
    if (test_failures) break;
  }
  TEST_CHECK(accepted == 20000, "%d of 20000 random layouts checked", accepted);
  return test_summary();
}
