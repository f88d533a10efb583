/*
 * Braid's own nccl_device.h (include/) against the library's view of the same structures
 * (src/abi/dev_api.h, which dev_api_abi_test holds to NCCL 2.28.9's header): every field at the
 * same offset with the same size, every structure of the same size and alignment, checked at
 * compile time (a mismatch fails this test's build, naming the field; the list, dev_api_fields.inc,
 * is the one dev_api_abi_test checks NCCL's header by). At run time, the header's
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

/* Every field and structure, at compile time. */
#include "dev_api_fields.inc"

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
