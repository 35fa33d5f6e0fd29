#!/usr/bin/env bash
# worker_figures.sh: the many-peers figures of README (rdx::worker) at the
# full scale, outside CI, which runs the same programs smaller
# (ctest -R 'worker|many_peers'). Needs a build with tests (default
# build/release) and the Soft-RoCE VMs (cmake/softroce). See --help.
set -euo pipefail
root="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
build="$root/build/release"
peers=1024
wakeups=100000
runs=10
clients="32 256"

usage() {
  cat <<'EOF'
Usage: tests/worker_figures.sh [--build DIR] [--peers N] [--wakeups N] [--runs N] [--clients "N ..."]
In one VM: N connection pairs on two workers with checked traffic, set-up,
teardown, fairness and the device's object counts (--peers, default 1024),
with ring buffers of each connection's own and on one receive pool;
then N messages through the worker's descriptor in an epoll loop
(--wakeups, default 100000). Between the two VMs: one server thread against
each client count (--clients, default "32 256"), polling, in event mode and
in event mode on a receive pool,
each --runs times in a row (default 10), one client killed in every run.
Prints what each program printed; exits 1 at the first failure.
EOF
}
while (($#)); do
  case "$1" in
    --build) build="$(readlink -f "$2")"; shift 2 ;;
    --peers) peers="$2"; shift 2 ;;
    --wakeups) wakeups="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --clients) clients="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "worker_figures.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
worker="$build/tests/rdma/channel_worker"
pool="$build/tests/rdma/channel_pool"
peer="$build/tests/twonode/worker_peer"
for p in "$worker" "$pool" "$peer"; do
  [[ -x "$p" ]] || { echo "worker_figures.sh: $p is missing: build the tests (cmake --build --preset release)" >&2; exit 2; }
done
vm="$root/cmake/softroce"
export RDX_VM_SHARE="$root:$build"

echo "== $peers pairs in one VM"
"$vm/rdx-run-rdma" --timeout 1800 -- env RDX_TEST_PEERS="$peers" "$worker" --warn NoTests "[many_peers]"
echo "== $peers pairs in one VM, the servers on one receive pool"
"$vm/rdx-run-rdma" --timeout 1800 -- env RDX_TEST_PEERS="$peers" "$pool" --warn NoTests "[many_peers]"
echo "== $wakeups messages through the worker's descriptor"
"$vm/rdx-run-rdma" --timeout 1800 -- env RDX_TEST_WAKEUPS="$wakeups" "$worker" --warn NoTests \
  "event mode: the worker's one descriptor in an epoll loop loses no wake-up"
for n in $clients; do
  for mode in "" "--events" "--events --pool"; do
    for ((i = 1; i <= runs; i++)); do
      echo "== $n clients against one server thread ${mode:-(polling)}, run $i of $runs"
      "$vm/rdx-run-twonode" --timeout 900 \
        --node0 "$peer --clients $n $mode" --node1 "$peer --clients $n --threads 4"
    done
  done
done
echo "worker_figures.sh: every run passed"
