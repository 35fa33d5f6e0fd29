#!/bin/bash
# psk_examples.sh run KEY STATUS PATTERN... -- CMD [ARGS...]
#   Runs CMD ARGS --psk-file FILE, FILE holding the key named KEY (none: no
#   --psk-file), shows its output, and succeeds only when CMD exits with
#   STATUS and its output matches every extended regular expression PATTERN.
#   A key is 32 bytes in hex (as `openssl rand -hex 32` writes one), mode 600,
#   derived from its name, so that both nodes of a test hold the same key
#   without sharing a file; another name is another key.
# psk_examples.sh clients PINGPONG SERVER PORT [ARGS...]
#   Node 1 of examples_pingpong_psk_clients: three clients of SERVER:PORT at
#   once, each with ARGS: one with the server's key (must pass, every payload
#   checked), one with another key (must fail: wrong key, authentication
#   failed) and one with none (must fail: the server wants authenticated set-up).
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

key_file() { # NAME: writes the key named NAME, prints its path
  local f=$dir/$1.key
  (umask 077 && printf 'rdx example test key %s\n' "$1" | sha256sum | cut -c1-64 >"$f")
  printf '%s\n' "$f"
}

run() { # KEY STATUS PATTERN... -- CMD [ARGS...]
  local key=$1 want=$2
  shift 2
  local patterns=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    patterns+=("$1")
    shift
  done
  shift
  local extra=()
  [ "$key" = none ] || extra=(--psk-file "$(key_file "$key")")
  local out rc
  out=$("$@" "${extra[@]}" 2>&1)
  rc=$?
  printf '%s\n' "$out"
  if [ "$rc" -ne "$want" ]; then
    echo "psk_examples: '$*' (key $key) exited with $rc, expected $want" >&2
    return 1
  fi
  local p
  for p in "${patterns[@]}"; do
    printf '%s\n' "$out" | grep -Eq -- "$p" || {
      echo "psk_examples: '$*' (key $key): output lacks /$p/" >&2
      return 1
    }
  done
  echo "psk_examples: ok (key $key, status $rc, ${#patterns[@]} message(s) found)"
}

case "${1:-}" in
  run)
    shift
    run "$@"
    ;;
  clients)
    pp=$2 server=$3 port=$4
    shift 4
    run job 0 "every payload checked" "authenticated with --psk-file" -- \
      "$pp" "$@" -p "$port" "$server" >"$dir/right.log" 2>&1 &
    right=$!
    run other 1 "wrong key \(the peer's proof does not match\).*authentication failed" -- \
      "$pp" "$@" -p "$port" "$server" >"$dir/other.log" 2>&1 &
    other=$!
    run none 1 "the peer wants authenticated set-up" -- \
      "$pp" "$@" -p "$port" "$server" >"$dir/none.log" 2>&1 &
    none=$!
    failed=0
    for c in right other none; do
      if ! wait "${!c}"; then failed=$((failed + 1)); fi
      sed "s/^/[client, $c key] /" "$dir/$c.log"
    done
    echo "psk_examples: 3 clients (right key, another key, none), $failed not as expected"
    [ "$failed" -eq 0 ]
    ;;
  *)
    echo "usage: $0 run KEY STATUS PATTERN... -- CMD [ARGS...] | clients PINGPONG SERVER PORT [ARGS...]" >&2
    exit 2
    ;;
esac
