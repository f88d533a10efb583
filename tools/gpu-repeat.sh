#!/usr/bin/env bash
# Runs one gpu_coll command again and again for SECS seconds (default 300), under each of
# a few environments in turn, and counts passes and failures: for an intermittent failure.
#   SECS=300 bash tools/gpu-repeat.sh "A=1" "NCCL_PROTO=LL" -- --mode hosts --nranks 2 --suite api --filter Shrink
# Each environment is one word of VAR=VALUE (VAR=VALUE,VAR2=VALUE2 for several). The logs of
# failed runs stay under $OUT/l (device tool) or ./gpu-repeat-out/l; the tally is in summary.txt.
# Binaries: BUILD_DIR (default .device/build, as tools/gpu-build.sh stages them).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-repeat-out}
B=${BUILD_DIR:-.device/build}
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/$B/src
envs=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ ${#envs[@]} -gt 0 ] || envs=("A=1")
mkdir -p "$OUT/l"
end=$(( $(date +%s) + ${SECS:-300} ))
i=0
while [ "$(date +%s)" -lt $end ]; do
  i=$((i + 1))
  for k in "${!envs[@]}"; do
    log=$OUT/l/run.$k.$i.log
    start=$(date +%s)
    env ${envs[$k]//,/ } timeout 120 "$B/tests/gpu/gpu_coll" "$@" > "$log" 2>&1
    rc=$?
    echo "env$k $i rc=$rc $(( $(date +%s) - start ))s $(grep -m1 FAIL "$log")" >> "$OUT/summary.txt"
    [ $rc = 0 ] && rm -f "$log"
  done
done
for k in "${!envs[@]}"; do
  echo "${envs[$k]}: $(grep -c "^env$k .*rc=0 " "$OUT/summary.txt") passed," \
       "$(grep -c "^env$k .*rc=[1-9]" "$OUT/summary.txt") failed" | tee -a "$OUT/summary.txt"
done
