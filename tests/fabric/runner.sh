#!/usr/bin/env bash
# Checks the Soft-RoCE runner itself: what each command sees (environment,
# working directory, the wire between the nodes, rxe0) and how exit statuses
# come back (a failure, a skip, a timeout).
set -uo pipefail
vm="$(readlink -f "${1:?path to rdx-vm}")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fail=0
check() {
  local want="$1" got="$2" what="$3"
  if [[ "$got" == "$want" ]]; then
    echo "ok: $what (exit $got)"
  else
    echo "FAILED: $what: exit $got, expected $want"
    fail=1
  fi
}

if ! missing="$("$(dirname "$vm")/rdx-vm-check")"; then
  if [[ "${RDX_REQUIRE_FABRIC:-0}" == 1 ]]; then
    echo "runner.sh: FAILED: cannot boot Soft-RoCE VMs: $missing"
    exit 1
  fi
  echo "runner.sh: SKIPPED: cannot boot Soft-RoCE VMs: $missing"
  exit 77
fi

# The checks below run twice: VMs booted for each command, then pooled VMs
# (RDX_VM_POOL, as scripts/quickstart.sh runs the test suites) in a pool of
# this script's own.
pool="$(mktemp -d /tmp/rdx-runner-pool.XXXXXX)"
trap '"$vm" --pool-stop "$pool"' EXIT
probe="$here/runner-probe.sh"
for mode in booted pooled; do
  if [[ "$mode" == booted ]]; then unset RDX_VM_POOL; else export RDX_VM_POOL="$pool"; fi

  # Two nodes: each sees its own address and its peer's, rxe0 is ACTIVE with
  # the IPv4-mapped GID at index 1, the peer answers over the wire, the
  # caller's directory and environment come along; node1's status (5) comes
  # back.
  out="$(cd "$here" && EXPECT_CWD="$here" CALLER_VAR="a b" "$vm" --nodes 2 --timeout 300 \
    --node0 "$probe" --node1 "$probe && exit 5" 2>&1)"
  rc=$?
  echo "$out"
  check 5 "$rc" "$mode, two nodes: probes, then node1's exit status"
  [[ "$(grep -c 'are right' <<<"$out")" == 2 ]] || { echo "FAILED: $mode: a node's probe did not pass"; fail=1; }
  grep -q '^\[node0\] node 0:' <<<"$out" && grep -q '^\[node1\] node 1:' <<<"$out" ||
    { echo "FAILED: $mode: output lines lack their node's name"; fail=1; }

  # One node: exit 77 (skipped) is kept.
  "$vm" --nodes 1 --timeout 300 -- bash -c 'exit 77'
  check 77 $? "$mode, one node: a skip is kept"

  # A timeout stops the VM and says so.
  "$vm" --nodes 1 --timeout 4 -- sleep 600
  check 124 $? "$mode, one node: timeout"
done

# A pooled VM runs the next command as a fresh boot leaves it: a command that
# leaves a process, a file in /tmp and /dev/shm, netem on eth0, a lower MTU,
# rxe0's counters raised and then rxe0 deleted is followed, in the same VM
# (the same boot id), by one that sees none of it. Then the pool stops and no VM is left.
export RDX_VM_POOL="$pool"
mess='cat /proc/sys/kernel/random/boot_id; sleep 900 & touch /tmp/left /dev/shm/left;
  ibv_rc_pingpong -d rxe0 -g 1 -n 5 >/dev/null 2>&1 & srv=$!;
  for i in $(seq 50); do ibv_rc_pingpong -d rxe0 -g 1 -n 5 127.0.0.1 >/dev/null 2>&1 && break; sleep 0.2; done;
  wait $srv; echo "sent $(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts)";
  tc qdisc replace dev eth0 root netem loss 1% && ip link set eth0 mtu 1000 && rdma link delete rxe0'
look='cat /proc/sys/kernel/random/boot_id; pgrep -x sleep && echo "a process survived";
  ls -A /tmp /dev/shm | grep -q left && echo "a file survived";
  tc qdisc show dev eth0 | grep -q netem && echo "netem survived";
  grep -qx 1500 /sys/class/net/eth0/mtu || echo "the MTU survived";
  rdma link show rxe0/1 | grep -q "state ACTIVE" || echo "rxe0 is not ACTIVE";
  echo "sent $(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts)"'
first="$("$vm" --nodes 1 --timeout 300 -- bash -c "$mess" 2>&1)"
check 0 $? "pooled: a command that leaves a mess"
second="$("$vm" --nodes 1 --timeout 300 -- bash -c "$look" 2>&1)"
check 0 $? "pooled: the next command"
echo "$first"
echo "$second"
[[ "$(head -n 1 <<<"$first")" == "$(head -n 1 <<<"$second")" ]] ||
  { echo "FAILED: pooled: the second command ran in another VM"; fail=1; }
grep -q '^\[node0\] sent [1-9]' <<<"$first" || { echo "FAILED: pooled: the first command's traffic raised no counter"; fail=1; }
grep -q '^\[node0\] sent 0$' <<<"$second" || { echo "FAILED: pooled: rxe0 is not a new device"; fail=1; }
if grep -q 'survived\|not ACTIVE' <<<"$second"; then
  echo "FAILED: pooled: the VM was not made fresh"
  fail=1
fi
# A VM that cannot make itself fresh after a command (eth0 renamed away)
# stops; the next command boots a new one and runs there, with a note.
"$vm" --nodes 1 --timeout 300 -- bash -c 'ip link set eth0 down && ip link set eth0 name gone0'
check 0 $? "pooled: a command that renames eth0 away"
third="$("$vm" --nodes 1 --timeout 300 -- bash -c 'cat /proc/sys/kernel/random/boot_id; ip -br link show eth0' 2>&1)"
check 0 $? "pooled: the next command, in a new VM"
echo "$third"
grep -q 'booting anew' <<<"$third" || { echo "FAILED: pooled: no note of the new boot"; fail=1; }
grep -q "$(head -n 1 <<<"$second" | sed 's/^\[node0\] //')" <<<"$third" &&
  { echo "FAILED: pooled: the command after a stopped VM ran in the old boot"; fail=1; }
if ((fail)); then
  for c in "$pool"/*/slot*/console.log; do
    [[ -s "$c" ]] && { echo "--- $c"; cat "$c"; }
  done
fi
"$vm" --pool-stop "$pool"
if pgrep -f "rdx-vm --keeper $pool" >/dev/null || [[ -e "$pool" ]]; then
  echo "FAILED: --pool-stop left a keeper or the pool's folder"
  fail=1
fi
trap - EXIT
exit "$fail"
