#!/bin/bash
# Runs rdma-core's ibv_rc_pingpong with the given arguments and fails unless it
# completed every exchange with valid data. ibv_rc_pingpong only prints
# "invalid data in page N" when its -c check fails, and a client started
# before its server gives up at once, so this wrapper
#   - retries a client while the server is not listening yet (up to 60 s),
#   - fails when the output reports invalid data or lacks the summary line.
set -u
out=$(mktemp)
trap 'rm -f "$out"' EXIT
deadline=$((SECONDS + 60))
while :; do
  ibv_rc_pingpong "$@" >"$out" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && grep -q "Couldn't connect to" "$out" && [ $SECONDS -lt $deadline ]; then
    sleep 0.5
    continue
  fi
  break
done
cat "$out"
if [ $rc -ne 0 ]; then
  echo "ibv_rc_pingpong_checked: ibv_rc_pingpong exited with status $rc" >&2
  exit 1
fi
if grep -q "invalid data" "$out"; then
  echo "ibv_rc_pingpong_checked: ibv_rc_pingpong received invalid data" >&2
  exit 1
fi
if ! grep -q "iters in" "$out"; then
  echo "ibv_rc_pingpong_checked: ibv_rc_pingpong printed no summary" >&2
  exit 1
fi
echo "ibv_rc_pingpong_checked: ok"
