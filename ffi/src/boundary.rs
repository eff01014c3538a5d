//! The edge between C and Rust: every exported function runs its body through [`guard`], which
//! catches panics, turns errors into result codes and keeps the calling thread's last error
//! message for `oxcclGetLastError`. Also the argument checks every function shares.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use oxccl_core::{DataType, Error};

use crate::abi::*;

/// Why a call failed: its result code and a message for `oxcclGetLastError`.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub(crate) code: oxcclResult_t,
    pub(crate) message: String,
}

impl Failure {
    /// The same failure, its message starting with the rank that met it (unless it does).
    pub(crate) fn naming_rank(self, rank: usize) -> Failure {
        if self.message.starts_with("rank ") {
            return self;
        }
        Failure {
            message: format!("rank {rank}: {}", self.message),
            ..self
        }
    }

    /// The outcome of a call that started work and returns before it is done.
    pub(crate) fn in_progress() -> Failure {
        Failure {
            code: oxcclInProgress,
            message: String::new(),
        }
    }

    /// An `oxcclInvalidUsage` failure.
    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: oxcclInvalidUsage,
            message: message.into(),
        }
    }

    /// An `oxcclInvalidArgument` failure.
    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            code: oxcclInvalidArgument,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    /// The result code NCCL would return for the same failure:
    ///
    /// - `InvalidArgument` → `oxcclInvalidArgument`;
    /// - `Timeout` → `oxcclTimeout`;
    /// - `PeerFailed` and `Aborted` → `oxcclRemoteError`: the group is broken (a peer died or
    ///   aborted, or this communicator was aborted) and the call cannot complete — NCCL's
    ///   "remote process exited or there was a network error";
    /// - `Mismatch` → `oxcclInvalidUsage`: the ranks' calls disagree, a bug in the program;
    /// - `Io`, `Bootstrap`, `Transport`, `Unavailable` → `oxcclSystemError`;
    /// - anything newer → `oxcclInternalError`.
    fn from(e: Error) -> Failure {
        let code = match &e {
            Error::InvalidArgument(_) => oxcclInvalidArgument,
            Error::Timeout { .. } => oxcclTimeout,
            Error::PeerFailed { .. } | Error::Aborted { .. } => oxcclRemoteError,
            Error::Mismatch { .. } => oxcclInvalidUsage,
            Error::Io { .. }
            | Error::Bootstrap(_)
            | Error::Transport { .. }
            | Error::Unavailable(_) => oxcclSystemError,
            _ => oxcclInternalError,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

/// `Result` of a function body.
pub(crate) type Outcome = Result<(), Failure>;

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Runs `body` as the exported function `name`: a failure is recorded as this thread's last
/// error (prefixed by `name`) and returned as its code; a panic becomes `oxcclInternalError`.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Outcome) -> oxcclResult_t {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return oxcclSuccess,
        Ok(Err(f)) => f,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Failure {
                code: oxcclInternalError,
                message: format!("internal error (a bug in oxccl, please report it): {what}"),
            }
        }
    };
    // `oxcclInProgress` is not a failure: the last error stays what it was.
    if failure.code != oxcclInProgress {
        set_last_error(&format!("{name}: {}", failure.message));
        if joins_group(name) {
            crate::dispatch::note_failure(&failure);
        }
    }
    failure.code
}

/// Whether the exported function `name` is kept by an open group (a collective, a send or a
/// receive, a communicator's creation), so that its failure fails the group's `oxcclGroupEnd`
/// as in NCCL. Other calls inside a group — queries, registration, `oxcclCommDestroy` — report
/// their own failure and leave the group's work alone.
fn joins_group(name: &str) -> bool {
    const KEPT: [&str; 20] = [
        "oxcclAllReduce",
        "oxcclBroadcast",
        "oxcclBcast",
        "oxcclReduce",
        "oxcclAllGather",
        "oxcclReduceScatter",
        "oxcclAlltoAll",
        "oxcclGather",
        "oxcclScatter",
        "oxcclSend",
        "oxcclRecv",
        "oxcclBarrier",
        "oxcclCommInitRank",
        "oxcclCommInitRankConfig",
        "oxcclCommInitRankOptions",
        "oxcclCommInitRankScalable",
        "oxcclCommInitAll",
        "oxcclCommInitFromEnv",
        "oxcclCommSplit",
        "oxcclCommShrink",
    ];
    KEPT.contains(&name)
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last_error(message: &str) {
    // An interior NUL would end the C string early: replace it.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // `try_with`: a call from a thread-local destructor, after this one is gone, keeps no message
    // rather than panicking outside the guard.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = Some(text));
}

/// This thread's last error message ("" if none), valid until the thread's next failing call.
pub(crate) fn last_error() -> *const std::ffi::c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_deref().unwrap_or(c"").as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The static description of a result code.
pub(crate) fn error_string(result: oxcclResult_t) -> &'static CStr {
    match result {
        oxcclSuccess => c"no error",
        oxcclUnhandledCudaError => c"unhandled cuda error (run with OXCCL_LOG=info for details)",
        oxcclSystemError => {
            c"unhandled system error (run with OXCCL_LOG=info for details); oxcclGetLastError says more"
        }
        oxcclInternalError => c"internal error - please report this issue to the oxccl developers",
        oxcclInvalidArgument => c"invalid argument (oxcclGetLastError names it)",
        oxcclInvalidUsage => c"invalid usage (oxcclGetLastError says more)",
        oxcclRemoteError => {
            c"remote process exited or there was a network error (oxcclGetLastError names the rank)"
        }
        oxcclInProgress => c"operation in progress",
        oxcclTimeout => c"operation timed out (OXCCL_TIMEOUT)",
        _ => c"unknown result code",
    }
}

/// Fails unless `stream` is NULL.
pub(crate) fn host_only(stream: oxcclStream_t) -> Outcome {
    if stream.is_null() {
        Ok(())
    } else {
        Err(Failure {
            code: oxcclInvalidUsage,
            message: "CUDA streams are not supported yet: pass NULL for host memory".into(),
        })
    }
}

/// The data type whose nccl.h value is `raw`.
pub(crate) fn data_type(raw: oxcclDataType_t) -> Result<DataType, Failure> {
    DataType::from_raw(raw.into()).ok_or_else(|| {
        Failure::invalid(format!(
            "datatype: {raw} is not an oxcclDataType_t (0 to {})",
            oxcclNumTypes - 1
        ))
    })
}

/// `value`, the argument `what` (a root, a peer), as a rank of a communicator of `size` ranks.
pub(crate) fn rank_arg(what: &str, value: c_int, size: usize) -> Result<usize, Failure> {
    usize::try_from(value)
        .ok()
        .filter(|&r| r < size)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "{what}: {value} is not a rank of this communicator of {size} ranks"
            ))
        })
}

/// The byte size of `count` elements of `dtype` times `blocks`, if a buffer can have it.
pub(crate) fn byte_len(
    what: &str,
    count: usize,
    blocks: usize,
    dtype: DataType,
) -> Result<usize, Failure> {
    count
        .checked_mul(dtype.size())
        .and_then(|b| b.checked_mul(blocks))
        .filter(|&b| isize::try_from(b).is_ok())
        .ok_or_else(|| {
            Failure::invalid(format!(
                "{what}: {count} elements of {dtype} do not fit in memory"
            ))
        })
}

/// Fails if `ptr` is NULL (an out-pointer or a buffer that must be there).
pub(crate) fn non_null<T>(ptr: *const T, what: &str) -> Outcome {
    if ptr.is_null() {
        Err(Failure::invalid(format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

/// The host buffer length from which [`Region::mapped`] checks the buffer's extent.
pub(crate) const CHECK_MAPPED_FROM: usize = 16 << 20;

/// A buffer of the C caller: its address and length in bytes.
#[derive(Clone, Copy)]
pub(crate) struct Region {
    pub(crate) ptr: *mut c_void,
    pub(crate) len: usize,
    pub(crate) name: &'static str,
}

impl Region {
    /// `len` bytes at `ptr`, the argument `name`.
    pub(crate) fn new(ptr: *const c_void, len: usize, name: &'static str) -> Region {
        Region {
            ptr: ptr.cast_mut(),
            len,
            name,
        }
    }

    fn start(&self) -> usize {
        self.ptr as usize
    }

    /// The region for reading: (address, length), NULL only when empty.
    pub(crate) fn read(&self) -> Result<(*const u8, usize), Failure> {
        if self.len == 0 {
            return Ok((std::ptr::null(), 0));
        }
        non_null(self.ptr, self.name)?;
        Ok((self.ptr.cast::<u8>().cast_const(), self.len))
    }

    /// The region for writing: (address, length), NULL only when empty.
    pub(crate) fn write(&self) -> Result<(*mut u8, usize), Failure> {
        if self.len == 0 {
            return Ok((std::ptr::null_mut(), 0));
        }
        non_null(self.ptr, self.name)?;
        Ok((self.ptr.cast::<u8>(), self.len))
    }

    /// Fails if this host region, from [`CHECK_MAPPED_FROM`] bytes, is not all memory mapped
    /// in this process. A count no buffer has (2^61 elements, say) passes the size checks,
    /// and a call cuts its length into slices and schedules them before it touches a byte:
    /// gigabytes of bookkeeping, then an abort. `msync(MS_ASYNC)` changes nothing (a no-op on
    /// every mapping since Linux 2.6.19) and fails with ENOMEM where a page of the range is
    /// unmapped; it walks the process's mappings, not the pages, so it costs the same for
    /// any length: well under 1% of a call from 16 MiB. Host memory only (device pointers
    /// are checked by the driver).
    pub(crate) fn mapped(&self) -> Outcome {
        if self.len < CHECK_MAPPED_FROM {
            return Ok(());
        }
        self.all_mapped()
    }

    /// [`Region::mapped`] at any length (registrations: they pin what they are given).
    pub(crate) fn all_mapped(&self) -> Outcome {
        if self.len == 0 {
            return Ok(());
        }
        let page = rustix::param::page_size();
        let start = self.start() & !(page - 1);
        let unmapped = || {
            Failure::invalid(format!(
                "{}: {} bytes at {:p} are not all memory of this process (the count is larger \
                 than the buffer)",
                self.name, self.len, self.ptr
            ))
        };
        let end = self.start().checked_add(self.len).ok_or_else(unmapped)?;
        // SAFETY: MS_ASYNC neither reads nor writes the range, nor changes a mapping. ENOMEM
        // (a page unmapped) and EINVAL (a range beyond the address space) say the same.
        unsafe {
            rustix::mm::msync(
                start as *mut c_void,
                end - start,
                rustix::mm::MsyncFlags::ASYNC,
            )
        }
        .map_err(|_| unmapped())
    }

    /// Fails if the two regions share a byte.
    pub(crate) fn disjoint(&self, other: &Region) -> Outcome {
        let overlap = self.len > 0
            && other.len > 0
            && self.start() < other.start().saturating_add(other.len)
            && other.start() < self.start().saturating_add(self.len);
        if overlap {
            return Err(Failure::invalid(format!(
                "{} and {} overlap without being an in-place call",
                self.name, other.name
            )));
        }
        Ok(())
    }
}
