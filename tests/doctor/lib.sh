# Shared by the rdx-doctor test scripts. Python starts slowly in the TCG VMs
# (about 10 s), so each case runs the doctor at once and saves its JSON, and
# one check.py --batch checks every case at the end:
#   record TITLE EXPECTATIONS... -- COMMAND...   run COMMAND now, queue its check
#   finish                                        check every queued case; exit status
rc=0
cases=0
work="$(mktemp -d)"
spec="$work/spec"
: >"$spec"
record() {
  local title="$1" exp=() out
  shift
  while [[ $# -gt 0 && "$1" != -- ]]; do
    exp+=("$1")
    shift
  done
  shift
  cases=$((cases + 1))
  out="$work/$cases.json"
  echo "== $title"
  "$@" >"$out" 2>"$work/$cases.err"
  local st=$?
  printf '%s\t%s--input %q --rc %d\n' "$title" "$(printf '%q ' "${exp[@]}")" "$out" "$st" >>"$spec"
}
finish() {
  python3 "$(dirname "${BASH_SOURCE[0]}")/check.py" --batch "$spec" || rc=1
  rm -rf "$work"
  exit $rc
}
