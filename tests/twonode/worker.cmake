# Two-node tests of rdx::worker (included from tests/twonode/CMakeLists.txt):
# node 0 serves N clients, and one that node 1 kills mid-traffic, from one
# thread on one worker; `ctest -R 'worker|many_peers'` selects them.
add_executable(worker_peer ${CMAKE_CURRENT_LIST_DIR}/worker_peer.cpp)
target_link_libraries(worker_peer PRIVATE rdx::rdx rdx_warnings Threads::Threads)
rdx_add_twonode_test(NAME worker_twonode TIMEOUT 600
  NODE0 $<TARGET_FILE:worker_peer> --clients 32
  NODE1 $<TARGET_FILE:worker_peer> --clients 32)
rdx_add_twonode_test(NAME worker_events_twonode TIMEOUT 600
  NODE0 $<TARGET_FILE:worker_peer> --clients 32 --events
  NODE1 $<TARGET_FILE:worker_peer> --clients 32)
rdx_add_twonode_test(NAME many_peers_256_twonode TIMEOUT 900
  NODE0 $<TARGET_FILE:worker_peer> --clients 256 --events
  NODE1 $<TARGET_FILE:worker_peer> --clients 256 --threads 4)
