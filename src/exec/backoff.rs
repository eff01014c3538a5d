//! How a waiter backs off while nothing moves: spin (the awaited party is usually running on
//! another core), then yield (it may share ours), then sleep in whatever way the waiter blocks.
//! Shared by the engine's loop and the group area's waits; each keeps its own durations.

use std::time::{Duration, Instant};

/// What a waiter does next, given how long nothing has moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Stay on the processor.
    Spin,
    /// Give the processor up, but stay runnable.
    Yield,
    /// Block until woken or a timeout.
    Sleep,
}

/// The spin → yield → sleep escalation of one wait, measured from the first idle look.
#[derive(Debug)]
pub(super) struct Backoff {
    /// Spin while idle for less than this...
    spin: Duration,
    /// ...then yield while idle for less than this (at least `spin`), then sleep.
    sleep: Duration,
    /// When nothing started moving: the first `phase` call since the last `reset`.
    since: Option<Instant>,
}

impl Backoff {
    /// A wait that spins for `spin`, yields until `sleep` has passed, then sleeps.
    pub(super) fn new(spin: Duration, sleep: Duration) -> Backoff {
        Backoff {
            spin,
            sleep,
            since: None,
        }
    }

    /// The phase at `now`, nothing having moved since the first call after the last `reset`
    /// (that call starts the clock).
    pub(super) fn phase(&mut self, now: Instant) -> Phase {
        let idle = now - *self.since.get_or_insert(now);
        if idle >= self.sleep {
            Phase::Sleep
        } else if idle >= self.spin {
            Phase::Yield
        } else {
            Phase::Spin
        }
    }

    /// Something moved: the next idle look starts over with spinning.
    pub(super) fn reset(&mut self) {
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_then_yields_then_sleeps_and_starts_over_on_reset() {
        let mut b = Backoff::new(Duration::from_micros(20), Duration::from_millis(2));
        let t0 = Instant::now();
        assert_eq!(b.phase(t0), Phase::Spin);
        assert_eq!(b.phase(t0 + Duration::from_micros(19)), Phase::Spin);
        assert_eq!(b.phase(t0 + Duration::from_micros(20)), Phase::Yield);
        assert_eq!(b.phase(t0 + Duration::from_micros(1999)), Phase::Yield);
        assert_eq!(b.phase(t0 + Duration::from_millis(2)), Phase::Sleep);
        b.reset();
        let t1 = t0 + Duration::from_millis(3);
        assert_eq!(b.phase(t1), Phase::Spin);
        assert_eq!(b.phase(t1 + Duration::from_millis(2)), Phase::Sleep);
    }
}
