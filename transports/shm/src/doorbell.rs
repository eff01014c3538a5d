//! Waking a peer that sleeps, without a system call when it does not.
//!
//! A side that is about to block announces it (`arm`: store its flag, then a full fence) and
//! re-checks the ring before sleeping; a side that just published or freed a slot fences and
//! then reads the flag (`should_ring`), and writes the peer's eventfd only if it is set. The two
//! fences make it impossible for both to miss each other (Dekker): either the sleeper sees the
//! new data, or the other side sees the flag. The loom tests check exactly these functions.

use crate::primitive::{AtomicU32, Ordering, fence};

/// Announces that this side is about to sleep; the caller must re-check for work afterwards
/// and not sleep if there is any.
pub fn arm(flag: &AtomicU32) {
    flag.store(1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
}

/// Withdraws the announcement after waking (or deciding not to sleep).
pub fn disarm(flag: &AtomicU32) {
    flag.store(0, Ordering::Relaxed);
}

/// After publishing work for the other side: whether it announced it sleeps (ring its bell).
pub fn should_ring(flag: &AtomicU32) -> bool {
    fence(Ordering::SeqCst);
    flag.load(Ordering::Relaxed) != 0
}
