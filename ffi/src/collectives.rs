//! The collectives, with nccl.h's arguments in nccl.h's order. Counts are in elements; a call is
//! in place when the buffers lie as nccl.h defines it (`sendbuff == recvbuff`, or the rank's
//! block of the larger buffer for all-gather and reduce-scatter), and other overlapping buffers
//! are an error. Host memory only: `stream` must be NULL, and the call returns when this
//! rank's part is complete.
//!
//! Buffer contract (for every function here): a buffer the call reads must be readable for its
//! whole length, a buffer it writes readable and writable, and no other thread may write to
//! the first or touch the second until the call returns. A buffer of zero bytes, and one that
//! only matters at the root on other ranks, may be NULL.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use oxccl_core::{Communicator, DataType};

use crate::abi::*;
use crate::boundary::{Outcome, Region, byte_len, data_type, guard, host_only, red_op, root_rank};
use crate::handles;

/// The checks every collective starts with: the stream, the handle, the data type.
fn prepare(
    comm: oxcclComm_t,
    stream: oxcclStream_t,
    datatype: oxcclDataType_t,
) -> Result<(Arc<Communicator>, DataType), crate::boundary::Failure> {
    host_only(stream)?;
    let c = handles::get(comm, "comm")?;
    Ok((c, data_type(datatype)?))
}

/// Whether `a` is `b` plus `offset` bytes.
fn at(a: *const c_void, b: *const c_void, offset: usize) -> bool {
    (b as usize).checked_add(offset) == Some(a as usize)
}

/// Every rank's `recvbuff` becomes the element-wise `op` of every rank's `sendbuff` (`count`
/// elements each); in place when `sendbuff == recvbuff`.
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: oxcclDataType_t,
    op: oxcclRedOp_t,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclAllReduce", || {
        let (c, dtype) = prepare(comm, stream, datatype)?;
        let op = red_op(op)?;
        let len = byte_len("count", count, 1, dtype)?;
        let send = Region::new(sendbuff, len, "sendbuff");
        let recv = Region::new(recvbuff, len, "recvbuff");
        if at(sendbuff, recvbuff, 0) {
            // SAFETY: in place, recvbuff is readable and writable for `len` bytes and only ours
            // during the call (the caller's contract).
            let buf = unsafe { recv.output() }?;
            return Ok(c.all_reduce_in_place_bytes(buf, dtype, op)?);
        }
        send.disjoint(&recv)?;
        // SAFETY: the caller's contract for sendbuff (read) and recvbuff (written), `len` bytes
        // each; they do not overlap (checked above).
        let (s, r) = unsafe { (send.input()?, recv.output()?) };
        Ok(c.all_reduce_bytes(s, r, dtype, op)?)
    })
}

/// Every rank's `recvbuff` becomes the root's `sendbuff` (`count` elements; `sendbuff` is
/// ignored on other ranks); in place when `sendbuff == recvbuff`.
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: oxcclDataType_t,
    root: c_int,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclBroadcast", || {
        let (c, dtype) = prepare(comm, stream, datatype)?;
        let root = root_rank(root, c.size())?;
        let len = byte_len("count", count, 1, dtype)?;
        let recv = Region::new(recvbuff, len, "recvbuff");
        if at(sendbuff, recvbuff, 0) {
            // SAFETY: in place, recvbuff is readable and writable for `len` bytes and only ours
            // during the call (the caller's contract).
            let buf = unsafe { recv.output() }?;
            return Ok(c.broadcast_in_place_bytes(buf, dtype, root)?);
        }
        let send = if c.rank() == root {
            Region::new(sendbuff, len, "sendbuff")
        } else {
            Region::new(sendbuff, 0, "sendbuff")
        };
        send.disjoint(&recv)?;
        // SAFETY: the caller's contract for sendbuff (read, at the root only: elsewhere an
        // empty region) and recvbuff (written); they do not overlap (checked above).
        let (s, r) = unsafe { (send.input()?, recv.output()?) };
        Ok(c.broadcast_bytes(s, r, dtype, root)?)
    })
}

/// Every rank's `buff` becomes the root's `buff` (`count` elements): in-place broadcast.
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: oxcclDataType_t,
    root: c_int,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclBcast", || {
        let (c, dtype) = prepare(comm, stream, datatype)?;
        let root = root_rank(root, c.size())?;
        let len = byte_len("count", count, 1, dtype)?;
        // SAFETY: buff is readable and writable for `len` bytes and only ours during the call
        // (the caller's contract).
        let buf = unsafe { Region::new(buff, len, "buff").output() }?;
        Ok(c.broadcast_in_place_bytes(buf, dtype, root)?)
    })
}

/// The root's `recvbuff` becomes the element-wise `op` of every rank's `sendbuff` (`count`
/// elements; `recvbuff` is ignored on other ranks); in place when `sendbuff == recvbuff`.
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: oxcclDataType_t,
    op: oxcclRedOp_t,
    root: c_int,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclReduce", || {
        let (c, dtype) = prepare(comm, stream, datatype)?;
        let op = red_op(op)?;
        let root = root_rank(root, c.size())?;
        let len = byte_len("count", count, 1, dtype)?;
        if at(sendbuff, recvbuff, 0) {
            // SAFETY: in place, the buffer is readable and writable for `len` bytes and only
            // ours during the call (the caller's contract).
            let buf = unsafe { Region::new(recvbuff, len, "recvbuff").output() }?;
            return Ok(c.reduce_in_place_bytes(buf, dtype, op, root)?);
        }
        let send = Region::new(sendbuff, len, "sendbuff");
        let recv = if c.rank() == root {
            Region::new(recvbuff, len, "recvbuff")
        } else {
            Region::new(recvbuff, 0, "recvbuff")
        };
        send.disjoint(&recv)?;
        // SAFETY: the caller's contract for sendbuff (read) and recvbuff (written, at the root
        // only: elsewhere an empty region); they do not overlap (checked above).
        let (s, r) = unsafe { (send.input()?, recv.output()?) };
        Ok(c.reduce_bytes(s, r, dtype, op, root)?)
    })
}

/// Every rank's `recvbuff` (nranks × `sendcount` elements) becomes all ranks' `sendbuff`
/// (`sendcount` elements), in rank order; in place when
/// `sendbuff == recvbuff + rank * sendcount * size of datatype`.
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: oxcclDataType_t,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclAllGather", || {
        let (c, dtype) = prepare(comm, stream, datatype)?;
        let block = byte_len("sendcount", sendcount, 1, dtype)?;
        let total = byte_len("sendcount", sendcount, c.size(), dtype)?;
        let recv = Region::new(recvbuff, total, "recvbuff");
        if block > 0 && at(sendbuff, recvbuff, c.rank() * block) {
            // SAFETY: in place, recvbuff is readable and writable for `total` bytes and only
            // ours during the call (the caller's contract).
            let buf = unsafe { recv.output() }?;
            return Ok(c.all_gather_in_place_bytes(buf, dtype)?);
        }
        let send = Region::new(sendbuff, block, "sendbuff");
        send.disjoint(&recv)?;
        // SAFETY: the caller's contract for sendbuff (read) and recvbuff (written); they do not
        // overlap (checked above).
        let (s, r) = unsafe { (send.input()?, recv.output()?) };
        Ok(c.all_gather_bytes(s, r, dtype)?)
    })
}

/// Rank r's `recvbuff` (`recvcount` elements) becomes block r of the element-wise `op` of every
/// rank's `sendbuff` (nranks × `recvcount` elements); in place when
/// `recvbuff == sendbuff + rank * recvcount * size of datatype`, and then the whole of
/// `sendbuff` must be writable (the call may use it as scratch space).
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: oxcclDataType_t,
    op: oxcclRedOp_t,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclReduceScatter", || {
        let (c, dtype) = prepare(comm, stream, datatype)?;
        let op = red_op(op)?;
        let block = byte_len("recvcount", recvcount, 1, dtype)?;
        let total = byte_len("recvcount", recvcount, c.size(), dtype)?;
        let send = Region::new(sendbuff, total, "sendbuff");
        if block > 0 && at(recvbuff, sendbuff, c.rank() * block) {
            // SAFETY: in place, sendbuff is readable and writable for `total` bytes (it holds
            // recvbuff) and only ours during the call (the caller's contract).
            let buf = unsafe { send.output() }?;
            return Ok(c.reduce_scatter_in_place_bytes(buf, dtype, op)?);
        }
        let recv = Region::new(recvbuff, block, "recvbuff");
        send.disjoint(&recv)?;
        // SAFETY: the caller's contract for sendbuff (read) and recvbuff (written); they do not
        // overlap (checked above).
        let (s, r) = unsafe { (send.input()?, recv.output()?) };
        Ok(c.reduce_scatter_bytes(s, r, dtype, op)?)
    })
}

/// Block j of rank r's `sendbuff` becomes block r of rank j's `recvbuff` (blocks of `count`
/// elements, nranks of them in each buffer); in place when `sendbuff == recvbuff`.
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: oxcclDataType_t,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclAlltoAll", || {
        let (c, dtype) = prepare(comm, stream, datatype)?;
        let total = byte_len("count", count, c.size(), dtype)?;
        let send = Region::new(sendbuff, total, "sendbuff");
        let recv = Region::new(recvbuff, total, "recvbuff");
        if at(sendbuff, recvbuff, 0) {
            // SAFETY: in place, recvbuff is readable and writable for `total` bytes and only
            // ours during the call (the caller's contract).
            let buf = unsafe { recv.output() }?;
            return Ok(c.all_to_all_in_place_bytes(buf, dtype)?);
        }
        send.disjoint(&recv)?;
        // SAFETY: the caller's contract for sendbuff (read) and recvbuff (written); they do not
        // overlap (checked above).
        let (s, r) = unsafe { (send.input()?, recv.output()?) };
        Ok(c.all_to_all_bytes(s, r, dtype)?)
    })
}

/// Extension: returns once every rank of `comm` has called it.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclBarrier(comm: oxcclComm_t, stream: oxcclStream_t) -> oxcclResult_t {
    guard("oxcclBarrier", || -> Outcome {
        host_only(stream)?;
        Ok(handles::get(comm, "comm")?.barrier()?)
    })
}
