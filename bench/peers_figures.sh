#!/bin/bash
# peers_figures.sh: the many-peers figures for README, from one run in one
# Soft-RoCE VM: for each peer count, connection set-up rate, registered
# bytes, memory regions, queue pairs and completion queues per connection
# (channel_worker's and channel_pool's many-peers cases), and the cost model
# (instructions, D1 and LL misses per window write and 64-byte message) on a
# worker with its receives on rings of their own and on a receive pool, and
# UCX's twins of both operations (connections with queues of their own).
# Writes the logs, peers.csv and peers.md to --out (with callgrind's dumps of
# each worker run, for callgrind_annotate), and the plot to --png.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/peers_figures.sh [--peers "1 16 64 256 1024"] [--out DIR] [--png FILE] [--build DIR]
Runs, in one Soft-RoCE VM (cmake/softroce/rdx-run-rdma), for each peer count N:
  channel_worker "[many_peers]" and channel_pool "[many_peers]" with RDX_TEST_PEERS=N
    (set-up rate, registered bytes, regions, queue pairs and CQs per connection);
  bench/cost_model.sh --cache -- --only window_write,channel_64 --peers N [--pool]
    (instructions and cache misses per operation, rdx and plain verbs);
then bench/peers_plot.py, which writes peers.csv and peers.md to DIR and the plot.
  --peers LIST   peer counts (default "1 16 64 256 1024")
  --out DIR      logs and tables; must lie under /tmp, which the VM can write
                 (default /tmp/rdx-peers-figures)
  --png FILE     the plot (default docs/peers.png)
  --build DIR    the release build (default build/release; needs channel_worker,
                 channel_pool and rdx_cost_model)
  -h, --help     this text
Takes about 10 minutes with the default counts on a 2-core host (539 s in the VM on 2026-12-07).
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
peers="1 16 64 256 1024" out=/tmp/rdx-peers-figures png="$src/docs/peers.png" build="$src/build/release" inside=no
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --peers) [ $# -ge 2 ] || { echo "peers_figures.sh: --peers needs a list" >&2; exit 2; }; peers=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || { echo "peers_figures.sh: --out needs a directory" >&2; exit 2; }; out=$2; shift 2 ;;
    --png) [ $# -ge 2 ] || { echo "peers_figures.sh: --png needs a file" >&2; exit 2; }; png=$2; shift 2 ;;
    --build) [ $# -ge 2 ] || { echo "peers_figures.sh: --build needs a directory" >&2; exit 2; }; build=$2; shift 2 ;;
    --inside) inside=yes; shift ;;
    *) echo "peers_figures.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for n in $peers; do
  case $n in '' | *[!0-9]*) echo "peers_figures.sh: --peers \"$peers\": $n is not a count" >&2; exit 2 ;; esac
  [ "$n" -ge 1 ] || { echo "peers_figures.sh: --peers: counts start at 1" >&2; exit 2; }
done

if [ $inside = yes ]; then
  # In the VM: every run's output to its own log, progress to stdout.
  for n in $peers; do
    echo "peers_figures: $n peers: channel_worker"
    RDX_TEST_PEERS=$n "$build/tests/rdma/channel_worker" --warn NoTests "[worker][many_peers]" \
      >"$out/worker_$n.log" 2>&1 || { echo "peers_figures: channel_worker at $n peers failed: $out/worker_$n.log"; exit 1; }
    echo "peers_figures: $n peers: channel_pool"
    RDX_TEST_PEERS=$n "$build/tests/rdma/channel_pool" --warn NoTests "[pool][many_peers]" \
      >"$out/pool_$n.log" 2>&1 || { echo "peers_figures: channel_pool at $n peers failed: $out/pool_$n.log"; exit 1; }
    for mode in ring pool; do
      extra=()
      [ $mode = ring ] || extra=(--pool)
      echo "peers_figures: $n peers: cost model, receives on $mode"
      "$here/cost_model.sh" --program "$build/bench/rdx_cost_model" --cache --out "$out/callgrind_${mode}_$n" -- \
        --only window_write,channel_64 --peers "$n" "${extra[@]}" \
        >"$out/cost_${mode}_$n.log" 2>&1 || { echo "peers_figures: cost model failed: $out/cost_${mode}_$n.log"; exit 1; }
    done
  done
  echo "peers_figures: cost model, connections with queues of their own, and UCX's twins"
  "$here/cost_model.sh" --program "$build/bench/rdx_cost_model" --cache -- \
    --only window_write,channel_64 --ucx >"$out/cost_own.log" 2>&1 ||
    { echo "peers_figures: cost model failed: $out/cost_own.log"; exit 1; }
  exit 0
fi

case $out in /tmp/*) ;; *) echo "peers_figures.sh: --out $out: must lie under /tmp (the VM writes there)" >&2; exit 2 ;; esac
for p in tests/rdma/channel_worker tests/rdma/channel_pool bench/rdx_cost_model; do
  [ -x "$build/$p" ] || { echo "peers_figures.sh: $build/$p is missing: cmake --build --preset release --target $(basename $p)" >&2; exit 2; }
done
command -v valgrind >/dev/null || { echo "peers_figures.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
rm -rf "$out"
mkdir -p "$out"
echo "peers_figures: peers $peers; logs in $out"
start=$(date +%s)
RDX_VM_SHARE="$src:$build:$out" RDX_REQUIRE_FABRIC=1 "$src/cmake/softroce/rdx-run-rdma" --timeout 3600 -- \
  "$here/peers_figures.sh" --inside --peers "$peers" --out "$out" --build "$build"
echo "peers_figures: VM runs took $(( $(date +%s) - start )) s"
/usr/bin/python3 "$here/peers_plot.py" --dir "$out" --peers "$peers" --png "$png"
