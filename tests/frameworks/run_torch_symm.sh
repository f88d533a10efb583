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
# shellcheck source-path=SCRIPTDIR source=torch_env.sh
. "$here/torch_env.sh"
torch_prologue "run_torch_symm.sh BUILD_DIR [NPROC]" "${1:-}" 1
np=${2:-2}
# Symmetric memory maps each rank's GPU memory into the others: one GPU per rank, one host.
torch_need_gpus "$np"
torch_env
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run() {  # run LABEL BACKEND [VAR=VALUE...]: its output in $out/LABEL.log, its results in $out/LABEL
  local label=$1 backend=$2; shift 2
  # $TORCH_ARGS is split into words on purpose.
  # shellcheck disable=SC2086
  torch_run "$label" "${TORCH_LIMIT:-400}" \
    "^rank [0-9]+: .*(FAIL|not in this torch|not implemented|checks passed)" \
    "$here/torch_symm_mem.py" "$@" -- --backend "$backend" --out-dir "$out/$label" ${TORCH_ARGS:-}
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
