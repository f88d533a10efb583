#!/usr/bin/env bash
# Run Braid's tests: host-only unit tests, multi-process tests on loopback, and the
# GPU tests (which report themselves skipped where there is no GPU).
#   bash tools/run-tests.sh [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
export NCCL_NVLS_ENABLE=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 "$@"
