#!/bin/bash
# expect_failure.sh STATUS PATTERN CMD [ARGS...]
# Runs CMD, shows its output, and succeeds only when CMD exits with STATUS
# (or any non-zero status when STATUS is "nonzero") and its output (stdout
# and stderr) matches the extended regular expression PATTERN.
set -u
want=$1 pattern=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$want" = nonzero ]; then
  [ $rc -ne 0 ] || { echo "expect_failure: '$*' succeeded; a failure was expected" >&2; exit 1; }
elif [ $rc -ne "$want" ]; then
  echo "expect_failure: '$*' exited with $rc, expected $want" >&2
  exit 1
fi
printf '%s\n' "$out" | grep -Eq -- "$pattern" || { echo "expect_failure: output lacks /$pattern/" >&2; exit 1; }
echo "expect_failure: ok (status $rc, message found)"
