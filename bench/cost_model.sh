#!/bin/bash
# cost_model.sh: user-space instructions per operation, rdx against plain
# verbs, from one run of rdx_cost_model under valgrind's callgrind; prints a
# Markdown table (operation, rdx, raw, rdx / raw) and, with --limits, fails
# when a ratio is above its limit. Instruction counts do not move with host
# noise, so the ratios hold from run to run.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/cost_model.sh [--program PATH] [--limits FILE] [--out DIR] [--cache] [-- PROGRAM-OPTIONS]
Runs rdx_cost_model under callgrind on this host's first RDMA device (in a
Soft-RoCE VM: cmake/softroce/rdx-run-rdma -- bench/cost_model.sh ...) and
prints instructions per operation for rdx and its plain-verbs twin.
  --program PATH   rdx_cost_model (default build/release/bench/rdx_cost_model)
  --limits FILE    lines "OPERATION MAX-RATIO": exit 1 when rdx / raw is above it
                   (an operation the file names must have been measured)
  --out DIR        keep callgrind's files here (default: a temporary directory)
  --cache          also simulate the caches (callgrind --cache-sim=yes) and print
                   a second table: first-level data (D1) and last-level (LL)
                   misses per operation, rdx and raw
  -h, --help       this text
Options after -- go to rdx_cost_model (--iterations N, --warmup N, --only OPS,
--peers N, --ucx). With --ucx the table adds UCX's count and rdx / UCX (UCX_IB_GID_INDEX
and UCX_TLS default to 0 and rc_verbs,ud_verbs: see the script).
Exit 0 when every ratio is within its limit, 1 otherwise, 2 for a usage error,
77 when valgrind is not installed (apt-get install valgrind).
EOF
}

prog="" limits="" out="" cache=no args=()
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --program) [ $# -ge 2 ] || { echo "cost_model.sh: --program needs a path" >&2; exit 2; }; prog=$2; shift 2 ;;
    --limits) [ $# -ge 2 ] || { echo "cost_model.sh: --limits needs a file" >&2; exit 2; }; limits=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || { echo "cost_model.sh: --out needs a directory" >&2; exit 2; }; out=$2; shift 2 ;;
    --cache) cache=yes; shift ;;
    --) shift; args=("$@"); break ;;
    *) echo "cost_model.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
[ -n "$prog" ] || prog="$here/../build/release/bench/rdx_cost_model"
[ -x "$prog" ] || { echo "cost_model.sh: $prog is not a program: build it (cmake --build --preset release --target rdx_cost_model) or pass --program" >&2; exit 2; }
[ -z "$limits" ] || [ -r "$limits" ] || { echo "cost_model.sh: cannot read --limits $limits" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "cost_model.sh: valgrind is not installed (apt-get install valgrind): skipped" >&2; exit 77; }

if [ -z "$out" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
rm -f "$out"/cg.out*

echo "cost_model: valgrind --tool=callgrind $prog ${args[*]:-}"
# UCX 1.13 on Soft-RoCE wires up only on GID 0, and its data must go over
# verbs (rc_verbs), not shared memory, to be the twin of the others.
export UCX_IB_GID_INDEX="${UCX_IB_GID_INDEX:-0}" UCX_TLS="${UCX_TLS:-rc_verbs,ud_verbs}"
rc=0
sim=()
[ $cache = no ] || sim=(--cache-sim=yes)
valgrind --tool=callgrind "${sim[@]}" --collect-atstart=no --callgrind-out-file="$out/cg.out" -q \
  "$prog" "${args[@]}" 2>"$out/stderr.txt" || rc=$?
# valgrind's notes about the verbs ioctls it does not model are not errors.
grep -v -e '^==[0-9]*== *$' -e 'noted but unhandled ioctl' -e 'This could cause spurious' \
  -e 'See README_MISSING_SYSCALL' -e 'set address range perms' "$out/stderr.txt" >&2 || true
if [ $rc = 137 ]; then
  echo "cost_model.sh: rdx_cost_model was killed under valgrind (exit 137), most likely for memory:" \
    "with --ucx --peers 1024 UCX's 1023 more endpoint pairs need a VM of 4 GiB" \
    "(RDX_VM_MEM=4096 for cmake/softroce/rdx-run-rdma; the default is 768 MB)" >&2
  exit 1
fi
[ $rc = 0 ] || { echo "cost_model.sh: rdx_cost_model failed under valgrind (exit $rc)" >&2; exit 1; }

# One dump per pass: "desc: Trigger: Client Request: API/OP/N", "events:"
# (Ir, and with --cache-sim Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw) and
# "totals:". counts.txt: NAME IR D1 LL (D1 = D1mr + D1mw, LL = ILmr + DLmr +
# DLmw; "-" without --cache).
counts="$out/counts.txt"
: >"$counts"
for f in $(ls "$out" | grep '^cg\.out\.[0-9]*$' | sort -t. -k3 -n); do
  f="$out/$f"
  awk '
    /^desc: Trigger: Client Request: / { name = $5 }
    /^events: / { for (i = 2; i <= NF; i++) col[$i] = i }
    /^totals: / || (/^summary: / && !got) {
      got = 1
      ir = $(col["Ir"]); d1 = "-"; ll = "-"
      if ("D1mr" in col) {
        d1 = $(col["D1mr"]) + $(col["D1mw"])
        ll = $(col["ILmr"]) + $(col["DLmr"]) + $(col["DLmw"])
      }
    }
    END { if (name != "" && got) print name, ir, d1, ll }' "$f" >>"$counts"
done
[ -s "$counts" ] || { echo "cost_model.sh: callgrind wrote no pass (was rdx_cost_model built with valgrind's header?)" >&2; exit 1; }

awk -v limits="$limits" '
  BEGIN {
    if (limits != "") {
      while ((getline line < limits) > 0) {
        if (line ~ /^[ \t]*(#|$)/) continue
        split(line, f, /[ \t]+/); lim[f[1]] = f[2]; limited[++nl] = f[1]
      }
    }
  }
  {
    split($1, p, "/"); api = p[1]; op = p[2]; n = p[3]
    per[api, op] = $2 / n
    if (api == "ucx") { ucx = 1; u_op = op; sub(/@.*/, "", u_op); ucx_of[u_op] = $2 / n }
    if (!(op in seen)) { seen[op] = 1; order[++no] = op }
  }
  END {
    bad = 0
    if (ucx) {
      # UCX twins measured (--ucx): its count for the same operation, and rdx / UCX.
      print "| operation | rdx instructions | raw instructions | rdx / raw | UCX instructions | rdx / UCX | limit |"
      print "|---|---:|---:|---:|---:|---:|---:|"
    } else {
      print "| operation | rdx instructions | raw instructions | rdx / raw | limit |"
      print "|---|---:|---:|---:|---:|"
    }
    for (i = 1; i <= no; i++) {
      op = order[i]
      if (!(("rdx", op) in per)) continue
      r = per["rdx", op]; w = per["raw", op]
      ratio = w > 0 ? r / w : 0
      l = (op in lim) ? lim[op] : "-"
      base = op; sub(/@.*/, "", base)
      # A message by post and a handler has the UCX active message as its twin too.
      if (base == "channel_64_handler") base = "channel_64"
      if (ucx && (base in ucx_of)) {
        printf "| %s | %.1f | %.1f | %.3f | %.1f | %.3f | %s |\n", op, r, w, ratio, ucx_of[base], r / ucx_of[base], l
      } else if (ucx) {
        printf "| %s | %.1f | %.1f | %.3f | - | - | %s |\n", op, r, w, ratio, l
      } else {
        printf "| %s | %.1f | %.1f | %.3f | %s |\n", op, r, w, ratio, l
      }
      if (l != "-" && ratio > l + 0) { bad = 1; over = over " " op sprintf(" (%.3f > %s)", ratio, l) }
    }
    for (i = 1; i <= nl; i++) if (!(limited[i] in seen)) { bad = 1; over = over " " limited[i] " (not measured)" }
    if (bad) { print "cost_model: over the limit:" over > "/dev/stderr"; exit 1 }
    if (limits != "") print "cost_model: every ratio within its limit (" limits ")"
  }' "$counts"

# With --cache: misses per operation, rdx and raw, beside each other.
[ $cache = no ] || awk '
  {
    split($1, p, "/"); api = p[1]; op = p[2]; n = p[3]
    d1[api, op] = $3 / n; ll[api, op] = $4 / n
    if (!(op in seen)) { seen[op] = 1; order[++no] = op }
  }
  END {
    print ""
    print "| operation | rdx D1 misses | raw D1 misses | rdx LL misses | raw LL misses |"
    print "|---|---:|---:|---:|---:|"
    for (i = 1; i <= no; i++) {
      op = order[i]
      if (!(("rdx", op) in d1)) continue
      printf "| %s | %.2f | %.2f | %.2f | %.2f |\n", op, d1["rdx", op], d1["raw", op], ll["rdx", op], ll["raw", op]
    }
  }' "$counts"
