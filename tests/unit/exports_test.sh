#!/bin/sh
# The libraries export exactly the NCCL API (nccl*, its pnccl* profiling names) and
# Braid's extensions (braid*): every symbol PyTorch links against is there, nothing
# else leaks (no cudart, no internal functions), and libnccl.so.2 has the right SONAME.
# With SYSTEM_LIBNCCL (a real NCCL, only read): every nccl*/pnccl* function it exports, but
# its internal ncclResetDebugInitInternal, must be exported too (a program may link any).
# Usage: exports_test.sh LIBNCCL LIBBRAID SYMBOL_LIST [SYSTEM_LIBNCCL]
set -u
lib=$1; braid=$2; wanted=$3; system=${4:-}
fail=0
for l in "$lib" "$braid"; do
  defined=$(nm -D --defined-only "$l" | awk '{print $3}' | sed 's/@.*//' | sort -u)
  leaked=$(printf '%s\n' "$defined" | grep -v -E '^(nccl|pnccl|braid)' | grep -v '^$')
  if [ -n "$leaked" ]; then
    echo "FAIL: $l exports symbols outside nccl*/pnccl*/braid*:"; printf '  %s\n' $leaked | head -20; fail=1
  fi
  for s in $(cat "$wanted"); do
    printf '%s\n' "$defined" | grep -qx "$s" || { echo "FAIL: $l does not export $s"; fail=1; }
  done
  echo "$l: $(printf '%s\n' "$defined" | wc -l) symbols exported"
done
if [ -n "$system" ] && [ -f "$system" ]; then
  ours=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u)
  theirs=$(nm -D --defined-only "$system" | awk '{print $3}' | sed 's/@.*//' |
           grep -E '^p?nccl' | grep -v -x 'ncclResetDebugInitInternal' | sort -u)
  missing=$(printf '%s\n' "$theirs" | while read -r s; do
    printf '%s\n' "$ours" | grep -qx "$s" || echo "$s"; done)
  if [ -n "$missing" ]; then
    echo "FAIL: $system exports these, $lib does not:"; printf '  %s\n' $missing; fail=1
  else
    echo "every nccl*/pnccl* symbol of $system is exported"
  fi
fi
soname=$(readelf -d "$lib" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libnccl.so.2" ] || { echo "FAIL: SONAME is '$soname', expected libnccl.so.2"; fail=1; }
if readelf -d "$lib" | grep -q 'NEEDED.*libcudart'; then
  echo "FAIL: $lib depends on a shared libcudart; cudart must be linked statically"; fail=1
fi
[ $fail -eq 0 ] && echo "exports OK"
exit $fail
