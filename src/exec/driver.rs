//! The I/O loop: runs operations — collectives compiled to schedules, and groups of
//! point-to-point messages — over the communicator's links. It posts what [`Progress`] says is
//! ready, polls links for completions, reduces lent messages straight out of transport memory,
//! and enforces the deadline, aborts and peer failures.
//!
//! # Threading model
//!
//! The [`Engine`] lives behind the communicator's mutex; whoever holds the lock drives progress
//! for every queued operation, in order. A blocking call drives its own operation on the calling
//! thread (no hand-off, so no wake-up latency); asynchronous operations are driven by a
//! background thread, or by whoever waits on them. Operations run one at a time in submission
//! order, so the messages of consecutive collectives never interleave on a link — except
//! point-to-point operations queued one after another, which run together as one batch
//! (`batch`: each message carries its own descriptor, so they pair per peer and direction
//! whatever the groups).
//!
//! # Waiting
//!
//! When nothing moves, the loop spins (latency), then — only where ranks may share cores —
//! yields, then blocks in `poll(2)` on the links' descriptors and the abort waker, never past
//! the operation's deadline (the escalation is [`Backoff`]'s, shared with the group area; the
//! durations are the engine's [`Pace`]).
//!
//! # Failure
//!
//! Any failure — timeout, dead or misbehaving peer, mismatched call, abort — fails the running
//! operation with an error naming this rank, the peer and the operation, sends a control notice
//! to every peer (so they fail fast too), then closes and drops every link: no transport can
//! touch user memory after that, and every later operation fails at once with `Aborted`. The
//! notice's bytes are [`notice`]'s; what the group area uses of this engine while it runs a
//! collective outside this loop is in `outside`.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_transport::{Completion, Link, RecvBuf, RecvInto, SendBuf, Token, TransportError};

use super::area::AreaPath;
use super::backoff::{Backoff, Phase};
use super::batch::{Batch, Post};
use super::descriptor::{self, Descriptor};
use super::flags::Flags;
use super::notice;
use super::op::{OpName, OpResult, Operation, Work};
use super::progress::{Action, Progress};
use crate::algo::{Buffer, Op, Plan, Region};
use crate::error::{Error, Result};
use crate::reduce::cpu;
use crate::reduce::shared::Shared;
use crate::trace::Recorder;
use crate::tune::Way;
use crate::types::{DataType, Rank};

/// How the loop waits while nothing moves: spin, then yield until `sleep`, then block.
#[derive(Clone, Copy, Debug)]
struct Pace {
    spin: Duration,
    sleep: Duration,
}

/// Where ranks may wait for each other's cores ([`crate::topo::Topology::crowded`]): spin
/// briefly, then yield, handing the core to the rank awaited. Short, because yielding costs
/// little where the awaited rank has a core of its own (it keeps polling through
/// `sched_yield`) and a lot where it shares ours: measured 2026-11-25, 2 µs against 20 µs took
/// 8-byte all-reduces on 2 simulated hosts × 2 ranks (4 ranks on the 2 cores) from 73–81 µs
/// to 29 µs — allreduce-perf under tools/sim-hosts/hosts.sh. On 4 ranks over TCP on the 2
/// cores, 8 B and 128 B: 38–47 µs against 58–61 going straight to `poll` after the spin, and
/// 220–235 spinning 100 µs (2026-11-27).
const CROWDED: Pace = Pace {
    spin: Duration::from_micros(2),
    sleep: Duration::from_millis(2),
};
/// Where every rank has a core to itself: spin, then block, never yield. A yield hands the
/// core to whatever else wants it for a time slice, and a rank waiting on a peer with a core of
/// its own only loses by that: with a `yes` hog on each of the 2 cores, 2 ranks over TCP took
/// 0.6–2.0 ms per 8-byte all-reduce spinning 2 µs and yielding, 15–21 µs spinning 100 µs then
/// blocking in `poll` (woken, the rank gets its core back ahead of the hog), and 20–22 µs
/// blocking after 2 µs; with nothing else running, 7–9 µs either way at 8 B, where blocking
/// after 2 µs took 11.5 µs at 128 B and 16–17 at 2 KiB (`allreduce-perf --ranks 2 --transport
/// tcp -b 8 -e 1M -f 16`, 2026-11-27).
const ROOMY: Pace = Pace {
    spin: Duration::from_micros(100),
    sleep: Duration::from_micros(100),
};
/// How often a running schedule looks at the links it does not use for a peer in another
/// collective ([`Engine::look_beside`]), from its start.
const LOOK_BESIDE: Duration = Duration::from_millis(2);
/// Longest single block, so aborts and deadlines are noticed even without a waker.
const MAX_BLOCK: Duration = Duration::from_millis(50);
/// Longest a failing rank keeps pushing its failure notices out to peers that do not take
/// them (the notices of peers that do leave at once).
const NOTICE_FLUSH: Duration = Duration::from_secs(2);

/// Token layout: serial (24 bits) | kind (8) | index (32).
const KIND_STEP: u64 = 0;
const KIND_DESC_SEND: u64 = 1;
const KIND_DESC_RECV: u64 = 2;
const KIND_MESSAGE: u64 = 3;
const KIND_P2P_DESC: u64 = 4;

/// The token of a post for point-to-point message `id` of the batch numbered `serial`.
pub(super) fn p2p_token(serial: u64, post: Post, id: u64) -> Token {
    let kind = match post {
        Post::Descriptor => KIND_P2P_DESC,
        Post::Slice => KIND_MESSAGE,
    };
    token(serial, kind, (id & 0xFFFF_FFFF) as usize)
}

fn token(serial: u64, kind: u64, index: usize) -> Token {
    ((serial & 0xFF_FFFF) << 40) | (kind << 32) | index as u64
}

fn split_token(t: Token) -> (u64, u64, usize) {
    (t >> 40, (t >> 32) & 0xFF, (t & 0xFFFF_FFFF) as usize)
}

/// The running operation's state.
struct Running {
    op: Operation,
    serial: u64,
    deadline: Instant,
    started: Instant,
    progress: Option<Progress>,
    /// Descriptors: ours per peer and theirs as received. The vectors are sized before any
    /// is posted and never grow, so their elements' addresses stay put for zero-copy sends.
    desc_out: Vec<(Rank, [u8; descriptor::LEN])>,
    desc_in: Vec<(Rank, [u8; descriptor::LEN], bool)>,
    /// Completions still expected outside the schedule: descriptor sends and receives.
    outstanding: usize,
    /// When [`Engine::look_beside`] next looks at the links the schedule does not use.
    next_look: Instant,
}

impl Running {
    /// The peer this operation waits for: the first whose descriptor has not come, else the
    /// first its schedule still expects a message from.
    fn waited_for(&self) -> Option<Rank> {
        self.desc_in
            .iter()
            .find(|(_, _, got)| !got)
            .map(|(p, _, _)| *p)
            .or_else(|| self.progress.as_ref().and_then(|p| p.waiting_for().next()))
    }
}

/// The per-communicator executor. See the module docs.
pub struct Engine {
    pub(super) rank: Rank,
    pub(super) links: Vec<Option<Box<dyn Link>>>,
    /// Per peer, why its link is gone (an error seen while no operation needed it).
    dead: Vec<Option<String>>,
    queue: VecDeque<Operation>,
    running: Option<Running>,
    /// The running point-to-point operations (never while `running` is).
    batch: Option<Batch>,
    /// The last batch, done, kept for its memory.
    spare: Option<Batch>,
    serial: u64,
    scratch: Vec<u64>,
    completions: Vec<(Rank, Completion)>,
    pub(super) polled: Vec<Completion>,
    broken: Option<String>,
    /// The rank at the root of the failure once `broken` (this one, or a peer).
    broken_by: Rank,
    timeout: Duration,
    pub(super) flags: Arc<Flags>,
    passes: u64,
    /// Reused list of what to wait on when blocking.
    readiness: Vec<oxccl_transport::Readiness>,
    /// The shared group area, when every peer is on this host over shared memory.
    area: Option<Arc<AreaPath>>,
    /// Turns of the area used so far (collectives on links do not use it).
    area_turns: u64,
    /// The communicator's flight recorder.
    pub(super) recorder: Arc<Recorder>,
    /// How the loop waits.
    pace: Pace,
}

impl Engine {
    /// An engine for `rank` over `links` (indexed by peer rank; `None` for this rank).
    pub fn new(
        rank: Rank,
        links: Vec<Option<Box<dyn Link>>>,
        timeout: Duration,
        flags: Arc<Flags>,
    ) -> Engine {
        Engine {
            rank,
            dead: vec![None; links.len()],
            links,
            queue: VecDeque::new(),
            running: None,
            batch: None,
            spare: None,
            serial: 0,
            scratch: Vec::new(),
            completions: Vec::new(),
            polled: Vec::new(),
            broken: None,
            broken_by: rank,
            timeout,
            flags,
            passes: 0,
            readiness: Vec::new(),
            area: None,
            area_turns: 0,
            recorder: Recorder::off(rank),
            pace: CROWDED,
        }
    }

    /// The same engine pacing its waits for ranks that may wait for each other's cores
    /// (`crowded`, as new engines do) or that each have one.
    pub fn crowded(self, crowded: bool) -> Engine {
        Engine {
            pace: if crowded { CROWDED } else { ROOMY },
            ..self
        }
    }

    /// The same engine recording its operations in `recorder`.
    pub fn with_recorder(self, recorder: Arc<Recorder>) -> Engine {
        Engine { recorder, ..self }
    }

    /// The same engine running area operations over `area`.
    pub fn with_area(self, area: Option<AreaPath>) -> Engine {
        Engine {
            area: area.map(Arc::new),
            ..self
        }
    }

    /// Largest message every link carries (the slice size must not exceed it).
    pub fn max_message(&self) -> usize {
        self.links
            .iter()
            .flatten()
            .map(|l| l.max_message())
            .min()
            .unwrap_or(usize::MAX)
    }

    /// Registers `len` bytes at `ptr` under `id` with every link, for sends from that memory
    /// without a copy where the transport can (rdma); undone on every link if one fails.
    ///
    /// # Safety
    ///
    /// The memory stays mapped and readable until [`Engine::deregister`] of `id` returns or
    /// the engine is dropped.
    pub unsafe fn register(&mut self, id: u64, ptr: *const u8, len: usize) -> Result<()> {
        let mut failed = None;
        for link in self.links.iter_mut().flatten() {
            // SAFETY: the caller's promise, passed on.
            if let Err(e) = unsafe { link.register(id, ptr, len) } {
                failed = Some((link.peer(), e));
                break;
            }
        }
        let Some((peer, source)) = failed else {
            return Ok(());
        };
        self.deregister(id);
        Err(Error::Transport {
            rank: self.rank,
            what: format!("register {len} bytes at {ptr:p} for the link to rank {peer}"),
            source,
        })
    }

    /// Ends registration `id` on every link; on return no link reads that memory.
    pub fn deregister(&mut self, id: u64) {
        for link in self.links.iter_mut().flatten() {
            link.deregister(id);
        }
    }

    /// Queues an operation. If the communicator is already broken it fails at once.
    pub fn submit(&mut self, op: Operation) {
        if let Some(why) = &self.broken {
            let e = Error::Aborted {
                rank: self.rank,
                op: op.name.to_string(),
                why: why.clone(),
            };
            op.settle(&self.recorder, Err(e));
            return;
        }
        self.queue.push_back(op);
    }

    /// Whether operations are queued or running.
    pub fn busy(&self) -> bool {
        self.running.is_some() || self.batch.is_some() || !self.queue.is_empty()
    }

    /// Drives until `result` is set or another thread waits for the communicator's lock
    /// ([`Flags::want`]: to queue an operation, which `result`'s may need, as a send may need
    /// this rank's next receive).
    pub fn drive_until(&mut self, result: &OpResult) {
        let mut backoff = Backoff::new(self.pace.spin, self.pace.sleep);
        while !result.is_done() && !self.flags.wanted() {
            if self.pass() {
                backoff.reset();
                continue;
            }
            self.idle(&mut backoff);
        }
    }

    /// Drives until nothing is queued or running, `budget` has passed, or another thread
    /// waits for the communicator's lock (to queue an operation: a send's peer may wait for
    /// this rank's next receive).
    pub fn drive_for(&mut self, budget: Duration) {
        let end = Instant::now() + budget;
        let mut backoff = Backoff::new(self.pace.spin, self.pace.sleep);
        // At least one pass, even with no budget (`is_completed`'s help).
        while self.busy() && !self.flags.wanted() {
            if self.pass() {
                backoff.reset();
            } else if Instant::now() < end {
                self.idle(&mut backoff);
            }
            if Instant::now() >= end {
                break;
            }
        }
    }

    /// Backs off after a pass that moved nothing: spin, then yield, then block.
    fn idle(&mut self, backoff: &mut Backoff) {
        let now = Instant::now();
        match backoff.phase(now) {
            Phase::Spin => std::hint::spin_loop(),
            Phase::Yield => std::thread::yield_now(),
            Phase::Sleep => {
                if let Some(r) = &self.running {
                    let peer = r.waited_for();
                    let step = r.progress.as_ref().map_or(0, Progress::done_steps);
                    self.recorder.waiting(peer, Some(step as u64));
                } else if let Some(b) = &self.batch {
                    self.recorder.waiting(b.waited_for(), None);
                }
                let until = self
                    .running
                    .as_ref()
                    .map(|r| r.deadline)
                    .or_else(|| self.batch.as_ref().and_then(Batch::deadline))
                    .unwrap_or(now + MAX_BLOCK);
                self.block(until.saturating_duration_since(now).min(MAX_BLOCK));
            }
        }
    }

    /// Blocks until a link may have progressed, the waker fires, or `timeout` passes.
    fn block(&mut self, timeout: Duration) {
        let mut ready = std::mem::take(&mut self.readiness);
        ready.clear();
        let mut waitable = true;
        for link in self.links.iter().flatten() {
            waitable &= link.readiness(&mut ready);
        }
        if !waitable || ready.is_empty() {
            self.readiness = ready;
            std::thread::sleep(timeout.min(Duration::from_micros(200)));
            return;
        }
        // Announce the sleep to transports that need it; any that finds work already there
        // cancels the sleep.
        let mut armed = 0;
        let mut sleep = true;
        for link in self.links.iter_mut().flatten() {
            armed += 1;
            if !link.arm() {
                sleep = false;
                break;
            }
        }
        if sleep {
            let mut fds: Vec<(BorrowedFd<'_>, rustix::event::PollFlags)> = ready
                .iter()
                .map(|r| {
                    let mut flags = rustix::event::PollFlags::empty();
                    if r.read {
                        flags |= rustix::event::PollFlags::IN;
                    }
                    if r.write {
                        flags |= rustix::event::PollFlags::OUT;
                    }
                    // SAFETY: the descriptor belongs to a link we hold, which stays open while
                    // we poll it (links are only dropped by this engine, not during this call).
                    (unsafe { BorrowedFd::borrow_raw(r.fd) }, flags)
                })
                .collect();
            if let Some(w) = self.flags.waker() {
                fds.push((w, rustix::event::PollFlags::IN));
            }
            let mut pollfds: Vec<rustix::event::PollFd<'_>> = fds
                .iter()
                .map(|(fd, f)| rustix::event::PollFd::new(fd, *f))
                .collect();
            let ts = rustix::event::Timespec {
                tv_sec: timeout.as_secs() as i64,
                tv_nsec: timeout.subsec_nanos() as i64,
            };
            let _ = rustix::event::poll(&mut pollfds, Some(&ts));
            // The waker (last) woke us: empty it, unless it says abort (see `Flags::want`).
            let woken = self.flags.waker().is_some()
                && pollfds
                    .last()
                    .is_some_and(|p| p.revents().contains(rustix::event::PollFlags::IN));
            drop(pollfds);
            drop(fds);
            if woken {
                self.flags.drain_waker();
            }
        }
        for link in self.links.iter_mut().flatten().take(armed) {
            link.disarm();
        }
        self.readiness = ready;
    }

    /// One pass: start the next operation, act on what is ready, poll links, check deadline and
    /// abort. Returns whether anything happened.
    fn pass(&mut self) -> bool {
        self.passes += 1;
        if self.flags.is_aborted() && self.broken.is_none() {
            let why = "abort() was called".to_string();
            self.fail(None, why.clone(), Some((self.rank, why)));
            return true;
        }
        if self.broken.is_none()
            && let Some((peer, cause)) = self.flags.lost()
        {
            let op = match (&self.running, self.queue.front()) {
                (Some(r), _) => r.op.name.to_string(),
                (None, _) if let Some(op) = self.batch.as_ref().and_then(Batch::head) => {
                    op.name.to_string()
                }
                (None, Some(op)) => op.name.to_string(),
                (None, None) => return false,
            };
            self.fail_with(Error::PeerFailed {
                rank: self.rank,
                peer,
                op,
                cause,
            });
            return true;
        }
        let mut moved = false;
        if self.running.is_none() {
            // Point-to-point operations join the running batch (or start one) while they are
            // next; anything else waits for the batch to end.
            while self.broken.is_none()
                && self
                    .queue
                    .front()
                    .is_some_and(|op| matches!(op.work, Work::PointToPoint { .. }))
            {
                let op = self.queue.pop_front().expect("looked");
                self.join(op);
                moved = true;
            }
            if self.batch.is_none() && !moved {
                let Some(op) = self.queue.pop_front() else {
                    return false;
                };
                if matches!(op.work, Work::Area { .. }) {
                    self.run_area(op);
                    return true;
                }
                self.start(op);
                moved = true;
            }
        }
        moved |= self.act();
        moved |= self.poll_links();
        if let Some(b) = &self.batch {
            if b.is_empty() {
                self.spare = self.batch.take();
                return true;
            }
            if let Some(deadline) = b.deadline()
                && Instant::now() >= deadline
            {
                let e = Error::Timeout {
                    rank: self.rank,
                    op: b.head().map_or_else(String::new, |op| op.name.to_string()),
                    peer: b.waited_for(),
                    after: self.timeout,
                };
                self.fail_with(e);
                return true;
            }
        }
        if let Some(r) = &self.running {
            let done = r.outstanding == 0 && r.progress.as_ref().is_none_or(|p| p.is_done());
            if done {
                let r = self.running.take().expect("checked");
                r.op.settle(&self.recorder, Ok(()));
                return true;
            }
            let now = Instant::now();
            if now >= r.deadline {
                let peer = r.waited_for();
                let e = Error::Timeout {
                    rank: self.rank,
                    op: r.op.name.to_string(),
                    peer,
                    after: self.timeout,
                };
                self.fail_with(e);
                return true;
            }
            if let Some(e) = self.look_beside(now) {
                self.fail_with(e);
                return true;
            }
        }
        moved
    }

    /// While a schedule runs (every [`LOOK_BESIDE`] from its start), looks at the links it does
    /// not use: a peer whose oldest unread message there is the descriptor of a collective with
    /// this one's sequence number, and not this one, called another collective here (ranks
    /// whose schedules for one call talk to different peers never read each other's
    /// descriptor: every rank waited out its deadline, 300 s by default, and was told of a
    /// timeout). A peer's descriptor of a later collective is a peer rightly ahead, left there.
    fn look_beside(&mut self, now: Instant) -> Option<Error> {
        let r = self.running.as_mut()?;
        if now < r.next_look {
            return None;
        }
        r.next_look = now + LOOK_BESIDE;
        let Work::Schedule { descriptor, .. } = &r.op.work else {
            return None;
        };
        let ours = *descriptor;
        let Descriptor::Collective { seq, .. } = ours else {
            return None;
        };
        for peer in 0..self.links.len() {
            if peer == self.rank || r.desc_in.iter().any(|d| d.0 == peer) {
                continue;
            }
            let Some(link) = self.links[peer].as_mut() else {
                continue;
            };
            let mut b = [0u8; descriptor::LEN];
            if link.peek(&mut b) != descriptor::LEN {
                continue;
            }
            let theirs = match Descriptor::decode(&b) {
                Some(d @ Descriptor::Collective { seq: s, .. }) if s == seq => d,
                _ => continue,
            };
            if ours.matches(&theirs) {
                continue;
            }
            let _ = link.post_control(&notice::mismatch(&ours, &theirs.to_string()));
            return Some(Error::Mismatch {
                rank: self.rank,
                peer,
                op: r.op.name.to_string(),
                ours: ours.to_string(),
                theirs: theirs.to_string(),
            });
        }
        None
    }

    /// Runs an area operation to its end: the area waits on shared memory, watching links,
    /// abort and the deadline through this engine.
    fn run_area(&mut self, op: Operation) {
        let Work::Area { plan, way, seq } = op.work else {
            return;
        };
        self.recorder.start(op.mark);
        let r = self.area_op(&op.name, (plan, way, seq), op.input, op.output);
        op.settle(&self.recorder, r);
    }

    /// Whether `plan`, sent `way`, is a call of the area's one-turn lane ([`AreaPath::small`]).
    #[inline]
    pub fn lane(&self, plan: &Plan, way: Way) -> bool {
        self.area.as_ref().is_some_and(|a| a.small(plan, way))
    }

    /// Runs area call `seq` now, on the calling thread, when nothing is queued or running
    /// (the blocking form's path: no queue, no result slot); `lane`: [`Engine::lane`] says it
    /// is a call of the one-turn lane. `Ok(true)`: it ran in that lane.
    #[inline]
    pub fn run_area_now(
        &mut self,
        (plan, way, seq): (Plan, Way, u64),
        lane: bool,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<bool> {
        if lane && let Some(r) = self.run_area_small((plan, way, seq), input, output) {
            return r.map(|()| true);
        }
        let name = OpName::Collective(plan.collective, seq);
        if self.busy() {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {name} cannot run ahead of queued operations",
                self.rank
            )));
        }
        if self.flags.is_aborted() {
            self.abort_now();
        }
        if let Some(why) = &self.broken {
            return Err(Error::Aborted {
                rank: self.rank,
                op: name.to_string(),
                why: why.clone(),
            });
        }
        self.area_op(&name, (plan, way, seq), input, output)
            .map(|()| false)
    }

    /// A call of the area's one-turn lane ([`AreaPath::small`]: the caller looked), run
    /// without the layers; `None` (nothing done) where anything would make it fail (the
    /// general path says how).
    #[inline]
    fn run_area_small(
        &mut self,
        (plan, way, seq): (Plan, Way, u64),
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Option<Result<()>> {
        if self.busy()
            || self.flags.is_aborted()
            || self.broken.is_some()
            || self.dead.iter().any(Option::is_some)
            || self.flags.any_lost()
        {
            return None;
        }
        // Taken out for the call (the path drives this engine) and put back after.
        let area = self.area.take()?;
        let mut turns = self.area_turns;
        let timeout = self.timeout;
        let r = area.run_small(
            self,
            (seq, &mut turns),
            (&plan, way),
            (input, output),
            timeout,
        );
        self.area_turns = turns;
        if self.broken.is_some() {
            area.fail(self.broken_by);
        }
        self.area = Some(area);
        Some(r)
    }

    fn area_op(
        &mut self,
        name: &OpName,
        (plan, way, seq): (Plan, Way, u64),
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<()> {
        // Taken out for the call (the path drives this engine) and put back after: no
        // reference count to touch on every call.
        let Some(area) = self.area.take() else {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {name} was routed through a shared area this communicator does not have",
                self.rank
            )));
        };
        let r = match self.first_dead() {
            Some((peer, cause)) => {
                let e = Error::PeerFailed {
                    rank: self.rank,
                    peer,
                    op: name.to_string(),
                    cause,
                };
                self.fail_outside(&e);
                Err(e)
            }
            None => {
                let mut turns = self.area_turns;
                let timeout = self.timeout;
                let r = area.run(
                    self,
                    (seq, &mut turns),
                    (&plan, way),
                    input,
                    output,
                    timeout,
                );
                self.area_turns = turns;
                r
            }
        };
        if self.broken.is_some() {
            area.fail(self.broken_by);
        }
        self.area = Some(area);
        r
    }

    /// A peer whose link was lost while idle, and why.
    fn first_dead(&self) -> Option<(Rank, String)> {
        self.dead
            .iter()
            .enumerate()
            .find_map(|(p, w)| w.clone().map(|w| (p, w)))
            .or_else(|| self.flags.lost())
    }

    /// Acts on `abort()` now, from the aborting thread when nobody drives: fails what is
    /// queued and tells every peer.
    pub fn abort_now(&mut self) {
        if self.broken.is_none() {
            let why = "abort() was called".to_string();
            self.fail(None, why.clone(), Some((self.rank, why)));
        }
    }

    /// Adds point-to-point operation `op` to the running batch, or starts one: posts what
    /// the windows of its peers and directions have room for (each completion posts more).
    fn join(&mut self, op: Operation) {
        if let Work::PointToPoint { messages, .. } = &op.work {
            let peers = || messages.iter().map(|m| m.peer);
            if let Some((peer, why)) =
                peers().find_map(|p| self.dead.get(p)?.clone().map(|w| (p, w)))
            {
                let e = Error::PeerFailed {
                    rank: self.rank,
                    peer,
                    op: op.name.to_string(),
                    cause: why,
                };
                self.queue.push_front(op);
                self.fail_with(e);
                return;
            }
            if let Some(peer) = peers().find(|&p| self.links.get(p).is_none_or(Option::is_none)) {
                let e = Error::InvalidArgument(format!(
                    "rank {}: {} names rank {peer}, which has no link",
                    self.rank, op.name
                ));
                op.settle(&self.recorder, Err(e));
                return;
            }
        }
        self.recorder.start(op.mark);
        if self.batch.is_none() {
            self.serial = self.serial.wrapping_add(1);
            let slice = match &op.work {
                Work::PointToPoint { slice, .. } => *slice,
                _ => 1,
            };
            let serial = self.serial;
            self.batch = Some(match self.spare.take() {
                Some(b) => b.reuse(serial, slice),
                None => Batch::new(serial, slice),
            });
        }
        let batch = self.batch.as_mut().expect("made above");
        batch.join(op, self.timeout, &self.recorder);
        if batch.is_empty() {
            self.spare = self.batch.take();
            return;
        }
        for i in 0.. {
            let Some(&lane) = self.batch.as_ref().and_then(|b| b.joined.get(i)) else {
                break;
            };
            if let Err((peer, e)) = self.feed(lane) {
                self.link_failed(peer, e);
                return;
            }
        }
    }

    /// Posts what the batch's `lane` has room for on its link.
    fn feed(&mut self, lane: usize) -> std::result::Result<(), (Rank, TransportError)> {
        let Some(batch) = self.batch.as_mut() else {
            return Ok(());
        };
        let peer = batch.lane_peer(lane);
        let Some(link) = self.links.get_mut(peer).and_then(Option::as_mut) else {
            return Ok(());
        };
        batch.feed(lane, link.as_mut()).map_err(|e| (peer, e))
    }

    /// Starts `op`: binds scratch, posts descriptors.
    fn start(&mut self, op: Operation) {
        self.recorder.start(op.mark);
        self.serial = self.serial.wrapping_add(1);
        let serial = self.serial;
        let now = Instant::now();
        let mut running = Running {
            serial,
            deadline: now + self.timeout,
            started: now,
            progress: None,
            desc_out: Vec::new(),
            desc_in: Vec::new(),
            outstanding: 0,
            next_look: now + LOOK_BESIDE,
            op,
        };
        let (peers, descs): (Vec<Rank>, Vec<Descriptor>) = match &running.op.work {
            Work::Schedule {
                schedule,
                descriptor,
                ..
            } => {
                let words = schedule.schedule().scratch_len().div_ceil(8);
                if self.scratch.len() < words {
                    self.scratch.resize(words, 0);
                }
                running.progress = Some(Progress::new(schedule.clone()));
                let peers = schedule.peers().to_vec();
                let descs = vec![*descriptor; peers.len()];
                (peers, descs)
            }
            Work::PointToPoint { .. } | Work::Area { .. } => {
                // `pass` hands area operations to `run_area` and point-to-point ones to `join`;
                // never started here.
                let e = Error::InvalidArgument(format!(
                    "rank {}: {} cannot run on links",
                    self.rank, running.op.name
                ));
                running.op.settle(&self.recorder, Err(e));
                return;
            }
        };
        if let Some((peer, why)) = peers
            .iter()
            .find_map(|&p| self.dead.get(p)?.clone().map(|w| (p, w)))
        {
            let e = Error::PeerFailed {
                rank: self.rank,
                peer,
                op: running.op.name.to_string(),
                cause: why,
            };
            self.running = Some(running);
            self.fail_with(e);
            return;
        }
        running.desc_out = peers
            .iter()
            .zip(&descs)
            .map(|(&p, d)| (p, d.encode()))
            .collect();
        running.desc_in = peers
            .iter()
            .map(|&p| (p, [0u8; descriptor::LEN], false))
            .collect();
        for (i, &peer) in peers.iter().enumerate() {
            let out_ptr = running.desc_out[i].1.as_ptr();
            let in_ptr = running.desc_in[i].1.as_mut_ptr();
            let Some(link) = self.links.get_mut(peer).and_then(Option::as_mut) else {
                running.op.settle(
                    &self.recorder,
                    Err(Error::InvalidArgument(format!(
                        "rank {}: {} names rank {peer}, which has no link",
                        self.rank, running.op.name
                    ))),
                );
                return;
            };
            // SAFETY: the descriptor vectors live in `running`, unmoved and ungrown, until the
            // operation ends; links are cancelled before `running` is dropped when it fails.
            let r = unsafe {
                link.post_send(
                    token(serial, KIND_DESC_SEND, i),
                    SendBuf::new(out_ptr, descriptor::LEN),
                )
                .and_then(|()| {
                    link.post_recv(
                        token(serial, KIND_DESC_RECV, i),
                        RecvInto::Memory(RecvBuf::new(in_ptr, descriptor::LEN)),
                    )
                })
            };
            running.outstanding += 2;
            if let Err(e) = r {
                self.running = Some(running);
                self.link_failed(peer, e);
                return;
            }
        }
        self.running = Some(running);
    }

    /// Base pointer and length of a buffer of the running operation.
    fn buffer(&mut self, b: Buffer) -> (*mut u8, usize) {
        let r = self.running.as_ref().expect("called while running");
        match b {
            Buffer::Input => (r.op.input.0 as *mut u8, r.op.input.1),
            Buffer::Output => r.op.output,
            Buffer::Scratch => (self.scratch.as_mut_ptr() as *mut u8, self.scratch.len() * 8),
        }
    }

    /// A region's memory, or an error if it lies outside its buffer (a bug, never UB).
    fn region(&mut self, region: Region) -> Result<*mut u8> {
        if region.len == 0 {
            // Empty messages (barriers) and unused buffers have no memory: never hand out null.
            return Ok(std::ptr::NonNull::<u8>::dangling().as_ptr());
        }
        let (base, len) = self.buffer(region.buffer);
        if region.end() > len {
            return Err(Error::InvalidArgument(format!(
                "rank {}: schedule region {region:?} exceeds its buffer of {len} bytes",
                self.rank
            )));
        }
        // SAFETY: offset is within the buffer (checked above).
        Ok(unsafe { base.add(region.offset) })
    }

    /// Performs every action the running schedule has ready.
    fn act(&mut self) -> bool {
        let mut moved = false;
        loop {
            let Some(r) = self.running.as_mut() else {
                return moved;
            };
            let serial = r.serial;
            let Some(p) = r.progress.as_mut() else {
                return moved;
            };
            let Some(action) = p.poll_action() else {
                return moved;
            };
            moved = true;
            let outcome = match action {
                Action::Send { step, peer, src } => {
                    self.post_send(serial, step as usize, peer, src)
                }
                Action::Recv { step, peer, op } => self.post_recv(serial, step as usize, peer, op),
                Action::Local { step, op } => self.local(op).map(|()| {
                    if let Some(p) = self.running.as_mut().and_then(|r| r.progress.as_mut()) {
                        p.handle_done(step);
                    }
                }),
            };
            if let Err(e) = outcome {
                self.fail_with(e);
                return true;
            }
        }
    }

    fn post_send(&mut self, serial: u64, step: usize, peer: Rank, src: Region) -> Result<()> {
        let ptr = self.region(src)?;
        let Some(link) = self.links.get_mut(peer).and_then(Option::as_mut) else {
            return Err(self.no_link(peer));
        };
        // SAFETY: the region lies in memory the operation's submitter keeps valid, or in scratch,
        // which is not resized while an operation runs; the schedule orders writes to it after
        // this send completes.
        let r =
            unsafe { link.post_send(token(serial, KIND_STEP, step), SendBuf::new(ptr, src.len)) };
        r.map_err(|e| self.transport_error(peer, e))
    }

    fn post_recv(&mut self, serial: u64, step: usize, peer: Rank, op: Op) -> Result<()> {
        let into = match op {
            Op::Recv { dst, .. } => {
                let ptr = self.region(dst)?;
                // SAFETY: as for sends; the schedule gives this step exclusive use of `dst`.
                RecvInto::Memory(unsafe { RecvBuf::new(ptr, dst.len) })
            }
            Op::RecvReduce { dst, .. } => RecvInto::Lend { len: dst.len },
            _ => unreachable!("progress offers receives only for receive steps"),
        };
        let Some(link) = self.links.get_mut(peer).and_then(Option::as_mut) else {
            return Err(self.no_link(peer));
        };
        // SAFETY: see above.
        let r = unsafe { link.post_recv(token(serial, KIND_STEP, step), into) };
        r.map_err(|e| self.transport_error(peer, e))
    }

    /// Runs a local step.
    fn local(&mut self, op: Op) -> Result<()> {
        let dtype = self.dtype();
        match op {
            Op::Copy { dst, src } => {
                let (d, s) = (self.region(dst)?, self.region(src)?);
                // SAFETY: both regions lie in their buffers (checked); schedules never copy
                // between overlapping regions.
                unsafe { std::ptr::copy(s, d, dst.len.min(src.len)) };
                Ok(())
            }
            Op::Reduce { dst, a, b, op } => {
                let (d, pa, pb) = (self.region(dst)?, self.region(a)?, self.region(b)?);
                // SAFETY: regions lie in their buffers and are equal or disjoint, so the slices
                // below never alias a mutable one.
                unsafe { combine(d, pa, pb, dst, a, b, dtype, op) }
            }
            Op::Divide { dst, by } => {
                let d = self.region(dst)?;
                // SAFETY: the region lies in its buffer and the schedule gives this step sole use.
                let out = unsafe { std::slice::from_raw_parts_mut(d, dst.len) };
                cpu::divide_bytes(out, dtype, by)
            }
            _ => unreachable!("progress offers only local steps here"),
        }
    }

    fn dtype(&self) -> DataType {
        match self.running.as_ref().map(|r| &r.op.work) {
            Some(Work::Schedule { dtype, .. }) => *dtype,
            _ => DataType::U8,
        }
    }

    /// Polls links (those of the running operation every pass, all of them now and then, to
    /// notice dead peers and notices early) and handles what completed.
    fn poll_links(&mut self) -> bool {
        self.completions.clear();
        let every =
            self.running.is_none() || self.passes.is_multiple_of(64) || self.links.len() <= 16;
        let mut failure: Option<(Rank, TransportError)> = None;
        for peer in 0..self.links.len() {
            if !every && !self.in_use(peer) {
                continue;
            }
            let Some(link) = self.links[peer].as_mut() else {
                continue;
            };
            self.polled.clear();
            let r = link.poll(&mut self.polled);
            self.completions
                .extend(self.polled.drain(..).map(|c| (peer, c)));
            if let Err(e) = r {
                failure = Some((peer, e));
                break;
            }
        }
        let moved = !self.completions.is_empty();
        let completions = std::mem::take(&mut self.completions);
        for (peer, c) in &completions {
            if self.broken.is_some() {
                break;
            }
            if let Err(e) = self.handle(*peer, c) {
                let finder = match c {
                    Completion::Control(_) => *peer,
                    _ => self.rank,
                };
                self.fail_found_by(finder, e);
            }
        }
        self.completions = completions;
        if let Some((peer, e)) = failure
            && self.broken.is_none()
        {
            if self.in_use(peer) {
                self.link_failed(peer, e);
            } else {
                // Nothing running needs this peer: remember why it is gone, so the next
                // operation that does fails at once, naming it.
                tracing::debug!(rank = self.rank, peer, "link lost while idle: {e}");
                self.dead[peer] = Some(e.to_string());
                self.links[peer] = None;
            }
            return true;
        }
        moved
    }

    fn in_use(&self, peer: Rank) -> bool {
        self.running
            .as_ref()
            .is_some_and(|r| r.desc_in.iter().any(|(p, _, _)| *p == peer))
            || self.batch.as_ref().is_some_and(|b| b.uses(peer))
    }

    /// Handles one completion from `peer`'s link.
    fn handle(&mut self, peer: Rank, c: &Completion) -> Result<()> {
        if let Completion::Control(bytes) = c {
            return Err(self.notice(peer, bytes));
        }
        let t = match c {
            Completion::Sent(t) | Completion::Received(t) => *t,
            Completion::Lent { token, .. } => *token,
            Completion::Control(_) => unreachable!("handled above"),
        };
        let (serial, kind, index) = split_token(t);
        let rank = self.rank;
        if kind == KIND_MESSAGE || kind == KIND_P2P_DESC {
            return self.handle_p2p(serial, kind, index);
        }
        let Some(r) = self.running.as_mut() else {
            return Ok(());
        };
        if serial != r.serial & 0xFF_FFFF {
            return Ok(()); // a completion of an earlier operation: cannot happen, ignore
        }
        match kind {
            KIND_DESC_SEND => r.outstanding -= 1,
            KIND_DESC_RECV => {
                r.outstanding -= 1;
                let (peer, buf, got) = &mut r.desc_in[index];
                *got = true;
                let ours = Descriptor::decode(&r.desc_out[index].1[..]).expect("we encoded it");
                match Descriptor::decode(&buf[..]) {
                    Some(theirs) if ours.matches(&theirs) => {}
                    theirs => {
                        let theirs = theirs
                            .map_or("something that is not an oxccl call".into(), |d| {
                                d.to_string()
                            });
                        let peer = *peer;
                        let e = Error::Mismatch {
                            rank,
                            peer,
                            op: r.op.name.to_string(),
                            ours: ours.to_string(),
                            theirs: theirs.clone(),
                        };
                        if let Some(link) = self.links.get_mut(peer).and_then(Option::as_mut) {
                            let _ = link.post_control(&notice::mismatch(&ours, &theirs));
                        }
                        return Err(e);
                    }
                }
            }
            KIND_STEP => {
                if let Completion::Lent { ptr, len, token } = c {
                    let token = *token;
                    let op = r.progress.as_ref().expect("schedule").schedule().steps()[index].op;
                    let Op::RecvReduce { dst, src, op, .. } = op else {
                        return Err(Error::InvalidArgument(format!(
                            "rank {rank}: lent message for a plain receive"
                        )));
                    };
                    let dtype = self.dtype();
                    let (d, s) = (self.region(dst)?, self.region(src)?);
                    // SAFETY: `ptr..ptr+len` is the link's lent memory, valid until release
                    // (shared memory a peer may write, for shm: read through copies only); dst
                    // and src lie in their buffers and are equal or disjoint; the message memory
                    // is the transport's and overlaps neither.
                    let r =
                        unsafe { combine_lent(d, s, Shared::new(*ptr, *len), dst, src, dtype, op) };
                    if let Some(link) = self.links.get_mut(peer).and_then(Option::as_mut) {
                        link.release(token);
                    }
                    r?;
                }
                if let Some(p) = self.running.as_mut().and_then(|r| r.progress.as_mut()) {
                    p.handle_done(index as u32);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Handles the completion of a point-to-point post.
    fn handle_p2p(&mut self, serial: u64, kind: u64, index: usize) -> Result<()> {
        let rank = self.rank;
        let Some(b) = self.batch.as_mut() else {
            return Ok(());
        };
        if serial != b.serial & 0xFF_FFFF {
            return Ok(()); // an earlier batch's: cannot happen, ignore
        }
        let post = if kind == KIND_P2P_DESC {
            Post::Descriptor
        } else {
            Post::Slice
        };
        match b.complete(post, index as u32, &self.recorder) {
            Ok(Some(_)) if b.is_empty() => {
                // Gone as soon as done, so that the next call finds the engine idle (an area
                // collective then runs on the caller's thread, unqueued).
                self.spare = self.batch.take();
                Ok(())
            }
            Ok(Some(lane)) => self
                .feed(lane)
                .map_err(|(peer, e)| self.transport_error(peer, e)),
            Ok(None) => Ok(()),
            Err(m) => {
                if let Some(link) = self.links.get_mut(m.peer).and_then(Option::as_mut) {
                    let _ = link.post_control(&notice::mismatch(&m.ours, &m.theirs));
                }
                Err(Error::Mismatch {
                    rank,
                    peer: m.peer,
                    op: m.op,
                    ours: m.ours.to_string(),
                    theirs: m.theirs,
                })
            }
        }
    }

    /// The error a peer's control notice stands for.
    fn notice(&self, peer: Rank, bytes: &[u8]) -> Error {
        let op = self
            .running
            .as_ref()
            .map(|r| r.op.name.to_string())
            .or_else(|| self.batch.as_ref()?.name_for(peer))
            .unwrap_or_else(|| "the next operation".into());
        let ours = self
            .running
            .as_ref()
            .and_then(|r| r.desc_out.first())
            .and_then(|(_, d)| Descriptor::decode(&d[..]))
            .or_else(|| self.batch.as_ref().and_then(Batch::first_descriptor));
        let ours = ours.map_or("nothing".into(), |d| d.to_string());
        notice::decode(bytes, (self.rank, self.links.len()), peer, op, ours)
    }

    fn no_link(&self, peer: Rank) -> Error {
        Error::InvalidArgument(format!("rank {}: no link to rank {peer}", self.rank))
    }

    fn transport_error(&self, peer: Rank, e: TransportError) -> Error {
        let op = self
            .running
            .as_ref()
            .map(|r| r.op.name.to_string())
            .or_else(|| self.batch.as_ref()?.name_for(peer))
            .unwrap_or_else(|| "idle".into());
        Error::PeerFailed {
            rank: self.rank,
            peer,
            op,
            cause: e.to_string(),
        }
    }

    fn link_failed(&mut self, peer: Rank, e: TransportError) {
        let e = self.transport_error(peer, e);
        self.fail_with(e);
    }

    fn fail_with(&mut self, e: Error) {
        self.fail_found_by(self.rank, e);
    }

    /// Fails with `e`, which rank `finder` found (this rank, or a peer whose notice says it).
    /// The root of the failure is the failed peer `e` names, else `finder`: a peer that found
    /// a mismatch knows already, and this rank's own notice to it is not waited for (its
    /// socket may be full of data it will never read now).
    fn fail_found_by(&mut self, finder: Rank, e: Error) {
        let origin = match &e {
            Error::PeerFailed { peer, .. } => *peer,
            _ => finder,
        };
        let why = e.to_string();
        self.fail(Some(e), why.clone(), Some((origin, why)));
    }

    /// Fails the running operation (with `error`, or `Aborted` if none) and everything queued,
    /// and tells the peers (`notice`: the rank at the root of the failure and what happened).
    /// Links are cancelled, not closed: no transport touches operation memory any more, yet a
    /// notice still reaches peers, and they are not led to blame this rank for a failure it
    /// only saw. Connections close when the communicator is dropped.
    pub(super) fn fail(
        &mut self,
        error: Option<Error>,
        why: String,
        notice: Option<(Rank, String)>,
    ) {
        if self.broken.is_some() {
            return;
        }
        self.broken = Some(why.clone());
        // Peers that run ahead through the area without waiting for this rank look there (a
        // failure, not a shutdown: a rank that leaves after its last call has published all it
        // owes; `area_op` says it for failures during an area call, when the area is out).
        if let Some((origin, _)) = &notice {
            self.broken_by = *origin;
            if let Some(area) = &self.area {
                area.fail(*origin);
            }
        }
        for link in self.links.iter_mut().flatten() {
            link.cancel();
        }
        if let Some((origin, text)) = notice {
            let msg = notice::failed(self.rank, origin, &text);
            let mut sink = Vec::new();
            let mut pending: Vec<usize> = Vec::new();
            // Nor is the peer this rank timed out waiting for: it is not reading either (the
            // call returned up to NOTICE_FLUSH past its deadline where that peer's socket was
            // full).
            let silent = match &error {
                Some(Error::Timeout { peer: Some(p), .. }) => Some(*p),
                _ => None,
            };
            for (peer, link) in self.links.iter_mut().enumerate() {
                // The rank at the root of the failure (dead, stopped, unreachable) is told too
                // if its link takes it, but not waited for: a stopped peer whose socket is full
                // would hold this rank's error for the whole flush time.
                if let Some(link) = link
                    && link.post_control(&msg).is_ok()
                    && peer != origin
                    && Some(peer) != silent
                {
                    pending.push(peer);
                }
            }
            // Push the notices out: until every link has handed its notice to the medium (a
            // few microseconds: links were just cancelled, so nothing but the rest of a frame
            // is ahead of it) or failed. A peer that is gone or does not read cannot hold us
            // past NOTICE_FLUSH.
            let until = Instant::now() + NOTICE_FLUSH.min(self.timeout);
            loop {
                pending.retain(|&peer| {
                    let Some(link) = self.links[peer].as_mut() else {
                        return false;
                    };
                    sink.clear();
                    link.poll(&mut sink).is_ok() && link.control_pending()
                });
                if pending.is_empty() {
                    break;
                }
                if Instant::now() >= until {
                    tracing::warn!(
                        rank = self.rank,
                        ?pending,
                        "failure notice not taken by these ranks in time"
                    );
                    break;
                }
                std::thread::yield_now();
            }
            self.flags.set_told();
        }
        if let Some(e) = &error {
            // The call the error goes to is the running one, or else the first queued one
            // (below): the dump shows it as the failed call.
            if self.running.is_none()
                && self.batch.is_none()
                && let Some(op) = self.queue.front()
            {
                self.recorder.start(op.mark);
            }
            self.recorder.failed(e);
        }
        let mut error = error;
        if let Some(b) = self.batch.take() {
            error = b.fail(self.rank, error.take(), &why, &self.recorder);
        }
        if self.running.is_none()
            && let Some(e) = error.take()
            && let Some(op) = self.queue.pop_front()
        {
            op.settle(&self.recorder, Err(e));
        }
        if let Some(r) = self.running.take() {
            let e = error.unwrap_or_else(|| Error::Aborted {
                rank: self.rank,
                op: r.op.name.to_string(),
                why: why.clone(),
            });
            tracing::debug!(rank = self.rank, op = %r.op.name, after = ?r.started.elapsed(), "operation failed: {e}");
            r.op.settle(&self.recorder, Err(e));
        }
        for op in self.queue.drain(..) {
            op.settle(
                &self.recorder,
                Err(Error::Aborted {
                    rank: self.rank,
                    op: op.name.to_string(),
                    why: why.clone(),
                }),
            );
        }
    }

    /// Fails everything and closes every connection (the communicator is being dropped).
    pub fn shutdown(&mut self, why: &str) {
        // Peers that read from this rank's area may be up to the area's lag (`LAG`, or
        // `CROWDED_LAG`) turns behind it: they find what they need there whether or not this
        // rank is alive, but would take its closed links for a failure. So a rank that did not
        // fail leaves once every peer has reached its last turn (or died, failed, or the
        // timeout passed).
        if self.broken.is_none()
            && self.area_turns > 0
            && let Some(area) = &self.area
        {
            // A peer the heartbeat declared silent is not waited for either.
            let flags = &self.flags;
            area.settle(self.area_turns - 1, self.timeout, &|r| flags.has_lost(r));
        }
        self.fail(None, why.into(), None);
        for link in self.links.iter_mut().flatten() {
            link.close();
        }
        for l in self.links.iter_mut() {
            *l = None;
        }
    }
}

/// `dst = a ⊕ msg`, `msg` a lent message in the transport's memory (see [`combine`]).
///
/// # Safety
///
/// `d` and `a` valid for their regions' lengths, equal or disjoint, and disjoint from `msg`.
unsafe fn combine_lent(
    d: *mut u8,
    a: *mut u8,
    msg: Shared<'_>,
    dst: Region,
    ra: Region,
    dtype: DataType,
    op: crate::types::ReduceOp,
) -> Result<()> {
    let len = dst.len;
    if ra.len != len || msg.len() != len {
        return Err(Error::InvalidArgument(format!(
            "reduce operands differ in length ({len}, {}, {})",
            ra.len,
            msg.len()
        )));
    }
    // SAFETY: the caller guarantees validity; in place only `d` is formed, else `d` and `a`
    // are disjoint.
    unsafe {
        if std::ptr::eq(d, a) {
            cpu::reduce_shared(std::slice::from_raw_parts_mut(d, len), msg, dtype, op)
        } else {
            cpu::reduce_into_shared(
                std::slice::from_raw_parts_mut(d, len),
                std::slice::from_raw_parts(a, len),
                msg,
                dtype,
                op,
            )
        }
    }
}

/// `dst = a ⊕ b` over raw memory, where each of `a` and `b` is either exactly `dst` or disjoint
/// from it (and from each other unless equal).
///
/// # Safety
///
/// Every pointer must be valid for its region's length, with the aliasing just described.
#[allow(clippy::too_many_arguments)]
unsafe fn combine(
    d: *mut u8,
    a: *mut u8,
    b: *mut u8,
    dst: Region,
    ra: Region,
    rb: Region,
    dtype: DataType,
    op: crate::types::ReduceOp,
) -> Result<()> {
    let len = dst.len;
    if ra.len != len || rb.len != len {
        return Err(Error::InvalidArgument(format!(
            "reduce operands differ in length ({len}, {}, {})",
            ra.len, rb.len
        )));
    }
    // SAFETY: the caller guarantees validity; the three branches make sure no mutable slice
    // overlaps another slice.
    unsafe {
        if std::ptr::eq(d, a) {
            cpu::reduce_bytes(
                std::slice::from_raw_parts_mut(d, len),
                std::slice::from_raw_parts(b, len),
                dtype,
                op,
            )
        } else if std::ptr::eq(d, b) {
            cpu::reduce_bytes(
                std::slice::from_raw_parts_mut(d, len),
                std::slice::from_raw_parts(a, len),
                dtype,
                op,
            )
        } else {
            cpu::reduce_into_bytes(
                std::slice::from_raw_parts_mut(d, len),
                std::slice::from_raw_parts(a, len),
                std::slice::from_raw_parts(b, len),
                dtype,
                op,
            )
        }
    }
}
