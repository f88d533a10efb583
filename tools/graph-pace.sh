#!/usr/bin/env bash
# An 8 B-512 B all-reduce's pace eager (-n 1000) and in a CUDA graph (-n 20 -G 50: the GPU's
# time an operation, the host's launch out of it), two processes bound to a core each, for
# Braid under each of PACE_VARIANTS ("name ENV=VALUE ..." separated by ';') and NCCL.
#   PACE_ROUNDS (2) rounds. Output: "name flags | size: us out of place, in place".
set -uo pipefail
cd "$(dirname "$0")/.."
. tools/device-libs.sh
# one NAME LIBDIR "ENV..." FLAGS...
one() {
  local name=$1 dir=$2 envs=$3 x= e; shift 3
  for e in $envs; do x="$x -x ${e%%=*}"; done
  env $envs LD_LIBRARY_PATH=$dir timeout 120 mpirun --allow-run-as-root --bind-to core -np 2 \
    -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE $x "$B/perf/all_reduce_perf" "$@" -g 1 2>&1 |
    awk -v name="$name $*" '$1 ~ /^[0-9]+$/ && NF > 10 {printf "%s | %s: %s %s\n", name, $1, $6, $10}
                             /WARN|rror/ {print name ": " $0}' | head -8
}
IFS=';' read -r -a variants <<< "${PACE_VARIANTS:-braid}"
for r in $(seq 1 "${PACE_ROUNDS:-2}"); do
  echo "== round $r"
  for v in "${variants[@]}" "nccl"; do
    read -r name envs <<< "$v"
    dir=$PWD/$B/src; [ "$name" = nccl ] && dir=$NCCL_DIR
    one "$name" "$dir" "${envs:-}" -b 8 -e 512 -f 8 -w 5 -n 1000
    one "$name" "$dir" "${envs:-}" -b 8 -e 512 -f 8 -w 5 -n 20 -G 50
  done
done
