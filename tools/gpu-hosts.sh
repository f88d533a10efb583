#!/usr/bin/env bash
# The network path on the GPU machine, on however many GPUs it has (one is enough): ranks
# pose as separate hosts (BRAID_HOSTID / NCCL_HOSTID, tools/as-host.sh), so Braid and NCCL
# both go kernel -> proxy -> TCP sockets -> proxy -> kernel. Two processes on one GPU
# time-slice it (each waits ~2 ms per turn), which hides the network entirely, so the
# CUDA MPS daemon is started for the run (a user-level server that lets both processes'
# kernels run at once; it changes no setting of the GPU) and stopped at the end.
#   bash tools/gpu-hosts.sh [suite|quick] [big] [api] [leaks] [deadpeer] [hang] [det] [perfdet] [tree] [direct] [proto] [mixed] [mixedcase] [ofiab] [lat] [torch] [perf] [perfwd] [sweep] [netprof] [netsweep] [chan] [colls] [ofi] [info]
# (default: perf). The intra-node path on one GPU: tools/sharegpu-round.sh.
# Logs under $OUT (device tool) or ./gpu-hosts-out. BUILD_DIR as in tools/gpu-check.sh;
# NP=4 runs four ranks (four hosts) instead of two.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/gpu-hosts-out}
BUILD_DIR=${BUILD_DIR:-build-gpu}
NCCL_LIB_DIR=${NCCL_LIB_DIR:-/usr/lib/x86_64-linux-gnu}
B=$BUILD_DIR
mkdir -p "$OUT/l"
. tools/device-build.sh "$BUILD_DIR"
export LD_LIBRARY_PATH=$PWD/$B/src
export CUDA_MPS_PIPE_DIRECTORY=/tmp/braid-mps CUDA_MPS_LOG_DIRECTORY=/tmp/braid-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
mps=0
if [ "${NO_MPS:-0}" != 1 ] && command -v nvidia-cuda-mps-control >/dev/null &&
   nvidia-cuda-mps-control -d; then mps=1; fi
echo "== MPS daemon: $mps" | tee -a "$OUT/summary.txt"
# Processes mpirun starts on its own host inherit its environment (BRAID_*, NCCL_*).
NP=${NP:-2}  # ranks (processes), each posing as its own host
M="mpirun --allow-run-as-root --bind-to none -np $NP"
status=0

# run NAME LIMIT CMD...: log in $OUT/l/NAME.log; rows and the verdict in the summary.
run() {
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$OUT/l/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc ($(( $(date +%s) - start )) s)" | tee -a "$OUT/summary.txt"
  grep -E '^ +[0-9]+ +[0-9]+ |cases|FAIL|Avg' "$OUT/l/$name.log" | head -40 | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || { status=1; tail -15 "$OUT/l/$name.log" | tee -a "$OUT/summary.txt"; }
}

S="-b 8 -e 1G -f 4 -w 3 -n 10 -g 1"
for step in ${*:-perf}; do
  case $step in
    quick) run suite_quick 300 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite all --quick --timeout 290 ;;
    suite) run suite 560 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite all --timeout 550 ;;
    perf)
      run ar_braid 200 $M tools/as-host.sh $B/perf/all_reduce_perf $S
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run ar_nccl 200 $M tools/as-host.sh $B/perf/all_reduce_perf $S
      ;;
    big)  # issue 8's size: 1 GiB all-reduce, Braid then NCCL
      run ar_braid_1g 120 $M tools/as-host.sh $B/perf/all_reduce_perf -b 1G -e 1G -w 3 -n 10 -g 1
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run ar_nccl_1g 120 $M tools/as-host.sh $B/perf/all_reduce_perf -b 1G -e 1G -w 3 -n 10 -g 1
      ;;
    perfwd)  # the ledger's cost: completion reports on (default) and off (BRAID_TIMEOUT=0)
      for i in 1 2; do
        run ar_braid_wd$i 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 8M -f 4 -w 20 -n 200 -g 1
        BRAID_TIMEOUT=0 run ar_braid_nowd$i 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 8M -f 4 -w 20 -n 200 -g 1
      done
      ;;
    sweep)  # streams and threads of the socket backend at large sizes
      for tn in "1 1" "2 2" "4 2" "4 4" "8 2"; do
        set -- $tn
        BRAID_SOCKET_NTHREADS=$1 BRAID_NSOCKS_PERTHREAD=$2 run ar_braid_t$1s$2 120 $M tools/as-host.sh \
          $B/perf/all_reduce_perf -b 64M -e 1G -f 4 -w 2 -n 5 -g 1
      done
      ;;
    netprof)  # where the CPU goes during 1 GiB all-reduces over sockets, per thread name
      lscpu | grep -E '^(Model name|CPU\(s\)|NUMA node)' | tee -a "$OUT/summary.txt"
      $M tools/as-host.sh $B/perf/all_reduce_perf -b 1G -e 1G -w 5 -n 60 -g 1 > "$OUT/l/netprof.log" 2>&1 &
      python3 tools/thread-cpu.py all_reduce_perf 2 60 > "$OUT/l/netprof_cpu.txt"
      wait $!
      grep -E '^ +[0-9]+ +[0-9]+ ' "$OUT/l/netprof.log" | tee -a "$OUT/summary.txt"
      head -60 "$OUT/l/netprof_cpu.txt" >> "$OUT/summary.txt"
      ;;
    netsweep)  # FIFO size, channels, helper threads and streams at large sizes (NETSWEEP: a list of
               # "NAME VAR=VALUE,VAR=VALUE" runs, default below)
      while read -r name vars; do
        [ -n "$name" ] || continue
        run ar_braid_$name 120 env ${vars//,/ } $M tools/as-host.sh $B/perf/all_reduce_perf -b 256M -e 1G -f 4 -w 2 -n 10 -g 1 < /dev/null
      done <<< "${NETSWEEP:-default A=1
buf1m BRAID_BUFFSIZE=1048576
buf2m BRAID_BUFFSIZE=2097152
buf8m BRAID_BUFFSIZE=8388608
c16 BRAID_MIN_NCHANNELS=16,BRAID_MAX_NCHANNELS=16
c16t1s2 BRAID_MIN_NCHANNELS=16,BRAID_MAX_NCHANNELS=16,BRAID_SOCKET_NTHREADS=1,BRAID_NSOCKS_PERTHREAD=2
t1s1 BRAID_SOCKET_NTHREADS=1,BRAID_NSOCKS_PERTHREAD=1
c16buf1m BRAID_MIN_NCHANNELS=16,BRAID_MAX_NCHANNELS=16,BRAID_BUFFSIZE=1048576}"
      ;;
    chan)  # channels x (ring | one-hop pair exchange) at middle and large sizes
      for c in 8 12 16; do
        for pm in 0 2147483648; do
          BRAID_MIN_NCHANNELS=$c BRAID_MAX_NCHANNELS=$c BRAID_NET_PAIR_MAX=$pm run ar_braid_c${c}_pair$pm 120 \
            $M tools/as-host.sh $B/perf/all_reduce_perf -b 8M -e 1G -f 4 -w 2 -n 5 -g 1
        done
      done
      ;;
    colls)  # the other collectives over the network, Braid then NCCL
      for c in all_gather reduce_scatter broadcast sendrecv alltoall; do
        run ${c}_braid 120 $M tools/as-host.sh $B/perf/${c}_perf -b 8 -e 512M -f 16 -w 2 -n 5 -g 1
        LD_LIBRARY_PATH=$NCCL_LIB_DIR run ${c}_nccl 120 $M tools/as-host.sh $B/perf/${c}_perf -b 8 -e 512M -f 16 -w 2 -n 5 -g 1
      done
      ;;
    mixed)  # two hosts of two GPUs each (P2P inside, the network between) over OFI (ctest's
            # gpu_net_mixed runs it over sockets); the two-host quick suite over OFI
      BRAID_NET=OFI run mixed_ofi 400 "$B/tests/gpu/gpu_coll" --mode hosts --nranks 4 \
        --ranks-per-host 2 --suite all --quick --timeout 390
      BRAID_NET=OFI run suite_quick_ofi 300 "$B/tests/gpu/gpu_coll" --mode hosts --nranks 2 --suite all --quick --timeout 290
      ;;
    mixedcase)  # the cases FILTER names (default: the split-share ones) on two hosts of two GPUs,
                # REPEAT times over OFI (NETS: the backends), the last run with the net and proxy log
      for net in ${NETS:-OFI}; do
        for i in $(seq ${REPEAT:-3}); do
          dbg=WARN; [ "$i" = "${REPEAT:-3}" ] && dbg=INFO
          BRAID_NET=$net BRAID_DEBUG=$dbg BRAID_DEBUG_SUBSYS=INIT,NET,PROXY,P2P run case_${net}_$i 200 \
            tools/stack-on-hang.sh ${CASE_LIMIT:-100} gpu_coll \
            "$B/tests/gpu/gpu_coll" --mode hosts --nranks 4 --ranks-per-host 2 --suite api \
            --filter "${FILTER:-Split share}" --timeout 190
        done
      done
      ;;
    ofiab)  # all-reduce over OFI with ofi_rxm's receive pool at 32 buffers an endpoint
            # (FI_OFI_RXM_MSG_RX_SIZE) and at libfabric's default (128), alternated
      for i in 1 2; do
        FI_OFI_RXM_MSG_RX_SIZE=32 BRAID_NET=ofi run ar_braid_ofi_rx32_$i 120 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 256M -f 4 -w 2 -n 5 -g 1
        FI_OFI_RXM_MSG_RX_SIZE=128 BRAID_NET=ofi run ar_braid_ofi_rx128_$i 120 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 256M -f 4 -w 2 -n 5 -g 1
      done
      ;;
    ofi) BRAID_NET=ofi run ar_braid_ofi 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 256M -f 4 -w 2 -n 5 -g 1 ;;
    api)  # split, shrink, revoke, nonblocking, graphs, registration: over the network, and
          # against NCCL with the very same binary
      run api_braid 280 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite api --timeout 270 --case-timeout ${CASE_TIMEOUT:-120} --verbose
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run api_nccl 280 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite api --timeout 270 --case-timeout ${CASE_TIMEOUT:-120} --verbose
      BRAID_CHECK=1 run api_check_braid 280 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite api --timeout 270 --case-timeout ${CASE_TIMEOUT:-120} --verbose
      ;;
    deadpeer)  # the last rank SIGKILLed mid-AllReduce: time to the survivors' error, abort time
      run deadpeer 120 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite deadpeer --timeout 110
      grep "^deadpeer" "$OUT/l/deadpeer.log" | tee -a "$OUT/summary.txt"
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run deadpeer_nccl 120 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite deadpeer --timeout 110
      grep "^deadpeer" "$OUT/l/deadpeer_nccl.log" | tee -a "$OUT/summary.txt"
      ;;
    hang)  # the last rank skips an AllReduce: SIGUSR1 report, then the BRAID_TIMEOUT verdict
      BRAID_DEBUG=WARN run hang 120 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite hang --timeout 110
      grep -E "^hang|WARN" "$OUT/l/hang.log" | head -12 | tee -a "$OUT/summary.txt"
      ;;
    leaks)  # 1000 communicators made and destroyed per rank: fds, threads, memory come back
      run leaks 580 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite leaks --timeout 570 --case-timeout 560
      grep "^leaks" "$OUT/l/leaks.log" | tee -a "$OUT/summary.txt"
      ;;
    torch)  # PyTorch on Braid (LD_PRELOAD) and on its own NCCL, compared
      TORCH_OUT=$OUT/l/torch run torch 900 bash tests/frameworks/run_torch.sh $B $NP
      grep -E "^  |^PyTorch|FAIL|== torchrun|^rank" "$OUT/l/torch.log" | head -30 | tee -a "$OUT/summary.txt"
      ;;
    det)  # BRAID_DETERMINISTIC=1: identical bits across settings, and the quick suite passes
      run det 400 sh tests/gpu/determinism_check.sh "$B/tests/gpu/gpu_coll" hosts $NP "$OUT/l/det"
      grep -E "^BRAID_DET|distinct|determinism OK|FAIL" "$OUT/l/det.log" | tee -a "$OUT/summary.txt"
      BRAID_DETERMINISTIC=1 run suite_quick_det 300 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite all --quick --timeout 290
      ;;
    tree)  # tree all-reduce: the quick suite forced onto trees; all-reduce as ring, tree, the model's choice, NCCL
      BRAID_ALGO=Tree run suite_quick_tree 300 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite all --quick --timeout 290
      for a in Ring Tree; do
        BRAID_ALGO=$a run ar_braid_$a 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 64M -f 4 -w 3 -n 20 -g 1
      done
      run ar_braid_model 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 64M -f 4 -w 3 -n 20 -g 1
      for a in Ring Tree; do
        NCCL_ALGO=$a LD_LIBRARY_PATH=$NCCL_LIB_DIR run ar_nccl_$a 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 64M -f 4 -w 3 -n 20 -g 1
      done
      ;;
    direct)  # direct all-reduce: the quick suite forced onto it; all-reduce as direct, tree, ring, the model's choice, NCCL
      BRAID_ALGO=Direct run suite_quick_direct 300 "$B/tests/gpu/gpu_coll" --mode hosts --nranks $NP --suite all --quick --timeout 290
      for a in Direct Tree Ring; do
        BRAID_ALGO=$a run ar_braid_$a 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 16M -f 4 -w 20 -n 100 -g 1
      done
      run ar_braid_model 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 16M -f 4 -w 20 -n 100 -g 1
      LD_LIBRARY_PATH=$NCCL_LIB_DIR run ar_nccl 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 16M -f 4 -w 20 -n 100 -g 1
      ;;
    proto)  # all-reduce with each protocol forced (the model picks the algorithm), then the model's own choice
      for pr in LL LL128 Simple; do
        NCCL_PROTO=$pr run ar_braid_$pr 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 64M -f 4 -w 20 -n 100 -g 1
      done
      run ar_braid_model 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 64M -f 4 -w 20 -n 100 -g 1
      ;;
    perfdet)  # what BRAID_DETERMINISTIC=1 costs: all-reduce with the mode off, then on
      run ar_braid_det0 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 256M -f 4 -w 3 -n 10 -g 1
      BRAID_DETERMINISTIC=1 run ar_braid_det1 200 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 256M -f 4 -w 3 -n 10 -g 1
      ;;
    lat)  # small all-reduces (one hop, or a few): Braid, AB_LIB_DIR (another Braid build) and NCCL, alternated
      for i in 1 2; do
        run ar_lat_braid$i 120 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 128K -f 4 -w 50 -n 500 -g 1
        [ -n "${AB_LIB_DIR:-}" ] && LD_LIBRARY_PATH=$AB_LIB_DIR run ar_lat_ab$i 120 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 128K -f 4 -w 50 -n 500 -g 1
        LD_LIBRARY_PATH=$NCCL_LIB_DIR run ar_lat_nccl$i 120 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 128K -f 4 -w 50 -n 500 -g 1
      done
      ;;
    info) BRAID_DEBUG=INFO run ar_braid_info 60 $M tools/as-host.sh $B/perf/all_reduce_perf -b 8 -e 8M -f 4 -w 1 -n 2 -g 1 ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
[ $mps = 1 ] && echo quit | nvidia-cuda-mps-control
# The device tool brings back at most 8 files: the logs travel as one archive.
tar czf "$OUT/logs.tgz" -C "$OUT/l" . && rm -rf "$OUT/l"
exit $status
