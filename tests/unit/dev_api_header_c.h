/* What dev_api_header_c.c, compiled as C, reports to dev_api_header_test. */
#ifndef DEV_API_HEADER_C_H
#define DEV_API_HEADER_C_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct dev_api_header_c_sizes {
  size_t dev_comm, dev_comm_resource_inlined, dev_comm_gin_shadows, window;
  size_t comm_reqs, comm_reqs_gin_counters, resource_reqs, team_reqs;
};

void dev_api_header_c_layout(struct dev_api_header_c_sizes* out);
int dev_api_header_c_rank_in_difference(ncclTeam_t parent, ncclTeam_t subset, int index);
size_t dev_api_header_c_resource_offset(ncclDevResourceHandle_t h);

#ifdef __cplusplus
}
#endif

#endif
