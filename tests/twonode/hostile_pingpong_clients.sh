#!/bin/bash
# hostile_pingpong_clients.sh PINGPONG SERVER PORT DEADLINE
# Node 1 of hostile_pingpong_server_twonode. Against `pingpong --channel -s 64
# -n 50 --clients 4 -t DEADLINE -p PORT` on SERVER it first connects a silent
# client (sends nothing) and a slow one (the start of a settings block, one
# byte a second), then runs two good clients at once. Succeeds when both good
# clients pass before DEADLINE seconds after the bad two connected, and the
# server drops the bad two at its set-up deadline, not before. Prints the times.
set -u
pp=$1 server=$2 port=$3 deadline=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }
start=$(ms)
since() { local d=$(($(ms) - start)); printf '%d.%03d' $((d / 1000)) $((d % 1000)); }

# Connects file descriptor $1 to the server, retrying while it starts.
open_fd() {
  local i
  for ((i = 0; i < 150; ++i)); do
    { eval "exec $1<>/dev/tcp/$server/$port"; } 2>/dev/null && return 0
    sleep 0.2
  done
  echo "cannot connect to $server:$port" >&2
  exit 1
}
# Records when the server closes the connection on file descriptor $1.
watch_close() {
  timeout 30 cat <&"$1" >/dev/null 2>&1
  since >"$dir/$2.closed"
}

open_fd 3
start=$(ms)  # times count from the silent client's connection
echo "silent client connected at $(since) s"
watch_close 3 silent &
exec 3<&-
open_fd 4
echo "slow client connected at $(since) s"
watch_close 4 slow &
(
  trap '' PIPE
  for b in 'R' 'D' 'X' 'P' '\0' '\0' '\0' '\3' '\0' '\0'; do
    printf "$b" >&4 2>/dev/null || break
    sleep 1
  done
) &
exec 4<&-

sleep 1  # the bad clients are accepted first
good() {
  "$pp" --channel -s 64 -n 50 -p "$port" "$server" >"$dir/good$1.log" 2>&1
  echo "$? $(since)" >"$dir/good$1.rc"
}
echo "good clients start at $(since) s"
good 1 &
g1=$!
good 2 &
g2=$!
wait $g1 $g2

ok=1
for i in 1 2; do
  sed "s/^/good $i| /" "$dir/good$i.log"
  read -r rc at <"$dir/good$i.rc"
  echo "good client $i: exit status $rc, finished at $at s"
  [ "$rc" = 0 ] || { echo "FAIL: good client $i failed" >&2; ok=0; }
  # Well before the bad clients' deadline: neither of them held the good ones.
  [ "${at%.*}" -lt "$deadline" ] || { echo "FAIL: good client $i ended after ${deadline} s" >&2; ok=0; }
done
wait  # the bad clients end when the server drops them
for c in silent slow; do
  at=$(cat "$dir/$c.closed")
  echo "$c client: dropped by the server at $at s"
  # Not before the deadline (the server waited for it), nor long after.
  if [ "${at%.*}" -lt $((deadline - 1)) ] || [ "${at%.*}" -gt $((deadline + 5)) ]; then
    echo "FAIL: the $c client was dropped at $at s, expected about ${deadline} s" >&2
    ok=0
  fi
done
[ $ok = 1 ] && echo "hostile clients: ok"
[ $ok = 1 ]
