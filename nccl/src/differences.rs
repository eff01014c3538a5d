//! Where NCCL 2.27 and oxccl's C ABI differ, and nothing else: the version reported (nccl.h's
//! NCCL_VERSION_CODE, not oxccl's), the timeout result code (oxccl's `oxcclTimeout`, 8, is past
//! NCCL 2.27's last code, so it is returned as `ncclRemoteError`; the last-error message still
//! says it timed out) and the error strings (NCCL's wording, pointing at `ncclGetLastError`,
//! whose message names the failed function by its NCCL name).

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int};

use oxccl::*;

/// nccl.h's NCCL_VERSION_CODE: 2.27.5, `2 * 10000 + 27 * 100 + 5`. 2.27 is the version whose
/// `ncclConfig_t` layout the C ABI has, and nccl-tests turns features on from 2.27.
pub(crate) const NCCL_VERSION_CODE: c_int = 22705;

/// What an oxccl function returns, as NCCL 2.27 returns it.
pub(crate) trait IntoNccl {
    /// The value for the NCCL caller.
    fn into_nccl(self) -> Self;
}

impl IntoNccl for oxcclResult_t {
    /// NCCL 2.27 has no timeout code: a timeout is a remote error (the group cannot finish).
    fn into_nccl(self) -> Self {
        if self == oxcclTimeout {
            oxcclRemoteError
        } else {
            self
        }
    }
}

impl IntoNccl for *const c_char {
    /// Strings pass as they are.
    fn into_nccl(self) -> Self {
        self
    }
}

/// `ncclGetVersion`: checks `version` as `oxcclGetVersion` does, then stores
/// [`NCCL_VERSION_CODE`] there.
///
/// # Safety
///
/// `version` is NULL (an error) or valid for writing one `int`.
pub(crate) unsafe fn get_version(version: *mut c_int) -> oxcclResult_t {
    // SAFETY: the caller's contract, oxcclGetVersion's.
    let result = unsafe { oxcclGetVersion(version) };
    if result == oxcclSuccess {
        // SAFETY: oxcclGetVersion succeeded, so `version` is not NULL; the caller guarantees it
        // is writable.
        unsafe { version.write(NCCL_VERSION_CODE) };
    }
    result
}

/// `ncclCommGetAsyncError`: `oxcclCommGetAsyncError`, with a timeout stored as
/// `ncclRemoteError`.
///
/// # Safety
///
/// `asyncError` is NULL (an error) or valid for reading and writing one `int`.
pub(crate) unsafe fn get_async_error(
    comm: oxcclComm_t,
    asyncError: *mut oxcclResult_t,
) -> oxcclResult_t {
    #[allow(unused_unsafe)]
    // SAFETY: the caller's contract, oxcclCommGetAsyncError's.
    let result = unsafe { oxcclCommGetAsyncError(comm, asyncError) };
    if result == oxcclSuccess {
        // SAFETY: the call succeeded, so `asyncError` is not NULL and holds a result code; the
        // caller guarantees it is readable and writable.
        unsafe { asyncError.write(asyncError.read().into_nccl()) };
    }
    result
}

/// `ncclGetErrorString`: NCCL's words for its result codes, "unknown result code" for others
/// (oxccl's timeout included: the shim never returns it). Static, NUL-terminated.
pub(crate) fn error_string(result: oxcclResult_t) -> *const c_char {
    let text = match result {
        oxcclSuccess => c"no error",
        oxcclUnhandledCudaError => c"unhandled cuda error (ncclGetLastError says more)",
        oxcclSystemError => c"unhandled system error (ncclGetLastError says more)",
        oxcclInternalError => c"internal error - please report this issue to the oxccl developers",
        oxcclInvalidArgument => c"invalid argument (ncclGetLastError names it)",
        oxcclInvalidUsage => c"invalid usage (ncclGetLastError says more)",
        oxcclRemoteError => {
            c"remote process exited or there was a network error (ncclGetLastError names the rank)"
        }
        oxcclInProgress => c"NCCL operation in progress",
        _ => c"unknown result code",
    };
    text.as_ptr()
}

thread_local! {
    /// The last `ncclGetLastError` message of this thread, with NCCL's function name.
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// `ncclGetLastError`: `oxcclGetLastError`'s message, whose leading function name
/// (`oxcclRecv: ...`) becomes NCCL's (`ncclRecv: ...`): the caller called that one. Any handle
/// may be passed.
pub(crate) fn last_error(comm: oxcclComm_t) -> *const c_char {
    let ours = oxcclGetLastError(comm);
    if ours.is_null() {
        return ours;
    }
    // SAFETY: oxcclGetLastError returns a NUL-terminated string valid until this thread's next
    // call into the library.
    let bytes = unsafe { CStr::from_ptr(ours) }.to_bytes();
    let Some(rest) = bytes.strip_prefix(b"oxccl") else {
        return ours;
    };
    let name_ends = rest.iter().position(|&b| !b.is_ascii_alphanumeric());
    if !rest.first().is_some_and(u8::is_ascii_uppercase) || name_ends.map(|i| rest[i]) != Some(b':')
    {
        return ours;
    }
    let mut text = b"nccl".to_vec();
    text.extend_from_slice(rest);
    // No NUL inside: it came from a C string.
    let Ok(text) = CString::new(text) else {
        return ours;
    };
    LAST.with(|l| {
        *l.borrow_mut() = text;
        l.borrow().as_ptr()
    })
}
