//! The drop-in `libnccl.so.2`: nccl.h's functions under NCCL's names (`ncclAllReduce`, ...) and
//! their profiling aliases (`pncclAllReduce`, ...), each calling the oxccl function of the same
//! name with an `oxccl` prefix in the C ABI crate (ffi/, linked in), with the declarations of
//! `include/nccl.h`. It holds no logic of its own beyond what tells NCCL 2.27 and oxccl apart
//! (`differences.rs`): the version it reports, the result code of a timeout, the error strings.
//! Types are the C ABI's: the same layouts and values as nccl.h's (a test compiles both headers
//! and compares them).

#![allow(non_snake_case, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_void};

use oxccl::*;

mod differences;
#[macro_use]
mod forward;

forward! {
    /// nccl.h's `ncclGetVersion`: NCCL's version code, 22705 (2.27.5).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int)
        -> oxcclResult_t = differences::get_version;
    /// nccl.h's `ncclGetUniqueId`.
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut oxcclUniqueId)
        -> oxcclResult_t = oxcclGetUniqueId;
    /// nccl.h's `ncclCommInitRank`.
    fn ncclCommInitRank / pncclCommInitRank(comm: *mut oxcclComm_t, nranks: c_int,
        commId: oxcclUniqueId, rank: c_int) -> oxcclResult_t = oxcclCommInitRank;
    /// nccl.h's `ncclCommInitRankConfig`.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(comm: *mut oxcclComm_t, nranks: c_int,
        commId: oxcclUniqueId, rank: c_int, config: *mut oxcclConfig_t)
        -> oxcclResult_t = oxcclCommInitRankConfig;
    /// nccl.h's `ncclCommInitAll`.
    fn ncclCommInitAll / pncclCommInitAll(comms: *mut oxcclComm_t, ndev: c_int,
        devlist: *const c_int) -> oxcclResult_t = oxcclCommInitAll;
    /// nccl.h's `ncclCommInitRankScalable`.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(newcomm: *mut oxcclComm_t,
        nranks: c_int, myrank: c_int, nId: c_int, commIds: *mut oxcclUniqueId,
        config: *mut oxcclConfig_t) -> oxcclResult_t = oxcclCommInitRankScalable;
    /// nccl.h's `ncclCommSplit`.
    fn ncclCommSplit / pncclCommSplit(comm: oxcclComm_t, color: c_int, key: c_int,
        newcomm: *mut oxcclComm_t, config: *mut oxcclConfig_t) -> oxcclResult_t = oxcclCommSplit;
    /// nccl.h's `ncclCommShrink` (NCCL 2.27).
    fn ncclCommShrink / pncclCommShrink(comm: oxcclComm_t, excludeRanksList: *mut c_int,
        excludeRanksCount: c_int, newcomm: *mut oxcclComm_t, config: *mut oxcclConfig_t,
        shrinkFlags: c_int) -> oxcclResult_t = oxcclCommShrink;
    /// nccl.h's `ncclCommFinalize`.
    fn ncclCommFinalize / pncclCommFinalize(comm: oxcclComm_t) -> oxcclResult_t = oxcclCommFinalize;
    /// nccl.h's `ncclCommDestroy`.
    fn ncclCommDestroy / pncclCommDestroy(comm: oxcclComm_t) -> oxcclResult_t = oxcclCommDestroy;
    /// nccl.h's `ncclCommAbort`.
    fn ncclCommAbort / pncclCommAbort(comm: oxcclComm_t) -> oxcclResult_t = oxcclCommAbort;
    /// nccl.h's `ncclCommGetAsyncError`: a timeout is reported as `ncclRemoteError`.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: oxcclComm_t,
        asyncError: *mut oxcclResult_t) -> oxcclResult_t = differences::get_async_error;
    /// nccl.h's `ncclCommCount`.
    fn ncclCommCount / pncclCommCount(comm: oxcclComm_t, count: *mut c_int)
        -> oxcclResult_t = oxcclCommCount;
    /// nccl.h's `ncclCommCuDevice`.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: oxcclComm_t, device: *mut c_int)
        -> oxcclResult_t = oxcclCommCuDevice;
    /// nccl.h's `ncclCommUserRank`.
    fn ncclCommUserRank / pncclCommUserRank(comm: oxcclComm_t, rank: *mut c_int)
        -> oxcclResult_t = oxcclCommUserRank;
    /// nccl.h's `ncclGetErrorString`: NCCL 2.27's wording for its codes 0 to 7.
    fn ncclGetErrorString / pncclGetErrorString(result: oxcclResult_t)
        -> *const c_char = differences::error_string;
    /// nccl.h's `ncclGetLastError`.
    fn ncclGetLastError / pncclGetLastError(comm: oxcclComm_t) -> *const c_char =
        differences::last_error;
    /// nccl.h's `ncclMemAlloc`: device memory where the program uses CUDA, as NCCL's.
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize)
        -> oxcclResult_t = nccl_mem_alloc;
    /// nccl.h's `ncclMemFree`.
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> oxcclResult_t = nccl_mem_free;
    /// nccl.h's `ncclCommRegister`.
    fn ncclCommRegister / pncclCommRegister(comm: oxcclComm_t, buff: *mut c_void, size: usize,
        handle: *mut *mut c_void) -> oxcclResult_t = oxcclCommRegister;
    /// nccl.h's `ncclCommDeregister`.
    fn ncclCommDeregister / pncclCommDeregister(comm: oxcclComm_t, handle: *mut c_void)
        -> oxcclResult_t = oxcclCommDeregister;
    /// nccl.h's `ncclCommWindowRegister`.
    fn ncclCommWindowRegister / pncclCommWindowRegister(comm: oxcclComm_t, buff: *mut c_void,
        size: usize, win: *mut oxcclWindow_t, winFlags: c_int)
        -> oxcclResult_t = oxcclCommWindowRegister;
    /// nccl.h's `ncclCommWindowDeregister`.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: oxcclComm_t, win: oxcclWindow_t)
        -> oxcclResult_t = oxcclCommWindowDeregister;
    /// nccl.h's `ncclRedOpCreatePreMulSum`.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(op: *mut oxcclRedOp_t,
        scalar: *mut c_void, datatype: oxcclDataType_t, residence: oxcclScalarResidence_t,
        comm: oxcclComm_t) -> oxcclResult_t = oxcclRedOpCreatePreMulSum;
    /// nccl.h's `ncclRedOpDestroy`.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: oxcclRedOp_t, comm: oxcclComm_t)
        -> oxcclResult_t = oxcclRedOpDestroy;
    /// nccl.h's `ncclGroupStart`.
    fn ncclGroupStart / pncclGroupStart() -> oxcclResult_t = oxcclGroupStart;
    /// nccl.h's `ncclGroupEnd`.
    fn ncclGroupEnd / pncclGroupEnd() -> oxcclResult_t = oxcclGroupEnd;
    /// nccl.h's `ncclAllReduce`.
    fn ncclAllReduce / pncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
        datatype: oxcclDataType_t, op: oxcclRedOp_t, comm: oxcclComm_t, stream: oxcclStream_t)
        -> oxcclResult_t = oxcclAllReduce;
    /// nccl.h's `ncclBroadcast`.
    fn ncclBroadcast / pncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
        datatype: oxcclDataType_t, root: c_int, comm: oxcclComm_t, stream: oxcclStream_t)
        -> oxcclResult_t = oxcclBroadcast;
    /// nccl.h's `ncclBcast`.
    fn ncclBcast / pncclBcast(buff: *mut c_void, count: usize, datatype: oxcclDataType_t,
        root: c_int, comm: oxcclComm_t, stream: oxcclStream_t) -> oxcclResult_t = oxcclBcast;
    /// nccl.h's `ncclReduce`.
    fn ncclReduce / pncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
        datatype: oxcclDataType_t, op: oxcclRedOp_t, root: c_int, comm: oxcclComm_t,
        stream: oxcclStream_t) -> oxcclResult_t = oxcclReduce;
    /// nccl.h's `ncclAllGather`.
    fn ncclAllGather / pncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void,
        sendcount: usize, datatype: oxcclDataType_t, comm: oxcclComm_t, stream: oxcclStream_t)
        -> oxcclResult_t = oxcclAllGather;
    /// nccl.h's `ncclReduceScatter`.
    fn ncclReduceScatter / pncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void,
        recvcount: usize, datatype: oxcclDataType_t, op: oxcclRedOp_t, comm: oxcclComm_t,
        stream: oxcclStream_t) -> oxcclResult_t = oxcclReduceScatter;
    /// nccl.h's `ncclAlltoAll` (NCCL 2.28).
    fn ncclAlltoAll / pncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
        datatype: oxcclDataType_t, comm: oxcclComm_t, stream: oxcclStream_t)
        -> oxcclResult_t = oxcclAlltoAll;
    /// nccl.h's `ncclGather` (NCCL 2.28).
    fn ncclGather / pncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
        datatype: oxcclDataType_t, root: c_int, comm: oxcclComm_t, stream: oxcclStream_t)
        -> oxcclResult_t = oxcclGather;
    /// nccl.h's `ncclScatter` (NCCL 2.28).
    fn ncclScatter / pncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
        datatype: oxcclDataType_t, root: c_int, comm: oxcclComm_t, stream: oxcclStream_t)
        -> oxcclResult_t = oxcclScatter;
    /// nccl.h's `ncclSend`.
    fn ncclSend / pncclSend(sendbuff: *const c_void, count: usize, datatype: oxcclDataType_t,
        peer: c_int, comm: oxcclComm_t, stream: oxcclStream_t) -> oxcclResult_t = oxcclSend;
    /// nccl.h's `ncclRecv`.
    fn ncclRecv / pncclRecv(recvbuff: *mut c_void, count: usize, datatype: oxcclDataType_t,
        peer: c_int, comm: oxcclComm_t, stream: oxcclStream_t) -> oxcclResult_t = oxcclRecv;
}

#[cfg(test)]
mod tests;

/// Functions of NCCL after 2.27 (2.28 to 2.30: device communicators, windows' device pointers,
/// signals, suspend/resume, grow/revoke, memory statistics, group simulation) that programs
/// built against a newer NCCL reference, PyTorch's libtorch_cuda among them: a library without
/// them cannot be loaded in NVIDIA's place. Each returns `ncclInvalidUsage`, with
/// `ncclGetLastError` naming the function; it reads none of its arguments, so it is sound under
/// the C calling convention whatever arguments the caller passes (the caller pops them).
macro_rules! unsupported {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "` (NCCL after 2.27): not implemented.")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> oxcclResult_t {
            nccl_unsupported(stringify!($name))
        }
    )*};
}

unsupported! {
    ncclCommGetUniqueId,
    ncclCommGrow,
    ncclCommMemStats,
    ncclCommResume,
    ncclCommRevoke,
    ncclCommSuspend,
    ncclDevCommCreate,
    ncclDevCommDestroy,
    ncclGetLsaMultimemDevicePointer,
    ncclGetPeerDevicePointer,
    ncclGroupSimulateEnd,
    ncclPutSignal,
    ncclSignal,
    ncclWaitSignal,
    ncclWinGetUserPtr,
}
