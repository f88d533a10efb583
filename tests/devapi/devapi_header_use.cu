/*
 * Every device-API entry point of Braid's own nccl_device.h that devapi_test does not call,
 * instantiated in kernels, so that the build fails when one of them stops compiling: every
 * cooperative group, ncclCoopBcast, ncclSymPtr's operators and conversions, ncclFindWindow on
 * lanes and tiles, the LL all-to-all's bcast/recvUnrolled/recvReduce on several element sizes,
 * barriers on warps and warp spans, and the team arithmetic on the device.
 *
 * Compiled with -DDEVAPI_REFUSED=n, it must fail instead, with the message of what Braid does
 * not offer (multimem, GIN): devapi_header_refusals checks that.
 * Built into devapi_braid_test beside devapi_test.cu; it defines no test of its own.
 */
#include <nccl.h>
#include <nccl_device.h>

#ifndef BRAID_VERSION_CODE
#error "devapi_header_use.cu checks Braid's own nccl_device.h (include/ first)"
#endif

struct hdr_pair16 {
  uint64_t a, b;
};
struct hdr_three4 {
  uint32_t a, b, c;
};

template <typename Coop>
__device__ int coop_use(Coop coop) {
  int v = ncclCoopBcast(coop, coop.thread_rank() * 3, 0);
  coop.sync();
  return v + coop.size() + coop.num_threads() + (int)ncclCoopGetLaneMask(coop) +
         ncclCoopIsThread(coop) + ncclCoopWithinWarp(coop) + ncclCoopCoalesced(coop).size();
}

__global__ void devapi_header_coop(int* out) {
  int acc = 0;
  acc += coop_use(ncclCoopThread());
  acc += coop_use(ncclCoopTile<8>());
  acc += coop_use(ncclCoopWarp());
  acc += coop_use(ncclCoopLanes(0x0000ffffu));
  acc += coop_use(ncclCoopCoalesced());
  acc += coop_use(ncclCoopWarpSpan(0, 2, 3));
  acc += coop_use(ncclCoopCta());
  out[threadIdx.x] = acc;
}

__global__ void devapi_header_ptr(ncclDevComm dc, ncclWindow_t win, ncclLsaBarrierHandle bh,
                                  uint64_t* out) {
  ncclSymPtr<float> p(win, 64);
  ncclSymPtr<float> q = p + 3;
  q += 2u;
  q -= 1L;
  q = q - 1ull;
  ncclSymPtr<char> c = q;
  ptrdiff_t d = q - p;
  bool same = (p == q) || (p != q && c.offset > 0);
  ncclSymPtr<char> rb = ncclGetResourceBuffer(dc, bh.bufHandle);
  ncclTeam lsa = ncclTeamLsa(dc), world = ncclTeamWorld(dc), rail = ncclTeamRail(dc);
  out[0] = (uint64_t)q.localPtr() + (uint64_t)q.lsaPtr(0) + (uint64_t)q.peerPtr(dc.rank) +
           (uint64_t)q.peerPtr(lsa, 0) + (uint64_t)d + same + (uint64_t)rb.localPtr();
  out[1] = (uint64_t)ncclGetResourceBufferLocalPointer(dc, bh.bufHandle) +
           (uint64_t)ncclGetResourceBufferLsaPointer(dc, bh.bufHandle, 0) +
           (uint64_t)ncclGetResourceBufferPeerPointer(dc, bh.bufHandle, lsa, 0) +
           ncclGetResourceBufferOffset(bh.bufHandle);
  ncclTeam inner = ncclTeamInnerFactor(world, 2), outer = ncclTeamOuterFactor(world, 2);
  out[2] = ncclTeamRankIsMember(lsa, world, 1) + ncclTeamRankToTeam(world, lsa, 0) +
           ncclTeamRankToWorld(dc, rail, 0) + ncclTeamRankToLsa(dc, world, dc.rank) +
           ncclTeamRankInDifference(world, lsa, 0) + inner.rank + outer.rank;
  out[3] = (uint64_t)ncclFindWindow(ncclCoopLanes(0xffu), dc, out) +
           (uint64_t)ncclFindWindow(ncclCoopTile<4>(), dc, out) +
           (uint64_t)ncclFindWindow(ncclCoopThread(), dc, out);
}

template <typename Coop>
__device__ void barrier_use(Coop coop, ncclDevComm const& dc, ncclLsaBarrierHandle bh, int index) {
  ncclLsaBarrierSession<Coop> bar(coop, dc, ncclTeamLsa(dc), bh, index);
  bar.arrive(coop, cuda::memory_order_release);
  bar.wait(coop, cuda::memory_order_acquire);
  bar.sync(coop, cuda::memory_order_relaxed);
}

__global__ void devapi_header_barrier(ncclDevComm dc, ncclLsaBarrierHandle bh) {
  int warp = threadIdx.x / 32;
  if (warp == 0) barrier_use(ncclCoopWarp(), dc, bh, blockIdx.x * 4);
  if (warp == 1) barrier_use(ncclCoopThread(), dc, bh, blockIdx.x * 4 + 1);
  if (warp >= 2 && warp < 4) barrier_use(ncclCoopWarpSpan(2, 2, 0), dc, bh, blockIdx.x * 4 + 2);
  ncclLsaBarrierSession<ncclCoopCta> all(ncclCoopCta(), dc, ncclTeamTagLsa(), 0, false);
  all.sync(ncclCoopCta(), cuda::memory_order_seq_cst);
#if DEVAPI_REFUSED == 1
  (void)ncclGetLsaMultimemPointer(dc.resourceWindow, 0, dc);
#elif DEVAPI_REFUSED == 2
  ncclSymPtr<int> p(dc.resourceWindow, 0);
  (void)p.multimemPtr(dc.lsaMultimem);
#elif DEVAPI_REFUSED == 3
  ncclGin gin(dc, 0);
#elif DEVAPI_REFUSED == 4
  ncclBarrierSession<ncclCoopCta> world(ncclCoopCta(), ncclTeamTagLsa(), dc, 0);
#endif
}

struct add_acc {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct to_acc {
  __device__ double operator()(hdr_three4 v) const { return (double)v.a + v.b + v.c; }
};

__global__ void devapi_header_lla2a(ncclDevComm dc, ncclLLA2AHandle h, double* out) {
  ncclCoopCta cta;
  ncclTeam team = ncclTeamLsa(dc);
  int t = threadIdx.x;
  ncclLLA2ASession<ncclCoopCta> a2a(cta, dc, team, h, blockIdx.x, team.nRanks);
  if (t == 0) a2a.bcast(team.rank, hdr_pair16{1, 2});
  hdr_pair16 got[4];
  a2a.recvUnrolled<1, 4>(0, team.nRanks < 4 ? team.nRanks : 4, 1, got);
  a2a.endEpoch(cta);
  if (t < team.nRanks) a2a.send(t, team.rank, hdr_three4{1, 2, 3});
  double sum = a2a.recvReduce<2, hdr_three4>(0, team.nRanks, 1, to_acc(), add_acc());
  a2a.endEpoch(cta);
  if (t < team.nRanks) a2a.send(t, team.rank, (short)t);
  short s = a2a.recv<short>(t < team.nRanks ? t : 0);
  a2a.endEpoch(cta);
  out[t] = sum + got[0].a + s;
}
