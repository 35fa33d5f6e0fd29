#!/bin/bash
# kv_window_clients.sh KV_WINDOW N SERVER [ARGS...]
# Starts N kv_window clients of SERVER at once (each with ARGS), waits for
# all, shows each one's output under its number, and fails unless every one
# passed its checks.
set -u
kv=$1 n=$2 server=$3
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=()
for i in $(seq 1 "$n"); do
  "$kv" "$@" "$server" >"$dir/$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in $(seq 1 "$n"); do
  if ! wait "${pids[$((i - 1))]}"; then failed=$((failed + 1)); fi
  sed "s/^/[kv client $i] /" "$dir/$i.log"
  grep -q "all checked on both sides" "$dir/$i.log" || failed=$((failed + 1))
done
echo "kv_window_clients: $n clients, $failed failure(s)"
[ "$failed" -eq 0 ]
