#!/usr/bin/env bash
# One round on the GPU machine: build, GPU tests, benchmarks against NCCL.
# Logs go to $OUT (the device tool brings them back) or ./gpu-check-out.
#   bash tools/gpu-check.sh [build] [test] [sanitize] [perf] [compare]   (default: build test perf)
# Keep NCCL_NVLS_ENABLE=0: NVLink multicast must never be used on the shared machine.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
steps=${*:-build test perf}
status=0

log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

for step in $steps; do
  case $step in
    build)
      log "build ($(nproc) cores)"
      start=$(date +%s)
      { cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
        cmake --build "$BUILD_DIR" -j "$(nproc)"; } > "$OUT/build.log" 2>&1 || { status=1; tail -40 "$OUT/build.log"; }
      log "build: rc=$status in $(( $(date +%s) - start )) s"
      ;;
    test)
      log "ctest -L gpu"
      ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure --timeout 300 > "$OUT/ctest-gpu.log" 2>&1 || status=1
      tail -15 "$OUT/ctest-gpu.log" | tee -a "$OUT/summary.txt"
      ;;
    unit)
      log "ctest -L 'unit|mp'"
      ctest --test-dir "$BUILD_DIR" -L 'unit|mp' --output-on-failure -j 8 > "$OUT/ctest-unit.log" 2>&1 || status=1
      tail -5 "$OUT/ctest-unit.log" | tee -a "$OUT/summary.txt"
      ;;
    sanitize)
      log "compute-sanitizer (reduced run)"
      compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD_DIR/tests/gpu/gpu_coll" --mode threads --quick \
        > "$OUT/sanitizer.log" 2>&1; rc=$?
      [ $rc -eq 0 ] || status=1
      tail -5 "$OUT/sanitizer.log" | tee -a "$OUT/summary.txt"
      ;;
    perf)
      log "all_reduce_perf, Braid, 2 processes"
      mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
        "$BUILD_DIR/perf/all_reduce_perf" -b 8 -e 1G -f 2 -g 1 > "$OUT/all_reduce_braid.log" 2>&1 || status=1
      tail -30 "$OUT/all_reduce_braid.log" | tee -a "$OUT/summary.txt"
      ;;
    compare)
      log "perf/compare"
      python3 "$BUILD_DIR/perf/compare" --mpirun -np 2 --png "$OUT/compare.png" \
        --markdown "$OUT/compare.md" > "$OUT/compare.log" 2>&1 || status=1
      tail -60 "$OUT/compare.log" | tee -a "$OUT/summary.txt"
      ;;
    *) log "unknown step $step"; status=2 ;;
  esac
done
exit $status
