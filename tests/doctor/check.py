#!/usr/bin/env python3
"""Checks what rdx-doctor --json reported.

  check.py [EXPECTATIONS] -- COMMAND...          run COMMAND and check its output
  check.py [EXPECTATIONS] --input FILE --rc N    check an output saved earlier (exit status N)
  check.py --batch SPEC                          each line of SPEC: TITLE<tab>ARGUMENTS (as above,
                                                 shell-quoted): every case checked in one run

EXPECTATIONS: [--exit N] [--status CHECK=STATUS]... [--text CHECK=SUBSTRING]...
              [--fact CHECK.KEY=VALUE]... [--worst STATUS]
(Python starts slowly in the TCG VMs, about 10 s: the VM scripts save outputs and check them
all with one --batch.)

--status: at least one finding of CHECK, and every one of them has STATUS.
--text:   some finding of CHECK has SUBSTRING in its message or its fix.
--fact:   some finding of CHECK has facts[KEY] == VALUE.
--worst:  no finding is worse than STATUS (ok < note < warning < error).
Prints every finding, then each failed expectation; exits 1 when any failed.
"""
import argparse
import json
import shlex
import subprocess
import sys

RANK = {"ok": 0, "note": 1, "warning": 2, "error": 3}


def pair(text, sep):
    k, _, v = text.partition(sep)
    if not k or not _:
        raise argparse.ArgumentTypeError(f"expected KEY{sep}VALUE, got {text!r}")
    return k, v


def check(argv):
    """Checks one case; returns the failed expectations."""
    p = argparse.ArgumentParser()
    p.add_argument("--exit", type=int)
    p.add_argument("--status", action="append", default=[], type=lambda t: pair(t, "="))
    p.add_argument("--text", action="append", default=[], type=lambda t: pair(t, "="))
    p.add_argument("--fact", action="append", default=[], type=lambda t: pair(t, "="))
    p.add_argument("--worst", choices=RANK)
    p.add_argument("--input")
    p.add_argument("--rc", type=int)
    p.add_argument("command", nargs="*")
    a = p.parse_args(argv)

    if a.input is not None:
        with open(a.input) as f:
            stdout, returncode, what = f.read(), a.rc, a.input
    else:
        if not a.command:
            return ["neither a command nor --input"]
        run = subprocess.run(a.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(run.stderr)
        stdout, returncode, what = run.stdout, run.returncode, " ".join(a.command)
    failed = []
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError as e:
        print(stdout)
        return [f"the output of {what} is not one JSON document: {e}"]
    checks = doc.get("checks", [])
    for f in checks:
        print(f"  {f['status']:8} {f['check']:16} {f['subject']}: {f['message']}")
        if f["fix"]:
            print(f"  {'':8} {'':16} fix: {f['fix']}")
    s = doc.get("summary", {})
    if sorted(s) != sorted(RANK) or any(s[k] != sum(1 for f in checks if f["status"] == k) for k in RANK):
        failed.append(f"the summary {s} does not count the findings")
    if a.exit is not None and returncode != a.exit:
        failed.append(f"exit status {returncode}, expected {a.exit}")
    for check_name, status in a.status:
        mine = [f for f in checks if f["check"] == check_name]
        if not mine:
            failed.append(f"no finding of check {check_name}")
        elif any(f["status"] != status for f in mine):
            failed.append(f"{check_name}: statuses {[f['status'] for f in mine]}, expected all {status}")
    for check_name, text in a.text:
        if not any(text in f["message"] or text in f["fix"] for f in checks if f["check"] == check_name):
            failed.append(f"{check_name}: no finding mentions {text!r}")
    for key, value in a.fact:
        check_name, _, fact = key.rpartition(".")
        got = [f["facts"].get(fact) for f in checks if f["check"] == check_name]
        if value not in got:
            failed.append(f"{check_name}: fact {fact} is {got}, expected {value!r}")
    if a.worst is not None:
        worse = [f"{f['check']} ({f['status']})" for f in checks if RANK[f["status"]] > RANK[a.worst]]
        if worse:
            failed.append(f"worse than {a.worst}: {', '.join(worse)}")
    return failed


def main():
    argv = sys.argv[1:]
    cases = []
    if len(argv) == 2 and argv[0] == "--batch":
        with open(argv[1]) as f:
            for line in f:
                if line.strip():
                    title, _, args = line.rstrip("\n").partition("\t")
                    cases.append((title, shlex.split(args)))
    else:
        cases.append(("", argv))
    bad = 0
    for title, args in cases:
        if title:
            print(f"\n== {title}")
        failed = check(args)
        for f in failed:
            print(f"FAIL: {f}")
        print("PASS" if not failed else f"{len(failed)} expectation(s) failed")
        bad += 1 if failed else 0
    if len(cases) > 1:
        print(f"\n{len(cases) - bad} of {len(cases)} cases passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
