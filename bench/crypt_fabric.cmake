# rdx_crypt_fabric: encrypted (connection_attr::encrypt) against plain
# connections on one fabric, two processes (server, then client SERVER), every
# byte checked; needs rdx::auth (OpenSSL) for its pre-shared-key set-up.
if(TARGET rdx::auth)
  add_executable(rdx_crypt_fabric ${CMAKE_CURRENT_LIST_DIR}/crypt_fabric.cpp)
  target_link_libraries(rdx_crypt_fabric PRIVATE rdx::rdx rdx::auth rdx_apps rdx_warnings)
else()
  message(STATUS "rdx: rdx::auth not found (apt-get install libssl-dev): rdx_crypt_fabric not built")
endif()

# The smoke of it on the fabric (`ctest -R crypt`): two VMs, --quick counts,
# both sides with one key (tests/twonode/psk_examples.sh derives it from a
# name), every byte checked in both modes.
if(TARGET rdx_crypt_fabric AND RDX_BUILD_TESTS)
  set(_psk ${PROJECT_SOURCE_DIR}/tests/twonode/psk_examples.sh)
  rdx_add_twonode_test(NAME crypt_fabric_twonode TIMEOUT 300
    NODE0 ${_psk} run job 0 -- $<TARGET_FILE:rdx_crypt_fabric> --timeout 60
    NODE1 ${_psk} run job 0 "'crypt_fabric,message,64,'" "'crypt_fabric,transfer,1048576,'"
          "'crypt_fabric,fetch,1048576,'"
          -- $<TARGET_FILE:rdx_crypt_fabric> --quick --timeout 60 $RDX_PEER_ADDR)
  add_test(NAME crypt_fabric_help COMMAND $<TARGET_FILE:rdx_crypt_fabric> --help)
  set_tests_properties(crypt_fabric_help PROPERTIES LABELS unit)
endif()
