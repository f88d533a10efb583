#!/bin/sh
# usage: tests/packaging/check.sh BUILD_DIR
#
# Checks that an installed Braid can be used from outside its tree: installs BUILD_DIR into a
# temporary prefix, then builds consumer/consumer.c against it with
#   1. cc $(pkg-config --cflags --libs braid)
#   2. a CMake project that calls find_package(Braid) and links Braid::nccl and Braid::braid
# and runs each program. Exits non-zero at the first step that fails.
# Honours CC, CFLAGS and LDFLAGS (the CMake step reads them too) and CUDAToolkit_ROOT.
set -eu

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/braid-packaging.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

step() { printf '\n== %s\n' "$*"; }
fail() { echo "packaging check FAILED: $*" >&2; exit 1; }

step "install $build into $prefix"
cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install"; }
pc=$(find "$prefix" -name braid.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "no braid.pc under $prefix"
pcdir=$(dirname "$pc")
libdir=$(dirname "$pcdir")
echo "braid.pc in $pcdir"

step "pkg-config --cflags --libs braid"
flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs braid) || fail "pkg-config"
echo "$flags"

step "the device API's headers: nccl_device.h with nccl.h, compiled as C with pkg-config's flags"
[ -f "$prefix/include/nccl_device.h" ] && [ -f "$prefix/include/nccl_device/core.h" ] ||
  fail "nccl_device.h or nccl_device/core.h not installed under $prefix/include"
printf '#include <nccl_device.h>\nint main(void) { return (int)ncclGetResourceBufferOffset(0) + BRAID_VERSION_CODE * 0; }\n' \
  > "$tmp/devapi.c"
# shellcheck disable=SC2086 # the flags are words
$cc ${CFLAGS:-} -Wall -Werror "$tmp/devapi.c" -o "$tmp/devapi_c" $flags ${LDFLAGS:-} ||
  fail "compiling nccl_device.h as C with pkg-config's flags"
LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$tmp/devapi_c" ||
  fail "the nccl_device.h consumer"

step "build the consumer with $cc and pkg-config's flags"
# shellcheck disable=SC2086 # the flags are words
$cc ${CFLAGS:-} "$here/consumer/consumer.c" -o "$tmp/consumer_pc" $flags ${LDFLAGS:-} ||
  fail "compiling or linking with pkg-config's flags"

step "run it"
LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$tmp/consumer_pc" ||
  fail "the pkg-config consumer"

step "configure the CMake consumer (find_package(Braid), CMAKE_PREFIX_PATH=$prefix)"
cmake -S "$here/consumer" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" > "$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; fail "configuring the CMake consumer"; }
found=$(grep "Braid .* from" "$tmp/configure.log" || true)
echo "$found"
case $found in
  *"$prefix"/*) ;;
  *) fail "find_package(Braid) found a Braid outside $prefix" ;;
esac

step "build the CMake consumer"
cmake --build "$tmp/cmake-build" > "$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; fail "building the CMake consumer"; }

for prog in consumer_nccl consumer_braid; do
  step "run $prog"
  LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$tmp/cmake-build/$prog" ||
    fail "$prog"
done

printf '\npackaging check passed\n'
