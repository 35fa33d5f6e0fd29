// rdx::cuda configuration: RDX_HAS_CUDA() says whether the CUDA Toolkit's host
// headers are usable in this translation unit.
#pragma once

//! \file
//! What of CUDA a translation unit can use: RDX_HAS_CUDA() and RDX_HAS_CUDA_DEVICE_CODE().

// Set by the rdx::cuda target (RDX_WITH_CUDA=1); a consumer that adds the
// toolkit's include path by hand can define RDX_WITH_CUDA=1 itself.
//! \def RDX_HAS_CUDA()
//! 1 where the CUDA Toolkit's host headers are usable (RDX_WITH_CUDA=1, which the rdx::cuda
//! target defines, and cuda_runtime_api.h and cuda.h found), else 0.
#if defined(RDX_WITH_CUDA) && RDX_WITH_CUDA && __has_include(<cuda_runtime_api.h>) && __has_include(<cuda.h>)
#define RDX_HAS_CUDA() 1
#else
#define RDX_HAS_CUDA() 0
#endif

// Device code (kernels, __device__ functions) exists only under nvcc.
//! \def RDX_HAS_CUDA_DEVICE_CODE()
//! 1 when nvcc compiles the translation unit (__CUDACC__), where device code exists, else 0.
#if defined(__CUDACC__)
#define RDX_HAS_CUDA_DEVICE_CODE() 1
#else
#define RDX_HAS_CUDA_DEVICE_CODE() 0
#endif
