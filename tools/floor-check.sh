#!/usr/bin/env bash
# The 8 B all-reduce against the floor of a launch per exchange, in one call (GPU machine):
# tools/resident-probe.cu's "launch" way (two threads of one process, one minimal exchange
# kernel launched per op), then all_reduce_perf at 8 B with Braid (BUILD_DIR's library and,
# when .device/old-packed.tar.xz is there, the old one) and NCCL, two threads of one process
# (-t 2, as the probe) and two processes bound to a core each (mpirun's default, perf/compare's).
#   FLOOR_ROUNDS (3) rounds; needs .device/resident-probe (nvcc -O2 -arch=sm_90 -Itools -o
#   .device/resident-probe tools/resident-probe.cu -lcuda -lpthread). Output on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
B=${BUILD_DIR:-.device/build}
[ -f .device/packed.tar.xz ] && tar -C "$B" -xJf .device/packed.tar.xz
libs="new=$PWD/$B/src"
if [ -f .device/old-packed.tar.xz ]; then
  mkdir -p .device/old && tar -C .device/old -xJf .device/old-packed.tar.xz && libs="$libs old=$PWD/.device/old/src"
fi
libs="$libs nccl=${NCCL_LIB_DIR:-/usr/lib/x86_64-linux-gnu}"
F="-b 8 -e 8 -w 200 -n 5000"
for r in $(seq 1 "${FLOOR_ROUNDS:-3}"); do
  echo "== round $r"
  timeout 120 .device/resident-probe 2>&1 | grep -i -E "launch|wrong|error" | sed 's/^/probe: /'
  for l in $libs; do
    name=${l%%=*}; dir=${l#*=}
    t=$(LD_LIBRARY_PATH=$dir timeout 120 "$B/perf/all_reduce_perf" $F -t 2 -g 1 2>&1 | awk '$1 == 8 {print $6, $10}')
    p=$(LD_LIBRARY_PATH=$dir timeout 120 mpirun --allow-run-as-root --bind-to core -np 2 \
        -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$B/perf/all_reduce_perf" $F -g 1 2>&1 |
        awk '$1 == 8 {print $6, $10}')
    echo "$name: 2 threads ${t:-failed} us; 2 processes ${p:-failed} us (out of / in place)"
  done
done
