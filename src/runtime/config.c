/*
 * Reading ncclConfig_t. The caller's struct says its own size; a field is
 * read only if it lies entirely within that size, so a program compiled
 * against an older header (smaller struct) gets defaults for the fields it
 * does not have, and one compiled against a newer header (larger struct)
 * has its extra fields ignored. The magic tells an initialised struct from
 * stack garbage.
 */
#include "runtime/config.h"

#include <stddef.h>
#include <stdio.h>
#include <limits.h>
#include <string.h>

#include "base/debug.h"
#include "base/error.h"
#include "base/param.h"

#define CONFIG_MAX_CTAS 64
#define CONFIG_MAX_CGA_CLUSTER 8 /* NCCL_MAX_CGA_CLUSTER_SIZE */

static void config_defaults(struct braid_config* c) {
  memset(c, 0, sizeof *c);
  c->blocking = 1;
  c->cga_cluster_size = -1; /* NCCL's undefined: the device decides (dev_state.c) */
  c->min_ctas = 1;
  c->max_ctas = CONFIG_MAX_CTAS;
  c->split_share = 0;
  c->traffic_class = -1;
  c->collnet_enable = 0;
  c->cta_policy = NCCL_CTA_POLICY_DEFAULT;
  c->shrink_share = 0;
  c->nvls_ctas = 0;
  c->nchannels_per_net_peer = 0;
  c->nvlink_centric_sched = 0;
}

/* Whether the caller's struct of `size` bytes contains the field at [offset, offset+len). */
#define HAS_FIELD(size, field) \
  ((size) >= offsetof(ncclConfig_t, field) + sizeof(((ncclConfig_t*)0)->field))

/* A value past what Braid (and NCCL) can use is capped, as NCCL does, and said at INFO. */
static void config_cap(int* value, int max, const char* name) {
  if (*value <= max) return;
  INFO(BRAID_LOG_INIT, "ncclConfig_t.%s = %d is larger than its limit %d: capped to %d", name,
       *value, max, max);
  *value = max;
}

/* A refusal's message starts with the function given the config ("ncclCommInitRankConfig: "). */
#define API_FMT "%s%s"
#define API_ARG(api) (api) ? (api) : "", (api) ? ": " : ""

static ncclResult_t config_check_range(const char* api, const char* name, int value, int lo,
                                       int hi) {
  if (value == NCCL_CONFIG_UNDEF_INT || (value >= lo && value <= hi)) return ncclSuccess;
  return braid_err(ncclInvalidArgument, API_FMT "config->%s = %d is out of range [%d, %d]",
                   API_ARG(api), name, value, lo, hi);
}

/* Copies field `f` into `dst` when present in the caller's struct and defined. */
#define TAKE_INT(user, size, f, dst)                                               \
  do {                                                                             \
    if (HAS_FIELD(size, f) && (user)->f != NCCL_CONFIG_UNDEF_INT) (dst) = (user)->f; \
  } while (0)

static ncclResult_t config_apply(const ncclConfig_t* user, struct braid_config* c,
                                 const char* api) {
  ncclResult_t res = ncclSuccess;
  if (user == NULL) return ncclSuccess;
  BRAID_CHECK(user->magic == NCCL_CONFIG_MAGIC, ncclInvalidArgument,
              API_FMT "config->magic = 0x%x, expected 0x%x: initialise the ncclConfig_t with "
              "NCCL_CONFIG_INITIALIZER before setting fields",
              API_ARG(api), user->magic, NCCL_CONFIG_MAGIC);
  size_t size = user->size;
  BRAID_CHECK(size >= offsetof(ncclConfig_t, blocking), ncclInvalidArgument,
              API_FMT "config->size = %zu is too small to be an ncclConfig_t", API_ARG(api),
              size);
  if (size > sizeof(ncclConfig_t))
    INFO(BRAID_LOG_INIT, "ncclConfig_t from a newer header (size %zu, version %u): fields past "
         "%zu bytes are ignored", size, user->version, sizeof(ncclConfig_t));

  if (HAS_FIELD(size, blocking)) {
    if (user->blocking != NCCL_CONFIG_UNDEF_INT) {
      BRAID_CHECK(user->blocking == 0 || user->blocking == 1, ncclInvalidArgument,
                  API_FMT "config->blocking = %d: must be 0 or 1", API_ARG(api),
                  user->blocking);
      c->blocking = user->blocking;
    }
  }
  /* As NCCL: nonsense is refused, values past the limits are capped (config_finish), said at INFO. */
  if (HAS_FIELD(size, cgaClusterSize))
    BRAID_TRY(config_check_range(api, "cgaClusterSize", user->cgaClusterSize, 0, INT_MAX));
  if (HAS_FIELD(size, minCTAs)) BRAID_TRY(config_check_range(api, "minCTAs", user->minCTAs, 1, INT_MAX));
  if (HAS_FIELD(size, maxCTAs)) BRAID_TRY(config_check_range(api, "maxCTAs", user->maxCTAs, 1, INT_MAX));
  if (HAS_FIELD(size, CTAPolicy)) BRAID_TRY(config_check_range(api, "CTAPolicy", user->CTAPolicy, 0, 2));
  if (HAS_FIELD(size, splitShare)) BRAID_TRY(config_check_range(api, "splitShare", user->splitShare, 0, 1));
  if (HAS_FIELD(size, shrinkShare)) BRAID_TRY(config_check_range(api, "shrinkShare", user->shrinkShare, 0, 1));
  if (HAS_FIELD(size, collnetEnable)) BRAID_TRY(config_check_range(api, "collnetEnable", user->collnetEnable, 0, 1));
  if (HAS_FIELD(size, nvlsCTAs)) BRAID_TRY(config_check_range(api, "nvlsCTAs", user->nvlsCTAs, 1, INT_MAX));
  if (HAS_FIELD(size, nChannelsPerNetPeer))
    BRAID_TRY(config_check_range(api, "nChannelsPerNetPeer", user->nChannelsPerNetPeer, 1, CONFIG_MAX_CTAS));
  if (HAS_FIELD(size, nvlinkCentricSched))
    BRAID_TRY(config_check_range(api, "nvlinkCentricSched", user->nvlinkCentricSched, 0, 1));

  TAKE_INT(user, size, cgaClusterSize, c->cga_cluster_size);
  TAKE_INT(user, size, minCTAs, c->min_ctas);
  TAKE_INT(user, size, maxCTAs, c->max_ctas);
  TAKE_INT(user, size, splitShare, c->split_share);
  TAKE_INT(user, size, trafficClass, c->traffic_class);
  TAKE_INT(user, size, collnetEnable, c->collnet_enable);
  TAKE_INT(user, size, CTAPolicy, c->cta_policy);
  TAKE_INT(user, size, shrinkShare, c->shrink_share);
  TAKE_INT(user, size, nvlsCTAs, c->nvls_ctas);
  TAKE_INT(user, size, nChannelsPerNetPeer, c->nchannels_per_net_peer);
  TAKE_INT(user, size, nvlinkCentricSched, c->nvlink_centric_sched);
  if (HAS_FIELD(size, netName) && user->netName != NULL)
    snprintf(c->net_name, sizeof c->net_name, "%s", user->netName);
  if (HAS_FIELD(size, commName) && user->commName != NULL)
    snprintf(c->comm_name, sizeof c->comm_name, "%s", user->commName);
  /* Values past the limits are capped once the environment had its say (config_finish). */
  return ncclSuccess;
fail:
  return res;
}

/* The variable a parameter was set by: NCCL_X or BRAID_X. */
static const char* config_env_name(braid_param_id_t id) {
  return braid_param_source(id) == BRAID_PARAM_FROM_NCCL_ENV ? braid_param_alias(id)
                                                              : braid_param_name(id);
}

/* One override: the environment's value when set and in [lo, hi] (else said at INFO, ignored). */
static void config_env_int(braid_param_id_t id, const char* field, int lo, int hi, int* dst) {
  int64_t v = braid_param_int(id);
  if (braid_param_source(id) == BRAID_PARAM_FROM_DEFAULT || v == -1) return;
  if (v < lo || v > hi) {
    INFO(BRAID_LOG_ENV, "%s=%lld is out of range [%d, %d]: ncclConfig_t.%s stays %d",
         config_env_name(id), (long long)v, lo, hi, field, *dst);
    return;
  }
  if (*dst != (int)v)
    INFO(BRAID_LOG_ENV, "ncclConfig_t.%s = %d reset to %lld by %s", field, *dst, (long long)v,
         config_env_name(id));
  *dst = (int)v;
}

/*
 * As NCCL's envConfigOverride, for every init and split (a copied parent config too): the
 * environment wins over the caller's fields; then values past the limits are capped, as NCCL
 * does, and said at INFO.
 */
static void config_finish(struct braid_config* c) {
  config_env_int(BRAID_P_COMM_BLOCKING, "blocking", 0, 1, &c->blocking);
  /* NCCL: a cluster size too big is limited to the largest (below), not ignored. */
  config_env_int(BRAID_P_CGA_CLUSTER_SIZE, "cgaClusterSize", 0, INT_MAX, &c->cga_cluster_size);
  config_env_int(BRAID_P_MIN_CTAS, "minCTAs", 1, INT_MAX, &c->min_ctas);
  config_env_int(BRAID_P_MAX_CTAS, "maxCTAs", 1, INT_MAX, &c->max_ctas);
  config_env_int(BRAID_P_COMM_SPLIT_SHARE_RESOURCES, "splitShare", 0, 1, &c->split_share);
  config_env_int(BRAID_P_COMM_SHRINK_SHARE_RESOURCES, "shrinkShare", 0, 1, &c->shrink_share);
  config_env_int(BRAID_P_CTA_POLICY, "CTAPolicy", 0, 2, &c->cta_policy);
  config_env_int(BRAID_P_NVLS_NCHANNELS, "nvlsCTAs", 1, INT_MAX, &c->nvls_ctas);
  config_env_int(BRAID_P_NCHANNELS_PER_NET_PEER, "nChannelsPerNetPeer", 1, CONFIG_MAX_CTAS,
                 &c->nchannels_per_net_peer);
  config_env_int(BRAID_P_NVLINK_UTIL_CENTRIC_SCHED_ENABLE, "nvlinkCentricSched", 0, 1,
                 &c->nvlink_centric_sched);
  config_cap(&c->cga_cluster_size, CONFIG_MAX_CGA_CLUSTER, "cgaClusterSize");
  config_cap(&c->min_ctas, CONFIG_MAX_CTAS, "minCTAs");
  config_cap(&c->max_ctas, CONFIG_MAX_CTAS, "maxCTAs");
  config_cap(&c->nvls_ctas, CONFIG_MAX_CTAS, "nvlsCTAs");
  if (c->min_ctas > c->max_ctas) {
    INFO(BRAID_LOG_INIT, "minCTAs = %d is larger than maxCTAs = %d: both set to %d", c->min_ctas,
         c->max_ctas, c->max_ctas);
    c->min_ctas = c->max_ctas;
  }
}

ncclResult_t config_resolve(const ncclConfig_t* user, struct braid_config* out) {
  return config_resolve_api(user, out, NULL);
}

ncclResult_t config_resolve_api(const ncclConfig_t* user, struct braid_config* out,
                                const char* api) {
  struct braid_config c;
  config_defaults(&c);
  ncclResult_t res = config_apply(user, &c, api);
  if (res != ncclSuccess) return res;
  config_finish(&c);
  *out = c;
  return ncclSuccess;
}

ncclResult_t config_resolve_from(const struct braid_config* parent, const ncclConfig_t* user,
                                 struct braid_config* out) {
  return config_resolve_from_api(parent, user, out, NULL);
}

ncclResult_t config_resolve_from_api(const struct braid_config* parent, const ncclConfig_t* user,
                                     struct braid_config* out, const char* api) {
  /* As NCCL's ncclCommSplit: the parent's config only when none is given; a given one starts
     from the defaults, like an init's, whatever the parent had. */
  if (user != NULL) return config_resolve_api(user, out, api);
  *out = *parent;
  config_finish(out);
  return ncclSuccess;
}
