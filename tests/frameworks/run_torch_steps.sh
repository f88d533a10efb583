#!/usr/bin/env bash
# Training steps (DDP, FSDP2) and torch.distributed collectives on Braid and on PyTorch's own
# NCCL, in alternating rounds on the same machine, set side by side:
#   bash tests/frameworks/run_torch_steps.sh BUILD_DIR [NPROC]
# torch_steps.py says what runs; torch_steps_compare.py what is compared and what fails (wrong
# results, calls that went to the wrong library, losses that differ beyond rounding: never a
# time). Braid is put in front of PyTorch's own libnccl.so.2 with LD_PRELOAD (torch_env.sh).
# TORCH_ROUNDS (3): runs per library, alternating, Braid first. TORCH_ISOLATED=1: each rank's
# process sees only its own GPU. TORCH_STEPS_ARGS: more arguments for torch_steps.py (e.g.
# --what colls). The table goes to $TORCH_OUT/steps.md (default: a temporary directory). Exit
# 77 (CTest's skip) without PyTorch or with fewer than NPROC (default 2) GPUs.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=torch_env.sh
. "$here/torch_env.sh"
np=${2:-2}
torch_prologue "run_torch_steps.sh BUILD_DIR [NPROC]" "${1:-}" "$np"
torch_env
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
status=0
for ((round = 1; round <= ${TORCH_ROUNDS:-3}; round++)); do
  # $TORCH_STEPS_ARGS is split into words on purpose.
  # shellcheck disable=SC2086
  torch_run "braid_r$round" "${TORCH_LIMIT:-600}" "^rank [0-9]+:" "$here/torch_steps.py" \
    LD_PRELOAD="$lib" -- --out-dir "$out/braid_r$round" ${TORCH_STEPS_ARGS:-} || status=1
  # shellcheck disable=SC2086
  torch_run "nccl_r$round" "${TORCH_LIMIT:-600}" "^rank [0-9]+:" "$here/torch_steps.py" \
    -- --out-dir "$out/nccl_r$round" ${TORCH_STEPS_ARGS:-} || status=1
done
python3 "$here/torch_steps_compare.py" "$out" "$build/src" --markdown "$out/steps.md" || status=1
echo "results in $out"
exit $status
