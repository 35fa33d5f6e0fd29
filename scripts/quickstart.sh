#!/usr/bin/env bash
# rdx quick start, for a fresh Debian 12 machine (as root, or with sudo).
#
#   sudo scripts/quickstart.sh pingpong   install what is missing, build, and run
#                                         the two-node host-memory ping-pong
#   sudo scripts/quickstart.sh test       install what is missing, build, and run
#                                         the whole test suite with a summary
#
# Both install only the Debian packages that are missing (pingpong: those the
# build and the VMs need; test adds its own) and configure the release preset
# (build/release). pingpong then builds only examples/pingpong, the one program
# it runs (the VM runner is a script: nothing of it is built); test builds
# every target. Both use the machine's RDMA device when it has one, else
# Soft-RoCE VMs (cmake/softroce/rdx-vm; the kernel package is downloaded once
# into ${RDX_SOFTROCE_CACHE:-~/.cache/rdx-softroce}).
#
# Environment:
#   RDX_PINGPONG   auto (default: rdx's examples/pingpong once built, else
#                  rdma-core's ibv_rc_pingpong), rdx, or ibv_rc_pingpong
#   RDX_ITERS      ping-pong round trips (default 1000)
#   RDX_SIZE       ping-pong message size in bytes (default 4096)
#   RDX_DEVICE     use this RDMA device natively
#   RDX_NO_INSTALL=1  install nothing (fail if something is missing)
#   RDX_QUICKSTART_SETUP=0  skip installing and building: use build/release as is
#   RDX_VM_BOOT_EACH=1  test: boot the VMs anew for every fabric test instead of
#                  running each pass's tests in pooled VMs (RDX_VM_POOL in
#                  cmake/softroce/rdx-vm: booted once, made fresh between tests)
#   JOBS           build and test parallelism (default: nproc)
set -euo pipefail

ROOT="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
PRESET=release
BUILD="$ROOT/build/$PRESET"
JOBS="${JOBS:-$(nproc)}"
RDX_VM="$ROOT/cmake/softroce/rdx-vm"

# What the build and the Soft-RoCE VMs need (enough for the ping-pong), and
# what the whole test suite adds (sanitizers, fuzzing, benchmarks, docs, UCX,
# mpirun and PMIx).
PACKAGES=(
  build-essential file cmake ninja-build pkg-config catch2 libxxhash-dev
  libibverbs-dev librdmacm-dev libssl-dev rdma-core ibverbs-utils ibverbs-providers rdmacm-utils
  qemu-system-x86 busybox-static cpio xz-utils iproute2 util-linux
)
TEST_PACKAGES=(
  libbenchmark-dev python3-matplotlib perftest clang-14 libclang-rt-14-dev clang-format clang-tidy doxygen valgrind libucx-dev
  openmpi-bin libpmix-dev
)

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
log() { printf '\n==> %s\n' "$*"; }
t0=$SECONDS
phase_start=$SECONDS
timings=()
phase_done() {
  timings+=("$(printf '%-10s %4ds' "$1" $((SECONDS - phase_start)))")
  phase_start=$SECONDS
}

native_device() {
  if [[ -n "${RDX_DEVICE:-}" ]]; then
    echo "$RDX_DEVICE"
  else
    ls /sys/class/infiniband 2>/dev/null | head -n 1
  fi
}

# ------------------------------------------------------------------ set-up --
install_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    echo "all ${#PACKAGES[@]} Debian packages are installed"
    return 0
  fi
  if [[ "${RDX_NO_INSTALL:-0}" == 1 ]]; then
    echo "missing Debian packages: ${missing[*]}" >&2
    exit 1
  fi
  if ((EUID != 0)); then
    echo "missing Debian packages: ${missing[*]}" >&2
    echo "run as root: sudo $0 ${cmd}" >&2
    exit 1
  fi
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt_updated=1
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The VMs' kernel: downloaded once, then cached with the initramfs.
prepare_vm() {
  if ! "$RDX_VM" --prepare >/dev/null 2>"$BUILD.vm-prepare.log"; then
    if ((EUID == 0)) && [[ "${apt_updated:-0}" == 0 ]]; then
      # The package lists may be old or absent: refresh them once and retry.
      apt-get update -qq
      apt_updated=1
      "$RDX_VM" --prepare >/dev/null 2>"$BUILD.vm-prepare.log" || { cat "$BUILD.vm-prepare.log" >&2; exit 1; }
    else
      cat "$BUILD.vm-prepare.log" >&2
      exit 1
    fi
  fi
  grep -v '^$' "$BUILD.vm-prepare.log" || true
  rm -f "$BUILD.vm-prepare.log"
  echo "Soft-RoCE VM kernel and initramfs ready"
}

# Configures the release preset and builds the targets named (every target
# when none is named).
configure_and_build() {
  local targets=("$@") what="every target"
  cd "$ROOT"
  cmake --preset "$PRESET" >"$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log" >&2; exit 1; }
  grep -E '^-- rdx:' "$BUILD.configure.log" || true
  if ((${#targets[@]} > 0)); then
    what="only ${targets[*]}, the program this command runs (the VMs need nothing built; scripts/quickstart.sh test builds every target)"
    targets=(--target "${targets[@]}")
  elif [[ "$cmd" == test && "${RDX_RELEASE_ALL:-0}" != 1 ]]; then
    # The test programs that only the sanitizer pass runs are built there
    # (with warnings as errors), not here as well.
    ctest --preset "$PRESET" --show-only=json-v1 >"$BUILD/ctest-all.json"
    mapfile -t targets < <(release_targets "$BUILD" "$BUILD/ctest-all.json")
    what="every target but the $(($(wc -l <"$BUILD/default-targets.txt") - ${#targets[@]})) test programs only the sanitizer pass runs"
    targets=(--target "${targets[@]}")
  fi
  cmake --build --preset "$PRESET" -j "$JOBS" "${targets[@]}" -- -k 0 >"$BUILD.build.log" 2>&1 ||
    { tail -n 60 "$BUILD.build.log" >&2; echo "build failed; full log: $BUILD.build.log" >&2; exit 1; }
  echo "built $what: $(grep -c '^\[' "$BUILD.build.log" || true) steps into build/$PRESET (log: build/$PRESET.build.log)"
}

# Hands the build back to the user who ran sudo.
# Each test pass's fabric tests run in pooled VMs: booted once, then made as
# a fresh boot leaves them between tests (cmake/softroce/rdx-vm, RDX_VM_POOL).
# A VM boot under TCG took 4 to 7 s of a core, once per fabric test before.
vm_pool_start() {
  [[ "${RDX_VM_BOOT_EACH:-0}" == 1 ]] && return 0
  RDX_VM_POOL="$(mktemp -d /tmp/rdx-vm-pool.XXXXXX)"
  export RDX_VM_POOL RDX_VM_POOL_IDLE="${RDX_VM_POOL_IDLE:-60}"
}
vm_pool_stop() {
  [[ -n "${RDX_VM_POOL:-}" ]] && "$RDX_VM" --pool-stop "$RDX_VM_POOL"
  unset RDX_VM_POOL
}

# ctest starts the longest tests first once it knows their times (from its
# Testing/Temporary/CTestCostData.txt); a fresh clone knows none and starts
# them in the order they are declared, leaving a long one for last. The
# files in tests/ctest-costs/ (name, runs, seconds: one CI run's times,
# pooled VMs) seed a build tree that has none; ctest keeps them up to date.
seed_test_costs() {
  local build="$1" seed="$ROOT/tests/ctest-costs/$2.txt" t="$1/Testing/Temporary/CTestCostData.txt"
  [[ -f "$t" || ! -f "$seed" ]] && return 0
  mkdir -p "${t%/*}"
  cp "$seed" "$t"
}

give_back_build() {
  vm_pool_stop
  if [[ -n "${SUDO_UID:-}" && -d "$BUILD" ]]; then
    chown -R "$SUDO_UID:${SUDO_GID:-$SUDO_UID}" "$ROOT/build" 2>/dev/null || true
  fi
}

setup() {
  if [[ "${RDX_QUICKSTART_SETUP:-1}" == 0 ]]; then
    [[ -d "$BUILD" ]] || { echo "no $BUILD: run once without RDX_QUICKSTART_SETUP=0" >&2; exit 1; }
    return 0
  fi
  log "Debian packages"
  install_packages
  phase_done install
  mkdir -p "$ROOT/build"
  if [[ "$1" == test || -z "$(native_device)" ]]; then
    log "Soft-RoCE VMs"
    prepare_vm
    phase_done vm-kernel
  fi
  log "configure and build (preset $PRESET)"
  if [[ "$1" == pingpong ]]; then
    # The ping-pong runs one program: build that alone, not the tests,
    # benchmarks and tools.
    configure_and_build pingpong
  else
    configure_and_build
  fi
  phase_done build
}

# ---------------------------------------------------------------- pingpong --
pingpong() {
  local iters="${RDX_ITERS:-1000}" size="${RDX_SIZE:-4096}" which="${RDX_PINGPONG:-auto}"
  local example="$BUILD/examples/pingpong" server client out dev
  if [[ "$which" == auto ]]; then
    if [[ -x "$example" ]]; then which=rdx; else which=ibv_rc_pingpong; fi
  fi
  case "$which" in
    rdx)
      server="$(printf '%q' "$example") -s $size -n $iters -p 18515"
      client="$server \$RDX_PEER_ADDR"
      ;;
    ibv_rc_pingpong)
      # -g: the GID index (rxe: 1, the RoCE v2 IPv4-mapped GID).
      server="ibv_rc_pingpong -d \$RDX_DEVICE -g \${RDX_GID_INDEX:-1} -s $size -n $iters -p 18515"
      # Its client does not retry: wait until the server listens.
      client="for i in \$(seq 100); do $server \$RDX_PEER_ADDR && exit 0; sleep 0.3; done; exit 1"
      ;;
    *) echo "RDX_PINGPONG must be auto, rdx or ibv_rc_pingpong" >&2; exit 2 ;;
  esac
  out="$BUILD/pingpong.log"
  dev="$(native_device)"
  if [[ -n "$dev" ]]; then
    log "ping-pong ($which) on the RDMA device $dev, server and client on this machine"
    export RDX_DEVICE="$dev" RDX_PEER_ADDR=127.0.0.1
    if [[ "$which" == ibv_rc_pingpong && -z "${RDX_GID_INDEX:-}" ]]; then
      RDX_GID_INDEX="$(roce_v2_ipv4_gid "$dev")"
      export RDX_GID_INDEX
    fi
    (bash -c "$server" 2>&1 | sed -u 's/^/[server] /') &
    local spid=$!
    bash -c "$client" 2>&1 | sed -u 's/^/[client] /' | tee "$out"
    wait "$spid"
  else
    log "ping-pong ($which) between two Soft-RoCE VMs (qemu, TCG: expect milliseconds, not microseconds)"
    "$RDX_VM" --nodes 2 --timeout 600 --node0 "$server" --node1 "$client" 2>&1 | tee "$out"
  fi
  phase_done pingpong
  log "result"
  if [[ "$which" == ibv_rc_pingpong ]]; then
    # "N iters in S seconds = U usec/iter" and "B bytes in S seconds = M Mbit/sec", client side.
    awk -v size="$size" '
      /(node1|client)\].* iters in .* usec\/iter/ { lat = $(NF-1) }
      /(node1|client)\].* bytes in .* Mbit\/sec/ { bw = $(NF-1) }
      END {
        if (lat == "" || bw == "") { print "no ping-pong result found"; exit 1 }
        printf "latency:   %.1f us per round trip (%d B messages)\n", lat, size
        printf "bandwidth: %.1f Mbit/s (%.2f MB/s)\n", bw, bw / 8
      }' "$out"
  else
    grep -E '(node1|client)\].*(latency|bandwidth):' "$out" | sed 's/^\[[a-z0-9]*\] //' || true
  fi
}

roce_v2_ipv4_gid() {
  local dev="$1" port=1 f i
  for f in /sys/class/infiniband/"$dev"/ports/"$port"/gids/*; do
    i="${f##*/}"
    if [[ "$(cat "$f" 2>/dev/null)" == 0000:0000:0000:0000:0000:ffff:* ]] &&
      [[ "$(cat /sys/class/infiniband/"$dev"/ports/"$port"/gid_attrs/types/"$i" 2>/dev/null)" == "RoCE v2" ]]; then
      echo "$i"
      return
    fi
  done
  echo 0
}

# -------------------------------------------------------------------- test --
# The labels of the rdma and twonode tests that run under the sanitizers
# instead of in the release pass (see run_sanitizer_tests).
SANITIZED_LABELS='rdma|twonode'
UNSANITIZED_LABELS='doctor|wire|release_only'

run_tests() {
  local junit="$BUILD/ctest-junit.xml" list="$BUILD/ctest-tests.json" rc=0 once=()
  cd "$ROOT"
  # A missing fabric is a failure here, never a silent skip.
  export RDX_REQUIRE_FABRIC=1
  ctest --preset "$PRESET" --show-only=json-v1 >"$list"
  # Each fabric test runs once: those the sanitizer pass takes run there
  # alone (the same program and assertions, with ASan and UBSan watching),
  # unless RDX_RELEASE_ALL=1.
  if [[ "${RDX_RELEASE_ALL:-0}" != 1 ]]; then
    mapfile -t once < <(sanitized_tests "$list")
  fi
  log "test suite: ctest -j$JOBS (unit, rdma, twonode; cuda where a GPU is)"
  vm_pool_start
  seed_test_costs "$BUILD" "$PRESET"
  if ((${#once[@]} > 0)); then
    echo "${#once[@]} rdma and twonode tests run once, under the sanitizers below (RDX_RELEASE_ALL=1 runs them here too)"
    ctest --preset "$PRESET" --show-only=json-v1 -E "^($(IFS='|'; echo "${once[*]}"))\$" >"$list"
    ctest --preset "$PRESET" -j "$JOBS" -E "^($(IFS='|'; echo "${once[*]}"))\$" --output-junit "$junit" || rc=$?
  else
    ctest --preset "$PRESET" -j "$JOBS" --output-junit "$junit" || rc=$?
  fi
  vm_pool_stop
  phase_done tests
  summarize "$list" "$junit" "rdx test summary (preset $PRESET)" || rc=1
  run_sanitizer_tests || rc=1
  run_fuzz_tests || rc=1
  return "$rc"
}

# The rdma and twonode tests under AddressSanitizer and
# UndefinedBehaviorSanitizer, in place of the release pass (but for rdx-doctor's reports and the soaks on a
# worse wire, labels doctor and wire: the same library paths as other tests;
# and label release_only: rdma-core's own programs, timing runs, more modes
# or sizes of a test the run already takes, and a test whose deadline ASan
# under emulation overruns), and the threading test under ThreadSanitizer.
run_sanitizer_tests() {
  local rc=0 b="$ROOT/build/asan-ubsan" t="$ROOT/build/tsan"
  log "sanitizers: rdma and twonode tests (preset asan-ubsan), threading test (preset tsan)"
  cd "$ROOT"
  # Only the programs these tests run are built (not the per-header checks,
  # unit tests, benchmarks or CUDA tests): the names come from the tests' own
  # commands.
  local targets=() tests=(-L "$SANITIZED_LABELS" -LE "$UNSANITIZED_LABELS")
  { cmake --preset asan-ubsan &&
    ctest --preset asan-ubsan "${tests[@]}" --show-only=json-v1 >"$b/ctest-tests.json" &&
    mapfile -t targets < <(test_programs "$b" "$b/ctest-tests.json") &&
    ((${#targets[@]} > 0)) &&
    echo "building ${#targets[@]} programs: ${targets[*]}" &&
    cmake --build --preset asan-ubsan -j "$JOBS" --target "${targets[@]}"; } >"$b.build.log" 2>&1 ||
    { tail -n 60 "$b.build.log" >&2; echo "asan-ubsan build failed; full log: $b.build.log" >&2; return 1; }
  echo "asan-ubsan: built ${#targets[@]} test programs (log: build/asan-ubsan.build.log)"
  phase_done asan-build
  vm_pool_start
  seed_test_costs "$b" asan-ubsan
  ctest --preset asan-ubsan "${tests[@]}" -j "$JOBS" --output-junit "$b/ctest-junit.xml" ||
    rc=$?
  vm_pool_stop
  phase_done asan-tests
  summarize "$b/ctest-tests.json" "$b/ctest-junit.xml" "rdx test summary (preset asan-ubsan, rdma and twonode but doctor, wire and release_only)" || rc=1
  { cmake --preset tsan && cmake --build --preset tsan --target channel_threads -j "$JOBS"; } >"$t.build.log" 2>&1 ||
    { tail -n 60 "$t.build.log" >&2; echo "tsan build failed; full log: $t.build.log" >&2; return 1; }
  ctest --preset tsan -R '^threads_loopback$' --show-only=json-v1 >"$t/ctest-tests.json"
  ctest --preset tsan -R '^threads_loopback$' --output-junit "$t/ctest-junit.xml" || rc=$?
  summarize "$t/ctest-tests.json" "$t/ctest-junit.xml" "rdx test summary (preset tsan, threads)" || rc=1
  phase_done tsan
  return "$rc"
}

# The libFuzzer targets (preset fuzz, clang): each over its seed corpus, then
# a short bounded run (RDX_FUZZ_SECONDS, 10 s by default), in parallel.
run_fuzz_tests() {
  local rc=0 f="$ROOT/build/fuzz"
  log "fuzzing: libFuzzer targets, seed corpora and a short run each (preset fuzz)"
  cd "$ROOT"
  { cmake --preset fuzz && cmake --build --preset fuzz -j "$JOBS"; } >"$f.build.log" 2>&1 ||
    { tail -n 60 "$f.build.log" >&2; echo "fuzz build failed; full log: $f.build.log" >&2; return 1; }
  ctest --preset fuzz -L fuzz --show-only=json-v1 >"$f/ctest-tests.json"
  ctest --preset fuzz -L fuzz -j "$JOBS" --output-junit "$f/ctest-junit.xml" || rc=$?
  summarize "$f/ctest-tests.json" "$f/ctest-junit.xml" "rdx test summary (preset fuzz, libFuzzer)" || rc=1
  phase_done fuzz
  return "$rc"
}

# The build tree's programs that the listed tests run (ctest --show-only=json-v1
# in $2), as ninja targets relative to the build tree $1: every path under
# $1 in a test's command, shell strings included, that ninja can build.
test_programs() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, re, subprocess, sys

build, listing = sys.argv[1], sys.argv[2]
known = set()
for line in subprocess.run(["ninja", "-C", build, "-t", "targets", "all"], capture_output=True, text=True,
                           check=True).stdout.splitlines():
    known.add(line.rsplit(": ", 1)[0])
found = set()
for t in json.load(open(listing))["tests"]:
    for arg in t.get("command", []):
        for path in re.findall(re.escape(build) + r"/[^\s'\"|;&)]+", arg):
            rel = path[len(build) + 1:]
            if rel in known:
                found.add(rel)
print("\n".join(sorted(found)))
PY
}

# Every target a plain build makes in the build tree $1, as ninja names it.
default_targets() {
  /usr/bin/python3 - "$1" <<'PY'
import subprocess, sys

def query(node):
    out = subprocess.run(["ninja", "-C", sys.argv[1], "-t", "query", node], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    ins, on = [], False
    for line in out[1:]:
        if line.startswith("  input:"):
            on = True
        elif line.startswith("  outputs:"):
            on = False
        elif on and line.startswith("    "):
            ins.append(line.strip())
    return ins

seen, todo = [], ["all"]
while todo:
    node = todo.pop()
    for i in query(node):
        if i == "all" or i.endswith("/all"):
            todo.append(i)
        elif i not in seen:
            seen.append(i)
print("\n".join(sorted(seen)))
PY
}

# What the release build makes for the test command (build tree $1, the full
# test list in $2): every default target but the test programs (under tests/)
# that only tests of the sanitizer pass run. Examples, tools, benchmarks and
# the header checks are always built.
release_targets() {
  local sanitized
  sanitized="$(sanitized_tests "$2" | paste -sd '|')"
  default_targets "$1" >"$1/default-targets.txt"
  /usr/bin/python3 - "$1" "$2" "$sanitized" "$1/default-targets.txt" <<'PY'
import json, re, sys

build, listing, sanitized, defaults = sys.argv[1:5]
run_san = re.compile(f"^({sanitized})$") if sanitized else None
only_san, elsewhere = set(), set()
for t in json.load(open(listing))["tests"]:
    progs = set()
    for arg in t.get("command", []):
        for path in re.findall(re.escape(build) + r"/[^\s'\"|;&)]+", arg):
            progs.add(path[len(build) + 1:])
    (only_san if run_san and run_san.match(t["name"]) else elsewhere).update(progs)
drop = {p for p in only_san - elsewhere if p.startswith("tests/")}
print("\n".join(d for d in open(defaults).read().split() if d not in drop))
PY
}

# The names of the tests (ctest --show-only=json-v1 in $1) that the sanitizer
# pass runs: a label of SANITIZED_LABELS and none of UNSANITIZED_LABELS.
sanitized_tests() {
  /usr/bin/python3 - "$1" "$SANITIZED_LABELS" "$UNSANITIZED_LABELS" <<'PY'
import json, re, sys

take, leave = (re.compile(f"^({x})$") for x in sys.argv[2:4])
for t in json.load(open(sys.argv[1]))["tests"]:
    labels = next((p["value"] for p in t.get("properties", []) if p["name"] == "LABELS"), [])
    if any(take.match(l) for l in labels) and not any(leave.match(l) for l in labels):
        print(re.escape(t["name"]))
PY
}

summarize() {
  /usr/bin/python3 - "$1" "$2" "${3:-rdx test summary}" <<'PY'
import json, sys, xml.etree.ElementTree as ET

tests = json.load(open(sys.argv[1]))["tests"]
labels = {}
for t in tests:
    for p in t.get("properties", []):
        if p["name"] == "LABELS":
            labels[t["name"]] = p["value"]
cases = ET.parse(sys.argv[2]).getroot().iter("testcase")
rows = {}
skipped, failed = [], []
def why(text, words):
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    pick = next((l for l in reversed(lines) if any(w in l.lower() for w in words)),
                lines[-1] if lines else "")
    return pick[:160]
for c in cases:
    name = c.get("name")
    out = c.findtext("system-out") or ""
    if c.find("skipped") is not None or c.get("status") in ("notrun", "disabled"):
        status = "skipped"
        skipped.append((name, why(out, ("skip", "no cuda", "no gpu", "not available")).removeprefix(name + ": ")))
    elif c.find("failure") is not None or c.find("error") is not None or c.get("status") == "fail":
        status = "failed"
        failed.append((name, why(out, ("fail", "error", "timeout")).removeprefix(name + ": ")))
    else:
        status = "passed"
    for l in labels.get(name, ["(none)"]):
        r = rows.setdefault(l, {"passed": 0, "skipped": 0, "failed": 0})
        r[status] += 1
total = len(skipped) + len(failed)
n = sum(1 for _ in ET.parse(sys.argv[2]).getroot().iter("testcase"))
passed = n - total
print()
print(sys.argv[3] if len(sys.argv) > 3 else "rdx test summary")
print(f"  {'label':<10} {'passed':>7} {'skipped':>8} {'failed':>7}")
order = ["unit", "rdma", "twonode", "cuda"]
for l in order + sorted(k for k in rows if k not in order):
    if l in rows:
        r = rows[l]
        print(f"  {l:<10} {r['passed']:>7} {r['skipped']:>8} {r['failed']:>7}")
if skipped:
    print("\nSkipped (not run, not counted as passed):")
    for name, reason in skipped:
        print(f"  {name}: {reason}")
if failed:
    print("\nFailed:")
    for name, reason in failed:
        print(f"  {name}: {reason}")
print(f"\n{passed} passed, {len(skipped)} skipped, {len(failed)} failed, of {n} tests")
sys.exit(1 if failed else 0)
PY
}

# -------------------------------------------------------------------- main --
cmd="${1:-}"
case "$cmd" in
  pingpong) ;;
  test) PACKAGES+=("${TEST_PACKAGES[@]}") ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac
trap give_back_build EXIT
setup "$cmd"
status=0
if [[ "$cmd" == pingpong ]]; then
  pingpong || status=$?
else
  run_tests || status=$?
fi
echo
echo "wall time: $((SECONDS - t0))s ($(IFS=','; echo "${timings[*]}" | sed 's/  */ /g'))"
exit "$status"
