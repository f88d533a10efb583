#!/usr/bin/env bash
# PyTorch's symmetric memory (torch.distributed._symmetric_memory) on Braid:
#   bash tests/frameworks/run_torch_symm.sh BUILD_DIR [NPROC]
# Three runs of torch_symm_mem.py, one after the other, each on NPROC ranks, one GPU each:
#   braid-nccl  Braid preloaded (as run_torch.sh does), symmetric-memory backend NCCL: the
#               backend that calls ncclMemAlloc, ncclCommWindowRegister, ncclDevCommCreate.
#               The verdict: it fails on any failed check or feature, or when nothing ran.
#   braid-cuda  Braid preloaded, backend CUDA (PyTorch maps the peers' memory itself): the
#               reference. Its results must match braid-nccl's (bit for bit where the data are
#               integer-valued); a failure of its own is printed, not counted, since it does
#               not run through Braid's windows.
#   nccl-nccl   PyTorch's own NCCL, backend NCCL: printed only, for comparison (NCCL 2.28.9
#               itself may fail in rendezvous where NVLink multicast is off).
# Then the checks and the median times of every run side by side (torch_symm_mem.py --compare).
# TORCH_ISOLATED=1: each rank's process sees only its own GPU (as run_torch.sh).
# TORCH_BRAID_ONLY=1: without the NCCL run. TORCH_LIMIT: seconds per run (default 400).
# TORCH_ARGS: more arguments for torch_symm_mem.py (--sizes, --iters). Exit 77 (CTest's skip)
# without PyTorch or with fewer GPUs than ranks. Results under $TORCH_OUT (default: a
# temporary directory).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run_torch_symm.sh BUILD_DIR [NPROC]}" && pwd)
np=${2:-2}
out=${TORCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
lib=$build/src/libnccl.so.2
[ -e "$lib" ] || { echo "no $lib: build Braid first" >&2; exit 1; }
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) || {
  echo "SKIP: python3 cannot import torch"; exit 77; }
[ "${ngpu:-0}" -ge 1 ] || { echo "SKIP: PyTorch sees no GPU"; exit 77; }
# Symmetric memory maps each rank's GPU memory into the others: one GPU per rank, one host.
[ "$ngpu" -ge "$np" ] || { echo "SKIP: $np ranks need $np GPUs, PyTorch sees $ngpu"; exit 77; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=1
unset LD_LIBRARY_PATH  # Braid comes in by LD_PRELOAD only; the NCCL run must see no Braid
# launch ARGS...: torch_symm_mem.py on np ranks, through torchrun or, isolated, one process per GPU
launch() {
  local port=$((29500 + RANDOM % 1000))
  if [ "${TORCH_ISOLATED:-0}" != 1 ]; then
    python3 -m torch.distributed.run --nproc-per-node "$np" --master-port "$port" \
      "$here/torch_symm_mem.py" "$@"
    return
  fi
  local gpus pids=() rc=0 r
  IFS=, read -r -a gpus <<< "${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((np - 1)))}"
  for ((r = 0; r < np; r++)); do
    CUDA_VISIBLE_DEVICES=${gpus[r]:?fewer GPUs than ranks} RANK=$r LOCAL_RANK=0 WORLD_SIZE=$np \
      LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      python3 "$here/torch_symm_mem.py" "$@" &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  return $rc
}
run() {  # run LABEL BACKEND [env...]: its output in $out/LABEL.log, its results in $out/LABEL
  local label=$1 backend=$2; shift 2
  env "$@" timeout -k 10 "${TORCH_LIMIT:-400}" bash -c "$(declare -f launch); here='$here' np=$np launch \"\$@\"" \
    launch --backend "$backend" --out-dir "$out/$label" ${TORCH_ARGS:-} > "$out/$label.log" 2>&1
  local rc=$?
  echo "== $label: rc=$rc"
  grep -E "^rank [0-9]+: .*(FAIL|not in this torch|not implemented|checks passed)" "$out/$label.log"
  [ $rc -eq 0 ] || tail -30 "$out/$label.log"
  return $rc
}
status=0
run braid-nccl NCCL LD_PRELOAD="$lib" || status=1
run braid-cuda CUDA LD_PRELOAD="$lib" || echo "(the CUDA backend's reference run failed: not counted)"
informative=()
if [ "${TORCH_BRAID_ONLY:-0}" != 1 ]; then
  run nccl-nccl NCCL || echo "(the run on NCCL failed: informative only, not counted)"
  informative=(--informative "$out/nccl-nccl")
fi
reference=()
[ -d "$out/braid-cuda" ] && reference=(--reference "$out/braid-cuda")
python3 "$here/torch_symm_mem.py" --compare "$out/braid-nccl" ${reference[@]+"${reference[@]}"} \
  ${informative[@]+"${informative[@]}"} \
  --lib-dir "$build/src" || status=1
echo "results in $out"
exit $status
