#!/bin/sh
# braid-info --topo as a user runs it, on fixture topologies (no GPU needed): the
# report names the GPUs, the paths (to NICs too), the rings and trees and the
# tuning choices; --dot writes a Graphviz graph that names every GPU and link;
# BRAID_TOPO_DUMP_FILE receives the topology, which braid-info reads back to the
# same report; a missing or malformed file fails with its name and line.
# Usage: braid_info_topo_test.sh BRAID_INFO FIXTURE_DIR
set -u
info=$1; fixtures=$2
tmp=$(mktemp -d /tmp/braid_info_topo.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check FILE PATTERN WHAT
  grep -q -e "$2" "$1" || { echo "FAIL: $3: no '$2' in $1:"; sed 's/^/  | /' "$1" | head -40; fail=1; }
}

# (a) 8x H100 with 8 NICs: PIX to the NICs of the GPU's switch, 32 ring channels, a dot file.
"$info" --topo --topo-file "$fixtures/dgx_h100_8nic.xml" --dot "$tmp/a.dot" >"$tmp/a.txt" 2>&1 ||
  { echo "FAIL: braid-info --topo on dgx_h100_8nic.xml exited $?"; cat "$tmp/a.txt"; fail=1; }
check "$tmp/a.txt" "^8 GPUs" "GPU count"
check "$tmp/a.txt" "Paths between ranks" "path matrix"
check "$tmp/a.txt" " NVL   396" "NVLink paths"
check "$tmp/a.txt" "mlx5_0:PIX 50 mlx5_1:PIX 50 mlx5_2:PHB" "GPU 0 to NIC paths"
check "$tmp/a.txt" "^Rings: 32 channels x 12.0 GB/s" "rings"
check "$tmp/a.txt" "^Trees: 32 channels" "trees"
check "$tmp/a.txt" "AllReduce" "tuning"
check "$tmp/a.txt" "Graphviz picture written to $tmp/a.dot" "dot notice"
[ -s "$tmp/a.dot" ] || { echo "FAIL: --dot wrote nothing"; fail=1; }
check "$tmp/a.dot" "^graph topology {" "dot header"
check "$tmp/a.dot" '"GPU/0000:19:00.0" -- "NVS/0"' "dot NVLink edge"
check "$tmp/a.dot" '"NIC/0000:1a:00.0" -- "NET/mlx5_0"' "dot NIC edge"
check "$tmp/a.dot" "^}" "dot closes"
[ "$(grep -c '\[style=filled' "$tmp/a.dot")" -ge 30 ] || { echo "FAIL: dot lists too few devices"; fail=1; }

# (b) PCIe only, two sockets: SYS between sockets; --dot alone implies --topo.
"$info" --topo-file "$fixtures/pcie_4gpu_2socket.xml" --dot "$tmp/b.dot" >"$tmp/b.txt" 2>&1 ||
  { echo "FAIL: braid-info on pcie_4gpu_2socket.xml exited $?"; fail=1; }
check "$tmp/b.txt" " SYS    10" "socket path"
check "$tmp/b.txt" "CPU/0 <-> CPU/1: 10.0 GB/s" "socket link"
check "$tmp/b.dot" "^graph topology {" "dot header (b)"

# The dump round trip: BRAID_TOPO_FILE in, BRAID_TOPO_DUMP_FILE out, the dump back in.
BRAID_TOPO_FILE="$fixtures/h200x2_nvswitch.xml" BRAID_TOPO_DUMP_FILE="$tmp/c.xml" \
  "$info" --topo >"$tmp/c.txt" 2>&1 || { echo "FAIL: BRAID_TOPO_FILE run exited $?"; fail=1; }
check "$tmp/c.txt" "written to $tmp/c.xml" "dump notice"
"$info" --topo --topo-file "$tmp/c.xml" >"$tmp/c2.txt" 2>&1 || { echo "FAIL: dump reload"; fail=1; }
sed -n '/^Paths between/,$p' "$tmp/c.txt" >"$tmp/c.tail"
sed -n '/^Paths between/,$p' "$tmp/c2.txt" >"$tmp/c2.tail"
cmp -s "$tmp/c.tail" "$tmp/c2.tail" || { echo "FAIL: the dump reports differently:"; diff "$tmp/c.tail" "$tmp/c2.tail" | head; fail=1; }

# Errors: file and line, exit status 1, never a crash.
printf '<system version="1">\n<cpu numaid="0">\n</system>\n' >"$tmp/bad.xml"
"$info" --topo --topo-file "$tmp/bad.xml" >"$tmp/bad.txt" 2>&1
[ $? -eq 1 ] || { echo "FAIL: malformed file: exit status not 1"; fail=1; }
check "$tmp/bad.txt" "$tmp/bad.xml:3: malformed XML: </system> closes <cpu> opened at line 2: expected </cpu>" "malformed"
"$info" --topo --topo-file "$tmp/none.xml" >"$tmp/none.txt" 2>&1
[ $? -eq 1 ] || { echo "FAIL: missing file: exit status not 1"; fail=1; }
check "$tmp/none.txt" "$tmp/none.xml" "missing file named"

[ $fail -eq 0 ] && echo "braid-info --topo OK"
exit $fail
