/*
 * ncclConfig_t, read with the size/magic/version protocol: a caller's struct
 * may be older (smaller: missing fields take defaults) or newer (larger: the
 * fields we do not know are ignored); a wrong magic is rejected.
 */
#ifndef BRAID_CORE_CONFIG_H
#define BRAID_CORE_CONFIG_H

#include "nccl.h"

/* The configuration a communicator runs with, every field resolved. */
struct braid_config {
  int blocking;          /* 1 (default) or 0 */
  int cga_cluster_size; /* -1: not set, the device's default (dev_state.c: 4 from Hopper on) */
  int min_ctas;
  int max_ctas;
  char net_name[32];
  int split_share;
  int traffic_class;
  char comm_name[64];
  int collnet_enable;
  int cta_policy;
  int shrink_share;
  int nvls_ctas;
  int nchannels_per_net_peer;
  int nvlink_centric_sched;
};

/*
 * Fills `out` with defaults, then with the caller's `user` config (may be NULL). A refusal's
 * message names the field (config->blocking) and, in the _api forms, starts with `api`: the
 * public function that was given the config.
 */
ncclResult_t config_resolve(const ncclConfig_t* user, struct braid_config* out);
ncclResult_t config_resolve_api(const ncclConfig_t* user, struct braid_config* out,
                                const char* api);
/* Split/shrink: NULL inherits the parent's resolved config; a given one is resolved alone. */
ncclResult_t config_resolve_from(const struct braid_config* parent, const ncclConfig_t* user,
                                 struct braid_config* out);
ncclResult_t config_resolve_from_api(const struct braid_config* parent, const ncclConfig_t* user,
                                     struct braid_config* out, const char* api);

#endif
