#!/bin/bash
# mpirun.sh [--master PORT] [--banner TEXT] [--ok TEXT] [--alone] N PROGRAM [ARGS...]
# Runs N ranks of PROGRAM under Open MPI's mpirun and fails unless mpirun
# exits 0, every rank printed --ok's TEXT (default "every byte right") and,
# with --banner, the output holds TEXT once.
#   --master PORT  the TCP rendezvous: MASTER_ADDR=127.0.0.1 and MASTER_PORT
#                  passed with -x (the ranks read Open MPI's variables);
#                  without it both are unset, so the ranks meet through
#                  mpirun's PMIx server.
#   --alone        first run PROGRAM once outside mpirun (it must exit 0).
# Exits 77 (skipped) only when mpirun is not installed.
set -u
master="" banner="" ok="every byte right" alone=""
while [ $# -gt 0 ]; do
  case "$1" in
    --master) master=$2; shift 2 ;;
    --banner) banner=$2; shift 2 ;;
    --ok) ok=$2; shift 2 ;;
    --alone) alone=1; shift ;;
    *) break ;;
  esac
done
n=$1
shift
if ! command -v mpirun >/dev/null; then
  echo "SKIP: mpirun is not installed (scripts/quickstart.sh test installs openmpi-bin)"
  exit 77
fi
# Under ASan, libpmix's own few leaked strings are suppressed (lsan-pmix.supp
# says which); every other leak still fails the rank.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$here/lsan-pmix.supp"
alone_status=0
if [ -n "$alone" ]; then
  env -u PMIX_NAMESPACE -u PMIX_RANK "$@" || alone_status=$?
  echo "mpirun.sh: alone exit $alone_status"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HOME=${TMPDIR:-/tmp}
pass=()
if [ -n "$master" ]; then
  export MASTER_ADDR=127.0.0.1 MASTER_PORT=$master
  pass=(-x MASTER_ADDR -x MASTER_PORT)
else
  unset MASTER_ADDR MASTER_PORT
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
mpirun --oversubscribe -np "$n" "${pass[@]}" "$@" >"$log" 2>&1 || status=$?
cat "$log"
right=$(grep -c -- "$ok" "$log")
seen=yes
[ -z "$banner" ] || grep -q -- "$banner" "$log" || seen=no
echo "mpirun.sh: mpirun exit $status, $right of $n ranks printed \"$ok\"${banner:+, banner \"$banner\": $seen}"
[ "$alone_status" -eq 0 ] && [ "$status" -eq 0 ] && [ "$right" -eq "$n" ] && [ "$seen" = yes ]
