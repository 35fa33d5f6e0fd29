# Shared by the rdx-doctor test scripts: `step TITLE COMMAND...` runs one
# expectation, printing the title; a failure sets rc=1 and the script goes on.
rc=0
step() {
  echo
  echo "== $1"
  shift
  "$@" || rc=1
}
