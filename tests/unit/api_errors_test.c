/*
 * The public API's answers to bad input that need no GPU and no peer:
 * each returns the documented code and leaves a message in ncclGetLastError
 * that names the problem. Functions of later milestones say they are not
 * implemented rather than succeed.
 */
#include <string.h>

#include "nccl.h"
#include "test.h"

static int last_error_has(const char* word) { return strstr(ncclGetLastError(NULL), word) != NULL; }

static void test_version_and_strings(void) {
  int v = 0;
  TEST_EXPECT_RES(ncclGetVersion(&v), ncclSuccess);
  TEST_CHECK(v == NCCL_VERSION_CODE, "version %d", v);
  TEST_EXPECT_RES(ncclGetVersion(NULL), ncclInvalidArgument);
  for (int r = 0; r <= ncclNumResults; r++)
    TEST_CHECK(ncclGetErrorString((ncclResult_t)r) != NULL && strlen(ncclGetErrorString((ncclResult_t)r)) > 0,
               "string for %d", r);
  TEST_CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "success string");
  TEST_CHECK(strstr(braidGetVersionString(), "Braid") != NULL, "version string");
}

static void test_init_args(void) {
  ncclUniqueId id;
  ncclComm_t comm;
  memset(&id, 0, sizeof id);
  TEST_EXPECT_RES(ncclCommInitRank(NULL, 2, id, 0), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  TEST_CHECK(last_error_has("nranks = 0"), "names nranks: %s", ncclGetLastError(NULL));
  TEST_EXPECT_RES(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  TEST_CHECK(last_error_has("rank = 2"), "names rank: %s", ncclGetLastError(NULL));
  TEST_EXPECT_RES(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclCommInitAll(NULL, 2, NULL), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclCommInitRankScalable(&comm, 4, 0, 0, &id, NULL), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclGetUniqueId(NULL), ncclInvalidArgument);
}

static void test_null_comm(void) {
  int x;
  ncclResult_t async;
  TEST_EXPECT_RES(ncclCommCount(NULL, &x), ncclInvalidArgument);
  TEST_CHECK(last_error_has("comm is NULL"), "message: %s", ncclGetLastError(NULL));
  TEST_EXPECT_RES(ncclCommCuDevice(NULL, &x), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclCommUserRank(NULL, &x), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclCommGetAsyncError(NULL, &async), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, NULL, 0), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclSend(NULL, 0, ncclFloat, 0, NULL, 0), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclCommDestroy(NULL), ncclSuccess);
  TEST_EXPECT_RES(ncclCommAbort(NULL), ncclSuccess);
  ncclRedOp_t op;
  float s = 1;
  TEST_EXPECT_RES(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat, ncclScalarHostImmediate, NULL),
                  ncclInvalidArgument);
}

static void test_groups(void) {
  TEST_EXPECT_RES(ncclGroupEnd(), ncclInvalidUsage);
  TEST_CHECK(last_error_has("without a matching ncclGroupStart"), "message: %s", ncclGetLastError(NULL));
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupEnd(), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupEnd(), ncclSuccess);
  /* An argument error inside a group fails the group end too. */
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  TEST_EXPECT_RES(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, NULL, 0), ncclInvalidArgument);
  TEST_CHECK(ncclGroupEnd() != ncclSuccess, "group with a failed call fails");
}

static void test_pending_features(void) {
  ncclComm_t out = (ncclComm_t)0x1;
  TEST_EXPECT_RES(ncclCommSplit(NULL, 0, 0, &out, NULL), ncclInvalidUsage);
  TEST_CHECK(out == NULL && last_error_has("not implemented"), "split says so: %s", ncclGetLastError(NULL));
  void* handle;
  TEST_EXPECT_RES(ncclCommRegister(NULL, NULL, 0, &handle), ncclInvalidUsage);
  TEST_CHECK(last_error_has("not implemented"), "register says so");
  TEST_EXPECT_RES(ncclCommShrink(NULL, NULL, 0, &out, NULL, 0), ncclInvalidUsage);
  ncclWindow_t win;
  TEST_EXPECT_RES(ncclCommWindowRegister(NULL, NULL, 0, &win, 0), ncclInvalidUsage);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupSimulateEnd(&sim), ncclInvalidUsage);
  TEST_EXPECT_RES(ncclGroupEnd(), ncclInvalidUsage); /* the simulate call closed the group */
}

int main(void) {
  test_version_and_strings();
  test_init_args();
  test_null_comm();
  test_groups();
  test_pending_features();
  return test_summary();
}
