#!/usr/bin/env bash
# loss_curve.sh: goodput of 1 MiB striped writes and reads between the two
# Soft-RoCE VMs against packet loss (netem on both VMs), for fixed chunks and
# for the adaptive mode (connection_attr::pacing), at several ACK timeouts,
# with the kernel's retransmission counters beside each point. Every byte is
# checked (the faults soak: xxh3 of each write and read). See --help.
set -euo pipefail
here="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
root="$(readlink -f "$here/../..")"

usage() {
  cat <<'EOF'
Usage: tests/faults/loss_curve.sh [--build DIR] [--seconds S] [--rounds R]
                                  [--losses LIST] [--modes LIST] [--acks LIST]
                                  [--ack-modes LIST] [--out FILE] [--plot PNG]
       tests/faults/loss_curve.sh --table LOG [--out FILE] [--plot PNG]
Runs the faults soak with 1 MiB window writes and reads, striped over 2 queue
pairs, between two Soft-RoCE VMs, in one boot, for every loss level, chunk
mode and round, and prints a Markdown table: write and read goodput (MB/s
while a transfer was under way; median and range over the rounds), the
goodput against the same mode's clean wire, and both VMs' retransmissions
(ACK timeouts, sequence NAKs). Every byte is checked: a mismatch, a lost or
duplicated message fails the point.

  --build DIR       build tree holding tests/faults/faults_soak (default build/release)
  --seconds S       seconds of traffic per point (default 20)
  --rounds R        rounds of the whole grid, for medians and ranges (default 3)
  --losses LIST     netem loss in percent, comma-separated (default 0,0.01,0.1,0.5,1,2)
  --modes LIST      chunk modes: 64K, 256K, 1M (fixed chunks) or adaptive
                    (default 64K,256K,1M,adaptive), at the default ACK timeout
  --acks LIST       more ACK timeout codes to run (default 10,12: 4.2 and 16.8 ms;
                    rdx's default is 14, 67 ms), each with --ack-modes
  --ack-modes LIST  the modes run at those codes (default 256K,adaptive)
  --out FILE        also write the table there (default BUILD/loss-curve.md); the
                    VMs' output goes to BUILD/loss-curve.log
  --plot PNG        draw goodput against loss, writes and reads (needs matplotlib)
  --table LOG       no run: the table (and --plot) of an earlier run's log
  -h, --help        this text
Exit status 1 when a point failed its checks, 2 for a usage mistake.
EOF
}

# --- inside a VM: every point in order ------------------------------------------
if [[ "${1:-}" == --node ]]; then
  soak="$2" seconds="$3"
  shift 3
  wire="$root/cmake/softroce/rdx-wire"
  port=18900
  for point in "$@"; do
    # round|loss|mode|ack
    IFS='|' read -r round loss mode ack <<<"$point"
    "$wire" clear >/dev/null 2>&1 || true
    if [[ "$loss" != 0 ]]; then "$wire" netem loss "${loss}%" >/dev/null; fi
    args=(--sizes 1M --queue-pairs 2 --port "$port" --progress 0)
    if [[ "$mode" == adaptive ]]; then args+=(--pacing); else args+=(--chunk "$mode"); fi
    if [[ "$ack" != 14 ]]; then args+=(--ack-timeout-us "$(awk -v c="$ack" 'BEGIN { printf "%d", 4.096 * 2 ^ c }')"); fi
    label="loss=$loss,mode=$mode,ack=$ack,round=$round"
    status=0
    if [[ "$RDX_NODE" == 0 ]]; then
      timeout $((seconds + 120)) "$soak" --role server --label "$label" "${args[@]}" || status=$?
    else
      echo "loss_curve: round $round, loss $loss%, $mode, ACK timeout code $ack, $seconds s"
      timeout $((seconds + 120)) "$soak" --role client --label "$label" --seconds "$seconds" "${args[@]}" ||
        status=$?
    fi
    echo "POINT label=$label node=$RDX_NODE status=$status"
    port=$((port + 2))
  done
  "$wire" clear >/dev/null 2>&1 || true
  exit 0
fi

# --- on the host -------------------------------------------------------------------
build="$root/build/release" seconds=20 rounds=3 losses="0,0.01,0.1,0.5,1,2" modes="64K,256K,1M,adaptive"
acks="10,12" ack_modes="256K,adaptive" out="" plot="" table_of=""
while (($#)); do
  case "$1" in
    --build) build="$(readlink -f "${2:?--build needs a directory}")"; shift 2 ;;
    --seconds) seconds="${2:?}"; shift 2 ;;
    --rounds) rounds="${2:?}"; shift 2 ;;
    --losses) losses="${2:?}"; shift 2 ;;
    --modes) modes="${2:?}"; shift 2 ;;
    --acks) acks="${2-}"; shift 2 ;;
    --ack-modes) ack_modes="${2:?}"; shift 2 ;;
    --out) out="${2:?}"; shift 2 ;;
    --plot) plot="${2:?}"; shift 2 ;;
    --table) table_of="${2:?}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "loss_curve.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# table LOG OUT PLOT: the Markdown table (and the plot) of a run's log.
table() {
  python3 - "$@" <<'EOF'
import re, statistics, sys
log, out, plot = sys.argv[1], sys.argv[2], sys.argv[3]
pts, status = {}, {}
for line in open(log, errors="replace"):
    m = re.match(r"\[node(\d)\] (RESULT|POINT) (.*)", line.strip())
    if not m:
        continue
    kv = dict(f.split("=", 1) for f in m.group(3).split() if "=" in f)
    lab = dict(x.split("=") for x in kv.pop("label").split(","))
    key = (float(lab["loss"]), lab["mode"], int(lab["ack"]), int(lab["round"]))
    if m.group(2) == "POINT":
        status[(key, m.group(1))] = int(kv["status"])
    else:
        pts.setdefault(key, {})[kv["role"]] = kv
def num(kv, k):
    return float(kv.get(k, 0)) if kv else 0.0
groups = {}
failed = False
for key in sorted(set(k for k, _ in status) | set(pts)):
    c, s = pts.get(key, {}).get("client"), pts.get(key, {}).get("server")
    ok = c is not None and s is not None and status.get((key, "0")) == 0 and status.get((key, "1")) == 0
    failed |= not ok
    g = groups.setdefault(key[:3], {"w": [], "r": [], "to": [], "nak": [], "fail": 0, "chunk": [], "dec": [], "probe": []})
    if not ok:
        g["fail"] += 1
        continue
    g["w"].append(num(c, "write_MBps"))
    g["r"].append(num(c, "read_MBps"))
    g["to"].append(num(c, "completer_retry_err") + num(s, "completer_retry_err"))
    g["nak"].append(num(c, "rcvd_seq_err") + num(s, "rcvd_seq_err"))
    if c.get("pacing") == "1":
        g["chunk"].append(int(c.get("pacing_chunk", 0)) // 1024)
        g["dec"].append(int(c.get("pacing_decreases", 0)))
        g["probe"].append(int(c.get("pacing_probes", 0)))
def med(v):
    return statistics.median(v) if v else float("nan")
def rng(v):
    return f"{med(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "-"
rows = []
head = ("| loss % | chunks | ACK timeout | write MB/s, median (range) | write vs clean | "
        "read MB/s | read vs clean | retransmit timeouts | NAK-sequence | adaptive: last chunk KiB, decreases, tail probes | failed rounds |")
for (loss, mode, ack), g in sorted(groups.items(), key=lambda x: (x[0][2] != 14, x[0][2], x[0][1], x[0][0])):
    clean = groups.get((0.0, mode, ack))
    def vs(k):
        if not clean or not clean[k] or not g[k]:
            return "-"
        return f"{med(g[k]) / med(clean[k]):.2f}"
    ackms = 4.096 * 2 ** ack / 1000
    rows.append("| " + " | ".join([
        f"{loss:g}", mode, f"{ack} ({ackms:.1f} ms)", rng(g["w"]), vs("w"), rng(g["r"]), vs("r"),
        f"{med(g['to']):.0f}" if g["to"] else "-", f"{med(g['nak']):.0f}" if g["nak"] else "-",
        (f"{med(g['chunk']):.0f}, {med(g['dec']):.0f}, {med(g['probe']):.0f}" if g["chunk"] else "-"), str(g["fail"]),
    ]) + " |")
sep = "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"
text = "\n".join([head, sep] + rows) + "\n"
if out != "/dev/null":
    open(out, "w").write(text)
print(text, end="")
if plot:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, k, what in ((axes[0], "w", "1 MiB writes"), (axes[1], "r", "1 MiB reads")):
        for (mode, ack) in sorted({(m, a) for (_, m, a) in groups}):
            xs = sorted(l for (l, m, a) in groups if m == mode and a == ack and groups[(l, m, a)][k])
            if not xs:
                continue
            ys = [med(groups[(l, mode, ack)][k]) for l in xs]
            lo = [min(groups[(l, mode, ack)][k]) for l in xs]
            hi = [max(groups[(l, mode, ack)][k]) for l in xs]
            xp = [max(l, 0.003) for l in xs]  # loss 0 drawn at the left edge of the log axis
            style = "-" if ack == 14 else ":"
            line, = ax.plot(xp, ys, style, marker="o" if mode == "adaptive" else ".",
                            label=f"{mode}, ACK {4.096 * 2 ** ack / 1000:.1f} ms")
            ax.fill_between(xp, lo, hi, color=line.get_color(), alpha=0.12)
        ax.set_xscale("log")
        ax.set_xlabel("netem loss on both VMs, % (0 drawn at 0.003)")
        ax.set_title(what)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("goodput, MB/s (median; band: range)")
    axes[1].legend(fontsize=7)
    fig.suptitle("rdx on Soft-RoCE between two VMs: goodput against loss (tests/faults/loss_curve.sh)")
    fig.tight_layout()
    fig.savefig(plot, dpi=110)
    print(f"loss_curve.sh: plot in {plot}")
sys.exit(1 if failed or not rows else 0)
EOF
}

if [[ -n "$table_of" ]]; then
  [[ -r "$table_of" ]] || { echo "loss_curve.sh: cannot read $table_of" >&2; exit 2; }
  table "$table_of" "${out:-/dev/null}" "$plot"
  exit $?
fi
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 0 ]] || { echo "loss_curve.sh: --seconds must be a whole number above 0" >&2; exit 2; }
[[ "$rounds" =~ ^[0-9]+$ && "$rounds" -gt 0 ]] || { echo "loss_curve.sh: --rounds must be a whole number above 0" >&2; exit 2; }
for m in ${modes//,/ } ${ack_modes//,/ }; do
  [[ "$m" == adaptive || "$m" =~ ^[0-9]+[KM]$ ]] || { echo "loss_curve.sh: unknown mode '$m' (64K, 256K, 1M or adaptive)" >&2; exit 2; }
done
for a in ${acks//,/ }; do
  [[ "$a" =~ ^[0-9]+$ && "$a" -ge 1 && "$a" -le 31 ]] || { echo "loss_curve.sh: ACK timeout code '$a' is not 1 to 31" >&2; exit 2; }
done
soak="$build/tests/faults/faults_soak"
[[ -x "$soak" ]] || { echo "loss_curve.sh: no $soak: build it (cmake --build $build --target faults_soak)" >&2; exit 2; }
out="${out:-$build/loss-curve.md}"
log="$build/loss-curve.log"

points=()
for ((r = 1; r <= rounds; ++r)); do
  for l in ${losses//,/ }; do
    for m in ${modes//,/ }; do points+=("$r|$l|$m|14"); done
    for a in ${acks//,/ }; do
      for m in ${ack_modes//,/ }; do points+=("$r|$l|$m|$a"); done
    done
  done
done
timeout=$(((seconds + 15) * ${#points[@]} + 180))
quote() { printf '%q ' "$@"; }
node_cmd="$(quote "$here/loss_curve.sh" --node "$soak" "$seconds" "${points[@]}")"
echo "loss_curve.sh: ${#points[@]} points of $seconds s, VMs bounded at $timeout s; output in $log"
set +e
"$root/cmake/softroce/rdx-run-twonode" --timeout "$timeout" --node0 "$node_cmd" --node1 "$node_cmd" 2>&1 |
  tee "$log" | grep --line-buffered -E '^\[node1\] loss_curve:|FAILED|POINT .*status=[1-9]'
set -e
table "$log" "$out" "$plot"
