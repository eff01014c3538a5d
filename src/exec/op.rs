//! What an operation is: the work handed to the engine ([`Operation`], [`Work`], [`Message`]),
//! what it is called in errors ([`OpName`]), and the slot its result lands in ([`OpResult`]).
//! Data only: running operations is the driver's job.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::descriptor::Descriptor;
use super::progress::Compiled;
use crate::algo::{Collective, Plan};
use crate::error::Result;
use crate::trace::{Mark, Recorder};
use crate::tune::Way;
use crate::types::{DataType, Rank};

/// The result slot of one operation, shared with whoever waits for it.
#[derive(Debug, Default)]
pub struct OpResult {
    done: AtomicBool,
    slot: Mutex<Option<Result<()>>>,
    cv: Condvar,
    /// Threads blocked in `wait_for`: a condition variable's notify is a system call even with
    /// nobody waiting, and the common case (the caller drives its own operation) has nobody.
    waiters: AtomicUsize,
}

impl OpResult {
    /// Whether the operation has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Stores the operation's result and wakes whoever waits; a second result is ignored.
    pub(super) fn set(&self, r: Result<()>) {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if self.done.load(Ordering::Acquire) {
            return;
        }
        *slot = Some(r);
        self.done.store(true, Ordering::Release);
        // Waiters register under the lock we hold, so none can slip in unseen.
        if self.waiters.load(Ordering::Acquire) > 0 {
            self.cv.notify_all();
        }
    }

    /// A result slot that holds success already (an operation with nothing to do).
    pub(crate) fn succeeded() -> OpResult {
        let r = OpResult::default();
        r.set(Ok(()));
        r
    }

    /// Takes the result once the operation is done.
    pub fn take(&self) -> Option<Result<()>> {
        if !self.is_done() {
            return None;
        }
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Blocks until the operation is done or `timeout` passes; returns whether it is done.
    pub fn wait_for(&self, timeout: Duration) -> bool {
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let (_slot, _) = self
            .cv
            .wait_timeout_while(slot, timeout, |_| !self.done.load(Ordering::Acquire))
            .unwrap_or_else(|p| p.into_inner());
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        self.is_done()
    }
}

/// What an operation does.
pub enum Work {
    /// A collective: run `schedule` over the bound buffers, after exchanging `descriptor` with
    /// every peer the schedule talks to.
    Schedule {
        /// This rank's schedule, indexed.
        schedule: Arc<Compiled>,
        /// What this rank called.
        descriptor: Descriptor,
        /// Element type, for reductions.
        dtype: DataType,
    },
    /// An all-reduce through the shared group area, run to completion when it starts (the
    /// area's ways wait on shared memory, not on links).
    Area {
        /// The call.
        plan: Plan,
        /// The way the routing decision chose.
        way: Way,
        /// Its sequence number among this communicator's collectives.
        seq: u64,
    },
    /// Point-to-point messages, all posted at once (so paired sends and receives cannot
    /// deadlock), each after its descriptor. Point-to-point operations queued one after another
    /// run together (the engine joins them to the running batch), so one rank's send and its
    /// later receive are both posted while the peer's are.
    PointToPoint {
        /// The messages, whole and in the caller's order: the engine posts them a slice at a
        /// time, a bounded number in flight per peer and direction (so what it holds does not
        /// grow with the messages' length).
        messages: Vec<Message>,
        /// The longest slice a link carries.
        slice: usize,
    },
}

/// One point-to-point message of a group.
#[derive(Clone, Copy, Debug)]
pub struct Message {
    /// The peer.
    pub peer: Rank,
    /// Send (`true`) or receive.
    pub send: bool,
    /// The memory.
    pub ptr: *mut u8,
    /// Its length (never 0: empty messages are not sent).
    pub len: usize,
    /// Its number among this rank's messages to (a send) or from (a receive) `peer`: the k-th
    /// send to a peer pairs with the peer's k-th receive from this rank, whatever the groups.
    pub seq: u64,
    /// The caller's tag (0 unless it names one): must be the same on both sides.
    pub tag: u32,
}

impl Message {
    /// This rank's descriptor of the message: a send's is sent ahead of its bytes, and a
    /// receive's must match the one that arrives.
    pub fn descriptor(&self) -> Descriptor {
        let len = self.len as u64;
        let (sends, recvs) = if self.send { (len, 0) } else { (0, len) };
        Descriptor::PointToPoint {
            seq: self.seq,
            sends,
            recvs,
            tag: self.tag,
        }
    }
}

/// What an operation is called in errors: formatted only when needed.
#[derive(Clone, Debug)]
pub enum OpName {
    /// Collective number `seq` of this communicator.
    Collective(Collective, u64),
    /// A group of point-to-point operations with these peers.
    PointToPoint(Vec<Rank>),
}

impl std::fmt::Display for OpName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpName::Collective(c, seq) => write!(f, "{c} #{seq}"),
            OpName::PointToPoint(peers) => {
                f.write_str("point-to-point with rank(s) ")?;
                for (i, p) in peers.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{p}")?;
                }
                Ok(())
            }
        }
    }
}

/// An operation handed to the engine.
pub struct Operation {
    /// Its name with sequence number, for errors (`all_reduce #3`).
    pub name: OpName,
    /// What to do.
    pub work: Work,
    /// Input memory (`Buffer::Input`).
    pub input: (*const u8, usize),
    /// Output memory (`Buffer::Output`).
    pub output: (*mut u8, usize),
    /// Where the result goes.
    pub result: Arc<OpResult>,
    /// Its entry in the flight recorder.
    pub mark: Mark,
}

impl Operation {
    /// Records how the operation ended and hands its result over.
    pub(super) fn settle(&self, recorder: &Recorder, r: Result<()>) {
        recorder.end(self.mark, &r);
        self.result.set(r);
    }
}

// SAFETY: an Operation carries raw pointers to memory its submitter keeps valid (and does not
// otherwise touch) until `result` is set; the engine only dereferences them while running the
// operation, under the communicator's lock, from whichever thread drives.
unsafe impl Send for Operation {}
