#!/usr/bin/env bash
# Runs a command; if it is still running after LIMIT seconds, prints the host threads' stacks of
# it and of its children named NAME (gdb, else cuda-gdb, attached in batch mode), then kills them.
# Its children get SIGUSR1 first: Braid's watchdogs and proxies then say where each rank waits.
# For hangs that say nothing:  tools/stack-on-hang.sh LIMIT NAME CMD...  (NO_STACKS=1: the SIGUSR1 only)
set -uo pipefail
limit=$1 name=$2; shift 2
"$@" &
pid=$!
for ((t = 0; t < limit * 10; t++)); do
  kill -0 $pid 2>/dev/null || { wait $pid; exit $?; }
  sleep 0.1
done
echo "stack-on-hang: '$*' still running after $limit s; SIGUSR1 to its children (Braid's verdicts), then stacks of it and its $name children:"
pkill -USR1 -P $pid -x "$name"
sleep 3
[ "${NO_STACKS:-0}" = 1 ] && dbg=none || dbg=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
[ "$dbg" = none ] && procs= || procs="$pid $(pgrep -P $pid -x "$name")"
for p in $procs; do
  echo "---- $name pid $p"
  if [ -n "$dbg" ]; then
    timeout 60 "$dbg" -batch -nx -p "$p" -ex "set pagination off" -ex "thread apply all bt" 2>&1 |
      grep -E '^Thread|^#' | head -200
  else
    for task in /proc/$p/task/*; do echo "task ${task##*/} $(cat $task/comm): $(cat $task/wchan 2>/dev/null)"; cat $task/stack 2>/dev/null | head -5; done
  fi
done
pkill -P $pid 2>/dev/null; kill $pid 2>/dev/null
wait $pid
exit 124
