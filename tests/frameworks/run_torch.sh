#!/usr/bin/env bash
# PyTorch on Braid against PyTorch on NCCL, same script, same machine, one after the other:
#   bash tests/frameworks/run_torch.sh BUILD_DIR [NPROC]
# Braid is put in front of PyTorch's own libnccl.so.2 with LD_PRELOAD: libtorch_cuda.so needs
# "libnccl.so.2", and the dynamic linker takes the preloaded object of that SONAME instead of
# the one its RPATH points at (LD_LIBRARY_PATH does not win over an RPATH). With fewer GPUs
# than ranks every rank poses as its own host (torch_check.py --hosts); start the CUDA MPS
# daemon first (nvidia-cuda-mps-control -d) or the ranks time-slice the GPU.
# TORCH_ISOLATED=1: each rank's process sees only its own GPU (CUDA_VISIBLE_DEVICES set per
# rank to the i-th GPU of the caller's list, as SLURM's --gpus-per-task=1 or a Kubernetes pod
# hands them out); the ranks are started here instead of by torchrun, with torchrun's variables.
# Exit 77 (CTest's skip) without PyTorch or a GPU. Results under $TORCH_OUT (default: a
# temporary directory).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run_torch.sh BUILD_DIR [NPROC]}" && pwd)
np=${2:-2}
out=${TORCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
lib=$build/src/libnccl.so.2
[ -e "$lib" ] || { echo "no $lib: build Braid first" >&2; exit 1; }
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) || {
  echo "SKIP: python3 cannot import torch"; exit 77; }
[ "${ngpu:-0}" -ge 1 ] || { echo "SKIP: PyTorch sees no GPU"; exit 77; }
hosts=""
[ "$ngpu" -lt "$np" ] && hosts=--hosts
[ "${TORCH_ISOLATED:-0}" = 1 ] && [ -n "$hosts" ] && { echo "SKIP: $np isolated ranks need $np GPUs"; exit 77; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=1
unset LD_LIBRARY_PATH  # Braid comes in by LD_PRELOAD only; the NCCL run must see no Braid
# launch ARGS...: torch_check.py on np ranks, through torchrun or, isolated, one process per GPU
launch() {
  local port=$((29500 + RANDOM % 1000))
  if [ "${TORCH_ISOLATED:-0}" != 1 ]; then
    python3 -m torch.distributed.run --nproc-per-node "$np" --master-port "$port" \
      "$here/torch_check.py" "$@"
    return
  fi
  local gpus pids=() rc=0 r
  IFS=, read -r -a gpus <<< "${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((np - 1)))}"
  for ((r = 0; r < np; r++)); do
    CUDA_VISIBLE_DEVICES=${gpus[r]:?fewer GPUs than ranks} RANK=$r LOCAL_RANK=0 WORLD_SIZE=$np \
      LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      python3 "$here/torch_check.py" "$@" &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  return $rc
}
run() {  # run LABEL [env...]: torch_check.py on np ranks; its output in $out/LABEL.log
  local label=$1; shift
  env "$@" timeout -k 10 ${TORCH_LIMIT:-600} bash -c "$(declare -f launch); here='$here' np=$np launch \"\$@\"" \
    launch --out-dir "$out/$label" $hosts ${TORCH_ARGS:-} > "$out/$label.log" 2>&1
  local rc=$?
  echo "== $label: rc=$rc"
  grep -E "^rank [0-9]+:" "$out/$label.log"
  [ $rc -eq 0 ] || tail -30 "$out/$label.log"
  return $rc
}
status=0
run braid LD_PRELOAD="$lib" || status=1
# TORCH_BRAID_ONLY=1: Braid alone (a variant beside a comparison made already)
if [ "${TORCH_BRAID_ONLY:-0}" != 1 ]; then
  run nccl || status=1
  python3 "$here/torch_compare.py" "$out/braid" "$out/nccl" "$build/src" || status=1
fi
echo "results in $out"
exit $status
