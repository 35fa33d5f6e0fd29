#!/usr/bin/env bash
# The checks the project chooses (.clang-tidy at the root, warnings as errors)
# over every installed header: one translation unit includes all of rdx's
# headers but rdx/cuda's, a second (where the CUDA Toolkit's headers are)
# includes rdx/cuda's with RDX_WITH_CUDA=1. Fails, naming each finding.
#
#   check_tidy.sh SOURCE_DIR WORK_DIR
#
# Exits 77 (ctest: skipped) only when clang-tidy is not installed
# (scripts/quickstart.sh test installs Debian's clang-tidy).
set -euo pipefail
root="$(cd "${1:?source directory}" && pwd)"
work="${2:?work directory}"
tidy="$(command -v clang-tidy || command -v clang-tidy-14 || true)"
if [[ -z "$tidy" ]]; then
  echo "clang-tidy not installed: apt-get install clang-tidy"
  exit 77
fi
# .clang-tidy applies to files under the source tree: the translation units
# live there (in the build tree when that is inside it, else in a hidden
# folder removed on exit).
case "$work/" in
  "$root"/*) ;;
  *)
    work="$root/.rdx-tidy.$$"
    trap 'rm -rf "$work"' EXIT
    ;;
esac
mkdir -p "$work"
cd "$root/include"
find rdx -name '*.hpp' -not -path 'rdx/cuda/*' | sort | sed 's/.*/#include <&>/' >"$work/tidy_core.cpp"
find rdx/cuda -name '*.hpp' | sort | sed 's/.*/#include <&>/' >"$work/tidy_cuda.cpp"
flags=(-std=c++20 "-I$root/include")
if pkg-config --exists pmix 2>/dev/null; then
  read -r -a pmix <<<"$(pkg-config --cflags pmix)"
  flags+=("${pmix[@]}")
else
  # rdx/group/pmix.hpp needs libpmix's headers.
  sed -i '/rdx\/group\/pmix.hpp/d' "$work/tidy_core.cpp"
fi
units=("$work/tidy_core.cpp")
cuda_include="${CUDA_HOME:-/usr/local/cuda}/include"
[[ -f "$cuda_include/cuda_runtime_api.h" ]] && units+=("$work/tidy_cuda.cpp")
rc=0
for u in "${units[@]}"; do
  extra=()
  [[ "$u" == *tidy_cuda.cpp ]] && extra=(-DRDX_WITH_CUDA=1 "-I$cuda_include")
  n="$(grep -c . "$u")"
  if out="$("$tidy" --quiet "$u" -- "${flags[@]}" "${extra[@]}" 2>&1)"; then
    echo "$("$tidy" --version | grep -m1 -o 'version [0-9.]*'): $n headers ($(basename "$u")): clean"
  else
    rc=1
    echo "$(basename "$u"): $n headers:"
    grep -E '(warning|error):' <<<"$out" | sed "s|$root/||" | sort -u
  fi
done
((rc == 0)) || echo "fix each finding above, or where a check is wrong for rdx, say why in .clang-tidy"
exit "$rc"
