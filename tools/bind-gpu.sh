#!/usr/bin/env bash
# Runs a command bound to CPUs chosen by where this rank's GPU sits (mpirun wrapper):
#   mpirun --bind-to none -np 2 tools/bind-gpu.sh MODE prog args...
# MODE: near (the GPU's NUMA node's CPUs, /sys/.../local_cpulist), near1 (one core of them),
# far (every other online CPU), far1 (one core of those), at:A,B,... (local rank i on the i-th
# CPU listed, whatever the GPU; e.g. at:8,9 keeps two ranks off CPU 0). The GPU is the rank's local index
# (OMPI_COMM_WORLD_LOCAL_RANK), counted in PCI order as nvidia-smi counts them.
set -euo pipefail
mode=$1; shift
idx=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-0}}
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$idx" | tr 'A-F' 'a-f')
bus=${bus#0000}  # nvidia-smi writes an 8-digit domain, sysfs a 4-digit one
expand() { # "0-3,8" -> "0 1 2 3 8"
  local IFS=,; for r in $1; do
    case $r in *-*) seq "${r%-*}" "${r#*-}" ;; *) echo "$r" ;; esac
  done | tr '\n' ' '
}
near=$(expand "$(cat /sys/bus/pci/devices/$bus/local_cpulist)")
all=$(expand "$(cat /sys/devices/system/cpu/online)")
far=""; for c in $all; do case " $near " in *" $c "*) ;; *) far="$far $c" ;; esac; done
pick() { # the idx-th CPU of the list (one core a rank even when two GPUs share a node)
  set -- $1
  [ $# -gt 0 ] || { echo "bind-gpu.sh: no CPU to put rank $idx on ($mode)" >&2; exit 2; }
  shift $(( idx % $# )); echo "$1"
}
case $mode in
  near) cpus=$near ;; far) cpus=${far:-$near} ;;
  near1) cpus=$(pick "$near") ;; far1) cpus=$(pick "${far:-$near}") ;;
  at:*) cpus=$(pick "$(echo "${mode#at:}" | tr , ' ')") ;;
  *) echo "bind-gpu.sh: unknown mode $mode (near, near1, far, far1, at:LIST)" >&2; exit 2 ;;
esac
[ -n "$cpus" ] || exit 2
list=$(echo $cpus | tr ' ' ',')
echo "bind-gpu: rank $idx GPU $bus ($mode) on CPUs $list" >&2
exec taskset -c "$list" "$@"
