/*
 * ncclConfig_t's size/magic/version protocol: an older caller's smaller
 * struct gets defaults for what it lacks, a newer caller's larger struct has
 * its extra fields ignored, a wrong magic or an out-of-range field is
 * rejected with a message naming it. Also through the public API, which
 * must reject a bad config before touching any GPU.
 */
#include <stddef.h>
#include <string.h>

#include "runtime/config.h"
#include "base/error.h"
#include "nccl.h"
#include "test.h"

static void test_defaults(void) {
  struct braid_config c;
  TEST_EXPECT_RES(config_resolve(NULL, &c), ncclSuccess);
  TEST_CHECK(c.blocking == 1, "default blocking %d", c.blocking);
  ncclConfig_t user = NCCL_CONFIG_INITIALIZER;
  TEST_EXPECT_RES(config_resolve(&user, &c), ncclSuccess);
  TEST_CHECK(c.blocking == 1 && c.min_ctas <= c.max_ctas, "initializer gives defaults");
}

static void test_fields_taken(void) {
  struct braid_config c;
  ncclConfig_t user = NCCL_CONFIG_INITIALIZER;
  user.blocking = 0;
  user.minCTAs = 2;
  user.maxCTAs = 8;
  user.commName = "trainer";
  user.netName = "Socket";
  TEST_EXPECT_RES(config_resolve(&user, &c), ncclSuccess);
  TEST_CHECK(c.blocking == 0 && c.min_ctas == 2 && c.max_ctas == 8, "fields copied");
  TEST_CHECK(strcmp(c.comm_name, "trainer") == 0 && strcmp(c.net_name, "Socket") == 0, "names");
}

/* A caller compiled against a header that ended at splitShare. */
static void test_older_struct(void) {
  struct braid_config c;
  ncclConfig_t user = NCCL_CONFIG_INITIALIZER;
  user.size = offsetof(ncclConfig_t, splitShare) + sizeof(int);
  user.version = NCCL_VERSION(2, 18, 0);
  user.maxCTAs = 4;
  user.CTAPolicy = 99; /* beyond the old struct: must not even be looked at */
  user.nvlinkCentricSched = 12345;
  TEST_EXPECT_RES(config_resolve(&user, &c), ncclSuccess);
  TEST_CHECK(c.max_ctas == 4, "old field read");
  TEST_CHECK(c.cta_policy == NCCL_CTA_POLICY_DEFAULT, "field past the old size ignored: %d", c.cta_policy);
}

/* A caller compiled against a future header with more fields appended. */
static void test_newer_struct(void) {
  struct {
    ncclConfig_t base;
    int future_a;
    void* future_b;
  } user = {NCCL_CONFIG_INITIALIZER, 7, NULL};
  struct braid_config c;
  user.base.size = sizeof user;
  user.base.version = NCCL_VERSION(2, 30, 0);
  user.base.minCTAs = 3;
  TEST_EXPECT_RES(config_resolve(&user.base, &c), ncclSuccess);
  TEST_CHECK(c.min_ctas == 3, "known field read from a newer struct");
}

static void test_rejections(void) {
  struct braid_config c;
  ncclConfig_t user = NCCL_CONFIG_INITIALIZER;
  user.magic = 0x12345678;
  TEST_EXPECT_RES(config_resolve(&user, &c), ncclInvalidArgument);
  TEST_CHECK(strstr(braid_err_last(), "magic") && strstr(braid_err_last(), "NCCL_CONFIG_INITIALIZER"),
             "message: %s", braid_err_last());

  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.blocking = 2;
  TEST_EXPECT_RES(config_resolve(&bad, &c), ncclInvalidArgument);
  TEST_CHECK(strstr(braid_err_last(), "blocking") != NULL, "message: %s", braid_err_last());

  /* As NCCL: min > max sets both to max; values past the limits are capped; 0 is refused. */
  ncclConfig_t ctas = NCCL_CONFIG_INITIALIZER;
  ctas.minCTAs = 16;
  ctas.maxCTAs = 4;
  TEST_EXPECT_RES(config_resolve(&ctas, &c), ncclSuccess);
  TEST_CHECK(c.min_ctas == 4 && c.max_ctas == 4, "min %d max %d", c.min_ctas, c.max_ctas);
  ncclConfig_t big = NCCL_CONFIG_INITIALIZER;
  big.maxCTAs = 128;
  big.cgaClusterSize = 16;
  big.nvlsCTAs = 100;
  TEST_EXPECT_RES(config_resolve(&big, &c), ncclSuccess);
  TEST_CHECK(c.max_ctas == 64 && c.cga_cluster_size == 8 && c.nvls_ctas == 64,
             "capped: max %d cga %d nvls %d", c.max_ctas, c.cga_cluster_size, c.nvls_ctas);
  ncclConfig_t zero = NCCL_CONFIG_INITIALIZER;
  zero.maxCTAs = 0;
  TEST_EXPECT_RES(config_resolve(&zero, &c), ncclInvalidArgument);
  TEST_CHECK(strstr(braid_err_last(), "maxCTAs") != NULL, "message: %s", braid_err_last());
  ncclConfig_t nvls0 = NCCL_CONFIG_INITIALIZER;
  nvls0.nvlsCTAs = 0;
  TEST_EXPECT_RES(config_resolve(&nvls0, &c), ncclInvalidArgument);
  ncclConfig_t cga = NCCL_CONFIG_INITIALIZER;
  cga.cgaClusterSize = -1;
  TEST_EXPECT_RES(config_resolve(&cga, &c), ncclInvalidArgument);

  ncclConfig_t policy = NCCL_CONFIG_INITIALIZER;
  policy.CTAPolicy = 7;
  TEST_EXPECT_RES(config_resolve(&policy, &c), ncclInvalidArgument);
  TEST_CHECK(strstr(braid_err_last(), "CTAPolicy") != NULL, "message: %s", braid_err_last());

  ncclConfig_t tiny = NCCL_CONFIG_INITIALIZER;
  tiny.size = 4;
  TEST_EXPECT_RES(config_resolve(&tiny, &c), ncclInvalidArgument);
}

/* The public entry rejects the config before it needs a GPU or a peer. */
static void test_api_rejects_magic(void) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclConfig_t user = NCCL_CONFIG_INITIALIZER;
  user.magic = 0;
  ncclComm_t comm = (ncclComm_t)0x1;
  TEST_EXPECT_RES(ncclCommInitRankConfig(&comm, 2, id, 0, &user), ncclInvalidArgument);
  TEST_CHECK(comm == NULL, "comm cleared on failure");
  TEST_CHECK(strstr(ncclGetLastError(NULL), "magic") != NULL, "last error: %s", ncclGetLastError(NULL));
}

/* ncclCommSplit's config: NULL inherits the parent's; a given one starts from the defaults. */
static void test_split_config(void) {
  struct braid_config parent, c;
  ncclConfig_t user = NCCL_CONFIG_INITIALIZER;
  user.blocking = 0;
  user.maxCTAs = 4;
  user.commName = "parent";
  TEST_EXPECT_RES(config_resolve(&user, &parent), ncclSuccess);
  TEST_EXPECT_RES(config_resolve_from(&parent, NULL, &c), ncclSuccess);
  TEST_CHECK(c.blocking == 0 && c.max_ctas == 4 && strcmp(c.comm_name, "parent") == 0,
             "NULL inherits: blocking %d maxCTAs %d name %s", c.blocking, c.max_ctas, c.comm_name);
  ncclConfig_t child = NCCL_CONFIG_INITIALIZER;
  child.minCTAs = 2;
  struct braid_config defaults;
  TEST_EXPECT_RES(config_resolve(NULL, &defaults), ncclSuccess);
  TEST_EXPECT_RES(config_resolve_from(&parent, &child, &c), ncclSuccess);
  TEST_CHECK(c.min_ctas == 2 && c.blocking == defaults.blocking &&
                 c.max_ctas == defaults.max_ctas && strcmp(c.comm_name, parent.comm_name) != 0,
             "a given config is not merged with the parent's: blocking %d maxCTAs %d name %s",
             c.blocking, c.max_ctas, c.comm_name);
}

/*
 * `config_test env`, run with NCCL_COMM_BLOCKING=0 NCCL_MIN_CTAS=80 NCCL_MAX_CTAS=6
 * NCCL_CGA_CLUSTER_SIZE=20 NCCL_CTA_POLICY=7 NCCL_COMM_SPLIT_SHARE_RESOURCES=1 (CTest sets them):
 * NCCL's envConfigOverride, the environment winning over the caller's fields.
 */
static void test_env_overrides(void) {
  struct braid_config c, child, defaults;
  ncclConfig_t user = NCCL_CONFIG_INITIALIZER;
  user.blocking = 1;
  user.maxCTAs = 32;
  user.CTAPolicy = 1;
  TEST_EXPECT_RES(config_resolve(&user, &c), ncclSuccess);
  TEST_CHECK(c.blocking == 0, "NCCL_COMM_BLOCKING=0 wins over blocking=1: %d", c.blocking);
  TEST_CHECK(c.max_ctas == 6 && c.min_ctas == 6, "NCCL_MAX_CTAS=6, NCCL_MIN_CTAS=80 capped: %d/%d",
             c.min_ctas, c.max_ctas);
  TEST_CHECK(c.cga_cluster_size == 8, "NCCL_CGA_CLUSTER_SIZE=20 limited to 8: %d",
             c.cga_cluster_size);
  TEST_CHECK(c.cta_policy == 1, "NCCL_CTA_POLICY=7 is out of range, the caller's 1 stays: %d",
             c.cta_policy);
  TEST_CHECK(c.split_share == 1, "NCCL_COMM_SPLIT_SHARE_RESOURCES=1: %d", c.split_share);
  TEST_EXPECT_RES(config_resolve(NULL, &defaults), ncclSuccess);
  TEST_CHECK(defaults.blocking == 0 && defaults.max_ctas == 6, "no config: the same overrides");
  struct braid_config parent = c;
  parent.blocking = 1; /* as if resolved before the variable was set */
  TEST_EXPECT_RES(config_resolve_from(&parent, NULL, &child), ncclSuccess);
  TEST_CHECK(child.blocking == 0, "a split inheriting the parent's config gets them too: %d",
             child.blocking);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "env") == 0) {
    test_env_overrides();
    return test_summary();
  }
  test_defaults();
  test_fields_taken();
  test_older_struct();
  test_newer_struct();
  test_rejections();
  test_split_config();
  test_api_rejects_magic();
  return test_summary();
}
