#!/usr/bin/env bash
# Proves the RDMA fabric with rdma-core's and perftest's own programs, before
# any rdx code runs.
#
#   fabric.sh rc_pingpong   two nodes: node 0 serves, node 1 connects (RDX_NODE)
#   fabric.sh write_bw      one node: ib_write_bw server and client on one device
#
# Environment (set by rdx-vm, or by the caller on a native device):
# RDX_DEVICE, RDX_NODE, RDX_PEER_ADDR; RDX_GID_INDEX (default 1: rxe's RoCE v2
# IPv4-mapped GID); RDX_FABRIC_ITERS.
set -euo pipefail
dev="${RDX_DEVICE:?RDX_DEVICE is not set}"
gid="${RDX_GID_INDEX:-1}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Runs a client until its server listens: retries only while the connection
# itself is refused, so a server is never handed a half-done exchange.
client() {
  local out="$1" i
  shift
  for ((i = 0; i < 120; i++)); do
    if "$@" >"$out" 2>&1; then
      cat "$out"
      return 0
    fi
    grep -qi "couldn't connect\|connection refused\|unable to connect" "$out" || break
    sleep 0.25
  done
  cat "$out"
  echo "fabric.sh: client failed: $*" >&2
  return 1
}

expect() {
  local file="$1" pattern="$2" what="$3"
  if ! grep -q -- "$pattern" "$file"; then
    echo "fabric.sh: FAILED: $what: no '$pattern' in the output" >&2
    return 1
  fi
}

case "${1:-}" in
  rc_pingpong)
    n="${RDX_FABRIC_ITERS:-200}"
    args=(-d "$dev" -g "$gid" -n "$n" -p 18602)
    if [[ "${RDX_NODE:?}" == 0 ]]; then
      ibv_rc_pingpong "${args[@]}" 2>&1 | tee "$tmp/out"
    else
      client "$tmp/out" ibv_rc_pingpong "${args[@]}" "${RDX_PEER_ADDR:?}"
    fi
    expect "$tmp/out" "$n iters in" "ibv_rc_pingpong on node $RDX_NODE"
    expect "$tmp/out" "usec/iter" "ibv_rc_pingpong on node $RDX_NODE"
    ;;
  write_bw)
    n="${RDX_FABRIC_ITERS:-200}"
    addr="${RDX_NODE_ADDR:-127.0.0.1}"
    args=(-d "$dev" -x "$gid" -s 65536 -n "$n" -p 18601 -F)
    ib_write_bw "${args[@]}" >"$tmp/server" 2>&1 &
    server=$!
    client "$tmp/client" ib_write_bw "${args[@]}" "$addr" || { kill "$server" 2>/dev/null; exit 1; }
    wait "$server" || { cat "$tmp/server"; echo "fabric.sh: FAILED: ib_write_bw server" >&2; exit 1; }
    sed 's/^/server: /' "$tmp/server"
    # The result row: size, iterations, peak, average (MB/s), message rate.
    awk '$1 == 65536 && $2 == '"$n"' { ok = 1; print "ib_write_bw: " $4 " MB/s average" } END { exit !ok }' \
      "$tmp/client" || { echo "fabric.sh: FAILED: no ib_write_bw result row" >&2; exit 1; }
    ;;
  *)
    echo "usage: fabric.sh rc_pingpong|write_bw" >&2
    exit 2
    ;;
esac
