//! Collectives through the group area (ranks of one host only), with no messages and no
//! schedule. Which way a call takes is the tuner's (`tune`): the cheapest by its measured
//! costs. All-reduce has three:
//!
//! - one-shot (small messages, at most an area buffer): each rank publishes its contribution
//!   in its own area buffer and reads everybody's — no system call; the path for sizes whose cost is otherwise the
//!   machinery around a few bytes;
//! - direct (when every rank can reach every peer's memory with
//!   `process_vm_readv`/`process_vm_writev`): each rank publishes the
//!   addresses of its buffers, then for its slice, part by part, reads each peer's input into
//!   cache, folds, and writes the result to its own output and straight into every peer's. The
//!   kernel copies page by page, which is fast while the buffers are in cache;
//! - two-shot: through the area in pieces of [`STAGE_BYTES`], each rank
//!   copies into its buffer the slices its peers reduce, reduces its own slice from their
//!   copies, and copies every other slice's result from its owner's buffer. All copies are
//!   user-space streams, which is what wins once the buffers no longer fit in cache.
//!
//! The other collectives (all-gather, reduce-scatter, broadcast, reduce, gather, scatter,
//! all-to-all) have two ways: staged (through the area in pieces, user-space copies; see
//! [`staged`]) and direct (each rank reads what it needs from peers' buffers with
//! `process_vm_readv`, reductions writing results where they belong; see [`direct`]).
//!
//! Each element's result is folded once, by its slice's owner, and copied to everyone (one-shot:
//! every rank folds all contributions in rank order), so all ranks get the same bits. While waiting for
//! peers this path watches what the engine would: abort, the deadline, dead peers, failure
//! notices, and a peer that started another collective (its descriptor arrives on a link) —
//! which is reported as a mismatch, as in the engine.
//!
//! Each way has its file: [`one_shot`], [`two_shot`], [`staged`], [`direct`]; [`waiter`] is how
//! they wait on each other with the engine's guarantees.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use oxccl_transport_shm::area::{self, AREA_BYTES, Area, CROWDED_LAG, DESC_BYTES, LAG, Published};

use super::descriptor::Descriptor;
use super::driver::Engine;
use super::op::OpName;
use crate::algo::{Algorithm, Collective, Plan};
use crate::error::{Error, Result};
use crate::reduce::cpu;
use crate::reduce::shared::Shared;
use crate::tune::Way;
use crate::types::Rank;
use waiter::Waiter;

mod direct;
mod one_shot;
mod small;
mod staged;
mod two_shot;
mod waiter;

/// How a waiter paces itself: how long it spins before it starts yielding, and after how many
/// looks at what it awaits it looks at the clock (and, once past the spin, yields).
#[derive(Clone, Copy, Debug)]
pub(super) struct Pace {
    spin: Duration,
    every: u32,
}

/// When every rank has a core of its own: the awaited rank is running elsewhere. Spin up to
/// the waiter's yield bound (100 µs), then sleep: never yield, which would hand the core to any
/// other busy process for a time slice. With a `yes` hog on each of the 2 cores, 2 ranks
/// (`allreduce-perf --ranks 2 -b 8 -e 16M -f 8`, two runs each, 2026-11-27) took 63-77 µs
/// per 256 KiB all-reduce, and 551-747 µs at 2 MiB in place, against 87-131 and 991-1721
/// after 20 µs of spinning and yields until 100 µs; the same within noise quiet and at
/// other sizes.
const ROOMY: Pace = Pace {
    spin: Duration::from_micros(100),
    every: 64,
};
/// When ranks outnumber cores, the awaited rank most likely waits for this core: yield after
/// 16 looks (well under a microsecond). 4 ranks on 2 cores, 1 KiB, against 2 µs of spinning
/// that looked at the clock every 64 looks: all-reduce 8.3–8.7 -> 4.4–4.7 µs, all-gather
/// 8.4–8.6 -> 2.9–3.9 µs, broadcast 2.6 -> 1.3–1.5 µs (`allreduce-perf --ranks 4 -o C -b 1K -e
/// 1K`, interleaved, after `--ranks 4 --calibrate`, 2026-11-26).
const CROWDED: Pace = Pace {
    spin: Duration::ZERO,
    every: 16,
};
/// Bytes of one part of a direct all-reduce: what is read from a peer into cache and reduced
/// before the next read (stays in L2).
const PART_BYTES: usize = 128 * 1024;
/// Largest piece of a two-shot all-reduce, in bytes: larger ones go through the area in
/// pieces of this size, one area turn each (a piece and its copies stay in L2).
const STAGE_BYTES: usize = 1 << 20;

/// The shared-area path of one communicator.
#[derive(Debug)]
pub struct AreaPath {
    area: Area,
    rank: Rank,
    /// Every rank of the communicator can read every other's memory (agreed at setup).
    direct: bool,
    /// Where peers' parts land before they are reduced.
    scratch: Mutex<Vec<u64>>,
    /// How waiters pace themselves.
    pace: Pace,
    /// Whether a rank that read a peer's publication asks for the peer's next one ahead
    /// ([`AreaPath::prefetch_next`]): where every rank has a core of its own.
    prefetch: bool,
    /// Per rank, how many of its first turns this rank has seen published and checked against
    /// its own descriptors (a rank it reads nothing from may be up to `lag` turns behind).
    checked: Vec<AtomicU64>,
    /// How many turns this rank may run ahead of a rank it reads nothing from: [`LAG`], or
    /// [`CROWDED_LAG`] where ranks outnumber cores (ranks may differ; see [`LAG`]), half the
    /// area's ring at most.
    lag: u64,
    /// Bytes of each rank's block in a staged piece where one buffer holds a piece of every
    /// rank's block ([`STAGE_BYTES`] / ranks).
    shared_stage: usize,
}

impl AreaPath {
    /// The path over `area` for `rank`; `direct` only if every rank agreed that all can read
    /// each other's memory; `crowded` if ranks may wait for each other's cores
    /// ([`crate::topo::Topology::crowded`]).
    ///
    /// Ranks bound to CPUs of their own are not crowded, though a rank pinned to one core sees
    /// one (`available_parallelism` follows the affinity mask): taking such ranks for crowded
    /// made them yield at every wait, and a yield hands a pinned rank's only core to any other
    /// process for its time slice: with a `yes` hog on each of the 2 cores, 2 ranks bound to a
    /// core each (`allreduce-perf --ranks 2`), the 64 KiB all-to-all took 2.8–3.8 ms a call,
    /// 15–19 µs unbound (2026-11-27).
    pub fn new(area: Area, rank: Rank, direct: bool, crowded: bool) -> AreaPath {
        let direct = direct && area.direct();
        let pace = if crowded { CROWDED } else { ROOMY };
        let checked = (0..area.len()).map(|_| AtomicU64::new(0)).collect();
        let shared_stage = STAGE_BYTES / area.len().max(1);
        // The ring is wide where any rank is crowded (agreed at setup); half of it at most.
        let lag = if crowded { CROWDED_LAG } else { LAG }.min(area.slots() / 2);
        AreaPath {
            area,
            rank,
            direct,
            scratch: Mutex::new(Vec::new()),
            pace,
            prefetch: !crowded,
            checked,
            lag,
            shared_stage,
        }
    }

    /// Before this rank leaves: waits until every peer has published turn `last` (this
    /// rank's last), or died, or failed, or went silent (`lost`: the heartbeat declared it;
    /// a stopped peer held a drop for the whole timeout before), or `timeout` passed, and logs
    /// a mismatch of their descriptors with ours not checked yet (it can no longer be
    /// returned).
    pub fn settle(&self, last: u64, timeout: Duration, lost: &dyn Fn(Rank) -> bool) {
        let until = std::time::Instant::now() + timeout;
        for r in (0..self.area.len()).filter(|&r| r != self.rank) {
            let mut spins = 0u32;
            while !self.area.published(r, last) {
                if !self.area.peer_alive(r)
                    || self.area.failed_peer().is_some()
                    || lost(r)
                    || std::time::Instant::now() >= until
                {
                    tracing::warn!(
                        rank = self.rank,
                        peer = r,
                        turn = last,
                        "leaving before a peer reached this rank's last call through the area"
                    );
                    return;
                }
                spins += 1;
                if spins < 64 {
                    std::thread::yield_now();
                } else {
                    let nap = Duration::from_millis(1);
                    self.area.sleep_on(r, nap, || self.area.published(r, last));
                }
            }
            let from = self.checked[r].load(Ordering::Relaxed);
            for t in from..=last {
                if let Ok(Some(_)) = self.differs(r, t) {
                    tracing::error!(
                        rank = self.rank,
                        peer = r,
                        turn = t,
                        "a collective through the area did not match the peer's (found as this \
                         rank leaves; it returned success here)"
                    );
                    return;
                }
            }
        }
    }

    /// Says in the area that this rank's communicator failed because of rank `origin` (see
    /// [`Area::fail`]).
    pub fn fail(&self, origin: Rank) {
        self.area.fail(origin);
    }

    /// Whether every rank can reach every peer's memory directly (agreed at setup).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// How the ranks run `way` here: one-shot as it is; the direct and two-shot ways, when
    /// every rank can reach every peer's memory, start with one turn where ranks publish their
    /// addresses and whether they ask for direct (they go direct only if all do: placement may
    /// differ between ranks); two-shot alone otherwise.
    #[inline(always)]
    fn protocol(&self, way: Way) -> Protocol {
        match way {
            Way::OneShot => Protocol::OneShot,
            Way::Staged => Protocol::TwoShot,
            _ if self.direct => Protocol::Agree {
                direct: way == Way::Direct,
            },
            _ => Protocol::TwoShot,
        }
    }

    /// Elements per piece of a two-shot all-reduce, or of a staged collective, of `plan`;
    /// and how many pieces (at least one: every call takes a turn, so every call is checked
    /// against the peers').
    ///
    /// No division on the way (every call asks, and a division takes as long as a few dozen
    /// other instructions): element sizes are powers of two, and a rank's share of a stage is
    /// worked out once.
    #[inline]
    fn piece(&self, plan: &Plan) -> usize {
        // A staged reduce-scatter, scatter or all-to-all publishes a piece of every peer's
        // block in one buffer.
        let stage = match plan.collective {
            Collective::ReduceScatter | Collective::Scatter | Collective::AllToAll => {
                self.shared_stage
            }
            _ => STAGE_BYTES,
        };
        (stage.min(AREA_BYTES) >> plan.dtype.size().trailing_zeros()).max(1)
    }

    #[inline]
    fn pieces(&self, plan: &Plan) -> usize {
        let piece = self.piece(plan);
        if plan.count <= piece {
            1
        } else {
            plan.count.div_ceil(piece)
        }
    }

    /// The descriptor collective `seq` carries on this path. It names the way (one-shot, in
    /// pieces: two-shot or staged, the direct way's agreement) and its unit (the whole
    /// message, a piece, a part), so ranks that send one call different ways fail with a
    /// mismatch instead of misreading each other's publications: by unit alone, a 128 KiB
    /// all-reduce one-shot and its direct agreement looked alike, and so did staged and direct
    /// on 8 ranks (a review, 2026-12-05).
    #[inline(always)]
    fn descriptor(&self, seq: u64, plan: &Plan, protocol: Protocol) -> Descriptor {
        let (unit, way) = match protocol {
            Protocol::OneShot if plan.collective == Collective::AllReduce => {
                (plan.count * plan.dtype.size(), 1)
            }
            Protocol::OneShot | Protocol::TwoShot => (self.piece(plan) * plan.dtype.size(), 2),
            Protocol::Agree { .. } => (PART_BYTES, 3),
        };
        Descriptor::collective(seq, plan, Algorithm::Direct, unit).through_area(way)
    }

    /// Runs `plan` (any collective but the barrier) on `input`
    /// and `output` (as [`Collective`]'s table says; in place both are the whole buffer) as
    /// collective `seq`, using the area's turns from `*turns` on and advancing it past those
    /// used (collectives on the engine do not touch the area, so its turns are counted apart).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        engine: &mut Engine,
        (seq, turns): (u64, &mut u64),
        (plan, way): (&Plan, Way),
        input: (*const u8, usize),
        output: (*mut u8, usize),
        timeout: Duration,
    ) -> Result<()> {
        let name = OpName::Collective(plan.collective, seq);
        let protocol = self.protocol(way);
        let ours = self.descriptor(seq, plan, protocol);
        let Some(blocks) = Blocks::of(plan, self.rank, self.area.len(), input, output) else {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {name}: buffers too small or not for this path",
                self.rank
            )));
        };
        let mut w = Waiter::new(
            engine,
            &self.area,
            &name,
            &ours,
            (timeout, self.pace),
            self.rank,
        );
        let mut next = || {
            *turns += 1;
            *turns - 1
        };
        if plan.collective != Collective::AllReduce {
            if let Protocol::Agree { direct } = protocol
                && self.go_direct(&mut w, next(), plan, &blocks, direct)?
            {
                return Ok(());
            }
            return self.staged(&mut w, &mut next, plan, &blocks);
        }
        let (input, output) = ((blocks.src, blocks.block), (blocks.dst, blocks.block));
        let in_place = blocks.in_place;
        match protocol {
            Protocol::OneShot => {
                return self.small_all_reduce(&mut w, next(), plan, input, output, in_place);
            }
            Protocol::Agree { direct } => {
                if self.go_direct(&mut w, next(), plan, &blocks, direct)? {
                    return Ok(());
                }
                // Someone would rather not: two-shot after all.
            }
            Protocol::TwoShot => {}
        }
        let (size, piece) = (plan.dtype.size(), self.piece(plan));
        for k in 0..self.pieces(plan) {
            let at = k * piece;
            let count = piece.min(plan.count - at.min(plan.count));
            // SAFETY: both buffers hold `count · size` bytes (checked by `Blocks::of`); the
            // piece is inside them.
            let (i, o) = unsafe { (input.0.add(at * size), output.0.add(at * size)) };
            let part = (count * size, in_place);
            self.two_shot_piece(&mut w, next(), plan, part, i, o)?;
        }
        Ok(())
    }

    /// This rank's place for `bytes` of data of `turn` ([`Area::my_buffer`]), once it may write
    /// there: every rank has published turn `turn - lag` (their descriptors up to it checked
    /// against ours), and for a large buffer `turn - 1`.
    #[inline(always)]
    fn claim(&self, w: &mut Waiter<'_>, turn: u64, bytes: usize) -> Result<*mut u8> {
        w.turn = turn;
        // Most calls find every peer's turns checked far enough already (one check covers
        // every turn a peer has published): a look at the counters, no call.
        if turn >= self.lag && self.unchecked(turn - self.lag) {
            self.catch_up(w, turn, turn - self.lag)?;
        }
        if Area::in_buffer(bytes) && turn >= 1 {
            self.catch_up(w, turn, turn - 1)?;
        }
        Ok(self.area.my_buffer(turn, bytes))
    }

    /// Whether some peer's descriptors have been checked only up to turn `upto` or less.
    #[inline(always)]
    fn unchecked(&self, upto: u64) -> bool {
        self.checked
            .iter()
            .enumerate()
            .any(|(r, c)| r != self.rank && c.load(Ordering::Relaxed) <= upto)
    }

    /// Waits until every rank has published turn `upto`, and checks each one's descriptors
    /// of the turns not checked yet against ours (also those past `upto` already published,
    /// before `turn`). A rank's descriptor of turn `t` stays in its slot until it writes
    /// `t + slots`, for which it waits for this rank's `t + slots - lag'` (its lag, at most
    /// `slots / 2`, as ours; one ring for all): so every turn from `turn - lag` on is still
    /// there, and earlier ones were checked by earlier calls.
    #[inline(never)]
    fn catch_up(&self, w: &mut Waiter<'_>, turn: u64, upto: u64) -> Result<()> {
        for r in (0..self.area.len()).filter(|&r| r != self.rank) {
            let mut t = self.checked[r].load(Ordering::Relaxed);
            if t > upto {
                continue;
            }
            w.until(|| {
                if self.area.published(r, upto) {
                    Ok(())
                } else {
                    Err(r)
                }
            })?;
            while t <= upto || (t < turn && self.area.published(r, t)) {
                match self.differs(r, t) {
                    Ok(None) => {}
                    Ok(Some(both)) => return Err(self.mismatch_published(w, r, both)),
                    Err(later) => {
                        // Nobody overwrites a turn this rank has not checked (see above),
                        // unless a process that is not playing by the protocol writes there.
                        let e = Error::PeerFailed {
                            rank: self.rank,
                            peer: r,
                            op: w.name.to_string(),
                            cause: format!(
                                "the area's slot of turn {t} already holds turn {later}, \
                                 before this rank checked the call there"
                            ),
                        };
                        w.fail(&e);
                        return Err(e);
                    }
                }
                t += 1;
            }
            self.checked[r].store(t, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Our publication of turn `t` and rank `r`'s, when both are there and their calls differ
    /// (tag or length); `None` when they agree or one is not there yet. `Err(later)`: one of
    /// the two slots already holds a later turn.
    #[inline]
    fn differs(&self, r: Rank, t: u64) -> std::result::Result<Option<(Published, Published)>, u64> {
        // The tags and lengths first (most calls agree), the publications only where they
        // differ.
        let (ours, theirs) = (self.area.call_of(self.rank, t)?, self.area.call_of(r, t)?);
        if ours.is_none() || theirs.is_none() || ours == theirs {
            return Ok(None);
        }
        let (ours, theirs) = (self.area.observe(self.rank, t)?, self.area.observe(r, t)?);
        Ok(match (ours, theirs) {
            (Some(o), Some(p)) if p.tag != o.tag || p.len != o.len => Some((o, p)),
            _ => None,
        })
    }

    /// [`AreaPath::mismatch`] of the two publications [`AreaPath::differs`] found.
    fn mismatch_published(
        &self,
        w: &mut Waiter<'_>,
        peer: Rank,
        (o, p): (Published, Published),
    ) -> Error {
        // SAFETY: both published with the stamps observed, in area memory: read once, as a
        // copy (any bytes are a valid array).
        let (ours, theirs) = unsafe {
            (
                oxccl_transport::shared::read(o.desc),
                oxccl_transport::shared::read(p.desc),
            )
        };
        self.mismatch(w, peer, &ours, &theirs)
    }

    /// The error of a call whose descriptors (as published) differ from rank `peer`'s,
    /// failing the communicator.
    fn mismatch(
        &self,
        w: &mut Waiter<'_>,
        peer: Rank,
        ours: &[u8; DESC_BYTES],
        theirs: &[u8; DESC_BYTES],
    ) -> Error {
        let say = |d: &[u8; DESC_BYTES]| {
            Descriptor::decode(d).map_or("something unreadable".into(), |d| d.to_string())
        };
        let e = Error::Mismatch {
            rank: self.rank,
            peer,
            op: w.name.to_string(),
            ours: say(ours),
            theirs: say(theirs),
        };
        w.fail(&e);
        e
    }

    /// Publishes `data` for `turn` (the call covering `len` bytes) with our descriptor, then
    /// hands the published data of every rank `reads` names (ours always), in rank order, to
    /// `each` once its descriptor is checked against ours. `data` is either copied here, or
    /// was written by the caller to the place [`AreaPath::claim`] gave it.
    ///
    /// Ranks this rank reads nothing from are neither waited for nor checked here: they may
    /// be up to `lag` turns behind, and [`AreaPath::claim`] checks their descriptors later.
    /// A rank that reads a peer's data checks its descriptor first, so nobody reads data of
    /// another call. A mismatch between ranks that read nothing from each other in that turn
    /// (a broadcast's root against a reduce's other rank) is found by `claim` within `lag`
    /// turns, or logged by [`AreaPath::settle`] when the rank leaves first.
    fn exchange(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        data: Data,
        len: usize,
        reads: impl Fn(Rank) -> bool,
        each: impl FnMut(Rank, *const u8) -> Result<()>,
    ) -> Result<()> {
        self.exchange_then(w, turn, data, len, reads, || {}, each)
    }

    /// [`AreaPath::exchange`], running `meanwhile` once this rank's publication is out and
    /// before it reads or waits for anybody's: work on this rank's own bytes (a copy from its
    /// input to its output) goes there, so that peers can start on what it published instead
    /// of waiting for that work. Out of place on 2 ranks, paired runs against the build that
    /// did it first (2026-11-29, README "How an all-reduce ... travels"): all-gather 0.77–0.97
    /// of the time from 8 B to 1 MiB, all-to-all 0.84–0.99.
    #[allow(clippy::too_many_arguments)]
    fn exchange_then(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        data: Data,
        len: usize,
        reads: impl Fn(Rank) -> bool,
        meanwhile: impl FnOnce(),
        mut each: impl FnMut(Rank, *const u8) -> Result<()>,
    ) -> Result<()> {
        w.turn = turn;
        let desc: [u8; DESC_BYTES] = w.ours.encode();
        let tag = area::tag(&desc);
        let bytes = match data {
            Data::Copy(data, data_len) => {
                let mine = self.claim(w, turn, data_len)?;
                // SAFETY: `data` holds `data_len` readable bytes, which fit a buffer (callers
                // check), and this rank may write its place (`claim`).
                unsafe { std::ptr::copy_nonoverlapping(data, mine, data_len) };
                data_len
            }
            Data::Claimed(bytes) => bytes,
        };
        self.area.publish(turn, &desc, tag, len, bytes);
        meanwhile();
        for r in 0..self.area.len() {
            let p = if r == self.rank {
                Published {
                    tag,
                    desc: &desc,
                    data: self.area.my_buffer(turn, bytes),
                    len,
                }
            } else if reads(r) {
                self.published_by(w, r, turn)?
            } else {
                continue;
            };
            if r != self.rank {
                self.accept(w, r, turn, &p, (&desc, tag, len))?;
            }
            each(r, p.data)?;
        }
        self.look_for_failures(w, turn)
    }

    /// Rank `r`'s publication of `turn`, waiting for it where it is not there yet (a look
    /// first: most calls find it there, and need no waiter's machinery).
    #[inline(always)]
    fn published_by(&self, w: &mut Waiter<'_>, r: Rank, turn: u64) -> Result<Published> {
        if let Ok(Some(p)) = self.area.observe(r, turn) {
            return Ok(p);
        }
        w.until(|| self.area.observe(r, turn).ok().flatten().ok_or(r))
    }

    /// Hints that rank `r`'s publication of `turn + 1` will be read next, where ranks have cores
    /// of their own: a peer usually runs ahead (by up to the lag), so the line is often
    /// written already and its trip between cores overlaps this call's work. Paired runs of
    /// the two builds, 2 ranks (`tools/perf/ab.sh -g -n 12 OLD NEW -- --ranks 2 -o OP -b 16 -e
    /// 1K -f 64 -n 20000 -w 1000 -R 1 --min-time 0.05 -c 0`, two runs, 2026-12-05), new / old
    /// time out of place / in place at 16 B and 1 KiB: all-gather 0.92–0.96 / 0.93–0.95 and
    /// 0.87–0.89 / 0.87–0.91, all-to-all 0.96–0.97 / 0.98–0.99 and 0.88–0.91 / 0.90–0.92,
    /// all-reduce 0.92–0.94 / 0.93–0.94 and 0.95–0.96 / 0.93–0.98; broadcast (one run, 8 B and
    /// 1 KiB) 1.01 / 1.00 and 0.91 / 0.99. Where ranks outnumber cores the peer is more often
    /// not there yet, and the hint would take the line from under its writer: not asked for.
    #[inline(always)]
    fn prefetch_next(&self, r: Rank, turn: u64) {
        if self.prefetch {
            self.area.prefetch(r, turn + 1);
        }
    }

    /// Checks rank `r`'s publication `p` of `turn` against ours (`desc`, its tag, the call's
    /// length) before this rank reads its data: a different call fails with both descriptors.
    #[inline(always)]
    fn accept(
        &self,
        w: &mut Waiter<'_>,
        r: Rank,
        turn: u64,
        p: &Published,
        (desc, tag, len): (&[u8; DESC_BYTES], u64, usize),
    ) -> Result<()> {
        if p.tag != tag || p.len != len {
            // SAFETY: published with the stamp observed, in area memory: read once, as a
            // copy (any bytes are a valid array).
            let theirs = unsafe { oxccl_transport::shared::read(p.desc) };
            if p.tag == tag && theirs == *desc {
                // The same call, another length: its slot's head was written out of turn.
                let e = Error::PeerFailed {
                    rank: self.rank,
                    peer: r,
                    op: w.name.to_string(),
                    cause: format!(
                        "its area says {} bytes for this call, which has {len} (written out of \
                         turn?)",
                        p.len
                    ),
                };
                w.fail(&e);
                return Err(e);
            }
            return Err(self.mismatch(w, r, desc, &theirs));
        }
        // Checked now: the lagged check need not read it again. One call at a time runs on
        // this path (the engine's), as `catch_up` assumes too: a load and a store, not a
        // locked compare-exchange, which would wait for this call's stores to reach the
        // cache on every read of a peer.
        if self.checked[r].load(Ordering::Relaxed) == turn {
            self.checked[r].store(turn + 1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// After this rank's part of `turn`: fails if a peer's communicator failed (see
    /// [`Area::fail`]).
    #[inline]
    fn look_for_failures(&self, w: &mut Waiter<'_>, turn: u64) -> Result<()> {
        match self.area.failed_peer() {
            None => Ok(()),
            Some((peer, origin)) => Err(self.failed_peer(w, turn, peer, origin)),
        }
    }

    /// The error of a call that finds rank `peer`'s communicator failed, `origin` being the
    /// rank it named at the root of the failure; fails this communicator.
    #[cold]
    fn failed_peer(&self, w: &mut Waiter<'_>, turn: u64, peer: Rank, origin: Rank) -> Error {
        // A rank that reads nothing from `peer` would not wait for it, so would not see its
        // failure notice: say it here, after what this rank reads was checked (a mismatch it
        // sees itself is the better error), naming the rank at the root of the failure as a
        // notice would. `peer` may have failed on a call of ours it found different from its
        // own within the lag (a broadcast whose ranks named different roots): the turns not
        // checked against it yet are still in both slots, so look, and name the calls that
        // differ as it did. This turn too, which this rank published: the calls may differ
        // from it on, and `peer` may have failed on it (with a narrower lag than ours it
        // checks this turn before we would).
        let from = self.checked[peer].load(Ordering::Relaxed);
        for t in from..=turn {
            if let Ok(Some(both)) = self.differs(peer, t) {
                return self.mismatch_published(w, peer, both);
            }
        }
        let cause = if origin == peer || origin == self.rank {
            "its communicator failed or was aborted".to_string()
        } else {
            format!("reported by rank {peer}, whose communicator failed because of it")
        };
        let peer = if origin == self.rank { peer } else { origin };
        let e = Error::PeerFailed {
            rank: self.rank,
            peer,
            op: w.name.to_string(),
            cause,
        };
        w.fail(&e);
        e
    }

    /// [`AreaPath::exchange`] where this rank reads every rank: their published data, in rank
    /// order.
    fn exchange_all(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        data: Data,
        len: usize,
    ) -> Result<Vec<*const u8>> {
        let mut all = Vec::with_capacity(self.area.len());
        self.exchange(
            w,
            turn,
            data,
            len,
            |_| true,
            |_, d| {
                all.push(d);
                Ok(())
            },
        )?;
        Ok(all)
    }
}

/// Folds rank `r`'s published `data` into `out`, in rank order: rank 0's is copied, every
/// later one's combined with `plan`'s operator.
fn fold_in(r: Rank, out: &mut [u8], data: Shared<'_>, plan: &Plan) -> Result<()> {
    if r == 0 {
        data.copy_to(out);
        Ok(())
    } else {
        cpu::reduce_shared(out, data, plan.dtype, plan.op.combiner())
    }
}

/// What a rank publishes in a turn (see [`AreaPath::exchange`]).
#[derive(Clone, Copy, Debug)]
enum Data {
    /// These bytes, copied into the area by the exchange.
    Copy(*const u8, usize),
    /// This many bytes the caller already wrote where [`AreaPath::claim`] said.
    Claimed(usize),
}

/// How the ranks go through the area for one call (see [`AreaPath::protocol`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    /// Everyone reads everyone's whole contribution (small).
    OneShot,
    /// Reduce-scatter then all-gather through shared buffers, piece by piece.
    TwoShot,
    /// A first turn where every rank publishes its addresses and whether it asks for the
    /// direct way (`direct`): direct if all ask, else two-shot.
    Agree {
        /// Whether this rank asks for direct.
        direct: bool,
    },
}

/// Byte range of slice `q` when `count` elements of `size` bytes are cut into `n` slices:
/// elements `[q·per + min(q, extra), …)`.
fn slicer(count: usize, n: usize, size: usize) -> impl Fn(usize) -> (usize, usize) {
    let (per, extra) = (count / n, count % n);
    move |q| {
        let lo = q * per + q.min(extra);
        (lo * size, (lo + per + usize::from(q < extra)) * size)
    }
}

/// This rank's regions for one call through the area, from the caller's buffers as
/// [`Collective`]'s table lays them out. Pointers are only dereferenced for non-empty ranges.
#[derive(Clone, Copy, Debug)]
pub(super) struct Blocks {
    /// What this rank contributes: the whole input (all-reduce, reduce, reduce-scatter,
    /// all-to-all; scatter at the root), its block (all-gather, gather), the data (broadcast,
    /// at the root); null where it contributes nothing.
    src: *const u8,
    /// Where its result lands: the whole output (all-reduce, all-gather, all-to-all,
    /// broadcast; reduce and gather at the root), its block (reduce-scatter, scatter); null
    /// where it gets nothing.
    dst: *mut u8,
    /// `src` and `dst` share memory: the same bytes, or one a block of the other.
    in_place: bool,
    /// Bytes of one rank's block (count × element size).
    block: usize,
}

impl Blocks {
    /// The regions of `plan` on rank `me` of `n`; `None` if a buffer is too small or the
    /// collective does not run through the area.
    #[inline(always)]
    fn of(
        plan: &Plan,
        me: Rank,
        n: usize,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Option<Blocks> {
        let block = plan.count.checked_mul(plan.dtype.size())?;
        let whole = block.checked_mul(n)?;
        let root = me == plan.root;
        let none = std::ptr::null_mut();
        // (src, bytes it must hold, dst, bytes it must hold)
        let (src, src_len, dst, dst_len) = match plan.collective {
            Collective::AllReduce => (input.0, block, output.0, block),
            Collective::Reduce if root => (input.0, block, output.0, block),
            Collective::Reduce => (input.0, block, none, 0),
            Collective::Broadcast if root => (input.0, block, output.0, block),
            Collective::Broadcast => (std::ptr::null(), 0, output.0, block),
            Collective::AllGather if plan.in_place => {
                // Our block is already in place: the input is the whole buffer.
                (
                    output.0.wrapping_add(me * block).cast_const(),
                    0,
                    output.0,
                    whole,
                )
            }
            Collective::AllGather => (input.0, block, output.0, whole),
            Collective::ReduceScatter if plan.in_place => {
                (input.0, whole, output.0.wrapping_add(me * block), 0)
            }
            Collective::ReduceScatter => (input.0, whole, output.0, block),
            // The root's block is already in place; the others contribute theirs.
            Collective::Gather if root && plan.in_place => (
                output.0.wrapping_add(me * block).cast_const(),
                0,
                output.0,
                whole,
            ),
            Collective::Gather if root => (input.0, block, output.0, whole),
            Collective::Gather => (input.0, block, none, 0),
            // The root's block of its input is its output.
            Collective::Scatter if root && plan.in_place => {
                (input.0, whole, output.0.wrapping_add(me * block), 0)
            }
            Collective::Scatter if root => (input.0, whole, output.0, block),
            Collective::Scatter => (std::ptr::null(), 0, output.0, block),
            // In place both are the whole buffer.
            Collective::AllToAll => (input.0, whole, output.0, whole),
            _ => return None,
        };
        if input.1 < src_len || output.1 < dst_len {
            return None;
        }
        let in_place = match plan.collective {
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                plan.in_place
            }
            Collective::Gather | Collective::Scatter => root && plan.in_place,
            _ => !dst.is_null() && std::ptr::eq(src, dst.cast_const()),
        };
        Some(Blocks {
            src,
            dst,
            in_place,
            block,
        })
    }
}
