#!/bin/sh
# Runs a command as if its MPI rank's GPU were the rank-th GPU of GPU_COLL_BUSIDS (bus ids of
# BRAID_TOPO_FILE's GPUs, comma-separated): BRAID_TOPO_BUSID, a testing mode of the library, so
# ranks sharing one GPU take the intra-node path (P2P, SHM) as the GPUs of that topology would.
# The perf tools give every such rank the first GPU. Correctness and relative costs only: the
# ranks share one GPU's SMs and memory, and no link.
#   GPU_COLL_BUSIDS=0000:19:00.0,0000:9b:00.0 BRAID_TOPO_FILE=... mpirun -np 2 tools/as-gpu.sh CMD
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-}}}
if [ -z "$rank" ] || [ -z "${GPU_COLL_BUSIDS:-}" ]; then
  echo "as-gpu.sh: needs an MPI rank (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK) and GPU_COLL_BUSIDS" >&2
  exit 2
fi
id=$(echo "$GPU_COLL_BUSIDS" | cut -d, -f$((rank + 1)))
if [ -z "$id" ]; then
  echo "as-gpu.sh: rank $rank has no bus id in GPU_COLL_BUSIDS=$GPU_COLL_BUSIDS" >&2
  exit 2
fi
export BRAID_TOPO_BUSID="$id"
exec "$@"
