# Placeholder until the Soft-RoCE runner lands.
function(rdx_add_rdma_test)
  cmake_parse_arguments(A "" "NAME" "COMMAND" ${ARGN})
  add_test(NAME ${A_NAME} COMMAND ${A_COMMAND})
  set_tests_properties(${A_NAME} PROPERTIES LABELS rdma)
endfunction()
