#!/usr/bin/env bash
# A/B of a library change on one GPU, both in one device call: "old" is the build staged by
# tools/stage-device.sh (carry .device), "new" is this tree's library built here (target nccl
# only, ~4 min on 16 cores); both run the staged perf tools and gpu_coll, which use only the
# public API. Each tools/sharegpu-round.sh SPEC runs ROUNDS times, old then new.
#   bash tools/gpu-lib-ab.sh ROUNDS SPEC...   (SPEC as in sharegpu-round.sh, NAME without prefix)
# Logs: $OUT/{old,new}<round>/logs.tgz; perf rows and verdicts in $OUT/ab.txt.
# AB_OLD_SRC=DIR: the other way round, for a change to the kernels (a local build of both would
# take most of an hour): the staged build is "new", and "old" is built here from DIR, an export
# of the commit before (git archive HEAD | tar -x -C DIR; not ignored, so the tree carries it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-lib-ab-out}
rounds=$1; shift
mkdir -p "$OUT"
start=$(date +%s)
src=.
built=new
if [ -n "${AB_OLD_SRC:-}" ]; then src=$AB_OLD_SRC; built=old; fi
{ cmake -S "$src" -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DBRAID_BUILD_TESTS=OFF -DBRAID_BUILD_PERF=OFF &&
  cmake --build build-gpu -j "$(nproc)" --target nccl; } > "$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
echo "== $built library built in $(( $(date +%s) - start )) s" | tee "$OUT/ab.txt"
. tools/device-build.sh .device/build
rm -rf .device/new && mkdir -p .device/new
ln -s "$PWD/build-gpu/src" .device/new/src
ln -s "$PWD/.device/build/perf" .device/new/perf
ln -s "$PWD/.device/build/tests" .device/new/tests
status=0
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    specs=()
    for s in "$@"; do specs+=("${side}_$s"); done
    b=.device/build; [ $side = $built ] && b=.device/new
    OUT=$OUT/$side$r BUILD_DIR=$b bash tools/sharegpu-round.sh "${specs[@]}" > /dev/null 2>&1 || status=1
    mkdir -p "$OUT/x" && tar xzf "$OUT/$side$r/logs.tgz" -C "$OUT/x"
    for s in "${specs[@]}"; do
      n=${s%% *}
      echo "== $n (round $r): $(grep -h 'library path' "$OUT/x/$n.log" | sed 's/.*path: //')" >> "$OUT/ab.txt"
      grep -E '^ +[0-9]+ +[0-9]+ ' "$OUT/x/$n.log" | awk '{print "  ", $1, $6, $8, $9, $10, $12}' >> "$OUT/ab.txt"
      grep -E 'cases,|FAIL' "$OUT/x/$n.log" | head -5 >> "$OUT/ab.txt"
    done
    rm -rf "$OUT/x"
  done
done
cat "$OUT/ab.txt"
exit $status
