# Debian packages of rdx, made by `cpack -G DEB` in a build tree with RDX_INSTALL
# on (tests/package checks them):
#
#   rdx-dev_<version>_all.deb      install component dev: the headers, the CMake
#                                  package (share/cmake/rdx) and rdx.pc; needs
#                                  libibverbs-dev, recommends librdmacm-dev (cm),
#                                  suggests libssl-dev (auth) and libpmix-dev (pmix)
#   rdx-tools_<version>_<arch>.deb install component tools: the example programs
#                                  and rdx-doctor, as rdx-* in bin; its Depends
#                                  come from dpkg-shlibdeps (dpkg-dev, file)
#
# The top-level CMakeLists.txt includes this file deferred, at its end, so that
# the programs of every directory are known here. rdx-tools is made only where
# one of them is built (RDX_BUILD_EXAMPLES, or tools/ for rdx-doctor). The
# examples link CUDA where rdx::cuda exists: configure with RDX_CUDA=OFF for a
# rdx-tools that depends on Debian packages only.

set(RDX_PACKAGE_MAINTAINER "rdx maintainers <maintainers@users.noreply.a-seed-311f750f.example>"
  CACHE STRING "Maintainer field of rdx's Debian packages")

# Programs of rdx-tools: target, then its name in bin (every name starts rdx-).
set(_rdx_tool_programs devinfo rdx-devinfo pingpong rdx-pingpong kv_window rdx-kv-window)
set(_rdx_has_tools OFF)
while(_rdx_tool_programs)
  list(POP_FRONT _rdx_tool_programs _rdx_target _rdx_name)
  if(TARGET ${_rdx_target})
    install(PROGRAMS $<TARGET_FILE:${_rdx_target}> DESTINATION ${CMAKE_INSTALL_BINDIR}
            RENAME ${_rdx_name} COMPONENT tools)
    # Renamed, so stripped here (cpack strips): install(TARGETS) would, but
    # cannot rename.
    if(CMAKE_STRIP)
      install(CODE "
        if(CMAKE_INSTALL_DO_STRIP)
          execute_process(COMMAND \"${CMAKE_STRIP}\"
            \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/${_rdx_name}\")
        endif()" COMPONENT tools)
    endif()
    set(_rdx_has_tools ON)
  endif()
endwhile()
if(TARGET rdx-doctor)
  install(TARGETS rdx-doctor RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
  set(_rdx_has_tools ON)
endif()

# Copyright files, where Debian keeps them: packages only (EXCLUDE_FROM_ALL
# leaves them out of a plain `cmake --install`).
foreach(_rdx_pkg IN ITEMS dev tools)
  install(FILES ${PROJECT_SOURCE_DIR}/LICENSE
          DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/rdx-${_rdx_pkg} RENAME copyright
          COMPONENT ${_rdx_pkg} EXCLUDE_FROM_ALL)
endforeach()

# CPack is the top-level project's: a project that adds rdx as a subdirectory
# (with RDX_INSTALL on) keeps its own packaging.
if(NOT PROJECT_IS_TOP_LEVEL)
  return()
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME rdx)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "rdx")
set(CPACK_PACKAGE_CONTACT "${RDX_PACKAGE_MAINTAINER}")
# Empty: each package's own description starts with its synopsis line
# (cpack would put the project's description before both).
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL dev)
if(_rdx_has_tools)
  list(APPEND CPACK_COMPONENTS_ALL tools)
endif()

set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${RDX_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# <name>_<version>_<arch>.deb: stable names (no Debian revision is set).
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME rdx-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libibverbs-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "librdmacm-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SUGGESTS "libssl-dev (>= 3.0), libpmix-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_DEV_DESCRIPTION
"header-only C++20 RDMA library: headers, CMake and pkg-config files
rdx wraps libibverbs in move-only owners and typed channels, with rdma_cm
connection set-up (rdx::cm, with librdmacm-dev), pre-shared-key
authentication (rdx::auth, with libssl-dev), a job's ranks from a PMIx
launcher (rdx::pmix, with libpmix-dev) and GPUDirect RDMA (rdx::cuda).
This package holds the headers, the CMake package, for
find_package(rdx CONFIG COMPONENTS cm auth pmix cuda), and rdx.pc for pkg-config.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME rdx-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION net)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_TOOLS_PACKAGE_RECOMMENDS "ibverbs-providers")
set(CPACK_DEBIAN_TOOLS_DESCRIPTION
"RDMA programs built with rdx: devinfo, pingpong, kv-window, doctor
rdx-devinfo shows each RDMA device, its ports and GID tables and the GID
rdx would choose; rdx-pingpong measures latency and bandwidth between two
hosts (and interoperates with ibv_rc_pingpong); rdx-kv-window serves a table
of records over one-sided RDMA; rdx-doctor checks a host's RDMA set-up.")

include(CPack)
