#!/bin/sh
# The bad-input tests cover the whole API: every nccl* function the library
# exports is called with wrong arguments in one of the bad-input test files
# (a new public function without such a call fails here).
# Usage: bad_input_coverage_test.sh LIBNCCL TEST_FILE...
set -u
lib=$1; shift
fail=0; n=0
for s in $(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | grep '^nccl' | sort -u); do
  n=$((n + 1))
  grep -qE "(^|[^A-Za-z_])$s\(" "$@" || { echo "FAIL: no bad-input call of $s in: $*"; fail=1; }
done
[ "$n" -gt 40 ] || { echo "FAIL: only $n nccl* functions exported by $lib"; fail=1; }
[ $fail -eq 0 ] && echo "bad-input calls cover all $n exported nccl* functions"
exit $fail
