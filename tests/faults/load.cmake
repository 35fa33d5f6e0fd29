# Load and forced faults in one process, loopback in one VM (load.cpp):
# churn (2000 connect-transfer-disconnect cycles, resources flat), scale (128
# connection pairs of 2 queue pairs, all carrying checked traffic at once) and
# a queue pair forced to ERR mid-transfer over K = 4, and a NIC that stops
# answering (the stall watchdog). Labels rdma and faults.
add_executable(faults_load ${CMAKE_CURRENT_LIST_DIR}/load.cpp)
target_include_directories(faults_load PRIVATE ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(faults_load PRIVATE rdx::rdx rdx_catch_main rdx_warnings Threads::Threads)
# Under the sanitizers a cycle costs several times more: 500 cycles there.
set(_churn_env)
if(CMAKE_CXX_FLAGS MATCHES "sanitize")
  set(_churn_env RDX_CHURN_CYCLES=500)
endif()
foreach(area churn scale qp_error stall)
  rdx_add_rdma_test(NAME faults_${area}_loopback TIMEOUT 600 COMMAND $<TARGET_FILE:faults_load> "[${area}]"
                    ENVIRONMENT ${_churn_env})
  set_tests_properties(faults_${area}_loopback PROPERTIES LABELS "rdma;faults")
endforeach()
