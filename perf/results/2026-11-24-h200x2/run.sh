#!/usr/bin/env bash
# What produced the logs beside it (device tool, kind nvidia-h200-x2, from the repository root;
# logs under $OUT): build on the machine, then all_reduce_perf with Braid and NCCL 2.28 from the
# system, default choice, then LL128 and LL forced. One call, 2026-11-24.
set -u
export NCCL_NVLS_ENABLE=0
nvidia-smi -L > $OUT/gpus.txt 2>&1; nvidia-smi topo -m >> $OUT/gpus.txt 2>&1
start=$(date +%s)
cmake -S . -B .device/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null &&
  cmake --build .device/b -j 32 --target nccl all_reduce_perf > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"
P=.device/b/perf/all_reduce_perf
S="-b 8 -e 1G -f 4 -w 5 -n 20 -g 1"
B=$PWD/.device/b/src; N=/usr/lib/x86_64-linux-gnu
one() {  # name lib proto
  env LD_LIBRARY_PATH=$2 ${3:+NCCL_PROTO=$3} timeout 90 mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
    $( [ -n "$3" ] && echo -x NCCL_PROTO ) $P $S > $OUT/$1.log 2>&1
  echo "== $1 rc=$?"; grep -E "^ +[0-9]+ " $OUT/$1.log | awk '{print $1, $6, $8}' | tr '\n' ';'; echo
}
one braid $B ""; one nccl $N ""; one braid_ll128 $B LL128; one nccl_ll128 $N LL128; one braid_ll $B LL; one nccl_ll $N LL
