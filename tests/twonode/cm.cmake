# Two-node tests of rdma_cm (included from tests/twonode/CMakeLists.txt): rdx's
# cm layer against rdma-core's rdma_server and rdma_client, and rdma-core's
# own rping and ucmatose between the VMs as a check of the fabric's rdma_cm.
# Node 0 serves, node 1 connects. The rdma-core programs come from the
# rdmacm-utils package; a test whose program is missing is skipped (77).

# rdma-core's clients give up at once when their server is not listening yet:
# cm_retry.sh runs them again while they fail saying so, and checks the output.
set(_cm_retry ${CMAKE_CURRENT_BINARY_DIR}/cm_retry.sh)
file(WRITE ${_cm_retry} [==[#!/bin/bash
# cm_retry.sh [--expect N REGEX] SECONDS CMD [ARGS...] (written by tests/twonode/cm.cmake)
# Runs CMD, an rdma_cm program of rdma-core, and runs it again while it fails
# because nothing listens yet (an rdma_cm REJECTED with IB CM reason 8, invalid
# service ID, or rdma_connect's "Connection refused"), for up to SECONDS; each
# run is bounded by 120 s. Shows the last run's output; fails when CMD failed
# or, with --expect, unless exactly N lines of its output match REGEX.
set -u
lines= regex=
if [ "${1:-}" = --expect ]; then
  lines=$2 regex=$3
  shift 3
fi
bound=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
deadline=$((SECONDS + bound))
attempts=0
while :; do
  attempts=$((attempts + 1))
  timeout -k 5 120 "$@" >"$out" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ $SECONDS -lt $deadline ] &&
    grep -Eq 'REJECTED, error:? 8|rdma_connect: Connection refused' "$out"; then
    sleep 0.5
    continue
  fi
  break
done
cat "$out"
echo "cm_retry: $1 exited with status $rc after $attempts attempt(s)"
if [ $rc -ne 0 ]; then
  echo "cm_retry: FAILED: '$*' exited with status $rc" >&2
  exit 1
fi
if [ -n "$lines" ]; then
  n=$(grep -Ec -- "$regex" "$out")
  if [ "$n" -ne "$lines" ]; then
    echo "cm_retry: FAILED: $n lines of the output of '$*' match /$regex/, expected $lines" >&2
    exit 1
  fi
  echo "cm_retry: $n line(s) match /$regex/"
fi
echo "cm_retry: ok"
]==])
file(CHMOD ${_cm_retry} PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
  WORLD_READ WORLD_EXECUTE)

# Finds rdma-core's program and sets _cm_<name>; where it is missing, adds
# each test in ARGN as a skip naming the package.
function(_rdx_cm_program name)
  find_program(RDX_CM_${name} ${name})
  set(_cm_${name} ${RDX_CM_${name}} PARENT_SCOPE)
  if(NOT RDX_CM_${name})
    foreach(t IN LISTS ARGN)
      add_test(NAME ${t} COMMAND sh -c "echo 'SKIP: ${name} not found (apt install rdmacm-utils)' >&2 && exit 77")
      set_tests_properties(${t} PROPERTIES LABELS twonode SKIP_RETURN_CODE 77)
    endforeach()
  endif()
endfunction()

if(TARGET rdx::cm)
  add_executable(cm_interop ${CMAKE_CURRENT_LIST_DIR}/cm_interop.cpp)
  target_link_libraries(cm_interop PRIVATE rdx::rdx rdx::cm rdx_warnings)
  set(_cmi $<TARGET_FILE:cm_interop>)
  # Usage errors and --help need no device.
  add_test(NAME cm_interop_help COMMAND ${_cmi} --help)
  add_test(NAME cm_interop_bad_option
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/expect_failure.sh 2 "unknown option --no-such-option"
            ${_cmi} --no-such-option)
  set_tests_properties(cm_interop_help cm_interop_bad_option PROPERTIES LABELS unit)

  # release_only (the interop and rdma-core tool tests below): they check the wire
  # against rdma-core's programs; the ASan run (scripts/quickstart.sh) leaves them to release.
  # rdx::cm::connect as rdma_client against rdma-core's rdma_server (port 7471):
  # 16 bytes each way, checked by the rdx side, then rdma_server's disconnect.
  _rdx_cm_program(rdma_server cm_interop_rdx_client_rdma_server)
  if(_cm_rdma_server)
    rdx_add_twonode_test(NAME cm_interop_rdx_client_rdma_server TIMEOUT 300
      NODE0 ${_cm_retry} --expect 1 "'^rdma_server: end 0$'" 0 ${_cm_rdma_server}
      NODE1 ${_cmi} --role client --peer $RDX_PEER_ADDR --timeout 90)
    set_property(TEST cm_interop_rdx_client_rdma_server APPEND PROPERTY LABELS release_only)
  endif()

  # rdx::cm::listener and request::accept as rdma_server for rdma-core's
  # rdma_client: the receive posted before the accept, then rdma_client's disconnect.
  _rdx_cm_program(rdma_client cm_interop_rdma_client_rdx_server)
  if(_cm_rdma_client)
    rdx_add_twonode_test(NAME cm_interop_rdma_client_rdx_server TIMEOUT 300
      NODE0 ${_cmi} --role server --peer $RDX_PEER_ADDR --timeout 120
      NODE1 ${_cm_retry} --expect 1 "'^rdma_client: end 0$'" 60 ${_cm_rdma_client} -s $RDX_PEER_ADDR)
    set_property(TEST cm_interop_rdma_client_rdx_server APPEND PROPERTY LABELS release_only)
  endif()
endif()

# rping: 10 pings between the VMs, each side printing every one (-v).
_rdx_cm_program(rping cm_rping_twonode)
if(_cm_rping)
  rdx_add_twonode_test(NAME cm_rping_twonode TIMEOUT 300
    NODE0 ${_cm_retry} --expect 10 "'^server ping data: rdma-ping-[0-9]+: '" 0
          ${_cm_rping} -s -a $RDX_NODE_ADDR -C 10 -v
    NODE1 ${_cm_retry} --expect 10 "'^ping data: rdma-ping-[0-9]+: '" 60
          ${_cm_rping} -c -a $RDX_PEER_ADDR -C 10 -v)
  set_property(TEST cm_rping_twonode APPEND PROPERTY LABELS release_only)
endif()

# ucmatose: one connection, 10 messages each way.
_rdx_cm_program(ucmatose cm_ucmatose_twonode)
if(_cm_ucmatose)
  rdx_add_twonode_test(NAME cm_ucmatose_twonode TIMEOUT 300
    NODE0 ${_cm_retry} --expect 1 "'^data transfers complete$'" 0 ${_cm_ucmatose}
    NODE1 ${_cm_retry} --expect 1 "'^data transfers complete$'" 60 ${_cm_ucmatose} -s $RDX_PEER_ADDR)
  set_property(TEST cm_ucmatose_twonode APPEND PROPERTY LABELS release_only)
endif()
