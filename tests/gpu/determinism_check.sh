#!/bin/sh
# BRAID_DETERMINISTIC=1: the determinism suite's outputs (gpu_coll --suite determinism, checked
# against the reference, then hashed) are bit for bit the same under every setting below:
# protocol, channel cap, chunk size, two ranks' ring instead of their pair exchange (Simple's
# default), the tree or the direct algorithm asked for, the copy-engine exchange. The same
# runs with the mode off are reported, not judged (on two ranks every order gives the same
# bits; from three on, they may differ).
# Usage: determinism_check.sh GPU_COLL MODE NRANKS [OUTDIR]; exits 77 when gpu_coll does.
set -u
bin=$1; mode=$2; n=$3; out=${4:-${TMPDIR:-/tmp}/braid-determinism.$$}
mkdir -p "$out"
settings='BRAID_PROTO=Simple NCCL_MAX_NCHANNELS=8
BRAID_PROTO=Simple NCCL_MAX_NCHANNELS=1
BRAID_PROTO=Simple NCCL_MAX_NCHANNELS=3 BRAID_CHUNKSIZE=65536
BRAID_PROTO=LL NCCL_MAX_NCHANNELS=4
BRAID_PROTO=LL NCCL_MAX_NCHANNELS=1
BRAID_PROTO=LL128 NCCL_MAX_NCHANNELS=4
BRAID_PROTO=Simple BRAID_P2P_PAIR_MIN=-1 NCCL_MAX_NCHANNELS=4
BRAID_CHUNKSIZE=131072
BRAID_ALGO=Tree
BRAID_ALGO=Direct
BRAID_CE_MIN_BYTES=1'
nsettings=$(echo "$settings" | wc -l)
fail=0
for det in 1 0; do
  i=0
  echo "$settings" | while read -r s; do
    i=$((i + 1))
    log=$out/det$det.$i.log
    # shellcheck disable=SC2086
    env $s BRAID_DETERMINISTIC=$det NCCL_NVLS_ENABLE=0 "$bin" --mode "$mode" --nranks "$n" \
      --suite determinism --seed 20261123 > "$log" 2>&1
    rc=$?
    [ $rc -eq 77 ] && { echo "skipped: $(tail -1 "$log")"; exit 77; }
    grep '^hash ' "$log" | sort > "$out/det$det.$i.hash"
    echo "BRAID_DETERMINISTIC=$det $s: rc=$rc, $(wc -l < "$out/det$det.$i.hash") hashes, $(md5sum < "$out/det$det.$i.hash" | cut -c1-12)"
    [ $rc -eq 0 ] || { echo "FAIL: the run failed:"; grep -E 'FAIL|cases' "$log" | head -5; exit 1; }
  done || { rc=$?; [ $rc -eq 77 ] && exit 77; fail=1; }
done
want=$((8 * n)) # the suite's 8 cases, one hash per rank each
for f in "$out"/det1.*.hash; do
  [ "$(wc -l < "$f")" -eq $want ] || { echo "FAIL: $f has $(wc -l < "$f") hashes, expected $want"; fail=1; }
  cmp -s "$f" "$out/det1.1.hash" || { echo "FAIL: deterministic outputs differ: $f vs det1.1.hash:";
    diff "$out/det1.1.hash" "$f" | head -6; fail=1; }
done
off=$(cat "$out"/det0.*.hash | sort -u | wc -l)
echo "with BRAID_DETERMINISTIC=0: $off distinct (case, rank, hash) lines over the settings ($want when all agree)"
[ $fail -eq 0 ] && echo "determinism OK: $want outputs identical under each of the $nsettings settings"
exit $fail
