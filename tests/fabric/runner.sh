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

# Two nodes: each sees its own address and its peer's, rxe0 is ACTIVE with the
# IPv4-mapped GID at index 1, the peer answers over the wire, the caller's
# directory and environment come along; node1's status (5) comes back.
probe="$here/runner-probe.sh"
out="$(cd "$here" && EXPECT_CWD="$here" CALLER_VAR="a b" "$vm" --nodes 2 --timeout 300 \
  --node0 "$probe" --node1 "$probe && exit 5" 2>&1)"
rc=$?
echo "$out"
check 5 "$rc" "two nodes: probes, then node1's exit status"
[[ "$(grep -c 'are right' <<<"$out")" == 2 ]] || { echo "FAILED: a node's probe did not pass"; fail=1; }
grep -q '^\[node0\] node 0:' <<<"$out" && grep -q '^\[node1\] node 1:' <<<"$out" ||
  { echo "FAILED: output lines lack their node's name"; fail=1; }

# One node: exit 77 (skipped) is kept.
"$vm" --nodes 1 --timeout 300 -- bash -c 'exit 77'
check 77 $? "one node: a skip is kept"

# A timeout kills the VM and says so.
"$vm" --nodes 1 --timeout 2 -- sleep 600
check 124 $? "one node: timeout"
exit "$fail"
