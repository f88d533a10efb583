#!/usr/bin/env bash
# Copies what the GPU machine needs from a local build into .device/build (ignored by git,
# carried by the device tool), laid out like the build tree, so a GPU round can run without
# rebuilding there:  bash tools/stage-device.sh [build-dir [tests-build-dir]]
# The GPU tests use only the public API, so they may come from another build of the same tree.
# Then run tools/gpu-check.sh there with BUILD_DIR=.device/build and carry .device.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(realpath "${1:-build}")
tests=$(realpath "${2:-$src}")
dst=.device/build
rm -rf "$dst" .device/packed.tar.xz
mkdir -p "$dst/src" "$dst/perf" "$dst/tools" "$dst/tests/gpu"
cp -a "$src"/src/libnccl.so* "$dst/src/"
for f in "$src"/perf/*_perf "$src"/perf/compare; do [ -e "$f" ] && cp -a "$f" "$dst/perf/"; done
# braid-info links everything statically (18 MB): only on request (STAGE_INFO=1).
[ "${STAGE_INFO:-0}" = 1 ] && cp -a "$src/tools/braid-info" "$dst/tools/"
for f in "$tests"/tests/gpu/*; do
  [ -f "$f" ] && [ -x "$f" ] && cp -a "$f" "$dst/tests/gpu/"
done
if [ -f "$tests/tests/gpu/CTestTestfile.cmake" ]; then
  # ctest runs the tests by absolute path: point them at the staged copies.
  sed "s|$tests/tests/gpu|/work/main/build/tests/gpu|g" "$tests/tests/gpu/CTestTestfile.cmake" \
    > "$dst/tests/gpu/CTestTestfile.cmake"
fi
# The library and braid-info (~80 MB of kernels each) are over what the device tool carries
# (64 MiB): they travel packed, and tools/gpu-check.sh unpacks them there.
packed=$(cd "$dst" && ls src/libnccl.so* tools/braid-info 2>/dev/null || true)
tar -C "$dst" -cJf .device/packed.tar.xz $packed
(cd "$dst" && rm -f $packed)
du -sh .device
