#!/bin/bash
# launch.sh [--nproc N] [--nnodes M] [--node-rank K] [--master HOST:PORT]
#           [--expect TEXT] [--kill RANK@SECONDS] -- COMMAND [ARGS...]
# Starts N copies of COMMAND on this node the way torchrun does: each with
# RANK (K x N + i), WORLD_SIZE (N x M), LOCAL_RANK (i), LOCAL_WORLD_SIZE (N),
# MASTER_ADDR and MASTER_PORT set, and nothing else of the job on its
# command line. Waits for all, shows each one's output under its rank, and
# fails unless every one exited 0 and (with --expect) printed TEXT.
# --kill RANK@SECONDS kills that rank (if it runs on this node) after the
# given seconds; it is then expected to fail, and the others to fail naming it.
set -u
nproc=4 nnodes=1 node_rank=0 master=127.0.0.1:29500 expect="" kill_rank="" kill_after=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) nproc=$2; shift 2 ;;
    --nnodes) nnodes=$2; shift 2 ;;
    --node-rank) node_rank=$2; shift 2 ;;
    --master) master=$2; shift 2 ;;
    --expect) expect=$2; shift 2 ;;
    --kill) kill_rank=${2%@*} kill_after=${2#*@}; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "launch.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "launch.sh: no command (see --help)" >&2; exit 2; }
world=$((nproc * nnodes))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=() ranks=()
for i in $(seq 0 $((nproc - 1))); do
  rank=$((node_rank * nproc + i))
  RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$i LOCAL_WORLD_SIZE=$nproc \
    MASTER_ADDR=${master%:*} MASTER_PORT=${master##*:} "$@" >"$dir/$rank.log" 2>&1 &
  pids+=($!) ranks+=("$rank")
done
killed=""
if [ -n "$kill_rank" ]; then
  for j in "${!ranks[@]}"; do
    if [ "${ranks[$j]}" = "$kill_rank" ]; then
      sleep "$kill_after"
      kill -9 "${pids[$j]}" 2>/dev/null && killed=$kill_rank
    fi
  done
fi
failed=0
for j in "${!ranks[@]}"; do
  rank=${ranks[$j]}
  status=0
  wait "${pids[$j]}" || status=$?
  sed "s/^/[rank $rank] /" "$dir/$rank.log"
  if [ "$rank" = "$killed" ]; then
    echo "[rank $rank] killed as asked"
    continue
  fi
  if [ -n "$killed" ]; then
    # The others must fail, naming the killed rank.
    # "rank 3", or "ranks 1, 3 and 5" naming it among others.
    if [ "$status" -eq 0 ] || ! grep -q -E "ranks? ([0-9]+(, | and ))*$killed([^0-9]|\$)" "$dir/$rank.log"; then
      echo "[rank $rank] expected to fail naming rank $killed (exit $status)"
      failed=$((failed + 1))
    fi
    continue
  fi
  if [ "$status" -ne 0 ]; then
    echo "[rank $rank] exit status $status"
    failed=$((failed + 1))
  elif [ -n "$expect" ] && ! grep -q -- "$expect" "$dir/$rank.log"; then
    echo "[rank $rank] did not print \"$expect\""
    failed=$((failed + 1))
  fi
done
if [ -n "$kill_rank" ] && [ -z "$killed" ] && [ "$((kill_rank / nproc))" = "$node_rank" ]; then
  echo "launch.sh: rank $kill_rank had ended before it could be killed"
  failed=$((failed + 1))
fi
echo "launch.sh: node $node_rank, ranks $((node_rank * nproc)) to $((node_rank * nproc + nproc - 1)) of $world: $failed failure(s)"
[ "$failed" -eq 0 ]
