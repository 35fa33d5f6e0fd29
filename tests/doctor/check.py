#!/usr/bin/env python3
"""Runs rdx-doctor --json and checks what it reported.

  check.py [--exit N] [--status CHECK=STATUS]... [--text CHECK=SUBSTRING]...
           [--fact CHECK.KEY=VALUE]... [--worst STATUS] -- COMMAND...

--status: at least one finding of CHECK, and every one of them has STATUS.
--text:   some finding of CHECK has SUBSTRING in its message or its fix.
--fact:   some finding of CHECK has facts[KEY] == VALUE.
--worst:  no finding is worse than STATUS (ok < note < warning < error).
Prints every finding, then each failed expectation; exits 1 when any failed.
"""
import argparse
import json
import subprocess
import sys

RANK = {"ok": 0, "note": 1, "warning": 2, "error": 3}


def pair(text, sep):
    k, _, v = text.partition(sep)
    if not k or not _:
        raise argparse.ArgumentTypeError(f"expected KEY{sep}VALUE, got {text!r}")
    return k, v


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--exit", type=int)
    p.add_argument("--status", action="append", default=[], type=lambda t: pair(t, "="))
    p.add_argument("--text", action="append", default=[], type=lambda t: pair(t, "="))
    p.add_argument("--fact", action="append", default=[], type=lambda t: pair(t, "="))
    p.add_argument("--worst", choices=RANK)
    p.add_argument("command", nargs="+")
    a = p.parse_args()

    run = subprocess.run(a.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(run.stderr)
    failed = []
    try:
        doc = json.loads(run.stdout)
    except json.JSONDecodeError as e:
        print(run.stdout)
        print(f"FAIL: the output is not one JSON document: {e}")
        return 1
    checks = doc.get("checks", [])
    for f in checks:
        print(f"  {f['status']:8} {f['check']:16} {f['subject']}: {f['message']}")
        if f["fix"]:
            print(f"  {'':8} {'':16} fix: {f['fix']}")
    s = doc.get("summary", {})
    if sorted(s) != sorted(RANK) or any(s[k] != sum(1 for f in checks if f["status"] == k) for k in RANK):
        failed.append(f"the summary {s} does not count the findings")
    if a.exit is not None and run.returncode != a.exit:
        failed.append(f"exit status {run.returncode}, expected {a.exit}")
    for check, status in a.status:
        mine = [f for f in checks if f["check"] == check]
        if not mine:
            failed.append(f"no finding of check {check}")
        elif any(f["status"] != status for f in mine):
            failed.append(f"{check}: statuses {[f['status'] for f in mine]}, expected all {status}")
    for check, text in a.text:
        if not any(text in f["message"] or text in f["fix"] for f in checks if f["check"] == check):
            failed.append(f"{check}: no finding mentions {text!r}")
    for key, value in a.fact:
        check, _, fact = key.partition(".")
        if check.startswith("peer") and "." in fact:  # peer.mtu.active_mtu
            more, _, fact = fact.partition(".")
            check = check + "." + more
        if not any(f["facts"].get(fact) == value for f in checks if f["check"] == check):
            got = [f["facts"].get(fact) for f in checks if f["check"] == check]
            failed.append(f"{check}: fact {fact} is {got}, expected {value!r}")
    if a.worst is not None:
        worse = [f"{f['check']} ({f['status']})" for f in checks if RANK[f["status"]] > RANK[a.worst]]
        if worse:
            failed.append(f"worse than {a.worst}: {', '.join(worse)}")
    for f in failed:
        print(f"FAIL: {f}")
    print("PASS" if not failed else f"{len(failed)} expectation(s) failed", "-", " ".join(a.command))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
