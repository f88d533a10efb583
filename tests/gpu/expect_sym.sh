#!/bin/sh
# Runs gpu_coll --suite sym with the tuning log on, one log file per process, and
# GPU_SYM_CHECK_LOG=1, so that every case checks the path its own process logged
# (tests/gpu/gpu_sym.c); then checks all the files together. A run that fails or crashes
# fails here whatever its log holds; its skip (77) passes through.
# Usage: expect_sym.sh on|off GPU_COLL ARGS...
#   on:  BRAID_SYM_MAX_BYTES > 0; every process logged symmetric all-reduces and
#        reduce-scatters, and some of each count in SYM_COUNTS (default: the full suite's, the
#        one at BRAID_SYM_MAX_BYTES = 16 MiB among them); none of SYM_COUNTS_ABSENT (the count
#        one element past it); reduce-scatters of each receive count in SYM_RS_COUNTS (default:
#        the full suite's; the ones at and past the limit depend on the ranks: each case checks
#        its own).
#   off: no line "from a symmetric window" at all, and ordinary all-reduces and
#        reduce-scatters logged (the log itself worked).
set -u
want=${1:-}
case $want in
  on | off) shift ;;
  *)
    echo "usage: expect_sym.sh on|off GPU_COLL ARGS..." >&2
    exit 2
    ;;
esac
dir=$(mktemp -d "${TMPDIR:-/tmp}/braid-expect-sym.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=TUNING BRAID_DEBUG_FILE="$dir/braid.%p.log" \
  GPU_SYM_CHECK_LOG=1 "$@" > "$dir/out" 2>&1
rc=$?
tail -20 "$dir/out"
# The failed cases by name (the tail above may not reach them).
grep "^FAIL" "$dir/out" | head -40
[ $rc -eq 0 ] || exit $rc
fail() {
  echo "FAIL: $*"
  exit 1
}
nlogs=0
for f in "$dir"/braid.*.log; do
  [ -f "$f" ] || continue
  nlogs=$((nlogs + 1))
  n=$(grep -c "AllReduce [0-9]* elements from a symmetric window" "$f")
  if [ "$want" = on ] && [ "$n" -eq 0 ]; then
    fail "the process of $(basename "$f") logged no all-reduce from a symmetric window"
  fi
  n=$(grep -c "ReduceScatter [0-9]* elements from a symmetric window" "$f")
  if [ "$want" = on ] && [ "$n" -eq 0 ]; then
    fail "the process of $(basename "$f") logged no reduce-scatter from a symmetric window"
  fi
done
[ "$nlogs" -gt 0 ] || fail "no log file (BRAID_DEBUG_FILE=$dir/braid.%p.log)"
sym=$(cat "$dir"/braid.*.log | grep -c "from a symmetric window")
sym_rs=$(cat "$dir"/braid.*.log | grep -c "ReduceScatter [0-9]* elements from a symmetric window")
plain=$(cat "$dir"/braid.*.log | grep -c "AllReduce [0-9]* B on [0-9]* ranks: ")
plain_rs=$(cat "$dir"/braid.*.log | grep -c "ReduceScatter [0-9]* B on [0-9]* ranks: ")
echo "$nlogs log file(s): $sym line(s) from a symmetric window ($sym_rs reduce-scatter)," \
  "$plain ordinary all-reduce(s), $plain_rs ordinary reduce-scatter(s)"
case $want in
  on)
    [ "${BRAID_SYM_MAX_BYTES:-0}" != 0 ] || fail "expect_sym.sh on needs BRAID_SYM_MAX_BYTES > 0"
    [ "$sym" -gt 0 ] || fail "no all-reduce took the symmetric path"
    for c in ${SYM_COUNTS:-1 2 3 7 8 1023 4097 65537 262149 4194304}; do
      cat "$dir"/braid.*.log | grep -q "AllReduce $c elements from a symmetric window" ||
        fail "no all-reduce of $c elements took the symmetric path"
    done
    for c in ${SYM_COUNTS_ABSENT-4194305}; do
      if cat "$dir"/braid.*.log | grep -q "AllReduce $c elements from a symmetric window"; then
        fail "an all-reduce of $c elements (past BRAID_SYM_MAX_BYTES) took the symmetric path"
      fi
    done
    for c in ${SYM_RS_COUNTS:-1 2 3 7 8 1023 1024 4097 65537 262144 262149}; do
      cat "$dir"/braid.*.log | grep -q "ReduceScatter $c elements from a symmetric window" ||
        fail "no reduce-scatter of $c elements took the symmetric path"
    done
    ;;
  off)
    [ "$sym" -eq 0 ] ||
      fail "$sym all-reduce(s) took the symmetric path" \
        "with BRAID_SYM_MAX_BYTES=${BRAID_SYM_MAX_BYTES:-unset}"
    [ "$plain" -gt 0 ] || fail "no ordinary all-reduce logged: is the tuning log on?"
    [ "$plain_rs" -gt 0 ] || fail "no ordinary reduce-scatter logged: is the tuning log on?"
    ;;
esac
verdict="never taken"
[ "$want" = on ] && verdict=taken
echo "PASS: the symmetric path $verdict, as BRAID_SYM_MAX_BYTES=${BRAID_SYM_MAX_BYTES:-unset} asks"
