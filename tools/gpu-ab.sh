#!/usr/bin/env bash
# A/B of a host-side change on the GPU machine, built there: builds this tree ("new"), then
# puts the files of the folder AB_OLD (laid out like the repo: their old versions, e.g. from
# `git show REV:path`) in place and rebuilds in the same build folder, so that only those
# files recompile ("old"); then puts the new ones back. Results:
#   .device/build              the new build's library, perf tools, gpu_coll (tools/gpu-hosts.sh
#                              and tools/gpu-check.sh run it with BUILD_DIR=.device/build)
#   .device/ab/{new,old}/      libnccl.so*, proxy_latency of each
#   bash tools/gpu-ab.sh AB_OLD [targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1; shift
B=.device/b
bash tools/gpu-build.sh proxy_latency "$@"
build() {
  local name=$1; shift
  cmake --build $B -j "$(nproc)" --target nccl proxy_latency "$@" > .device/build-$name.log 2>&1 ||
    { tail -30 .device/build-$name.log; exit 1; }
}
keep() {
  rm -rf .device/ab/$1 && mkdir -p .device/ab/$1
  cp -a $B/src/libnccl.so* $B/tests/mp/proxy_latency .device/ab/$1/
}
keep new
files=$(cd "$old" && find . -type f | sed 's|^\./||')
mkdir -p .device/ab/keep
for f in $files; do mkdir -p ".device/ab/keep/$(dirname "$f")"; cp -a "$f" ".device/ab/keep/$f"; cp "$old/$f" "$f"; done
build old "$@" && keep old
for f in $files; do cp -a ".device/ab/keep/$f" "$f"; touch "$f"; done
echo "gpu-ab: built new and old ($(echo $files | wc -w) files differ)"
