//! The collectives and point-to-point calls, with nccl.h's arguments in nccl.h's order.
//! Counts are in elements; a call is in place when the buffers lie as nccl.h defines it
//! (`sendbuff == recvbuff`, or the rank's block of the larger buffer for all-gather,
//! reduce-scatter, and gather and scatter at the root), and other overlapping buffers are an
//! error. A NULL `stream` means host memory; a collective with a CUDA stream takes device memory
//! ([`crate::device`]); point-to-point calls are host-only for now. Each function checks its
//! arguments, builds a [`Plan`] and hands it to `dispatch`, which runs it now, starts it
//! (non-blocking communicators) or keeps it for `oxcclGroupEnd`.
//!
//! Buffer contract (for every function here): a buffer the call reads must be readable for its
//! whole length, a buffer it writes readable and writable, and no other thread may write to
//! the first or touch the second until the operation is complete: when the call returns
//! `oxcclSuccess` outside a group; when `oxcclGroupEnd` returns inside one; when
//! `oxcclCommGetAsyncError` reports `oxcclSuccess` after `oxcclInProgress`. A buffer of zero
//! bytes, and one that only matters at the root on other ranks, may be NULL.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use oxccl_core::algo::{Collective, Plan};
use oxccl_core::{DataType, RawMessage};

use crate::abi::*;
use crate::boundary::{Failure, Outcome, Region, byte_len, data_type, guard, host_only, rank_arg};
use crate::dispatch::{Job, issue};
use crate::entry::Entry;
use crate::handles;
use crate::ops::{Operator, operator};

/// The checks every call starts with: the handle, the data type; and the communicator's
/// (rank, size). A collective's stream is looked at by [`collective`], a point-to-point
/// call's (host memory only for now) before this.
fn prepare(
    comm: oxcclComm_t,
    datatype: oxcclDataType_t,
) -> Result<(Arc<Entry>, DataType, usize, usize), Failure> {
    let entry = handles::get(comm, "comm")?;
    let dtype = data_type(datatype)?;
    let (rank, size) = {
        let c = entry.comm()?;
        (c.rank(), c.size())
    };
    Ok((entry, dtype, rank, size))
}

/// Whether `a` is `b` plus `offset` bytes.
fn at(a: *const c_void, b: *const c_void, offset: usize) -> bool {
    (b as usize).checked_add(offset) == Some(a as usize)
}

/// How a call's buffers lie.
pub(crate) enum Buffers {
    /// In place: one buffer holds input and output (the larger of the two, whole).
    Shared(Region),
    /// Apart: they must not overlap.
    Apart { send: Region, recv: Region },
}

/// Checks the buffers and issues `plan` with operator `op` (None for collectives that do not
/// reduce): on host memory with a NULL `stream`, else on device memory ordered on `stream`
/// ([`crate::device`]).
fn collective(
    entry: &Arc<Entry>,
    plan: Plan,
    op: Option<Operator>,
    buffers: Buffers,
    stream: oxcclStream_t,
) -> Outcome {
    let (plan, premul) = match op {
        None => (plan, None),
        Some(Operator::Plain(o)) => (plan.op(o), None),
        Some(Operator::PreMulSum(k)) => (plan, Some(k)),
        Some(Operator::PreMulSumAt(at)) => {
            let k = crate::device::scalar_at(entry, at, plan.dtype, stream)?;
            (plan, Some(k))
        }
    };
    if !stream.is_null() || crate::device::default_stream_device(entry, &buffers) {
        return crate::device::collective(entry, plan, premul, buffers, stream);
    }
    let (plan, input, output) = match buffers {
        Buffers::Shared(buf) => {
            buf.mapped()?;
            let (p, len) = buf.write()?;
            (plan.in_place(true), (p.cast_const(), len), (p, len))
        }
        Buffers::Apart { send, recv } => {
            send.disjoint(&recv)?;
            send.mapped()?;
            recv.mapped()?;
            (plan, send.read()?, recv.write()?)
        }
    };
    issue(
        entry,
        Job::Collective {
            plan,
            input,
            output,
            premul,
        },
    )
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
        let (entry, dtype, _, _) = prepare(comm, datatype)?;
        let op = operator(op, dtype, &entry.operators, entry.cuda)?;
        let len = byte_len("count", count, 1, dtype)?;
        let recv = Region::new(recvbuff, len, "recvbuff");
        let buffers = if at(sendbuff, recvbuff, 0) {
            Buffers::Shared(recv)
        } else {
            let send = Region::new(sendbuff, len, "sendbuff");
            Buffers::Apart { send, recv }
        };
        let plan = Plan::new(Collective::AllReduce, count, dtype);
        collective(&entry, plan, Some(op), buffers, stream)
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
        let (entry, dtype, rank, size) = prepare(comm, datatype)?;
        let root = rank_arg("root", root, size)?;
        let len = byte_len("count", count, 1, dtype)?;
        let recv = Region::new(recvbuff, len, "recvbuff");
        let buffers = if at(sendbuff, recvbuff, 0) {
            Buffers::Shared(recv)
        } else {
            let send_len = if rank == root { len } else { 0 };
            let send = Region::new(sendbuff, send_len, "sendbuff");
            Buffers::Apart { send, recv }
        };
        let plan = Plan::new(Collective::Broadcast, count, dtype).root(root);
        collective(&entry, plan, None, buffers, stream)
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
        let (entry, dtype, _, size) = prepare(comm, datatype)?;
        let root = rank_arg("root", root, size)?;
        let len = byte_len("count", count, 1, dtype)?;
        let plan = Plan::new(Collective::Broadcast, count, dtype).root(root);
        let buffers = Buffers::Shared(Region::new(buff, len, "buff"));
        collective(&entry, plan, None, buffers, stream)
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
        let (entry, dtype, rank, size) = prepare(comm, datatype)?;
        let op = operator(op, dtype, &entry.operators, entry.cuda)?;
        let root = rank_arg("root", root, size)?;
        let len = byte_len("count", count, 1, dtype)?;
        let buffers = if at(sendbuff, recvbuff, 0) {
            Buffers::Shared(Region::new(recvbuff, len, "recvbuff"))
        } else {
            let recv_len = if rank == root { len } else { 0 };
            Buffers::Apart {
                send: Region::new(sendbuff, len, "sendbuff"),
                recv: Region::new(recvbuff, recv_len, "recvbuff"),
            }
        };
        let plan = Plan::new(Collective::Reduce, count, dtype).root(root);
        collective(&entry, plan, Some(op), buffers, stream)
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
        let (entry, dtype, rank, size) = prepare(comm, datatype)?;
        let block = byte_len("sendcount", sendcount, 1, dtype)?;
        let total = byte_len("sendcount", sendcount, size, dtype)?;
        let recv = Region::new(recvbuff, total, "recvbuff");
        let buffers = if block > 0 && at(sendbuff, recvbuff, rank * block) {
            Buffers::Shared(recv)
        } else {
            let send = Region::new(sendbuff, block, "sendbuff");
            Buffers::Apart { send, recv }
        };
        let plan = Plan::new(Collective::AllGather, sendcount, dtype);
        collective(&entry, plan, None, buffers, stream)
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
        let (entry, dtype, rank, size) = prepare(comm, datatype)?;
        let op = operator(op, dtype, &entry.operators, entry.cuda)?;
        let block = byte_len("recvcount", recvcount, 1, dtype)?;
        let total = byte_len("recvcount", recvcount, size, dtype)?;
        let send = Region::new(sendbuff, total, "sendbuff");
        let buffers = if block > 0 && at(recvbuff, sendbuff, rank * block) {
            Buffers::Shared(send)
        } else {
            let recv = Region::new(recvbuff, block, "recvbuff");
            Buffers::Apart { send, recv }
        };
        let plan = Plan::new(Collective::ReduceScatter, recvcount, dtype);
        collective(&entry, plan, Some(op), buffers, stream)
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
        let (entry, dtype, _, size) = prepare(comm, datatype)?;
        let total = byte_len("count", count, size, dtype)?;
        let recv = Region::new(recvbuff, total, "recvbuff");
        let buffers = if at(sendbuff, recvbuff, 0) {
            Buffers::Shared(recv)
        } else {
            let send = Region::new(sendbuff, total, "sendbuff");
            Buffers::Apart { send, recv }
        };
        let plan = Plan::new(Collective::AllToAll, count, dtype);
        collective(&entry, plan, None, buffers, stream)
    })
}

/// Block r of the root's `recvbuff` (nranks × `count` elements; ignored on other ranks)
/// becomes rank r's `sendbuff` (`count` elements); at the root, in place when
/// `sendbuff == recvbuff + root * count * size of datatype`.
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: oxcclDataType_t,
    root: c_int,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclGather", || {
        let (entry, dtype, rank, size) = prepare(comm, datatype)?;
        let root = rank_arg("root", root, size)?;
        let block = byte_len("count", count, 1, dtype)?;
        let total = byte_len("count", count, size, dtype)?;
        let buffers = if rank != root {
            Buffers::Apart {
                send: Region::new(sendbuff, block, "sendbuff"),
                recv: Region::new(recvbuff, 0, "recvbuff"),
            }
        } else if block > 0 && at(sendbuff, recvbuff, root * block) {
            Buffers::Shared(Region::new(recvbuff, total, "recvbuff"))
        } else {
            Buffers::Apart {
                send: Region::new(sendbuff, block, "sendbuff"),
                recv: Region::new(recvbuff, total, "recvbuff"),
            }
        };
        let plan = Plan::new(Collective::Gather, count, dtype).root(root);
        collective(&entry, plan, None, buffers, stream)
    })
}

/// Rank r's `recvbuff` (`count` elements) becomes block r of the root's `sendbuff` (nranks ×
/// `count` elements; ignored on other ranks); at the root, in place when
/// `recvbuff == sendbuff + root * count * size of datatype`.
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: oxcclDataType_t,
    root: c_int,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclScatter", || {
        let (entry, dtype, rank, size) = prepare(comm, datatype)?;
        let root = rank_arg("root", root, size)?;
        let block = byte_len("count", count, 1, dtype)?;
        let total = byte_len("count", count, size, dtype)?;
        let buffers = if rank != root {
            Buffers::Apart {
                send: Region::new(sendbuff, 0, "sendbuff"),
                recv: Region::new(recvbuff, block, "recvbuff"),
            }
        } else if block > 0 && at(recvbuff, sendbuff, root * block) {
            Buffers::Shared(Region::new(sendbuff, total, "sendbuff"))
        } else {
            Buffers::Apart {
                send: Region::new(sendbuff, total, "sendbuff"),
                recv: Region::new(recvbuff, block, "recvbuff"),
            }
        };
        let plan = Plan::new(Collective::Scatter, count, dtype).root(root);
        collective(&entry, plan, None, buffers, stream)
    })
}

/// Sends `count` elements of `sendbuff` to `peer`, which receives them with a matching
/// `oxcclRecv` (same count and type; messages between two ranks match in the order posted,
/// whatever the groups). Alone, the call returns when the data has left `sendbuff`; put sends
/// and receives that depend on each other (an exchange, a ring shift) in one group, or start
/// them (`oxcclSendStart`, `oxcclRecvStart`).
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: oxcclDataType_t,
    peer: c_int,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclSend", || {
        let (entry, dtype, _, size) = prepare(comm, datatype)?;
        let peer = rank_arg("peer", peer, size)?;
        let len = byte_len("count", count, 1, dtype)?;
        let region = Region::new(sendbuff, len, "sendbuff");
        let (ptr, len) = region.read()?;
        if crate::device::on_device(&entry, ptr.cast(), len, stream) {
            // SAFETY: the buffer contract: `sendbuff` holds `len` bytes.
            return unsafe {
                crate::device::message(
                    &entry,
                    peer,
                    true,
                    (ptr.cast_mut().cast(), len, "sendbuff"),
                    stream,
                )
            };
        }
        region.mapped()?;
        let message = RawMessage {
            peer,
            send: true,
            ptr: ptr.cast_mut(),
            len,
            tag: 0,
        };
        issue(&entry, Job::Message(message))
    })
}

/// Receives into `recvbuff` the `count` elements `peer` sends with a matching `oxcclSend`.
///
/// # Safety
///
/// The buffer contract of the module documentation (in oxccl.h, at the top).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: oxcclDataType_t,
    peer: c_int,
    comm: oxcclComm_t,
    stream: oxcclStream_t,
) -> oxcclResult_t {
    guard("oxcclRecv", || {
        let (entry, dtype, _, size) = prepare(comm, datatype)?;
        let peer = rank_arg("peer", peer, size)?;
        let len = byte_len("count", count, 1, dtype)?;
        let region = Region::new(recvbuff, len, "recvbuff");
        let (ptr, len) = region.write()?;
        if crate::device::on_device(&entry, ptr.cast_const().cast(), len, stream) {
            // SAFETY: the buffer contract: `recvbuff` holds `len` bytes.
            return unsafe {
                crate::device::message(&entry, peer, false, (ptr.cast(), len, "recvbuff"), stream)
            };
        }
        region.mapped()?;
        let message = RawMessage {
            peer,
            send: false,
            ptr,
            len,
            tag: 0,
        };
        issue(&entry, Job::Message(message))
    })
}

/// Extension: returns once every rank of `comm` has called it.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclBarrier(comm: oxcclComm_t, stream: oxcclStream_t) -> oxcclResult_t {
    guard("oxcclBarrier", || {
        host_only(stream)?;
        let entry = handles::get(comm, "comm")?;
        let plan = Plan::new(Collective::Barrier, 0, DataType::U8);
        let none = Region::new(std::ptr::null(), 0, "none");
        collective(
            &entry,
            plan,
            None,
            Buffers::Apart {
                send: none,
                recv: none,
            },
            stream,
        )
    })
}
