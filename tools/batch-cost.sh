#!/usr/bin/env bash
# What a batch of -n calls costs beyond n calls (GPU machine): all_reduce_perf at 8 B, two
# processes bound to a core each (as perf/compare), for several -n, each run -N 8 times (a
# barrier before each batch), with the floor library (tools/floor-nccl.cu, .device/floor),
# Braid (BUILD_DIR's) and NCCL. Prints per library and -n the median and lowest us a call
# (out of place) and n times the median: batch = fixed + n * per_call.
#   BATCH_ROUNDS (2) rounds; BATCH_NS ("1 2 5 20 100 1000").
set -uo pipefail
cd "$(dirname "$0")/.."
. tools/device-libs.sh
libs=$LIBS
for r in $(seq 1 "${BATCH_ROUNDS:-2}"); do
  echo "== round $r"
  for l in $libs; do
    name=${l%%=*}; dir=${l#*=}
    for n in ${BATCH_NS:-1 2 5 20 100 1000}; do
      LD_LIBRARY_PATH=$dir timeout 120 mpirun --allow-run-as-root --bind-to core -np 2 \
        -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$B/perf/all_reduce_perf" -b 8 -e 8 -w 5 -n $n -N 8 \
        -g 1 2>&1 | awk '$1 == 8 {print $6}' | sort -g |
        awk -v name=$name -v n=$n '{t[++k] = $1}
          END {if (k == 0) {print name, "n", n, "failed"; exit}
               m = t[int((k + 1) / 2)];
               printf "%-6s n %5d: median %7.2f  min %7.2f  n*median %9.1f us (%d batches)\n",
                      name, n, m, t[1], n * m, k}'
    done
  done
done
