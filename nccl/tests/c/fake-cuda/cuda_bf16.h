/* A stand-in for CUDA's cuda_bf16.h, for nccl/tests/header.rs: the bfloat16 type NVIDIA's
 * nccl.h brings in with CUDA's runtime headers (CUDA 11 and later). */
#ifndef __CUDA_BF16_H__
#define __CUDA_BF16_H__

typedef struct __nv_bfloat16 {
  unsigned short x;
} __nv_bfloat16;

#endif
