#!/usr/bin/env bash
# rdx benchmarks on a two-node Soft-RoCE fabric, side by side with plain verbs
# and perftest, in the same VMs and the same run.
#
#   bench/run_fabric.sh [options] [-- extra rdx_bench arguments]
#
# Builds rdx_bench (Release) in build-bench, boots two VMs
# (cmake/softroce/rdx-vm --nodes 2) and, figure by figure, runs rdx_bench
# (client on node 0, responder on node 1) and perftest's
# ib_{write,read,send}_{bw,lat} at the same size, depth and message count,
# then bench/plot.py: one CSV and one JSON of every figure, one PNG, a table
# of ratios and the targets.
#
# Each perftest figure (write, read, send: bw, lat) comes with rdx_bench's
# figures read against it: raw and rdx twins, paired runs, remote_window
# (window_*), and for send the two channel<std::byte> figures: chan_send_*
# (copying send and receive) and chan_zc_* (zero-copy: send_registered,
# receive_view).
#
# Options:
#   --sizes LIST     message sizes: default, all, or a list such as 8,4K,1M
#   --only REGEX     only the perftest figures whose op (write_bw, read_lat, ...)
#                    matches REGEX (extended), with their rdx_bench figures
#                    (e.g. --only send: send_*, chan_send_*, chan_zc_*); the
#                    rdx_bench figures no perftest figure names are skipped
#   --rounds N       rounds of (rdx_bench, perftest) in the same VMs (default 1);
#                    twins run back to back, raw first in odd rounds, rdx first in even
#   --reps N         repetitions of every rdx_bench run within a round (default 1)
#   --no-interleave  all of rdx_bench, then all of perftest, in each round (the
#                    default runs them figure by figure: a plan line's rdx_bench
#                    figures, then its perftest run, one rdx_bench process each)
#   --out DIR        results folder (default build-bench/fabric-results/<UTC time>)
#   --build DIR      build folder (default build-bench)
#   --no-build       use the existing rdx_bench
#   --timeout S      limit for the VMs (default 3000)
#   -h, --help       this text
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

# ----------------------------------------------------------------------------
# Inside a VM: node 0 runs the clients, node 1 the servers, in plan order.
if [[ "${1:-}" == "--in-vm" ]]; then
  out=$2
  bench=$3
  read -r -a bench_args < "$out/rdx_bench.args"
  rounds=$(cat "$out/rounds")
  interleave=$(cat "$out/interleave")
  only=$(cat "$out/only")
  dev=${RDX_DEVICE:-rxe0}
  mkdir -p "$out/perftest"
  mapfile -t plan < "$out/plan.txt"

  # One rdx_bench run on port $2, results named rdx_bench_$1.*: the client on
  # node 0 (further arguments, a filter, go to it), the responder on node 1.
  rdx_run() {
    local tag=$1 port=$2 rc=0
    shift 2
    if [[ "$RDX_NODE" == 0 ]]; then
      "$bench" "${bench_args[@]}" "$@" --rdx_order=$order --rdx_port="$port" \
        --benchmark_out="$out/rdx_bench_$tag.json" --benchmark_out_format=json --benchmark_color=false \
        > "$out/rdx_bench_$tag.txt" 2> "$out/rdx_bench_$tag.err" < /dev/null || rc=$?
      # 3: some benchmarks failed, the others are in the JSON; anything else ends the run.
      if ((rc != 0)); then
        echo "rdx_bench client ($tag): status $rc:"; tail -5 "$out/rdx_bench_$tag.err"
        ((rc == 3)) || exit 1
      fi
    else
      "$bench" "${bench_args[@]}" --rdx_port="$port" > "$out/responder_$tag.txt" 2>&1 < /dev/null || {
        echo "rdx_bench responder ($tag) failed (status $?):"; cat "$out/responder_$tag.txt"; exit 1; }
    fi
  }

  # perftest for one plan line (op size depth count) on port $5: one process pair.
  perftest_run() {
    local op=$1 size=$2 depth=$3 count=$4 port=$5 group
    local tool=ib_$op
    local args=(-d "$dev" -x 1 -F -s "$size" -n "$count" -p "$port")
    case $op in
      *_bw)
        group=$(( depth / 4 )); (( group < 1 )) && group=1
        args+=(-t "$depth" -Q "$group")
        [[ $op == read_bw ]] && args+=(-o "$(( depth < 16 ? depth : 16 ))")
        ;;
    esac
    # The same inline threshold as rdx's default (64 B) for writes and sends.
    [[ $op != read_* ]] && args+=(-I 64)
    local log="$out/perftest/${op}_s${size}_d${depth}_r${round}.txt"
    if [[ "$RDX_NODE" == 0 ]]; then
      echo "${tool} ${args[*]} $RDX_PEER_ADDR" > "$log"
      local ok=0
      for try in $(seq 1 100); do
        if timeout 300 "$tool" "${args[@]}" "$RDX_PEER_ADDR" >> "$log" 2>&1 < /dev/null; then ok=1; break; fi
        # Not listening yet (the server of this figure is still starting): try again.
        grep -q "Couldn't connect\|Unable to open\|Failed to connect" "$log" || break
        sleep 0.3
      done
      [[ $ok == 1 ]] || echo "perftest: $tool size $size depth $depth failed, see $log"
    else
      timeout 300 "$tool" "${args[@]}" > "$log.server" 2>&1 < /dev/null || echo "perftest server $tool size $size failed"
    fi
  }

  # The rdx_bench figures that a plan line's perftest run is compared with:
  # raw and rdx twins, paired runs, channels (copying chan_send_*, zero-copy
  # chan_zc_*), windows, striped variants.
  figure_filter() {
    local op=$1 size=$2 depth=$3 tail="/size:$2" ops
    [[ $op == *_bw ]] && tail+="/depth:$depth"
    ops="(chan_|window_)?$op"
    [[ $op == send_* ]] && ops+="|chan_zc_${op#send_}"
    echo "^fabric/(paired/)?($ops)(/(raw|rdx))?$tail(/|\$)"
  }

  for ((round = 1; round <= rounds; round++)); do
    # Twins back to back; which one goes first alternates by round.
    order=raw_first
    ((round % 2 == 0)) && order=rdx_first
    if ((interleave)); then
      # Figure by figure: rdx_bench's figures of a plan line, then perftest's,
      # so that the host's load moves little between the two.
      filters=()
      for ((i = 0; i < ${#plan[@]}; i++)); do
        read -r op size depth count <<< "${plan[$i]}"
        filters+=("$(figure_filter "$op" "$size" "$depth")")
        [[ "$RDX_NODE" == 0 ]] && echo "round $round of $rounds: figure $((i + 1)) of ${#plan[@]}: $op size $size depth $depth ($order, then perftest)"
        rdx_run "r$round.f$((i + 1))" $((10000 + 1000 * round + i)) --benchmark_filter="${filters[$i]}"
        perftest_run "$op" "$size" "$depth" "$count" $((31000 + 1000 * round + i))
      done
      # Every figure no plan line names (the micro benchmarks, shapes perftest
      # does not run), unless --only narrowed the plan.
      all=$(IFS='|'; echo "${filters[*]}")
      if [[ -z "$only" ]]; then
        [[ "$RDX_NODE" == 0 ]] && echo "round $round of $rounds: the other rdx_bench figures"
        rdx_run "r$round.rest" $((10000 + 1000 * round + 999)) --benchmark_filter="-($all)"
      fi
    else
      [[ "$RDX_NODE" == 0 ]] && echo "round $round of $rounds: rdx_bench ($order)"
      if [[ -n "$only" ]]; then
        filters=()
        for line in "${plan[@]}"; do
          read -r op size depth count <<< "$line"
          filters+=("$(figure_filter "$op" "$size" "$depth")")
        done
        rdx_run "r$round" $((18600 + round)) --benchmark_filter="$(IFS='|'; echo "${filters[*]}")"
      else
        rdx_run "r$round" $((18600 + round))
      fi
      # perftest: one process pair per figure, a distinct port each.
      [[ "$RDX_NODE" == 0 ]] && echo "round $round of $rounds: perftest"
      for ((i = 0; i < ${#plan[@]}; i++)); do
        read -r op size depth count <<< "${plan[$i]}"
        perftest_run "$op" "$size" "$depth" "$count" $((19001 + 200 * round + i))
      done
    fi
  done
  exit 0
fi

# ----------------------------------------------------------------------------
# On the host.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
sizes=default
only=""
reps=1
rounds=1
interleave=1
out=""
build=$root/build-bench
do_build=1
timeout=3000
extra=()
while (($#)); do
  case $1 in
    --sizes) sizes=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --no-interleave) interleave=0; shift ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --timeout) timeout=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "run_fabric.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$out" ]] || out=$build/fabric-results/$(date -u +%Y%m%dT%H%M%SZ)

if ((do_build)); then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRDX_WARNINGS_AS_ERRORS=ON > /dev/null
  cmake --build "$build" --target rdx_bench
fi
bench=$build/bench/rdx_bench
[[ -x "$bench" ]] || { echo "run_fabric.sh: $bench not built (is libbenchmark-dev installed?)" >&2; exit 1; }
for t in ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat; do
  command -v $t > /dev/null || { echo "run_fabric.sh: $t not found (apt-get install perftest)" >&2; exit 1; }
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
# Counts sized for two TCG VMs (about 5 to 15 MB/s, milliseconds per round trip).
bench_args=(--rdx_sizes="$sizes" --rdx_bw_bytes=2097152 --rdx_bw_max_msgs=128 --rdx_lat_bytes=8388608
            --rdx_lat_iters=40 --benchmark_repetitions="$reps" --benchmark_min_time=0.05 "${extra[@]}")
echo "${bench_args[*]}" > "$out/rdx_bench.args"
echo "$rounds" > "$out/rounds"
echo "$interleave" > "$out/interleave"
printf '%s\n' "$only" > "$out/only"
"$bench" "${bench_args[@]}" --rdx_plan > "$out/plan.txt"
if [[ -n "$only" ]]; then
  awk -v re="$only" '$1 ~ re' "$out/plan.txt" > "$out/plan.only" ||
    { echo "run_fabric.sh: --only '$only' is not an extended regular expression" >&2; exit 2; }
  mv "$out/plan.only" "$out/plan.txt"
  [[ -s "$out/plan.txt" ]] || { echo "run_fabric.sh: --only '$only' matches no figure of the plan" >&2; exit 2; }
fi
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "host: $(nproc) cores, $(uname -r); load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "perftest: $(dpkg-query -W -f '${Version}' perftest 2>/dev/null || echo unknown)"
  echo "rdx_bench ${bench_args[*]}; rounds: $rounds; $( ((interleave)) && echo "figure by figure with perftest" || echo "rdx_bench, then perftest")"
  [[ -z "$only" ]] || echo "only: $only"
} > "$out/info.txt"
echo "run_fabric.sh: $(wc -l < "$out/plan.txt") fabric figures x (raw, rdx, perftest); results in $out"

self="$here/run_fabric.sh"
# A VM that panics while booting under a loaded host ("IO-APIC + timer doesn't
# work") leaves the other waiting; stop both and boot again (at most 3 tries).
status=1
for attempt in 1 2 3; do
  : > "$out/vm.log"
  "$root/cmake/softroce/rdx-vm" --nodes 2 --timeout "$timeout" --rw "$out" --mem 1024 \
    --node0 "'$self' --in-vm '$out' '$bench'" --node1 "'$self' --in-vm '$out' '$bench'" >> "$out/vm.log" 2>&1 &
  vm=$!
  tail -n +1 -f "$out/vm.log" --pid=$vm &
  tailer=$!
  panicked=0
  while kill -0 $vm 2>/dev/null; do
    if grep -q "Kernel panic" "$out/vm.log"; then
      panicked=1
      # The runner's VMs die with it (parent-death signal).
      kill $vm 2>/dev/null || true
      break
    fi
    sleep 1
  done
  set +e
  wait $vm
  status=$?
  set -e
  wait $tailer 2>/dev/null || true
  ((panicked)) || break
  echo "run_fabric.sh: a VM panicked while booting (attempt $attempt); booting again" >&2
  cp "$out/vm.log" "$out/vm-panic-$attempt.log"
  status=125
done
if ((status != 0)); then
  echo "run_fabric.sh: the VMs ended with status $status (see $out/vm.log); plotting what came back" >&2
fi
/usr/bin/python3 "$here/plot.py" "$out"
exit $status
