/*
 * The public API's answers to bad input that need no GPU and no peer:
 * each returns the documented code and leaves a message in ncclGetLastError
 * that names the problem. The device API, not implemented, says so rather
 * than succeed.
 */
#include <string.h>

#include "nccl.h"
#include "test.h"

/* From nccl_device.h (not part of nccl.h); Braid exports it for programs that link it. */
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm);

static int last_error_has(const char* word) { return strstr(ncclGetLastError(NULL), word) != NULL; }

/* nccl_device.h's host functions (its header is C++ only): the layouts and types as there. */
struct test_team {
  int nRanks, rank, stride;
};
struct test_team ncclTeamWorld(ncclComm_t comm);
struct test_team ncclTeamLsa(ncclComm_t comm);
struct test_team ncclTeamRail(ncclComm_t comm);
int ncclTeamRankToWorld(ncclComm_t comm, struct test_team team, int rank);
int ncclTeamRankToLsa(ncclComm_t comm, struct test_team team, int rank);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
ncclResult_t ncclLsaBarrierCreateRequirement(struct test_team team, int nBarriers, void* outHandle,
                                             void* outReq);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, struct test_team team, int nBarriers,
                                             void* outHandle, void* outReq);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, void* outHandle, void* outReq);

/* Teams of no communicator are empty; the device API's requirements say it is missing. */
static void test_device_api_host(void) {
  struct test_team t = ncclTeamWorld(NULL);
  TEST_CHECK(t.nRanks == 0, "the world team of no comm has %d ranks", t.nRanks);
  t = ncclTeamLsa(NULL);
  TEST_CHECK(t.nRanks == 0, "the LSA team of no comm has %d ranks", t.nRanks);
  t = ncclTeamRail(NULL);
  TEST_CHECK(t.nRanks == 0, "the rail team of no comm has %d ranks", t.nRanks);
  TEST_CHECK(ncclTeamRankToWorld(NULL, t, 0) == -1, "RankToWorld of no comm");
  TEST_CHECK(ncclTeamRankToLsa(NULL, t, 0) == -1, "RankToLsa of no comm");
  TEST_CHECK(ncclLLA2ACalcSlots(32, 16) == 64 && ncclLLA2ACalcSlots(10, 1) == 10,
             "LL all-to-all slots: 8 bytes each");
  TEST_EXPECT_RES(ncclLsaBarrierCreateRequirement(t, 1, NULL, NULL), ncclInvalidUsage);
  TEST_EXPECT_RES(ncclGinBarrierCreateRequirement(NULL, t, 1, NULL, NULL), ncclInvalidUsage);
  TEST_EXPECT_RES(ncclLLA2ACreateRequirement(1, 1, NULL, NULL), ncclInvalidUsage);
  TEST_CHECK(last_error_has("not implemented"), "says so: %s", ncclGetLastError(NULL));
}

static void test_version_and_strings(void) {
  int v = 0;
  TEST_EXPECT_RES(ncclGetVersion(&v), ncclSuccess);
  TEST_CHECK(v == NCCL_VERSION_CODE, "version %d", v);
  TEST_EXPECT_RES(ncclGetVersion(NULL), ncclInvalidArgument);
  for (int r = 0; r <= ncclNumResults; r++)
    TEST_CHECK(ncclGetErrorString((ncclResult_t)r) != NULL && strlen(ncclGetErrorString((ncclResult_t)r)) > 0,
               "string for %d", r);
  TEST_CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "success string");
  TEST_CHECK(strcmp(ncclGetErrorString((ncclResult_t)-1), "unknown result code") == 0 &&
                 strcmp(ncclGetErrorString((ncclResult_t)1000), "unknown result code") == 0,
             "codes out of range have a string");
  /* Deprecated in nccl.h, still exported (PyTorch links it); no arguments to get wrong. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ncclResetDebugInit();
#pragma GCC diagnostic pop
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

static void test_mem(void) {
  void* p = (void*)0x1;
  TEST_EXPECT_RES(ncclMemAlloc(NULL, 16), ncclInvalidArgument);
  TEST_CHECK(last_error_has("ptr is NULL"), "message: %s", ncclGetLastError(NULL));
  TEST_EXPECT_RES(ncclMemAlloc(&p, 0), ncclInvalidArgument);
  TEST_CHECK(p == NULL && last_error_has("size is 0"), "message: %s", ncclGetLastError(NULL));
  TEST_EXPECT_RES(ncclMemFree(NULL), ncclSuccess);
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

/* Split, shrink, registration and simulation: argument checks before any peer is needed. */
static void test_comm_api_args(void) {
  ncclComm_t out = (ncclComm_t)0x1;
  TEST_EXPECT_RES(ncclCommSplit(NULL, 0, 0, &out, NULL), ncclInvalidArgument);
  TEST_CHECK(out == NULL && last_error_has("comm is NULL"), "split names comm: %s",
             ncclGetLastError(NULL));
  TEST_EXPECT_RES(ncclCommSplit(NULL, 0, 0, NULL, NULL), ncclInvalidArgument);
  TEST_CHECK(last_error_has("newcomm is NULL"), "split names newcomm: %s", ncclGetLastError(NULL));
  out = (ncclComm_t)0x1;
  TEST_EXPECT_RES(ncclCommShrink(NULL, NULL, 0, &out, NULL, 0), ncclInvalidArgument);
  TEST_CHECK(out == NULL, "shrink clears newcomm");
  TEST_EXPECT_RES(ncclCommRevoke(NULL, 0), ncclInvalidArgument);
  void* handle = (void*)0x1;
  TEST_EXPECT_RES(ncclCommRegister(NULL, NULL, 0, &handle), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclCommDeregister(NULL, handle), ncclInvalidArgument);
  ncclWindow_t win;
  TEST_EXPECT_RES(ncclCommWindowRegister(NULL, NULL, 0, &win, 0), ncclInvalidArgument);
  TEST_EXPECT_RES(ncclCommFinalize(NULL), ncclSuccess); /* as NCCL's: nothing to finalize */
  TEST_EXPECT_RES(ncclDevCommCreate(NULL, NULL, NULL), ncclInvalidUsage);
  TEST_CHECK(last_error_has("not implemented"), "the device API says so: %s", ncclGetLastError(NULL));
  /* Simulation: needs an initialized simInfo and an open group; an empty group takes no time. */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  TEST_EXPECT_RES(ncclGroupSimulateEnd(&sim), ncclInvalidUsage);
  TEST_CHECK(last_error_has("without a matching ncclGroupStart"), "message: %s", ncclGetLastError(NULL));
  /* NULL asks for no estimate: a plain group end (NCCL's ncclGroupEndInternal(NULL)). */
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupSimulateEnd(NULL), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupEnd(), ncclInvalidUsage); /* it closed the group */
  /* A bad simInfo fails the group and ends it, as NCCL's does. */
  ncclSimInfo_t bad = sim;
  bad.magic = 0;
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupSimulateEnd(&bad), ncclInvalidArgument); /* the inner group */
  TEST_CHECK(last_error_has("NCCL_SIM_INFO_INITIALIZER"), "names the initializer: %s",
             ncclGetLastError(NULL));
  TEST_EXPECT_RES(ncclGroupEnd(), ncclInvalidArgument); /* the outer group carries the failure */
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupSimulateEnd(&sim), ncclSuccess); /* closes the group */
  TEST_CHECK(sim.estimatedTime == 0.0f, "an empty group is estimated at %g", (double)sim.estimatedTime);
  TEST_EXPECT_RES(ncclGroupEnd(), ncclInvalidUsage);
}

int main(void) {
  test_version_and_strings();
  test_device_api_host();
  test_init_args();
  test_null_comm();
  test_mem();
  test_groups();
  test_comm_api_args();
  return test_summary();
}
