#!/bin/sh
# Runs a command as if its MPI rank were a machine of its own: BRAID_HOSTID (Braid) and
# NCCL_HOSTID (NVIDIA's NCCL) name a host per rank, so ranks on one machine, even on one
# GPU, talk through the network transport. The perf tools honour the same variables when
# they pick a GPU, so every rank takes the first visible GPU.
#   mpirun -np 2 tools/as-host.sh build/perf/all_reduce_perf -b 8 -e 1G -f 4 -g 1
# AS_HOST_GPUS=N (N GPUs on the machine) gives rank r the GPU r % N alone (CUDA_VISIBLE_DEVICES),
# so each emulated host has a GPU and PCIe link of its own, as two real hosts would.
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-}}}
if [ -z "$rank" ]; then
  echo "as-host.sh: no MPI rank in the environment (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK)" >&2
  exit 2
fi
export BRAID_HOSTID="as-host$rank" NCCL_HOSTID="as-host$rank"
if [ -n "${AS_HOST_GPUS:-}" ]; then
  [ "$AS_HOST_GPUS" -ge 1 ] 2>/dev/null || { echo "as-host.sh: AS_HOST_GPUS=$AS_HOST_GPUS is not a GPU count" >&2; exit 2; }
  export CUDA_VISIBLE_DEVICES=$((rank % AS_HOST_GPUS))
fi
exec "$@"
