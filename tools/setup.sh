#!/usr/bin/env bash
# Set up Braid on a fresh Debian/Ubuntu machine that has the CUDA toolkit (nvcc):
# install the build dependencies, configure, build, and run the main job — the
# all-reduce benchmark on the local GPUs, or braid-info where there is no GPU.
#   bash tools/setup.sh            # everything
#   bash tools/setup.sh --no-run   # install and build only (CI)
# BUILD_DIR (default build) and JOBS (default: all cores) can be overridden; CUDA_ARCHS
# sets CMAKE_CUDA_ARCHITECTURES. Unset, the kernels are built for this machine's GPUs
# (`native`) where nvidia-smi lists one, else for CMakeLists.txt's default list of
# architectures (several times longer); CI uses 90-virtual: PTX only, no GPU there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
run_main=1
[ "${1:-}" = "--no-run" ] && run_main=0

packages="cmake make gcc g++ pkg-config python3 libhwloc-dev libibverbs-dev libfabric-dev
          libopenmpi-dev openmpi-bin iproute2 binutils"
missing=""
for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "== installing:$missing"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "setup: nvcc not found; install the CUDA toolkit (13.x)"; exit 1; }

echo "== configuring and building in $BUILD_DIR with $JOBS jobs"
start=$(date +%s)
if [ -z "${CUDA_ARCHS:-}" ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  CUDA_ARCHS=native
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
  ${CUDA_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS} >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "== build took $(( $(date +%s) - start )) s"

[ $run_main -eq 1 ] || exit 0
ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${ngpus:-0}" -ge 1 ] && [ -x "$BUILD_DIR/perf/all_reduce_perf" ]; then
  echo "== all_reduce_perf on $ngpus local GPUs"
  NCCL_NVLS_ENABLE=0 "$BUILD_DIR/perf/all_reduce_perf" -b 8 -e 1G -f 4 -g "$ngpus"
else
  echo "== no GPU here: braid-info"
  "$BUILD_DIR/tools/braid-info" --version --env
fi
