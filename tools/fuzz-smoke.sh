#!/usr/bin/env bash
# The libFuzzer harnesses (tests/unit/fuzz_*.c) built with clang and run briefly on the
# fixtures, so that they cannot stop building or crash unseen (CI runs this; long runs are by
# hand, as tests/unit/CMakeLists.txt says):   bash tools/fuzz-smoke.sh [seconds each, 20]
# Host-only build in build-fuzz (no kernels). Fails on a failed build, a crash or a report.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
if ! command -v clang >/dev/null; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "== installing clang"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang >/dev/null
fi
start=$(date +%s)
if ! { CC=clang cmake -S . -B build-fuzz -DBRAID_FUZZ=ON -DBRAID_KERNELS=OFF -DBRAID_BUILD_PERF=OFF \
         >/dev/null && cmake --build build-fuzz --target fuzz_topo_xml fuzz_bootstrap \
         fuzz_bootstrap_root fuzz_net_socket fuzz_watchdog -j "${JOBS:-$(nproc)}" >/dev/null; }; then
  echo "== fuzz: build FAILED"; exit 1
fi
echo "== fuzz: built in $(( $(date +%s) - start )) s"
status=0
for h in fuzz_topo_xml fuzz_bootstrap fuzz_bootstrap_root fuzz_net_socket fuzz_watchdog; do
  corpus=$(mktemp -d)
  [ "$h" = fuzz_topo_xml ] && cp tests/unit/fixtures/*.xml "$corpus"/
  log=build-fuzz/$h.log
  build-fuzz/tests/unit/$h -max_total_time="$secs" -rss_limit_mb=4096 "$corpus" > "$log" 2>&1
  rc=$?
  echo "== $h: rc=$rc, $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" | tail -1)"
  [ $rc -eq 0 ] || { tail -30 "$log"; status=1; }
  rm -rf "$corpus"
done
exit $status
