#!/usr/bin/env bash
# No header of rdx above 450 lines: a header that grows past it holds more
# than one job and is split by job (docs/design.md, "Layers"). Fails naming
# each header over the limit and its length.
#
#   check_header_length.sh SOURCE_DIR [LIMIT]
set -euo pipefail
root="${1:?source directory}"
limit="${2:-450}"
cd "$root"
mapfile -t files < <(find include -type f \( -name '*.hpp' -o -name '*.h' -o -name '*.cuh' \) | sort)
bad=()
for f in "${files[@]}"; do
  n=$(wc -l <"$f")
  ((n <= limit)) || bad+=("$f ($n lines)")
done
echo "${#files[@]} headers, ${#bad[@]} above $limit lines"
if ((${#bad[@]} > 0)); then
  printf '  %s\n' "${bad[@]}"
  echo "fix: split each by job into headers of at most $limit lines"
  exit 1
fi
