# README's ```cpp blocks are real code. Every block is compiled as the body of
# a function of its own (readme_examples, with rdx::cm where a block includes
# rdx/cm, rdx::cuda where one includes rdx/cuda; a block whose target is not
# built is left out); the first two, the server and the client of "A server and a
# client", are also programs of their own, run between the two VMs by
# readme_server_client_twonode, so the example a newcomer copies is known to
# work as printed.
file(READ ${PROJECT_SOURCE_DIR}/README.md _readme)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/README.md)
# Blocks hold no backtick, so [^`]* stops at their closing fence. Semicolons
# would split the list of blocks: each stands in as \x01 until a block is used.
string(ASCII 1 _semi)
string(REPLACE ";" "${_semi}" _readme "${_readme}")
string(REGEX MATCHALL "```cpp\n[^`]*```" _blocks "${_readme}")
list(LENGTH _blocks _count)
if(_count LESS 3)
  message(FATAL_ERROR "README.md: expected at least 3 ```cpp blocks (server, client, rdma_cm), found ${_count}")
endif()

set(_prelude "#include <chrono>\n#include <cstddef>\n#include <cstdint>\n#include <cstdio>\n#include <exception>\n#include <optional>\n#include <system_error>\n")
set(_includes "")
set(_functions "")
set(_needs_cm OFF)
set(_needs_cuda OFF)
set(_i 0)
foreach(_block IN LISTS _blocks)
  string(REPLACE "${_semi}" ";" _block "${_block}")
  string(REGEX REPLACE "^```cpp\n" "" _code "${_block}")
  string(REGEX REPLACE "```$" "" _code "${_code}")
  string(REGEX MATCHALL "#include <[^>]+>" _inc "${_code}")
  string(REGEX REPLACE "#include <[^>]+>\n" "" _body "${_code}")
  # A block of rdx/cm or rdx/cuda needs that target: left out where it is not built.
  set(_skip OFF)
  foreach(_part IN ITEMS cm cuda)
    if(_code MATCHES "#include <rdx/${_part}/")
      if(TARGET rdx::${_part})
        set(_needs_${_part} ON)
      else()
        set(_skip ON)
      endif()
    endif()
  endforeach()
  if(_skip)
    math(EXPR _i "${_i} + 1")
    continue()
  endif()
  list(APPEND _includes ${_inc})
  string(APPEND _functions "[[maybe_unused]] static void readme_block_${_i}() {\n${_body}}\n")
  math(EXPR _i "${_i} + 1")
endforeach()
list(REMOVE_DUPLICATES _includes)
list(JOIN _includes "\n" _includes)
set(_types "struct record { std::uint64_t words[8]; };\n")
file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/readme_examples.cpp CONTENT
  "${_includes}\n${_prelude}${_types}${_functions}int main() { return 0; }\n")
add_executable(readme_examples ${CMAKE_CURRENT_BINARY_DIR}/readme_examples.cpp)
target_link_libraries(readme_examples PRIVATE rdx::rdx rdx_warnings)
if(_needs_cm)
  target_link_libraries(readme_examples PRIVATE rdx::cm)
endif()
if(_needs_cuda)
  target_link_libraries(readme_examples PRIVATE rdx::cuda)
endif()

# The server and the client as programs.
list(GET _blocks 0 _server)
list(GET _blocks 1 _client)
foreach(_role IN ITEMS server client)
  string(REPLACE "${_semi}" ";" _code "${_${_role}}")
  string(TOUPPER "${_role}" _up)
  string(SUBSTRING "${_up}" 0 1 _first)
  string(SUBSTRING "${_role}" 1 -1 _tail)
  if(NOT _code MATCHES "// ${_first}${_tail}:")
    message(FATAL_ERROR "README.md: the ${_role} block must be the "
                        "${_role} of \"A server and a client\" (a line \"// ${_first}${_tail}: ...\")")
  endif()
  string(REGEX REPLACE "^```cpp\n" "" _code "${_code}")
  string(REGEX REPLACE "```$" "" _code "${_code}")
  string(REGEX MATCHALL "#include <[^>]+>" _inc "${_code}")
  string(REGEX REPLACE "#include <[^>]+>\n" "" _body "${_code}")
  list(JOIN _inc "\n" _inc)
  file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/readme_${_role}.cpp CONTENT
    "${_inc}\n${_prelude}${_types}static void readme_${_role}() {\n${_body}}\nint main() {\n  try {\n    readme_${_role}();\n    std::printf(\"readme_${_role}: done\\n\");\n    return 0;\n  } catch (const std::exception& e) {\n    std::fprintf(stderr, \"readme_${_role}: %s\\n\", e.what());\n    return 1;\n  }\n}\n")
  add_executable(readme_${_role} ${CMAKE_CURRENT_BINARY_DIR}/readme_${_role}.cpp)
  target_link_libraries(readme_${_role} PRIVATE rdx::rdx rdx_warnings)
endforeach()

rdx_add_twonode_test(NAME readme_server_client_twonode TIMEOUT 200
  NODE0 ${PROJECT_SOURCE_DIR}/tests/twonode/expect_failure.sh 0
        "'the client wrote 64 records. record 63 starts with 1063'" $<TARGET_FILE:readme_server>
  NODE1 ${PROJECT_SOURCE_DIR}/tests/twonode/expect_failure.sh 0 "'readme_client: done'"
        $<TARGET_FILE:readme_client>)
