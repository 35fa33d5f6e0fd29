#!/usr/bin/env bash
# Builds and runs everything of rdx::cuda on a GPU machine, in one go:
# configure, build the cuda tests, tools and gpu_pingpong, run the cuda and
# topology tests, print the GPUDirect probe and the topology from the real
# sysfs, measure the staging pipeline against plain cudaMemcpy, and end with a
# short table. Same-host GPU peers too: the two-process tests, compute-sanitizer
# over both processes, and the window figures against an in-process
# cudaMemcpyAsync (cuda_same_host_bench). Logs go to $OUT (default out/gpu-check).
#
#   scripts/gpu-check.sh               # from the repository root
#   BUILD=build-gpu MIB=1024 REPS=7 scripts/gpu-check.sh
#
# The GPU machine has no Catch2: carry Debian's single header as
# .device/catch2/include/catch2/catch.hpp (`carry: [".device"]`).
set -u -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/out/gpu-check}
BUILD=${BUILD:-$ROOT/build-gpu}
MIB=${MIB:-1024}
REPS=${REPS:-7}
CHUNKS_KIB=${CHUNKS_KIB:-"1024 4096 16384 0"}  # 0: the default options
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$SUMMARY" >/dev/null; }

# Catch2: the machine's own, else the single header carried in
# .device/catch2/include/catch2/catch.hpp (Debian's /usr/include/catch2/catch.hpp),
# for which a minimal package config is written here.
prefix=()
if [[ -f $ROOT/.device/catch2/include/catch2/catch.hpp ]]; then
  mkdir -p "$BUILD/catch2-config"
  cat >"$BUILD/catch2-config/Catch2Config.cmake" <<CFG
if(NOT TARGET Catch2::Catch2)
  add_library(Catch2::Catch2 INTERFACE IMPORTED)
  set_target_properties(Catch2::Catch2 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "$ROOT/.device/catch2/include")
endif()
set(Catch2_FOUND TRUE)
CFG
  prefix=(-DCatch2_DIR="$BUILD/catch2-config")
fi
gen=()
if command -v ninja >/dev/null; then gen=(-G Ninja); fi

{
  echo "== system"
  date -u
  uname -r
  nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv 2>&1
  nvidia-smi topo -m 2>&1
  command -v nvcc >/dev/null && nvcc --version | tail -2
  [[ -x /usr/local/cuda/bin/nvcc ]] && /usr/local/cuda/bin/nvcc --version | tail -2
  cmake --version | head -1
  echo "/sys/class/infiniband: $(ls /sys/class/infiniband 2>&1 | tr '\n' ' ')"
  echo "peermem: $(cat /sys/kernel/mm/memory_peers/nv_mem/version 2>&1) / $(cat /sys/module/nvidia_peermem/version 2>&1)"
} >"$OUT/system.log" 2>&1

echo "== configure and build" | tee "$OUT/build.log"
targets=(cuda_topology_test cuda_memory_test cuda_pattern_test cuda_staging_test cuda_probe_test
         cuda_register_test cuda_device_select_test cuda_gpu_info cuda_staging_throughput gpu_pingpong devinfo rdx-doctor
         cuda_same_host_test cuda_same_host_bench cuda_same_host_choice_test
         cuda_alltoall_blocks_test alltoall)
if cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" "${prefix[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DRDX_CUDA=ON -DRDX_WARNINGS_AS_ERRORS=ON -DRDX_BUILD_BENCHMARKS=OFF >>"$OUT/build.log" 2>&1 &&
   cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" >>"$OUT/build.log" 2>&1; then
  row "build (${#targets[@]} targets, -Werror)" "ok"
else
  row "build" "FAILED (see build.log)"
  tail -40 "$OUT/build.log"
  cat "$SUMMARY"
  exit 1
fi

echo "== tests"
(cd "$BUILD" && ctest -R '^cuda_' -LE rdma --output-on-failure -V) >"$OUT/ctest.log" 2>&1
for t in cuda_topology_test cuda_memory_test cuda_pattern_test cuda_staging_test cuda_probe_test cuda_register_test \
         cuda_device_select_test \
         cuda_same_host_choice_test cuda_same_host_vmm cuda_same_host_legacy cuda_same_host_exporter_exit \
         cuda_same_host_grant_refused cuda_same_host_same_process cuda_alltoall_blocks_test; do
  line=$(grep -E "^ *[0-9]+/[0-9]+ Test +#[0-9]+: $t " "$OUT/ctest.log" | tail -1)
  if [[ $line == *Passed* ]]; then r="passed"
  elif [[ $line == *Skipped* || $line == *"Not Run"* ]]; then r="skipped: $(grep -m1 -o "$t: SKIP: .*" "$OUT/ctest.log" | sed "s/^$t: SKIP: //" | cut -c1-80)"
  else r="FAILED"; fi
  [[ -n $line && $line =~ ([0-9.]+\ sec) ]] && r="$r (${BASH_REMATCH[1]})"
  row "test $t" "$r"
done

# alltoall --memory cuda: the GPU is found and the blocks made; with no RDMA
# device on this machine it must stop there, naming the device it lacks.
a2a_out=$("$BUILD/examples/alltoall" --memory cuda --rank 0 --world 1 -n 1 2>&1)
a2a_rc=$?
echo "$a2a_out" >"$OUT/alltoall-cuda.log"
row "alltoall --memory cuda (exit $a2a_rc)" "$(echo "$a2a_out" | tail -1 | cut -c1-100)"

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -n $SAN ]]; then
  echo "== compute-sanitizer memcheck"
  for t in cuda_pattern_test cuda_staging_test cuda_alltoall_blocks_test; do
    "$SAN" --tool memcheck --error-exitcode 9 "$BUILD/tests/cuda/$t" >>"$OUT/ctest.log" 2>&1
    rc=$?
    row "memcheck $t" "$([[ $rc == 0 ]] && echo clean || echo "FAILED (exit $rc)")"
  done
  # Both processes of each same-host case (the test starts its peer itself).
  for c in vmm legacy exporter_exit; do
    "$SAN" --tool memcheck --target-processes all --error-exitcode 9 "$BUILD/tests/cuda/cuda_same_host_test" "$c" \
      >>"$OUT/sanitizer-same-host.log" 2>&1
    rc=$?
    row "memcheck cuda_same_host_test $c (both)" "$([[ $rc == 0 ]] && echo clean || echo "FAILED (exit $rc)")"
  done
else
  row "memcheck" "compute-sanitizer not installed"
fi

echo "== probe and topology (real sysfs)"
"$BUILD/tests/cuda/cuda_gpu_info" >"$OUT/probe.log" 2>&1
rc=$?
cat "$OUT/probe.log"
row "probe + topology (cuda_gpu_info)" "exit $rc; best path: $(grep -m1 -o 'best path: .*' "$OUT/probe.log" | cut -d' ' -f3)"

echo "== devinfo -g (the GPUDirect probe as users see it)"
"$BUILD/examples/devinfo" -g >"$OUT/devinfo.log" 2>&1
rc=$?
cat "$OUT/devinfo.log"
row "devinfo -g" "exit $rc; $(grep -m1 -o 'best path: .*' "$OUT/devinfo.log")"

echo "== rdx-doctor's GPU part (this machine has no RDMA device: devices is an error, each GPU a warning)"
"$BUILD/tools/rdx-doctor" --check devices,gpu >"$OUT/doctor.log" 2>&1
cat "$OUT/doctor.log"
# What the doctor must say, from what the machine has: peermem as sysfs shows it, no NIC.
peermem=absent
[[ -e /sys/kernel/mm/memory_peers/nv_mem/version || -e /sys/module/nvidia_peermem/version ]] && peermem=loaded
python3 "$ROOT/tests/doctor/check.py" --exit 1 --status devices=error --status gpu=warning --status gpu.peers=ok --fact gpu.nic= \
  --fact gpu.peermem=$peermem --fact gpu.best_path=staged --fact gpu.kernel_dmabuf_mr=unknown \
  --text 'gpu=no RDMA device on this host' -- "$BUILD/tools/rdx-doctor" --json --check devices,gpu \
  >"$OUT/doctor-check.log" 2>&1
rc=$?
cat "$OUT/doctor-check.log"
"$BUILD/tools/rdx-doctor" --json --check devices,gpu >"$OUT/doctor.json" 2>/dev/null
row "rdx-doctor same-host facts" "$(grep -o '"shareable_posix_fd":"[a-z]*"' "$OUT/doctor.json" | head -1) $(grep -o '"gpu_pairs":"[0-9]*"' "$OUT/doctor.json" | head -1)"
row "rdx-doctor --check devices,gpu (checked)" "$([[ $rc == 0 ]] && echo "as expected: peermem $peermem, no NIC, $(grep -o '"dma_buf_export":"[a-z]*"' "$OUT/doctor.json" | head -1)" || echo FAILED)"

echo "== staging throughput vs plain cudaMemcpy"
# shellcheck disable=SC2086
cmd="$BUILD/tests/cuda/cuda_staging_throughput $MIB $REPS $CHUNKS_KIB"
echo "\$ $cmd" | tee "$OUT/throughput.log"
$cmd 2>&1 | tee -a "$OUT/throughput.log"
rc=${PIPESTATUS[0]}
row "throughput run (every byte checked)" "exit $rc"
while read -r l; do
  row "  ${l%%D2H*}" "D2H${l#*D2H}"
done < <(grep '^RESULT' "$OUT/throughput.log" | sed 's/^RESULT //')

# Smaller transfers at the default options (chunks sized by chunk_for), for the record.
for m in 16 64; do
  cmd3="$BUILD/tests/cuda/cuda_staging_throughput $m $REPS 0"
  echo "\$ $cmd3" | tee -a "$OUT/throughput.log"
  while read -r l; do
    row "  $m MiB ${l%%D2H*}" "D2H${l#*D2H}"
  done < <($cmd3 2>&1 | tee -a "$OUT/throughput.log" | grep -E '^RESULT (staged.*depth 2|plain)' | sed 's/^RESULT //')
done
# A smaller transfer at a 4 MiB chunk (the old default) and the default, for the record.
cmd2="$BUILD/tests/cuda/cuda_staging_throughput 256 $REPS 4096 0"
echo "\$ $cmd2" | tee -a "$OUT/throughput.log"
$cmd2 2>&1 | grep -E 'RESULT staged.*depth 2|RESULT plain' | sed 's/^RESULT /RESULT256 /' | tee -a "$OUT/throughput.log"
while read -r l; do
  row "  256 MiB ${l%%D2H*}" "D2H${l#*D2H}"
done < <(grep '^RESULT256' "$OUT/throughput.log" | sed 's/^RESULT256 //')

echo "== same-host window between two processes on one GPU vs in-process cudaMemcpyAsync"
cmd="$BUILD/tests/cuda/cuda_same_host_bench"
echo "\$ $cmd" | tee "$OUT/same-host.log"
$cmd 2>&1 | tee -a "$OUT/same-host.log"
rc=${PIPESTATUS[0]}
row "cuda_same_host_bench (1 GiB each side)" "exit $rc"
while read -r l; do
  row "  ${l:0:40}" "${l:40}"
done < <(grep '^RESULT' "$OUT/same-host.log" | sed 's/^RESULT //')

echo "== gpu_pingpong"
"$BUILD/examples/gpu_pingpong/gpu_pingpong" --size 256M --iters 5 >"$OUT/pingpong.log" 2>&1
rc=$?
cat "$OUT/pingpong.log"
row "gpu_pingpong --size 256M --iters 5" "exit $rc; $(grep -m1 -o 'latency.*GB/s' "$OUT/pingpong.log" | cut -c1-60)"
"$BUILD/examples/gpu_pingpong/gpu_pingpong" --size 1M --iters 2 --path direct >>"$OUT/pingpong.log" 2>&1
rc=$?
row "gpu_pingpong --path direct (no RDMA device)" "exit $rc ($(case $rc in 1) echo 'refused, as it must';; 77) echo 'skipped: no GPU';; *) echo UNEXPECTED;; esac))"

echo "== gpu_pingpong --same-host (two processes of this host, no NIC)"
for args in "--size 256M --iters 20" "--size 256M --iters 20 --sm-copy" "--size 4K --iters 1000 --warmup 100"; do
  sock="@rdx-gpu-check-$$-$RANDOM"
  # shellcheck disable=SC2086
  "$BUILD/examples/gpu_pingpong/gpu_pingpong" --same-host "$sock" $args >>"$OUT/pingpong-same-host.log" 2>&1 &
  server=$!
  # shellcheck disable=SC2086
  "$BUILD/examples/gpu_pingpong/gpu_pingpong" --same-host "$sock" --connect local $args \
    >"$OUT/pingpong-client.log" 2>&1
  rc=$?
  wait "$server"
  src=$?
  cat "$OUT/pingpong-client.log" >>"$OUT/pingpong-same-host.log"
  cat "$OUT/pingpong-client.log"
  row "gpu_pingpong --same-host $args" "exit $rc/$src; $(grep -m1 -o 'latency.*GB/s' "$OUT/pingpong-client.log")"
done

echo
echo "== summary (logs in $OUT)"
cat "$SUMMARY"
