#!/usr/bin/env bash
# rdx-doctor in one Soft-RoCE VM: all ok on the healthy device, then each
# fault injected and reported as the right error with its fix:
#   the locked-memory limit lowered (ulimit -l 64, without CAP_IPC_LOCK),
#   a GID index forced to the link-local entry (RDX_GID_INDEX=0, and -g 0),
#   the port's link down, and last the rxe device removed.
#   one_node.sh DOCTOR
set -uo pipefail
doctor="${1:?rdx-doctor}"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

record "healthy: every finding ok (or a note), exit 0" --exit 0 --worst note --status devices=ok \
  --status ports=ok --status gid=ok --status mtu=ok --status memlock=ok --status fork=ok \
  --status retrans=ok --fact retrans.retry_exceeded_err=0 --fact retrans.duplicate_request=0 \
  --fact gid.chosen_index=1 --fact "gid.chosen_type=RoCE v2" --fact ports.netdev=eth0 \
  --fact mtu.active_mtu=1024 -- "$doctor" --json

echo "== healthy, as people read it"
out="$("$doctor")"
st=$?
echo "$out"
[[ $st == 0 && "$out" == *"summary: "*" 0 errors"* && "$out" == *"rdx uses GID index 1"* ]] ||
  { echo "FAIL: human output (exit $st)"; rc=1; }

record "--check selects checks" --exit 0 --status memlock=ok -- "$doctor" --json --check memlock
"$doctor" --check nosuch >/dev/null 2>&1
[[ $? == 2 ]] || { echo "FAIL: --check nosuch did not exit 2"; rc=1; }

# Root holds CAP_IPC_LOCK, which the limit does not bind: drop it first.
record "ulimit -l 64 without CAP_IPC_LOCK: memlock error naming the limit and the fix" --exit 1 \
  --status memlock=error --text 'memlock=64 KiB' --text 'memlock=ulimit -l unlimited' \
  --text 'memlock=Cannot allocate memory' --fact memlock.cap_ipc_lock=no --fact memlock.limit_bytes=65536 \
  --status devices=ok --status gid=ok \
  -- setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock -- bash -c "ulimit -l 64 && exec $doctor --json"

record "RDX_GID_INDEX=0 (the link-local entry): gid error, the fix names the entry rdx would use" \
  --exit 1 --status gid=error --text gid=link-local \
  --text 'gid=unset RDX_GID_INDEX (rdx then chooses GID index 1' --fact gid.chosen_index=0 \
  -- env RDX_GID_INDEX=0 "$doctor" --json
record "-g 0 does the same as RDX_GID_INDEX=0" --exit 1 --status gid=error --text gid=link-local \
  -- "$doctor" --json -g 0

# Untrusted input: a program on the port that is not rdx-doctor (another magic),
# then one that claims a 16 MiB hello. Each is refused at peer.hello, nothing read past it.
python3 -c '
import socket, struct
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 18599)); l.listen(2)
for head in (b"HTTP/1.1", struct.pack("!II", 0x52445844, 16 << 20)):
    c, _ = l.accept(); c.sendall(head); c.recv(65536); c.close()
' &
fake=$!
record "a foreign program on the port: peer.hello error" --exit 1 --status peer.hello=error \
  --text 'peer.hello=did not answer as rdx-doctor --serve does' --text 'peer.hello=is not rdx-doctor --serve' \
  -- "$doctor" --peer 127.0.0.1 -p 18599 -t 30 --json --check devices
record "a hello claiming 16 MiB: refused" --exit 1 --status peer.hello=error \
  --text 'peer.hello=did not answer as rdx-doctor --serve does' -- "$doctor" --peer 127.0.0.1 -p 18599 -t 30 --json --check devices
wait "$fake"

ip link set eth0 down
sleep 1
record "link down: ports error with the fix" --exit 1 --status ports=error --fact ports.state=DOWN \
  --text 'ports=ip link set dev eth0 up' -- "$doctor" --json --check devices,ports
ip link set eth0 up
sleep 2
record "link up again: ports ok" --exit 0 --status ports=ok -- "$doctor" --json --check ports

rdma link delete rxe0
record "rxe device removed: devices error with the fix" --exit 1 --status devices=error \
  --text 'devices=no device is registered' --text 'devices=rdma link add rxe0 type rxe netdev eth0' \
  -- "$doctor" --json
finish
