//! Extension: sends and receives that start and return at once, each with a request to wait
//! for or test, as MPI's `MPI_Isend` / `MPI_Irecv` with `MPI_Wait` / `MPI_Test`. nccl.h has
//! no such calls (its sends and receives are ordered on a CUDA stream instead); a host
//! program (torch.distributed's `isend` and `irecv` on CPU tensors) needs them to post a
//! send and a receive one after the other without the first waiting for its peer.
//!
//! The k-th send to a peer pairs with the peer's k-th receive from this rank, however either
//! side started them (`oxcclSend`, in a group, or here), and started ones run together: a
//! send started here, then a receive, both progress while this rank waits for either. A
//! request's memory belongs to oxccl until `oxcclRequestWait` returns, or `oxcclRequestTest`
//! reports it done; destroying or aborting the communicator first waits for its requests
//! (their handles are then unknown); finalizing or splitting it does not end them.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use oxccl_core::RawMessage;

use crate::abi::*;
use crate::boundary::{Failure, Outcome, Region, byte_len, data_type, guard, rank_arg};
use crate::dispatch::in_group;
use crate::entry::{Entry, InFlight};
use crate::handles;

/// The live requests by id, with the communicator each belongs to (whose entry holds it).
static LIVE: Mutex<BTreeMap<usize, Weak<Entry>>> = Mutex::new(BTreeMap::new());

fn live() -> std::sync::MutexGuard<'static, BTreeMap<usize, Weak<Entry>>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Forgets the requests `ids` (their communicator is going: it waits for them).
pub(crate) fn forget<'a>(ids: impl IntoIterator<Item = &'a usize>) {
    let mut live = live();
    for id in ids {
        live.remove(id);
    }
}

/// Starts a send (`send`) or receive of `count` elements at `buf` with `peer` and writes its
/// request to `request`.
///
/// # Safety
///
/// `request` is NULL or writable; `buf`: the module's contract.
unsafe fn start(
    (buf, count, datatype, peer, tag): (*mut c_void, usize, oxcclDataType_t, c_int, c_int),
    send: bool,
    comm: oxcclComm_t,
    request: *mut oxcclRequest_t,
) -> Outcome {
    let what = if send { "sendbuff" } else { "recvbuff" };
    if request.is_null() {
        return Err(Failure::invalid("request is NULL"));
    }
    let entry = handles::get(comm, "comm")?;
    let dtype = data_type(datatype)?;
    let c = entry.for_operation()?;
    if in_group() {
        return Err(Failure::usage(format!(
            "rank {}: a started {} cannot be part of a group (use oxcclSend and oxcclRecv \
             there)",
            c.rank(),
            if send { "send" } else { "receive" }
        )));
    }
    let peer = rank_arg("peer", peer, c.size())?;
    let len = byte_len("count", count, 1, dtype)?;
    let region = Region::new(buf.cast_const(), len, what);
    let ptr = if send {
        region.read()?.0.cast_mut()
    } else {
        region.write()?.0
    };
    if crate::device::on_device(&entry, ptr.cast_const().cast(), len, std::ptr::null_mut()) {
        return Err(Failure::invalid(format!(
            "rank {}: {what} is device memory: started sends and receives take host memory \
             (use oxcclSend and oxcclRecv with a stream)",
            c.rank()
        )));
    }
    region.mapped()?;
    let message = RawMessage {
        peer,
        send,
        ptr: ptr.cast(),
        len,
        // Any int: compared bit for bit.
        tag: tag as u32,
    };
    // SAFETY: the module's contract: the memory stays valid and untouched until the request
    // is waited for (or the communicator destroyed, which waits for it).
    let pending = unsafe { c.start_point_to_point_raw(&[message]) }.map_err(|e| {
        let f = Failure::from(e);
        entry.fail(&f);
        f
    })?;
    let id = handles::fresh_id();
    entry
        .requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(
            id,
            InFlight {
                pending,
                _scratch: None,
            },
        );
    live().insert(id, Arc::downgrade(&entry));
    // SAFETY: checked not NULL; the caller's contract makes it writable.
    unsafe { request.write(std::ptr::without_provenance_mut(id)) };
    Ok(())
}

/// Extension: starts sending `count` elements of `sendbuff` (host memory) to `peer` and
/// returns at once with `*request`, which `oxcclRequestWait` or `oxcclRequestTest` ends. The
/// peer receives them with a matching receive (same count, type and `tag`; messages between
/// two ranks match in the order posted, and a receive whose count or tag differs from the
/// message it meets fails, naming both). Not inside a group.
///
/// # Safety
///
/// `request` is writable; `sendbuff` is readable for the message's length, and nothing
/// writes to it until the request has ended.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclSendStart(
    sendbuff: *const c_void,
    count: usize,
    datatype: oxcclDataType_t,
    peer: c_int,
    tag: c_int,
    comm: oxcclComm_t,
    request: *mut oxcclRequest_t,
) -> oxcclResult_t {
    guard("oxcclSendStart", || {
        // SAFETY: the caller's contract.
        unsafe {
            start(
                (sendbuff.cast_mut(), count, datatype, peer, tag),
                true,
                comm,
                request,
            )
        }
    })
}

/// Extension: starts receiving into `recvbuff` (host memory) the `count` elements `peer`
/// sends, and returns at once with `*request` (see `oxcclSendStart`).
///
/// # Safety
///
/// `request` is writable; `recvbuff` is writable for the message's length, and nothing else
/// touches it until the request has ended.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclRecvStart(
    recvbuff: *mut c_void,
    count: usize,
    datatype: oxcclDataType_t,
    peer: c_int,
    tag: c_int,
    comm: oxcclComm_t,
    request: *mut oxcclRequest_t,
) -> oxcclResult_t {
    guard("oxcclRecvStart", || {
        // SAFETY: the caller's contract.
        unsafe { start((recvbuff, count, datatype, peer, tag), false, comm, request) }
    })
}

/// A looked-up request: its communicator, and the request if it was taken out.
type Found = Option<(Arc<Entry>, Option<InFlight>)>;

/// The request `*request` names, taken out of the live ones once `take` says so (given
/// whether it is complete); `None` for a NULL handle (an ended request).
///
/// # Safety
///
/// `request` is NULL or readable.
unsafe fn lookup(
    request: *mut oxcclRequest_t,
    take: impl FnOnce(&InFlight) -> bool,
) -> Result<Found, Failure> {
    if request.is_null() {
        return Err(Failure::invalid("request is NULL"));
    }
    // SAFETY: checked not NULL; the caller's contract makes it readable.
    let id = unsafe { request.read() } as usize;
    if id == 0 {
        return Ok(None);
    }
    let unknown = || {
        Failure::invalid(format!(
            "request ({id:#x}) is not a live request: it ended already, its communicator was \
             destroyed or aborted (which waited for it), or it did not come from \
             oxcclSendStart or oxcclRecvStart"
        ))
    };
    let entry = live()
        .get(&id)
        .and_then(Weak::upgrade)
        .ok_or_else(unknown)?;
    let mut requests = entry
        .requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let Some(op) = requests.get(&id) else {
        drop(requests);
        live().remove(&id);
        return Err(unknown());
    };
    if !take(op) {
        drop(requests);
        return Ok(Some((entry, None)));
    }
    let op = requests.remove(&id);
    drop(requests);
    live().remove(&id);
    // SAFETY: as above; it is writable too (the caller's contract).
    unsafe { request.write(std::ptr::null_mut()) };
    Ok(Some((entry, op)))
}

/// The result of `op`, which has finished or is waited for here.
fn finish(entry: &Entry, op: InFlight) -> Outcome {
    op.pending.wait().map_err(|e| {
        let f = Failure::from(e);
        entry.fail(&f);
        f
    })
}

/// Extension: waits for the send or receive of `*request` (within the communicator's
/// timeout), ends the request (`*request` becomes NULL) and returns its result: a failure
/// names the rank, the peer and the operation (`oxcclGetLastError`). A NULL `*request` (an
/// ended request) returns `oxcclSuccess` at once.
///
/// # Safety
///
/// `request` is readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclRequestWait(request: *mut oxcclRequest_t) -> oxcclResult_t {
    guard("oxcclRequestWait", || {
        // SAFETY: the caller's contract.
        match unsafe { lookup(request, |_| true) }? {
            Some((entry, Some(op))) => finish(&entry, op),
            _ => Ok(()),
        }
    })
}

/// Extension: whether the send or receive of `*request` has finished, without blocking:
/// `*done` 1 and the request ended (`*request` becomes NULL) with its result returned, or
/// `*done` 0 and `oxcclSuccess`. A NULL `*request` is done.
///
/// # Safety
///
/// `request` is readable and writable, `done` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclRequestTest(
    request: *mut oxcclRequest_t,
    done: *mut c_int,
) -> oxcclResult_t {
    guard("oxcclRequestTest", || {
        if done.is_null() {
            return Err(Failure::invalid("done is NULL"));
        }
        // SAFETY: the caller's contract.
        let found = unsafe { lookup(request, |op| op.pending.is_completed()) }?;
        let (finished, outcome) = match found {
            None => (true, Ok(())),
            Some((_, None)) => (false, Ok(())),
            Some((entry, Some(op))) => (true, finish(&entry, op)),
        };
        // SAFETY: checked not NULL; the caller's contract makes it writable.
        unsafe { done.write(c_int::from(finished)) };
        outcome
    })
}
