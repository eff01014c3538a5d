//! Versions, unique ids, creating and destroying communicators, queries and error strings.

use std::ffi::{c_char, c_int};

use oxccl_core::bootstrap::UniqueId;
use oxccl_core::{Communicator, Config};

use crate::abi::*;
use crate::boundary::{Failure, error_string, guard, last_error, non_null};
use crate::handles;

/// This library's version as `major * 10000 + minor * 100 + patch` (NCCL's encoding).
const VERSION_CODE: c_int = {
    const fn parse(s: &str) -> c_int {
        let b = s.as_bytes();
        let mut v = 0;
        let mut i = 0;
        while i < b.len() {
            v = v * 10 + (b[i] - b'0') as c_int;
            i += 1;
        }
        v
    }
    parse(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + parse(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + parse(env!("CARGO_PKG_VERSION_PATCH"))
};

/// Stores the library version, `major * 10000 + minor * 100 + patch`, in `*version`.
///
/// # Safety
///
/// `version` is NULL (an error) or valid for writing one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclGetVersion(version: *mut c_int) -> oxcclResult_t {
    guard("oxcclGetVersion", || {
        non_null(version, "version")?;
        // SAFETY: not NULL, and the caller guarantees it points to a writable int.
        unsafe { version.write(VERSION_CODE) };
        Ok(())
    })
}

/// Makes a new unique id in `*uniqueId`: starts a store server in this process (it lives until
/// the process exits) that the ranks of one communicator meet at. Call it on one rank, then
/// send the id to every rank.
///
/// # Safety
///
/// `uniqueId` is NULL (an error) or valid for writing one `oxcclUniqueId`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclGetUniqueId(uniqueId: *mut oxcclUniqueId) -> oxcclResult_t {
    guard("oxcclGetUniqueId", || {
        non_null(uniqueId, "uniqueId")?;
        let id = UniqueId::new()?;
        let mut out = oxcclUniqueId {
            internal: [0; OXCCL_UNIQUE_ID_BYTES],
        };
        for (o, b) in out.internal.iter_mut().zip(id.as_bytes()) {
            *o = *b as c_char;
        }
        // SAFETY: not NULL, and the caller guarantees it points to a writable oxcclUniqueId
        // (which has no alignment beyond 1).
        unsafe { uniqueId.write(out) };
        Ok(())
    })
}

/// Registers `comm` and writes its handle to `*out`.
///
/// # Safety
///
/// `out` is NULL or valid for writing one handle.
unsafe fn hand_out(out: *mut oxcclComm_t, comm: Communicator) -> Result<(), Failure> {
    non_null(out, "comm")?;
    // SAFETY: not NULL, and the caller guarantees it points to a writable oxcclComm_t.
    unsafe { out.write(handles::register(comm)) };
    Ok(())
}

/// Creates rank `rank` of a communicator of `nranks` ranks that meet through `commId`
/// (nccl.h's `ncclCommInitRank`). Every rank calls it with the same id and `nranks`; it
/// returns when all have joined, or fails after `OXCCL_TIMEOUT` seconds. The configuration
/// comes from the `OXCCL_*` environment variables.
///
/// # Safety
///
/// `comm` is NULL (an error) or valid for writing one `oxcclComm_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommInitRank(
    comm: *mut oxcclComm_t,
    nranks: c_int,
    commId: oxcclUniqueId,
    rank: c_int,
) -> oxcclResult_t {
    guard("oxcclCommInitRank", || {
        non_null(comm, "comm")?;
        let n = usize::try_from(nranks)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| Failure::invalid(format!("nranks: {nranks} is not positive")))?;
        let r = usize::try_from(rank)
            .ok()
            .filter(|&r| r < n)
            .ok_or_else(|| {
                Failure::invalid(format!("rank: {rank} is not in 0..{nranks} (nranks)"))
            })?;
        let bytes: [u8; OXCCL_UNIQUE_ID_BYTES] = commId.internal.map(|c| c as u8);
        let id = UniqueId::from_bytes(&bytes).map_err(|e| {
            Failure::invalid(format!(
                "commId is not an id from oxcclGetUniqueId (or was damaged on the way): {e}"
            ))
        })?;
        let c = Communicator::init_rank(&id, n, r, Config::from_env()?)?;
        // SAFETY: `comm` was checked above; the caller guarantees it is writable.
        unsafe { hand_out(comm, c) }
    })
}

/// Creates `ndev` communicators that are ranks 0 to `ndev - 1` of one communicator inside this
/// process (nccl.h's `ncclCommInitAll`), in `comms[0..ndev]`. Drive each from its own thread:
/// a collective returns only when every rank has called it. `devlist` (CUDA devices) may be
/// NULL and is ignored by this host-memory build.
///
/// # Safety
///
/// `comms` is NULL (an error) or valid for writing `ndev` handles; `devlist` is NULL or valid
/// for reading `ndev` ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommInitAll(
    comms: *mut oxcclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> oxcclResult_t {
    let _ = devlist;
    guard("oxcclCommInitAll", || {
        non_null(comms, "comms")?;
        let n = usize::try_from(ndev)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| Failure::invalid(format!("ndev: {ndev} is not positive")))?;
        let all = Communicator::init_local(n, Config::from_env()?)?;
        for (i, c) in all.into_iter().enumerate() {
            // SAFETY: `comms` is not NULL and the caller guarantees room for `ndev` handles;
            // i < ndev.
            unsafe { comms.add(i).write(handles::register(c)) };
        }
        Ok(())
    })
}

/// Extension: creates this process's communicator from a launcher's environment (oxrun's
/// `OXCCL_*` variables, torchrun, Slurm, Open MPI or PMI), with the configuration of the
/// `OXCCL_*` variables: the C form of `oxccl::Communicator::init`.
///
/// # Safety
///
/// `comm` is NULL (an error) or valid for writing one `oxcclComm_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommInitFromEnv(comm: *mut oxcclComm_t) -> oxcclResult_t {
    guard("oxcclCommInitFromEnv", || {
        non_null(comm, "comm")?;
        let c = Communicator::init(Config::from_env()?)?;
        // SAFETY: `comm` was checked above; the caller guarantees it is writable.
        unsafe { hand_out(comm, c) }
    })
}

/// Destroys `comm`: its handle becomes invalid at once, and its connections close (after the
/// calls other threads are still making on it return). Every rank destroys its own.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclCommDestroy(comm: oxcclComm_t) -> oxcclResult_t {
    guard("oxcclCommDestroy", || {
        drop(handles::remove(comm, "comm")?);
        Ok(())
    })
}

/// Aborts and destroys `comm` from any thread: running and later calls on it fail (with
/// `oxcclRemoteError`), the peers are told (their calls fail naming this rank), and the handle
/// becomes invalid.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclCommAbort(comm: oxcclComm_t) -> oxcclResult_t {
    guard("oxcclCommAbort", || {
        let c = handles::remove(comm, "comm")?;
        c.abort();
        Ok(())
    })
}

/// Stores the number of ranks of `comm` in `*count`.
///
/// # Safety
///
/// `count` is NULL (an error) or valid for writing one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommCount(comm: oxcclComm_t, count: *mut c_int) -> oxcclResult_t {
    guard("oxcclCommCount", || {
        let c = handles::get(comm, "comm")?;
        non_null(count, "count")?;
        let n = c_int::try_from(c.size())
            .map_err(|_| Failure::invalid("count: the size does not fit in an int"))?;
        // SAFETY: not NULL, and the caller guarantees it points to a writable int.
        unsafe { count.write(n) };
        Ok(())
    })
}

/// Stores the rank of `comm` in `*rank`.
///
/// # Safety
///
/// `rank` is NULL (an error) or valid for writing one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommUserRank(comm: oxcclComm_t, rank: *mut c_int) -> oxcclResult_t {
    guard("oxcclCommUserRank", || {
        let c = handles::get(comm, "comm")?;
        non_null(rank, "rank")?;
        let r = c_int::try_from(c.rank())
            .map_err(|_| Failure::invalid("rank: the rank does not fit in an int"))?;
        // SAFETY: not NULL, and the caller guarantees it points to a writable int.
        unsafe { rank.write(r) };
        Ok(())
    })
}

/// A static, NUL-terminated description of `result` (any value; unknown ones get
/// "unknown result code"). Never NULL; never free it.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclGetErrorString(result: oxcclResult_t) -> *const c_char {
    error_string(result).as_ptr()
}

/// The message of the last failed oxccl call on the calling thread ("" if none), naming the
/// function, the argument or the rank at fault. NUL-terminated; valid until the next failing
/// oxccl call on this thread; never free it. `comm` is not used and may be NULL.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclGetLastError(comm: oxcclComm_t) -> *const c_char {
    let _ = comm;
    last_error()
}
