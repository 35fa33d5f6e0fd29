#!/bin/bash
# psk.sh [--wrong RANK] N PORT ALLTOALL [ARGS...]
# Writes a fresh pre-shared key (hex, mode 600) and runs N ranks of ALLTOALL
# with --psk-file under torchrun's variables (launch.sh) on 127.0.0.1:PORT:
# every rank must print "every byte right". With --wrong RANK, that rank gets
# another key: it must fail saying it holds another key, and every other rank
# must fail within the deadline naming it (rank 0 with the refusal's reason).
set -u
wrong=""
if [ "${1:-}" = "--wrong" ]; then wrong=$2; shift 2; fi
n=$1 port=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
key() { (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$1"); }
key "$dir/job.key"
key "$dir/other.key"
if [ -z "$wrong" ]; then
  exec "$here/launch.sh" --nproc "$n" --master "127.0.0.1:$port" --expect "every byte right" -- \
    "$@" --psk-file "$dir/job.key"
fi
# Each rank picks its key file by its RANK.
export PSK_JOB=$dir/job.key PSK_OTHER=$dir/other.key PSK_WRONG=$wrong
pick='if [ "$RANK" = "$PSK_WRONG" ]; then k=$PSK_OTHER; else k=$PSK_JOB; fi; exec "$@" --psk-file "$k"'
status=0
"$here/launch.sh" --nproc "$n" --master "127.0.0.1:$port" -- sh -c "$pick" sh "$@" >"$dir/out" 2>&1 || status=$?
cat "$dir/out"
bad=0
if [ "$status" -eq 0 ]; then echo "psk.sh: every rank succeeded, though rank $wrong held another key"; bad=1; fi
check() {  # RANK TEXT
  if ! grep "^\[rank $1\] " "$dir/out" | grep -q -- "$2"; then
    echo "psk.sh: rank $1 did not print \"$2\""
    bad=1
  fi
}
check "$wrong" "holds another key"
for r in $(seq 0 $((n - 1))); do
  [ "$r" = "$wrong" ] || check "$r" "rank $wrong of $n never arrived"
done
check 0 "claiming rank $wrong: its MAC is wrong"
echo "psk.sh: $n ranks, rank $wrong with another key: $([ $bad -eq 0 ] && echo "refused and named as expected" || echo FAILED)"
[ "$bad" -eq 0 ]
