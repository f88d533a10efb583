#!/usr/bin/env bash
# The host-profile test build: applies perf/results/2026-11-27-j/hostprof.patch (rdtsc
# marks along one call's host path; each process prints its stages' averages at exit), builds
# the library in build/ (host files only), packs it into .device/prof.tar.xz for
# `tools/gpu-check.sh hostprof`, then takes the patch out and rebuilds, so build/ is the
# normal library again. Stage the normal build first (tools/stage-device.sh), then this.
#   bash tools/hostprof-stage.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
patch=${HOSTPROF_PATCH:-perf/results/2026-11-27-j/hostprof.patch}
git apply --check "$patch"
git apply "$patch"
trap 'git apply -R "$patch" && cmake --build "$build" -j2 --target nccl > /dev/null' EXIT
cmake --build "$build" -j2 --target nccl > /dev/null
tmp=$(mktemp -d)
cp -a "$build"/src/libnccl.so* "$tmp"/
mkdir -p .device
tar -C "$tmp" -cJf .device/prof.tar.xz .
rm -rf "$tmp"
du -sh .device/prof.tar.xz
