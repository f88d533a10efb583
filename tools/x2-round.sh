#!/usr/bin/env bash
# The rounds on the 2-GPU machine (device kind nvidia-h200-x2), one device call each (each under
# the tool's 10 minutes a command), from a build staged here with braid-info:
#   STAGE_INFO=1 bash tools/stage-device.sh build
# then, carrying .device:  bash tools/x2-round.sh N   (logs and tables under $OUT/rN)
#   1  issues 3-6: probe, detected topology against the fixture, the all-reduce sweep under
#      mpirun on Braid and NCCL, perf/compare of every collective 8 B - 2 GiB (one round) and
#      bf16 all-reduce
#   2  issues 2, 3, 7, 9: every GPU test but the 1000-communicator leak runs, CTEST_JOBS
#      (default 3) at once
#   3  issues 7, 8: the socket path with each emulated host on a GPU of its own against NCCL's
#      socket path; PyTorch DDP on Braid and on NCCL
#   4  issues 3, 9: compute-sanitizer (reduced run) and the single-process 2-GPU leak run
#   5  issue 6: the one-hop pair exchange against the ring; the copy-engine exchange against
#      the kernels and NCCL (16 MB - 2 GB)
#   6  after a fix: round 2 again, then the socket path at 1 GiB (with the streams x threads
#      sweep) and PyTorch again
#   7  issues 2, 6: the world communicator's queries (gpu_api), small sizes of reduce-scatter
#      against all-gather and NCCL (tools/gpu-check.sh small), the copy-engine exchange of
#      every collective it runs against the kernels and NCCL, one round
#   8  issues 6, 7: large sizes with each buffer/thread/channel setting against NCCL
#      (gpu-check.sh bw); PyTorch DDP alternating with NCCL, its compute-only step time, and
#      Braid variants that leave SMs to the model (gpu-check.sh ddp)
#   9  issues 6, 7: the one-hop pair exchange against the ring, send/recv buffer sizes, DDP
#      with the pair exchange and with fewer threads per CTA
#   10 issue 7: DDP on Braid and NCCL twice, each with a profile of 10 steps (GPU time per
#      kernel, the collectives' time beside other kernels)
#   11 issue 7: NCCL's tuning choice at the buckets' sizes; DDP on Braid and NCCL, then
#      Braid alone with LL128, fewer channels, smaller chunks
#   12 issue 7: all-reduce 1 MB - 2 GB with smaller ring chunks and 24 channels; DDP with
#      128 KB chunks alternating with NCCL
#   13 issues 6, 8: a post warp in Simple steps against the default; send/recv with LL up to
#      64 KB - 1 MB (and its P2P tests forced onto LL); the socket path's ring against the
#      one-hop exchange at 8-16 channels, each emulated host on its own GPU
#   14 issues 6, 8: the post warp on send/recv connections, alternated; every GPU test with it;
#      the socket path at 1 GiB (exchange now the default, against the ring and NCCL), 8 B-128 KB
#   15 issues 6, 8: the GPU tests round 14 left (time), the new two-hosts-of-two-GPUs test; under
#      MPS the same over OFI, the two-host suite over OFI, the tree all-reduce on two hosts
#   16 issues 6, 8: with the post warp on by default for P2P send/recv: the tests it touches
#      left from 14-15, one at a time; OFI two-host suites without MPS; perf/compare, 2 rounds
#   17 issue 8: the split-share cases on two hosts of two GPUs over OFI, with ofi_rxm's receive
#      pool at 32 buffers and at libfabric's 128; the mixed OFI suites (at 32); all-reduce over
#      OFI with both; the socket path at 1 GiB and 8 B-128 KB against NCCL
#   18 issue 8: round 17's split-share cases, three times with each receive pool, stacks of a
#      hang (tools/stack-on-hang.sh); the socket path at 1 GiB twice and 8 B-128 KB
#   19 issue 8: round 18's cases again, with the proxies' step report on SIGUSR1 before the stacks
#   20 issue 8: the first split-share case with the ring forced and by default, alternated
#   21 after 443a33c (P2P FIFOs zeroed before export) and f602400 (BRAID_HANG_WARN): every GPU
#      test (the new legacy-stream case and gpu_net_hosts_hangwarn among them), then the
#      split-share cases on two hosts of two GPUs over OFI ten times (round 19 hung in 5 of 7)
#   22 round 21 with the Hopper launch attributes (remote memory sync domain by default): every
#      GPU test, then the split-share cases over OFI five times
#   23 issues 6-8: the launch attributes against NCCL's (gpu-check.sh launch); the socket path at
#      1 GiB and 8 B-128 KB against NCCL
#   24 with clusters of 4 blocks by default: every GPU test, then PyTorch DDP on Braid and NCCL
#   25 issue 6: perf/compare of every collective and bf16 all-reduce (COMPARE_ROUNDS, default 1)
set -uo pipefail
cd "$(dirname "$0")/.."
export BUILD_DIR=${BUILD_DIR:-.device/build}
OUT=${OUT:-$PWD/x2-out}
n=${1:-}
export OUT=$OUT/r$n
# gpu_tests: every GPU test but the leak runs, CTEST_JOBS at once. net_hosts STEPS...: the socket
# path with each emulated host on a GPU of its own (no MPS needed), under $OUT/hosts.
gpu_tests() { CTEST_JOBS=${CTEST_JOBS:-3} TEST_LIMIT=${TEST_LIMIT:-560} bash tools/gpu-check.sh test; }
net_hosts() {
  OUT=$1 NO_MPS=1 AS_HOST_GPUS=$(nvidia-smi -L | grep -c '^GPU') bash tools/gpu-hosts.sh "${@:2}"
}
case $n in
  1) COMPARE_ROUNDS=1 bash tools/gpu-check.sh probe topo mpi compare ;;
  2) gpu_tests ;;
  3) net_hosts "$OUT" perf torch ;;
  4) SANITIZE_LIMIT=200 bash tools/gpu-check.sh sanitize; rc=$?
     OUT=$OUT/leaks TEST_EXCLUDE= TEST_ONLY=leaks_threads bash tools/gpu-check.sh test || rc=1
     exit $rc ;;
  5) bash tools/gpu-check.sh pair ce ;;
  6) gpu_tests; rc=$?
     net_hosts "$OUT/hosts" big sweep torch || rc=1
     exit $rc ;;
  7) OUT=$OUT/api TEST_ONLY='gpu_api_(threads|procs)' CTEST_JOBS=2 TEST_LIMIT=200 bash tools/gpu-check.sh test; rc=$?
     CE_ROUNDS=1 bash tools/gpu-check.sh small ce || rc=1
     exit $rc ;;
  8) bash tools/gpu-check.sh bw ddp ;;
  9) bash tools/gpu-check.sh pair p2pbuf; rc=$?
     OUT=$OUT/ddp DDP_RUNS=1 DDP_VARIANTS="pair128m BRAID_P2P_PAIR_MAX=134217728
t256 BRAID_NTHREADS=256" bash tools/gpu-check.sh ddp || rc=1
     exit $rc ;;
  10) DDP_RUNS=2 DDP_VARIANTS= DDP_ARGS="--profile-steps 10" bash tools/gpu-check.sh ddp ;;
  11) bash tools/gpu-check.sh ncclchoice; rc=$?
      OUT=$OUT/ddp DDP_RUNS=1 DDP_ARGS="--profile-steps 10" DDP_VARIANTS_ALONE=1 DDP_VARIANTS="ll128 BRAID_PROTO=LL128
ch24 BRAID_MAX_NCHANNELS=24
chunk128k BRAID_CHUNKSIZE=131072
chunk256k BRAID_CHUNKSIZE=262144" bash tools/gpu-check.sh ddp || rc=1
      exit $rc ;;
  12) bash tools/gpu-check.sh chunk; rc=$?
      OUT=$OUT/ddp DDP_RUNS=0 DDP_VARIANTS="chunk128k_a BRAID_CHUNKSIZE=131072
chunk128k_b BRAID_CHUNKSIZE=131072" bash tools/gpu-check.sh ddp || rc=1
      exit $rc ;;
  13) bash tools/gpu-check.sh postwarp p2pll; rc=$?
      OUT=$OUT/p2pll TEST_ONLY='gpu_p2p_(threads|procs)' CTEST_JOBS=2 TEST_LIMIT=150 \
        BRAID_P2P_LL_MAX=1048576 BRAID_PROTO=LL bash tools/gpu-check.sh test || rc=1
      net_hosts "$OUT/hosts" chan || rc=1
      exit $rc ;;
  14) PWAB_ROUNDS=2 bash tools/gpu-check.sh pwab; rc=$?
      OUT=$OUT/tests BRAID_SIMPLE_POST_WARP=2 TEST_LIMIT=330 bash tools/gpu-check.sh test || rc=1
      NETSWEEP="pair A=1
ring BRAID_NET_PAIR_MAX=0
pair2 A=2
ring2 BRAID_NET_PAIR_MAX=0" net_hosts "$OUT/hosts" big netsweep lat || rc=1
      exit $rc ;;
  15) OUT=$OUT/tests TEST_ONLY='gpu_sharegpu|gpu_ce|gpu_determinism|gpu_net_mixed' CTEST_JOBS=3 \
        TEST_LIMIT=300 bash tools/gpu-check.sh test; rc=$?
      OUT=$OUT/hosts AS_HOST_GPUS= bash tools/gpu-hosts.sh mixed tree || rc=1
      exit $rc ;;
  16) OUT=$OUT/tests TEST_ONLY='gpu_sharegpu_(p2p|ll128)$|gpu_net_mixed|gpu_p2p_procs' CTEST_JOBS=1 \
        TEST_LIMIT=200 bash tools/gpu-check.sh test; rc=$?
      OUT=$OUT/hosts NO_MPS=1 bash tools/gpu-hosts.sh mixed || rc=1
      COMPARE_ROUNDS=2 COMPARE_LIMIT=300 bash tools/gpu-check.sh compare || rc=1
      exit $rc ;;
  17) export FI_OFI_RXM_MSG_RX_SIZE=32
      NO_MPS=1 REPEAT=2 OUT=$OUT/case bash tools/gpu-hosts.sh mixedcase; rc=$?
      NO_MPS=1 REPEAT=1 FI_OFI_RXM_MSG_RX_SIZE=128 OUT=$OUT/case128 bash tools/gpu-hosts.sh mixedcase || rc=1
      NO_MPS=1 OUT=$OUT/mixed bash tools/gpu-hosts.sh mixed || rc=1
      net_hosts "$OUT/hosts" ofiab big lat || rc=1
      exit $rc ;;
  18) export CASE_LIMIT=40 NO_MPS=1 REPEAT=3
      FI_OFI_RXM_MSG_RX_SIZE=32 OUT=$OUT/case bash tools/gpu-hosts.sh mixedcase; rc=$?
      FI_OFI_RXM_MSG_RX_SIZE=128 OUT=$OUT/case128 bash tools/gpu-hosts.sh mixedcase || rc=1
      net_hosts "$OUT/hosts" big big lat || rc=1
      exit $rc ;;
  19) export CASE_LIMIT=30 NO_MPS=1
      REPEAT=4 FI_OFI_RXM_MSG_RX_SIZE=128 OUT=$OUT/case128 bash tools/gpu-hosts.sh mixedcase; rc=$?
      REPEAT=3 FI_OFI_RXM_MSG_RX_SIZE=32 OUT=$OUT/case bash tools/gpu-hosts.sh mixedcase || rc=1
      exit $rc ;;
  20) export CASE_LIMIT=25 NO_MPS=1 NO_STACKS=1 REPEAT=1 FILTER="Split share: parent"
      for i in 1 2 3; do
        OUT=$OUT/ring$i BRAID_ALGO=RING bash tools/gpu-hosts.sh mixedcase; rc=$?
        OUT=$OUT/default$i bash tools/gpu-hosts.sh mixedcase || rc=1
      done
      exit $rc ;;
  21) TEST_LIMIT=400 gpu_tests; rc=$?
      CASE_LIMIT=40 NO_MPS=1 NO_STACKS=1 REPEAT=10 OUT=$OUT/case bash tools/gpu-hosts.sh mixedcase || rc=1
      exit $rc ;;
  22) TEST_LIMIT=380 gpu_tests; rc=$?
      CASE_LIMIT=40 NO_MPS=1 NO_STACKS=1 REPEAT=5 OUT=$OUT/case bash tools/gpu-hosts.sh mixedcase || rc=1
      exit $rc ;;
  23) bash tools/gpu-check.sh launch; rc=$?
      net_hosts "$OUT/hosts" big lat || rc=1
      exit $rc ;;
  24) TEST_LIMIT=400 gpu_tests; rc=$?
      OUT=$OUT/ddp DDP_RUNS=${DDP_RUNS:-1} DDP_VARIANTS= bash tools/gpu-check.sh ddp || rc=1
      exit $rc ;;
  25) COMPARE_ROUNDS=${COMPARE_ROUNDS:-1} bash tools/gpu-check.sh compare ;;
  *) sed -n '2,/^set /p' "$0" | sed '$d'; exit 2 ;;
esac
