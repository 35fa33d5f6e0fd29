#!/bin/bash
# pingpong_clients.sh PINGPONG SERVER PORT N [CLIENT ARGS...]
# Node 1 of the one-thread pingpong server tests: starts N pingpong clients
# at once against SERVER:PORT, each a process of its own with CLIENT ARGS,
# waits for all, prints how many passed, and fails unless every one did.
set -u
pp=$1 server=$2 port=$3 n=$4
shift 4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=()
for ((i = 1; i <= n; ++i)); do
  "$pp" "$@" -p "$port" "$server" >"$dir/$i.log" 2>&1 &
  pids+=($!)
done
passed=0
for ((i = 1; i <= n; ++i)); do
  if wait "${pids[i - 1]}"; then
    passed=$((passed + 1))
  else
    echo "client $i FAILED:" >&2
    sed "s/^/client $i| /" "$dir/$i.log" >&2
  fi
done
grep -h "round trip latency\|median" "$dir/1.log" | head -n 3
echo "$passed of $n clients passed"
[ "$passed" = "$n" ]
