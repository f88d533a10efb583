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
# NP: processes (GPUs) for the perf steps and the suites step (2 here; 4 or 8 on the larger kinds).
NP=${NP:-2}
# MPI_BIND: how mpirun binds the ranks (perf/compare leaves mpirun's default: one core a rank).
MPI_BIND=${MPI_BIND:---bind-to none}
MPIRUN="mpirun --allow-run-as-root $MPI_BIND -np $NP -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x BRAID_DEBUG -x BRAID_DEBUG_SUBSYS -x BRAID_ALGO -x BRAID_PROTO -x BRAID_P2P_PAIR_MAX -x BRAID_CE_MIN_BYTES -x BRAID_BUFFSIZE -x BRAID_P2P_BUFFSIZE -x BRAID_NTHREADS -x BRAID_MAX_NCHANNELS -x BRAID_CHUNKSIZE -x BRAID_P2P_LL_MAX -x BRAID_P2P_CHANNEL_BYTES -x BRAID_SIMPLE_POST_WARP"

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

# rows PREFIX COLUMNS: for each log $LOGS/PREFIX*.log a summary line of its result rows'
# COLUMNS (an awk expression per row, e.g. '$6' the out-of-place time), then any row with
# wrong values.
rows() {
  local f
  for f in "$LOGS"/$1*.log; do
    [ -f "$f" ] || continue
    printf '%-28s' "$(basename "$f" .log)"
    grep -E '^ +[0-9]+ +[0-9]+ ' "$f" | awk "{printf \" %s\", $2} END {print \"\"}"
    grep -E '^ +[0-9]+ +[0-9]+ ' "$f" |
      awk '($9 != 0 && $9 != "N/A") || ($13 != 0 && $13 != "N/A") {print "WRONG: " $0}'
  done >> "$OUT/summary.txt"
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
      # BUILD_TARGETS: only these (the library, perf tools, gpu_coll, braid-info, say).
      { cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
        cmake --build "$BUILD_DIR" -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}; } \
        > "$LOGS/build.log" 2>&1 || { status=1; tail -40 "$LOGS/build.log"; }
      log "build: rc=$status in $(( $(date +%s) - start )) s"
      ;;
    test)
      # The 1000-communicator leak checks take minutes each: TEST_EXCLUDE= runs them too.
      # TEST_ONLY: a regular expression of the tests to run (ctest -R). CTEST_JOBS: tests at once.
      # The forced algorithm/protocol matrix (label forced) has its own step below; TEST_FORCED=1
      # takes it in here too (one ctest for all, more tests at once).
      excl=${TEST_EXCLUDE-leaks}
      lexcl=forced; [ "${TEST_FORCED:-0}" = 1 ] && lexcl=
      log "ctest -L gpu${lexcl:+ -LE $lexcl}${excl:+ -E $excl}${TEST_ONLY:+ -R $TEST_ONLY}"
      timeout -k 10 ${TEST_LIMIT:-480} ctest --test-dir "$BUILD_DIR/tests/gpu" -L gpu ${lexcl:+-LE $lexcl} \
        -j ${CTEST_JOBS:-1} ${excl:+-E "$excl"} ${TEST_ONLY:+-R "$TEST_ONLY"} --output-on-failure \
        > "$LOGS/ctest-gpu.log" 2>&1 || status=1
      tail -15 "$LOGS/ctest-gpu.log" | tee -a "$OUT/summary.txt"
      ;;
    suites)
      # The whole suite on NP GPUs: one process per GPU, then one thread per GPU.
      for m in ${SUITE_MODES:-procs threads}; do
        run suite_${m}_$NP ${SUITE_LIMIT:-300} "$BUILD_DIR/tests/gpu/gpu_coll" --mode $m --nranks $NP \
          --suite ${SUITE:-all} --timeout $(( ${SUITE_LIMIT:-300} - 20 ))
        grep -E "cases|^FAIL" "$LOGS/suite_${m}_$NP.log" | head -20 >> "$OUT/summary.txt"
      done
      ;;
    forced)
      # Every algorithm x protocol forced in turn, the whole suite each (tests/gpu/CMakeLists.txt).
      log "ctest -L forced${TEST_ONLY:+ -R $TEST_ONLY}"
      timeout -k 10 ${FORCED_LIMIT:-480} ctest --test-dir "$BUILD_DIR/tests/gpu" -L forced \
        -j ${CTEST_JOBS:-4} ${TEST_ONLY:+-R "$TEST_ONLY"} --output-on-failure \
        > "$LOGS/ctest-forced.log" 2>&1 || status=1
      grep -E "Test +#|ran with|FAIL" "$LOGS/ctest-forced.log" | head -60 >> "$OUT/summary.txt"
      tail -6 "$LOGS/ctest-forced.log" | tee -a "$OUT/summary.txt"
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
      rows pair_ '$6'
      ;;
    ce)
      # The copy-engine exchange (BRAID_CE_MIN_BYTES=1: at every size) against the kernels
      # (BRAID_CE_MIN_BYTES=-1; by default it takes the large sizes) and NCCL, alternating,
      # for the collectives it runs (CE_COLLECTIVES), 32 MB to 2 GB, CE_ROUNDS rounds.
      P=$BUILD_DIR/perf; S="-b 32M -e 2G -f 4 -w 5 -n 20 -g 1"
      for c in ${CE_COLLECTIVES:-all_reduce all_gather reduce_scatter broadcast sendrecv alltoall}; do
        for r in $(seq 1 "${CE_ROUNDS:-2}"); do
          BRAID_CE_MIN_BYTES=-1 run ce_${c}_kernels_$r 200 $MPIRUN $P/${c}_perf $S
          BRAID_CE_MIN_BYTES=1 run ce_${c}_ce_$r 200 $MPIRUN $P/${c}_perf $S
          LD_LIBRARY_PATH=$NCCL_LIB_DIR run ce_${c}_nccl_$r 200 $MPIRUN $P/${c}_perf $S
        done
      done
      for f in "$LOGS"/ce_*.log; do
        echo "-- $(basename "$f" .log)"; grep -E '^ +[0-9]+ +[0-9]+ |wrong' "$f"
      done >> "$OUT/summary.txt"
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
    small)
      # Small sizes, 200 timed calls: reduce-scatter against all-gather (the same ring steps)
      # and NCCL; host time per call (-C 1); GPU time alone (-G); each protocol forced; and
      # the tuning model's choice for a few sizes (BRAID_DEBUG_SUBSYS=TUNING).
      P=$BUILD_DIR/perf; S="-b 8 -e 2M -f 4 -w 20 -n 200 -g 1"
      for c in reduce_scatter all_gather all_reduce; do
        run small_${c} 120 $MPIRUN $P/${c}_perf $S
        LD_LIBRARY_PATH=$NCCL_LIB_DIR run small_${c}_nccl 120 $MPIRUN $P/${c}_perf $S
      done
      run small_rs_cpu 120 $MPIRUN $P/reduce_scatter_perf $S -C 1
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run small_rs_cpu_nccl 120 $MPIRUN $P/reduce_scatter_perf $S -C 1
      run small_rs_graph 120 $MPIRUN $P/reduce_scatter_perf -b 8 -e 2M -f 4 -w 5 -n 20 -g 1 -G 20
      run small_ag_graph 120 $MPIRUN $P/all_gather_perf -b 8 -e 2M -f 4 -w 5 -n 20 -g 1 -G 20
      BRAID_PROTO=LL run small_rs_ll 120 $MPIRUN $P/reduce_scatter_perf $S
      BRAID_PROTO=Simple run small_rs_simple 120 $MPIRUN $P/reduce_scatter_perf $S
      BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=TUNING run small_rs_tuning 60 $MPIRUN $P/reduce_scatter_perf \
        -b 32 -e 128K -f 64 -w 1 -n 2 -g 1
      for f in "$LOGS"/small_*.log; do
        echo "-- $(basename "$f" .log)"; grep -E '^ +[0-9]+ +[0-9]+ |TUNING|Tuning|tuning' "$f" | head -30
      done >> "$OUT/summary.txt"
      ;;
    ddp)
      # Issue 7: PyTorch DDP on Braid and on NCCL, alternating DDP_RUNS times (each
      # run_torch.sh runs both), with the step time without the all-reduce (DDP no_sync); then
      # Braid variants (DDP_VARIANTS: lines "NAME VAR=VALUE,VAR=VALUE"), NCCL again beside each.
      T="--steps ${DDP_STEPS:-150} --compute-steps 30 ${DDP_ARGS:-}"
      for v in $(seq 1 "${DDP_RUNS:-2}"); do
        TORCH_ARGS="$T" TORCH_OUT=$LOGS/ddp_$v run ddp_$v 300 bash tests/frameworks/run_torch.sh "$BUILD_DIR" 2
      done
      while read -r name vars; do
        [ -n "$name" ] || continue
        TORCH_BRAID_ONLY=${DDP_VARIANTS_ALONE:-0} TORCH_ARGS="$T" TORCH_OUT=$LOGS/ddp_$name run ddp_$name 300 env ${vars//,/ } \
          bash tests/frameworks/run_torch.sh "$BUILD_DIR" 2 < /dev/null
      done <<< "${DDP_VARIANTS-ce BRAID_CE_MIN_BYTES=1048576
ch16 BRAID_MAX_NCHANNELS=16
ch8 BRAID_MAX_NCHANNELS=8}"
      for f in "$LOGS"/ddp_*.log; do
        echo "-- $(basename "$f" .log)"; grep -E '^rank [0-9]|step time|loss at' "$f"
      done >> "$OUT/summary.txt"
      for f in "$LOGS"/ddp_*/*/profile_rank0.txt; do  # DDP_ARGS=--profile-steps N
        [ -f "$f" ] && { echo "-- $f"; cat "$f"; }
      done >> "$OUT/summary.txt"
      ;;
    chunk)
      # Ring chunk sizes (BRAID_CHUNKSIZE) and channels against the default and NCCL, all-reduce
      # 1 MB - 2 GB, two rounds alternated.
      P=$BUILD_DIR/perf; S="-b 1M -e 2G -f 4 -w 3 -n 10 -g 1"
      for r in 1 2; do
        LD_LIBRARY_PATH=$NCCL_LIB_DIR run chunk_0nccl_$r 120 $MPIRUN $P/all_reduce_perf $S
        run chunk_default_$r 120 $MPIRUN $P/all_reduce_perf $S
        for k in 64 128 256; do
          BRAID_CHUNKSIZE=$((k << 10)) run chunk_${k}k_$r 120 $MPIRUN $P/all_reduce_perf $S
        done
        BRAID_MAX_NCHANNELS=24 run chunk_ch24_$r 120 $MPIRUN $P/all_reduce_perf $S
      done
      rows chunk_ '$6'
      ;;
    perchan)
      # What one channel (CTA) moves: all-reduce and broadcast at 512 MB / 2 GB with 16, 24 and
      # 32 channels forced, Braid and NCCL alike (NCCL_MIN/MAX_NCHANNELS, Braid's aliases too).
      P=$BUILD_DIR/perf; S="-b 512M -e 2G -f 4 -w 3 -n 10 -g 1"
      M="$MPIRUN -x NCCL_MIN_NCHANNELS -x NCCL_MAX_NCHANNELS"
      for c in all_reduce broadcast; do
        for n in 16 24 32; do
          NCCL_MIN_NCHANNELS=$n NCCL_MAX_NCHANNELS=$n LD_LIBRARY_PATH=$NCCL_LIB_DIR run perchan_${c}_nccl_$n 120 $M $P/${c}_perf $S
          NCCL_MIN_NCHANNELS=$n NCCL_MAX_NCHANNELS=$n run perchan_${c}_braid_$n 120 $M $P/${c}_perf $S
        done
      done
      rows perchan_ '$1 ": " $8 "/" $12'
      ;;
    postwarp)
      # BRAID_SIMPLE_POST_WARP (a warp of its own posts each Simple step; not in the tree yet:
      # build with perf/patches/simple-post-warp.patch applied) against the default, alternated,
      # 2 MB - 2 GB for each collective (24 channels too for all-reduce), with the perf tools'
      # data checks; small all-reduces.
      P=$BUILD_DIR/perf; S="-b 2M -e 2G -f 4 -w 3 -n 10 -g 1"
      M="$MPIRUN -x BRAID_SIMPLE_POST_WARP -x NCCL_MIN_NCHANNELS -x NCCL_MAX_NCHANNELS"
      for c in all_reduce broadcast sendrecv all_gather reduce_scatter alltoall; do
        for h in 0 1; do BRAID_SIMPLE_POST_WARP=$h run pw_${c}_$h 120 $M $P/${c}_perf $S; done
      done
      for h in 0 1; do
        NCCL_MIN_NCHANNELS=24 NCCL_MAX_NCHANNELS=24 BRAID_SIMPLE_POST_WARP=$h run pw_ar24_$h 120 $M $P/all_reduce_perf -b 512M -e 2G -f 4 -w 3 -n 10 -g 1
        BRAID_SIMPLE_POST_WARP=$h run pw_small_$h 120 $M $P/all_reduce_perf -b 8 -e 1M -f 8 -w 20 -n 200 -g 1
      done
      rows pw_ '$1 ": " $6 "/" $10'
      ;;
    pwab)
      # The post warp again, alternated PWAB_ROUNDS times: send/recv and all-to-all with it on
      # P2P send/receive connections (2) or off (0), all-reduce with it everywhere (1) or off.
      P=$BUILD_DIR/perf; S="-b 2M -e 2G -f 4 -w 3 -n 10 -g 1"
      for i in $(seq ${PWAB_ROUNDS:-2}); do
        for c in sendrecv alltoall all_reduce; do
          for h in 0 $([ $c = all_reduce ] && echo 1 || echo 2); do
            BRAID_SIMPLE_POST_WARP=$h run pwab_${c}_${h}_$i 120 $MPIRUN $P/${c}_perf $S
          done
        done
      done
      rows pwab_ '$1 ": " $6 "/" $10'
      ;;
    p2pwhy)
      # Which protocol send/recv takes at 8 KB - 1 MB (the tuner's INFO lines), and its time
      # with the defaults, with BRAID_P2P_LL_MAX and BRAID_SIMPLE_POST_WARP set, at the perf
      # tools' short and long iteration counts.
      P=$BUILD_DIR/perf
      BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=TUNING run p2pwhy_info 60 $MPIRUN $P/sendrecv_perf -b 8K -e 1M -f 4 -w 1 -n 1
      grep -E "rank 0 .*SendRecv" "$LOGS/p2pwhy_info.log" | sed 's/.*TUNING //; s/ predicted.*//' | sort -u >> "$OUT/summary.txt"
      for r in 1 2; do
        for it in "-w 5 -n 20" "-w 20 -n 200"; do
          for v in "d A=1" "ll16k BRAID_P2P_LL_MAX=16384" "pw0 BRAID_SIMPLE_POST_WARP=0"; do
            set -- $v
            (export "$2"; run "p2pwhy_n${it##* }_${1}_$r" 60 $MPIRUN $P/sendrecv_perf -b 8K -e 1M -f 4 $it -g 1)
          done
          LD_LIBRARY_PATH=$NCCL_LIB_DIR run "p2pwhy_n${it##* }_nccl_$r" 60 $MPIRUN $P/sendrecv_perf -b 8K -e 1M -f 4 $it -g 1
        done
      done
      rows p2pwhy_ '$6'
      ;;
    p2pll)
      # Send/recv and all-to-all 4 KB - 1 MB: LL allowed up to BRAID_P2P_LL_MAX (one channel per
      # 16 KB), left to the model and forced, against the default and NCCL, alternated twice.
      P=$BUILD_DIR/perf; S="-b 4K -e 1M -f 2 -w 20 -n 200 -g 1"
      for i in 1 2; do
        for c in sendrecv alltoall; do
          LD_LIBRARY_PATH=$NCCL_LIB_DIR run p2pll_${c}_${i}_nccl 120 $MPIRUN $P/${c}_perf $S
          run p2pll_${c}_${i}_default 120 $MPIRUN $P/${c}_perf $S
          for m in 65536 262144 1048576; do
            BRAID_P2P_LL_MAX=$m run p2pll_${c}_${i}_model$m 120 $MPIRUN $P/${c}_perf $S
            BRAID_P2P_LL_MAX=$m BRAID_PROTO=LL run p2pll_${c}_${i}_ll$m 120 $MPIRUN $P/${c}_perf $S
          done
        done
      done
      rows p2pll_ '$6'
      ;;
    ncclchoice)
      # What NCCL's tuner picks for the all-reduce sizes of the DDP model's buckets.
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING LD_LIBRARY_PATH=$NCCL_LIB_DIR run ncclchoice 120 \
        mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS \
        $BUILD_DIR/perf/all_reduce_perf -b 16M -e 64M -f 2 -w 1 -n 2 -g 1
      grep -iE 'algo|proto|channel|^ +[0-9]+ +[0-9]+ ' "$LOGS/ncclchoice.log" | grep -v '^$' | sort | uniq -c | head -40 >> "$OUT/summary.txt"
      ;;
    p2pbuf)
      # Send/recv and all-to-all from 1 MB to 2 GB with each P2P buffer size, and NCCL.
      P=$BUILD_DIR/perf; S="-b 1M -e 2G -f 4 -w 3 -n 10 -g 1"
      for c in sendrecv alltoall; do
        LD_LIBRARY_PATH=$NCCL_LIB_DIR run p2pbuf_${c}_0nccl 120 $MPIRUN $P/${c}_perf $S
        for b in 1 2 4 8; do
          BRAID_P2P_BUFFSIZE=$((b << 20)) run p2pbuf_${c}_${b}m 120 $MPIRUN $P/${c}_perf $S
        done
      done
      rows p2pbuf_ '$6'
      ;;
    launch)
      # NCCL's Hopper launch attributes (dev_state.c): NCCL with its own defaults and with
      # clusters off; Braid with the remote sync domain (default) and without, clusters of 2 and
      # 4 blocks (NCCL_CGA_CLUSTER_SIZE sets both libraries' cgaClusterSize), NVLink-centric
      # scheduling; all-reduce, broadcast and send/recv 64 MB - 2 GB, LAUNCH_ROUNDS alternated;
      # small all-reduces with and without clusters.
      P=$BUILD_DIR/perf; S="-b 64M -e 2G -f 4 -w 3 -n 10 -g 1"
      M="$MPIRUN -x NCCL_CGA_CLUSTER_SIZE -x BRAID_MEM_SYNC_DOMAIN -x NCCL_MEM_SYNC_DOMAIN -x NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE -x NCCL_MIN_NCHANNELS -x NCCL_MAX_NCHANNELS"
      for r in $(seq 1 "${LAUNCH_ROUNDS:-2}"); do
        for c in ${LAUNCH_COLLS:-all_reduce broadcast sendrecv}; do
          LD_LIBRARY_PATH=$NCCL_LIB_DIR run la_${c}_0nccl_$r 120 $M $P/${c}_perf $S
          NCCL_CGA_CLUSTER_SIZE=0 LD_LIBRARY_PATH=$NCCL_LIB_DIR run la_${c}_0nccl_cga0_$r 120 $M $P/${c}_perf $S
          run la_${c}_default_$r 120 $M $P/${c}_perf $S
          BRAID_MEM_SYNC_DOMAIN=0 run la_${c}_dom0_$r 120 $M $P/${c}_perf $S
          NCCL_CGA_CLUSTER_SIZE=2 run la_${c}_cga2_$r 120 $M $P/${c}_perf $S
          NCCL_CGA_CLUSTER_SIZE=4 run la_${c}_cga4_$r 120 $M $P/${c}_perf $S
          NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE=1 run la_${c}_nucs_$r 120 $M $P/${c}_perf $S
        done
      done
      for v in 0 4; do
        NCCL_CGA_CLUSTER_SIZE=$v run la_small_cga${v} 120 $M $P/all_reduce_perf -b 8 -e 1M -f 8 -w 20 -n 200 -g 1
        NCCL_CGA_CLUSTER_SIZE=$v LD_LIBRARY_PATH=$NCCL_LIB_DIR run la_small_0nccl_cga${v} 120 $M $P/all_reduce_perf -b 8 -e 1M -f 8 -w 20 -n 200 -g 1
      done
      BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=INIT NCCL_CGA_CLUSTER_SIZE=4 run la_info 60 $M -x BRAID_DEBUG -x BRAID_DEBUG_SUBSYS \
        $P/all_reduce_perf -b 8 -e 8 -w 1 -n 1 -g 1
      grep -h 'launched with' "$LOGS/la_info.log" | head -2 >> "$OUT/summary.txt"
      rows la_ '$1 ": " $6 "/" $10'
      ;;
    pairchunk)
      # Two ranks: the pair exchange (pair.h) of all-reduce and all-gather against the ring
      # (BRAID_P2P_PAIR_MIN=-1) and NCCL, 2 MB - 2 GB, with fixed chunks of 128, 256 and 512 KB
      # and with the default rule (tune_table.pair_chunks), PAIRX_ROUNDS alternated.
      P=$BUILD_DIR/perf; S="${PAIRX_SIZES:--b 2M -e 2G -f 4} -w 3 -n 20 -g 1"
      M="$MPIRUN -x BRAID_P2P_PAIR_MIN"
      export BRAID_CE_MIN_BYTES=-1 # the kernels at every size (the copy engines take 512 MB+)
      for r in $(seq 1 "${PAIRX_ROUNDS:-2}"); do
        for c in ${PAIRX_COLLS:-all_reduce all_gather}; do
          LD_LIBRARY_PATH=$NCCL_LIB_DIR run pc_${c}_0nccl_$r 120 $M $P/${c}_perf $S
          BRAID_P2P_PAIR_MIN=-1 run pc_${c}_1ring_$r 120 $M $P/${c}_perf $S
          for k in 131072 262144 524288; do
            BRAID_P2P_PAIR_MIN=0 BRAID_CHUNKSIZE=$k run pc_${c}_pair$((k / 1024))k_$r 120 $M $P/${c}_perf $S
          done
          BRAID_P2P_PAIR_MIN=0 run pc_${c}_pairauto_$r 120 $M $P/${c}_perf $S
        done
      done
      unset BRAID_CE_MIN_BYTES
      rows pc_ '$1 ": " $6 "/" $10'
      ;;
    bw)
      # Large sizes (512 MB, 2 GB): the receive buffers (BRAID_BUFFSIZE for the rings,
      # BRAID_P2P_BUFFSIZE for send/recv), threads per CTA and channels, one at a time.
      P=$BUILD_DIR/perf; S="-b 512M -e 2G -f 4 -w 3 -n 10 -g 1"
      for c in sendrecv broadcast all_reduce all_gather reduce_scatter alltoall; do
        LD_LIBRARY_PATH=$NCCL_LIB_DIR run bw_${c}_0nccl 120 $MPIRUN $P/${c}_perf $S
        run bw_${c}_default 120 $MPIRUN $P/${c}_perf $S
        BRAID_NTHREADS=1024 run bw_${c}_t1024 120 $MPIRUN $P/${c}_perf $S
        BRAID_MAX_NCHANNELS=16 run bw_${c}_ch16 120 $MPIRUN $P/${c}_perf $S
        case $c in
          sendrecv|alltoall)
            BRAID_P2P_BUFFSIZE=4194304 run bw_${c}_p2p4m 120 $MPIRUN $P/${c}_perf $S
            BRAID_P2P_BUFFSIZE=16777216 run bw_${c}_p2p16m 120 $MPIRUN $P/${c}_perf $S ;;
          *)
            BRAID_BUFFSIZE=16777216 run bw_${c}_buf16m 120 $MPIRUN $P/${c}_perf $S
            BRAID_BUFFSIZE=1048576 run bw_${c}_buf1m 120 $MPIRUN $P/${c}_perf $S ;;
        esac
      done
      rows bw_ '$1 ": " $8 "/" $12'
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
      # Issue 6's bar: 2 processes (NP), float32 sum, 8 B to 2 GiB by x4, each collective against
      # NCCL in the same run; then bf16 all-reduce (COMPARE_BF16=0: not). COMPARE_COLLECTIVES
      # narrows the list.
      F="-b 8 -e 2G -f 4 -w 5 -n 20"
      C="python3 $BUILD_DIR/perf/compare --mpirun $NP --nccl-lib $NCCL_LIB_DIR --rounds ${COMPARE_ROUNDS:-2}"
      run compare ${COMPARE_LIMIT:-540} $C --plot "$OUT/compare.png" --markdown "$OUT/compare.md" \
        --collectives ${COMPARE_COLLECTIVES:-all_reduce,all_gather,reduce_scatter,broadcast,sendrecv,alltoall} -- $F
      tail -60 "$LOGS/compare.log" >> "$OUT/summary.txt"
      [ "${COMPARE_BF16:-1}" = 1 ] || continue
      run compare_bf16 300 $C --plot "$OUT/compare_bf16.png" --markdown "$OUT/compare_bf16.md" \
        --collectives all_reduce -- $F -d bfloat16
      tail -20 "$LOGS/compare_bf16.log" >> "$OUT/summary.txt"
      ;;
    hostprof)
      # The host-profile test build (tools/hostprof-stage.sh packs it into .device/prof.tar.xz):
      # HOSTPROF_COLLS at HOSTPROF_SIZE bytes, 5000 calls; each rank's stage averages (stage 3,
      # the group's close, also holds the communicator's init: its average is no call's).
      mkdir -p .device/prof && tar -C .device/prof -xJf .device/prof.tar.xz ||
        { log "hostprof: no .device/prof.tar.xz"; status=1; continue; }
      for c in ${HOSTPROF_COLLS:-all_reduce sendrecv}; do
        LD_LIBRARY_PATH=$PWD/.device/prof run hostprof_$c 120 $MPIRUN $BUILD_DIR/perf/${c}_perf \
          -b ${HOSTPROF_SIZE:-8} -e ${HOSTPROF_SIZE:-8} -w 100 -n 5000 -g 1
        grep -E '^ +[0-9]+ +[0-9]+ |HOSTPROF' "$LOGS/hostprof_$c.log" >> "$OUT/summary.txt"
      done
      ;;
    sweep)
      # Settings side by side: SWEEP_FILE holds one run a line, "NAME|COLL|PERF FLAGS|VAR=V ..."
      # (a NAME starting with nccl runs NCCL's library, one starting with old_ the library in
      # SWEEP_OLD_LIB, an earlier build's), all of them SWEEP_ROUNDS times,
      # rounds alternated; the summary has each log's out-of-place time/busbw, in place after.
      # SWEEP_OLD_TAR: a library packed like .device/packed.tar.xz, unpacked as SWEEP_OLD_LIB.
      if [ -n "${SWEEP_OLD_TAR:-}" ]; then
        mkdir -p .device/old && tar -C .device/old -xJf "$SWEEP_OLD_TAR" &&
          SWEEP_OLD_LIB=$PWD/.device/old/src || { log "sweep: cannot unpack $SWEEP_OLD_TAR"; status=1; }
      fi
      for r in $(seq 1 "${SWEEP_ROUNDS:-2}"); do
        while IFS='|' read -r name coll flags vars; do
          case $name in ''|\#*) continue ;; esac
          xs=""; for v in $vars; do xs="$xs -x ${v%%=*}"; done
          lib=$LD_LIBRARY_PATH
          case $name in nccl*) lib=$NCCL_LIB_DIR ;; old_*) lib=${SWEEP_OLD_LIB:?old_ runs need it} ;; esac
          env $vars LD_LIBRARY_PATH=$lib timeout -k 5 ${SWEEP_LIMIT:-120} $MPIRUN $xs \
            $BUILD_DIR/perf/${coll}_perf $flags -g 1 < /dev/null > "$LOGS/sw_${name}_$r.log" 2>&1 ||
            log "sweep $name round $r: rc=$?"
        done < "${SWEEP_FILE:?SWEEP_FILE names the runs}"
      done
      rows sw_ '$1 ": " $6 "/" $8 " " $10 "/" $12'
      ;;
    bind)
      # Small calls against where each rank's CPU sits relative to its GPU (tools/bind-gpu.sh):
      # BIND_MODES of core (mpirun's default binding, what perf/compare gets), none, near, near1,
      # far, far1; Braid and NCCL alternated, BIND_ROUNDS times. Then tools/launch-cost.cu pinned
      # to one CPU near GPU 0 and one far from it, when .device/launch-cost is there.
      grep -H . /sys/bus/pci/devices/*/local_cpulist 2>/dev/null | grep -i "$(nvidia-smi --query-gpu=pci.bus_id \
        --format=csv,noheader | sed 's/^0000//' | tr 'A-F\n' 'a-f|' | sed 's/|$//')" >> "$OUT/summary.txt"
      lscpu | grep -E "^(NUMA|Socket|Model name)" >> "$OUT/summary.txt"
      for r in $(seq 1 "${BIND_ROUNDS:-2}"); do
        for m in ${BIND_MODES:-core near1 far1 none}; do
          for lib in braid nccl; do
            l=$LD_LIBRARY_PATH; [ $lib = nccl ] && l=$NCCL_LIB_DIR
            case $m in
              core|none) b="--bind-to $m"; w="" ;;
              *) b="--bind-to none"; w="tools/bind-gpu.sh $m" ;;
            esac
            LD_LIBRARY_PATH=$l timeout -k 5 120 ${MPIRUN/$MPI_BIND/$b} $w \
              $BUILD_DIR/perf/${BIND_COLL:-all_reduce}_perf ${BIND_FLAGS:--b 8 -e 32 -f 4 -w 200 -n 2000} \
              -g 1 < /dev/null > "$LOGS/bd_${m}_${lib}_$r.log" 2>&1 || log "bind $m $lib round $r: rc=$?"
          done
        done
      done
      rows bd_ '$1 ": " $6 "/" $10'
      if [ -x .device/launch-cost ]; then
        bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0 | sed 's/^0000//' | tr 'A-F' 'a-f')
        near=$(cut -d, -f1 "/sys/bus/pci/devices/$bus/local_cpulist" | cut -d- -f1)
        far=$(( ($(nproc) - 1 + near) % $(nproc) ))  # the last CPU when GPU 0 sits by CPU 0
        for c in $near $far $near $far; do
          echo "launch-cost GPU 0 on CPU $c:" >> "$OUT/summary.txt"
          timeout 120 taskset -c $c .device/launch-cost 0 2>&1 | head -${LAUNCH_LINES:-3} >> "$OUT/summary.txt"
        done
      fi
      ;;
    *) log "unknown step $step"; status=2 ;;
  esac
done
tar czf "$OUT/logs.tgz" -C "$LOGS" . && rm -rf "$LOGS"
exit $status
