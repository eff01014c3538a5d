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
//! Each element's result is folded once, by its slice's owner, and copied to everyone (one-shot:
//! every rank folds all contributions in rank order), so all ranks get the same bits. While waiting for
//! peers this path watches what the engine would: abort, the deadline, dead peers, failure
//! notices, and a peer that started another collective (its descriptor arrives on a link) —
//! which is reported as a mismatch, as in the engine.
//!
//! Each way has its file: [`one_shot`], [`two_shot`], [`direct`]; [`waiter`] is how they wait
//! on each other with the engine's guarantees.
//!
//! [`Config::direct_min`]: crate::Config::direct_min
//! [`Config::direct_max`]: crate::Config::direct_max

use std::sync::Mutex;
use std::time::Duration;

use oxccl_transport_shm::area::{self, AREA_BYTES, Area, DESC_BYTES, Published};

use super::descriptor::Descriptor;
use super::driver::Engine;
use super::flags::Flags;
use super::op::OpName;
use crate::algo::{Algorithm, Plan};
use crate::error::{Error, Result};
use crate::tune::Way;
use crate::types::Rank;
use waiter::Waiter;

mod direct;
mod one_shot;
mod two_shot;
mod waiter;

/// Spin this long before yielding, when every rank of the host has a core of its own...
const SPIN: Duration = Duration::from_micros(20);
/// ...and this long when ranks outnumber cores (the awaited rank may need this core).
const SPIN_CROWDED: Duration = Duration::from_micros(2);
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
