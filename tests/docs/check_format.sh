#!/usr/bin/env bash
# The style the project writes down (.clang-format at the root) is the style of
# every C++ and CUDA file: fails, naming each file that clang-format would
# change and the command that fixes it.
#
#   check_format.sh SOURCE_DIR
#
# Exits 77 (ctest: skipped) only when clang-format is not installed
# (scripts/quickstart.sh test installs Debian's clang-format).
set -euo pipefail
root="${1:?source directory}"
cf="$(command -v clang-format || command -v clang-format-14 || true)"
if [[ -z "$cf" ]]; then
  echo "clang-format not installed: apt-get install clang-format"
  exit 77
fi
cd "$root"
mapfile -t files < <(find include apps examples tests bench tools -type f \
  \( -name '*.hpp' -o -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
bad=()
for f in "${files[@]}"; do
  "$cf" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
echo "$("$cf" --version): ${#files[@]} files, ${#bad[@]} not formatted"
if ((${#bad[@]} > 0)); then
  printf '  %s\n' "${bad[@]}"
  echo "fix: clang-format -i ${bad[*]}"
  exit 1
fi
