#!/usr/bin/env bash
# The planned rounds on the 2x H200 (device kind nvidia-h200-x2), one device call each, from a
# build staged here with braid-info:  STAGE_INFO=1 bash tools/stage-device.sh build
# then, carrying .device:  bash tools/x2-round.sh N   (N = 1..4; logs and tables in $OUT)
#   1  issues 4-6: detected topology against the fixture, perf tools under mpirun on Braid and
#      NCCL, perf/compare of every collective 8 B - 2 GiB (one round) and bf16 all-reduce
#   2  issue 6: the one-hop pair exchange against the ring; the copy-engine exchange against
#      the kernels and NCCL (16 MB - 2 GB)
#   3  issues 2-3, 6, 9: every GPU test but the 1000-communicator leak runs
#   4  issue 9: compute-sanitizer runs and the leak runs on two GPUs
set -uo pipefail
cd "$(dirname "$0")/.."
export BUILD_DIR=${BUILD_DIR:-.device/build}
case ${1:-} in
  1) COMPARE_ROUNDS=1 bash tools/gpu-check.sh topo mpi compare ;;
  2) bash tools/gpu-check.sh pair ce ;;
  3) bash tools/gpu-check.sh test ;;
  4) bash tools/gpu-check.sh sanitize && TEST_EXCLUDE= TEST_ONLY=leaks bash tools/gpu-check.sh test ;;
  *) sed -n 2,12p "$0"; exit 2 ;;
esac
