/* A stand-in for CUDA's cuda_fp16.h, for nccl/tests/header.rs: the half type NVIDIA's nccl.h
 * brings in with CUDA's runtime headers. */
#ifndef __CUDA_FP16_H__
#define __CUDA_FP16_H__

typedef struct __half {
  unsigned short x;
} __half;

#endif
