/*
 * A small test harness shared by every suite: checks that record a failure
 * and go on (so one run reports every broken case), a skip that uses CTest's
 * skip code, and a summary that turns failures into the exit status.
 *
 *   int main(void) { TEST_CHECK(1 + 1 == 2, "arithmetic"); return test_summary(); }
 */
#ifndef BRAID_TESTS_TEST_H
#define BRAID_TESTS_TEST_H

#include <stdio.h>
#include <stdlib.h>

#define TEST_SKIP_CODE 77

static int test_failures;
static int test_checks;

#define TEST_CHECK(cond, ...)                                            \
  do {                                                                   \
    test_checks++;                                                       \
    if (!(cond)) {                                                       \
      test_failures++;                                                   \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                      \
      fprintf(stderr, "\n");                                             \
    }                                                                    \
  } while (0)

/* Check an ncclResult_t-returning call for an expected code. */
#define TEST_EXPECT_RES(call, expected)                                                 \
  do {                                                                                  \
    int got_ = (int)(call);                                                             \
    TEST_CHECK(got_ == (int)(expected), "%s returned %d, expected %d", #call, got_,     \
               (int)(expected));                                                        \
  } while (0)

#define TEST_SKIP(...)                      \
  do {                                      \
    fprintf(stderr, "SKIP: ");              \
    fprintf(stderr, __VA_ARGS__);           \
    fprintf(stderr, "\n");                  \
    exit(TEST_SKIP_CODE);                   \
  } while (0)

static inline int test_summary(void) {
  if (test_failures) {
    fprintf(stderr, "%d of %d checks failed\n", test_failures, test_checks);
    return 1;
  }
  fprintf(stderr, "all %d checks passed\n", test_checks);
  return 0;
}

#endif
