#!/usr/bin/env bash
# l6 (2 GPUs): the final build: the GPU suite, the abort report of the abortpeer case, and
# the abort check by clock against the build before it (SWEEP_OLD_TAR), launch-cost stack.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
B=.device/build
BUILD_DIR=$B CTEST_JOBS=6 TEST_LIMIT=420 tools/gpu-check.sh test
mv $OUT/logs.tgz $OUT/ctest-logs.tgz
BUILD_DIR=$B SWEEP_FILE=perf/sweeps/l6-abort-clock-ab.txt SWEEP_ROUNDS=2 \
  SWEEP_OLD_TAR=.device/old-packed.tar.xz tools/gpu-check.sh sweep
S=$OUT/l6-abort.txt
{ for i in 1 2; do echo "# launch-cost stack, CPU 31, run $i"; taskset -c 31 .device/launch-cost 0 stack; done
} > $OUT/l6-launch-stack.txt 2>&1
( export LD_LIBRARY_PATH=$PWD/$B/src BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=INIT
  for i in 1 2 3; do
    echo "# abortpeer $i"
    timeout 100 $B/tests/gpu/gpu_coll --mode hosts --suite abortpeer --timeout 90 2>&1 |
      grep -E "ncclCommAbort: rank|abortpeer \[|cases|FAIL" | sed 's/^.*BRAID/BRAID/'
  done ) > $S 2>&1
cat $S
