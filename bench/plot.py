#!/usr/bin/python3
"""Collects one fabric run of bench/run_fabric.sh: rdx_bench's JSON (rdx and
its plain-verbs twins) and perftest's logs. Writes figures.csv and
figures.json (every figure), fabric.png (bandwidth and latency against message
size) and prints the table of ratios with the targets.

    /usr/bin/python3 bench/plot.py RESULTS_DIR

Needs Debian's python3-matplotlib for the PNG only (run with /usr/bin/python3);
without it the table, CSV and JSON are still written.
"""
import csv
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

# Targets (checked and printed, never enforced).
RDX_RAW_LAT_MAX = 1.03
RDX_RAW_BW_MIN = 0.97
RDX_PT_BW_MIN = 1.00      # from PT_BW_FROM bytes up
PT_BW_FROM = 64 * 1024
RDX_PT_LAT_MAX = 1.05
# channel<T> send bandwidth against raw send at 4 KiB and 64 KiB, every depth:
# checked for the copying channel (chan_send_bw) and the zero-copy one
# (chan_zc_bw: send_registered, receive_view) alike, and listed apart.
CHAN_RAW_BW_MIN = 0.95
CHAN_SIZES = (4096, 65536)
CHAN_KINDS = {"chan_send_bw": "copying", "chan_zc_bw": "zero-copy"}

MIB = 1048576 / 1e6       # perftest's MB/sec is MiB/s; figures here are MB/s (10^6 B/s)

PAIRED = re.compile(r"^fabric/paired/([a-z_]+)/size:(\d+)(?:/depth:(\d+))?(?:/qps:(\d+))?")
NAME = re.compile(r"^(fabric|micro)/([a-z_]+)/(raw|rdx)(?:/size:(\d+))?(?:/depth:(\d+))?(?:/qps:(\d+))?(?:/batch:(\d+))?")
PT_FILE = re.compile(r"^([a-z]+_(?:bw|lat))_s(\d+)_d(\d+)_r(\d+)\.txt$")
PT_BW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
# bytes, iterations, t_min, t_max, t_typical, ... (t_stdev may read -nan)
PT_LAT = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s")


def to_ns(value, unit):
    return value * {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[unit]


def kind_of(op):
    return "bw" if "_bw" in op else ("lat" if "_lat" in op else "micro")


# Which plain-verbs twin and which perftest program each figure is read against.
CHAN_TWINS = {"chan_send_bw": "send_bw", "chan_send_lat": "send_lat",
              "chan_zc_bw": "send_bw", "chan_zc_lat": "send_lat"}


def raw_twin(op):
    return CHAN_TWINS.get(op, op)


def perftest_twin(op):
    base = op.removesuffix("_2qp")
    return {"window_write_bw": "write_bw", "window_read_bw": "read_bw", "window_read_lat": "read_lat",
            **CHAN_TWINS}.get(base, base)


# (source, op, size, depth) -> {round: [figures]}: rdx/perftest is judged within a round.
ROUNDS = defaultdict(lambda: defaultdict(list))
ROUND_OF = re.compile(r"_r(\d+)\.")


def load_rdx(out):
    """(source, op, size, depth) -> list of figures (every round and repetition); errors; context."""
    samples, errors, context = defaultdict(list), [], {}
    paths = sorted(out.glob("rdx_bench*.json"))
    if not paths:
        return samples, [f"no rdx_bench*.json in {out} (rdx_bench did not finish)"], {}
    for path in paths:
        rm = ROUND_OF.search(path.name)
        rnd = int(rm.group(1)) if rm else 0
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            errors.append(f"{path.name}: {e}")
            continue
        context = data.get("context", context)
        for b in data.get("benchmarks", []):
            if b.get("run_type", "iteration") != "iteration":
                continue
            pm = PAIRED.match(b.get("run_name") or b["name"])
            if pm:
                if b.get("error_occurred"):
                    errors.append(f"{path.name}: {b['name']}: {b.get('error_message')}")
                elif "vs_raw" in b:
                    what, size, depth, qps = pm.groups()
                    op = what + ("_2qp" if qps == "2" else "")
                    samples[("paired", op, int(size), int(depth or 1))].append(b["vs_raw"])
                continue
            m = NAME.match(b.get("run_name") or b["name"])
            if not m:
                continue
            kind, what, api, size, depth, qps, batch = m.groups()
            if b.get("error_occurred"):
                errors.append(f"{path.name}: {b['name']}: {b.get('error_message')}")
                continue
            if kind == "fabric":
                value = b["MBps"] if "_bw" in what else b["lat_us"]
                op = what + ("_2qp" if qps == "2" else "")
                key = (api, op, int(size), int(depth or 1))
                ROUNDS[key][rnd].append(value)
            else:
                value = to_ns(b["real_time"], b.get("time_unit", "ns"))
                key = (api, "micro_" + what, int(batch or 0), 0)
            samples[key].append(value)
    return samples, errors, context


def load_perftest(out):
    samples, errors = defaultdict(list), []
    folder = out / "perftest"
    if not folder.is_dir():
        return samples, ["perftest logs missing"]
    for f in sorted(folder.iterdir()):
        m = PT_FILE.match(f.name)
        if not m:
            continue
        op, size, depth = m.group(1), int(m.group(2)), int(m.group(3))
        value = None
        for line in f.read_text(errors="replace").splitlines():
            if op.endswith("_bw"):
                lm = PT_BW.match(line)
                if lm and int(lm.group(1)) == size:
                    # Two columns carry the figure: MiB/s with 2 decimals and
                    # millions of messages/s with 6. The first rounds small
                    # messages to 0, the second large ones (at 1 MiB, 8.4 or
                    # 9.4 MB/s and nothing between): take whichever rounds less.
                    mib, rate = float(lm.group(4)), float(lm.group(5))
                    rate_err = 5e-7 / rate if rate > 0 else float("inf")
                    mib_err = 5e-3 / mib if mib > 0 else float("inf")
                    value = rate * size if rate_err <= mib_err else mib * MIB
                    break
            else:
                lm = PT_LAT.match(line)
                if lm and int(lm.group(1)) == size:
                    value = float(lm.group(5))                # t_typical (median), usec
                    break
        if value is None:
            errors.append(f"perftest {f.name}: no result line")
        else:
            samples[("perftest", op, size, depth)].append(value)
            ROUNDS[("perftest", op, size, depth)][int(m.group(4))].append(value)
    return samples, errors


def per_round(a, b):
    """Median over rounds of median(a in round) / median(b in round), or None without a shared round."""
    ra, rb = ROUNDS.get(a, {}), ROUNDS.get(b, {})
    ratios = [statistics.median(ra[r]) / statistics.median(rb[r]) for r in ra if rb.get(r) and statistics.median(rb[r])]
    return statistics.median(ratios) if ratios else None


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def spread(values):
    """Half the relative range of repetitions: the noise a ratio is read against."""
    if not values or len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return (max(values) - min(values)) / (2 * med) if med else 0.0


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    rdx, rdx_err, context = load_rdx(out)
    pt, pt_err = load_perftest(out)
    samples = {**rdx, **pt}

    # Every figure.
    rows = []
    for (source, op, size, depth), values in sorted(samples.items()):
        unit = "ratio" if source == "paired" else {"bw": "MB/s", "lat": "us", "micro": "ns"}[kind_of(op)]
        rows.append({"source": source, "op": op, "size": size, "depth": depth, "unit": unit, **summary(values),
                     "values": values})
    with open(out / "figures.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["source", "op", "size", "depth", "unit", "median", "min", "max", "n"])
        for r in rows:
            w.writerow([r["source"], r["op"], r["size"], r["depth"], r["unit"], f"{r['median']:.6g}",
                        f"{r['min']:.6g}", f"{r['max']:.6g}", r["n"]])

    # Ratios and targets.
    order = lambda c: (kind_of(c[0]) == "micro", c[0].startswith(("window", "chan")), kind_of(c[0]), c[0], c[2], c[1])
    configs = sorted({(op, size, depth) for (src, op, size, depth) in samples if src in ("rdx", "raw", "paired")}, key=order)
    table, misses, checked = [], [], 0
    chan_checks = []   # the channel target, per figure: (op, size, depth, judged ratio, verdict)
    lines = []
    hdr = (f"{'figure':<30}{'rdx':>10}{'raw':>10}{'perftest':>10}{'rdx/raw':>9}{'noise':>7}{'paired':>8}"
           f"{'rdx/pt':>8}  targets")
    lines.append(hdr)
    lines.append("-" * (len(hdr) + 30))
    for op, size, depth in configs:
        r = samples.get(("rdx", op, size, depth))
        w = samples.get(("raw", raw_twin(op), size, depth))
        p = samples.get(("perftest", perftest_twin(op), size, depth))
        med = lambda v: statistics.median(v) if v else None
        mr, mw, mp = med(r), med(w), med(p)
        rr = mr / mw if mr and mw else None
        # rdx/perftest within each round (perftest runs right after rdx_bench
        # in every round), the median over rounds; else of all the medians.
        rp_medians = mr / mp if mr and mp else None
        rp = per_round(("rdx", op, size, depth), ("perftest", perftest_twin(op), size, depth))
        rp = rp if rp is not None else rp_medians
        kind = kind_of(op)
        bw, lat = kind == "bw", kind == "lat"
        best_of = max if bw else min
        rb = best_of(r) / best_of(w) if r and w and best_of(w) else None
        pr = samples.get(("paired", op, size, depth))
        noise = max(spread(r or []), spread(w or []), spread(pr or []))
        rpair = statistics.median(pr) if pr else None
        checks = []

        def check(name, ok, within_noise=False):
            nonlocal checked
            checked += 1
            verdict = "ok" if ok else ("MISS~" if within_noise else "MISS")
            checks.append(f"{name} {verdict}")
            if not ok:
                misses.append({"op": op, "size": size, "depth": depth, "target": name, "rdx": mr, "raw": mw,
                               "perftest": mp, "rdx_raw": rr, "rdx_raw_best": rb, "rdx_raw_paired": rpair,
                               "rdx_perftest": rp,
                               "noise": noise, "within_noise": within_noise})

        # rdx/raw is judged on the paired ratio where there is one (both twins
        # alternating within one run), else on the medians of the separate runs.
        # Within noise: the other estimate meets it, or the miss lies inside the spread of the runs.
        judged = rpair if rpair is not None else rr
        other = rr if rpair is not None else rb
        if judged is not None and bw:
            check(f"raw>={RDX_RAW_BW_MIN}", judged >= RDX_RAW_BW_MIN,
                  (other or 0) >= RDX_RAW_BW_MIN or judged >= 1 - noise)
        if judged is not None and lat:
            check(f"raw<={RDX_RAW_LAT_MAX}", judged <= RDX_RAW_LAT_MAX,
                  (other or 9) <= RDX_RAW_LAT_MAX or judged <= 1 + noise)
        if judged is not None and op in CHAN_KINDS and size in CHAN_SIZES:
            check(f"chan>={CHAN_RAW_BW_MIN}", judged >= CHAN_RAW_BW_MIN,
                  (other or 0) >= CHAN_RAW_BW_MIN or judged >= 1 - noise)
            chan_checks.append((op, size, depth, judged, checks[-1].split()[-1]))
        if rp is not None and bw and size >= PT_BW_FROM:
            check("pt>=1", rp >= RDX_PT_BW_MIN)
        if rp is not None and lat:
            check(f"pt<={RDX_PT_LAT_MAX}", rp <= RDX_PT_LAT_MAX)
        unit = {"bw": "MB/s", "lat": "us", "micro": "ns"}[kind]
        name = f"{op} {size}" + (f" d{depth}" if bw else "")
        fmt = lambda v: f"{v:10.4g}" if v is not None else f"{'-':>10}"
        fr = lambda v, n=9: f"{v:{n}.3f}" if v is not None else f"{'-':>{n}}"
        lines.append(f"{name:<30}{fmt(mr)}{fmt(mw)}{fmt(mp)}{fr(rr)}{noise * 100:6.0f}%{fr(rpair, 8)}{fr(rp, 8)}  "
                     f"{', '.join(checks)}")
        table.append({"op": op, "size": size, "depth": depth, "unit": unit, "rdx": mr, "raw": mw, "perftest": mp,
                      "rdx_raw": rr, "rdx_raw_best": rb, "rdx_raw_paired": rpair, "rdx_perftest": rp,
                      "rdx_perftest_of_medians": rp_medians, "noise": noise, "checks": checks,
                      "runs": len(r or [])})

    print()
    print(f"Fabric: {context.get('rdx_mode', '?')} on {context.get('rdx_device', '?')}; "
          "bandwidth in MB/s (10^6 B/s), latency in us (median; write and send: half a round trip), micro in ns")
    print("rdx, raw, perftest: medians of all runs. rdx/raw: of those medians (twins back to back, every round);\n"
          "paired: median over rounds of rdx/raw from one run in which both alternate in 8 blocks each (judged when "
          "present);\nnoise: half the relative range of the separate runs (and of the paired ratios); MISS~: missed, but the other estimate "
          "meets it or the miss lies inside the noise.\nchan_send_* (copying channel) and chan_zc_* (zero-copy: "
          "send_registered, receive_view) are read against raw send_*,\nwindow_* against "
          "raw verbs on queue pairs of the same depth; perftest: ib_write/read/send_*;\n"
          "rdx/pt: median over rounds of rdx/perftest within the round (perftest runs right after rdx_bench)")
    print("\n".join(lines))
    print(f"\ntargets: {checked - len(misses)} of {checked} met; {len(misses)} missed "
          f"({sum(m['within_noise'] for m in misses)} within noise)")
    chan_summary = {}
    sizes_text = " and ".join(f"{s // 1024} KiB" for s in CHAN_SIZES)
    print(f"channel<T> send bandwidth >= {CHAN_RAW_BW_MIN} of raw send at {sizes_text} (rdx/raw, paired where run):")
    for op, kind in CHAN_KINDS.items():
        mine = [c for c in chan_checks if c[0] == op]
        met = sum(c[4] == "ok" for c in mine)
        chan_summary[kind] = {"op": op, "met": met, "checked": len(mine),
                              "figures": [{"size": c[1], "depth": c[2], "ratio": c[3], "verdict": c[4]} for c in mine]}
        figures = ", ".join(f"{c[1]} d{c[2]} {c[3]:.3f} {c[4]}" for c in mine) or "not measured"
        print(f"  {kind:<9} ({op}): {met} of {len(mine)} met: {figures}")
    for e in rdx_err + pt_err:
        print("error:", e)

    (out / "figures.json").write_text(json.dumps({
        "context": context, "info": (out / "info.txt").read_text() if (out / "info.txt").exists() else "",
        "figures": rows, "ratios": table, "misses": misses, "errors": rdx_err + pt_err,
        "channel_target": chan_summary,
        "targets": {"rdx_raw_lat_max": RDX_RAW_LAT_MAX, "rdx_raw_bw_min": RDX_RAW_BW_MIN,
                    "rdx_perftest_bw_min": RDX_PT_BW_MIN, "perftest_bw_from": PT_BW_FROM,
                    "rdx_perftest_lat_max": RDX_PT_LAT_MAX, "chan_raw_bw_min": CHAN_RAW_BW_MIN,
                    "chan_sizes": list(CHAN_SIZES)}}, indent=1))
    (out / "table.txt").write_text("\n".join(lines) + "\n")
    plot(out, samples, context)
    return 0


def plot(out, samples, context):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        print("note: matplotlib not importable (run with /usr/bin/python3): no PNG")
        return
    colors = {"write": "tab:blue", "read": "tab:orange", "send": "tab:green"}
    styles = {"rdx": "-", "raw": "--", "perftest": ":"}
    markers = {1: "o", 64: "^"}
    fig, (ax_bw, ax_lat) = plt.subplots(1, 2, figsize=(13, 5))
    series = defaultdict(list)
    for (source, op, size, depth), values in samples.items():
        if source not in styles or kind_of(op) == "micro" or op.startswith(("window", "chan")):
            continue
        series[(source, op, depth)].append((size, statistics.median(values)))
    for (source, op, depth), pts in sorted(series.items()):
        pts.sort()
        ax = ax_bw if kind_of(op) == "bw" else ax_lat
        ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=styles[source], color=colors[op.split("_")[0]],
                marker=markers.get(depth, "s"), markersize=4, linewidth=1.4 if source == "rdx" else 1.1)
    for ax, title, ylabel in ((ax_bw, "Bandwidth", "MB/s"), (ax_lat, "Latency (median)", "us")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], color=c, label=k) for k, c in colors.items()]
    handles += [Line2D([], [], color="black", linestyle=s, label=k) for k, s in styles.items()]
    handles += [Line2D([], [], color="black", marker=m, linestyle="", label=f"depth {d}") for d, m in markers.items()]
    ax_bw.legend(handles=handles, fontsize=8, ncol=3)
    mode = context.get("rdx_mode", "?")
    fig.suptitle(f"rdx vs plain verbs vs perftest: Soft-RoCE ({context.get('rdx_device', '?')}), {mode}, qemu TCG")
    fig.tight_layout()
    fig.savefig(out / "fabric.png", dpi=110)
    print(f"wrote {out / 'fabric.png'}, {out / 'figures.csv'}, {out / 'figures.json'}")


if __name__ == "__main__":
    sys.exit(main())
