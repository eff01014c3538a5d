/*
 * nccl.h for oxccl's drop-in libnccl.so.2 (nccl/ in the oxccl repository).
 *
 * NCCL's C API as of NCCL 2.27.5: its names, types, numeric values, struct layout and argument
 * order, so that a program written for NCCL builds against this header unchanged and runs on
 * oxccl when linked with -lnccl (our libnccl.so.2), or on NVIDIA's library. Written for oxccl
 * from NCCL's documentation; it is not NVIDIA's header.
 *
 * Every function calls the oxccl function of the same name with an oxccl prefix; include/oxccl.h
 * documents each (arguments checked, results, buffers, threads). What differs from oxccl.h:
 *   - ncclGetVersion reports NCCL_VERSION_CODE below, the API this header declares;
 *   - NCCL 2.27 has no timeout result: a call that times out (oxcclTimeout in oxccl.h) returns
 *     ncclRemoteError here, and ncclGetLastError says that it timed out;
 *   - ncclGetErrorString words its strings as NCCL does.
 * Every function also exists as pnccl* (pncclAllReduce, ...), the names profilers interpose.
 *
 * Memory: a NULL stream means host memory, and a call completes before it returns. With a CUDA
 * stream the collectives, ncclSend and ncclRecv take CUDA device memory, staged through host
 * memory in stream order (inside a group too; not yet on a non-blocking communicator:
 * ncclInvalidUsage). A NULL stream is CUDA's default stream where the program had loaded CUDA
 * before it made the communicator and the buffer is device memory; otherwise host memory.
 * ncclMemAlloc gives device memory (on the current context) in a program that has loaded CUDA,
 * as NCCL's does, and host memory otherwise.
 *
 * CUDA: this header needs no CUDA toolkit. It declares cudaStream_t exactly as CUDA's
 * driver_types.h does unless CUDA's runtime headers are already included, or can be found, in
 * which case it includes <cuda_runtime.h> as NVIDIA's nccl.h does. So CUDA's headers may come
 * before or after this one.
 */

#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>

/* cudaStream_t. __DRIVER_TYPES_H__ is the include guard of CUDA's driver_types.h, which
 * declares it (cuda_runtime_api.h, which defines CUDART_VERSION, includes that file). When CUDA's
 * headers can be found they are included here, so that a later #include <cuda_runtime.h> finds
 * its guard set; declaring the type here and again in driver_types.h would be a repeated
 * typedef, legal in C11 and C++ but not in C99. Without them the declaration below is
 * driver_types.h's own, so the two name the same type. */
#if !defined(__DRIVER_TYPES_H__) && !defined(CUDART_VERSION) && defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#endif
#endif
#if !defined(__DRIVER_TYPES_H__) && !defined(CUDART_VERSION)
typedef struct CUstream_st *cudaStream_t;
#endif
/* With CUDA's runtime headers, NVIDIA's nccl.h also brings in half and nv_bfloat16, and programs
 * written for it (nccl-tests) use them without including these headers themselves. */
#if defined(CUDART_VERSION)
#include <cuda_fp16.h>
#if CUDART_VERSION >= 11000
#include <cuda_bf16.h>
#endif
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 27
#define NCCL_PATCH 5
#define NCCL_SUFFIX ""

/* The version code of X.Y.Z: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE 22705

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator (opaque). */
typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

/* What every rank needs to find the others: made once by ncclGetUniqueId, sent to every rank
 * (MPI_Bcast, a file, a socket), passed by value to ncclCommInitRank. It holds the address of
 * a meeting point and a job secret: treat it as a password. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Result of every call. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6, /* a peer failed or left, the communicator was aborted, or a timeout */
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

/* ncclCommSplit's color for ranks that join no new communicator. */
#define NCCL_SPLIT_NOCOLOR (-1)

/* ncclCommShrink's flags: wait for comm's earlier operations, or abort them first. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* The "not set" values of ncclConfig_t's fields. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL

/* Options of ncclCommInitRankConfig, ncclCommInitRankScalable and ncclCommSplit: NCCL 2.27's
 * layout. Start from NCCL_CONFIG_INITIALIZER and set the fields you need. */
typedef struct ncclConfig_v22700 {
  size_t size;                  /* sizeof(ncclConfig_t) */
  unsigned int magic, version;  /* 0xcafebeef; the NCCL_VERSION_CODE the program was built with */
  int blocking;                 /* 0: calls may return ncclInProgress (ncclCommGetAsyncError) */
  int cgaClusterSize, minCTAs, maxCTAs;
  const char *netName;
  int splitShare, trafficClass;
  const char *commName;
  int collnetEnable, CTAPolicy, shrinkShare, nvlsCTAs;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                 \
  {                                                                                             \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),         \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                    \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                    \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                    \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                     \
  }

/* A registered window (opaque). */
typedef struct ncclWindow *ncclWindow_t;
/* ncclCommWindowRegister's winFlags, NCCL 2.27's values. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01

/* Element types. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Reduction operators. ncclRedOpCreatePreMulSum makes further ones, numbered from ncclNumOps;
 * ncclMaxRedOp is the largest value an operator can have without ncclRedOp_t growing past the
 * size of an int-sized enum (the dummy enum measures it). */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum {
  ncclScalarDevice = 0,        /* device memory, read when the collective runs */
  ncclScalarHostImmediate = 1  /* host memory, read when the operator is created */
} ncclScalarResidence_t;

/* Declares the function `name` and, with the same type, `pname`: the name under which
 * profilers interpose it (libnccl.so.2 exports both). */
#define OXCCL_NCCL_API(ret, name, args) ret name args; ret p##name args

/* Versions, ids, communicators. */
OXCCL_NCCL_API(ncclResult_t, ncclGetVersion, (int *version));

OXCCL_NCCL_API(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *uniqueId));

OXCCL_NCCL_API(ncclResult_t, ncclCommInitRank, (ncclComm_t *comm, int nranks, ncclUniqueId commId,
    int rank));

OXCCL_NCCL_API(ncclResult_t, ncclCommInitRankConfig, (ncclComm_t *comm, int nranks,
    ncclUniqueId commId, int rank, ncclConfig_t *config));

/* ndev ranks of one communicator in this process, comm[0..ndev]. */
OXCCL_NCCL_API(ncclResult_t, ncclCommInitAll, (ncclComm_t *comm, int ndev, const int *devlist));

/* Like ncclCommInitRank with nId ids (several meeting points). */
OXCCL_NCCL_API(ncclResult_t, ncclCommInitRankScalable, (ncclComm_t *newcomm, int nranks, int myrank,
    int nId, ncclUniqueId *commIds, ncclConfig_t *config));

/* Ranks that pass the same color form a new communicator, ordered by key then rank;
 * NCCL_SPLIT_NOCOLOR gets NULL. */
OXCCL_NCCL_API(ncclResult_t, ncclCommSplit, (ncclComm_t comm, int color, int key,
    ncclComm_t *newcomm, ncclConfig_t *config));

/* The ranks not excluded form a new communicator in the same order, also after comm failed
 * (a peer died): every rank not excluded calls it with the same list. */
OXCCL_NCCL_API(ncclResult_t, ncclCommShrink, (ncclComm_t comm, int *excludeRanksList,
    int excludeRanksCount, ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags));

OXCCL_NCCL_API(ncclResult_t, ncclCommFinalize, (ncclComm_t comm));

OXCCL_NCCL_API(ncclResult_t, ncclCommDestroy, (ncclComm_t comm));

/* From any thread: running and later calls on comm fail, and the peers are told. */
OXCCL_NCCL_API(ncclResult_t, ncclCommAbort, (ncclComm_t comm));

OXCCL_NCCL_API(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t *asyncError));

OXCCL_NCCL_API(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count));

OXCCL_NCCL_API(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int *device));

OXCCL_NCCL_API(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank));

/* Errors. Static strings; never free them. ncclGetLastError: the calling thread's last failure,
 * naming the function and the argument or rank at fault; comm may be NULL. */
OXCCL_NCCL_API(const char *, ncclGetErrorString, (ncclResult_t result));

OXCCL_NCCL_API(const char *, ncclGetLastError, (ncclComm_t comm));

/* Memory and registration. */
OXCCL_NCCL_API(ncclResult_t, ncclMemAlloc, (void **ptr, size_t size));

OXCCL_NCCL_API(ncclResult_t, ncclMemFree, (void *ptr));

OXCCL_NCCL_API(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void *buff, size_t size,
    void **handle));

OXCCL_NCCL_API(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void *handle));

OXCCL_NCCL_API(ncclResult_t, ncclCommWindowRegister, (ncclComm_t comm, void *buff, size_t size,
    ncclWindow_t *win, int winFlags));

OXCCL_NCCL_API(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win));

/* Reduction operators made at run time: sum of the inputs each multiplied by *scalar first. */
OXCCL_NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, (ncclRedOp_t *op, void *scalar,
    ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm));

OXCCL_NCCL_API(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));

/* Groups: the calls between ncclGroupStart and ncclGroupEnd (which nest) are issued together. */
OXCCL_NCCL_API(ncclResult_t, ncclGroupStart, (void));

OXCCL_NCCL_API(ncclResult_t, ncclGroupEnd, (void));

/* Collectives. Counts are in elements; every rank calls each collective, in the same order.
 * In place where the buffers lie as each comment says. */

/* recvbuff = op over the ranks of sendbuff (count elements); in place if sendbuff == recvbuff. */
OXCCL_NCCL_API(ncclResult_t, ncclAllReduce, (const void *sendbuff, void *recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));

/* recvbuff = the root's sendbuff (count elements). */
OXCCL_NCCL_API(ncclResult_t, ncclBroadcast, (const void *sendbuff, void *recvbuff, size_t count,
    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream));

/* In-place broadcast of buff. */
OXCCL_NCCL_API(ncclResult_t, ncclBcast, (void *buff, size_t count, ncclDataType_t datatype,
    int root, ncclComm_t comm, cudaStream_t stream));

/* The root's recvbuff = op over the ranks of sendbuff (count elements). */
OXCCL_NCCL_API(ncclResult_t, ncclReduce, (const void *sendbuff, void *recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream));

/* Block r of recvbuff (nranks * sendcount elements) = rank r's sendbuff; in place if
 * sendbuff == recvbuff + rank * sendcount elements. */
OXCCL_NCCL_API(ncclResult_t, ncclAllGather, (const void *sendbuff, void *recvbuff, size_t sendcount,
    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream));

/* Rank r's recvbuff (recvcount elements) = block r of op over the ranks of sendbuff; in place
 * if recvbuff == sendbuff + rank * recvcount elements. */
OXCCL_NCCL_API(ncclResult_t, ncclReduceScatter, (const void *sendbuff, void *recvbuff,
    size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
    cudaStream_t stream));

/* ncclAlltoAll, ncclGather and ncclScatter came with NCCL 2.28; declared here all the same
 * (a program that checks NCCL_VERSION_CODE for them will not call them). */

/* Block j of rank r's sendbuff goes to block r of rank j's recvbuff (count elements a block). */
OXCCL_NCCL_API(ncclResult_t, ncclAlltoAll, (const void *sendbuff, void *recvbuff, size_t count,
    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream));

/* Block r of the root's recvbuff = rank r's sendbuff (count elements). */
OXCCL_NCCL_API(ncclResult_t, ncclGather, (const void *sendbuff, void *recvbuff, size_t count,
    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream));

/* Rank r's recvbuff = block r of the root's sendbuff (count elements). */
OXCCL_NCCL_API(ncclResult_t, ncclScatter, (const void *sendbuff, void *recvbuff, size_t count,
    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream));

/* Point to point: a send on one rank pairs with a receive on its peer. Between ncclGroupStart
 * and ncclGroupEnd they are issued together, so exchanges do not deadlock. */
OXCCL_NCCL_API(ncclResult_t, ncclSend, (const void *sendbuff, size_t count, ncclDataType_t datatype,
    int peer, ncclComm_t comm, cudaStream_t stream));

OXCCL_NCCL_API(ncclResult_t, ncclRecv, (void *recvbuff, size_t count, ncclDataType_t datatype,
    int peer, ncclComm_t comm, cudaStream_t stream));

#undef OXCCL_NCCL_API

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
