#!/bin/sh
# usage: tests/devapi/header_compile.sh NVCC BRAID_INCLUDE_DIR
#
# Compiles device code against Braid's own nccl_device.h (no GPU needed, nothing is run):
#   1. devapi_test.cu with -DDEVAPI_BRAID_HEADERS, and devapi_header_use.cu: must compile
#      cleanly (-Wall -Werror on the host side);
#   2. devapi_header_use.cu with each -DDEVAPI_REFUSED=n (multimem addresses, GIN): must fail,
#      with the header's message saying what Braid does not offer.
# Exits 77 (skipped) when NVCC cannot be run.
set -u
nvcc=$1
inc=$2
here=$(cd "$(dirname "$0")" && pwd)
"$nvcc" --version > /dev/null 2>&1 || { echo "no working nvcc ($nvcc): skipped"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/braid-devhdr.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
flags="-std=c++17 -arch=sm_90 -I $inc"
failed=0

for src in devapi_test.cu devapi_header_use.cu; do
  # shellcheck disable=SC2086 # the flags are words
  if "$nvcc" $flags -DDEVAPI_BRAID_HEADERS -Xcompiler -Wall,-Werror -c "$here/$src" \
      -o "$tmp/out.o" > "$tmp/log" 2>&1; then
    echo "ok: $src compiles against Braid's nccl_device.h"
  else
    cat "$tmp/log"
    echo "FAILED: $src does not compile against Braid's nccl_device.h"
    failed=1
  fi
done

for n in 1 2 3 4; do
  # shellcheck disable=SC2086
  if "$nvcc" $flags -DDEVAPI_REFUSED=$n -c "$here/devapi_header_use.cu" -o "$tmp/out.o" \
      > "$tmp/log" 2>&1; then
    echo "FAILED: DEVAPI_REFUSED=$n compiled: something Braid does not offer was accepted"
    failed=1
  elif grep -q "Braid offers no" "$tmp/log"; then
    echo "ok: DEVAPI_REFUSED=$n refused: $(grep -o 'Braid offers no [^:]*' "$tmp/log" | head -n 1)"
  else
    cat "$tmp/log"
    echo "FAILED: DEVAPI_REFUSED=$n failed without the header's message"
    failed=1
  fi
done
exit $failed
