# Tests that need an RDMA fabric.
#
# rdx_add_rdma_test(NAME <name> COMMAND <cmd> [<arg>...]
#                   [TIMEOUT <s>] [ENVIRONMENT <VAR=value>...] [WORKING_DIRECTORY <dir>])
#   ctest label "rdma". At test time the command runs natively when the machine
#   has an RDMA device (RDX_DEVICE set, or /sys/class/infiniband not empty),
#   otherwise inside one Soft-RoCE VM (cmake/softroce/rdx-vm) with RDX_DEVICE=rxe0.
#
# rdx_add_twonode_test(NAME <name> NODE0 <word>... NODE1 <word>...
#                      [TIMEOUT <s>] [ENVIRONMENT <VAR=value>...] [WORKING_DIRECTORY <dir>])
#   ctest label "twonode". Always two Soft-RoCE VMs joined by a private wire.
#   The words of NODE0 and of NODE1 are joined with spaces into one bash
#   command per VM, so $RDX_PEER_ADDR, $RDX_NODE_ADDR, $RDX_NODE and
#   $RDX_DEVICE expand there (write them without braces, or as \${...}).
#   Generator expressions such as $<TARGET_FILE:tgt> work in both.
#
# Both exit 77 (reported by ctest as skipped, never as passed) when the
# machine has no RDMA device and cannot boot the VMs (no qemu, no static
# busybox, ...), with a message saying what is missing; with the environment
# variable RDX_REQUIRE_FABRIC=1 (set by scripts/quickstart.sh and CI) that is
# a failure instead. The working directory (default: the current binary dir)
# must not be under /tmp or /run, which are empty tmpfs inside the VMs.
#
# A VM under TCG keeps one core busy, so each rdma test takes PROCESSORS 1 and
# each twonode test PROCESSORS 2: `ctest -j$(nproc)` never starts more VMs
# than there are cores.

set(RDX_SOFTROCE_DIR ${CMAKE_CURRENT_LIST_DIR}/softroce CACHE INTERNAL "rdx Soft-RoCE runner")
set(RDX_RDMA_TEST_TIMEOUT 900 CACHE STRING "Default ctest TIMEOUT (s) of rdma and twonode tests")

function(_rdx_fabric_test_props name label timeout processors)
  cmake_parse_arguments(P "" "WORKING_DIRECTORY" "ENVIRONMENT" ${ARGN})
  set_tests_properties(${name} PROPERTIES
    LABELS ${label}
    SKIP_RETURN_CODE 77
    TIMEOUT ${timeout}
    PROCESSORS ${processors})
  # The source and build trees reach the VMs even from under /tmp (rdx-vm).
  set(env "RDX_VM_SHARE=${PROJECT_SOURCE_DIR}:${PROJECT_BINARY_DIR}" ${P_ENVIRONMENT})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${env}")
endfunction()

function(rdx_add_rdma_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT;WORKING_DIRECTORY" "COMMAND;ENVIRONMENT" ${ARGN})
  if(NOT A_NAME OR NOT A_COMMAND)
    message(FATAL_ERROR "rdx_add_rdma_test: NAME and COMMAND are required")
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT ${RDX_RDMA_TEST_TIMEOUT})
  endif()
  # The runner stops the VM before ctest's own timeout, so it cleans up.
  math(EXPR vm_timeout "${A_TIMEOUT} - 20")
  set(wd ${CMAKE_CURRENT_BINARY_DIR})
  if(A_WORKING_DIRECTORY)
    set(wd ${A_WORKING_DIRECTORY})
  endif()
  add_test(NAME ${A_NAME}
    COMMAND ${RDX_SOFTROCE_DIR}/rdx-run-rdma --timeout ${vm_timeout} -- ${A_COMMAND}
    WORKING_DIRECTORY ${wd})
  _rdx_fabric_test_props(${A_NAME} rdma ${A_TIMEOUT} 1 ENVIRONMENT ${A_ENVIRONMENT})
endfunction()

function(rdx_add_twonode_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT;WORKING_DIRECTORY" "NODE0;NODE1;ENVIRONMENT" ${ARGN})
  if(NOT A_NAME OR NOT A_NODE0 OR NOT A_NODE1)
    message(FATAL_ERROR "rdx_add_twonode_test: NAME, NODE0 and NODE1 are required")
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT ${RDX_RDMA_TEST_TIMEOUT})
  endif()
  math(EXPR vm_timeout "${A_TIMEOUT} - 20")
  list(JOIN A_NODE0 " " node0)
  list(JOIN A_NODE1 " " node1)
  set(wd ${CMAKE_CURRENT_BINARY_DIR})
  if(A_WORKING_DIRECTORY)
    set(wd ${A_WORKING_DIRECTORY})
  endif()
  add_test(NAME ${A_NAME}
    COMMAND ${RDX_SOFTROCE_DIR}/rdx-run-twonode --timeout ${vm_timeout}
            --node0 "${node0}" --node1 "${node1}"
    WORKING_DIRECTORY ${wd})
  _rdx_fabric_test_props(${A_NAME} twonode ${A_TIMEOUT} 2 ENVIRONMENT ${A_ENVIRONMENT})
endfunction()
