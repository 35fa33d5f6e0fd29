# Two-node tests of rdx::worker (included from tests/twonode/CMakeLists.txt):
# node 0 serves N clients, and one that node 1 kills mid-traffic, from one
# thread on one worker; `ctest -R 'worker|many_peers'` selects them.
add_executable(worker_peer ${CMAKE_CURRENT_LIST_DIR}/worker_peer.cpp)
target_link_libraries(worker_peer PRIVATE rdx::rdx rdx_warnings Threads::Threads)
if(TARGET rdx::cm)
  target_link_libraries(worker_peer PRIVATE rdx::cm)
  target_compile_definitions(worker_peer PRIVATE RDX_WORKER_PEER_CM=1)
endif()
rdx_add_twonode_test(NAME worker_twonode TIMEOUT 600
  NODE0 $<TARGET_FILE:worker_peer> --clients 32
  NODE1 $<TARGET_FILE:worker_peer> --clients 32)
rdx_add_twonode_test(NAME worker_events_twonode TIMEOUT 600
  NODE0 $<TARGET_FILE:worker_peer> --clients 32 --events
  NODE1 $<TARGET_FILE:worker_peer> --clients 32)
# Set-up while serving: rdx::acceptor over TCP; and every connection through
# rdma_cm, one blocking accept after another and with cm::acceptor.
rdx_add_twonode_test(NAME worker_acceptor_twonode TIMEOUT 600
  NODE0 $<TARGET_FILE:worker_peer> --clients 32 --events --acceptor
  NODE1 $<TARGET_FILE:worker_peer> --clients 32)
if(TARGET rdx::cm)
  rdx_add_twonode_test(NAME worker_cm_twonode TIMEOUT 600
    NODE0 $<TARGET_FILE:worker_peer> --clients 32 --events --cm
    NODE1 $<TARGET_FILE:worker_peer> --clients 32 --cm)
  rdx_add_twonode_test(NAME worker_cm_acceptor_twonode TIMEOUT 600
    NODE0 $<TARGET_FILE:worker_peer> --clients 32 --events --cm --acceptor
    NODE1 $<TARGET_FILE:worker_peer> --clients 32 --cm)
endif()
# release_only: the set-up variants; the ASan run takes the acceptors in
# worker_acceptor_loopback and worker_cm_acceptor_loopback, and rdma_cm
# set-up in cm_loopback and the cm_* tests.
set_property(TEST worker_acceptor_twonode APPEND PROPERTY LABELS release_only)
if(TARGET rdx::cm)
  set_property(TEST worker_cm_twonode worker_cm_acceptor_twonode APPEND PROPERTY LABELS release_only)
endif()
# The server's connections on one receive pool (worker_attr::pool): 32 and 256 clients.
rdx_add_twonode_test(NAME worker_pool_events_twonode TIMEOUT 600
  NODE0 $<TARGET_FILE:worker_peer> --clients 32 --events --pool
  NODE1 $<TARGET_FILE:worker_peer> --clients 32)
rdx_add_twonode_test(NAME many_peers_pool_256_twonode TIMEOUT 900
  NODE0 $<TARGET_FILE:worker_peer> --clients 256 --events --pool --acceptor
  NODE1 $<TARGET_FILE:worker_peer> --clients 256 --threads 4)
set_property(TEST many_peers_pool_256_twonode APPEND PROPERTY LABELS release_only)
rdx_add_twonode_test(NAME many_peers_256_twonode TIMEOUT 900
  NODE0 $<TARGET_FILE:worker_peer> --clients 256 --events
  NODE1 $<TARGET_FILE:worker_peer> --clients 256 --threads 4)

# pingpong's --clients server: every client on one worker, one thread, set up
# by rdx::acceptor while the others are served; 32 client processes at once,
# polling and in event mode (the clients sleep on events: 32 busy-polling
# processes would share the VM's one core with the server).
# -t 120 (the server's wait for a client): 32 ASan client processes can
# take more than 30 s to start in the VM.
# --ack-timeout 500 (code 17, 537 ms a try, 3.8 s before a request fails):
# with 32 ASan processes on each VM's one vCPU, the VM's kernel can fall
# behind the default 67 ms for longer than its 7 tries (470 ms), and a
# client's send failed with "transport retry counter exceeded" in a CI run
# while its peer was alive. The wait is set in time, as users set it.
set(_pp $<TARGET_FILE:pingpong>)
set(_fail ${CMAKE_CURRENT_LIST_DIR}/expect_failure.sh)
set(_ppc ${CMAKE_CURRENT_LIST_DIR}/pingpong_clients.sh)
foreach(_m channel window)
  rdx_add_twonode_test(NAME worker_pingpong_${_m}_32_twonode TIMEOUT 600
    NODE0 ${_fail} 0 "'32 clients handled: 32 served, 0 failed in set-up, 0 failed after set-up'"
          ${_pp} --${_m} -s 64 -n 200 --clients 32 -t 120 -p 18570 --ack-timeout 500
    NODE1 ${_ppc} ${_pp} $RDX_PEER_ADDR 18570 32 --${_m} -s 64 -n 200 -e --ack-timeout 500)
  # Event mode with the clients' messages in one receive pool (--pool).
  rdx_add_twonode_test(NAME worker_pingpong_${_m}_32_events_twonode TIMEOUT 600
    NODE0 ${_fail} 0 "'32 clients handled: 32 served, 0 failed in set-up, 0 failed after set-up'"
          ${_pp} --${_m} -s 64 -n 200 --clients 32 -e --pool -t 120 -p 18571 --ack-timeout 500
    NODE1 ${_ppc} ${_pp} $RDX_PEER_ADDR 18571 32 --${_m} -s 64 -n 200 -e --ack-timeout 500)
endforeach()
# 32 client processes in one VM: under ASan each holds about 20 MiB of its own
# memory, more than 768 MiB in all (one CI run: clients killed by the VM's
# OOM killer), so both VMs of the 32-client pingpong tests get 1280 MiB (not
# kv_window's: with more memory its 32 ASan clients reached the server too late).
set_property(TEST worker_pingpong_channel_32_twonode worker_pingpong_channel_32_events_twonode
  worker_pingpong_window_32_twonode worker_pingpong_window_32_events_twonode
  APPEND PROPERTY ENVIRONMENT RDX_VM_MEM=1280)
# release_only: the window variants over TCP. Under ASan the server's writes
# met "transport retry counter exceeded" near the end of a run, all clients'
# at the same moment, as the first of 32 ASan client processes exited and
# their VM's kernel fell behind the ACK timeout (67 ms x 6 retries). The
# channel variants and the rdma_cm window variant (the same per-client state
# machine) run under ASan.
set_property(TEST worker_pingpong_window_32_twonode worker_pingpong_window_32_events_twonode
  APPEND PROPERTY LABELS release_only)
# And the polling channel variant: its event-mode twin runs under ASan.
set_property(TEST worker_pingpong_channel_32_twonode APPEND PROPERTY LABELS release_only)
# The same over rdma_cm (rdx::cm::acceptor): settings as the first message each way.
if(TARGET rdx::cm)
  rdx_add_twonode_test(NAME worker_pingpong_cm_window_32_events_twonode TIMEOUT 600
    NODE0 ${_fail} 0 "'32 clients handled: 32 served, 0 failed in set-up, 0 failed after set-up'"
          ${_pp} --cm --window -s 64 -n 200 --clients 32 -e -t 120 -p 18572 --ack-timeout 500
    NODE1 ${_ppc} ${_pp} $RDX_PEER_ADDR 18572 32 --cm --window -s 64 -n 200 -e --ack-timeout 500)
  # Under ASan, 32 rdma_cm set-ups at once on the VMs' one vCPU can overrun a
  # client's connection-manager timeout (one CI run: a client rejected, IB CM
  # reason 28): it runs in the release suite; its TCP twin
  # (worker_pingpong_window_32_events_twonode) runs under ASan.
  set_property(TEST worker_pingpong_cm_window_32_events_twonode APPEND PROPERTY LABELS release_only)
  set_property(TEST worker_pingpong_cm_window_32_events_twonode APPEND PROPERTY ENVIRONMENT RDX_VM_MEM=1280)
endif()

# kv_window's --clients server: every client on one worker, one thread, set up
# by rdx::acceptor while the others are served; 32 client processes at once
# over TCP, each on its own slice of the table, both sides checking it.
# Under ASan, 32 client processes start on the VM's one emulated vCPU (load
# 14) and hold about 20 MiB each: in 768 MiB their VM ran out of memory (17
# to 29 MiB available, kv_window_clients.sh's report) and none reached the
# server within its 30 s wait for a first client. Both VMs get 1280 MiB and
# both sides a 120 s timeout (the wait for a first client and each set-up;
# a passing run is as fast as before).
rdx_add_twonode_test(NAME worker_kv_window_32_twonode TIMEOUT 600
  NODE0 ${_fail} 0 "'server: 32 of 32 clients passed'" $<TARGET_FILE:kv_window> --clients 32 --pool -n 32 -t 120
  NODE1 ${CMAKE_CURRENT_LIST_DIR}/kv_window_clients.sh $<TARGET_FILE:kv_window> 32 $RDX_PEER_ADDR -n 32 -t 120)
set_property(TEST worker_kv_window_32_twonode APPEND PROPERTY ENVIRONMENT RDX_VM_MEM=1280)
