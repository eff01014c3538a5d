/* nccl.h against oxccl.h, for nccl/tests/header.rs: every value the two headers share is equal,
 * ncclConfig_t has oxcclConfig_t's layout (which is the Rust struct's: cbindgen writes oxccl.h
 * from it), and NCCL_CONFIG_INITIALIZER fills what NCCL's does. Compiled as C11 (for
 * _Static_assert and _Generic); exits 0 when the run-time checks hold. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>

#include "nccl.h"
#include "oxccl.h"

#define SAME(a, b) _Static_assert((long long)(a) == (long long)(b), #a " != " #b)

/* Result codes: NCCL 2.27's 0 to 7 are oxccl's; its count stops where oxccl's timeout is. */
SAME(ncclSuccess, oxcclSuccess);
SAME(ncclUnhandledCudaError, oxcclUnhandledCudaError);
SAME(ncclSystemError, oxcclSystemError);
SAME(ncclInternalError, oxcclInternalError);
SAME(ncclInvalidArgument, oxcclInvalidArgument);
SAME(ncclInvalidUsage, oxcclInvalidUsage);
SAME(ncclRemoteError, oxcclRemoteError);
SAME(ncclInProgress, oxcclInProgress);
SAME(ncclNumResults, oxcclTimeout);
SAME(sizeof(ncclResult_t), sizeof(oxcclResult_t));

/* Data types. */
SAME(ncclInt8, oxcclInt8);
SAME(ncclChar, oxcclChar);
SAME(ncclUint8, oxcclUint8);
SAME(ncclInt32, oxcclInt32);
SAME(ncclInt, oxcclInt);
SAME(ncclUint32, oxcclUint32);
SAME(ncclInt64, oxcclInt64);
SAME(ncclUint64, oxcclUint64);
SAME(ncclFloat16, oxcclFloat16);
SAME(ncclHalf, oxcclHalf);
SAME(ncclFloat32, oxcclFloat32);
SAME(ncclFloat, oxcclFloat);
SAME(ncclFloat64, oxcclFloat64);
SAME(ncclDouble, oxcclDouble);
SAME(ncclBfloat16, oxcclBfloat16);
SAME(ncclFloat8e4m3, oxcclFloat8e4m3);
SAME(ncclFloat8e5m2, oxcclFloat8e5m2);
SAME(ncclNumTypes, oxcclNumTypes);
SAME(sizeof(ncclDataType_t), sizeof(oxcclDataType_t));

/* Operators; oxccl's bitwise extensions lie above NCCL's and below ncclMaxRedOp. */
SAME(ncclSum, oxcclSum);
SAME(ncclProd, oxcclProd);
SAME(ncclMax, oxcclMax);
SAME(ncclMin, oxcclMin);
SAME(ncclAvg, oxcclAvg);
SAME(ncclNumOps, oxcclNumOps);
SAME(ncclMaxRedOp, 0x7fffffff);
SAME(sizeof(ncclRedOp_t), sizeof(oxcclRedOp_t));
_Static_assert(oxcclBand > ncclNumOps && oxcclBxor < ncclMaxRedOp, "extension operators");

SAME(ncclScalarDevice, oxcclScalarDevice);
SAME(ncclScalarHostImmediate, oxcclScalarHostImmediate);
SAME(sizeof(ncclScalarResidence_t), sizeof(oxcclScalarResidence_t));

/* Ids, handles, streams. */
SAME(NCCL_UNIQUE_ID_BYTES, OXCCL_UNIQUE_ID_BYTES);
SAME(sizeof(ncclUniqueId), sizeof(oxcclUniqueId));
SAME(sizeof(ncclComm_t), sizeof(oxcclComm_t));
SAME(sizeof(ncclWindow_t), sizeof(oxcclWindow_t));
SAME(sizeof(cudaStream_t), sizeof(oxcclStream_t));
_Static_assert(_Generic((cudaStream_t)0, struct CUstream_st *: 1, default: 0),
               "cudaStream_t is CUDA's struct CUstream_st *");

/* The configuration: every field at oxccl's offset with oxccl's size, and the same size. */
#define FIELD(f)                                                                           \
  SAME(offsetof(ncclConfig_t, f), offsetof(oxcclConfig_t, f));                             \
  SAME(sizeof(((ncclConfig_t *)0)->f), sizeof(((oxcclConfig_t *)0)->f))
FIELD(size);
FIELD(magic);
FIELD(version);
FIELD(blocking);
FIELD(cgaClusterSize);
FIELD(minCTAs);
FIELD(maxCTAs);
FIELD(netName);
FIELD(splitShare);
FIELD(trafficClass);
FIELD(commName);
FIELD(collnetEnable);
FIELD(CTAPolicy);
FIELD(shrinkShare);
FIELD(nvlsCTAs);
SAME(sizeof(ncclConfig_t), sizeof(oxcclConfig_t));

/* Every function is declared under both names, with one type. */
#define ALIAS(f) _Static_assert(sizeof(&f == &p##f), #f)
ALIAS(ncclGetVersion); ALIAS(ncclGetUniqueId); ALIAS(ncclCommInitRank);
ALIAS(ncclCommInitRankConfig); ALIAS(ncclCommInitAll); ALIAS(ncclCommInitRankScalable);
ALIAS(ncclCommSplit); ALIAS(ncclCommFinalize); ALIAS(ncclCommDestroy); ALIAS(ncclCommAbort);
ALIAS(ncclCommGetAsyncError); ALIAS(ncclCommCount); ALIAS(ncclCommCuDevice);
ALIAS(ncclCommUserRank); ALIAS(ncclGetErrorString); ALIAS(ncclGetLastError); ALIAS(ncclMemAlloc);
ALIAS(ncclMemFree); ALIAS(ncclCommRegister); ALIAS(ncclCommDeregister);
ALIAS(ncclCommWindowRegister); ALIAS(ncclCommWindowDeregister); ALIAS(ncclRedOpCreatePreMulSum);
ALIAS(ncclRedOpDestroy); ALIAS(ncclGroupStart); ALIAS(ncclGroupEnd); ALIAS(ncclAllReduce);
ALIAS(ncclBroadcast); ALIAS(ncclBcast); ALIAS(ncclReduce); ALIAS(ncclAllGather);
ALIAS(ncclReduceScatter); ALIAS(ncclAlltoAll); ALIAS(ncclGather); ALIAS(ncclScatter);
ALIAS(ncclSend); ALIAS(ncclRecv);

/* Versions and the rest. */
SAME(NCCL_VERSION_CODE, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
SAME(NCCL_VERSION_CODE, 22705);
SAME(NCCL_VERSION(2, 8, 4), 2804);
SAME(NCCL_VERSION(2, 9, 6), 20906);
SAME(NCCL_SPLIT_NOCOLOR, -1);
SAME(NCCL_CONFIG_UNDEF_INT, INT_MIN);

#define EXPECT(cond)                                                                       \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "failed: %s\n", #cond);                                              \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

int main(void) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  EXPECT(c.size == sizeof(ncclConfig_t));
  EXPECT(c.magic == 0xcafebeef);
  EXPECT(c.version == NCCL_VERSION_CODE);
  EXPECT(c.blocking == NCCL_CONFIG_UNDEF_INT && c.cgaClusterSize == NCCL_CONFIG_UNDEF_INT);
  EXPECT(c.minCTAs == NCCL_CONFIG_UNDEF_INT && c.maxCTAs == NCCL_CONFIG_UNDEF_INT);
  EXPECT(c.netName == NCCL_CONFIG_UNDEF_PTR && c.commName == NCCL_CONFIG_UNDEF_PTR);
  EXPECT(c.splitShare == NCCL_CONFIG_UNDEF_INT && c.trafficClass == NCCL_CONFIG_UNDEF_INT);
  EXPECT(c.collnetEnable == NCCL_CONFIG_UNDEF_INT && c.CTAPolicy == NCCL_CONFIG_UNDEF_INT);
  EXPECT(c.shrinkShare == NCCL_CONFIG_UNDEF_INT && c.nvlsCTAs == NCCL_CONFIG_UNDEF_INT);
  EXPECT(NCCL_COMM_NULL == NULL);
  printf("ok\n");
  return 0;
}
