#!/usr/bin/env bash
# l7 (2 GPUs): the FIFO waits' abort check every 64 spins (this build) against every 1024
# (old_, the kernels of 8d07fda): the same sweep as l6, the abortpeer case's report, the suite.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
B=.device/build
BUILD_DIR=$B SWEEP_FILE=perf/sweeps/l6-abort-clock-ab.txt SWEEP_ROUNDS=2 \
  SWEEP_OLD_TAR=.device/old-packed.tar.xz tools/gpu-check.sh sweep
mv $OUT/logs.tgz $OUT/sweep-logs.tgz
( export LD_LIBRARY_PATH=$PWD/$B/src BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=INIT
  for i in 1 2 3; do
    echo "# abortpeer $i"
    timeout 100 $B/tests/gpu/gpu_coll --mode hosts --suite abortpeer --timeout 90 2>&1 |
      grep -E "ncclCommAbort: rank|abortpeer \[|cases|FAIL" | sed 's/^.*BRAID/BRAID/'
  done ) > $OUT/l7-abort.txt 2>&1
cat $OUT/l7-abort.txt
BUILD_DIR=$B CTEST_JOBS=6 TEST_LIMIT=400 tools/gpu-check.sh test
