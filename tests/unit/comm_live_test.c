/*
 * Use after destroy and double destroy, without a GPU: a communicator object
 * is made and freed the way init and destroy do it (comm_alloc, comm_free),
 * then every public function that takes a communicator is called with the
 * stale handle. Each must refuse it with ncclInvalidArgument and a message
 * naming it, without reading through it: under AddressSanitizer (CI's
 * sanitizer stage) a single read of the freed object fails this test.
 *
 * It also drives the table of live communicators through growth and removal
 * in an order that exercises its deletion (many handles, freed in a shuffled
 * order, each checked before and after).
 */
#include <stdint.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/config.h"
#include "nccl.h"
#include "test.h"

ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm);

static struct ncclComm* make_comm(void) {
  struct braid_config cfg;
  struct ncclComm* comm = NULL;
  if (config_resolve(NULL, &cfg) != ncclSuccess || comm_alloc(&comm, 0, 1, -1, &cfg) != ncclSuccess)
    return NULL;
  return comm;
}

static int names_stale(void) {
  return strstr(ncclGetLastError(NULL), "not a live communicator") != NULL;
}

/* Every function that takes a communicator, with the stale handle `c`. */
#define EXPECT_STALE(call)                                                                      \
  do {                                                                                          \
    TEST_EXPECT_RES(call, ncclInvalidArgument);                                                 \
    TEST_CHECK(names_stale(), "%s: message '%s' does not name the stale handle", #call,         \
               ncclGetLastError(NULL));                                                         \
  } while (0)

static void test_stale_handle(void) {
  struct ncclComm* c = make_comm();
  TEST_CHECK(c != NULL, "comm_alloc failed: %s", ncclGetLastError(NULL));
  if (c == NULL) return;
  TEST_CHECK(comm_is_live(c), "a new communicator is live");
  comm_free(c);
  TEST_CHECK(!comm_is_live(c), "a freed communicator is not live");

  int x = 0;
  ncclResult_t async;
  ncclComm_t child = (ncclComm_t)0x1;
  void* handle = NULL;
  ncclWindow_t win = NULL;
  ncclRedOp_t op;
  float scalar = 2.0f, buf[4];
  int exclude = 0;
  EXPECT_STALE(ncclCommDestroy(c)); /* double destroy */
  EXPECT_STALE(ncclCommAbort(c));
  EXPECT_STALE(ncclCommFinalize(c));
  EXPECT_STALE(ncclCommCount(c, &x));
  EXPECT_STALE(ncclCommCuDevice(c, &x));
  EXPECT_STALE(ncclCommUserRank(c, &x));
  EXPECT_STALE(ncclCommGetAsyncError(c, &async));
  EXPECT_STALE(ncclCommSplit(c, 0, 0, &child, NULL));
  TEST_CHECK(child == NULL, "a refused split leaves newcomm NULL");
  child = (ncclComm_t)0x1;
  EXPECT_STALE(ncclCommShrink(c, &exclude, 1, &child, NULL, NCCL_SHRINK_DEFAULT));
  EXPECT_STALE(ncclCommRevoke(c, 0));
  EXPECT_STALE(ncclCommRegister(c, buf, sizeof buf, &handle));
  EXPECT_STALE(ncclCommDeregister(c, (void*)0x1));
  EXPECT_STALE(ncclCommWindowRegister(c, buf, sizeof buf, &win, NCCL_WIN_DEFAULT));
  EXPECT_STALE(ncclCommWindowDeregister(c, NULL));
  EXPECT_STALE(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, c));
  EXPECT_STALE(ncclRedOpDestroy((ncclRedOp_t)ncclNumOps, c));
  EXPECT_STALE(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, c, NULL));
  EXPECT_STALE(ncclBroadcast(buf, buf, 1, ncclFloat32, 0, c, NULL));
  EXPECT_STALE(ncclBcast(buf, 1, ncclFloat32, 0, c, NULL));
  EXPECT_STALE(ncclReduce(buf, buf, 1, ncclFloat32, ncclSum, 0, c, NULL));
  EXPECT_STALE(ncclAllGather(buf, buf, 1, ncclFloat32, c, NULL));
  EXPECT_STALE(ncclReduceScatter(buf, buf, 1, ncclFloat32, ncclSum, c, NULL));
  EXPECT_STALE(ncclAlltoAll(buf, buf, 1, ncclFloat32, c, NULL));
  EXPECT_STALE(ncclGather(buf, buf, 1, ncclFloat32, 0, c, NULL));
  EXPECT_STALE(ncclScatter(buf, buf, 1, ncclFloat32, 0, c, NULL));
  EXPECT_STALE(ncclSend(buf, 1, ncclFloat32, 0, c, NULL));
  EXPECT_STALE(ncclRecv(buf, 1, ncclFloat32, 0, c, NULL));
  /* Inside a group the refusal also fails the group's end. */
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  EXPECT_STALE(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, c, NULL));
  TEST_CHECK(ncclGroupEnd() == ncclInvalidArgument, "the group of a refused call fails");
  /* ncclGetLastError with the stale handle falls back to the thread's last error. */
  TEST_CHECK(ncclGetLastError(c) != NULL && names_stale(), "ncclGetLastError(stale): %s",
             ncclGetLastError(c));
  /* The device API's calls check the handle too. */
  EXPECT_STALE(ncclDevCommCreate(c, NULL, NULL));
  EXPECT_STALE(ncclDevCommDestroy(c, NULL));
}

/* A handle that was never a communicator: an address on the stack, and a made-up one. */
static void test_never_a_comm(void) {
  uint64_t fake[64];
  memset(fake, 0xab, sizeof fake);
  int x;
  EXPECT_STALE(ncclCommCount((ncclComm_t)(void*)fake, &x));
  EXPECT_STALE(ncclCommDestroy((ncclComm_t)(void*)fake));
  EXPECT_STALE(ncclCommAbort((ncclComm_t)(uintptr_t)0x1000));
}

/* Growth past the first table size and deletion in shuffled order keep every answer right. */
static void test_table(void) {
  enum { N = 1000 };
  static struct ncclComm* comms[N];
  static int order[N];
  uint32_t seed = 12345;
  int made = 0;
  for (int i = 0; i < N; i++) {
    comms[i] = make_comm();
    made += comms[i] != NULL;
    order[i] = i;
  }
  TEST_CHECK(made == N, "made %d of %d communicators", made, N);
  if (made != N) return;
  for (int i = N - 1; i > 0; i--) { /* Fisher-Yates, a fixed seed */
    seed = seed * 1103515245u + 12345u;
    int j = (int)((seed >> 8) % (uint32_t)(i + 1));
    int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  int wrong = 0;
  for (int k = 0; k < N; k++) {
    comm_free(comms[order[k]]);
    /* Every handle freed so far is refused and every other one still accepted. */
    if (k % 97 == 0 || k == N - 1)
      for (int i = 0; i < N; i++) {
        int freed = 0;
        for (int m = 0; m <= k && !freed; m++) freed = order[m] == i;
        wrong += comm_is_live(comms[i]) == freed;
      }
  }
  TEST_CHECK(wrong == 0, "%d wrong answers from the table of live communicators", wrong);
}

int main(void) {
  test_stale_handle();
  test_never_a_comm();
  test_table();
  return test_summary();
}
