//! Collectives through the group area (ranks of one host only), with no messages and no
//! schedule:
//!
//! - small all-reduces (up to [`AREA_BYTES`]): each rank publishes its contribution in its own
//!   area buffer and reads everybody's — no system call; the path for sizes whose cost is
//!   otherwise the machinery around a few bytes;
//! - large all-reduces, when every rank can read every peer's memory (`process_vm_readv`): each
//!   rank publishes the addresses of its buffers, reduces its slice reading every peer's input
//!   in place, part by part, then copies the other slices straight out of their owners' outputs
//!   as the owners publish progress. Every byte crosses once: about 5·S of memory traffic for
//!   two ranks (the least an all-reduce of S bytes can move), against 9·S through message rings.
//!
//! Contributions are folded in rank order, so all ranks get the same bits. While waiting for
//! peers this path watches what the engine would: abort, the deadline, dead peers, failure
//! notices, and a peer that started another collective (its descriptor arrives on a link) —
//! which is reported as a mismatch, as in the engine.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use oxccl_transport_shm::area::{self, AREA_BYTES, Area, DESC_BYTES, MAX_PARTS, Published};
use oxccl_transport_shm::cma;

use super::descriptor::Descriptor;
use super::driver::{Engine, Flags, OpName};
use crate::algo::{Algorithm, Collective, Plan};
use crate::error::{Error, Result};
use crate::reduce::cpu;
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
/// Largest all-reduce, in bytes, done one-shot (every rank reads every contribution whole).
const ONE_SHOT_MAX: usize = 16 * 1024;

/// The shared-area path of one communicator.
#[derive(Debug)]
pub struct AreaPath {
    area: Area,
    rank: Rank,
    /// Every rank of the communicator can read every other's memory (agreed at setup).
    direct: bool,
    /// Smallest all-reduce, in bytes, that reads peers' memory directly.
    direct_min: usize,
    /// Where peers' parts land before they are reduced.
    scratch: Mutex<Vec<u64>>,
    /// How long to spin before yielding.
    spin: Duration,
}

impl AreaPath {
    /// The path over `area` for `rank`; `direct` only if every rank agreed that all can read
    /// each other's memory.
    pub fn new(area: Area, rank: Rank, direct: bool, direct_min: usize) -> AreaPath {
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
            direct_min,
            scratch: Mutex::new(Vec::new()),
            spin,
        }
    }

    /// Whether `plan` runs here: an all-reduce that fits a buffer, or any all-reduce when
    /// every rank reads the others' memory directly.
    pub fn takes(&self, plan: &Plan) -> bool {
        plan.collective == Collective::AllReduce && self.way(plan).is_some()
    }

    /// Which way `plan` goes, if through the area.
    fn way(&self, plan: &Plan) -> Option<Way> {
        let bytes = plan.count * plan.dtype.size();
        if bytes <= ONE_SHOT_MAX {
            Some(Way::OneShot)
        } else if self.direct && bytes >= self.direct_min && self.parts(plan) <= MAX_PARTS {
            Some(Way::Direct)
        } else if bytes <= AREA_BYTES {
            Some(Way::TwoShot)
        } else {
            None
        }
    }

    /// Parts of the largest slice of a direct all-reduce of `plan`.
    fn parts(&self, plan: &Plan) -> u64 {
        let n = self.area.len();
        let biggest = plan.count.div_ceil(n) * plan.dtype.size();
        biggest.div_ceil(PART_BYTES) as u64
    }

    /// The descriptor collective `seq` carries on this path.
    pub fn descriptor(seq: u64, plan: &Plan) -> Descriptor {
        Descriptor::collective(seq, plan, Algorithm::Direct, 0)
    }

    /// All-reduce `input` into `output` (which may be the same memory) as collective `seq`,
    /// the area's `turn`-th use (collectives on the engine do not touch the area, so its turns
    /// are counted apart).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        engine: &mut Engine,
        flags: &Flags,
        (seq, turn): (u64, u64),
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
        timeout: Duration,
    ) -> Result<()> {
        let name = OpName::Collective(plan.collective, seq);
        let ours = Self::descriptor(seq, plan);
        let bytes = plan.count * plan.dtype.size();
        if input.1 < bytes || output.1 < bytes {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {name}: buffers too small",
                self.rank
            )));
        }
        let mut w = Waiter::new(
            engine,
            flags,
            &self.area,
            &name,
            &ours,
            (timeout, self.spin),
            self.rank,
        );
        match self.way(plan) {
            Some(Way::OneShot) => self.small_all_reduce(&mut w, turn, plan, input, output),
            Some(Way::TwoShot) => self.two_shot_all_reduce(&mut w, turn, plan, input, output),
            Some(Way::Direct) => self.direct_all_reduce(&mut w, turn, plan, input, output),
            None => Err(Error::InvalidArgument(format!(
                "rank {}: {name}: not for the shared area",
                self.rank
            ))),
        }
    }

    /// Two-shot: each rank copies into its buffer the slices its peers reduce, reduces its own
    /// slice reading the peers' copies, leaves the result in its buffer, and copies every other
    /// slice's result from its owner's buffer. Shared memory only, no system call.
    fn two_shot_all_reduce(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<()> {
        let (n, me) = (self.area.len(), self.rank);
        let size = plan.dtype.size();
        let bytes = plan.count * size;
        let in_place = std::ptr::eq(input.0, output.0);
        let slice = slicer(plan.count, n, size);
        let mine = self.area.my_buffer(turn);
        for q in (0..n).filter(|&q| q != me) {
            let (lo, hi) = slice(q);
            // SAFETY: `input` holds `bytes` bytes and the buffer AREA_BYTES ≥ `bytes` (this
            // way is taken only then); this rank owns its buffer (see `exchange`).
            unsafe { std::ptr::copy_nonoverlapping(input.0.add(lo), mine.add(lo), hi - lo) };
        }
        // The publication says the copies are there.
        let mut all = Vec::with_capacity(n);
        self.exchange(w, turn, ([].as_ptr(), 0), bytes, |_, data| {
            all.push(data);
            Ok(())
        })?;
        let (lo, hi) = slice(me);
        // SAFETY: `output` holds `bytes` bytes; `input` too, and is either the same memory
        // (then only `out` is formed) or disjoint from it; peers' buffers hold their copies of
        // this slice, unchanged until they publish `turn + 1`.
        let out = unsafe { std::slice::from_raw_parts_mut(output.0.add(lo), hi - lo) };
        let mut first = true;
        for (_, &data) in all.iter().enumerate().filter(|&(q, _)| q != me) {
            // SAFETY: see above.
            let theirs = unsafe { std::slice::from_raw_parts(data.add(lo), hi - lo) };
            if first && !in_place {
                // SAFETY: as above.
                let a = unsafe { std::slice::from_raw_parts(input.0.add(lo), hi - lo) };
                cpu::reduce_into_bytes(out, a, theirs, plan.dtype, plan.op.combiner())?;
            } else {
                cpu::reduce_bytes(out, theirs, plan.dtype, plan.op.combiner())?;
            }
            first = false;
        }
        if plan.op == ReduceOp::Avg {
            cpu::divide_bytes(out, plan.dtype, n)?;
        }
        // SAFETY: our own buffer's slice, not read by peers until the progress below.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), mine.add(lo), hi - lo) };
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
            // SAFETY: rank q's result for its slice, complete (its progress said so) and
            // unchanged until it publishes `turn + 1`; our output's range is ours.
            unsafe { std::ptr::copy_nonoverlapping(all[q].add(lo), output.0.add(lo), hi - lo) };
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

    /// The direct all-reduce: see the module's documentation.
    fn direct_all_reduce(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<()> {
        let (n, me) = (self.area.len(), self.rank);
        let size = plan.dtype.size();
        let bytes = plan.count * size;
        let in_place = std::ptr::eq(input.0, output.0);
        let slice = slicer(plan.count, n, size);
        let part = PART_BYTES / size * size;

        self.area.set_progress(turn, 0);
        let mut addrs = [0u8; 16];
        addrs[..8].copy_from_slice(&(input.0 as u64).to_le_bytes());
        addrs[8..].copy_from_slice(&(output.0 as u64).to_le_bytes());
        let mut peer_addrs: Vec<(usize, usize)> = Vec::with_capacity(n);
        self.exchange(w, turn, (addrs.as_ptr(), addrs.len()), bytes, |_, data| {
            let mut a = [0u8; 16];
            // SAFETY: every publication of this turn carries 16 bytes of addresses (the
            // descriptors matched, so every rank took this path).
            unsafe { std::ptr::copy_nonoverlapping(data, a.as_mut_ptr(), 16) };
            let word = |i: usize| {
                u64::from_le_bytes(a[i * 8..i * 8 + 8].try_into().expect("8 bytes")) as usize
            };
            peer_addrs.push((word(0), word(1)));
            Ok(())
        })?;
        // A failed read means the peer died or unmapped memory it promised to keep: either
        // way it failed.
        let opname = w.name.to_string();
        let read_err = |peer: Rank, e: std::io::Error| Error::PeerFailed {
            rank: me,
            peer,
            op: opname.clone(),
            cause: format!("reading its memory directly failed: {e}"),
        };

        // Reduce-scatter: our slice, part by part, reading each peer's input in place.
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        scratch.resize(PART_BYTES / 8, 0);
        let tmp: &mut [u8] = bytemuck::cast_slice_mut(&mut scratch[..]);
        let (lo, hi) = slice(me);
        let mut done = 0u64;
        let mut at = lo;
        while at < hi {
            let len = part.min(hi - at);
            let mut first = true;
            for q in (0..n).filter(|&q| q != me) {
                // SAFETY: `tmp` is ours; the kernel checks the peer's range, which the peer
                // keeps valid and unchanged until every rank finishes this turn.
                unsafe {
                    cma::read(
                        self.area.pid(q),
                        peer_addrs[q].0 + at,
                        tmp.as_mut_ptr(),
                        len,
                    )
                }
                .map_err(|e| {
                    let e = read_err(q, e);
                    w.engine.fail_outside(&e);
                    e
                })?;
                // SAFETY: `output` holds `bytes` bytes; `input` too, and is either the same
                // memory (then only `out` is formed) or disjoint from it.
                let out = unsafe { std::slice::from_raw_parts_mut(output.0.add(at), len) };
                if first && !in_place {
                    // SAFETY: as above.
                    let a = unsafe { std::slice::from_raw_parts(input.0.add(at), len) };
                    cpu::reduce_into_bytes(out, a, &tmp[..len], plan.dtype, plan.op.combiner())?;
                } else {
                    cpu::reduce_bytes(out, &tmp[..len], plan.dtype, plan.op.combiner())?;
                }
                first = false;
            }
            if plan.op == ReduceOp::Avg {
                // SAFETY: as above.
                let out = unsafe { std::slice::from_raw_parts_mut(output.0.add(at), len) };
                cpu::divide_bytes(out, plan.dtype, n)?;
            }
            at += len;
            done += 1;
            self.area.set_progress(turn, done);
        }
        drop(scratch);

        // All-gather: every other slice straight from its owner's output, as it progresses.
        for q in (1..n).map(|k| (me + k) % n) {
            let (lo, hi) = slice(q);
            let mut at = lo;
            while at < hi {
                let parts = w.until(|| {
                    let p = self.area.progress(q, turn);
                    (p as usize * part > at - lo || lo + p as usize * part >= hi)
                        .then_some(p)
                        .ok_or(q)
                })?;
                let upto = (lo + parts as usize * part).min(hi);
                // SAFETY: `output` holds `bytes` bytes and this range of it is ours to write
                // (in place, no peer reads it any more: its owner has finished these parts,
                // which needed every rank's input there).
                unsafe {
                    cma::read(
                        self.area.pid(q),
                        peer_addrs[q].1 + at,
                        output.0.add(at),
                        upto - at,
                    )
                }
                .map_err(|e| {
                    let e = read_err(q, e);
                    w.engine.fail_outside(&e);
                    e
                })?;
                at = upto;
            }
        }
        // Peers read our buffers until they finish: the caller gets them back only then.
        self.area.finish(turn);
        w.until(|| self.area.unfinished(turn).map_or(Ok(()), Err))?;
        Ok(())
    }
}

/// The ways through the area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    /// Everyone reads everyone's whole contribution (small).
    OneShot,
    /// Reduce-scatter then all-gather through shared buffers (medium).
    TwoShot,
    /// Reduce-scatter then all-gather reading peers' memory (large).
    Direct,
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
            if self.flags.is_aborted() {
                let e = Error::Aborted {
                    rank: self.rank,
                    op: self.name.to_string(),
                    why: "abort() was called".into(),
                };
                self.engine.fail_outside(&e);
                return Err(e);
            }
            if now >= self.deadline {
                let e = Error::Timeout {
                    rank: self.rank,
                    op: self.name.to_string(),
                    peer: Some(blocker).filter(|&r| r != self.rank),
                    after: self.timeout,
                };
                self.engine.fail_outside(&e);
                return Err(e);
            }
            if now - self.checked >= CHECK_EVERY {
                self.checked = now;
                self.engine.check_outside(self.name, self.ours)?;
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
