# Sourced (from the repository root) by the GPU machine's measuring scripts (floor-check.sh,
# batch-cost.sh, graph-pace.sh, ab-small.sh): sets B, the staged build (its packed library
# unpacked), NCCL_DIR, and LIBS, the libraries to set side by side as name=dir: "floor"
# (tools/floor-nccl.cu's, when .device/floor has it), Braid's under BRAID_NAME (braid), "old"
# (with DEVICE_LIBS_OLD=1, when .device/old-packed.tar.xz is there) and "nccl".
export NCCL_NVLS_ENABLE=0
B=${BUILD_DIR:-.device/build}
[ -f .device/packed.tar.xz ] && tar -C "$B" -xJf .device/packed.tar.xz
NCCL_DIR=${NCCL_LIB_DIR:-/usr/lib/x86_64-linux-gnu}
LIBS=
[ -f .device/floor/libnccl.so.2 ] && LIBS="floor=$PWD/.device/floor"
LIBS="$LIBS ${BRAID_NAME:-braid}=$PWD/$B/src"
if [ "${DEVICE_LIBS_OLD:-0}" = 1 ] && [ -f .device/old-packed.tar.xz ]; then
  mkdir -p .device/old && tar -C .device/old -xJf .device/old-packed.tar.xz &&
    LIBS="$LIBS old=$PWD/.device/old/src"
fi
LIBS="$LIBS nccl=$NCCL_DIR"
