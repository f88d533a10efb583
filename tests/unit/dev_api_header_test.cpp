/*
 * Braid's own nccl_device.h (include/) against the library's view of the same structures
 * (src/abi/dev_api.h, which dev_api_abi_test holds to NCCL 2.28.9's header): every field at the
 * same offset with the same size, every structure of the same size and alignment, checked at
 * compile time (a mismatch fails this test's build, naming the field). At run time, the header's
 * inline host code: the team arithmetic against a brute-force enumeration of each team's world
 * ranks, ncclSymPtr's arithmetic, the resource offsets, and the same header compiled as C
 * (dev_api_header_c.c) agreeing with C++.
 */
#include <stddef.h>
#include <stdint.h>

#include <nccl_device.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "abi/dev_api.h"
#include "dev_api_header_c.h"
#include "test.h"

#ifndef BRAID_VERSION_CODE
#error "nccl_device.h must come from Braid's include/ (NCCL's is checked by dev_api_abi_test)"
#endif

#define FIELD(N, nf, B, bf)                                                            \
  static_assert(offsetof(N, nf) == offsetof(B, bf), "offset of " #N "::" #nf);        \
  static_assert(sizeof(((N*)0)->nf) == sizeof(((B*)0)->bf), "size of " #N "::" #nf)
#define FIELD_T(N, nf, B, bf)                                                          \
  FIELD(N, nf, B, bf);                                                                 \
  static_assert(std::is_same<decltype(N::nf), decltype(B::bf)>::value, "type of " #N "::" #nf)
#define SAME_STRUCT(N, B)                                                              \
  static_assert(sizeof(N) == sizeof(B), "size of " #N);                                \
  static_assert(alignof(N) == alignof(B), "alignment of " #N)

SAME_STRUCT(ncclTeam, devapi_team);
FIELD_T(ncclTeam, nRanks, devapi_team, nranks);
FIELD_T(ncclTeam, rank, devapi_team, rank);
FIELD_T(ncclTeam, stride, devapi_team, stride);

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
static_assert(std::is_same<ncclWindow_t, ncclWindow_vidmem*>::value, "nccl.h's ncclWindow_t");

SAME_STRUCT(ncclMultimemHandle, devapi_multimem);
FIELD(ncclMultimemHandle, mcBasePtr, devapi_multimem, mc_base);

SAME_STRUCT(ncclLsaBarrierHandle, devapi_lsa_barrier);
FIELD_T(ncclLsaBarrierHandle, bufHandle, devapi_lsa_barrier, buf);
FIELD_T(ncclLsaBarrierHandle, nBarriers, devapi_lsa_barrier, nbarriers);

SAME_STRUCT(ncclGinBarrierHandle, devapi_gin_barrier);
FIELD_T(ncclGinBarrierHandle, signal0, devapi_gin_barrier, signal0);
FIELD_T(ncclGinBarrierHandle, bufHandle, devapi_gin_barrier, buf);

SAME_STRUCT(ncclLLA2AHandle, devapi_lla2a);
FIELD_T(ncclLLA2AHandle, bufHandle, devapi_lla2a, buf);
FIELD_T(ncclLLA2AHandle, nSlots, devapi_lla2a, nslots);

typedef ncclDevCommWindowTable::Entry table_entry;
typedef std::remove_extent<decltype(devapi_window_table::entries)>::type devapi_table_entry;
SAME_STRUCT(ncclDevCommWindowTable, devapi_window_table);
SAME_STRUCT(table_entry, devapi_table_entry);
FIELD_T(table_entry, base, devapi_table_entry, base);
FIELD_T(table_entry, size, devapi_table_entry, size);
FIELD(table_entry, window, devapi_table_entry, window);
FIELD(ncclDevCommWindowTable, entries, devapi_window_table, entries);
FIELD(ncclDevCommWindowTable, next, devapi_window_table, next);
static_assert(std::extent<decltype(ncclDevCommWindowTable::entries)>::value ==
                  DEVAPI_WINDOW_TABLE_SIZE,
              "ncclDevCommWindowTable::entries count");

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

SAME_STRUCT(ncclTeamRequirements, devapi_team_req);
FIELD(ncclTeamRequirements, next, devapi_team_req, next);
FIELD(ncclTeamRequirements, team, devapi_team_req, team);
FIELD_T(ncclTeamRequirements, multimem, devapi_team_req, multimem);
FIELD(ncclTeamRequirements, outMultimemHandle, devapi_team_req, out_multimem_handle);

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

static_assert(NCCL_GIN_MAX_CONTEXTS == DEVAPI_GIN_MAX_CONTEXTS, "NCCL_GIN_MAX_CONTEXTS");
static_assert(std::is_same<ncclDevResourceHandle_t, uint32_t>::value, "ncclDevResourceHandle_t");

/* ---- team arithmetic against enumeration ---- */

/* The world ranks of a team, given this rank's world rank (teams are progressions through it). */
static std::vector<int> members(ncclTeam t, int me) {
  std::vector<int> w;
  for (int k = 0; k < t.nRanks; k++) w.push_back(me + (k - t.rank) * t.stride);
  return w;
}

static bool same(ncclTeam a, ncclTeam b) {
  return a.nRanks == b.nRanks && a.rank == b.rank && a.stride == b.stride;
}

/* Membership, translation and set difference of sub against parent (sub within parent). */
static void check_pair(ncclTeam parent, ncclTeam sub, int me, const char* what) {
  std::vector<int> pw = members(parent, me), sw = members(sub, me);
  for (int k = 0; k < sub.nRanks; k++) {
    auto at = std::find(pw.begin(), pw.end(), sw[k]);
    TEST_CHECK(ncclTeamRankIsMember(parent, sub, k), "%s: sub member %d in parent", what, k);
    TEST_CHECK(at != pw.end() && ncclTeamRankToTeam(parent, sub, k) == at - pw.begin(),
               "%s: sub member %d is parent member %d", what, k,
               ncclTeamRankToTeam(parent, sub, k));
  }
  for (int k = 0; k < parent.nRanks; k++) {
    bool in_sub = std::find(sw.begin(), sw.end(), pw[k]) != sw.end();
    TEST_CHECK(ncclTeamRankIsMember(sub, parent, k) == in_sub, "%s: parent member %d in sub: %d",
               what, k, (int)in_sub);
  }
  std::vector<int> rest; /* parent ranks not in sub, increasing */
  for (int k = 0; k < parent.nRanks; k++)
    if (std::find(sw.begin(), sw.end(), pw[k]) == sw.end()) rest.push_back(k);
  TEST_CHECK((int)rest.size() == parent.nRanks - sub.nRanks, "%s: sub within parent", what);
  for (int i = 0; i < (int)rest.size(); i++) {
    int got = ncclTeamRankInDifference(parent, sub, i);
    TEST_CHECK(got == rest[i], "%s: difference[%d] = %d, not %d", what, i, got, rest[i]);
    TEST_CHECK(dev_api_header_c_rank_in_difference(parent, sub, i) == got,
               "%s: C's difference[%d] differs", what, i);
  }
}

static int check_teams() {
  int cases = 0;
  for (int n = 1; n <= 12; n++) {
    for (int lsa = 1; lsa <= n; lsa++) {
      if (n % lsa != 0) continue;
      for (int me = 0; me < n; me++, cases++) {
        ncclDevComm dc = {};
        dc.rank = me;
        dc.nRanks = n;
        dc.lsaRank = me % lsa;
        dc.lsaSize = lsa;
        ncclTeam world = ncclTeamWorld(dc), l = ncclTeamLsa(dc), rail = ncclTeamRail(dc);
        ncclTeam want_world = {n, me, 1}, want_lsa = {lsa, me % lsa, 1},
                 want_rail = {n / lsa, me / lsa, lsa};
        TEST_CHECK(same(world, want_world) && same(l, want_lsa) && same(rail, want_rail),
                   "n %d lsa %d rank %d: teams", n, lsa, me);
        TEST_CHECK(same(ncclTeamInnerFactor(world, lsa), l) &&
                       same(ncclTeamOuterFactor(world, lsa), rail),
                   "n %d lsa %d rank %d: world factored by %d", n, lsa, me, lsa);
        for (int k = 0; k < rail.nRanks; k++)
          TEST_CHECK(ncclTeamRankToWorld(dc, rail, k) == members(rail, me)[k] &&
                         ncclTeamRankToLsa(dc, rail, k) == dc.lsaRank + (k - rail.rank) * lsa,
                     "n %d lsa %d rank %d: rail member %d", n, lsa, me, k);
        for (int k = 0; k < lsa; k++)
          TEST_CHECK(ncclTeamRankToWorld(dc, l, k) == me - dc.lsaRank + k &&
                         ncclTeamRankToLsa(dc, l, k) == k,
                     "n %d lsa %d rank %d: LSA member %d", n, lsa, me, k);
        check_pair(world, l, me, "world/lsa");
        check_pair(world, rail, me, "world/rail");
        check_pair(world, world, me, "world/world");
        /* The same LSA team walked backwards (a negative stride). */
        ncclTeam back = {lsa, lsa - 1 - dc.lsaRank, -1};
        check_pair(world, back, me, "world/lsa reversed");
        /* Every other world rank, when n is even. */
        if (n % 2 == 0) {
          ncclTeam evens = {n / 2, me / 2, 2};
          check_pair(world, evens, me, "world/stride 2");
          check_pair(evens, ncclTeamOuterFactor(evens, 1), me, "stride 2/itself");
        }
      }
    }
  }
  return cases;
}

static void check_sym_ptr() {
  ncclWindow_t w = (ncclWindow_t)(uintptr_t)0x1000;
  ncclSymPtr<float> p(w, 64);
  ncclSymPtr<float> q = p + 3;
  TEST_CHECK(q.offset == 64 + 12 && q.window == w, "p + 3: offset %zu", q.offset);
  q -= 5;
  TEST_CHECK(q.offset == 64 - 8, "-= 5: offset %zu", q.offset);
  q += 2ull;
  q = q - (short)-4;
  TEST_CHECK(q.offset == 64 + 16, "+= 2ull, - (-4): offset %zu", q.offset);
  TEST_CHECK(q - p == 4 && p - q == -4, "q - p = %ld", (long)(q - p));
  ncclSymPtr<char> c = q;
  TEST_CHECK(c.offset == q.offset && c.window == w, "conversion keeps window and offset");
  c += 3;
  TEST_CHECK(c.offset == 64 + 19, "char steps by bytes: %zu", c.offset);
  TEST_CHECK(p == ncclSymPtr<float>(w, 64) && p != q && !(p != p),
             "equality is window and offset");
  TEST_CHECK(ncclSymPtr<float>(w, 64) != ncclSymPtr<float>(nullptr, 64), "window counts");
  ncclSymPtr<double> none;
  TEST_CHECK(none.window == nullptr && none.offset == 0, "default: null window, offset 0");
  static_assert(std::is_same<ncclSymPtr<int>::ElementType, int>::value, "ElementType");
}

int main() {
  int cases = check_teams();
  check_sym_ptr();
  for (uint32_t h : {0u, 1u, 7u, 1000u, 0xffffffffu}) {
    TEST_CHECK(ncclGetResourceBufferOffset(h) == (size_t)h * DEVAPI_RESOURCE_UNIT &&
                   dev_api_header_c_resource_offset(h) == (size_t)h * DEVAPI_RESOURCE_UNIT,
               "resource handle %u at %zu", h, ncclGetResourceBufferOffset(h));
  }
  struct dev_api_header_c_sizes c;
  dev_api_header_c_layout(&c);
  TEST_CHECK(c.dev_comm == sizeof(ncclDevComm) &&
                 c.dev_comm_resource_inlined == offsetof(ncclDevComm, resourceWindow_inlined) &&
                 c.dev_comm_gin_shadows == offsetof(ncclDevComm, ginSignalShadows) &&
                 c.window == sizeof(ncclWindow_vidmem),
             "C's ncclDevComm (%zu bytes) is C++'s (%zu)", c.dev_comm, sizeof(ncclDevComm));
  TEST_CHECK(c.comm_reqs == sizeof(ncclDevCommRequirements) &&
                 c.comm_reqs_gin_counters == offsetof(ncclDevCommRequirements, ginCounterCount) &&
                 c.resource_reqs == sizeof(ncclDevResourceRequirements) &&
                 c.team_reqs == sizeof(ncclTeamRequirements),
             "C's requirement structures are C++'s");
  fprintf(stderr, "Braid's nccl_device.h: layouts (compile time), %d team configurations, "
          "ncclSymPtr, C and C++ agree\n", cases);
  return test_summary();
}
