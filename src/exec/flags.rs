//! The flags a communicator shares between its engine and `abort()`: the abort flag, whether
//! peers were told of a failure, and the eventfd that wakes a driver blocked in `poll(2)`.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::types::Rank;

/// Abort flag and the waker that interrupts a blocked driver; shared with `abort()`.
#[derive(Debug)]
pub struct Flags {
    aborted: AtomicBool,
    /// Peers were sent this rank's failure notice.
    told: AtomicBool,
    /// The first peer the liveness watch declared failed, plus one (0: none).
    lost: AtomicUsize,
    /// Every peer declared failed, in the order declared, with what was seen.
    lost_why: Mutex<Vec<(Rank, String)>>,
    waker: Option<OwnedFd>,
    /// Threads waiting for the communicator's lock (to queue an operation) while the progress
    /// thread drives with it: the progress thread lets go of it for them.
    wanted: AtomicUsize,
}

impl Flags {
    /// New flags with an eventfd waker (or none if the system refuses one: the driver then
    /// notices an abort within its longest block).
    pub fn new() -> Flags {
        let waker = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .ok();
        Flags {
            aborted: AtomicBool::new(false),
            told: AtomicBool::new(false),
            lost: AtomicUsize::new(0),
            lost_why: Mutex::new(Vec::new()),
            waker,
            wanted: AtomicUsize::new(0),
        }
    }

    /// Marks the communicator aborted and wakes a blocked driver.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        if let Some(w) = &self.waker {
            let _ = rustix::io::write(w, &1u64.to_ne_bytes());
        }
    }

    /// Declares `peer` failed (`why`: what was seen) and, for the first one, wakes a blocked
    /// driver; the engine fails the running call, or the next one, with `PeerFailed` naming
    /// the first. Later declarations of other peers are kept for [`Flags::lost_all`].
    pub fn lose(&self, peer: Rank, why: String) {
        {
            let mut w = self.lost_why.lock().unwrap_or_else(|p| p.into_inner());
            if w.iter().any(|(p, _)| *p == peer) {
                return;
            }
            w.push((peer, why));
            if self.lost.load(Ordering::Acquire) != 0 {
                return;
            }
            self.lost.store(peer + 1, Ordering::Release);
        }
        if let Some(w) = &self.waker {
            let _ = rustix::io::write(w, &1u64.to_ne_bytes());
        }
    }

    /// Whether a peer was declared failed ([`Flags::lost`] says which and why).
    #[inline]
    pub fn any_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire) != 0
    }

    /// The first peer declared failed, and why.
    #[inline]
    pub fn lost(&self) -> Option<(Rank, String)> {
        if self.lost.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lost_why
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first()
            .cloned()
    }

    /// Whether `peer` was declared failed.
    pub fn has_lost(&self, peer: Rank) -> bool {
        self.any_lost()
            && self
                .lost_why
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|(p, _)| *p == peer)
    }

    /// Every peer declared failed so far, in the order declared.
    pub fn lost_all(&self) -> Vec<Rank> {
        self.lost_why
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(p, _)| *p)
            .collect()
    }

    /// A thread waits for the communicator's lock (until [`Flags::got`]); wakes a driver
    /// blocked in `poll(2)` so that it lets go.
    pub fn want(&self) {
        self.wanted.fetch_add(1, Ordering::AcqRel);
        if let Some(w) = &self.waker {
            let _ = rustix::io::write(w, &1u64.to_ne_bytes());
        }
    }

    /// The thread of [`Flags::want`] has the lock.
    pub fn got(&self) {
        self.wanted.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether a thread waits for the communicator's lock.
    #[inline]
    pub fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Acquire) > 0
    }

    /// Empties the waker after a wake-up for [`Flags::want`] (an abort's stays: an aborted
    /// communicator never blocks again).
    pub(super) fn drain_waker(&self) {
        if let Some(w) = &self.waker
            && !self.is_aborted()
        {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(w, &mut b);
        }
    }

    /// Whether `abort` was called.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// The eventfd a blocked driver polls to notice `abort`, if the system gave one.
    pub(super) fn waker(&self) -> Option<BorrowedFd<'_>> {
        self.waker.as_ref().map(|w| w.as_fd())
    }

    /// Whether this rank's failure notices went out to its peers (the communicator failed).
    pub fn peers_told(&self) -> bool {
        self.told.load(Ordering::Acquire)
    }

    /// Records that this rank's failure notices went out.
    pub(super) fn set_told(&self) {
        self.told.store(true, Ordering::Release);
    }
}

impl Default for Flags {
    fn default() -> Self {
        Flags::new()
    }
}
