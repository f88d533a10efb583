#!/bin/sh
# Runs gpu_coll on emulated hosts (--mode hosts: every host a process group of its own, so the
# traffic between hosts goes through the network transport) with one network backend forced,
# and passes only when the run passed AND its log shows that this backend carried that traffic:
#   - gpu_coll exited 0 (every case passed; a crash or a failed case fails);
#   - "NET/BACKEND selected" was logged by at least two processes (both ends of a connection),
#     by every process with one GPU per host, and no other backend was selected anywhere;
#   - ring channels connected via NET (with one GPU per host: never via anything else);
#   - every GPU/NIC pair staged through host memory ("GPUDirect RDMA off", never "on"): the
#     backends tested so read or copy the data with the CPU; with EXPECT_GDR=on the opposite:
#     every pair took GPU memory directly ("on", never "off");
#   - EXPECT_TREE=1: at least one collective on all the ranks ran as a Tree (with two hosts or
#     more every tree spans them: chains inside a host, binary trees between the hosts' heads).
# The environment forces the backend (NCCL_NET, with BRAID_IB_VERBS_LIB or NCCL_NET_PLUGIN where
# needed); this script only checks what the library logged.
#
# Usage: expect_net.sh BACKEND HOSTS GPUS_PER_HOST GPU_COLL [ARGS...]
#   BACKEND        the name in the library's "NET/<name> selected" line: Socket, IB, OFI, Plugin
#   HOSTS x GPUS_PER_HOST ranks (--nranks, --ranks-per-host). With one GPU per host every rank
#   needs a GPU of its own (GPU_COLL_GPU_PER_RANK=1); when fewer than HOSTS are visible the run
#   is 2 hosts instead, and with fewer than 2 it is skipped. gpu_coll's skip (77) passes through.
# OFI: a provider that cannot run here (no libfabric.so.1, no such provider) makes the library
# refuse NCCL_NET=OFI at init; the next of EXPECT_OFI_PROVIDERS (space-separated, default
# "tcp;ofi_rxm tcp sockets"; BRAID_OFI_PROVIDER when set) is tried, and with none left the test
# is skipped (77) with the library's reasons. With EXPECT_GDR=on a provider whose run logged
# "net OFI: GPU memory off: <why>" (no FI_HMEM, or no GPU memory registered at init) counts as
# one that cannot run: the next is tried, and with none left the test is skipped with the whys.
set -u
[ $# -ge 4 ] || {
  echo "usage: expect_net.sh BACKEND HOSTS GPUS_PER_HOST GPU_COLL [ARGS...]" >&2
  exit 2
}
backend=$1
hosts=$2
per_host=$3
shift 3
log=${TMPDIR:-/tmp}/braid-expect-net.$$.log
trap 'rm -f "$log"' EXIT
subsys=INIT,NET
[ "${EXPECT_TREE:-0}" = 1 ] && subsys=INIT,NET,TUNING
[ "$per_host" -eq 1 ] && export GPU_COLL_GPU_PER_RANK=1

# run PROVIDER COMMAND...: one gpu_coll run into $log (BRAID_OFI_PROVIDER=PROVIDER unless
# empty); sets rc.
run() {
  prov=$1
  shift
  if [ -n "$prov" ]; then
    BRAID_OFI_PROVIDER=$prov BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=$subsys "$@" > "$log" 2>&1
  else
    BRAID_DEBUG=INFO BRAID_DEBUG_SUBSYS=$subsys "$@" > "$log" 2>&1
  fi
  rc=$?
}

# attempt: the run, over each OFI provider in turn for OFI; sets rc (77 when no provider could).
attempt() {
  nranks=$((hosts * per_host))
  echo "== $hosts host(s) x $per_host GPU(s) over NET/$backend"
  if [ "$backend" != OFI ]; then
    run "" "$@" --mode hosts --nranks "$nranks" --ranks-per-host "$per_host"
    return
  fi
  reasons=
  if [ -n "${BRAID_OFI_PROVIDER:-}" ]; then
    providers=$BRAID_OFI_PROVIDER
  else
    providers=${EXPECT_OFI_PROVIDERS:-"tcp;ofi_rxm tcp sockets"}
  fi
  set -f # the providers are split on spaces only, never expanded as file names
  for prov in $providers; do
    run "$prov" "$@" --mode hosts --nranks "$nranks" --ranks-per-host "$per_host"
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && grep -q "the OFI backend cannot run here" "$log"; then
      why=$(grep -m1 "the OFI backend cannot run here" "$log" | sed 's/.*cannot run here: //')
      echo "BRAID_OFI_PROVIDER=$prov: the OFI backend cannot run here: $why"
      reasons="$reasons; $prov: $why"
      continue
    fi
    if [ "${EXPECT_GDR:-off}" = on ] && [ "$rc" -ne 77 ] && grep -q "net OFI: GPU memory off: " "$log"; then
      why=$(grep -m1 "net OFI: GPU memory off: " "$log" | sed 's/.*GPU memory off: //; s/; staging every message through host memory//')
      echo "BRAID_OFI_PROVIDER=$prov: no GPU memory path: $why"
      reasons="$reasons; $prov: $why"
      continue
    fi
    echo "BRAID_OFI_PROVIDER=$prov"
    set +f
    return
  done
  set +f
  if [ "${EXPECT_GDR:-off}" = on ]; then
    echo "SKIP: no libfabric provider of \"$providers\" runs the OFI backend on GPU memory here:${reasons#;}"
  else
    echo "SKIP: no libfabric provider of \"$providers\" can run the OFI backend here:${reasons#;}"
  fi
  rc=77
}

attempt "$@"
if [ "$rc" -eq 77 ] && [ "$per_host" -eq 1 ] && [ "$hosts" -gt 2 ] &&
  grep -q "^SKIP: [0-9]* GPU(s) visible, $((hosts * per_host)) needed" "$log"; then
  grep -m1 "^SKIP: " "$log"
  echo "fewer GPUs than $hosts hosts of one GPU each: 2 hosts x 1 GPU instead"
  hosts=2
  attempt "$@"
fi
grep -v "BRAID INFO" "$log" | tail -20
if [ "$rc" -eq 77 ]; then
  grep -q "^SKIP: " "$log" && grep -m1 "^SKIP: " "$log"
  exit 77
fi
# The failed cases by name (the tail above may not reach them).
grep "^FAIL" "$log" | head -40

nranks=$((hosts * per_host))
# The processes that selected this backend, by pid (the log line's second field).
chose=$(grep "BRAID INFO .*NET/$backend selected: " "$log" | cut -d: -f2 | sort -u | wc -l)
others=$(grep "BRAID INFO .*NET/[A-Za-z0-9_]* selected: " "$log" | grep -vc "NET/$backend selected: ")
vianet=$(grep -c "ring channels connected via NET " "$log")
viaother=$(grep "ring channels connected via " "$log" | grep -vc "connected via NET ")
gdr_off=$(grep -c "GPUDirect RDMA off" "$log")
gdr_on=$(grep -c "GPUDirect RDMA on" "$log")
trees=0
[ "${EXPECT_TREE:-0}" = 1 ] && trees=$(grep -c " on $nranks ranks: Tree/" "$log")
grep -m1 "NET/$backend selected: " "$log" | sed 's/.*BRAID INFO [A-Z]* //'
grep "GPUDirect RDMA o[nf]" "$log" | sed 's/.*BRAID INFO [A-Z]* //' | sort -u | head -8
grep "BRAID INFO .*NET/[A-Za-z0-9_]* selected: " "$log" | grep -v "NET/$backend selected: " |
  sed 's/.*BRAID INFO [A-Z]* //' | sort -u | head -5
[ "$rc" -eq 0 ] || { echo "FAIL: gpu_coll exited with status $rc"; exit 1; }
echo "$chose process(es) selected NET/$backend; $vianet ring connection line(s) via NET," \
  "$viaother via another transport; GPUDirect RDMA off $gdr_off, on $gdr_on"
need=2
[ "$per_host" -eq 1 ] && need=$nranks
fail=0
[ "$chose" -ge "$need" ] ||
  { echo "FAIL: $chose process(es) selected NET/$backend, $need expected"; fail=1; }
[ "$others" -eq 0 ] ||
  { echo "FAIL: $others log line(s) show another network backend selected"; fail=1; }
[ "$vianet" -ge 1 ] || { echo "FAIL: no ring channel connected via NET"; fail=1; }
[ "$per_host" -gt 1 ] || [ "$viaother" -eq 0 ] ||
  { echo "FAIL: ring channels between hosts of one GPU connected via another transport"; fail=1; }
if [ "${EXPECT_GDR:-off}" = on ]; then
  if [ "$gdr_on" -eq 0 ] || [ "$gdr_off" -ne 0 ]; then
    echo "FAIL: every GPU/NIC pair must take GPU memory directly (GPUDirect RDMA on)"
    fail=1
  fi
elif [ "$gdr_off" -eq 0 ] || [ "$gdr_on" -ne 0 ]; then
  echo "FAIL: every GPU/NIC pair must stage through host memory (GPUDirect RDMA off)"
  fail=1
fi
if [ "${EXPECT_TREE:-0}" = 1 ]; then
  echo "$trees collective call(s) on $nranks ranks ($hosts hosts) ran as a Tree"
  [ "$trees" -ge 1 ] || { echo "FAIL: no collective ran as a Tree across the hosts"; fail=1; }
fi
[ "$fail" -eq 0 ] && echo "passed: NET/$backend carried the traffic between $hosts hosts"
exit "$fail"
