#!/usr/bin/env bash
# crypt-speed.sh: what sealing messages (connection_attr::encrypt) costs on
# one core: rdx's seal and open (bench/crypt_seal.cpp, built as
# rdx_crypt_seal) beside `openssl speed` for AES-256-GCM at the same sizes,
# and how many cores each rate needs to keep up with a 100, 200 or 400 Gb/s
# link. Builds nothing.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/crypt-speed.sh [--program PATH] [--seconds N] [--min-time S] [--sizes "N ..."] [--aead]
Runs `openssl speed -evp aes-256-gcm -bytes N -seconds SECONDS` and
rdx_crypt_seal's seal/N and open/N for each size, then prints a Markdown
table: size, OpenSSL MB/s, rdx seal MB/s, rdx open MB/s, seal / OpenSSL;
and a second one: the cores each rate at the largest size needs for 100,
200 and 400 Gb/s. MB are 10^6 bytes; both tools divide by CPU time on one
core. Take figures from an optimized build (preset release): a Debug build
measures rdx's unoptimized code around the same OpenSSL.
  --program PATH  rdx_crypt_seal (default build/release/bench/rdx_crypt_seal;
                  cmake --build --preset release --target rdx_crypt_seal)
  --seconds N     openssl speed's time per size (default 2)
  --min-time S    Google Benchmark's --benchmark_min_time per size (default 1)
  --sizes "N ..." payload sizes in bytes (default "1024 4096 16384 65536 1048576";
                  rdx_crypt_seal has 64 1024 4096 16384 65536 1048576)
  --aead          run openssl speed with -aead: per buffer a new IV, the AAD, the
                  data and the tag, as a seal does; without it OpenSSL streams
                  one message through one IV (no tag), an upper bound
  -h, --help      this text
Exit 0 when every figure was measured, 1 when one is missing, 2 for a usage
error, 77 when the openssl program is not installed.
EOF
}

root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
prog="" seconds=2 min_time=1 sizes="1024 4096 16384 65536 1048576" aead=()
need() { [ "$2" -ge 2 ] || { echo "crypt-speed.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --program) need "$1" $#; prog=$2; shift 2 ;;
    --seconds) need "$1" $#; seconds=$2; shift 2 ;;
    --min-time) need "$1" $#; min_time=$2; shift 2 ;;
    --sizes) need "$1" $#; sizes=$2; shift 2 ;;
    --aead) aead=(-aead); shift ;;
    *) echo "crypt-speed.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$prog" ] || prog="$root/build/release/bench/rdx_crypt_seal"
[ -x "$prog" ] || { echo "crypt-speed.sh: $prog is not a program: build it (cmake --build --preset release --target rdx_crypt_seal) or pass --program" >&2; exit 2; }
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "crypt-speed.sh: --seconds $seconds is not a whole number of seconds" >&2; exit 2; }
for n in $sizes; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "crypt-speed.sh: size $n is not a number of bytes" >&2; exit 2; }
done
command -v openssl >/dev/null || { echo "crypt-speed.sh: openssl is not installed (apt-get install openssl): skipped" >&2; exit 77; }

echo "crypt-speed: $(openssl version)${aead:+ (openssl speed -aead)}, $prog, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')"

declare -A ossl seal open
for n in $sizes; do
  # -mr prints "+F:<index>:AES-256-GCM:<bytes per second>".
  ossl[$n]=$(openssl speed -mr "${aead[@]}" -evp aes-256-gcm -bytes "$n" -seconds "$seconds" 2>/dev/null |
    awk -F: '/^\+F:/ { v = $NF } END { if (v != "") print v }')
done

filter="^(seal|open)/($(tr ' ' '|' <<<"$sizes" | sed 's/|*$//'))\$"
csv=$("$prog" --benchmark_filter="$filter" --benchmark_format=csv --benchmark_min_time="$min_time" 2>/dev/null)
while IFS=, read -r name rate; do
  kind=${name%%/*} n=${name#*/}
  case $kind in
    seal) seal[$n]=$rate ;;
    open) open[$n]=$rate ;;
  esac
done < <(awk -F, '
  NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  { gsub(/"/, "", $1); print $1 "," $col["bytes_per_second"] }' <<<"$csv")

mbs() { [ -n "${1:-}" ] && awk -v v="$1" 'BEGIN { printf "%.0f", v / 1e6 }' || printf "n/a"; }
ratio() { [ -n "${1:-}" ] && [ -n "${2:-}" ] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }' || printf "n/a"; }
cores() { [ -n "${2:-}" ] && awk -v g="$1" -v r="$2" 'BEGIN { printf "%.1f", g * 1e9 / 8 / r }' || printf "n/a"; }

missing=0
echo
echo "| size (bytes) | OpenSSL MB/s | rdx seal MB/s | rdx open MB/s | seal / OpenSSL |"
echo "|---:|---:|---:|---:|---:|"
for n in $sizes; do
  for v in "${ossl[$n]:-}" "${seal[$n]:-}" "${open[$n]:-}"; do [ -n "$v" ] || missing=1; done
  echo "| $n | $(mbs "${ossl[$n]:-}") | $(mbs "${seal[$n]:-}") | $(mbs "${open[$n]:-}") | $(ratio "${seal[$n]:-}" "${ossl[$n]:-}") |"
done

last=${sizes##* }
echo
echo "Cores needed at the $last-byte rate:"
echo
echo "| rate | 100 Gb/s | 200 Gb/s | 400 Gb/s |"
echo "|---|---:|---:|---:|"
for row in "OpenSSL speed:${ossl[$last]:-}" "rdx seal:${seal[$last]:-}" "rdx open:${open[$last]:-}"; do
  r=${row#*:}
  echo "| ${row%%:*} | $(cores 100 "$r") | $(cores 200 "$r") | $(cores 400 "$r") |"
done
if ((missing)); then
  echo "crypt-speed.sh: some figures are missing (n/a): see $prog --benchmark_filter='$filter'" >&2
  exit 1
fi
