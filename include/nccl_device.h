/*
 * Braid's device API: NCCL 2.28.9's nccl_device.h, the part of it Braid offers, with NCCL's
 * names, types and signatures. Kernels get a device communicator (ncclDevCommCreate) and reach
 * the memory of the ranks in their LSA team (the ranks whose memory this GPU loads and stores
 * directly) through registered windows, synchronize with LSA barriers and exchange small
 * values with the LL all-to-all. Multimem (NVLink multicast) and GIN (GPU-initiated
 * networking) are not offered: using them fails to compile, with a message.
 *
 *   nccl_device/core.h         structures, host calls, teams
 *   nccl_device/coop.h         cooperative groups
 *   nccl_device/ptr.h          window addresses, ncclSymPtr, ncclFindWindow
 *   nccl_device/lsa_barrier.h  ncclLsaBarrierSession
 *   nccl_device/ll_a2a.h       ncclLLA2ASession
 *   nccl_device/gin.h          the names of what is not offered
 *
 * docs/design.md, "Symmetric memory windows and the device API", describes the library's side.
 */
#ifndef BRAID_NCCL_DEVICE_H
#define BRAID_NCCL_DEVICE_H

#include "nccl_device/core.h"
#include "nccl_device/coop.h"
#include "nccl_device/ptr.h"
#include "nccl_device/lsa_barrier.h"
#include "nccl_device/ll_a2a.h"
#include "nccl_device/gin.h"

#endif
