#!/usr/bin/env bash
# BRAID_SMALL_NTHREADS off (0) against its default (64) against NCCL, three rounds, on what
# it must not touch (GPU machine): all-to-all at 8 MB and send/recv at 32-512 B (send/recv
# works keep the full block), two processes as perf/compare runs them. Output on stdout.
set -u
cd "$(dirname "$0")/.."
. tools/device-libs.sh
for r in 1 2 3; do
  for v in 0 64 nccl; do
    d=$PWD/$B/src; [ $v = nccl ] && d=$NCCL_DIR
    for c in "alltoall -b 8M -e 8M" "sendrecv -b 32 -e 512 -f 4"; do
      set -- $c
      t=$(BRAID_SMALL_NTHREADS=${v/nccl/0} LD_LIBRARY_PATH=$d timeout 40 mpirun --allow-run-as-root \
          -np 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x BRAID_SMALL_NTHREADS \
          "$B/perf/${1}_perf" "${@:2}" -w 5 -n 20 -g 1 2>&1 |
          awk '$1 ~ /^[0-9]+$/ && NF > 10 {printf "%s:%s ", $1, $6}')
      echo "r$r small=$v $1: $t"
    done
  done
done
