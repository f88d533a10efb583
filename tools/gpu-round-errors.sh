export BUILD_DIR=.device/build CASE_TIMEOUT=60
mkdir -p $OUT
[ -e build ] || ln -s .device/build build
export LD_LIBRARY_PATH=$PWD/.device/build/src NCCL_NVLS_ENABLE=0
nvidia-smi -L > $OUT/smi.txt
timeout 120 .device/build/tests/gpu/gpu_coll --mode threads --nranks 1 --suite errors --verbose > $OUT/errors_threads.log 2>&1; echo "errors rc=$?" >> $OUT/smi.txt
OUT=$OUT/np2 timeout 480 bash tools/gpu-hosts.sh quick hang deadpeer
