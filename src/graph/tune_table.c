/*
 * Every constant of the topology and tuning model, with where it comes from.
 * "Measured" means on two H200 SXM joined by NVLink (NV18 through NVSwitch;
 * driver 580, CUDA 13.0) unless said; "NCCL" means the value NCCL 2.28 uses
 * for the same quantity (src/graph/topo.h, tuning.cc), kept where we have no
 * measurement yet. The measurements are in docs/tuning.md, Tuning model
 * constants. Change them here and nowhere else.
 */
#include "graph/tune_table.h"

#include <stdlib.h>
#include <string.h>

const struct tune_table tune_table = {
  /* NCCL's LOC_BW: a GPU to itself, never the bottleneck. */
  .loc_bw = 5000.0f,
  /* A NIC reporting speed -1 or nothing: 10 Gb/s, as NCCL assumes. */
  .net_default_bw = 1.25f,
  /*
   * One CTA's Simple-protocol throughput. NCCL reaches 339 GB/s all-reduce
   * busbw at 2 GB on the H200 pair with 32 channels, i.e. ~10.6 GB/s per
   * channel; 12 leaves room for a faster kernel. Channels are added (rings
   * duplicated) until each carries at most this much.
   */
  .chan_bw_max = 12.0f,
  /* Two SMs at least, as NCCL gets on PCIe machines, so one slow CTA is not the whole job. */
  .min_channels = 2,
  /*
   * A channel through the network moves what one proxy connection and one
   * CTA polling host memory move: ~3.5 GB/s each with the socket backend
   * (all-reduce busbw over loopback between two emulated hosts: 2 channels
   * 7 GB/s, 4 channels 9-10, 8 channels 15-16; docs/tuning.md, Network
   * rings: at least 8 channels). A NIC's
   * speed says nothing about that, and an unknown one (virtual NICs report
   * none) would get the minimum, so rings across hosts get at least this many.
   */
  .net_min_channels = 8,
  /*
   * Bounds the ring search (deterministic: counts steps, not time, ~25 ns
   * each). An 8-GPU NVSwitch node needs ~2,000 steps; a hopeless segment
   * (8! orders) is cut at the segment budget.
   */
  .search_budget = 1 << 22,
  .search_segment_budget = 1 << 16,
  /*
   * Rounding: 50 GB/s NICs fit 2 rings of 24 (96) or 5 of 10 (100); the 4%
   * are not worth 2.5x the connections. A judgement, not a measurement.
   */
  .search_min_gain = 1.05f,
  /*
   * Latency of a call before any step: kernel launch (3.3 µs measured
   * back-to-back) plus setup. Calibrated so that Ring/LL on 2 GPUs predicts
   * NCCL's measured 7.4 µs for an 8-byte all-reduce. Simple adds a fence per
   * step, LL128 a warp-wide flag check; Tree adds the up/down switch.
   */
  .base_lat = {
    /* Simple  LL    LL128 */
    {  7.0f,   5.0f, 5.5f },  /* Ring */
    {  8.0f,   5.5f, 6.0f },  /* Tree */
    {  7.0f,   5.0f, 5.5f },  /* Direct (Simple only: the others never run) */
  },
  /*
   * Per pipeline step over one hop. NVLink LL: half of the 1.25 µs flag
   * ping-pong round trip (measured). Simple waits for a fence and a tail
   * update (~3x, NCCL's ratio). PCIe: NCCL's figures. Network: four
   * processes posing as hosts on one GPU, socket backend: an 8-byte
   * all-reduce took 107-122 µs as a ring (6 steps) and 81-92 µs as a tree
   * (4 steps), ~18 µs a step; InfiniBand should be lower: measure it.
   */
  .hop_lat = {
    /* Simple  LL     LL128 */
    {  2.0f,   0.6f,  1.0f },  /* NVLink */
    {  3.0f,   1.0f,  2.0f },  /* PCIe / host */
    { 18.0f,   5.0f,  7.0f },  /* network */
  },
  /*
   * A ring of 3 or more ranks forwards: a Simple step of a middle rank starts only once the
   * chunk it passes on has fully arrived, where two ranks (the pair exchange) send and
   * receive at once. Fitted on 4x H200 (NV18 through NVSwitch, 32 channels), Simple against
   * LL forced from 1 to 8 MB: the crossovers fell between 2 and 4 MB for all-reduce (2 MB:
   * LL 24.1 us, Simple 32.2; 4 MB: 43.0 and 41.3), reduce-scatter and all-gather (2 MB: LL
   * 15.7, Simple 17.8-18.6; 4 MB: 25.8-26.3 and 22.8-23.4), where the two-rank constants
   * alone put them between 1 and 2 MB; 3.4 us a step puts them at about 3 MB
   * (docs/tuning.md, Tuning model constants). LL forwards line by line and LL128 is not
   * chosen: 0. PCIe: not measured, 0. Rings across hosts do not take it (tune.c): not
   * measured there.
   */
  .ring_fwd_lat = {
    /* Simple  LL    LL128 */
    {  3.4f,   0.0f, 0.0f },  /* NVLink */
    {  0.0f,   0.0f, 0.0f },  /* PCIe / host */
    {  0.0f,   0.0f, 0.0f },  /* network (unused) */
  },
  /*
   * Achieved / modelled bandwidth. NVLink, measured at 1 GB on the H200 pair
   * with each protocol forced (NCCL 2.28.3): Simple 327-339, LL128 308,
   * LL 122 GB/s against 18 links x 22 GB/s = 396 modelled. PCIe and network:
   * NCCL's LL is half of Simple by construction (8 B flag per 8 B); LL128 is
   * only trusted over NVLink (128-byte stores are not atomic over PCIe),
   * hence 0, which disables it there.
   */
  .proto_eff = {
    /* Simple  LL     LL128 */
    {  0.86f,  0.31f, 0.78f },  /* NVLink */
    {  0.90f,  0.45f, 0.0f  },  /* PCIe / host */
    {  0.90f,  0.45f, 0.80f },  /* network */
  },
  /* NCCL scales tree all-reduce by 0.92 against the link; keep that until measured. */
  .tree_eff = 0.92f,
  /*
   * A direct all-reduce sends to and receives from every peer at once, but
   * each proxy posts its sends and receives one after another (a syscall
   * each on sockets). Measured on the same set-up: 8 bytes across 4 hosts in
   * 55-64 µs = base + one step + 2 peers x ~15 µs. Hosts that do not share
   * one machine's cores and TCP stack should do better: measure there.
   */
  .direct_peer_lat = 15.0f,
  /*
   * The two-rank pair exchange over P2P (pair.h) takes chunks of the size per
   * channel / pair_chunks, between pair_chunk_min and a FIFO slot (512 KB): its
   * last chunk's reduce does not overlap a transfer, so a channel wants many.
   * Measured on 2x H100 NV18, fixed chunks of 128, 256 and 512 KB from 2 MB
   * to 2 GB: for all-reduce and all-gather this rule was within 3% of the
   * best of them from 8 MB up and within 0.6 us below; any one fixed size
   * lost up to 17% somewhere (docs/tuning.md, Pair exchange chunk size).
   */
  .pair_chunks = 16,
  .pair_chunk_min = 131072,
  /*
   * The copy-engine exchange of two ranks against the kernels (2x H100 NV18, one run,
   * 64 MB slots; docs/tuning.md, BRAID_CE_MIN_BYTES), busbw GB/s at 512 MB / 2 GiB: all-reduce
   * 349 / 373 against 333 / 348, reduce-scatter 328-337 / 364 against 318 / 328, all-gather
   * 336-346 / 370 against 340 / 357, all-to-all 344 / 368 against 350 / 353, send/recv
   * 358 / 375 against 362 / 366; broadcast 304 / 308 against 366 / 371 (its root's own copy);
   * everything slower at 32 and 128 MB (the first chunk's copy and the last one's pass
   * overlap nothing). So: all-reduce and reduce-scatter from 512 MB, all-gather and
   * send/receive (all-to-all's messages are half its size) from 1 GB (not measured at 1 GB),
   * broadcast and reduce never.
   */
  .ce_min_bytes =
      {
          [BRAID_COLL_BROADCAST] = 0,
          [BRAID_COLL_REDUCE] = 0,
          [BRAID_COLL_ALLGATHER] = 1ll << 30,
          [BRAID_COLL_REDUCESCATTER] = 512ll << 20,
          [BRAID_COLL_ALLREDUCE] = 512ll << 20,
          [BRAID_COLL_SENDRECV] = 1ll << 30,
      },
  /* NCCL's defaults: 512 threads for Simple and LL, 640 for LL128. */
  .nthreads = {512, 512, 640},
  /* NCCL's thread thresholds: a channel needs 64 B per thread (Simple), 8 B (LL, LL128). */
  .thread_bytes = {64, 8, 8},
  /*
   * LL128's numbers above are NCCL's LL128 on the H200 pair, not Braid's.
   * Braid's, measured there (docs/tuning.md, BRAID_PROTO): 199 GB/s at 512 MB
   * against NCCL's 299, and slower than Braid's own default choice at every
   * size from 8 KB up. The model leaves it out until it is faster;
   * BRAID_PROTO (NCCL_PROTO) naming it runs it.
   */
  .proto_auto = {1, 1, 0},
};

/*
 * NVLink bandwidth per link and direction. SM90: measured 397 GB/s
 * copy-engine peer copy over 18 links = 22 GB/s (NCCL uses 20.6). Others:
 * NCCL's SMxx_NVLINK_BW.
 */
float tune_nvlink_bw(int sm) {
  if (sm >= 100) return 40.1f;
  if (sm >= 90) return 22.0f;
  if (sm == 86 || sm == 87 || sm == 89) return 12.0f;
  if (sm >= 70) return 20.0f;
  return 18.0f;
}

/*
 * Per lane: raw rate x line encoding (8b/10b up to 5 GT/s, 128b/130b after,
 * FLIT ~0.96 for Gen6) x 0.88, the efficiency measured for pinned host<->GPU
 * copies on Gen5 x16 (55.5 GB/s of 63). Empty or unknown speeds count as
 * Gen3, as NCCL does.
 */
float tune_pcie_lane_bw(const char* link_speed) {
  double gts = link_speed ? strtod(link_speed, NULL) : 0.0;
  double enc = gts <= 5.0 ? 0.8 : gts >= 64.0 ? 0.96 : 128.0 / 130.0;
  if (!(gts >= 2.5 && gts <= 256.0)) {
    gts = 8.0;
    enc = 128.0 / 130.0;
  }
  return (float)(gts * enc / 8.0 * 0.88);
}

/* Socket-to-socket bandwidth: NCCL's values (BDW/SKL/SRP/ERP QPI, AMD, P9, ARM, ZPI). */
float tune_cpu_bw(int arch, int vendor, int model) {
  if (arch == TUNE_CPU_ARCH_POWER) return 32.0f;
  if (arch == TUNE_CPU_ARCH_ARM) return 6.0f;
  if (vendor == TUNE_CPU_VENDOR_AMD) return 16.0f;
  if (vendor == TUNE_CPU_VENDOR_ZHAOXIN) return 6.0f;
  if (vendor == TUNE_CPU_VENDOR_INTEL) {
    switch (model) {
      case TUNE_CPU_MODEL_ERP: return 40.0f;
      case TUNE_CPU_MODEL_SRP: return 22.0f;
      case TUNE_CPU_MODEL_SKL: return 10.0f;
      default: return 6.0f;
    }
  }
  return 6.0f;
}

/* Per-ring speeds tried by the search, fastest first (GB/s); 0 ends the list. */
const float tune_search_speeds[] = {64.0f, 48.0f, 40.0f, 32.0f, 24.0f, 20.0f, 16.0f, 12.0f,
                                    10.0f, 8.0f,  6.0f,  5.0f,  4.0f,  3.0f,  2.5f,  2.0f,
                                    1.5f,  1.2f,  1.0f,  0.75f, 0.5f,  0.25f, 0.1f,  0.0f};
