/*
 * The structures of NCCL's device API (nccl_device.h, NCCL 2.28.9) as the
 * library fills them. Their functions are inline in NCCL's headers and
 * compiled into the caller's kernels, which read these structures field by
 * field: every field sits where NCCL's headers put it (dev_api_abi_test
 * compares each offset and size with NCCL's own header). C mirrors, so the
 * host code of the library needs no C++ and no NCCL header.
 *
 * A window is one buffer per rank of the LSA team (the ranks of this host
 * that load and store each other's memory), all mapped in every member's
 * address space at one stride: rank i's buffer starts at
 * lsa_flat_base + i * stride4g * 4 GiB. The stride is a multiple of 4 GiB so
 * that the inline code moves between ranks by adding to the address's high
 * 32-bit word alone.
 */
#ifndef BRAID_ABI_DEV_API_H
#define BRAID_ABI_DEV_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DEVAPI_GIN_MAX_CONTEXTS 4   /* NCCL_GIN_MAX_CONTEXTS */
#define DEVAPI_RESOURCE_UNIT 128    /* a resource handle counts 128-byte units */
#define DEVAPI_WINDOW_TABLE_SIZE 32 /* entries of one window table block */

/* struct ncclTeam */
struct devapi_team {
  int32_t nranks, rank, stride;
};

/* struct ncclWindow_vidmem: ncclWindow_t points at one in device memory. */
struct devapi_window {
  void* win_host;       /* the library's own record of the window */
  char* lsa_flat_base;  /* the LSA team's rank 0's first byte */
  int32_t lsa_rank;
  int32_t world_rank;
  uint32_t stride4g;    /* between two ranks' buffers, in units of 4 GiB */
  uint32_t mc_offset4k; /* multicast (not offered: 0) */
  uint32_t gin_offset4k;
  void* gin_wins[DEVAPI_GIN_MAX_CONTEXTS];
};

/* struct ncclMultimemHandle */
struct devapi_multimem {
  void* mc_base;
};

/* struct ncclLsaBarrierHandle: nbarriers * (3 + team size) 32-bit words in the resource window. */
struct devapi_lsa_barrier {
  uint32_t buf;
  int32_t nbarriers;
};

/* struct ncclGinBarrierHandle */
struct devapi_gin_barrier {
  uint32_t signal0;
  uint32_t buf;
};

/* struct ncclLLA2AHandle: nblocks * (1 + 2 * nslots) 16-byte lines in the resource window. */
struct devapi_lla2a {
  uint32_t buf;
  uint32_t nslots;
};

/* struct ncclDevCommWindowTable (C++ only in NCCL's header; the same layout). */
struct devapi_window_table {
  struct {
    uintptr_t base, size; /* the user's buffer on this rank */
    struct devapi_window* window;
  } entries[DEVAPI_WINDOW_TABLE_SIZE];
  struct devapi_window_table* next;
};

/* struct ncclDevComm: the caller keeps it and passes it to its kernels by value. */
struct devapi_comm {
  int32_t rank, nranks;
  uint32_t nranks_rcp32;
  int32_t lsa_rank, lsa_size;
  uint32_t lsa_size_rcp32;
  struct devapi_window_table* window_table;
  struct devapi_window* resource_window;
  struct devapi_window resource_window_inlined;
  struct devapi_multimem lsa_multimem;
  struct devapi_lsa_barrier lsa_barrier;
  struct devapi_gin_barrier rail_gin_barrier;
  uint8_t gin_context_count;
  uint8_t gin_types[4];
  void* gin_handles[4];
  uint32_t gin_signal_base;
  int32_t gin_signal_count;
  uint32_t gin_counter_base;
  int32_t gin_counter_count;
  uint64_t* gin_signal_shadows;
};

/* struct ncclDevResourceRequirements: a list the caller links. */
struct devapi_resource_req {
  struct devapi_resource_req* next;
  size_t buffer_size, buffer_align;
  uint32_t* out_buffer_handle; /* where ncclDevCommCreate writes the handle, if not NULL */
  int32_t gin_signal_count;
  int32_t gin_counter_count;
  uint32_t* out_gin_signal_start;
  uint32_t* out_gin_counter_start;
};

/* struct ncclTeamRequirements */
struct devapi_team_req {
  struct devapi_team_req* next;
  struct devapi_team team;
  bool multimem;
  struct devapi_multimem* out_multimem_handle;
};

/* struct ncclDevCommRequirements */
struct devapi_comm_req {
  struct devapi_resource_req* resource_requirements;
  struct devapi_team_req* team_requirements;
  bool lsa_multimem;
  int32_t barrier_count;
  int32_t lsa_barrier_count;
  int32_t rail_gin_barrier_count;
  int32_t lsa_lla2a_block_count, lsa_lla2a_slot_count;
  bool gin_force_enable;
  int32_t gin_context_count;
  int32_t gin_signal_count;
  int32_t gin_counter_count;
};

/* The reciprocal NCCL's inline code divides by (nccl::utility::idivRcp32). */
static inline uint32_t devapi_rcp32(uint32_t x) {
  return x == 0 ? 0 : UINT32_MAX / x + ((x & (x - 1)) == 0);
}

#endif
