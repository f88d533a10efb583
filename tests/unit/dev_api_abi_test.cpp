/*
 * Braid's C mirrors of NCCL's device-API structures (src/abi/dev_api.h)
 * against NCCL 2.28.9's own nccl_device.h. A kernel compiled against NCCL's
 * header reads these structures field by field through NCCL's inline code,
 * so every field must sit at the same offset with the same size, and every
 * structure must have the same size and alignment. The layout is checked at
 * compile time (a mismatch fails the build of this test, naming the field);
 * the reciprocal NCCL's inline code divides by is checked at run time.
 *
 * Built only when the build finds nccl_device.h (tests/unit/CMakeLists.txt).
 */
#include <stddef.h>
#include <stdint.h>

#include <nccl_device.h>

#include <type_traits>

#include "abi/dev_api.h"
#include "test.h"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE != 22809
#error "dev_api_abi_test needs NCCL 2.28.9's nccl_device.h (NCCL_VERSION_CODE 22809)"
#endif
#ifdef BRAID_VERSION_CODE
#error "nccl.h came from Braid's include/, not from NCCL: the comparison would be with itself"
#endif

/* One field: same offset, same size. */
#define FIELD(N, nf, B, bf)                                                            \
  static_assert(offsetof(N, nf) == offsetof(B, bf), "offset of " #N "::" #nf);        \
  static_assert(sizeof(((N*)0)->nf) == sizeof(((B*)0)->bf), "size of " #N "::" #nf)
/* One field whose type must also be the same (plain integers and bools). */
#define FIELD_T(N, nf, B, bf)                                                          \
  FIELD(N, nf, B, bf);                                                                 \
  static_assert(std::is_same<decltype(N::nf), decltype(B::bf)>::value, "type of " #N "::" #nf)
/* The whole structure: same size and alignment. */
#define SAME_STRUCT(N, B)                                                              \
  static_assert(sizeof(N) == sizeof(B), "size of " #N);                                \
  static_assert(alignof(N) == alignof(B), "alignment of " #N)

/* ncclTeam */
SAME_STRUCT(ncclTeam, devapi_team);
FIELD_T(ncclTeam, nRanks, devapi_team, nranks);
FIELD_T(ncclTeam, rank, devapi_team, rank);
FIELD_T(ncclTeam, stride, devapi_team, stride);

/* ncclWindow_vidmem */
SAME_STRUCT(ncclWindow_vidmem, devapi_window);
FIELD(ncclWindow_vidmem, winHost, devapi_window, win_host);
FIELD(ncclWindow_vidmem, lsaFlatBase, devapi_window, lsa_flat_base);
FIELD_T(ncclWindow_vidmem, lsaRank, devapi_window, lsa_rank);
FIELD_T(ncclWindow_vidmem, worldRank, devapi_window, world_rank);
FIELD_T(ncclWindow_vidmem, stride4G, devapi_window, stride4g);
FIELD_T(ncclWindow_vidmem, mcOffset4K, devapi_window, mc_offset4k);
FIELD_T(ncclWindow_vidmem, ginOffset4K, devapi_window, gin_offset4k);
FIELD(ncclWindow_vidmem, ginWins, devapi_window, gin_wins);
static_assert(std::extent<decltype(ncclWindow_vidmem::ginWins)>::value ==
                  std::extent<decltype(devapi_window::gin_wins)>::value,
              "ncclWindow_vidmem::ginWins count");
static_assert(std::is_same<ncclWindow_t, ncclWindow_vidmem*>::value, "ncclWindow_t");

/* ncclMultimemHandle */
SAME_STRUCT(ncclMultimemHandle, devapi_multimem);
FIELD(ncclMultimemHandle, mcBasePtr, devapi_multimem, mc_base);

/* ncclLsaBarrierHandle */
SAME_STRUCT(ncclLsaBarrierHandle, devapi_lsa_barrier);
FIELD_T(ncclLsaBarrierHandle, bufHandle, devapi_lsa_barrier, buf);
FIELD_T(ncclLsaBarrierHandle, nBarriers, devapi_lsa_barrier, nbarriers);

/* ncclGinBarrierHandle */
SAME_STRUCT(ncclGinBarrierHandle, devapi_gin_barrier);
FIELD_T(ncclGinBarrierHandle, signal0, devapi_gin_barrier, signal0);
FIELD_T(ncclGinBarrierHandle, bufHandle, devapi_gin_barrier, buf);

/* ncclLLA2AHandle */
SAME_STRUCT(ncclLLA2AHandle, devapi_lla2a);
FIELD_T(ncclLLA2AHandle, bufHandle, devapi_lla2a, buf);
FIELD_T(ncclLLA2AHandle, nSlots, devapi_lla2a, nslots);

/* ncclDevCommWindowTable and its Entry */
typedef ncclDevCommWindowTable::Entry nccl_table_entry;
typedef std::remove_extent<decltype(devapi_window_table::entries)>::type devapi_table_entry;
SAME_STRUCT(ncclDevCommWindowTable, devapi_window_table);
SAME_STRUCT(nccl_table_entry, devapi_table_entry);
FIELD_T(nccl_table_entry, base, devapi_table_entry, base);
FIELD_T(nccl_table_entry, size, devapi_table_entry, size);
FIELD(nccl_table_entry, window, devapi_table_entry, window);
FIELD(ncclDevCommWindowTable, entries, devapi_window_table, entries);
FIELD(ncclDevCommWindowTable, next, devapi_window_table, next);
static_assert(std::extent<decltype(ncclDevCommWindowTable::entries)>::value ==
                  DEVAPI_WINDOW_TABLE_SIZE,
              "ncclDevCommWindowTable::entries count");

/* ncclDevComm */
SAME_STRUCT(ncclDevComm, devapi_comm);
FIELD_T(ncclDevComm, rank, devapi_comm, rank);
FIELD_T(ncclDevComm, nRanks, devapi_comm, nranks);
FIELD_T(ncclDevComm, nRanks_rcp32, devapi_comm, nranks_rcp32);
FIELD_T(ncclDevComm, lsaRank, devapi_comm, lsa_rank);
FIELD_T(ncclDevComm, lsaSize, devapi_comm, lsa_size);
FIELD_T(ncclDevComm, lsaSize_rcp32, devapi_comm, lsa_size_rcp32);
FIELD(ncclDevComm, windowTable, devapi_comm, window_table);
FIELD(ncclDevComm, resourceWindow, devapi_comm, resource_window);
FIELD(ncclDevComm, resourceWindow_inlined, devapi_comm, resource_window_inlined);
FIELD(ncclDevComm, lsaMultimem, devapi_comm, lsa_multimem);
FIELD(ncclDevComm, lsaBarrier, devapi_comm, lsa_barrier);
FIELD(ncclDevComm, railGinBarrier, devapi_comm, rail_gin_barrier);
FIELD_T(ncclDevComm, ginContextCount, devapi_comm, gin_context_count);
FIELD(ncclDevComm, ginTypes, devapi_comm, gin_types);
FIELD(ncclDevComm, ginHandles, devapi_comm, gin_handles);
FIELD_T(ncclDevComm, ginSignalBase, devapi_comm, gin_signal_base);
FIELD_T(ncclDevComm, ginSignalCount, devapi_comm, gin_signal_count);
FIELD_T(ncclDevComm, ginCounterBase, devapi_comm, gin_counter_base);
FIELD_T(ncclDevComm, ginCounterCount, devapi_comm, gin_counter_count);
FIELD(ncclDevComm, ginSignalShadows, devapi_comm, gin_signal_shadows);

/* ncclDevResourceRequirements */
SAME_STRUCT(ncclDevResourceRequirements, devapi_resource_req);
FIELD(ncclDevResourceRequirements, next, devapi_resource_req, next);
FIELD_T(ncclDevResourceRequirements, bufferSize, devapi_resource_req, buffer_size);
FIELD_T(ncclDevResourceRequirements, bufferAlign, devapi_resource_req, buffer_align);
FIELD_T(ncclDevResourceRequirements, outBufferHandle, devapi_resource_req, out_buffer_handle);
FIELD_T(ncclDevResourceRequirements, ginSignalCount, devapi_resource_req, gin_signal_count);
FIELD_T(ncclDevResourceRequirements, ginCounterCount, devapi_resource_req, gin_counter_count);
FIELD_T(ncclDevResourceRequirements, outGinSignalStart, devapi_resource_req,
        out_gin_signal_start);
FIELD_T(ncclDevResourceRequirements, outGinCounterStart, devapi_resource_req,
        out_gin_counter_start);

/* ncclTeamRequirements */
SAME_STRUCT(ncclTeamRequirements, devapi_team_req);
FIELD(ncclTeamRequirements, next, devapi_team_req, next);
FIELD(ncclTeamRequirements, team, devapi_team_req, team);
FIELD_T(ncclTeamRequirements, multimem, devapi_team_req, multimem);
FIELD(ncclTeamRequirements, outMultimemHandle, devapi_team_req, out_multimem_handle);

/* ncclDevCommRequirements */
SAME_STRUCT(ncclDevCommRequirements, devapi_comm_req);
FIELD(ncclDevCommRequirements, resourceRequirementsList, devapi_comm_req,
      resource_requirements);
FIELD(ncclDevCommRequirements, teamRequirementsList, devapi_comm_req, team_requirements);
FIELD_T(ncclDevCommRequirements, lsaMultimem, devapi_comm_req, lsa_multimem);
FIELD_T(ncclDevCommRequirements, barrierCount, devapi_comm_req, barrier_count);
FIELD_T(ncclDevCommRequirements, lsaBarrierCount, devapi_comm_req, lsa_barrier_count);
FIELD_T(ncclDevCommRequirements, railGinBarrierCount, devapi_comm_req, rail_gin_barrier_count);
FIELD_T(ncclDevCommRequirements, lsaLLA2ABlockCount, devapi_comm_req, lsa_lla2a_block_count);
FIELD_T(ncclDevCommRequirements, lsaLLA2ASlotCount, devapi_comm_req, lsa_lla2a_slot_count);
FIELD_T(ncclDevCommRequirements, ginForceEnable, devapi_comm_req, gin_force_enable);
FIELD_T(ncclDevCommRequirements, ginContextCount, devapi_comm_req, gin_context_count);
FIELD_T(ncclDevCommRequirements, ginSignalCount, devapi_comm_req, gin_signal_count);
FIELD_T(ncclDevCommRequirements, ginCounterCount, devapi_comm_req, gin_counter_count);

/* Constants the inline code bakes in. */
static_assert(NCCL_GIN_MAX_CONTEXTS == DEVAPI_GIN_MAX_CONTEXTS, "NCCL_GIN_MAX_CONTEXTS");
static_assert(std::is_same<ncclDevResourceHandle_t, uint32_t>::value, "ncclDevResourceHandle_t");

/* devapi_rcp32(x) against nccl::utility::idivRcp32(x), and the division the
 * inline code does with it (idivFast32) gives the exact quotient. */
static void check_rcp(uint32_t x) {
  uint32_t ours = devapi_rcp32(x), theirs = nccl::utility::idivRcp32(x);
  TEST_CHECK(ours == theirs, "rcp32(%u): Braid %u, NCCL %u", x, ours, theirs);
  static const uint32_t numerators[] = {0, 1, 2, 3, 7, 4095, 4096, 65535, 1000003,
                                        0x7fffffffu, 0x80000000u};
  for (uint32_t n : numerators) {
    uint32_t q = nccl::utility::idivFast32(n, x, ours);
    TEST_CHECK(q == n / x, "idivFast32(%u, %u) with Braid's rcp: %u", n, x, q);
  }
}

int main() {
  int checked = 0;
  for (uint32_t x = 1; x <= 4096; x++, checked++) check_rcp(x);
  static const uint32_t large[] = {4097, 65535, 65536, 65537, 1000000, 1u << 20, (1u << 20) + 1,
                                   0x7fffffffu, 0x80000000u, 0x80000001u, 0xfffffffeu,
                                   0xffffffffu};
  for (uint32_t x : large) {
    check_rcp(x);
    checked++;
  }
  TEST_CHECK(checked == 4096 + (int)(sizeof(large) / sizeof(large[0])), "%d values checked",
             checked);
  fprintf(stderr, "dev_api.h matches NCCL %d's nccl_device.h: layouts (compile time), %d "
          "reciprocals\n", NCCL_VERSION_CODE, checked);
  return test_summary();
}
