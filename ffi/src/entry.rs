//! What the C ABI keeps per communicator handle: the communicator (once created: a
//! non-blocking creation fills it in later), whether its calls block, the operations a
//! non-blocking communicator still runs, the first failure that broke it, its reduction
//! operators and its registered memory.
//!
//! An operation's memory belongs to oxccl until the operation is seen complete: a
//! [`Pending`] waits for its operation when dropped, and [`Entry::drain`] (destroy, abort,
//! finalize) waits for them all, so no call returns to C while a peer may still touch the
//! caller's buffers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use oxccl_core::{Communicator, Pending, Registration};

use crate::abi::*;
use crate::boundary::{Failure, Outcome};
use crate::ops::Operators;

/// An operation running in the background and the scratch memory it uses (dropped after it:
/// fields drop in order).
pub(crate) struct InFlight {
    pub(crate) pending: Pending,
    /// Kept alive (never read here): the operation reads it.
    pub(crate) _scratch: Option<Vec<u8>>,
}

/// One communicator handle's state.
pub(crate) struct Entry {
    comm: OnceLock<Communicator>,
    /// False once its handle is unregistered (destroy, abort).
    listed: AtomicBool,
    /// Whether calls complete before they return (`oxcclConfig_t.blocking`).
    pub(crate) blocking: bool,
    /// The first failure that broke the communicator (or its creation), reported by
    /// `oxcclCommGetAsyncError` from then on. With no communicator and no failure, a
    /// non-blocking creation is still running.
    failed: Mutex<Option<Failure>>,
    /// Operations of a non-blocking communicator not yet seen complete.
    pending: Mutex<Vec<InFlight>>,
    /// Sends and receives started by `oxcclSendStart` / `oxcclRecvStart`, by request id, until
    /// waited for.
    pub(crate) requests: Mutex<BTreeMap<usize, InFlight>>,
    /// Set by `oxcclCommFinalize`: no new operations.
    finalized: AtomicBool,
    /// The operators made by `oxcclRedOpCreatePreMulSum` for this communicator.
    pub(crate) operators: Mutex<Operators>,
    /// Registered memory by handle id; dropping a registration ends it.
    pub(crate) registered: Mutex<BTreeMap<usize, Registration>>,
    /// Whether the program had loaded libcuda when this communicator was made: then a
    /// collective with a NULL stream on device memory takes CUDA's default stream
    /// ([`crate::device`]).
    pub(crate) cuda: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Entry {
    /// An entry for `comm`, created already.
    pub(crate) fn ready(comm: Communicator, blocking: bool) -> Entry {
        let e = Entry::creating(blocking);
        let _ = e.comm.set(comm);
        e
    }

    /// An entry whose communicator is still being created.
    pub(crate) fn creating(blocking: bool) -> Entry {
        Entry {
            comm: OnceLock::new(),
            listed: AtomicBool::new(true),
            blocking,
            failed: Mutex::new(None),
            pending: Mutex::new(Vec::new()),
            requests: Mutex::new(BTreeMap::new()),
            finalized: AtomicBool::new(false),
            operators: Mutex::new(Operators::default()),
            registered: Mutex::new(BTreeMap::new()),
            cuda: crate::device::cuda_in_process(),
        }
    }

    /// Whether the handle is still registered.
    pub(crate) fn registered_now(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// Marks the handle unregistered.
    pub(crate) fn unregister(&self) {
        self.listed.store(false, Ordering::Release);
    }

    /// Ends a background creation with its outcome.
    pub(crate) fn created(&self, outcome: Result<Option<Communicator>, Failure>) {
        match outcome {
            Ok(Some(c)) => {
                let _ = self.comm.set(c);
            }
            Ok(None) => self.set_failed(Failure {
                code: oxcclInvalidUsage,
                message: "comm joined no communicator (OXCCL_SPLIT_NOCOLOR)".into(),
            }),
            Err(f) => self.set_failed(f),
        }
    }

    /// The communicator, once created; a creation still running or failed is an error.
    pub(crate) fn comm(&self) -> Result<&Communicator, Failure> {
        if let Some(c) = self.comm.get() {
            return Ok(c);
        }
        Err(self.failure().unwrap_or_else(|| Failure {
            code: oxcclInvalidUsage,
            message: "comm is still being created (non-blocking): wait until \
                      oxcclCommGetAsyncError reports oxcclSuccess"
                .into(),
        }))
    }

    /// The communicator, for a new operation: not finalized.
    pub(crate) fn for_operation(&self) -> Result<&Communicator, Failure> {
        let c = self.comm()?;
        if self.finalized.load(Ordering::Acquire) {
            return Err(Failure::usage(format!(
                "rank {}: comm was finalized (oxcclCommFinalize): it takes no new operations",
                c.rank()
            )));
        }
        Ok(c)
    }

    /// Records `f` as what broke the communicator if it is that kind of failure (a peer, a
    /// timeout, the system, a bug) and nothing was recorded before.
    pub(crate) fn fail(&self, f: &Failure) {
        if matches!(
            f.code,
            oxcclRemoteError | oxcclTimeout | oxcclSystemError | oxcclInternalError
        ) {
            let mut failed = lock(&self.failed);
            if failed.is_none() {
                *failed = Some(f.clone());
            }
        }
    }

    /// What broke the communicator, if anything did.
    pub(crate) fn failure(&self) -> Option<Failure> {
        lock(&self.failed).clone()
    }

    /// Records `f` as what broke the communicator, whatever its kind, unless something was.
    fn set_failed(&self, f: Failure) {
        lock(&self.failed).get_or_insert(f);
    }

    /// Adds a background operation (non-blocking communicators).
    pub(crate) fn push(&self, op: InFlight) {
        lock(&self.pending).push(op);
    }

    /// The state `oxcclCommGetAsyncError` reports: the recorded failure, else
    /// `oxcclInProgress` while a creation or an operation runs, else `oxcclSuccess`. Finished
    /// operations are collected (their failure recorded).
    pub(crate) fn poll(&self) -> oxcclResult_t {
        if let Some(f) = lock(&self.failed).as_ref() {
            return f.code;
        }
        if self.comm.get().is_none() {
            return oxcclInProgress;
        }
        let done: Vec<InFlight> = {
            let mut pending = lock(&self.pending);
            let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut *pending)
                .into_iter()
                .partition(|op| op.pending.is_completed());
            *pending = running;
            done
        };
        for op in done {
            if let Err(e) = op.pending.wait() {
                self.fail(&Failure::from(e));
            }
        }
        if let Some(f) = lock(&self.failed).as_ref() {
            return f.code;
        }
        if lock(&self.pending).is_empty() {
            oxcclSuccess
        } else {
            oxcclInProgress
        }
    }

    /// Waits for every background operation; the first failure, if any.
    pub(crate) fn drain(&self) -> Outcome {
        let all = std::mem::take(&mut *lock(&self.pending));
        let mut first = Ok(());
        for op in all {
            if let Err(e) = op.pending.wait() {
                let f = Failure::from(e);
                self.fail(&f);
                if first.is_ok() {
                    first = Err(f);
                }
            }
        }
        first
    }

    /// Waits for every started send and receive (destroy, abort: their handles are unknown
    /// afterwards); their failures are recorded, not returned.
    pub(crate) fn drain_requests(&self) {
        let all = std::mem::take(&mut *lock(&self.requests));
        crate::requests::forget(all.keys());
        for (_, op) in all {
            if let Err(e) = op.pending.wait() {
                self.fail(&Failure::from(e));
            }
        }
    }

    /// Marks the communicator finalized.
    pub(crate) fn finalize(&self) {
        self.finalized.store(true, Ordering::Release);
    }
}
