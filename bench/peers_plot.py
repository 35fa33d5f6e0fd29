#!/usr/bin/env python3
"""peers_plot.py: reads the logs bench/peers_figures.sh wrote and writes
peers.csv and peers.md beside them and a PNG plot of set-up time, memory per
peer and instructions per operation against the number of peers."""

import argparse
import csv
import os
import re
import sys

WORKER_SETUP = re.compile(r"worker: (\d+) connection pairs on two workers, set up in ([\d.]+) s \((\d+) per second\)")
WORKER_BYTES = re.compile(r"worker: (-?\d+) registered bytes per connection")
WORKER_OBJECTS = re.compile(
    r"worker: (\d+) connections: (-?\d+) queue pairs, (-?\d+) completion queues, (-?\d+) memory regions more")
WORKER_DOWN = re.compile(r"worker: (\d+) pairs torn down in ([\d.]+) s")
POOL_BYTES = re.compile(
    r"pool: registered bytes per connection: (-?\d+) by default \(connection_attr\{\}\), (-?\d+) with a ring of its "
    r"own \(recv_depth \d+, 64-byte messages\), (-?\d+) on the pool; the pool (-?\d+) \((\d+) peers: (-?\d+) per peer")
ROW = re.compile(r"^\|\s*([a-z_0-9]+)(?:@\d+(pool)?)?\s*\|(.*)\|\s*$")


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cost_rows(text):
    """{op: {"rdx": ir, "raw": ir, "rdx_d1":, "raw_d1":, "rdx_ll":, "raw_ll":}} from cost_model.sh's tables."""
    rows, cache = {}, False
    for line in text.splitlines():
        if "D1 misses" in line:
            cache = True
            continue
        m = ROW.match(line.strip())
        if not m or m.group(1) == "operation":
            continue
        cells = [c.strip() for c in m.group(3).split("|")]
        r = rows.setdefault(m.group(1), {})
        try:
            if cache:
                r["rdx_d1"], r["raw_d1"], r["rdx_ll"], r["raw_ll"] = (float(c) for c in cells[:4])
            else:
                r["rdx"], r["raw"] = float(cells[0]), float(cells[1])
                if len(cells) >= 6 and cells[3] not in ("", "-"):
                    r["ucx"] = float(cells[3])  # the --ucx table: rdx, raw, ratio, UCX, rdx / UCX, limit
        except ValueError:
            continue
    return rows


def collect(d, peers):
    table = []
    own = cost_rows(read(os.path.join(d, "cost_own.log")))
    for n in peers:
        row = {"peers": n}
        w = read(os.path.join(d, f"worker_{n}.log"))
        if m := WORKER_SETUP.search(w):
            row["setup_s"], row["setup_per_s"] = float(m.group(2)), int(m.group(3))
        if m := WORKER_BYTES.search(w):
            row["worker_bytes_per_conn"] = int(m.group(1))
        if m := WORKER_OBJECTS.search(w):
            conns = int(m.group(1))
            row["qp_per_conn"] = int(m.group(2)) / conns
            row["cq_per_conn"] = int(m.group(3)) / conns
            row["mr_per_conn"] = int(m.group(4)) / conns
        if m := WORKER_DOWN.search(w):
            row["teardown_s"] = float(m.group(2))
        p = read(os.path.join(d, f"pool_{n}.log"))
        if m := POOL_BYTES.search(p):
            row["default_bytes_per_conn"] = int(m.group(1))
            row["ring_bytes_per_conn"] = int(m.group(2))
            row["pooled_bytes_per_conn"] = int(m.group(3))
            row["pool_bytes"] = int(m.group(4))
            row["pool_bytes_per_peer"] = int(m.group(6))
        for mode in ("ring", "pool"):
            c = cost_rows(read(os.path.join(d, f"cost_{mode}_{n}.log")))
            for op in ("window_write", "channel_64"):
                for k, v in c.get(op, {}).items():
                    row[f"{op}_{mode}_{k}"] = v
        for op in ("window_write", "channel_64"):
            for k, v in own.get(op, {}).items():
                row[f"{op}_own_{k}"] = v
        table.append(row)
    return table


def fmt(v, digits=0):
    if v is None:
        return "-"
    if isinstance(v, float) and digits:
        return f"{v:.{digits}f}"
    return f"{v:,.0f}" if isinstance(v, (int, float)) else str(v)


def markdown(table):
    out = ["| peers | set-up (pairs/s) | QPs, CQs, MRs per connection | registered bytes per connection: "
           "default, small ring, on the pool (+ pool share) |",
           "|---:|---:|---|---|"]
    for r in table:
        objs = "-"
        if "qp_per_conn" in r:
            objs = f"{r['qp_per_conn']:.2f}, {r['cq_per_conn']:.2f}, {r['mr_per_conn']:.2f}"
        mem = "-"
        if "pooled_bytes_per_conn" in r:
            mem = (f"{fmt(r['default_bytes_per_conn'])}, {fmt(r['ring_bytes_per_conn'])}, "
                   f"{fmt(r['pooled_bytes_per_conn'])} (+{fmt(r['pool_bytes_per_peer'] - r['pooled_bytes_per_conn'])})")
        out.append(f"| {r['peers']} | {fmt(r.get('setup_per_s'))} | {objs} | {mem} |")
    out += ["", "| peers | operation | receives | rdx instr. | raw instr. | rdx / raw | rdx D1 / raw D1 misses "
            "| rdx LL / raw LL misses |", "|---:|---|---|---:|---:|---:|---|---|"]
    for r in table:
        for op in ("window_write", "channel_64"):
            for mode in ("ring", "pool"):
                k = f"{op}_{mode}_"
                if k + "rdx" not in r:
                    continue
                ratio = r[k + "rdx"] / r[k + "raw"] if r.get(k + "raw") else 0
                d1 = f"{fmt(r.get(k + 'rdx_d1'), 2)} / {fmt(r.get(k + 'raw_d1'), 2)}"
                ll = f"{fmt(r.get(k + 'rdx_ll'), 2)} / {fmt(r.get(k + 'raw_ll'), 2)}"
                out.append(f"| {r['peers']} | {op} | {mode} | {r[k + 'rdx']:.1f} | {r[k + 'raw']:.1f} | "
                           f"{ratio:.2f} | {d1} | {ll} |")
    if table:
        r = table[0]
        out += ["", "| operation (queues of their own) | rdx instr. | raw instr. | UCX instr. | rdx / raw | rdx / UCX "
                "| rdx D1 / raw D1 misses | rdx LL / raw LL misses |", "|---|---:|---:|---:|---:|---:|---|---|"]
        for op in ("window_write", "channel_64"):
            k = f"{op}_own_"
            if k + "rdx" not in r:
                continue
            ucx = r.get(k + "ucx")
            out.append(f"| {op} | {r[k + 'rdx']:.1f} | {r[k + 'raw']:.1f} | {fmt(ucx, 1)} | "
                       f"{r[k + 'rdx'] / r[k + 'raw']:.2f} | {fmt(r[k + 'rdx'] / ucx if ucx else None, 2)} | "
                       f"{fmt(r.get(k + 'rdx_d1'), 2)} / {fmt(r.get(k + 'raw_d1'), 2)} | "
                       f"{fmt(r.get(k + 'rdx_ll'), 2)} / {fmt(r.get(k + 'raw_ll'), 2)} |")
    return "\n".join(out) + "\n"


def series(table, key):
    pts = [(r["peers"], r[key]) for r in table if key in r and r[key] is not None and r[key] > 0]
    return [p for p, _ in pts], [v for _, v in pts]


def plot(table, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [
        (ax[0], "set-up time of all the connection pairs (s)", [("setup_s", "pairs made and connected, both ends on workers")]),
        (ax[1], "registered bytes per connection", [
            ("default_bytes_per_conn", "default connection (ring of its own)"),
            ("worker_bytes_per_conn", "ring of its own on a worker (recv_depth 8 x 64 B)"),
            ("pool_bytes_per_peer", "on a receive pool, with its share of the pool")]),
        (ax[2], "instructions per operation", [
            ("window_write_ring_rdx", "window write, rdx"),
            ("window_write_ring_raw", "window write, plain verbs"),
            ("channel_64_ring_rdx", "64-byte message, rdx (rings)"),
            ("channel_64_pool_rdx", "64-byte message, rdx (pool)"),
            ("channel_64_ring_raw", "64-byte message, plain verbs")]),
    ]
    for a, title, keys in panels:
        drawn = False
        for key, label in keys:
            xs, ys = series(table, key)
            if xs:
                a.plot(xs, ys, marker="o", label=label)
                drawn = True
        if a is ax[2]:
            # UCX's twins (connections of their own, no peers): level lines.
            for key, label, style in (("window_write_own_ucx", "UCX put + flush", "--"),
                                      ("channel_64_own_ucx", "UCX 64-byte active message", ":")):
                v = table[0].get(key) if table else None
                if v:
                    a.axhline(v, color="gray", linestyle=style, label=label)
                    a.legend(fontsize=7)
        a.set_title(title, fontsize=10)
        a.set_xlabel("peers on one worker")
        a.set_xscale("log")
        if drawn:
            a.set_yscale("log")
            a.legend(fontsize=7)
        else:
            a.text(0.5, 0.5, "not measured", ha="center", transform=a.transAxes)
        a.grid(True, which="both", alpha=0.3)
    fig.suptitle("rdx: many peers on one worker thread (Soft-RoCE, one VM; bench/peers_figures.sh)", fontsize=11)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", required=True, help="the logs of bench/peers_figures.sh")
    ap.add_argument("--peers", default="1 16 64 256 1024", help="the peer counts measured")
    ap.add_argument("--png", help="write the plot here")
    a = ap.parse_args()
    peers = [int(p) for p in a.peers.split()]
    table = collect(a.dir, peers)
    keys = sorted({k for r in table for k in r}, key=lambda k: (k != "peers", k))
    with open(os.path.join(a.dir, "peers.csv"), "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(table)
    md = markdown(table)
    with open(os.path.join(a.dir, "peers.md"), "w", encoding="utf-8") as f:
        f.write(md)
    sys.stdout.write(md)
    missing = [r["peers"] for r in table if "setup_per_s" not in r or "window_write_ring_rdx" not in r]
    if a.png:
        plot(table, a.png)
        print(f"peers_plot: wrote {a.png}")
    if missing:
        print(f"peers_plot: no figures for {missing} peers: see the logs in {a.dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
