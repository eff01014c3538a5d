/* A stand-in for CUDA's driver_types.h, for nccl/tests/header.rs: its include guard and its
 * declaration of cudaStream_t as CUDA's own header writes them (with CUDA's
 * __device_builtin__ marker, empty outside nvcc), and one more type beside it. */
#ifndef __DRIVER_TYPES_H__
#define __DRIVER_TYPES_H__

#define __device_builtin__

typedef enum __device_builtin__ cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1
} cudaError_t;

typedef __device_builtin__ struct CUstream_st *cudaStream_t;

#endif
