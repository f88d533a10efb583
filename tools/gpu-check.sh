#!/usr/bin/env bash
# One round on the GPU machine: build (or use a staged build), GPU tests, benchmarks against NCCL.
# Logs go to $OUT (the device tool brings them back) or ./gpu-check-out.
#   bash tools/gpu-check.sh [probe] [build] [test] [hosts] [sanitize] [smoke] [perf] [compare] [ce] ...
#   (default: build test perf)
# With a build staged by tools/stage-device.sh (carry .device): BUILD_DIR=.device/build.
# Keep NCCL_NVLS_ENABLE=0: NVLink multicast must never be used on the shared machine.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
# The device tool brings back at most 8 files: logs go to $LOGS and are packed into
# $OUT/logs.tgz at the end; summary.txt, the plot and the tables stay beside it.
LOGS=$OUT/logs
mkdir -p "$LOGS"
BUILD_DIR=${BUILD_DIR:-build-gpu}
NCCL_LIB_DIR=${NCCL_LIB_DIR:-/usr/lib/x86_64-linux-gnu}
steps=${*:-build test perf}
status=0
MPIRUN="mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x BRAID_DEBUG -x BRAID_ALGO -x BRAID_PROTO -x BRAID_P2P_PAIR_MAX -x BRAID_CE_MIN_BYTES"

log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

. tools/device-build.sh "$BUILD_DIR"
export LD_LIBRARY_PATH=$PWD/$BUILD_DIR/src${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# run NAME TIMEOUT CMD...: runs with a time limit, log in $OUT/NAME.log, tail in the summary.
run() {
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  log "$name: rc=$rc ($(( $(date +%s) - start )) s)"
  [ $rc -eq 0 ] || { status=1; tail -25 "$LOGS/$name.log" | tee -a "$OUT/summary.txt"; }
  return $rc
}

for step in $steps; do
  case $step in
    probe)
      { nvidia-smi; nvidia-smi topo -m; nproc; free -g; df -h .; uname -a
        ls -la "$NCCL_LIB_DIR"/libnccl* ; which mpirun mpicc nvcc cmake python3 compute-sanitizer
        mpirun --version | head -2; ls /usr/include/mpi.h /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h
        python3 -c 'import matplotlib, torch; print(matplotlib.__version__, torch.__version__, torch.cuda.device_count())'
      } > "$LOGS/probe.log" 2>&1
      log "probe"; head -40 "$LOGS/probe.log" >> "$OUT/summary.txt"
      ;;
    build)
      log "build ($(nproc) cores)"
      start=$(date +%s)
      { cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
        cmake --build "$BUILD_DIR" -j "$(nproc)"; } > "$LOGS/build.log" 2>&1 || { status=1; tail -40 "$LOGS/build.log"; }
      log "build: rc=$status in $(( $(date +%s) - start )) s"
      ;;
    test)
      # The 1000-communicator leak checks take minutes each: TEST_EXCLUDE= runs them too.
      # TEST_ONLY: a regular expression of the tests to run (ctest -R). CTEST_JOBS: tests at once.
      excl=${TEST_EXCLUDE-leaks}
      log "ctest -L gpu${excl:+ -E $excl}${TEST_ONLY:+ -R $TEST_ONLY}"
      timeout -k 10 ${TEST_LIMIT:-480} ctest --test-dir "$BUILD_DIR/tests/gpu" -L gpu -j ${CTEST_JOBS:-1} \
        ${excl:+-E "$excl"} ${TEST_ONLY:+-R "$TEST_ONLY"} --output-on-failure \
        > "$LOGS/ctest-gpu.log" 2>&1 || status=1
      tail -15 "$LOGS/ctest-gpu.log" | tee -a "$OUT/summary.txt"
      ;;
    unit)
      log "ctest -L 'unit|mp'"
      ctest --test-dir "$BUILD_DIR" -L 'unit|mp' --output-on-failure -j 8 > "$LOGS/ctest-unit.log" 2>&1 || status=1
      tail -5 "$LOGS/ctest-unit.log" | tee -a "$OUT/summary.txt"
      ;;
    sanitize)
      log "compute-sanitizer (reduced run)"
      # The errors suite is left out: it passes bad pointers on purpose, which the
      # sanitizer rightly reports as failed CUDA calls.
      { timeout -k 10 ${SANITIZE_LIMIT:-300} compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 1000 \
          "$BUILD_DIR/tests/gpu/gpu_coll" --mode threads --quick --suite coll &&
        timeout -k 10 ${SANITIZE_LIMIT:-300} compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 1000 \
          "$BUILD_DIR/tests/gpu/gpu_coll" --mode threads --quick --suite p2p; } > "$LOGS/sanitizer.log" 2>&1; rc=$?
      [ $rc -eq 0 ] || status=1
      tail -5 "$LOGS/sanitizer.log" | tee -a "$OUT/summary.txt"
      ;;
    topo)
      # Issue 5: what detection finds here, written to a file, and whether it is the
      # fixture of this machine (TOPO_EXPECT; the 2x H200 NV18 one by default).
      BRAID_TOPO_DUMP_FILE=$OUT/topo-detected.xml run topo 60 "$BUILD_DIR/tools/braid-info" --topo
      run topo_expect 60 "$BUILD_DIR/tools/braid-info" --topo \
        --expect "${TOPO_EXPECT:-tests/unit/fixtures/h200x2_nvswitch.xml}"
      cat "$LOGS/topo_expect.log" >> "$OUT/summary.txt"
      ;;
    smoke)
      # Every collective, every type and op, single process on 2 GPUs, checked.
      P=$BUILD_DIR/perf
      run smoke_allreduce 60 $P/all_reduce_perf -g 2 -b 8 -e 64M -f 4 -n 5 -w 2
      for c in all_reduce reduce_scatter reduce; do
        run sweep_$c 120 $P/${c}_perf -g 2 -b 4 -e 4M -f 33 -d all -o all -n 2 -w 1
      done
      for c in all_gather broadcast sendrecv alltoall gather scatter; do
        run sweep_$c 60 $P/${c}_perf -g 2 -b 4 -e 32M -f 9 -n 2 -w 1
      done
      ;;
    mpi)
      # The same binary under mpirun on Braid, then on the system NCCL (issue 4's command).
      P=$BUILD_DIR/perf
      run mpi_allreduce_braid 120 $MPIRUN $P/all_reduce_perf -b 8 -e 1G -f 2 -g 1
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run mpi_allreduce_nccl 120 $MPIRUN $P/all_reduce_perf -b 8 -e 1G -f 2 -g 1
      for l in braid nccl; do grep -E '^ +[0-9]+ +[0-9]+ |Avg|wrong' "$LOGS/mpi_allreduce_$l.log" |
        sed "s/^/$l: /" >> "$OUT/summary.txt"; done
      ;;
    cost)
      # Host time of each CUDA call the enqueue path makes.
      nvcc -O2 -arch=sm_90 -Iinclude -o /tmp/cuda-call-cost tools/cuda-call-cost.cu \
        -L"$BUILD_DIR/src" -lnccl -lcuda > "$LOGS/cost-build.log" 2>&1 || tail "$LOGS/cost-build.log"
      run cost 120 /tmp/cuda-call-cost && cat "$LOGS/cost.log" >> "$OUT/summary.txt"
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run cost_nccl 120 /tmp/cuda-call-cost &&
        grep nccl "$LOGS/cost_nccl.log" | sed 's/^/NCCL: /' >> "$OUT/summary.txt"
      ;;
    graph)
      # GPU time alone: the timed loop captured in a CUDA graph (-G), Braid then NCCL.
      P=$BUILD_DIR/perf; S="-b 8 -e 1M -f 4 -w 5 -n 20 -g 1 -G 20"
      run graph_ar 120 $MPIRUN $P/all_reduce_perf $S
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run graph_ar_nccl 120 $MPIRUN $P/all_reduce_perf $S
      ;;
    p2p)
      P=$BUILD_DIR/perf; S="-b 8 -e 128M -f 4 -w 5 -n 20 -g 1"
      for c in sendrecv alltoall; do
        run cal_${c} 120 $MPIRUN $P/${c}_perf $S
        LD_LIBRARY_PATH=$NCCL_LIB_DIR run cal_${c}_nccl 120 $MPIRUN $P/${c}_perf $S
      done
      ;;
    pair)
      # Two-rank all-reduce with Simple as the one-hop pair exchange (BRAID_P2P_PAIR_MAX)
      # against the ring, alternating, the model's choice otherwise.
      P=$BUILD_DIR/perf; S="-b 8 -e 512M -f 4 -w 5 -n 20 -g 1"
      for r in 1 2; do
        run pair_ring_$r 120 $MPIRUN $P/all_reduce_perf $S
        BRAID_P2P_PAIR_MAX=1073741824 run pair_on_$r 120 $MPIRUN $P/all_reduce_perf $S
      done
      ;;
    ce)
      # The copy-engine exchange (BRAID_CE_MIN_BYTES) against the kernels and NCCL, alternating,
      # for the collectives it runs, from 16 MB to 2 GB.
      P=$BUILD_DIR/perf; S="-b 16M -e 2G -f 4 -w 5 -n 20 -g 1"
      for c in all_reduce all_gather reduce_scatter; do
        for r in 1 2; do
          run ce_${c}_kernels_$r 200 $MPIRUN $P/${c}_perf $S
          BRAID_CE_MIN_BYTES=1 run ce_${c}_ce_$r 200 $MPIRUN $P/${c}_perf $S
          LD_LIBRARY_PATH=$NCCL_LIB_DIR run ce_${c}_nccl_$r 200 $MPIRUN $P/${c}_perf $S
        done
      done
      ;;
    testp2p)
      run ctest_p2p 300 ctest --test-dir "$BUILD_DIR/tests/gpu" -R 'p2p|inflight' --output-on-failure
      ;;
    calib)
      # Each protocol forced over the same sweep, the default choice, NCCL, and the host
      # time per call (-C 1), two processes: what the tuning table is calibrated from.
      P=$BUILD_DIR/perf; S="-b 8 -e 128M -f 4 -w 5 -n 20 -g 1"
      run cal_ar_default 120 $MPIRUN $P/all_reduce_perf $S
      BRAID_PROTO=LL run cal_ar_ll 120 $MPIRUN $P/all_reduce_perf -b 8 -e 8M -f 4 -w 5 -n 20 -g 1
      BRAID_PROTO=Simple run cal_ar_simple 120 $MPIRUN $P/all_reduce_perf $S
      run cal_ar_cpu 120 $MPIRUN $P/all_reduce_perf -b 8 -e 8K -f 4 -w 5 -n 50 -g 1 -C 1
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run cal_ar_nccl 120 $MPIRUN $P/all_reduce_perf $S
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run cal_ar_nccl_cpu 120 $MPIRUN $P/all_reduce_perf -b 8 -e 8K -f 4 -w 5 -n 50 -g 1 -C 1
      for c in all_gather reduce_scatter sendrecv alltoall broadcast; do
        run cal_${c} 120 $MPIRUN $P/${c}_perf $S
        LD_LIBRARY_PATH=$NCCL_LIB_DIR run cal_${c}_nccl 120 $MPIRUN $P/${c}_perf $S
      done
      ;;
    hosts)
      # The network path on one GPU or more (ranks posing as hosts, under MPS): its own script.
      OUT=$OUT/hosts BUILD_DIR=$BUILD_DIR bash tools/gpu-hosts.sh suite perf colls > "$LOGS/hosts.log" 2>&1 || status=1
      tail -40 "$LOGS/hosts.log" >> "$OUT/summary.txt"
      ;;
    perf)
      log "all_reduce_perf, Braid, 2 processes"
      $MPIRUN "$BUILD_DIR/perf/all_reduce_perf" -b 8 -e 1G -f 2 -g 1 > "$LOGS/all_reduce_braid.log" 2>&1 || status=1
      tail -30 "$LOGS/all_reduce_braid.log" | tee -a "$OUT/summary.txt"
      ;;
    compare)
      # Issue 6's bar: 2 processes, float32 sum, 8 B to 2 GiB by x4, each collective against
      # NCCL in the same run; then bf16 all-reduce. COMPARE_COLLECTIVES narrows the list.
      F="-b 8 -e 2G -f 4 -w 5 -n 20"
      C="python3 $BUILD_DIR/perf/compare --mpirun 2 --nccl-lib $NCCL_LIB_DIR --rounds ${COMPARE_ROUNDS:-2}"
      run compare ${COMPARE_LIMIT:-540} $C --plot "$OUT/compare.png" --markdown "$OUT/compare.md" \
        --collectives ${COMPARE_COLLECTIVES:-all_reduce,all_gather,reduce_scatter,broadcast,sendrecv,alltoall} -- $F
      tail -60 "$LOGS/compare.log" >> "$OUT/summary.txt"
      run compare_bf16 300 $C --plot "$OUT/compare_bf16.png" --markdown "$OUT/compare_bf16.md" \
        --collectives all_reduce -- $F -d bfloat16
      tail -20 "$LOGS/compare_bf16.log" >> "$OUT/summary.txt"
      ;;
    *) log "unknown step $step"; status=2 ;;
  esac
done
tar czf "$OUT/logs.tgz" -C "$LOGS" . && rm -rf "$LOGS"
exit $status
