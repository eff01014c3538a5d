/* A stand-in for CUDA's cuda_runtime.h, for nccl/tests/header.rs: its include guard, the
 * CUDART_VERSION its cuda_runtime_api.h defines, and driver_types.h included as CUDA does. */
#ifndef __CUDA_RUNTIME_H__
#define __CUDA_RUNTIME_H__

#define CUDART_VERSION 12080

#include "driver_types.h"

#endif
