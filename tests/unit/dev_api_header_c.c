/*
 * Braid's nccl_device.h compiled as C (the host part: structures, host calls, inline team
 * arithmetic). dev_api_header_test compares what C sees here with what C++ sees.
 */
#include <stddef.h>

#include <nccl_device.h>

#include "dev_api_header_c.h"

void dev_api_header_c_layout(struct dev_api_header_c_sizes* out) {
  out->dev_comm = sizeof(struct ncclDevComm);
  out->dev_comm_resource_inlined = offsetof(struct ncclDevComm, resourceWindow_inlined);
  out->dev_comm_gin_shadows = offsetof(struct ncclDevComm, ginSignalShadows);
  out->window = sizeof(struct ncclWindow_vidmem);
  out->comm_reqs = sizeof(struct ncclDevCommRequirements);
  out->comm_reqs_gin_counters = offsetof(struct ncclDevCommRequirements, ginCounterCount);
  out->resource_reqs = sizeof(struct ncclDevResourceRequirements);
  out->team_reqs = sizeof(struct ncclTeamRequirements);
}

int dev_api_header_c_rank_in_difference(ncclTeam_t parent, ncclTeam_t subset, int index) {
  return ncclTeamRankInDifference(parent, subset, index);
}

size_t dev_api_header_c_resource_offset(ncclDevResourceHandle_t h) {
  return ncclGetResourceBufferOffset(h);
}
