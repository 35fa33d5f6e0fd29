#!/usr/bin/env bash
# rdx-doctor between the two Soft-RoCE VMs.
#   peer.sh healthy server|client DOCTOR [PEER]   both sides all ok, a checked
#                                                 transfer each way
#   peer.sh faults  server|client DOCTOR [PEER]   the peer not running; the
#       client's MTU forced lower (ip link set eth0 mtu 1000); the client's GID
#       forced to its link-local entry (RDX_GID_INDEX=0): each reported on
#       the side that sees it, with the fix
set -uo pipefail
mode="${1:?healthy|faults}" role="${2:?server|client}" doctor="${3:?rdx-doctor}" peer="${4:-}"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
ok_peer=(--status peer.tcp=ok --status peer.hello=ok --status peer.gid=ok --status peer.connect=ok
  --status peer.write=ok --status peer.receive=ok)

case "$mode.$role" in
  healthy.server)
    record "serve one doctor: everything ok" --exit 0 --worst note "${ok_peer[@]}" --status peer.mtu=ok \
      --status peer.settings=ok --status peer.host=ok -- "$doctor" --serve --json -t 120
    ;;
  healthy.client)
    record "--peer: everything ok" --exit 0 --worst note "${ok_peer[@]}" --status peer.mtu=ok \
      --status peer.settings=ok --status peer.host=ok --status peer.latency=ok \
      -- "$doctor" --peer "$peer" --json -t 60
    ;;
  faults.server)
    # Not listening yet while the client tries; then one doctor per case.
    sleep 8
    record "serve the client whose MTU is lower: MTUs compared, transfer still ok" --exit 0 \
      --status peer.mtu=warning --text 'peer.mtu=here 1024, on node1 512' "${ok_peer[@]}" \
      -- "$doctor" --serve --json -t 120
    record "serve the client whose GID is link-local: gid error here too" --exit 1 \
      --status peer.gid=error --text "peer.gid=the peer's GID is link-local" --text 'peer.connect=RTR' \
      -- "$doctor" --serve --json -t 120
    ;;
  faults.client)
    record "the peer not running: peer.tcp error naming rdx-doctor --serve" --exit 1 \
      --status peer.tcp=error --text 'peer.tcp=nothing listens on' \
      --text 'peer.tcp=start `rdx-doctor --serve` there' -- "$doctor" --peer "$peer" --json -t 2 --check devices
    ip link set eth0 mtu 1000
    sleep 1
    record "MTU forced lower here: local mtu warning, peer.mtu warning with the fix, transfer ok" \
      --exit 0 --status mtu=warning --fact mtu.active_mtu=512 --status peer.mtu=warning \
      --text 'peer.mtu=here 512, on node0 1024' --text 'peer.mtu=mtu 1500' "${ok_peer[@]}" \
      -- "$doctor" --peer "$peer" --json -t 60
    ip link set eth0 mtu 1500
    sleep 1
    record "GID forced to the link-local entry here: gid errors with the fix" --exit 1 \
      --status gid=error --status peer.gid=error --text "peer.gid=this side's GID is link-local" \
      --text 'peer.gid=unset RDX_GID_INDEX on node1' --text 'peer.connect=ibv_modify_qp(RTR)' \
      --text 'peer.connect=see peer.gid' -- env RDX_GID_INDEX=0 "$doctor" --peer "$peer" --json -t 60
    ;;
  *) echo "usage: peer.sh healthy|faults server|client DOCTOR [PEER]" >&2; exit 2 ;;
esac
finish
