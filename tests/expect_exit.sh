#!/bin/sh
# Runs a command and passes only when it exits with the expected status AND its output (stdout
# and stderr together) holds the expected lines. CTest's PASS_REGULAR_EXPRESSION looks at the
# output alone: a process that prints the line and then crashes, or exits with any status,
# would pass.
#   expect_exit.sh STATUS PATTERN [PATTERN...] -- COMMAND [ARGS...]
# Each PATTERN is an extended regular expression matched against one line; with several, they
# must match consecutive lines, in order (the first anywhere). The command's output is printed
# whole. Its exit status 77 (CTest's skip code) is passed through, whatever STATUS says.
set -u
usage() {
  echo "usage: expect_exit.sh STATUS PATTERN [PATTERN...] -- COMMAND [ARGS...]" >&2
  exit 2
}
[ $# -ge 4 ] || usage
want=$1
shift
case $want in '' | *[!0-9]*) usage ;; esac
npat=0
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  npat=$((npat + 1))
  export "EXPECT_EXIT_PAT_$npat=$1"
  shift
done
[ $# -ge 2 ] && [ "$npat" -ge 1 ] || usage
shift # the "--"
export EXPECT_EXIT_NPAT=$npat

log=${TMPDIR:-/tmp}/braid-expect-exit.$$.log
trap 'rm -f "$log"' EXIT
"$@" > "$log" 2>&1
rc=$?
cat "$log"
echo "--- expect_exit.sh: exit status $rc"
if [ "$rc" -eq 77 ]; then
  echo "skipped (exit status 77)"
  exit 77
fi

# The patterns come through the environment: awk reads ENVIRON as it is, without the escape
# processing that -v assignments apply.
awk '
  { line[NR] = $0 }
  END {
    n = ENVIRON["EXPECT_EXIT_NPAT"] + 0
    for (i = 1; i + n - 1 <= NR; i++) {
      ok = 1
      for (j = 1; j <= n && ok; j++)
        if (line[i + j - 1] !~ ENVIRON["EXPECT_EXIT_PAT_" j]) ok = 0
      if (ok) exit 0
    }
    exit 1
  }' "$log"
found=$?

fail=0
if [ "$rc" -ne "$want" ]; then
  if [ "$rc" -gt 128 ]; then
    echo "FAIL: exit status $rc (signal $((rc - 128))), expected $want"
  else
    echo "FAIL: exit status $rc, expected $want"
  fi
  fail=1
fi
if [ "$found" -ne 0 ]; then
  echo "FAIL: no line (or run of $npat consecutive lines) matches:"
  i=1
  while [ "$i" -le "$npat" ]; do
    eval "pat=\$EXPECT_EXIT_PAT_$i"
    printf '  %s\n' "$pat"
    i=$((i + 1))
  done
  fail=1
fi
[ "$fail" -eq 0 ] && echo "passed: exit status $want and the expected output"
exit "$fail"
