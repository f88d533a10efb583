/*
 * The all-to-all's pairwise rounds (p2p_alltoall_partner, runtime/p2p_work.c): on every even
 * rank count from 4 to 256, each round pairs every rank with another (the partner's partner is
 * the rank, never itself), and over the nranks - 1 rounds every rank meets every other once.
 * Two ranks that disagreed would each wait for a message the other sends in another round.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/p2p_work.h"
#include "test.h"

int main(void) {
  TEST_CHECK(!p2p_alltoall_pairwise(1) && !p2p_alltoall_pairwise(2) &&
                 !p2p_alltoall_pairwise(3) && !p2p_alltoall_pairwise(5),
             "pairwise rounds only on an even count of 4 or more");
  for (int n = 4; n <= 256 && !test_failures; n += 2) {
    TEST_CHECK(p2p_alltoall_pairwise(n), "%d ranks: pairwise", n);
    unsigned char* met = calloc((size_t)n * (size_t)n, 1);
    if (met == NULL) return 1;
    for (int k = 1; k < n; k++)
      for (int r = 0; r < n; r++) {
        const int p = p2p_alltoall_partner(r, n, k);
        TEST_CHECK(p >= 0 && p < n && p != r, "%d ranks, round %d: rank %d gets partner %d", n, k,
                   r, p);
        if (p < 0 || p >= n) continue;
        TEST_CHECK(p2p_alltoall_partner(p, n, k) == r,
                   "%d ranks, round %d: %d pairs with %d, which pairs with %d", n, k, r, p,
                   p2p_alltoall_partner(p, n, k));
        met[(size_t)r * (size_t)n + (size_t)p]++;
      }
    for (int a = 0; a < n; a++)
      for (int b = 0; b < n; b++)
        TEST_CHECK(met[(size_t)a * (size_t)n + (size_t)b] == (a != b),
                   "%d ranks: rank %d meets rank %d %d times", n, a, b,
                   met[(size_t)a * (size_t)n + (size_t)b]);
    free(met);
  }
  return test_summary();
}
