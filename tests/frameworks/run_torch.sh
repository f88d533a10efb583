#!/usr/bin/env bash
# PyTorch on Braid against PyTorch on NCCL, same script, same machine, one after the other:
#   bash tests/frameworks/run_torch.sh BUILD_DIR [NPROC]
# Braid is put in front of PyTorch's own libnccl.so.2 with LD_PRELOAD (torch_env.sh says why).
# With fewer GPUs than ranks every rank poses as its own host (torch_check.py --hosts); start
# the CUDA MPS daemon first (nvidia-cuda-mps-control -d) or the ranks time-slice the GPU.
# TORCH_ISOLATED=1: each rank's process sees only its own GPU (CUDA_VISIBLE_DEVICES set per
# rank to the i-th GPU of the caller's list, as SLURM's --gpus-per-task=1 or a Kubernetes pod
# hands them out); the ranks are started here instead of by torchrun, with torchrun's variables.
# Exit 77 (CTest's skip) without PyTorch or a GPU. Results under $TORCH_OUT (default: a
# temporary directory).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=torch_env.sh
. "$here/torch_env.sh"
torch_prologue "run_torch.sh BUILD_DIR [NPROC]" "${1:-}" 1
np=${2:-2}
hosts=""
[ "$ngpu" -lt "$np" ] && hosts=--hosts
[ "${TORCH_ISOLATED:-0}" = 1 ] && [ -n "$hosts" ] && { echo "SKIP: $np isolated ranks need $np GPUs"; exit 77; }
torch_env
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run() {  # run LABEL [VAR=VALUE...]: torch_check.py on np ranks; its output in $out/LABEL.log
  local label=$1; shift
  # $hosts and $TORCH_ARGS are split into words on purpose.
  # shellcheck disable=SC2086
  torch_run "$label" "${TORCH_LIMIT:-600}" "^rank [0-9]+:" "$here/torch_check.py" "$@" -- \
    --out-dir "$out/$label" $hosts ${TORCH_ARGS:-}
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
