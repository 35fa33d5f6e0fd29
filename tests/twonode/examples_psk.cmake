# --psk-file in the examples (rdx::auth): set-up over TCP authenticated with a
# pre-shared key (included from tests/twonode/CMakeLists.txt). Both nodes
# derive the same key from its name (psk_examples.sh); another name is
# another key. Small counts: each twonode test boots two VMs under TCG.
if(NOT RDX_BUILD_EXAMPLES)
  return()
endif()

set(_pp $<TARGET_FILE:pingpong>)
set(_kv $<TARGET_FILE:kv_window>)
set(_fail ${CMAKE_CURRENT_LIST_DIR}/expect_failure.sh)
set(_psk ${CMAKE_CURRENT_LIST_DIR}/psk_examples.sh)

if(NOT TARGET rdx::auth)
  # Without OpenSSL the flag is refused with the fix.
  add_test(NAME examples_pingpong_psk_not_built
    COMMAND ${_fail} 2 "--psk-file: this pingpong was built without rdx::auth \\(install libssl-dev"
            ${_pp} --channel --psk-file key)
  set_tests_properties(examples_pingpong_psk_not_built PROPERTIES LABELS unit)
  return()
endif()

# The modes whose set-up has no authentication refuse --psk-file at parse
# time, saying which modes take it; a key file others may read is refused
# before any device is opened. No fabric needed.
add_test(NAME examples_pingpong_psk_raw_mode COMMAND bash -c
  "${_fail} 2 '--psk-file authenticates .*only --channel and --window .*--mode send sets up raw queue pairs' ${_pp} --psk-file key && ${_fail} 2 '--mode write_imm sets up raw queue pairs without it: add --channel or --window' ${_pp} --mode write_imm --psk-file key 10.0.0.1 && ${_fail} 2 '--rc-compat speaks ibv_rc_pingpong.s exchange, which has no authentication' ${_pp} --rc-compat --psk-file key")
add_test(NAME examples_pingpong_psk_key_file_mode COMMAND bash -c
  "d=$(mktemp -d) && trap 'rm -rf $d' EXIT && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' >$d/key && chmod 644 $d/key && ${_fail} 1 'key file .*/key has mode 0644: group or others may reach it \\(chmod 600 it\\)' ${_pp} --channel --psk-file $d/key")
set_tests_properties(examples_pingpong_psk_raw_mode examples_pingpong_psk_key_file_mode PROPERTIES LABELS unit)
if(TARGET rdx::cm)
  add_test(NAME examples_psk_cm_refused COMMAND bash -c
    "${_fail} 2 'rdma_cm set-up \\(--cm\\) has no authentication: drop --cm or --psk-file' ${_pp} --channel --cm --psk-file key && ${_fail} 2 'rdma_cm set-up \\(--cm\\) has no authentication' ${_kv} --cm --psk-file key")
  set_tests_properties(examples_psk_cm_refused PROPERTIES LABELS unit)
endif()

# The same key on both sides: set up, then every payload checked as usual.
rdx_add_twonode_test(NAME examples_pingpong_psk_channel TIMEOUT 300
  NODE0 ${_psk} run job 0 "'received, checked and echoed'" "'authenticated with --psk-file'" -- ${_pp} --channel -s 64 -n 50
  NODE1 ${_psk} run job 0 "'every payload checked'" "'authenticated with --psk-file'" -- ${_pp} --channel -s 64 -n 50 $RDX_PEER_ADDR)

# A --clients server with a key and three clients at once: the one with the
# key is served; the one with another key and the one with none fail naming
# why, the server refuses both (each in its own set-up) and exits 0.
rdx_add_twonode_test(NAME examples_pingpong_psk_clients TIMEOUT 300
  NODE0 ${_psk} run job 0 "'3 clients handled: 1 served, 2 failed in set-up, 0 failed after set-up'"
        "'FAILED in set-up .*refused \\(--psk-file\\): rdx authentication with .*wrong key'"
        "'FAILED in set-up .*refused \\(--psk-file\\): rdx authentication with .*no authentication from peer'"
        -- ${_pp} --channel -s 64 -n 20 --clients 3 -t 60
  NODE1 ${_psk} clients ${_pp} $RDX_PEER_ADDR 18515 --channel -s 64 -n 20 -t 60)

# kv_window with the key on both sides, both sleeping on their descriptors (-e).
rdx_add_twonode_test(NAME examples_kv_window_psk_events TIMEOUT 300
  NODE0 ${_psk} run job 0 "'server: all 64 records in their final state'" "'set-up authenticated with --psk-file'"
        "'sleeping on its worker'" -- ${_kv} -e -n 64
  NODE1 ${_psk} run job 0 "'all checked on both sides'" "'authenticated with --psk-file'" "'sleeping on its descriptor'"
        -- ${_kv} -e -n 64 $RDX_PEER_ADDR)

# --encrypt (connection_attr::encrypt): sealed messages with keys from the
# authenticated set-up; `ctest -R crypt` selects these. Without --psk-file,
# or with a one-sided mode, it is refused at parse time.
add_test(NAME examples_pingpong_crypt_flags COMMAND bash -c
  "${_fail} 2 '--encrypt seals messages with keys from the authenticated set-up: add --psk-file FILE' ${_pp} --channel --encrypt && ${_fail} 2 '--window writes one-sided, which an encrypted connection refuses: use --channel' ${_pp} --window --encrypt --psk-file key")
set_tests_properties(examples_pingpong_crypt_flags PROPERTIES LABELS unit)
# Both sides seal: every payload checked as usual, 4 KiB messages.
rdx_add_twonode_test(NAME examples_pingpong_crypt_channel TIMEOUT 300
  NODE0 ${_psk} run job 0 "'received, checked and echoed'" "'messages sealed'" -- ${_pp} --channel --encrypt -s 4096 -n 50
  NODE1 ${_psk} run job 0 "'every payload checked'" "'messages sealed'" -- ${_pp} --channel --encrypt -s 4096 -n 50 $RDX_PEER_ADDR)
# Only the server seals: both refuse in set-up, naming both settings.
rdx_add_twonode_test(NAME examples_pingpong_crypt_mismatch TIMEOUT 300
  NODE0 ${_psk} run job 1 "'encrypt is true here but false at the peer'" -- ${_pp} --channel --encrypt -s 64 -n 5
  NODE1 ${_psk} run job 1 "'encrypt is false here but true at the peer'" -- ${_pp} --channel -s 64 -n 5 $RDX_PEER_ADDR)
