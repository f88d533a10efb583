#!/usr/bin/env bash
# l5: the abort report (ncclCommAbort's phases) on the GPU machine: the abort/fault/API tests,
# then the abortpeer case alone and under load, its report lines kept.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
B=.device/build
BUILD_DIR=$B CTEST_JOBS=6 TEST_LIMIT=300 TEST_ONLY="api|errors|dead|abort|hang|initfail|inflight" \
  tools/gpu-check.sh test
S=$OUT/l5.txt
export LD_LIBRARY_PATH=$PWD/$B/src BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=INIT
ap() { timeout 100 $B/tests/gpu/gpu_coll --mode hosts --suite abortpeer --timeout 90 2>&1 |
  grep -E "ncclCommAbort: rank|abortpeer \[|cases|FAIL" | sed 's/^.*BRAID/BRAID/'; }
{
  for i in 1 2 3; do echo "# alone $i"; ap; done
  for i in 1 2 3; do
    echo "# beside a suite on both GPUs $i"
    BRAID_DEBUG=WARN timeout 100 $B/tests/gpu/gpu_coll --mode threads --suite coll --quick > /dev/null 2>&1 &
    l=$!; sleep 2; ap; kill $l 2>/dev/null; wait $l 2>/dev/null
  done
} > $S 2>&1
cat $S
