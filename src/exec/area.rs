//! Collectives through the group area (ranks of one host only), with no messages and no
//! schedule:
//!
//! - one-shot (up to 16 KiB): each rank publishes its contribution in its own area buffer and
//!   reads everybody's — no system call; the path for sizes whose cost is otherwise the
//!   machinery around a few bytes;
//! - direct (from [`Config::direct_min`] to [`Config::direct_max`], when every rank can reach
//!   every peer's memory with `process_vm_readv`/`process_vm_writev`): each rank publishes the
//!   addresses of its buffers, then for its slice, part by part, reads each peer's input into
//!   cache, folds, and writes the result to its own output and straight into every peer's. The
//!   kernel copies page by page, which is fast while the buffers are in cache;
//! - two-shot (everything else): through the area in pieces of [`STAGE_BYTES`], each rank
//!   copies into its buffer the slices its peers reduce, reduces its own slice from their
//!   copies, and copies every other slice's result from its owner's buffer. All copies are
//!   user-space streams, which is what wins once the buffers no longer fit in cache.
//!
//! The crossovers were measured on the reference machine (see the README's performance section).
//!
//! [`Config::direct_min`]: crate::Config::direct_min
//! [`Config::direct_max`]: crate::Config::direct_max
//! Each element's result is folded once, by its slice's owner, and copied to everyone (one-shot:
//! every rank folds all contributions in rank order), so all ranks get the same bits. While waiting for
//! peers this path watches what the engine would: abort, the deadline, dead peers, failure
//! notices, and a peer that started another collective (its descriptor arrives on a link) —
//! which is reported as a mismatch, as in the engine.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use oxccl_transport_shm::area::{self, AREA_BYTES, Area, DESC_BYTES, Published};

use super::descriptor::Descriptor;
use super::driver::{Engine, Flags, OpName};
use crate::algo::{Algorithm, Plan};
use crate::error::{Error, Result};
use crate::reduce::{cpu, stream};
use crate::tune::Way;
use crate::types::{Rank, ReduceOp};

/// Spin this long before yielding, when every rank of the host has a core of its own...
const SPIN: Duration = Duration::from_micros(20);
/// ...and this long when ranks outnumber cores (the awaited rank may need this core).
const SPIN_CROWDED: Duration = Duration::from_micros(2);
/// Yield until this long before sleeping.
const YIELD: Duration = Duration::from_micros(100);
/// Look at the links this often while waiting.
const CHECK_EVERY: Duration = Duration::from_millis(1);
/// Bytes of one part of a direct all-reduce: what is read from a peer into cache and reduced
/// before the next read (stays in L2).
const PART_BYTES: usize = 128 * 1024;
/// Largest piece of a two-shot all-reduce, in bytes: larger ones go through the area in
/// pieces of this size, one area turn each (a piece and its copies stay in L2).
const STAGE_BYTES: usize = 1 << 20;
/// Bytes reduced before the result is copied out (it is still in L1 then).
const FOLD_BYTES: usize = 32 * 1024;
/// Direct all-reduces at least this large write their output (out of place: nobody touched it
/// lately) with non-temporal stores.
const STREAM_MIN: usize = 256 * 1024;
/// The same for two-shot all-reduces, counting the whole message: below it, inputs and outputs
/// fit in cache together and normal stores win.
const STAGED_STREAM_MIN: usize = 8 << 20;

/// The shared-area path of one communicator.
#[derive(Debug)]
pub struct AreaPath {
    area: Area,
    rank: Rank,
    /// Every rank of the communicator can read every other's memory (agreed at setup).
    direct: bool,
    /// Where peers' parts land before they are reduced.
    scratch: Mutex<Vec<u64>>,
    /// How long to spin before yielding.
    spin: Duration,
}

impl AreaPath {
    /// The path over `area` for `rank`; `direct` only if every rank agreed that all can read
    /// each other's memory.
    pub fn new(area: Area, rank: Rank, direct: bool) -> AreaPath {
        let direct = direct && area.direct();
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let spin = if area.len() > cores {
            SPIN_CROWDED
        } else {
            SPIN
        };
        AreaPath {
            area,
            rank,
            direct,
            scratch: Mutex::new(Vec::new()),
            spin,
        }
    }

    /// Whether every rank can reach every peer's memory directly (agreed at setup).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// How the ranks run `way` here: one-shot as it is; the direct and two-shot ways, when
    /// every rank can reach every peer's memory, start with one turn where ranks publish their
    /// addresses and whether they ask for direct (they go direct only if all do: placement may
    /// differ between ranks); two-shot alone otherwise.
    fn protocol(&self, way: Way) -> Protocol {
        match way {
            Way::OneShot => Protocol::OneShot,
            _ if self.direct => Protocol::Agree {
                direct: way == Way::Direct,
            },
            _ => Protocol::TwoShot,
        }
    }

    /// Elements per piece of a two-shot all-reduce of `plan`, and how many pieces.
    fn piece(&self, plan: &Plan) -> usize {
        (STAGE_BYTES.min(AREA_BYTES) / plan.dtype.size()).max(1)
    }

    fn pieces(&self, plan: &Plan) -> usize {
        plan.count.div_ceil(self.piece(plan))
    }

    /// The descriptor collective `seq` carries on this path. Its slice size tells the ways
    /// apart (the whole message one-shot, a piece two-shot, a part direct), so ranks whose
    /// settings send one call different ways fail with a mismatch instead of misreading
    /// each other's publications.
    fn descriptor(&self, seq: u64, plan: &Plan, protocol: Protocol) -> Descriptor {
        let unit = match protocol {
            Protocol::OneShot => plan.count * plan.dtype.size(),
            Protocol::TwoShot => self.piece(plan) * plan.dtype.size(),
            Protocol::Agree { .. } => PART_BYTES,
        };
        Descriptor::collective(seq, plan, Algorithm::Direct, unit)
    }

    /// All-reduce `input` into `output` (which may be the same memory) as collective `seq`,
    /// using the area's turns from `*turns` on and advancing it past those used (collectives
    /// on the engine do not touch the area, so its turns are counted apart).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        engine: &mut Engine,
        flags: &Flags,
        (seq, turns): (u64, &mut u64),
        (plan, way): (&Plan, Way),
        input: (*const u8, usize),
        output: (*mut u8, usize),
        timeout: Duration,
    ) -> Result<()> {
        let name = OpName::Collective(plan.collective, seq);
        let protocol = self.protocol(way);
        let ours = self.descriptor(seq, plan, protocol);
        let bytes = plan.count * plan.dtype.size();
        if input.1 < bytes || output.1 < bytes {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {name}: buffers too small",
                self.rank
            )));
        }
        let in_place = std::ptr::eq(input.0, output.0);
        let mut w = Waiter::new(
            engine,
            flags,
            &self.area,
            &name,
            &ours,
            (timeout, self.spin),
            self.rank,
        );
        let mut next = || {
            *turns += 1;
            *turns - 1
        };
        match protocol {
            Protocol::OneShot => {
                return self.small_all_reduce(&mut w, next(), plan, input, output);
            }
            Protocol::Agree { direct } => {
                if self.direct_all_reduce(&mut w, next(), plan, input, output, direct)? {
                    return Ok(());
                }
                // Someone would rather not: two-shot after all.
            }
            Protocol::TwoShot => {}
        }
        let (size, piece) = (plan.dtype.size(), self.piece(plan));
        for k in 0..self.pieces(plan) {
            let at = k * piece;
            let count = piece.min(plan.count - at);
            // SAFETY: both buffers hold `bytes` bytes (checked above); the piece is inside
            // them.
            let (i, o) = unsafe { (input.0.add(at * size), output.0.add(at * size)) };
            let part = (count * size, in_place);
            self.two_shot_piece(&mut w, next(), plan, part, i, o)?;
        }
        Ok(())
    }

    /// One piece of a two-shot all-reduce, `bytes` long at `input`/`output` (the same memory
    /// when `in_place`): each rank copies into its buffer the slices its peers reduce, reduces
    /// its own slice reading the peers' copies into its buffer and its output, and copies
    /// every other slice's result from its owner's buffer. Shared memory only, no system call.
    fn two_shot_piece(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        (bytes, in_place): (usize, bool),
        input: *const u8,
        output: *mut u8,
    ) -> Result<()> {
        let (n, me) = (self.area.len(), self.rank);
        let size = plan.dtype.size();
        let slice = slicer(bytes / size, n, size);
        let mine = self.area.my_buffer(turn);
        for q in (0..n).filter(|&q| q != me) {
            let (lo, hi) = slice(q);
            // SAFETY: `input` holds `bytes` bytes and the buffer AREA_BYTES ≥ `bytes` (pieces
            // are never larger); this rank owns its buffer (see `exchange`).
            unsafe { std::ptr::copy_nonoverlapping(input.add(lo), mine.add(lo), hi - lo) };
        }
        // The publication says the copies are there.
        let mut all = Vec::with_capacity(n);
        self.exchange(w, turn, ([].as_ptr(), 0), bytes, |_, data| {
            all.push(data);
            Ok(())
        })?;
        let stream = !in_place && plan.count * size >= STAGED_STREAM_MIN;
        let copy_out = |at: usize, from: *const u8, len: usize| {
            // SAFETY: `output` holds `bytes` bytes and this range is ours to write (`input`, if
            // the same memory, is done being read there); `from` is area memory, disjoint.
            let (out, from) = unsafe {
                (
                    std::slice::from_raw_parts_mut(output.add(at), len),
                    std::slice::from_raw_parts(from, len),
                )
            };
            if stream {
                stream::copy_streaming(out, from);
            } else {
                out.copy_from_slice(from);
            }
        };
        // Our slice, a few KiB at a time: fold into our buffer, then copy to our output.
        let (lo, hi) = slice(me);
        let fold = FOLD_BYTES / size * size;
        let mut at = lo;
        while at < hi {
            let len = fold.min(hi - at);
            // SAFETY: our own buffer's slice, which peers read only after our progress below;
            // `input` holds `bytes` bytes.
            let (res, a) = unsafe {
                (
                    std::slice::from_raw_parts_mut(mine.add(at), len),
                    std::slice::from_raw_parts(input.add(at), len),
                )
            };
            let peers = all.iter().enumerate().filter(|&(q, _)| q != me);
            for (k, (_, &data)) in peers.enumerate() {
                // SAFETY: peers' buffers hold their copies of this slice, unchanged until they
                // publish `turn + 1`.
                let theirs = unsafe { std::slice::from_raw_parts(data.add(at), len) };
                if k == 0 {
                    cpu::reduce_into_bytes(res, a, theirs, plan.dtype, plan.op.combiner())?;
                } else {
                    cpu::reduce_bytes(res, theirs, plan.dtype, plan.op.combiner())?;
                }
            }
            if plan.op == ReduceOp::Avg {
                cpu::divide_bytes(res, plan.dtype, n)?;
            }
            copy_out(at, res.as_ptr(), len);
            at += len;
        }
        self.area.set_progress(turn, 1);
        for q in (1..n).map(|k| (me + k) % n) {
            let (lo, hi) = slice(q);
            w.until(|| {
                if self.area.progress(q, turn) >= 1 {
                    Ok(())
                } else {
                    Err(q)
                }
            })?;
            // Rank q's result for its slice, complete (its progress said so) and unchanged
            // until it publishes `turn + 1`.
            copy_out(lo, all[q].wrapping_add(lo), hi - lo);
        }
        Ok(())
    }

    /// Publishes `data` (its call covering `len` bytes) with our descriptor for `turn`, then
    /// hands every rank's published data (ours included), in rank order, to `each` once its
    /// descriptor is checked against ours.
    fn exchange(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        (data, data_len): (*const u8, usize),
        len: usize,
        mut each: impl FnMut(Rank, *const u8) -> Result<()>,
    ) -> Result<()> {
        let desc: [u8; DESC_BYTES] = w.ours.encode();
        let tag = area::tag(&desc);
        let mine = self.area.my_buffer(turn);
        // SAFETY: `data` holds `data_len` readable bytes, which fit a buffer (callers check),
        // and this rank owns its area buffer: every rank read it before publishing `turn - 1`,
        // which this rank observed.
        unsafe { std::ptr::copy_nonoverlapping(data, mine, data_len) };
        self.area.publish(turn, &desc, tag, len);
        for r in 0..self.area.len() {
            let p = if r == self.rank {
                Published {
                    tag,
                    desc: &desc,
                    data: mine,
                    len,
                }
            } else {
                w.until(|| self.area.observe(r, turn).ok().flatten().ok_or(r))?
            };
            if p.tag != tag || p.len != len {
                // SAFETY: published with the stamp observed; unchanged until `turn + 1`.
                let theirs = Descriptor::decode(&unsafe { p.desc.read() })
                    .map_or("something unreadable".into(), |d| d.to_string());
                let e = Error::Mismatch {
                    rank: self.rank,
                    peer: r,
                    op: w.name.to_string(),
                    ours: w.ours.to_string(),
                    theirs,
                };
                w.engine.fail_outside(&e);
                return Err(e);
            }
            each(r, p.data)?;
        }
        Ok(())
    }

    fn small_all_reduce(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<()> {
        let bytes = plan.count * plan.dtype.size();
        self.exchange(w, turn, (input.0, bytes), bytes, |r, published| {
            // SAFETY: `output` holds `bytes` writable bytes; the published buffer holds `bytes`
            // readable bytes that stay unchanged until this rank publishes `turn + 1`; they never
            // overlap (area memory is not the caller's).
            let (out, data) = unsafe {
                (
                    std::slice::from_raw_parts_mut(output.0, bytes),
                    std::slice::from_raw_parts(published, bytes),
                )
            };
            if r == 0 {
                out.copy_from_slice(data);
            } else {
                cpu::reduce_bytes(out, data, plan.dtype, plan.op.combiner())?;
            }
            Ok(())
        })?;
        let n = self.area.len();
        if plan.op == ReduceOp::Avg && n > 1 {
            // SAFETY: as above.
            let out = unsafe { std::slice::from_raw_parts_mut(output.0, bytes) };
            cpu::divide_bytes(out, plan.dtype, n)?;
        }
        Ok(())
    }

    /// The direct all-reduce: see the module's documentation. Returns `Ok(false)` when some
    /// rank did not ask for it (then nobody touched anyone's memory).
    ///
    /// Peers reach this rank's buffers from the moment it publishes their addresses. So once
    /// published, it returns — with a result or an error — only when no peer can touch them
    /// any more: on success, once every rank finished (left its loop); on any error, after
    /// [`AreaPath::stop_touching`].
    fn direct_all_reduce(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
        want: bool,
    ) -> Result<bool> {
        // A panic between publishing and returning must not hand back memory peers still
        // write: stop touching first, then let it go on.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.direct_inner(w, turn, plan, input, output, want)
        }));
        match r {
            Ok(Ok(direct)) => Ok(direct),
            Ok(Err(e)) => {
                self.stop_touching(w, turn, &e);
                Err(e)
            }
            Err(panic) => {
                let e = Error::InvalidArgument(format!(
                    "rank {}: {}: the direct all-reduce panicked",
                    self.rank, w.name
                ));
                self.stop_touching(w, turn, &e);
                std::panic::resume_unwind(panic)
            }
        }
    }

    fn direct_inner(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
        want: bool,
    ) -> Result<bool> {
        let (n, me) = (self.area.len(), self.rank);
        let size = plan.dtype.size();
        let bytes = plan.count * size;
        let slice = slicer(plan.count, n, size);
        let part = PART_BYTES / size * size;
        let stream = !std::ptr::eq(input.0, output.0) && bytes >= STREAM_MIN;

        // Publish our buffers' addresses and whether we would go direct.
        let mut addrs = [0u8; 24];
        addrs[..8].copy_from_slice(&(input.0 as u64).to_le_bytes());
        addrs[8..16].copy_from_slice(&(output.0 as u64).to_le_bytes());
        addrs[16..].copy_from_slice(&u64::from(want).to_le_bytes());
        let mut peer_addrs: Vec<(usize, usize)> = Vec::with_capacity(n);
        let mut everyone = true;
        self.exchange(w, turn, (addrs.as_ptr(), addrs.len()), bytes, |_, data| {
            let mut a = [0u8; 24];
            // SAFETY: every publication of this turn carries 24 bytes (the descriptors
            // matched, so every rank took this path).
            unsafe { std::ptr::copy_nonoverlapping(data, a.as_mut_ptr(), 24) };
            let word = |i: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&a[i * 8..i * 8 + 8]);
                u64::from_le_bytes(b) as usize
            };
            peer_addrs.push((word(0), word(1)));
            everyone &= word(2) == 1;
            Ok(())
        })?;
        if !everyone {
            // Nobody touches anyone's memory: every rank saw the same publications.
            return Ok(false);
        }
        // A failed read means the peer died or unmapped memory it promised to keep: either
        // way it failed.
        let opname = w.name.to_string();
        let reach_err = |peer: Rank, e: std::io::Error| Error::PeerFailed {
            rank: me,
            peer,
            op: opname.clone(),
            cause: format!("reaching its memory directly failed: {e}"),
        };

        // From here this rank may touch peers' memory: say so before looking whether anyone
        // gave up (the order that makes `stop_touching` sound).
        self.area.enter(turn);
        // Our slice, part by part: read each peer's input into cache, fold, then write the
        // result to our output and straight into every peer's output. Writing a peer's
        // buffer is safe in place too: only we read that slice of it, and we just did.
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        scratch.resize(2 * PART_BYTES / 8, 0);
        let (tmp, acc) =
            bytemuck::cast_slice_mut::<u64, u8>(&mut scratch[..]).split_at_mut(PART_BYTES);
        let (lo, hi) = slice(me);
        let mut at = lo;
        while at < hi {
            // Before touching any peer: has anyone given up, aborted, timed out, failed?
            w.check_running(turn)?;
            let len = part.min(hi - at);
            let (tmp, acc) = (&mut tmp[..len], &mut acc[..len]);
            for (k, q) in (1..n).map(|k| (k, (me + k) % n)) {
                // SAFETY: `tmp` is ours; the kernel checks the peer's range, which the peer
                // keeps valid and unchanged until every rank finishes this turn or stops
                // touching it (`stop_touching`), and no rank gave up when we last looked.
                unsafe {
                    self.area
                        .read_from(q, peer_addrs[q].0 + at, tmp.as_mut_ptr(), len)
                }
                .map_err(|e| reach_err(q, e))?;
                if k == 1 {
                    // SAFETY: `input` holds `bytes` bytes.
                    let mine = unsafe { std::slice::from_raw_parts(input.0.add(at), len) };
                    cpu::reduce_into_bytes(acc, mine, tmp, plan.dtype, plan.op.combiner())?;
                } else {
                    cpu::reduce_bytes(acc, tmp, plan.dtype, plan.op.combiner())?;
                }
            }
            if plan.op == ReduceOp::Avg {
                cpu::divide_bytes(acc, plan.dtype, n)?;
            }
            // SAFETY: `output` holds `bytes` bytes; `input` is either the same memory, whose
            // range we are done reading, or disjoint from it.
            let out = unsafe { std::slice::from_raw_parts_mut(output.0.add(at), len) };
            if stream {
                stream::copy_streaming(out, acc);
            } else {
                // In place, these lines were just read: they are in cache.
                out.copy_from_slice(acc);
            }
            for q in (1..n).map(|k| (me + k) % n) {
                // SAFETY: `acc` is ours; the peer keeps its output valid until every rank
                // finishes this turn or stops touching it, and does not touch this range of
                // it meanwhile.
                unsafe {
                    self.area
                        .write_to(q, peer_addrs[q].1 + at, acc.as_ptr(), len)
                }
                .map_err(|e| reach_err(q, e))?;
            }
            at += len;
        }
        drop(scratch);

        // Done touching peers; they reach our buffers until they finish too: the caller gets
        // them back only then. A rank that gave up instead never finishes.
        self.area.leave();
        self.area.finish(turn);
        let gave_up = w.until(|| {
            if self.area.unfinished(turn).is_none() {
                Ok(None)
            } else if let Some(r) = self.area.abandoned(turn) {
                Ok(Some(r))
            } else {
                Err(self.area.unfinished(turn).unwrap_or(me))
            }
        })?;
        match gave_up {
            None => Ok(true),
            Some(peer) => Err(w.gave_up(peer, turn)),
        }
    }

    /// After an error in a direct all-reduce whose addresses this rank published: tells every
    /// rank it gave up, stops touching peers, and waits until no peer can touch this rank's
    /// buffers — every peer has left its loop, or exited. Peers look before every part (a few
    /// dozen microseconds of copying), so this is prompt; it has no deadline of its own and
    /// ignores abort, since returning earlier would hand the caller memory a peer may still
    /// write. A peer frozen in the middle of a part (stopped by a debugger or SIGSTOP) holds
    /// this rank until it goes on or exits; that is logged once a timeout.
    ///
    /// `e` fails the communicator (peers are told) once this rank no longer touches theirs.
    fn stop_touching(&self, w: &mut Waiter<'_>, turn: u64, e: &Error) {
        self.area.abandon(turn);
        self.area.leave();
        w.engine.fail_outside(e);
        let started = Instant::now();
        let mut warned = started;
        for q in (0..self.area.len()).filter(|&q| q != self.rank) {
            let mut spins = 0u32;
            while self.area.touching(q, turn) {
                spins = spins.saturating_add(1);
                if spins < 256 {
                    std::hint::spin_loop();
                    continue;
                }
                if !self.area.peer_alive(q) {
                    break;
                }
                if warned.elapsed() >= w.timeout {
                    warned = Instant::now();
                    tracing::error!(
                        rank = self.rank,
                        peer = q,
                        op = %w.name,
                        "rank {q} still reaches this rank's buffers after {:?}; waiting until it \
                         stops or exits",
                        started.elapsed()
                    );
                }
                self.area
                    .sleep_on(q, CHECK_EVERY, || !self.area.touching(q, turn));
            }
        }
    }
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

/// Waiting for shared memory, with the engine's guarantees.
struct Waiter<'a> {
    engine: &'a mut Engine,
    flags: &'a Flags,
    area: &'a Area,
    name: &'a OpName,
    ours: &'a Descriptor,
    deadline: Instant,
    timeout: Duration,
    checked: Instant,
    rank: Rank,
    spin: Duration,
}

impl<'a> Waiter<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        engine: &'a mut Engine,
        flags: &'a Flags,
        area: &'a Area,
        name: &'a OpName,
        ours: &'a Descriptor,
        (timeout, spin): (Duration, Duration),
        rank: Rank,
    ) -> Waiter<'a> {
        let now = Instant::now();
        Waiter {
            engine,
            flags,
            area,
            name,
            ours,
            deadline: now + timeout,
            timeout,
            checked: now,
            rank,
            spin,
        }
    }

    /// Between parts of a direct all-reduce: fails if this rank was aborted or is past its
    /// deadline, if a rank gave up `turn`, or (every [`CHECK_EVERY`]) if a link says a peer
    /// failed.
    fn check_running(&mut self, turn: u64) -> Result<()> {
        if let Some(peer) = self.area.abandoned(turn) {
            // Nothing more to touch: say so before looking for why (peers wait on it).
            self.area.leave();
            return Err(self.gave_up(peer, turn));
        }
        let now = Instant::now();
        if let Some(e) = self.flag_error(now, None) {
            return Err(e);
        }
        if now - self.checked >= CHECK_EVERY {
            self.checked = now;
            let area = self.area;
            self.engine.check_outside(self.name, self.ours, &mut || {
                area.unfinished(turn).is_none()
            })?;
        }
        Ok(())
    }

    /// The error of a call that rank `peer` gave up, failing the communicator. The rank that
    /// gave up sent its failure notice first, so the links usually say what happened and to
    /// whom (a rank that died, say): that error wins.
    fn gave_up(&mut self, peer: Rank, turn: u64) -> Error {
        let until = Instant::now() + Duration::from_millis(100);
        let area = self.area;
        loop {
            let settled = &mut || area.unfinished(turn).is_none();
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
        self.engine.fail_outside(&e);
        e
    }

    /// The error if abort() was called or the deadline passed (`blocker`: the rank waited
    /// for, if any); the caller fails the communicator with it.
    fn flag_error(&self, now: Instant, blocker: Option<Rank>) -> Option<Error> {
        if self.flags.is_aborted() {
            return Some(Error::Aborted {
                rank: self.rank,
                op: self.name.to_string(),
                why: "abort() was called".into(),
            });
        }
        (now >= self.deadline).then(|| Error::Timeout {
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
    fn until<T>(&mut self, mut ready: impl FnMut() -> std::result::Result<T, Rank>) -> Result<T> {
        let mut spins = 0u32;
        let mut start: Option<Instant> = None;
        loop {
            let blocker = match ready() {
                Ok(v) => return Ok(v),
                Err(r) => r,
            };
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let start = *start.get_or_insert(now);
            if let Some(e) = self.flag_error(now, Some(blocker)) {
                self.engine.fail_outside(&e);
                return Err(e);
            }
            if now - self.checked >= CHECK_EVERY {
                self.checked = now;
                self.engine
                    .check_outside(self.name, self.ours, &mut || ready().is_ok())?;
            }
            let idle = now - start;
            if idle >= YIELD {
                let nap = CHECK_EVERY.min(self.deadline - now);
                self.area.sleep_on(blocker, nap, || ready().is_ok());
            } else if idle >= self.spin {
                std::thread::yield_now();
            }
        }
    }
}
