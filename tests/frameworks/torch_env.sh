# shellcheck shell=bash disable=SC2154  # np: the runner's number of ranks
# What the PyTorch runners (run_torch.sh, run_torch_symm.sh, run_torch_deadpeer.sh) share,
# sourced by each after `set -uo pipefail`:
#   torch_prologue USAGE BUILD_DIR N  Braid's library, PyTorch and N GPUs, or the runner's exit
#   torch_need_gpus N                 exit 77 unless PyTorch sees N GPUs
#   torch_env                         the environment every run starts from
#   torch_run ...                     one script on $np ranks, its output kept and summarised
# Braid comes in by LD_PRELOAD of BUILD_DIR/src/libnccl.so.2, per run, and by nothing else:
# libtorch_cuda.so needs "libnccl.so.2", and the dynamic linker takes the preloaded object of
# that SONAME instead of the one its RPATH points at (LD_LIBRARY_PATH does not win over an
# RPATH). The runs on PyTorch's own NCCL must see no Braid.

# torch_prologue USAGE BUILD_DIR N: sets build (BUILD_DIR's absolute path), out ($TORCH_OUT,
# made if missing, else a new temporary directory), lib (Braid's libnccl.so.2) and ngpu (the
# GPUs PyTorch sees). Exit 1 (with USAGE where BUILD_DIR is not given) where the library is
# missing; 77 (CTest's skip) where python3 cannot import torch or PyTorch sees fewer than N GPUs.
torch_prologue() {
  build=$(cd "${2:?usage: $1}" && pwd)
  out=${TORCH_OUT:-$(mktemp -d)}
  mkdir -p "$out"
  lib=$build/src/libnccl.so.2
  [ -e "$lib" ] || { echo "no $lib: build Braid first" >&2; exit 1; }
  ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) || {
    echo "SKIP: python3 cannot import torch"; exit 77; }
  torch_need_gpus "$3"
}

# torch_need_gpus N: exit 77 (CTest's skip) unless PyTorch sees at least N GPUs.
torch_need_gpus() {
  [ "${ngpu:-0}" -ge "$1" ] && return 0
  if [ "$1" -le 1 ]; then
    echo "SKIP: PyTorch sees no GPU"
  else
    echo "SKIP: $1 ranks need $1 GPUs, PyTorch sees ${ngpu:-0}"
  fi
  exit 77
}

# torch_env: no NVLink multicast in NCCL, one OpenMP thread a rank, and no LD_LIBRARY_PATH
# (after the checks above, which may need it to import torch).
torch_env() {
  export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1
  unset LD_LIBRARY_PATH
}

# torch_launch SCRIPT ARGS...: SCRIPT on $np ranks, through torchrun or, with TORCH_ISOLATED=1,
# one process per GPU: CUDA_VISIBLE_DEVICES set per rank to the i-th GPU of the caller's list
# (as SLURM's --gpus-per-task=1 or a Kubernetes pod hands them out), torchrun's variables set
# here. Runs in a shell of its own (torch_run), so that timeout can stop it.
# shellcheck disable=SC2317  # called by name in torch_run's inner shell
torch_launch() {
  local script=$1; shift
  local port=$((29500 + RANDOM % 1000))
  if [ "${TORCH_ISOLATED:-0}" != 1 ]; then
    python3 -m torch.distributed.run --nproc-per-node "$np" --master-port "$port" \
      "$script" "$@"
    return
  fi
  local gpus pids=() rc=0 r
  IFS=, read -r -a gpus <<< "${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((np - 1)))}"
  for ((r = 0; r < np; r++)); do
    CUDA_VISIBLE_DEVICES=${gpus[r]:?fewer GPUs than ranks} RANK=$r LOCAL_RANK=0 WORLD_SIZE=$np \
      LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      python3 "$script" "$@" &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  return "$rc"
}

# torch_run LABEL LIMIT PATTERN SCRIPT [VAR=VALUE...] -- [ARGS...]: SCRIPT ARGS on $np ranks
# (torch_launch) with the VAR=VALUE environment, stopped after LIMIT seconds. Its output goes to
# $out/LABEL.log; the lines of it that match PATTERN (an extended regular expression) are
# printed, and the last 30 lines too where it failed. Returns its exit status.
torch_run() {
  local label=$1 limit=$2 pattern=$3 script=$4 vars=()
  shift 4
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  env ${vars[@]+"${vars[@]}"} timeout -k 10 "$limit" \
    bash -c "$(declare -f torch_launch); np=$np torch_launch \"\$@\"" \
    torch_launch "$script" "$@" > "$out/$label.log" 2>&1
  local rc=$?
  echo "== $label: rc=$rc"
  grep -E "$pattern" "$out/$label.log"
  [ $rc -eq 0 ] || tail -30 "$out/$label.log"
  return $rc
}
