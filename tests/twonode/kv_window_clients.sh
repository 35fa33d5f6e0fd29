#!/bin/bash
# kv_window_clients.sh KV_WINDOW N SERVER [ARGS...]
# Starts N kv_window clients of SERVER at once (each with ARGS), waits for
# all, shows each one's output under its number, and fails unless every one
# passed its checks. While they run it says every 10 s how many still do.
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
# Every 10 s while clients run: how many, the first one's state and last
# line, the load and free memory (the VM is stopped, and these logs lost, if
# the server fails first).
(
  nap=""
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  for ((t = 10; ; t += 10)); do
    sleep 10 &
    nap=$!
    wait "$nap"
    running=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
    ((running > 0)) || exit 0
    first="${pids[0]}"
    state=$(ps -o stat=,wchan:24= -p "$first" 2>/dev/null | tr -s ' ')
    echo "kv_window_clients: ${t} s: $running of $n running; client 1 (${state:-ended}) said: $(tail -n 1 "$dir/1.log" 2>/dev/null)"
    echo "kv_window_clients: load $(cut -d' ' -f1-4 /proc/loadavg), $(awk '/MemAvailable/ {print $2 / 1024 " MiB"}' /proc/meminfo) available"
  done
) &
watch=$!
failed=0
for i in $(seq 1 "$n"); do
  if ! wait "${pids[$((i - 1))]}"; then failed=$((failed + 1)); fi
  sed "s/^/[kv client $i] /" "$dir/$i.log"
  grep -q "all checked on both sides" "$dir/$i.log" || failed=$((failed + 1))
done
kill "$watch" 2>/dev/null
echo "kv_window_clients: $n clients, $failed failure(s)"
[ "$failed" -eq 0 ]
