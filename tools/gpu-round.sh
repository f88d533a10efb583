#!/usr/bin/env bash
# One round on a GPU machine: build, the GPU tests, the examples, and Braid against the
# installed NCCL. Run it from anywhere on the machine that has the GPUs:
#   bash tools/gpu-round.sh [build] [test] [examples] [compare]      (default: all four)
# Results go to $OUT (default ./gpu-round-out): summary.txt, logs.tgz (every step's full log)
# and from the compare step compare.md/.png and compare_inplace.md (compare_tN*, compare_gN*
# for the other modes), compare_bf16.md/.png.
#
# Settings (environment):
#   BUILD_DIR      build tree, relative to the repository root (build-gpu)
#   CUDA_ARCHS     CMAKE_CUDA_ARCHITECTURES (native: the GPUs of this machine)
#   CTEST_JOBS     GPU tests run at once (1: the tests take every GPU they find)
#   TEST_ONLY      regular expression: only these GPU tests (ctest -R)
#   TEST_EXCLUDE   regular expression of GPU tests left out (default: leaks, the 1000-communicator
#                  checks, several minutes each; set it empty to run them)
#   TEST_FORCED=1  also the forced algorithm x protocol matrix (label forced, ~2 minutes a test)
#                  (tests labelled long, such as the 200-iteration chaos run, only by ctest -L long)
#   TEST_LIMIT     seconds for the whole test step (0: none)
#   NP             ranks for compare, one per GPU (default: every GPU nvidia-smi lists)
#   COMPARE_MODES  any of mpirun (one process a GPU), threads (-t NP), gpus (-g NP) (mpirun)
#   COMPARE_ROUNDS alternating runs per library (2); COMPARE_COLLECTIVES narrows the list;
#   COMPARE_BF16=0 skips the bfloat16 all-reduce; COMPARE_LIMIT seconds a collective (0: none);
#   COMPARE_ISOLATED=1 runs each rank seeing only its own GPU (perf/compare --isolated)
#   NCCL_LIB_DIR   directory of NVIDIA's libnccl.so.2 (default: perf/compare finds it)
# NVLink multicast (NVLS) stays off for both libraries: NCCL_NVLS_ENABLE=0.
set -uo pipefail
OUT=$(mkdir -p "${OUT:-gpu-round-out}" && cd "${OUT:-gpu-round-out}" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2
export NCCL_NVLS_ENABLE=0
LOGS=$OUT/logs
mkdir -p "$LOGS"
: > "$OUT/summary.txt"
BUILD_DIR=${BUILD_DIR:-build-gpu}
steps=${*:-build test examples compare}
status=0

log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

# run NAME LIMIT CMD...: CMD with a time limit (0: none), its output in $LOGS/NAME.log; the
# summary gets its exit status and time, and the log's tail when it failed.
run() {
  local name=$1 limit=$2 start=$SECONDS rc; shift 2
  timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  log "$name: rc=$rc ($((SECONDS - start)) s)"
  [ $rc -eq 0 ] || { status=1; tail -30 "$LOGS/$name.log" | tee -a "$OUT/summary.txt"; }
  return $rc
}

{
  echo "host $(hostname), $(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M UTC')"
  git log -1 --format='commit %h %s' 2>/dev/null
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
  nvcc --version 2>/dev/null | tail -1
} >> "$OUT/summary.txt"
nvidia-smi topo -m > "$LOGS/topology.log" 2>&1

for step in $steps; do
  case $step in
    build)
      command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
      run configure 0 cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-native}" &&
        run build 0 cmake --build "$BUILD_DIR" -j "$(nproc)"
      ;;
    test)
      # The leak checks and the forced matrix are long; TEST_EXCLUDE= and TEST_FORCED=1 add them.
      # The examples (labels gpu and examples) have their own step.
      excl=${TEST_EXCLUDE-leaks}
      lexcl="forced|long|examples"; [ "${TEST_FORCED:-0}" = 1 ] && lexcl="long|examples"
      log "ctest -L gpu${lexcl:+ -LE $lexcl}${excl:+ -E $excl}${TEST_ONLY:+ -R $TEST_ONLY}"
      run ctest-gpu "${TEST_LIMIT:-0}" ctest --test-dir "$BUILD_DIR" -L gpu ${lexcl:+-LE "$lexcl"} \
        ${excl:+-E "$excl"} ${TEST_ONLY:+-R "$TEST_ONLY"} -j "${CTEST_JOBS:-1}" --output-on-failure
      grep -E "tests passed|tests failed|\*\*\*|Not Run|Skipped" "$LOGS/ctest-gpu.log" |
        head -40 >> "$OUT/summary.txt"
      ;;
    examples)
      run ctest-examples 0 ctest --test-dir "$BUILD_DIR" -L examples --output-on-failure
      grep -E "tests passed|tests failed|\*\*\*" "$LOGS/ctest-examples.log" >> "$OUT/summary.txt"
      ;;
    compare)
      # Seven collectives, float32 (sum where it reduces), 8 B to 2 GiB by x4, the two libraries
      # alternating; one comparison per collective (a slow one loses only itself), its in-place
      # table from the same runs, then the tables joined (perf/compare --merge). Modes: one
      # process per GPU under mpirun, one thread per GPU (-t), one thread driving them all (-g).
      # Then the bfloat16 all-reduce under mpirun.
      np=${NP:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
      [ "$np" -ge 2 ] || { log "compare: needs 2 GPUs or more, found $np"; status=1; continue; }
      C=(python3 "$BUILD_DIR/perf/compare" --rounds "${COMPARE_ROUNDS:-2}"
         ${NCCL_LIB_DIR:+--nccl-lib "$NCCL_LIB_DIR"})
      F=(-b 8 -e 2G -f 4 -w 5 -n 20)
      colls=${COMPARE_COLLECTIVES:-all_reduce,all_gather,reduce_scatter,broadcast,reduce,sendrecv,alltoall}
      for mode in ${COMPARE_MODES:-mpirun}; do
        case $mode in
          mpirun) M=(--mpirun "$np"); tag=compare; what="$np ranks under mpirun" ;;
          threads) M=(-t "$np"); tag=compare_t$np; what="one process, a thread per GPU" ;;
          gpus) M=(-g "$np"); tag=compare_g$np; what="one thread driving $np GPUs" ;;
          *) log "compare: unknown mode '$mode' (mpirun, threads, gpus)"; status=2; continue ;;
        esac
        if [ "${COMPARE_ISOLATED:-0}" = 1 ] && [ "$mode" = mpirun ]; then
          M+=(--isolated); what="$what, each seeing only its GPU"
        fi
        log "perf/compare, $what"
        parts=(); iparts=()
        for c in ${colls//,/ }; do
          run "${tag}_$c" "${COMPARE_LIMIT:-0}" "${C[@]}" "${M[@]}" --collectives "$c" \
            --markdown "$LOGS/${tag}_$c.md" --markdown-other-place "$LOGS/${tag}_${c}_ip.md" \
            --plot '' -- "${F[@]}"
          grep -E "^# geomean" "$LOGS/${tag}_$c.log" >> "$OUT/summary.txt"
          [ -s "$LOGS/${tag}_$c.md" ] && parts+=("$LOGS/${tag}_$c.md")
          [ -s "$LOGS/${tag}_${c}_ip.md" ] && iparts+=("$LOGS/${tag}_${c}_ip.md")
        done
        [ ${#parts[@]} -gt 0 ] || continue
        run "${tag}_merge" 0 "${C[0]}" "${C[1]}" --merge "${parts[@]}" --markdown "$OUT/$tag.md" \
          --plot "$OUT/$tag.png"
        [ ${#iparts[@]} -gt 0 ] && run "${tag}_inplace_merge" 0 "${C[0]}" "${C[1]}" \
          --merge "${iparts[@]}" --markdown "$OUT/${tag}_inplace.md" --plot ''
        # Where Braid took longer, a line per collective and place (none: no line).
        awk '/^## /{c=$2} /^Braid slower at/ && !/none$/ {n=FILENAME; sub(/.*\//, "", n);
          print n ", " c ": " $0}' "$OUT/$tag.md" "$OUT/${tag}_inplace.md" 2>/dev/null \
          >> "$OUT/summary.txt"
      done
      [ "${COMPARE_BF16:-1}" = 1 ] || continue
      M=(--mpirun "$np"); [ "${COMPARE_ISOLATED:-0}" = 1 ] && M+=(--isolated)
      run compare_bf16 "${COMPARE_LIMIT:-0}" "${C[@]}" "${M[@]}" --plot "$OUT/compare_bf16.png" \
        --markdown "$OUT/compare_bf16.md" --collectives all_reduce -- "${F[@]}" -d bfloat16
      grep -E "^# geomean" "$LOGS/compare_bf16.log" >> "$OUT/summary.txt"
      ;;
    *) log "unknown step '$step' (build, test, examples, compare)"; status=2 ;;
  esac
done

tar czf "$OUT/logs.tgz" -C "$LOGS" . && rm -rf "$LOGS"
log "done: $([ $status -eq 0 ] && echo ok || echo FAILED); results in $OUT"
exit $status
