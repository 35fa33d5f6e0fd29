# rdx_enable_cuda_language(<what>): enables CMake's CUDA language for rdx's
# own kernels (tests, examples) where nvcc exists; sets RDX_CUDA_LANGUAGE to
# ON or OFF, saying "no CUDA compiler, <what> not built" when OFF.
macro(rdx_enable_cuda_language what)
  set(RDX_CUDA_LANGUAGE OFF)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(STATUS "rdx: no CUDA compiler, ${what} not built")
  else()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # sm_90 machine code for the H200, and PTX any newer GPU can compile.
      set(CMAKE_CUDA_ARCHITECTURES 90-real 75-virtual)
    endif()
    enable_language(CUDA)
    set(RDX_CUDA_LANGUAGE ON)
  endif()
endmacro()
