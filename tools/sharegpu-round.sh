#!/usr/bin/env bash
# The intra-node path on one GPU (any suite, N ranks): ranks pose as
# the GPUs of tests/unit/fixtures/h200x<N>_nvswitch.xml (BRAID_TOPO_BUSID) under CUDA MPS.
#   bash tools/sharegpu-round.sh "NAME NP LIMIT ENV ARGS..." ...
# e.g. "full4 4 240 A=1 --suite all" "deadpeer2 2 60 A=1 --suite deadpeer". ENV is one word
# (VAR=VALUE, commas for several). ARGS "--perf TOOL ARGS..." runs perf/TOOL under mpirun
# instead (tools/as-gpu.sh), e.g.
#   "ar_ll128 2 120 NCCL_PROTO=LL128 --perf all_reduce_perf -b 8 -e 64M -f 4 -g 1".
# Binaries from BUILD_DIR (default .device/build, as tools/gpu-build.sh stages them); logs in
# $OUT/logs.tgz, verdicts in $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/sharegpu-out}
B=${BUILD_DIR:-.device/build}
. tools/device-build.sh "$B"
export LD_LIBRARY_PATH=$PWD/$B/src NCCL_NVLS_ENABLE=0
export CUDA_MPS_PIPE_DIRECTORY=/tmp/braid-mps CUDA_MPS_LOG_DIRECTORY=/tmp/braid-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" "$OUT/l"
mps=0
nvidia-cuda-mps-control -d && mps=1
status=0
for spec in "$@"; do
  set -- $spec
  name=$1 np=$2 lim=$3 e=$4
  shift 4
  fx=tests/unit/fixtures/h200x${np}_nvswitch.xml
  ids=$(grep -B1 '<gpu ' "$fx" | grep -o 'busid="[^"]*"' | cut -d'"' -f2 | paste -sd,)
  start=$(date +%s)
  if [ "${1:-}" = --perf ]; then  # a perf tool, one MPI rank per posed GPU (tools/as-gpu.sh)
    shift
    run=(mpirun --allow-run-as-root --bind-to none -np "$np" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE
         -x BRAID_TOPO_FILE -x GPU_COLL_BUSIDS -x CUDA_MPS_PIPE_DIRECTORY tools/as-gpu.sh "$B/perf/$@")
    for v in ${e//,/ }; do run=("${run[@]:0:6}" -x "${v%%=*}" "${run[@]:6}"); done
  else
    run=("$B/tests/gpu/gpu_coll" --mode sharegpu --nranks "$np" --timeout $((lim - 5)) "$@")
  fi
  env BRAID_TOPO_FILE="$fx" GPU_COLL_BUSIDS="$ids" ${e//,/ } timeout -k 5 "$lim" "${run[@]}" \
    > "$OUT/l/$name.log" 2>&1
  rc=$?
  echo "== $name: rc=$rc ($(( $(date +%s) - start )) s) $(grep -E 'cases,' "$OUT/l/$name.log" | tail -1)" | tee -a "$OUT/summary.txt"
  grep -E "^(deadpeer|hang|leaks)|FAIL" "$OUT/l/$name.log" | head -8 | cut -c1-400 | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || status=1
done
[ $mps = 1 ] && echo quit | nvidia-cuda-mps-control
tar czf "$OUT/logs.tgz" -C "$OUT/l" . && rm -rf "$OUT/l"
exit $status
