# Sourced by the GPU-machine scripts (gpu-check.sh, gpu-hosts.sh, sharegpu-round.sh) from the
# repo root, with $1 the build folder they use. A build staged by tools/stage-device.sh was
# configured in /work/main/build: make those absolute paths resolve here, and unpack the
# library and braid-info (packed: over the device tool's carry limit unpacked).
if [ "$1" = .device/build ]; then
  [ -e build ] || ln -s .device/build build
  [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
  if [ -f .device/packed.tar.xz ] && [ ! -e .device/build/src/libnccl.so.2 ]; then
    tar -C .device/build -xJf .device/packed.tar.xz
  fi
fi
