# Two-node tests of channels and windows (included from
# tests/twonode/CMakeLists.txt). Node 0 serves, node 1 connects; every
# payload is checked on both sides.
add_executable(channel_peer ${CMAKE_CURRENT_LIST_DIR}/channel_peer.cpp)
target_link_libraries(channel_peer PRIVATE rdx::rdx rdx_warnings)

# Windows (write, read, fetch_add, compare_swap), messages and notifications,
# striped over K = 1, 2 and 4 queue pairs.
rdx_add_twonode_test(NAME channel_twonode TIMEOUT 600
  NODE0 $<TARGET_FILE:channel_peer>
  NODE1 $<TARGET_FILE:channel_peer>)

if(RDX_BUILD_EXAMPLES)
  set(_pp $<TARGET_FILE:pingpong>)
  set(_kv $<TARGET_FILE:kv_window>)
  rdx_add_twonode_test(NAME channel_pingpong_channel TIMEOUT 300
    NODE0 ${_pp} --channel -s 64 -n 100
    NODE1 ${_pp} --channel -s 64 -n 100 $RDX_PEER_ADDR)
  rdx_add_twonode_test(NAME channel_pingpong_channel_4k TIMEOUT 300
    NODE0 ${_pp} --channel -s 4096 -n 50
    NODE1 ${_pp} --channel -s 4096 -n 50 $RDX_PEER_ADDR)
  rdx_add_twonode_test(NAME channel_pingpong_window TIMEOUT 300
    NODE0 ${_pp} --window -s 64 -n 100
    NODE1 ${_pp} --window -s 64 -n 100 $RDX_PEER_ADDR)
  rdx_add_twonode_test(NAME channel_pingpong_window_64k TIMEOUT 300
    NODE0 ${_pp} --window -s 64K -n 20
    NODE1 ${_pp} --window -s 64K -n 20 $RDX_PEER_ADDR)
  # release_only: more sizes and modes of channel_pingpong_channel; the ASan
  # run (scripts/quickstart.sh) leaves them to release.
  set_property(TEST channel_pingpong_channel_4k channel_pingpong_window channel_pingpong_window_64k
    APPEND PROPERTY LABELS release_only)
  rdx_add_twonode_test(NAME channel_kv_window TIMEOUT 300
    NODE0 ${_kv} -n 64
    NODE1 ${_kv} -n 64 $RDX_PEER_ADDR)
  # 20000 records (1.25 MiB): the table reads stripe over 4 queue pairs.
  rdx_add_twonode_test(NAME channel_kv_window_striped TIMEOUT 300
    NODE0 ${_kv} -n 20000 -k 4
    NODE1 ${_kv} -n 20000 -k 4 $RDX_PEER_ADDR)
  add_test(NAME channel_kv_window_help COMMAND ${_kv} --help)
  set_tests_properties(channel_kv_window_help PROPERTIES LABELS unit)
endif()

# Dead peers (docs/design.md, "Dead peers"): the victim's process is killed
# mid-transfer, or its link goes down with only receives pending; the
# survivor checks that every pending operation ends with an error, once,
# within connection::detection_bound().
add_executable(dead_peer ${CMAKE_CURRENT_LIST_DIR}/dead_peer.cpp)
target_link_libraries(dead_peer PRIVATE rdx::rdx rdx_warnings)
if(TARGET rdx::cm)
  target_link_libraries(dead_peer PRIVATE rdx::cm)
  target_compile_definitions(dead_peer PRIVATE RDX_TEST_CM=1)
endif()
rdx_add_twonode_test(NAME dead_peer_kill_twonode TIMEOUT 300
  NODE0 $<TARGET_FILE:dead_peer> --kill
  NODE1 $<TARGET_FILE:dead_peer> --kill)
rdx_add_twonode_test(NAME dead_peer_link_twonode TIMEOUT 300
  NODE0 $<TARGET_FILE:dead_peer> --link
  NODE1 $<TARGET_FILE:dead_peer> --link)
rdx_add_twonode_test(NAME dead_peer_link_traffic_twonode TIMEOUT 300
  NODE0 $<TARGET_FILE:dead_peer> --link-traffic
  NODE1 $<TARGET_FILE:dead_peer> --link-traffic)

# Least privilege on the fabric (docs/design.md, "Trust"): a sub-range grant
# and a key on another connection refused by the NIC; revoke while the peer
# writes; with rdx::auth, the pre-shared key between two nodes.
add_executable(trust_peer ${CMAKE_CURRENT_LIST_DIR}/trust_peer.cpp)
target_link_libraries(trust_peer PRIVATE rdx::rdx rdx_warnings)
if(TARGET rdx::auth)
  target_link_libraries(trust_peer PRIVATE rdx::auth)
  target_compile_definitions(trust_peer PRIVATE RDX_TEST_AUTH=1)
  rdx_add_twonode_test(NAME auth_twonode TIMEOUT 300
    NODE0 $<TARGET_FILE:trust_peer> --auth
    NODE1 $<TARGET_FILE:trust_peer> --auth)
endif()
rdx_add_twonode_test(NAME grant_twonode TIMEOUT 300
  NODE0 $<TARGET_FILE:trust_peer> --grant
  NODE1 $<TARGET_FILE:trust_peer> --grant)
rdx_add_twonode_test(NAME revoke_twonode TIMEOUT 300
  NODE0 $<TARGET_FILE:trust_peer> --revoke
  NODE1 $<TARGET_FILE:trust_peer> --revoke)
