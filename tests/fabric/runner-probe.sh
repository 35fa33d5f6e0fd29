#!/usr/bin/env bash
# Runs in each VM of runner.sh: checks what rdx-vm promises a command.
set -uo pipefail
n="${RDX_NODE:-?}"
want() {
  if ! eval "$1"; then
    echo "node $n: FAILED: $2"
    exit 1
  fi
}
want '[[ "$RDX_DEVICE" == rxe0 && "${RDX_VM:-}" == 1 ]]' "RDX_DEVICE=${RDX_DEVICE:-} RDX_VM=${RDX_VM:-}"
want '[[ "$PWD" == "$EXPECT_CWD" ]]' "working directory $PWD, expected $EXPECT_CWD"
want '[[ "${CALLER_VAR:-}" == "a b" ]]' "the caller's environment did not come along"
want '[[ "$RDX_NODE_ADDR" == "10.77.0.$((n + 1))" && "$RDX_PEER_ADDR" == "10.77.0.$((2 - n))" ]]' \
  "addresses: RDX_NODE_ADDR=$RDX_NODE_ADDR RDX_PEER_ADDR=$RDX_PEER_ADDR"
want 'rdma link show rxe0/1 | grep -q "state ACTIVE"' "rxe0 port 1 is not ACTIVE"
want '[[ "$(cat /sys/class/infiniband/rxe0/ports/1/gids/1)" == "0000:0000:0000:0000:0000:ffff:0a4d:000$((n + 1))" ]]' \
  "GID 1 is not the IPv4-mapped address"
want 'touch /tmp/x && rm /tmp/x' "/tmp is not writable"
# The wire: node 1 talks to node 0 over TCP; node 0 waits for it, so neither
# powers off before the other is done.
if ((n == 0)); then
  want '[[ "$(timeout 120 busybox nc -l -p 5555)" == "hello from node 1" ]]' "no message from node 1"
else
  sent=0
  for ((i = 0; i < 300; i++)); do
    if echo "hello from node 1" | busybox nc -w 5 "$RDX_PEER_ADDR" 5555 2>/dev/null; then
      sent=1
      break
    fi
    sleep 0.2
  done
  want '((sent))' "cannot reach node 0 at $RDX_PEER_ADDR:5555"
fi
echo "node $n: environment, rxe0, GID 1 and the wire are right"
