#!/usr/bin/env bash
# Builds this tree on the GPU machine (16 cores: ~2.5 minutes) into .device/b and stages
# the library, perf tools and gpu_coll in .device/build, where tools/gpu-hosts.sh and
# tools/gpu-check.sh find them with BUILD_DIR=.device/build. Extra targets may follow.
#   bash tools/gpu-build.sh [targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
B=.device/b
mkdir -p $B
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
cmake --build $B -j "$(nproc)" --target nccl all_reduce_perf gpu_coll "$@" > .device/build.log 2>&1 ||
  { tail -30 .device/build.log; exit 1; }
mkdir -p .device/build/src .device/build/perf .device/build/tests/gpu
cp -a $B/src/libnccl.so* .device/build/src/
cp -a $B/perf/*_perf .device/build/perf/
cp -a $B/tests/gpu/gpu_coll .device/build/tests/gpu/
