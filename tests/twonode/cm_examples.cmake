# Two-node tests of the examples over rdma_cm (--cm; included from
# tests/twonode/CMakeLists.txt). Node 0 serves, node 1 connects; the clients
# retry while nothing listens yet. Every payload is checked on both sides.
if(NOT RDX_BUILD_EXAMPLES OR NOT TARGET rdx::cm)
  return()
endif()

set(_pp $<TARGET_FILE:pingpong>)
set(_kv $<TARGET_FILE:kv_window>)
set(_fail ${CMAKE_CURRENT_LIST_DIR}/expect_failure.sh)

# pingpong in every mode: settings (and the write_imm ring) in the private
# data for send and write_imm, rdx::cm::connect/accept for channel and window.
foreach(m send write_imm channel window)
  rdx_add_twonode_test(NAME cm_pingpong_${m} TIMEOUT 300
    NODE0 ${_pp} --cm --mode ${m} -n 100
    NODE1 ${_pp} --cm --mode ${m} -n 100 $RDX_PEER_ADDR)
endforeach()
rdx_add_twonode_test(NAME cm_pingpong_window_64k TIMEOUT 300
  NODE0 ${_pp} --cm --window -s 64K -n 20
  NODE1 ${_pp} --cm --window -s 64K -n 20 $RDX_PEER_ADDR)
# release_only: more modes of the same set-up; the ASan run (scripts/quickstart.sh)
# takes cm_pingpong_channel and leaves these to release.
set_property(TEST cm_pingpong_send cm_pingpong_write_imm cm_pingpong_window cm_pingpong_window_64k
  APPEND PROPERTY LABELS release_only)

# The server rejects a request whose settings differ; the client prints the
# server's reason from the reject's private data.
rdx_add_twonode_test(NAME cm_pingpong_settings_rejected TIMEOUT 300
  NODE0 ${_fail} 1 "'settings differ.*-n 10 here, 20 there'" ${_pp} --cm -n 10
  NODE1 ${_fail} 1 "'rejected by the rdx server.*settings differ'" ${_pp} --cm -n 20 $RDX_PEER_ADDR)

# No listener: the client retries until its timeout, then names the peer and the cause.
rdx_add_twonode_test(NAME cm_pingpong_no_listener TIMEOUT 300
  NODE0 sleep 10
  NODE1 ${_fail} 1 "'10.77.0.1:18515: nothing listens on that port'" ${_pp} --cm -t 3 $RDX_PEER_ADDR)

# One kv_window server, three clients at once over rdma_cm, two queue pairs
# each: each client works on its own slice of the table, and both sides check.
rdx_add_twonode_test(NAME cm_kv_window_three_clients TIMEOUT 300
  NODE0 ${_fail} 0 "'server: 3 of 3 clients passed'" ${_kv} --cm --clients 3 -n 32 -k 2
  NODE1 ${CMAKE_CURRENT_LIST_DIR}/kv_window_clients.sh ${_kv} 3 $RDX_PEER_ADDR --cm -n 32 -k 2)

# The victim's process is killed mid-transfer: its kernel disconnects, and the
# survivor's pending operations end with peer_disconnected, printed next to
# the retry-timeout bound that dead_peer_kill_twonode measures over TCP.
rdx_add_twonode_test(NAME cm_dead_peer_kill_twonode TIMEOUT 300
  NODE0 $<TARGET_FILE:dead_peer> --kill --cm
  NODE1 $<TARGET_FILE:dead_peer> --kill --cm)
