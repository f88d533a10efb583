/*
 * The public API's answers to bad input that need no GPU and no peer:
 * each returns the documented code and leaves a message in ncclGetLastError
 * that names the problem. The device API, not implemented, says so rather
 * than succeed.
 *
 * A refusal's message names the function that refused and the argument at
 * fault, and it is what ncclGetLastError says afterwards, for the thread and
 * for the communicator: an older, unrelated failure never shows instead. As
 * NCCL's, the last failure stays after later successful calls. The checks on
 * a communicator use one made without a GPU the way init makes it
 * (comm_alloc), so its calls that need no GPU can be refused.
 */
#include <string.h>

#include "abi/dev_api.h"
#include "nccl.h"
#include "runtime/comm.h"
#include "runtime/config.h"
#include "test.h"

/* From nccl_device.h (C++ only, not part of nccl.h): the layouts as abi/dev_api.h mirrors them. */
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const struct devapi_comm_req* reqs,
                               struct devapi_comm* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const struct devapi_comm* devComm);

static int last_error_has(const char* word) { return strstr(ncclGetLastError(NULL), word) != NULL; }

/*
 * `got` (from the call written `text`) must be `want`, and the message ncclGetLastError gives,
 * for the calling thread and, when `comm` is given, for that communicator, must name the
 * function `fn` and the argument `arg`.
 */
static void expect_refusal(const char* text, ncclResult_t got, ncclResult_t want, ncclComm_t comm,
                           const char* fn, const char* arg) {
  const char* mine = ncclGetLastError(NULL);
  TEST_CHECK(got == want, "%s returned %d, expected %d; ncclGetLastError: %s", text, (int)got,
             (int)want, mine);
  TEST_CHECK(strstr(mine, fn) != NULL && strstr(mine, arg) != NULL,
             "%s: the thread's last error does not name %s and %s: %s", text, fn, arg, mine);
  if (comm == NULL) return;
  const char* its = ncclGetLastError(comm);
  TEST_CHECK(strstr(its, fn) != NULL && strstr(its, arg) != NULL,
             "%s: the communicator's last error does not name %s and %s: %s", text, fn, arg, its);
}
#define EXPECT_REFUSAL(call, want, comm, fn, arg) \
  expect_refusal(#call, (call), (want), (comm), (fn), (arg))

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
ncclResult_t ncclLsaBarrierCreateRequirement(struct test_team team, int nBarriers,
                                             struct devapi_lsa_barrier* outHandle,
                                             struct devapi_resource_req* outReq);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, struct test_team team, int nBarriers,
                                             void* outHandle, void* outReq);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, struct devapi_lla2a* outHandle,
                                        struct devapi_resource_req* outReq);

/*
 * Teams of no communicator are empty; the requirements a device communicator is made from hold
 * what NCCL's inline code reads (sizes, handles to fill); GIN says it is missing.
 */
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
  struct devapi_lsa_barrier bar;
  struct devapi_lla2a a2a;
  struct devapi_resource_req req;
  EXPECT_REFUSAL(ncclLsaBarrierCreateRequirement(t, 1, NULL, &req), ncclInvalidArgument, NULL,
                 "ncclLsaBarrierCreateRequirement", "outHandle");
  EXPECT_REFUSAL(ncclLsaBarrierCreateRequirement(t, 1, &bar, NULL), ncclInvalidArgument, NULL,
                 "ncclLsaBarrierCreateRequirement", "outReq");
  EXPECT_REFUSAL(ncclLsaBarrierCreateRequirement((struct test_team){4, 1, 1}, -1, &bar, &req),
                 ncclInvalidArgument, NULL, "ncclLsaBarrierCreateRequirement", "nBarriers");
  memset(&req, 0xff, sizeof req);
  TEST_EXPECT_RES(ncclLsaBarrierCreateRequirement((struct test_team){4, 1, 1}, 3, &bar, &req),
                  ncclSuccess);
  /* Per barrier two epochs, a multicast inbox and one inbox per member: 3 * (3 + 4) words. */
  TEST_CHECK(req.buffer_size == 3 * 7 * 4 && req.out_buffer_handle == &bar.buf &&
                 bar.nbarriers == 3 && req.next == NULL && req.gin_signal_count == 0,
             "LSA barrier requirement: %zu bytes, handle %p (want %p), %d barriers",
             req.buffer_size, (void*)req.out_buffer_handle, (void*)&bar.buf, bar.nbarriers);
  EXPECT_REFUSAL(ncclLLA2ACreateRequirement(1, 1, NULL, &req), ncclInvalidArgument, NULL,
                 "ncclLLA2ACreateRequirement", "outHandle");
  EXPECT_REFUSAL(ncclLLA2ACreateRequirement(-1, 1, &a2a, &req), ncclInvalidArgument, NULL,
                 "ncclLLA2ACreateRequirement", "nBlocks");
  TEST_EXPECT_RES(ncclLLA2ACreateRequirement(2, 5, &a2a, &req), ncclSuccess);
  /* Per block an epoch line and two generations of 5 slots, 16 bytes each. */
  TEST_CHECK(req.buffer_size == 2 * 11 * 16 && req.out_buffer_handle == &a2a.buf &&
                 a2a.nslots == 5,
             "LL all-to-all requirement: %zu bytes, %u slots", req.buffer_size, a2a.nslots);
  TEST_EXPECT_RES(ncclGinBarrierCreateRequirement(NULL, t, 1, NULL, NULL), ncclInvalidUsage);
  TEST_CHECK(last_error_has("not implemented") && last_error_has("GIN"), "says so: %s",
             ncclGetLastError(NULL));
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
  TEST_EXPECT_RES(ncclDevCommCreate(NULL, NULL, NULL), ncclInvalidArgument);
  TEST_CHECK(last_error_has("ncclDevCommCreate") && last_error_has("comm"),
             "ncclDevCommCreate names comm: %s", ncclGetLastError(NULL));
  TEST_EXPECT_RES(ncclDevCommDestroy(NULL, NULL), ncclInvalidArgument);
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

/* Refusals before any communicator or GPU is needed: each names its function and argument. */
static void test_refusals_name_function_and_argument(void) {
  int x;
  ncclResult_t async;
  void* handle = (void*)0x1;
  ncclWindow_t win;
  ncclRedOp_t op;
  float s = 1;
  ncclComm_t comm = NULL;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  /* An id that is not Braid's is refused at the call, before any device or wait, naming it. */
  ncclComm_t nc = NULL;
  EXPECT_REFUSAL(ncclCommInitRank(&nc, 2, id, 0), ncclInvalidArgument, NULL, "ncclCommInitRank",
                 "ncclUniqueId");
  TEST_CHECK(nc == NULL, "a refused init gives no communicator");
  ncclUniqueId two[2];
  memset(two, 0, sizeof two);
  EXPECT_REFUSAL(ncclCommInitRankScalable(&nc, 2, 0, 2, two, NULL), ncclInvalidArgument, NULL,
                 "ncclCommInitRankScalable", "commIds[0]");
  EXPECT_REFUSAL(ncclCommCount(NULL, &x), ncclInvalidArgument, NULL, "ncclCommCount", "comm");
  EXPECT_REFUSAL(ncclCommCuDevice(NULL, &x), ncclInvalidArgument, NULL, "ncclCommCuDevice", "comm");
  EXPECT_REFUSAL(ncclCommUserRank(NULL, &x), ncclInvalidArgument, NULL, "ncclCommUserRank", "comm");
  EXPECT_REFUSAL(ncclCommGetAsyncError(NULL, &async), ncclInvalidArgument, NULL,
                 "ncclCommGetAsyncError", "comm");
  EXPECT_REFUSAL(ncclCommRegister(NULL, &s, sizeof s, &handle), ncclInvalidArgument, NULL,
                 "ncclCommRegister", "comm");
  EXPECT_REFUSAL(ncclCommDeregister(NULL, handle), ncclInvalidArgument, NULL, "ncclCommDeregister",
                 "comm");
  EXPECT_REFUSAL(ncclCommWindowRegister(NULL, &s, sizeof s, &win, NCCL_WIN_DEFAULT),
                 ncclInvalidArgument, NULL, "ncclCommWindowRegister", "comm");
  EXPECT_REFUSAL(ncclCommWindowDeregister(NULL, NULL), ncclInvalidArgument, NULL,
                 "ncclCommWindowDeregister", "comm");
  EXPECT_REFUSAL(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, ncclScalarHostImmediate, NULL),
                 ncclInvalidArgument, NULL, "ncclRedOpCreatePreMulSum", "comm");
  EXPECT_REFUSAL(ncclRedOpDestroy((ncclRedOp_t)ncclNumOps, NULL), ncclInvalidArgument, NULL,
                 "ncclRedOpDestroy", "comm");
  EXPECT_REFUSAL(ncclMemAlloc(NULL, 16), ncclInvalidArgument, NULL, "ncclMemAlloc", "ptr");
  EXPECT_REFUSAL(ncclMemAlloc((void**)&handle, 0), ncclInvalidArgument, NULL, "ncclMemAlloc",
                 "size");
  EXPECT_REFUSAL(ncclGetVersion(NULL), ncclInvalidArgument, NULL, "ncclGetVersion", "version");
  /* The config is read before any device is looked for. */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 2;
  EXPECT_REFUSAL(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, NULL,
                 "ncclCommInitRankConfig", "blocking");
  TEST_CHECK(comm == NULL, "a refused init leaves comm NULL");
  ncclConfig_t ctas = NCCL_CONFIG_INITIALIZER;
  ctas.minCTAs = 0;
  EXPECT_REFUSAL(ncclCommInitRankConfig(&comm, 1, id, 0, &ctas), ncclInvalidArgument, NULL,
                 "ncclCommInitRankConfig", "minCTAs");
  ncclConfig_t policy = NCCL_CONFIG_INITIALIZER;
  policy.CTAPolicy = 9;
  EXPECT_REFUSAL(ncclCommInitRankScalable(&comm, 1, 0, 1, &id, &policy), ncclInvalidArgument,
                 NULL, "ncclCommInitRankScalable", "CTAPolicy");
  ncclConfig_t garbage = NCCL_CONFIG_INITIALIZER;
  garbage.magic = 0;
  EXPECT_REFUSAL(ncclCommInitRankConfig(&comm, 1, id, 0, &garbage), ncclInvalidArgument, NULL,
                 "ncclCommInitRankConfig", "magic");
  ncclConfig_t tiny = NCCL_CONFIG_INITIALIZER;
  tiny.size = 4;
  EXPECT_REFUSAL(ncclCommInitRankConfig(&comm, 1, id, 0, &tiny), ncclInvalidArgument, NULL,
                 "ncclCommInitRankConfig", "size");
}

/* ncclGetLastError keeps the last failure through later successes (as NCCL's); a new one wins. */
static void test_last_error_is_the_latest(void) {
  int v = 0;
  EXPECT_REFUSAL(ncclCommUserRank(NULL, &v), ncclInvalidArgument, NULL, "ncclCommUserRank", "comm");
  TEST_EXPECT_RES(ncclGetVersion(&v), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  TEST_EXPECT_RES(ncclGroupEnd(), ncclSuccess);
  TEST_CHECK(last_error_has("ncclCommUserRank"), "the last failure is kept after successes: %s",
             ncclGetLastError(NULL));
  EXPECT_REFUSAL(ncclMemAlloc(NULL, 8), ncclInvalidArgument, NULL, "ncclMemAlloc", "ptr");
  TEST_CHECK(!last_error_has("ncclCommUserRank"), "the older failure is gone: %s",
             ncclGetLastError(NULL));
}

/* A communicator as init makes it (no GPU, no peers), READY for the calls that check so. */
static struct ncclComm* make_comm(void) {
  struct braid_config cfg;
  struct ncclComm* comm = NULL;
  if (config_resolve(NULL, &cfg) != ncclSuccess || comm_alloc(&comm, 0, 1, -1, &cfg) != ncclSuccess)
    return NULL;
  comm->state = BRAID_COMM_READY;
  return comm;
}

/*
 * Each refusal on a communicator is its ncclGetLastError, not the older failure before it
 * (every call below fails in another function than the call before it, or names another
 * argument); a success in between keeps the last failure.
 */
static void test_comm_last_error(void) {
  struct ncclComm* c = make_comm();
  TEST_CHECK(c != NULL, "comm_alloc failed: %s", ncclGetLastError(NULL));
  if (c == NULL) return;
  int x = -1;
  ncclResult_t async;
  void* handle = NULL;
  ncclWindow_t win = NULL;
  ncclRedOp_t op, op2;
  float s = 2.0f;
  /* The older failure that every later one must replace. */
  EXPECT_REFUSAL(ncclRedOpDestroy(ncclSum, c), ncclInvalidArgument, c, "ncclRedOpDestroy", "op");
  EXPECT_REFUSAL(ncclCommUserRank(c, NULL), ncclInvalidArgument, c, "ncclCommUserRank", "rank");
  EXPECT_REFUSAL(ncclCommCount(c, NULL), ncclInvalidArgument, c, "ncclCommCount", "count");
  EXPECT_REFUSAL(ncclCommCuDevice(c, NULL), ncclInvalidArgument, c, "ncclCommCuDevice", "device");
  EXPECT_REFUSAL(ncclCommGetAsyncError(c, NULL), ncclInvalidArgument, c, "ncclCommGetAsyncError",
                 "asyncError");
  EXPECT_REFUSAL(ncclCommRegister(c, &s, sizeof s, NULL), ncclInvalidArgument, c,
                 "ncclCommRegister", "handle");
  EXPECT_REFUSAL(ncclCommRegister(c, NULL, 64, &handle), ncclInvalidArgument, c,
                 "ncclCommRegister", "buff");
  TEST_CHECK(handle == NULL, "a refused registration leaves handle NULL");
  EXPECT_REFUSAL(ncclCommRegister(c, &s, 0, &handle), ncclInvalidArgument, c, "ncclCommRegister",
                 "size");
  EXPECT_REFUSAL(ncclCommDeregister(c, NULL), ncclInvalidArgument, c, "ncclCommDeregister",
                 "handle");
  EXPECT_REFUSAL(ncclCommWindowRegister(c, &s, sizeof s, NULL, NCCL_WIN_DEFAULT),
                 ncclInvalidArgument, c, "ncclCommWindowRegister", "win");
  EXPECT_REFUSAL(ncclCommDeregister(c, &s), ncclInvalidArgument, c, "ncclCommDeregister",
                 "handle");
  EXPECT_REFUSAL(ncclCommWindowRegister(c, &s, sizeof s, &win, 0x40), ncclInvalidArgument, c,
                 "ncclCommWindowRegister", "winFlags");
  EXPECT_REFUSAL(ncclCommWindowRegister(c, NULL, 64, &win, NCCL_WIN_DEFAULT), ncclInvalidArgument,
                 c, "ncclCommWindowRegister", "buff");
  EXPECT_REFUSAL(ncclCommWindowDeregister(c, (ncclWindow_t)(void*)&s), ncclInvalidArgument, c,
                 "ncclCommWindowDeregister", "win");
  EXPECT_REFUSAL(ncclCommWindowRegister(c, &s, 0, &win, NCCL_WIN_DEFAULT), ncclInvalidArgument, c,
                 "ncclCommWindowRegister", "size");
  /* Inside a group the registration waits for the group's end (as NCCL: *win set then),
   * where it runs on a thread of its own; this comm has no GPU, so there it fails. */
  TEST_EXPECT_RES(ncclGroupStart(), ncclSuccess);
  win = (ncclWindow_t)(void*)&s;
  TEST_EXPECT_RES(ncclCommWindowRegister(c, &s, sizeof s, &win, NCCL_WIN_DEFAULT), ncclSuccess);
  TEST_CHECK(win == NULL, "a deferred registration's window is NULL until the group ends");
  TEST_CHECK(ncclGroupEnd() != ncclSuccess, "the deferred registration failed at the group's end");
  TEST_CHECK(win == NULL, "a failed registration leaves the window NULL");
  struct devapi_comm_req dreq;
  struct devapi_comm dcomm;
  memset(&dreq, 0, sizeof dreq);
  memset(&dcomm, 0, sizeof dcomm);
  EXPECT_REFUSAL(ncclDevCommCreate(c, NULL, &dcomm), ncclInvalidArgument, c, "ncclDevCommCreate",
                 "reqs");
  EXPECT_REFUSAL(ncclDevCommCreate(c, &dreq, NULL), ncclInvalidArgument, c, "ncclDevCommCreate",
                 "outDevComm");
  dreq.lsa_barrier_count = -2;
  EXPECT_REFUSAL(ncclDevCommCreate(c, &dreq, &dcomm), ncclInvalidArgument, c, "ncclDevCommCreate",
                 "lsaBarrierCount");
  dreq.lsa_barrier_count = 4;
  /* Barriers across hosts are GIN's, which Braid lacks: refused, naming the field (the comm
   * poses as one of two ranks on two hosts: a rail team of two). */
  dreq.rail_gin_barrier_count = 4;
  c->nranks = 2;
  EXPECT_REFUSAL(ncclDevCommCreate(c, &dreq, &dcomm), ncclInvalidUsage, c, "ncclDevCommCreate",
                 "railGinBarrierCount");
  c->nranks = 1;
  dreq.rail_gin_barrier_count = 0;
  dreq.gin_signal_count = 1;
  EXPECT_REFUSAL(ncclDevCommCreate(c, &dreq, &dcomm), ncclInvalidUsage, c, "ncclDevCommCreate",
                 "ginSignalCount");
  dreq.gin_signal_count = 0;
  dreq.lsa_multimem = true;
  EXPECT_REFUSAL(ncclDevCommCreate(c, &dreq, &dcomm), ncclInvalidUsage, c, "ncclDevCommCreate",
                 "lsaMultimem");
  /* A zeroed device communicator was never made: nothing to destroy, as NCCL. */
  TEST_EXPECT_RES(ncclDevCommDestroy(c, &dcomm), ncclSuccess);
  dcomm.resource_window = (struct devapi_window*)(void*)&s; /* not one of this comm's */
  EXPECT_REFUSAL(ncclDevCommDestroy(c, &dcomm), ncclInvalidArgument, c, "ncclDevCommDestroy",
                 "devComm");
  EXPECT_REFUSAL(ncclRedOpCreatePreMulSum(NULL, &s, ncclFloat32, ncclScalarHostImmediate, c),
                 ncclInvalidArgument, c, "ncclRedOpCreatePreMulSum", "op");
  EXPECT_REFUSAL(ncclRedOpCreatePreMulSum(&op, NULL, ncclFloat32, ncclScalarHostImmediate, c),
                 ncclInvalidArgument, c, "ncclRedOpCreatePreMulSum", "scalar");
  EXPECT_REFUSAL(ncclRedOpCreatePreMulSum(&op, &s, ncclNumTypes, ncclScalarHostImmediate, c),
                 ncclInvalidArgument, c, "ncclRedOpCreatePreMulSum", "datatype");
  EXPECT_REFUSAL(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, (ncclScalarResidence_t)7, c),
                 ncclInvalidArgument, c, "ncclRedOpCreatePreMulSum", "residence");
  EXPECT_REFUSAL(ncclRedOpDestroy((ncclRedOp_t)-1, c), ncclInvalidArgument, c, "ncclRedOpDestroy",
                 "op");
  EXPECT_REFUSAL(ncclRedOpDestroy((ncclRedOp_t)(ncclNumOps + 3), c), ncclInvalidArgument, c,
                 "ncclRedOpDestroy", "op");
  /* Successes in between keep the last failure, on the comm and for the thread. */
  TEST_EXPECT_RES(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, ncclScalarHostImmediate, c),
                  ncclSuccess);
  TEST_EXPECT_RES(ncclRedOpCreatePreMulSum(&op2, &s, ncclFloat64, ncclScalarDevice, c),
                  ncclSuccess);
  TEST_CHECK(op >= ncclNumOps && op2 >= ncclNumOps && op != op2, "created operators %d and %d",
             (int)op, (int)op2);
  TEST_EXPECT_RES(ncclCommUserRank(c, &x), ncclSuccess);
  TEST_CHECK(x == 0, "rank %d", x);
  TEST_EXPECT_RES(ncclCommCount(c, &x), ncclSuccess);
  TEST_CHECK(x == 1, "count %d", x);
  TEST_EXPECT_RES(ncclCommGetAsyncError(c, &async), ncclSuccess);
  TEST_EXPECT_RES(ncclCommWindowDeregister(c, NULL), ncclSuccess);
  TEST_EXPECT_RES(ncclRedOpDestroy(op, c), ncclSuccess);
  TEST_CHECK(strstr(ncclGetLastError(c), "ncclRedOpDestroy") != NULL &&
                 strstr(ncclGetLastError(c), "not an operator created") != NULL,
             "the comm keeps its last failure after successes: %s", ncclGetLastError(c));
  TEST_CHECK(last_error_has("not an operator created"),
             "the thread keeps its last failure after successes: %s", ncclGetLastError(NULL));
  /* Destroyed once: a second destroy is refused; the other operator is still there. */
  EXPECT_REFUSAL(ncclRedOpDestroy(op, c), ncclInvalidArgument, c, "ncclRedOpDestroy", "op");
  TEST_EXPECT_RES(ncclRedOpDestroy(op2, c), ncclSuccess);
  /* A failure without this communicator does not become its last error. */
  EXPECT_REFUSAL(ncclCommCount(NULL, &x), ncclInvalidArgument, NULL, "ncclCommCount", "comm");
  TEST_CHECK(strstr(ncclGetLastError(c), "ncclRedOpDestroy") != NULL,
             "another call's failure is not the comm's: %s", ncclGetLastError(c));
  comm_free(c);
}

int main(void) {
  test_version_and_strings();
  test_device_api_host();
  test_init_args();
  test_null_comm();
  test_mem();
  test_groups();
  test_comm_api_args();
  test_refusals_name_function_and_argument();
  test_last_error_is_the_latest();
  test_comm_last_error();
  return test_summary();
}
