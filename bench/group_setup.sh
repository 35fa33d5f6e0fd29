#!/bin/bash
# bench/group_setup.sh [--ranks "8 16 32"] [--block BYTES] [--iters N] [--modes "full on-demand"]
#                      [--extra "ARGS"] [--out FILE]
# Set-up time of rdx::group::mesh and all-to-all time against
# the number of ranks, with examples/alltoall under torchrun's variables:
# all ranks in one Soft-RoCE VM, then half in each of the two VMs. Prints a
# markdown table (and writes it to --out): per N, the slowest rank's set-up
# and its steps, and the median all-to-all time and bandwidth per rank, for
# a full mesh made at set-up and for pairs connected on first use
# (--on-demand), whose first all-to-all does the connecting: "ready" is
# set-up plus the first all-to-all, the slowest rank's. --extra passes more
# alltoall flags (-e). Needs build/release (examples/alltoall) and the VMs (cmake/softroce/rdx-vm).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ranks="8 16 32" block=16K iters=5 out="" modes="full on-demand" extra=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --block) block=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --extra) extra=$2; shift 2 ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "group_setup.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
a2a=$root/build/release/examples/alltoall
launch=$root/tests/group/launch.sh
vm=$root/cmake/softroce/rdx-vm
[ -x "$a2a" ] || { echo "group_setup.sh: build examples/alltoall first (cmake --build build/release --target alltoall)" >&2; exit 1; }
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
base="-s $block -n $iters -t 120 --ack-timeout 500 -q $extra"
# From the ranks' lines: slowest set-up and its steps, median of the medians, mean MB/s.
summarize() {
  awk -v n="$2" -v where="$3" -v mode="$4" '
    /set-up .* ms \(rendezvous/ {
      match($0, /set-up [0-9.]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
      match($0, /rendezvous [0-9.]+/); rv = substr($0, RSTART + 11, RLENGTH - 11) + 0
      match($0, /connect [0-9.]+/); c = substr($0, RSTART + 8, RLENGTH - 8) + 0
      match($0, /median [0-9.]+/); m[++k] = substr($0, RSTART + 7, RLENGTH - 7) + 0
      match($0, /sent [0-9.]+/); bw += substr($0, RSTART + 5, RLENGTH - 5)
      match($0, /first all-to-all [0-9.]+/); f = substr($0, RSTART + 17, RLENGTH - 17) + 0
      if (s + f > ready) ready = s + f
      if (s > worst) { worst = s; wrv = rv; wc = c }
      if ($0 ~ /every byte right/) ok++
    }
    END {
      for (i = 2; i <= k; i++) { v = m[i]; for (j = i - 1; j >= 1 && m[j] > v; j--) m[j + 1] = m[j]; m[j + 1] = v }
      med = k ? m[int((k + 1) / 2)] : 0
      printf "| %d | %s | %s | %.0f | %.0f | %.0f | %.0f | %.1f | %.2f | %d of %d |\n", n, where, mode, worst, wrv, wc, ready, med, k ? bw / k : 0, ok, n
    }' "$1"
}
table="| ranks | where | connections | set-up, slowest rank (ms) | its rendezvous (ms) | its connecting (ms) | ready: set-up + first all-to-all, slowest (ms) | all-to-all median (ms) | sent per rank (MB/s) | ranks with every byte right |
|---|---|---|---|---|---|---|---|---|---|"
for mode in $modes; do
args=$base
[ "$mode" = on-demand ] && args="$base --on-demand"
for n in $ranks; do
  echo "==> $n ranks in one VM ($mode)" >&2
  flock /tmp/rdx-vm.lock "$vm" --timeout 600 -- "$launch" --nproc "$n" --master 127.0.0.1:29530 -- "$a2a" $args \
    >"$logs/one-$n.log" 2>&1 || echo "(some ranks failed: see below)" >&2
  row=$(summarize "$logs/one-$n.log" "$n" "one VM" "$mode")
  echo "$row" >&2
  table+=$'\n'"$row"
  half=$((n / 2))
  echo "==> $n ranks across the two VMs ($half each, $mode)" >&2
  flock /tmp/rdx-vm.lock "$vm" --nodes 2 --timeout 600 \
    --node0 "$launch --nproc $half --nnodes 2 --node-rank 0 --master \$RDX_NODE_ADDR:29531 -- $a2a $args" \
    --node1 "$launch --nproc $half --nnodes 2 --node-rank 1 --master \$RDX_PEER_ADDR:29531 -- $a2a $args" \
    >"$logs/two-$n.log" 2>&1 || echo "(some ranks failed: see below)" >&2
  row=$(summarize "$logs/two-$n.log" "$n" "two VMs" "$mode")
  echo "$row" >&2
  table+=$'\n'"$row"
  grep -h "failure(s)" "$logs/one-$n.log" "$logs/two-$n.log" >&2 || true
done
done
echo "$table"
[ -z "$out" ] || echo "$table" >"$out"
