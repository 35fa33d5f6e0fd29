#!/usr/bin/env bash
# Builds the API reference and fails on any Doxygen warning (an undocumented public
# entity, a doc-comment error), so the reference stays complete.
#
#   check_doxygen.sh DOXYGEN DOXYFILE WARN_LOG
#
# DOXYGEN may be empty (not found when CMake ran): then doxygen is looked for on PATH.
# Exits 77 (ctest: skipped) only when doxygen is not installed.
set -euo pipefail
doxygen="${1:-}"
doxyfile="${2:?Doxyfile}"
log="${3:?warning log}"

if [[ -z "$doxygen" || ! -x "$doxygen" ]]; then
  doxygen="$(command -v doxygen || true)"
fi
if [[ -z "$doxygen" ]]; then
  echo "doxygen not installed: apt-get install doxygen"
  exit 77
fi

mkdir -p "$(dirname "$log")"
rm -f "$log"
start=$SECONDS
# The log named here wins over the Doxyfile's WARN_LOGFILE, so the check reads what it wrote.
if ! { cat "$doxyfile" && echo "WARN_LOGFILE = $log"; } | "$doxygen" -; then
  echo "doxygen failed ($("$doxygen" --version), $doxyfile)"
  exit 1
fi
echo "doxygen $("$doxygen" --version): $((SECONDS - start)) s, warnings in $log"

if [[ -s "$log" ]]; then
  count="$(grep -cE ': (warning|error): ' "$log" || true)"
  echo "FAIL: $count Doxygen warnings (every public entity needs a //! comment); the first 40:"
  # A warning may continue on the lines after it (a parameter list, a candidate): keep them.
  awk '/: (warning|error): / { n++ } n > 40 { exit } { print }' "$log"
  exit 1
fi
echo "no Doxygen warnings"
