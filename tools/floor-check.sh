#!/usr/bin/env bash
# The 8 B all-reduce against the floor of a launch per exchange, in one call (GPU machine).
#  - tools/resident-probe.cu's "launch" way (two threads of one process, one minimal exchange
#    kernel launched per op), when .device/resident-probe is there (nvcc -O2 -arch=sm_90 -Itools
#    -o .device/resident-probe tools/resident-probe.cu -lcuda -lpthread);
#  - all_reduce_perf with each library: "floor" (tools/floor-nccl.cu, a libnccl.so.2 whose
#    ncclAllReduce is one minimal exchange kernel and nothing else, when .device/floor/ has it),
#    Braid (BUILD_DIR's; and "old" when .device/old-packed.tar.xz is there) and NCCL, two
#    processes bound to a core each (mpirun's default, what perf/compare gets) in two ways:
#    perf/compare's flags (-b 8 -e 2G -f 4 -w 5 -n 20: 8 B the first size after the warm-up)
#    and a long loop (-w 200 -n 5000); and two threads of one process (-t 2, as the probe;
#    not the floor's). FLOOR_ROUNDS (3) rounds. Output on stdout: us a call, out of place /
#    in place; with FLOOR_LOGS=DIR each compare-flags run's whole output there too.
set -uo pipefail
cd "$(dirname "$0")/.."
BRAID_NAME=new DEVICE_LIBS_OLD=1 . tools/device-libs.sh
libs=$LIBS
LONG="-b 8 -e 8 -w 200 -n 5000"
SHORT="-b 8 -e 2G -f 4 -w 5 -n 20"
# procs TAG FLAGS: all_reduce_perf's 8 B row (out of place, in place) from two bound processes.
procs() {
  local log=${FLOOR_LOGS:+$FLOOR_LOGS/$name-$r-$1.log}
  shift
  LD_LIBRARY_PATH=$dir timeout 120 mpirun --allow-run-as-root --bind-to core -np 2 \
    -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$B/perf/all_reduce_perf" "$@" -g 1 2>&1 |
    tee ${log:-/dev/null} | awk '$1 == 8 {print $6, $10}'
}
for r in $(seq 1 "${FLOOR_ROUNDS:-3}"); do
  echo "== round $r"
  [ -x .device/resident-probe ] &&
    timeout 120 .device/resident-probe 2>&1 | grep -i -E "launch|wrong|error" | sed 's/^/probe: /'
  for l in $libs; do
    name=${l%%=*}; dir=${l#*=}
    s=$(procs n20 $SHORT); p=$(procs n5000 $LONG)
    t=
    [ "$name" = floor ] ||
      t=$(LD_LIBRARY_PATH=$dir timeout 120 "$B/perf/all_reduce_perf" $LONG -t 2 -g 1 2>&1 | awk '$1 == 8 {print $6, $10}')
    echo "$name: 2 processes -n 20 ${s:-failed}; -n 5000 ${p:-failed}${t:+; 2 threads -n 5000 $t} (us, out of / in place)"
  done
done
