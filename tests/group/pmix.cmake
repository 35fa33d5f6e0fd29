# rdx::group::pmix_session (group/pmix.hpp), where rdx::pmix (libpmix) was
# found: `ctest -R pmix`. Included by this directory's CMakeLists.txt.
if(NOT TARGET rdx::pmix)
  return()
endif()

# The session alone, no RDMA device: outside a PMIx job, then 4 ranks under
# mpirun (info() against Open MPI's variables, twelve exchanges in a row).
add_executable(group_pmix_session ${CMAKE_CURRENT_LIST_DIR}/pmix_session.cpp)
target_link_libraries(group_pmix_session PRIVATE rdx::pmix rdx_warnings)
add_test(NAME group_pmix_session
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/mpirun.sh --alone --ok "under PMIx: ok" 4 $<TARGET_FILE:group_pmix_session>)
set_tests_properties(group_pmix_session PROPERTIES LABELS unit SKIP_RETURN_CODE 77 TIMEOUT 120)

# examples/alltoall's PMIx path: mpirun's PMIx server gives 8 ranks in one VM
# their places and carries their addresses, with no MASTER_ADDR. (examples/
# is added after tests/, so the target alltoall is not known yet here.)
if(RDX_BUILD_EXAMPLES)
  rdx_add_rdma_test(NAME group_alltoall_pmix_loopback TIMEOUT 300
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/mpirun.sh --banner "ranks (PMIx)" 8 $<TARGET_FILE:alltoall> --bootstrap pmix -s 16K -n 5)
endif()
