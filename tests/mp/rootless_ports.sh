#!/bin/sh
# BRAID_COMM_ID with a port the ranks' own listeners could be given: each run of
# "bootstrap_env_test rootless" goes in a fresh network namespace whose ephemeral port range is
# 60 ports around the test's rendezvous port, so a rank that started before rank 0 would often
# be handed that port for its listener and answer the others in the root's place (the job
# then failed with "not a rank-to-rank hello"). The library never listens on it. Needs root
# (unshare -n) and `ip`; else exits 77, which CTest reports as skipped.
#   rootless_ports.sh BOOTSTRAP_ENV_TEST [RUNS]
exe=${1:?usage: rootless_ports.sh BOOTSTRAP_ENV_TEST [RUNS]}
runs=${2:-10}
command -v unshare >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 || { echo "SKIP: no unshare or ip"; exit 77; }
unshare -n true 2>/dev/null || { echo "SKIP: unshare -n is not permitted here"; exit 77; }
log=$(mktemp)
i=1
while [ "$i" -le "$runs" ]; do
  if ! unshare -n sh -c 'ip link set lo up &&
      echo "40000 40059" > /proc/sys/net/ipv4/ip_local_port_range && exec "$0" rootless' "$exe" \
      > "$log" 2>&1; then
    echo "run $i of $runs failed:"; grep -v '^rank ' "$log" | tail -20; rm -f "$log"; exit 1
  fi
  i=$((i + 1))
done
rm -f "$log"
echo "$runs runs in fresh namespaces with 60 ephemeral ports: all passed"
