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
targets="nccl all_reduce_perf gpu_coll proxy_latency $*"
B=.device/b
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
build() { cmake --build $B -j "$(nproc)" --target $targets > "$B/../build-$1.log" 2>&1 ||
          { tail -30 "$B/../build-$1.log"; exit 1; }; }
keep() {
  rm -rf .device/ab/$1 && mkdir -p .device/ab/$1
  cp -a $B/src/libnccl.so* $B/tests/mp/proxy_latency .device/ab/$1/
}
build new && keep new
mkdir -p .device/build/src .device/build/perf .device/build/tests/gpu
cp -a $B/src/libnccl.so* .device/build/src/ && cp -a $B/perf/*_perf .device/build/perf/ &&
  cp -a $B/tests/gpu/gpu_coll .device/build/tests/gpu/
files=$(cd "$old" && find . -type f | sed 's|^\./||')
mkdir -p .device/ab/keep
for f in $files; do mkdir -p ".device/ab/keep/$(dirname "$f")"; cp -a "$f" ".device/ab/keep/$f"; cp "$old/$f" "$f"; done
build old && keep old
for f in $files; do cp -a ".device/ab/keep/$f" "$f"; touch "$f"; done
echo "gpu-ab: built new and old ($(echo $files | wc -w) files differ)"
