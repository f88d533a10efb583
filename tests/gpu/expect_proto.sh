#!/bin/sh
# Runs a gpu_coll command with the tuning log on and fails unless collectives ran with PROTO:
# a protocol forced where the connections cannot run it is dropped without an error (the
# model's choice runs instead), so the suite passing alone does not show that it ran.
# Usage: expect_proto.sh PROTO GPU_COLL ARGS...; gpu_coll's skip (77) passes through.
# EXPECT_PATTERN: a log line (grep pattern) to count instead of PROTO's choice.
# EXPECT_ABSENT: a log line (grep pattern) that must not appear at all.
# EXPECT_EACH: more patterns, separated by '|', each of which must match at least one line.
# EXPECT_ALL: every line matching this pattern must also match EXPECT_PATTERN (a forced choice
# that some calls did not take fails).
# EXPECT_SUBSYS: the log's subsystems (default TUNING), for patterns logged outside it.
set -u
proto=$1
shift
log=${TMPDIR:-/tmp}/braid-expect-proto.$$.log
BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=${EXPECT_SUBSYS:-TUNING} "$@" > "$log" 2>&1
rc=$?
grep -v "BRAID INFO" "$log" | tail -20
# The failed cases by name (the tail above may not reach them).
grep "^FAIL" "$log" | head -40
n=$(grep -c "${EXPECT_PATTERN:-ranks: [A-Za-z]*/$proto, }" "$log")
others=$(grep -c "ranks: [A-Za-z]*/[A-Za-z0-9]*, " "$log")
absent=0
[ -n "${EXPECT_ABSENT:-}" ] && absent=$(grep -c "$EXPECT_ABSENT" "$log")
strays=0
if [ -n "${EXPECT_ALL:-}" ]; then
  strays=$(grep "$EXPECT_ALL" "$log" | grep -vc "${EXPECT_PATTERN:-ranks: [A-Za-z]*/$proto, }")
  grep "$EXPECT_ALL" "$log" | grep -v "${EXPECT_PATTERN:-ranks: [A-Za-z]*/$proto, }" | head -5
fi
missing=
if [ -n "${EXPECT_EACH:-}" ]; then
  old_ifs=$IFS; IFS='|'
  set -f # the patterns are split on '|' only, never expanded as file names
  for pat in $EXPECT_EACH; do
    grep -q "$pat" "$log" || missing="$missing '$pat'"
  done
  set +f
  IFS=$old_ifs
fi
rm -f "$log"
[ $rc -eq 0 ] || exit $rc
echo "$n of $others collective calls ran with $proto"
[ "$n" -gt 0 ] || { echo "FAIL: none ran with $proto"; exit 1; }
[ "$absent" -eq 0 ] || { echo "FAIL: $absent log lines match '$EXPECT_ABSENT'"; exit 1; }
[ "$strays" -eq 0 ] || { echo "FAIL: $strays log lines match '$EXPECT_ALL' but not the forced choice"; exit 1; }
[ -z "$missing" ] || { echo "FAIL: no log line matches$missing"; exit 1; }
