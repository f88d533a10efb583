#!/usr/bin/env bash
# l2: where an 8 B all-reduce's host time goes outside Braid's marks, and whether CPU 0 costs it.
# Run from the repo root on the x2 machine with .device carried (staged build + prof.tar.xz).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
. tools/device-build.sh .device/build
B=.device/build; NL=/usr/lib/x86_64-linux-gnu
mkdir -p .device/prof && tar -C .device/prof -xJf .device/prof.tar.xz
S=$OUT/l2.txt
M="mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH"
ar() { # LIB BIND [flags]: one 8 B all-reduce run, prints its rows
  local lib=$1 bind=$2; shift 2
  LD_LIBRARY_PATH=$lib timeout -k 5 90 $M tools/bind-gpu.sh $bind $B/perf/all_reduce_perf \
    -b 8 -e 8 -g 1 ${*:--w 200 -n 5000} < /dev/null 2>&1 | grep -E '^ +[0-9]+ +[0-9]+ |HOSTPROF (stage|span|total)'
}
{
  echo "# interrupts per CPU during 20000 8 B all-reduces, ranks on CPUs 0,1"
  for lib in $PWD/$B/src $NL; do
    echo "## $lib"; IRQ_TOP=8 tools/irq-diff.sh bash -c "LD_LIBRARY_PATH=$lib $M tools/bind-gpu.sh at:0,1 \
      $B/perf/all_reduce_perf -b 8 -e 8 -g 1 -w 100 -n 20000 < /dev/null 2>/dev/null | grep -E '^ +8 '"
  done
  echo "## launch-cost on CPU 0"; IRQ_TOP=6 tools/irq-diff.sh taskset -c 0 .device/launch-cost 0 2>&1 | head -8
  for r in 1 2; do
    for at in at:0,1 at:8,9 at:30,31 near; do
      echo "# round $r $at braid / nccl / braid-hostprof"
      ar $PWD/$B/src $at; ar $NL $at; ar $PWD/.device/prof $at
    done
  done
} > $S 2>&1
cat $S
