/*
 * Braid's device API, part 6: what it does not offer. GPU-initiated networking (GIN: ncclGin,
 * its barriers, and the barriers across the world or rail team that need it) is not in Braid;
 * ncclDevCommCreate refuses every GIN requirement. The names exist only so that a program
 * using them fails to compile with a message that says why, rather than with an unknown name.
 * (ncclGinBarrierHandle is in core.h: ncclDevComm holds one, always zero.)
 */
#ifndef BRAID_NCCL_DEVICE_GIN_H
#define BRAID_NCCL_DEVICE_GIN_H

#include "core.h"
#include "ptr.h"

#if defined(__CUDACC__)
#define BRAID_DEVAPI_NO_GIN                                                                    \
  "Braid offers no GIN (GPU-initiated networking): ncclGin, GIN barriers and ncclBarrierSession " \
  "are not available; within one LSA team use ncclLsaBarrierSession"

struct ncclGin {
  template <typename... A>
  NCCL_DEVICE_INLINE ncclGin(A&&...) {
    static_assert(braid_devapi_refused<A...>::value, BRAID_DEVAPI_NO_GIN);
  }
};

template <typename Coop>
struct ncclGinBarrierSession {
  static_assert(braid_devapi_refused<Coop>::value, BRAID_DEVAPI_NO_GIN);
};

template <typename Coop>
struct ncclBarrierSession {
  static_assert(braid_devapi_refused<Coop>::value, BRAID_DEVAPI_NO_GIN);
};
#endif

#endif
