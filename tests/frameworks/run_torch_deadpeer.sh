#!/usr/bin/env bash
# How fast a survivor learns that its peer died, under torch.distributed on Braid:
#   bash tests/frameworks/run_torch_deadpeer.sh BUILD_DIR
# torch_deadpeer.py starts 2 ranks with multiprocessing (no launcher watching), one GPU each,
# SIGKILLs rank 1 in a stream of 64 MB collectives, reaped at once or left a zombie, with
# BRAID_TIMEOUT unset, 0 and 600, every GPU visible or one per process; rank 0 must raise
# within 5 s of the kill, the exception or its log naming rank 1. Every mode runs on Braid
# (LD_PRELOAD of BUILD_DIR/src/libnccl.so.2, as run_torch.sh does) and, for comparison only,
# on PyTorch's own NCCL; a table of the times follows. Exit 0 only if every mode met the bar on
# Braid; 77 (CTest's skip) without PyTorch or with fewer than 2 GPUs.
# TORCH_BRAID_ONLY=1: without the NCCL runs. TORCH_DEADPEER_MODES: a regular expression, only
# the modes whose name matches ("allreduce all reaped BRAID_TIMEOUT=unset", ...).
# TORCH_DEADPEER_SEED: the seed of the kill delays (printed by every run). Results under
# $TORCH_OUT (default: a temporary directory).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=torch_env.sh
. "$here/torch_env.sh"
torch_prologue "run_torch_deadpeer.sh BUILD_DIR" "${1:-}" 2
torch_env
unset LD_PRELOAD  # Braid comes in by LD_PRELOAD, per run, only (torch_deadpeer.py sets it)
args=(matrix --out "$out" --lib "$lib")
[ "${TORCH_BRAID_ONLY:-0}" = 1 ] || args+=(--nccl)
[ -n "${TORCH_DEADPEER_SEED:-}" ] && args+=(--seed "$TORCH_DEADPEER_SEED")
[ -n "${TORCH_DEADPEER_MODES:-}" ] && args+=(--modes "$TORCH_DEADPEER_MODES")
python3 "$here/torch_deadpeer.py" "${args[@]}"
