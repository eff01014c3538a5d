//! Waiting for peers through shared memory with the engine's guarantees: abort, the deadline,
//! dead peers, failure notices and mismatched calls end a wait as they would in the engine.

use std::time::{Duration, Instant};

use oxccl_transport_shm::area::Area;

use super::Pace;
use crate::error::{Error, Result};
use crate::exec::backoff::{Backoff, Phase};
use crate::exec::descriptor::Descriptor;
use crate::exec::driver::Engine;
use crate::exec::op::OpName;
use crate::exec::outside::Look;
use crate::types::Rank;

/// Yield until this long before sleeping.
const YIELD: Duration = Duration::from_micros(100);
/// Look at the links this often while waiting.
pub(super) const CHECK_EVERY: Duration = Duration::from_millis(1);

/// Waiting for shared memory, with the engine's guarantees.
pub(super) struct Waiter<'a> {
    pub(super) engine: &'a mut Engine,
    area: &'a Area,
    pub(super) name: &'a OpName,
    pub(super) ours: &'a Descriptor,
    /// When this call first had to wait (the deadline runs from there; a call whose peers are
    /// all there already never reads the clock).
    started: Option<Instant>,
    pub(super) timeout: Duration,
    /// When the links were last looked at (from the first wait on).
    checked: Option<Instant>,
    rank: Rank,
    pace: Pace,
    /// The area turn this call is at (set as it takes each).
    pub(super) turn: u64,
}

impl<'a> Waiter<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        engine: &'a mut Engine,
        area: &'a Area,
        name: &'a OpName,
        ours: &'a Descriptor,
        (timeout, pace): (Duration, Pace),
        rank: Rank,
    ) -> Waiter<'a> {
        Waiter {
            engine,
            area,
            name,
            ours,
            started: None,
            timeout,
            checked: None,
            rank,
            pace,
            turn: 0,
        }
    }

    /// `now`, starting the call's deadline at the first wait.
    fn waited(&mut self, now: Instant) -> Instant {
        if self.started.is_none() {
            self.started = Some(now);
            self.checked = Some(now);
            // A call of the one-turn lane is timed from here (its recorder entry has no
            // begin time until it waits).
            self.engine.recorder.waits();
        }
        now
    }

    /// Fails the communicator because of `e`, and says so in the area (peers that run ahead
    /// without waiting for this rank look there).
    pub(super) fn fail(&mut self, e: &Error) {
        let origin = match e {
            Error::PeerFailed { peer, .. } => *peer,
            _ => self.rank,
        };
        self.area.fail(origin);
        self.engine.fail_outside(e);
    }

    /// When the call times out.
    fn deadline(&self) -> Instant {
        self.started.unwrap_or_else(Instant::now) + self.timeout
    }

    /// Between parts of a direct all-reduce: fails if this rank was aborted or is past its
    /// deadline, if a rank gave up `turn`, or (every [`CHECK_EVERY`]) if a link says a peer
    /// failed.
    pub(super) fn check_running(&mut self, turn: u64) -> Result<()> {
        if let Some(peer) = self.area.abandoned(turn) {
            // Nothing more to touch: say so before looking for why (peers wait on it).
            self.area.leave();
            return Err(self.gave_up(peer, turn));
        }
        let now = self.waited(Instant::now());
        if let Some(e) = self.flag_error(now, None) {
            return Err(e);
        }
        if now - self.checked.unwrap_or(now) >= CHECK_EVERY {
            self.checked = Some(now);
            let area = self.area;
            // Nobody leaves a direct call before everybody finished it.
            self.engine
                .check_outside(self.name, self.ours, &mut |_, _| {
                    area.unfinished(turn).is_none()
                })?;
        }
        Ok(())
    }

    /// The error of a call that rank `peer` gave up, failing the communicator. The rank that
    /// gave up sent its failure notice first, so the links usually say what happened and to
    /// whom (a rank that died, say): that error wins.
    pub(super) fn gave_up(&mut self, peer: Rank, turn: u64) -> Error {
        let until = Instant::now() + Duration::from_millis(100);
        let area = self.area;
        loop {
            let settled = &mut |_, _| area.unfinished(turn).is_none();
            if let Err(e) = self.engine.check_outside(self.name, self.ours, settled) {
                return e;
            }
            if Instant::now() >= until {
                break;
            }
            std::thread::yield_now();
        }
        let e = Error::PeerFailed {
            rank: self.rank,
            peer,
            op: self.name.to_string(),
            cause: "it gave up this call (failed, timed out or aborted)".into(),
        };
        self.fail(&e);
        e
    }

    /// The error if abort() was called or the deadline passed (`blocker`: the rank waited
    /// for, if any); the caller fails the communicator with it.
    fn flag_error(&self, now: Instant, blocker: Option<Rank>) -> Option<Error> {
        if self.engine.flags.is_aborted() {
            return Some(Error::Aborted {
                rank: self.rank,
                op: self.name.to_string(),
                why: "abort() was called".into(),
            });
        }
        (now >= self.deadline()).then(|| Error::Timeout {
            rank: self.rank,
            op: self.name.to_string(),
            peer: blocker.filter(|&r| r != self.rank),
            after: self.timeout,
        })
    }

    /// Waits until `ready` gives a value; until then it names the rank it waits for. Spins
    /// first (the peer is usually running on another core), then yields (it may share ours),
    /// then sleeps on that rank's futex, waking at least every [`CHECK_EVERY`] to look at the
    /// links, the deadline and abort.
    pub(super) fn until<T>(
        &mut self,
        mut ready: impl FnMut() -> std::result::Result<T, Rank>,
    ) -> Result<T> {
        let mut spins = 0u32;
        let mut backoff = Backoff::new(self.pace.spin, YIELD);
        loop {
            let blocker = match ready() {
                Ok(v) => return Ok(v),
                Err(r) => r,
            };
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(self.pace.every) {
                std::hint::spin_loop();
                continue;
            }
            let now = self.waited(Instant::now());
            let phase = backoff.phase(now);
            if let Some(e) = self.flag_error(now, Some(blocker)) {
                self.fail(&e);
                return Err(e);
            }
            if now - self.checked.unwrap_or(now) >= CHECK_EVERY {
                self.checked = Some(now);
                let (area, turn) = (self.area, self.turn);
                let tag = oxccl_transport_shm::area::tag(&self.ours.encode());
                // A peer that published this turn as we did has finished what it does in this
                // call before its next one (it may read nothing from the rank we wait for). One
                // that is gone has failed us only if what we wait for is still not there.
                let mut settled = |peer, look| {
                    ready().is_ok()
                        || look == Look::Ahead
                            && area
                                .observe(peer, turn)
                                .is_ok_and(|p| p.is_some_and(|p| p.tag == tag))
                };
                self.engine
                    .check_outside(self.name, self.ours, &mut settled)?;
            }
            match phase {
                // Still spinning: straight back to looking (the counter above paces it).
                Phase::Spin => {}
                Phase::Yield => std::thread::yield_now(),
                Phase::Sleep => {
                    self.engine.recorder.waiting(Some(blocker), None);
                    let nap = CHECK_EVERY.min(self.deadline().saturating_duration_since(now));
                    self.area.sleep_on(blocker, nap, || ready().is_ok());
                }
            }
        }
    }
}
