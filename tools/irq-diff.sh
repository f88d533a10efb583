#!/usr/bin/env bash
# Interrupts taken while a command runs, per source, on the CPUs that took them:
#   tools/irq-diff.sh CMD ARGS...   (the command's own output goes to stderr)
# Prints the sources with the most interrupts in that time, "CPUn:count" for each CPU.
set -uo pipefail
before=$(mktemp); after=$(mktemp)
cat /proc/interrupts > "$before"
"$@" 1>&2; rc=$?
cat /proc/interrupts > "$after"
awk -v top="${IRQ_TOP:-10}" '
  FNR == 1 { ncpu = NF; for (i = 1; i <= NF; i++) cpu[i] = $i; next }
  NR == FNR { for (i = 2; i <= ncpu + 1; i++) b[$1, i] = $i; next }
  { tot = 0; s = "";
    for (i = 2; i <= ncpu + 1; i++) { d = $i - b[$1, i]; if (d > 0) { tot += d; s = s " " cpu[i - 1] ":" d } }
    if (tot > 0) { name = ""; for (i = ncpu + 2; i <= NF; i++) name = name " " $i
      printf "%10d %-6s%s |%s\n", tot, $1, name, s } }' "$before" "$after" | sort -rn | head -"${IRQ_TOP:-10}"
rm -f "$before" "$after"
exit $rc
