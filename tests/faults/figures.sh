#!/usr/bin/env bash
# figures.sh: the Reliability figures of README, from one run between the two
# Soft-RoCE VMs. Each wire condition (clean, 1% loss, 5 ms delay with jitter,
# reordering, 1% duplication) carries the checked soak traffic of
# tests/faults/soak.cpp for a fixed time; the table compares each condition's
# latencies with the clean wire's of the same run. See --help.
set -euo pipefail
here="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
root="$(readlink -f "$here/../..")"

# name|netem arguments (empty: a clean wire). Both VMs put them on what they send.
conditions=(
  "clean|"
  "loss|loss 1%"
  "delay|delay 5ms 1ms rate 1gbit"
  "reorder|delay 10ms reorder 15% 50%"
  "duplicate|duplicate 1%"
)

usage() {
  cat <<'EOF'
Usage: tests/faults/figures.sh [--build DIR] [--seconds S] [--clean-seconds S]
                               [--only NAME,...] [--out FILE]
       tests/faults/figures.sh --table LOG [--out FILE]
Runs the faults soak (checked messages, window writes and reads, striped over
2 queue pairs) between two Soft-RoCE VMs under each wire condition in turn,
in one boot of the VMs, and prints a Markdown table of what moved, what the
kernel retransmitted, what was lost or corrupted (must be 0) and p50/p99
latencies against the clean wire.

  --build DIR        build tree holding tests/faults/faults_soak (default build/dev)
  --seconds S        seconds of traffic per faulty condition (default 60)
  --clean-seconds S  seconds on the clean wire (default: --seconds)
  --only LIST        conditions to run (clean is always run first: the baseline);
                     of clean, loss, delay, reorder, duplicate
  --out FILE         also write the table there (default BUILD/faults-figures.md);
                     the VMs' whole output goes to BUILD/faults-figures.log
  --table LOG        no run: the table of an earlier run's log (BUILD/faults-figures.log)
  -h, --help         this text

Conditions (netem on both VMs' egress, through cmake/softroce/rdx-wire):
  clean      nothing
  loss       loss 1%
  delay      delay 5ms 1ms rate 1gbit   (the rate keeps packet order)
  reorder    delay 10ms reorder 15% 50% (netem reorders only what it delays)
  duplicate  duplicate 1%
Exit status 1 when any condition's soak failed (a mismatch, a loss, a
duplicate, a failed connection), 2 for a usage mistake.
EOF
}

# --- inside a VM: run every condition in order --------------------------------
if [[ "${1:-}" == --node ]]; then
  soak="$2" seconds="$3" clean_seconds="$4"
  shift 4
  wire="$root/cmake/softroce/rdx-wire"
  port=18800
  for c in "$@"; do
    name="${c%%|*}" args="${c#*|}"
    "$wire" clear >/dev/null 2>&1 || true
    if [[ -n "$args" ]]; then
      # shellcheck disable=SC2086 # netem's arguments are words
      "$wire" netem $args
    fi
    secs="$seconds"
    [[ "$name" == clean ]] && secs="$clean_seconds"
    status=0
    if [[ "$RDX_NODE" == 0 ]]; then
      "$soak" --role server --label "$name" --port "$port" || status=$?
    else
      echo "figures: $name ($args) for $secs s"
      "$soak" --role client --label "$name" --port "$port" --seconds "$secs" || status=$?
    fi
    echo "FIGURE label=$name node=$RDX_NODE status=$status"
    port=$((port + 10))
  done
  "$wire" clear >/dev/null 2>&1 || true
  exit 0
fi

# --- on the host ---------------------------------------------------------------
build="$root/build/dev" seconds=60 clean_seconds="" only="" out="" table_of=""
while (($#)); do
  case "$1" in
    --build) build="$(readlink -f "${2:?--build needs a directory}")"; shift 2 ;;
    --seconds) seconds="${2:?--seconds needs a number}"; shift 2 ;;
    --clean-seconds) clean_seconds="${2:?--clean-seconds needs a number}"; shift 2 ;;
    --only) only="${2:?--only needs a list}"; shift 2 ;;
    --out) out="${2:?--out needs a file}"; shift 2 ;;
    --table) table_of="${2:?--table needs a log}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "figures.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# table LOG OUT STATUS: the Markdown table of a run's log.
table() {
python3 - "$1" "$2" "$3" <<'EOF'
import re, sys
log, out, vm_status = sys.argv[1], sys.argv[2], int(sys.argv[3])
res, status = {}, {}
for line in open(log, errors="replace"):
    m = re.match(r"\[node(\d)\] (RESULT|FIGURE) (.*)", line.strip())
    if not m:
        continue
    kv = dict(f.split("=", 1) for f in m.group(3).split() if "=" in f)
    if m.group(2) == "RESULT":
        res[(kv["label"], kv["role"])] = kv
    else:
        status[(kv["label"], m.group(1))] = int(kv["status"])
order = ["clean", "loss", "delay", "reorder", "duplicate"]
netem = {"clean": "none", "loss": "loss 1%", "delay": "delay 5ms 1ms rate 1gbit",
         "reorder": "delay 10ms reorder 15% 50%", "duplicate": "duplicate 1%"}
def n(kv, k):
    return int(kv.get(k, 0)) if kv else 0
clean = res.get(("clean", "client"))
rows, failed = [], vm_status != 0
for lab in order:
    c, s = res.get((lab, "client")), res.get((lab, "server"))
    st = [status.get((lab, x)) for x in "01"]
    if c is None and st == [None, None]:
        continue
    ok = c is not None and s is not None and st == [0, 0]
    failed |= not ok
    def both(k):
        return n(c, k) + n(s, k)
    def ratio(k):
        if not c or not clean or n(clean, k) == 0:
            return "-"
        return f"{n(c, k) / n(clean, k):.1f}"
    def ms(kv, k):
        return f"{n(kv, k) / 1000:.1f}"
    rows.append("| " + " | ".join([
        lab, netem[lab], "pass" if ok else "FAILED",
        f"{float(c['seconds']):.0f}" if c else "-",
        f"{n(c, 'bytes') / 1e6:.0f}", str(n(c, "ops")),
        str(both("completer_retry_err")), str(both("rcvd_seq_err")),
        str(both("out_of_seq_request")), str(both("duplicate_request")), str(both("send_rnr_err")),
        str(n(c, "mismatches")), str(n(c, "lost")), str(n(c, "duplicates")),
        f"{ms(c, 'msg_p50_us')} / {ms(c, 'msg_p99_us')}", ratio("msg_p50_us"),
        f"{ms(c, 'write_p50_us')} / {ms(c, 'write_p99_us')}",
        f"{ms(c, 'read_p50_us')} / {ms(c, 'read_p99_us')}", ratio("read_p50_us"),
    ]) + " |")
head = ("| wire | netem (both VMs) | soak | s | MB | ops | retransmit timeouts | NAK-sequence | "
        "out of sequence | duplicate requests | RNR NAKs | checksum mismatches | lost | duplicated | "
        "message p50 / p99 ms | p50 vs clean | write p50 / p99 ms (4 KiB to 1 MiB) | read p50 / p99 ms | read p50 vs clean |")
sep = "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"
table = "\n".join([head, sep] + rows) + "\n"
open(out, "w").write(table)
print(table, end="")
if out != "/dev/null":
    print(f"figures.sh: table in {out}")
sys.exit(1 if failed or not rows else 0)
EOF
}

if [[ -n "$table_of" ]]; then
  [[ -r "$table_of" ]] || { echo "figures.sh: cannot read $table_of" >&2; exit 2; }
  status=0
  table "$table_of" "${out:-/dev/null}" 0 || status=$?
  exit "$status"
fi
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 0 ]] || { echo "figures.sh: --seconds must be a whole number above 0" >&2; exit 2; }
clean_seconds="${clean_seconds:-$seconds}"
[[ "$clean_seconds" =~ ^[0-9]+$ && "$clean_seconds" -gt 0 ]] || { echo "figures.sh: --clean-seconds must be a whole number above 0" >&2; exit 2; }
soak="$build/tests/faults/faults_soak"
[[ -x "$soak" ]] || { echo "figures.sh: no $soak: build it (cmake --build --preset dev --target faults_soak; needs libxxhash-dev)" >&2; exit 2; }
out="${out:-$build/faults-figures.md}"
log="$build/faults-figures.log"

chosen=("${conditions[0]}")
for c in "${conditions[@]:1}"; do
  name="${c%%|*}"
  if [[ -z "$only" || ",$only," == *",$name,"* ]]; then chosen+=("$c"); fi
done
if [[ -n "$only" ]]; then
  for n in ${only//,/ }; do
    [[ " clean loss delay reorder duplicate " == *" $n "* ]] || { echo "figures.sh: unknown condition '$n' (see --help)" >&2; exit 2; }
  done
fi

total=$((clean_seconds + seconds * (${#chosen[@]} - 1)))
timeout=$((total + 150 * ${#chosen[@]} + 120))
quote() { printf '%q ' "$@"; }
node_cmd="$(quote "$here/figures.sh" --node "$soak" "$seconds" "$clean_seconds" "${chosen[@]}")"
echo "figures.sh: ${#chosen[@]} conditions, $total s of traffic, VMs bounded at $timeout s; output in $log"
set +e
"$root/cmake/softroce/rdx-run-twonode" --timeout "$timeout" --node0 "$node_cmd" --node1 "$node_cmd" 2>&1 |
  tee "$log" | grep --line-buffered -E '^\[node1\] (figures:|soak client:)|FAILED|FIGURE .*status=[1-9]'
vm_status=${PIPESTATUS[0]}
set -e

table "$log" "$out" "$vm_status"
