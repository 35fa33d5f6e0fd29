# Finds librdmacm and defines the imported target RDMACM::rdmacm.
find_path(RDMACM_INCLUDE_DIR rdma/rdma_cma.h)
find_library(RDMACM_LIBRARY rdmacm)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(RDMACM REQUIRED_VARS RDMACM_LIBRARY RDMACM_INCLUDE_DIR)
if(RDMACM_FOUND AND NOT TARGET RDMACM::rdmacm)
  add_library(RDMACM::rdmacm UNKNOWN IMPORTED)
  set_target_properties(RDMACM::rdmacm PROPERTIES
    IMPORTED_LOCATION "${RDMACM_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${RDMACM_INCLUDE_DIR}")
endif()
mark_as_advanced(RDMACM_INCLUDE_DIR RDMACM_LIBRARY)
