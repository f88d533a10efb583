#!/usr/bin/env bash
# The host test suites under sanitizers, each on a host-only build (BRAID_KERNELS=OFF: no
# device code, so a build takes about a minute on 2 cores):
#   bash tools/sanitize-tests.sh [asan] [tsan]      (default: both; CI runs both)
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer, every unit and mp test
#   tsan: ThreadSanitizer, the bootstrap, proxy and network tests (Braid's threaded code), the
#         watchdog's server thread (watchdog_server_test), the launch helpers (launch_pool_test)
#         and the group calls that run without
#         a GPU (api_errors_test, comm_live_test; the watchdog's monitor, enqueue and launch
#         need a communicator on a GPU, so no host test reaches them)
# Fails on a failed test or on any sanitizer report in any process's output: the mp tests'
# children leave with _exit(), which skips TSan's own exit status, so the log is read too.
# Build trees: build-asan, build-tsan (JOBS as in tools/setup.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
status=0

# run KIND "CMAKE_OPTIONS" CTEST_ARGS...
run() {
  local kind=$1 option=$2; shift 2
  local dir=build-$kind log=build-$kind/sanitize-tests.log start=$(date +%s)
  echo "== $kind: host-only build in $dir"
  if ! { cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo $option -DBRAID_KERNELS=OFF \
           -DBRAID_BUILD_PERF=OFF >/dev/null && cmake --build "$dir" -j "$JOBS" >/dev/null; }; then
    echo "== $kind: build FAILED"; status=1; return
  fi
  echo "== $kind: built in $(( $(date +%s) - start )) s; testing"
  NCCL_NVLS_ENABLE=0 ctest --test-dir "$dir" -V -j 2 "$@" > "$log" 2>&1
  local rc=$?
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" "$log"
  local reports
  reports=$(grep -cE "WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:" "$log")
  if [ $rc -ne 0 ] || [ "$reports" -ne 0 ]; then
    echo "== $kind: FAILED (ctest rc=$rc, $reports sanitizer reports; the first:)"
    grep -m 3 -A 12 -E "WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:" "$log"
    status=1
  else
    echo "== $kind: clean ($(( $(date +%s) - start )) s in all)"
  fi
}

for kind in ${*:-asan tsan}; do
  case $kind in
    # CUDA maps memory in ASan's shadow gap; the CUDA runtime is not instrumented.
    asan) ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
            run asan "-DBRAID_ASAN=ON -DBRAID_UBSAN=ON" -L "unit|mp" ;;
    tsan) TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1" \
            run tsan "-DBRAID_TSAN=ON" -L "unit|mp" \
              -R '^(bootstrap\.|proxy\.|net\.|watchdog_server_test$|api_errors_test$|comm_live_test$|launch_pool_test$)' ;;
    *) echo "unknown kind $kind (asan, tsan)"; status=2 ;;
  esac
done
exit $status
