//! The group area: one small segment per rank, mapped by every rank of the host, where a
//! collective can be done in one step without messages — each rank publishes its contribution
//! in its own segment, and every rank reads what it needs. This module is the memory layout and
//! the publish/observe protocol; what is computed lives in oxccl's executor.
//!
//! Each rank's segment holds a ring of small slots, one per turn (`seq % slots`: [`SLOTS`], or
//! [`WIDE_SLOTS`] in an area some rank of which is crowded, agreed at setup), and two large
//! buffers used alternately (`seq % 2`) by turns whose data does not fit a slot:
//!
//! - writer (owner): writes data (in the slot, or in the large buffer) and descriptor, then
//!   stores `seq + 1` into the slot's stamp (release);
//! - readers: acquire-load the stamp; once it equals `seq + 1` the descriptor and data are
//!   theirs to read, until they publish `seq + 1` themselves.
//!
//! A rank reads what it needs of turn `seq` before it publishes `seq + 1`. Before it writes turn
//! `seq`, its owner makes sure that every rank has published `seq - lag` (so, with
//! `lag <= slots / 2`, has finished with the slot, and its descriptor of that turn is still
//! there to check), and for a large buffer that every rank has published `seq - 1`. So a rank
//! that reads nothing from a peer in a turn (a broadcast's root, a reduce's other ranks) runs
//! up to `lag` turns ahead of it instead of waiting for it every call ([`LAG`], or
//! [`CROWDED_LAG`] where ranks outnumber cores), and a small collective
//! costs one cache-line transfer per peer read: stamp, length, the descriptor's tag and up to
//! 40 bytes of data share one line, and the heads of consecutive turns lie side by side.
//!
//! A direct collective (peers read each other's memory) also uses the `progress` word (parts
//! of this rank's slice done) and the `done` counter (finished reading everybody's memory), and
//! every rank waits for all `done` before returning the caller's buffers. Waiters sleep on the
//! owner's futex (`bell`) after spinning.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::cma::Process;
use crate::primitive::{AtomicU64, Ordering};
use crate::segment::Segment;

/// Bytes of data each large area buffer holds.
pub const AREA_BYTES: usize = 4 << 20;

/// Bytes of data a slot holds: publications up to this size go in the turn's slot, larger
/// ones in a large buffer.
pub const SLOT_BYTES: usize = 4096;

/// Small slots per rank, one per turn in a ring, in an area where every rank has a core.
pub const SLOTS: u64 = 64;

/// Small slots per rank in an area where some rank is crowded ([`Area::widened`]), so that a
/// crowded rank may run [`CROWDED_LAG`] turns ahead. Not every area: a ring this wide made
/// 2-rank calls slower where each rank has a core (`allreduce-perf --ranks 2`, paired runs
/// against 64 slots: 8-byte broadcast 1.09, 1 KiB all-reduce 1.06 of the time, 2026-12-02),
/// its slots and the peer's falling out of the nearer caches.
pub const WIDE_SLOTS: u64 = 256;

/// How many turns a rank may run ahead of a peer it reads nothing from, where each rank has
/// a core: a writer checks every rank's descriptor of turn `seq - LAG` before it writes turn
/// `seq`. Any lag up to `slots / 2` is safe (the area's ring), and ranks may use different
/// ones: a rank's descriptor of turn `t` stays until it writes `t + slots`, which waits for
/// every checker to publish `t + slots - lag` (the writer's lag), while a checker looks at it
/// by its own turn `t + lag'` (the checker's lag), which comes first where
/// `lag + lag' <= slots`.
pub const LAG: u64 = 8;

/// The lag of ranks that outnumber the cores they run on ([`LAG`] otherwise), in a ring of
/// [`WIDE_SLOTS`]. Such ranks take turns on the cores, and a broadcast's root or a reduce's
/// other ranks that may run further ahead do more calls per turn (each turn ends in context
/// switches, a few µs each): 4 ranks on 2 cores, 16 bytes, paired runs of the two builds, a
/// broadcast took 0.49 of the time with 32 as with 8, a reduce 0.65, at 1440 bytes 0.71 and
/// 0.72, while all-reduce and all-gather (every rank reads every other) stayed within noise
/// (2026-11-28); 128 against 32, 8 bytes, 0.85 and 0.98 (2026-12-02).
pub const CROWDED_LAG: u64 = WIDE_SLOTS / 2;
// Both at least 1 (a rank's first claim of a turn waits for the one before), and at most half
// the ring they run in, so that any two ranks' lags add up to the ring at most; that bound is
// exact: a descriptor is checked in `claim` by the checker's turn `t + lag'`, so every path
// that publishes a turn must `claim` it first. A crowded rank's area is always wide.
const _: () = assert!(1 <= LAG && LAG <= SLOTS / 2 && LAG <= CROWDED_LAG);
const _: () = assert!(CROWDED_LAG <= WIDE_SLOTS / 2 && SLOTS.is_power_of_two());
const _: () = assert!(WIDE_SLOTS.is_power_of_two() && SLOTS <= WIDE_SLOTS);

const MAGIC: u64 = u64::from_le_bytes(*b"OXSHMAR7");

/// Bytes of the descriptor each buffer carries (what its owner called).
pub const DESC_BYTES: usize = 48;

/// One slot's head: stamp, length and the descriptor's tag, followed in the same cache line
/// by data of up to [`INLINE_BYTES`]; larger data lies in the slot's body. Heads lie side by
/// side, one line each, and so do the full descriptors (read only when tags differ, to say
/// how), so a ring of small calls walks through consecutive lines.
#[repr(C, align(64))]
struct BufferHead {
    /// `seq + 1` once the data of collective `seq` is published; 0 before any.
    stamp: AtomicU64,
    /// Data length in bytes, with [`IN_BUFFER`] set when the data is in the large buffer,
    /// [`IN_BODY`] when in the slot's body (neither: in this line).
    len: AtomicU64,
    /// [`tag`] of what the owner called at `seq`.
    tag: AtomicU64,
}

/// Where data in a head starts, from the head.
const HEAD: usize = 24;
/// Bytes of data a head holds.
const INLINE_BYTES: usize = 64 - HEAD;
/// The bit of a head's `len` that says the data lies in the turn's large buffer.
const IN_BUFFER: u64 = 1 << 63;
/// The bit of a head's `len` that says the data lies in the slot's body.
const IN_BODY: u64 = 1 << 62;
/// The bits of a head's `len` that say where the data lies.
const PLACE: u64 = IN_BUFFER | IN_BODY;
const _: () = assert!(size_of::<BufferHead>() == 64 && DESC_BYTES <= 64);

/// A 64-bit digest of a descriptor: equal descriptors have equal tags; a difference in any one
/// word always changes it (each step is a bijection of the running value).
#[inline]
pub fn tag(desc: &[u8; DESC_BYTES]) -> u64 {
    desc.chunks_exact(8).fold(0x6f78_6363_6c5f_6172, |h, w| {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        (h ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
    })
}

#[repr(C)]
struct AreaHeader {
    magic: AtomicU64,
    bytes: AtomicU64,
    /// `seq + 1` of the last collective this rank finished reading everybody's buffers for.
    done: CachePadded<AtomicU64>,
    /// Progress of a direct collective: `(seq + 1) << PROGRESS_BITS | parts finished`.
    progress: CachePadded<AtomicU64>,
    /// `seq + 1` while this rank may touch peers' memory in direct collective `seq`; 0 when
    /// it does not.
    touching: CachePadded<AtomicU64>,
    /// `seq + 1` of the direct collective this rank gave up (peers stop touching its memory).
    abandoned: CachePadded<AtomicU64>,
    /// Once this rank's communicator failed (an error, or abort()), the rank at the root of
    /// the failure, plus one (0: none): a peer that runs ahead without waiting for it looks here
    /// every call.
    failed: CachePadded<AtomicU64>,
    /// Where peers waiting on this rank sleep.
    bell: CachePadded<Bell>,
}

/// A futex peers sleep on until this rank changes something: `event` counts changes,
/// `sleepers` says whether a change must wake anybody (a system call only then). The futex is
/// the kernel's, so this one word is std's atomic even under loom (this module is not modelled).
#[repr(C)]
struct Bell {
    event: std::sync::atomic::AtomicU32,
    sleepers: std::sync::atomic::AtomicU32,
}

/// Bits of [`AreaHeader::progress`] that count parts.
const PROGRESS_BITS: u32 = 24;

/// Most parts a direct collective may publish progress for.
pub const MAX_PARTS: u64 = (1 << PROGRESS_BITS) - 1;

/// Where slot `k`'s head lies: heads follow the header, a line each.
#[inline]
const fn head_offset(k: usize) -> usize {
    size_of::<AreaHeader>().next_multiple_of(128) + k * 64
}

/// Where slot `k`'s full descriptor lies: descriptors follow the heads, a line each.
#[inline]
const fn desc_offset(k: usize) -> usize {
    head_offset(WIDE_SLOTS as usize) + k * 64
}

/// Where slot `k`'s body lies: bodies follow the descriptors, page-aligned.
#[inline]
const fn body_offset(k: usize) -> usize {
    desc_offset(WIDE_SLOTS as usize).next_multiple_of(4096) + k * SLOT_BYTES
}

/// Where the header, the heads, the descriptors and the bodies of a ring of `slots` end: the
/// part every call touches, mapped when the segment is (the large buffers are mapped as
/// messages first reach them).
const fn ring_end(slots: u64) -> usize {
    body_offset(slots as usize)
}

/// Where the widest ring ends: the layout has room for it in every area.
const RING_END: usize = ring_end(WIDE_SLOTS);

#[inline]
fn buffer_offset(b: usize) -> usize {
    RING_END.next_multiple_of(4096) + b * AREA_BYTES
}

fn area_len() -> usize {
    buffer_offset(2)
}

/// One rank's area segment.
#[derive(Debug)]
pub struct AreaSegment {
    seg: Segment,
}

impl AreaSegment {
    /// A new area for this rank.
    pub fn create() -> io::Result<AreaSegment> {
        let seg = Segment::create("oxccl-shm-area", area_len())?;
        // SAFETY: a fresh zeroed mapping large enough for the header (all-zero atomics are
        // valid); not yet shared.
        let h = unsafe { &*seg.as_ptr().cast::<AreaHeader>() };
        h.magic.store(MAGIC, Ordering::Relaxed);
        h.bytes.store(AREA_BYTES as u64, Ordering::Relaxed);
        // A hint: without it, each of the first turns through the ring faulted its slot's
        // pages in, here and in every peer (`allreduce-perf -b 8 -e 32 -f 4 -w 5` on 2 ranks,
        // the 8-byte row, the first 64 calls: 7.0–8.4 µs a call before, 0.5–1.2 after).
        let _ = seg.prefault(ring_end(SLOTS));
        Ok(AreaSegment { seg })
    }

    /// A peer's area, checked before use.
    pub fn open(fd: OwnedFd) -> io::Result<AreaSegment> {
        let seg = Segment::map(fd)?;
        let ok = seg.len() >= area_len() && {
            // SAFETY: length checked first; the header's fields are atomics (any bytes are
            // valid), each loaded once.
            let h = unsafe { &*seg.as_ptr().cast::<AreaHeader>() };
            h.magic.load(Ordering::Relaxed) == MAGIC
                && h.bytes.load(Ordering::Relaxed) == AREA_BYTES as u64
        };
        if !ok {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an oxccl area segment",
            ));
        }
        let _ = seg.prefault(ring_end(SLOTS));
        Ok(AreaSegment { seg })
    }

    /// The descriptor to hand to peers.
    pub fn fd(&self) -> impl std::os::fd::AsFd + '_ {
        self.seg.fd()
    }

    #[inline]
    fn header(&self) -> &AreaHeader {
        // SAFETY: the mapping holds a header (checked) for as long as `self` lives.
        unsafe { &*self.seg.as_ptr().cast::<AreaHeader>() }
    }

    /// The head of slot `k` (below [`WIDE_SLOTS`]).
    #[inline]
    fn head(&self, k: usize) -> &BufferHead {
        // SAFETY: slot heads lie inside the mapping (its length was checked), 64-aligned.
        unsafe { &*self.seg.as_ptr().add(head_offset(k)).cast::<BufferHead>() }
    }

    /// Where the data of turn `seq` lies, by its [`PLACE`] bits: in its slot `k`'s head or
    /// body, or in its large buffer.
    #[inline]
    fn data(&self, seq: u64, k: usize, place: u64) -> *mut u8 {
        let at = if place & IN_BUFFER != 0 {
            buffer_offset((seq % 2) as usize)
        } else if place & IN_BODY != 0 {
            body_offset(k)
        } else {
            head_offset(k) + HEAD
        };
        // SAFETY: slots and buffers lie inside the mapping.
        unsafe { self.seg.as_ptr().add(at) }
    }

    /// The descriptor of slot `k`.
    #[inline]
    fn desc(&self, k: usize) -> *mut [u8; DESC_BYTES] {
        // SAFETY: descriptors lie inside the mapping (byte-aligned type).
        unsafe { self.seg.as_ptr().add(desc_offset(k)).cast() }
    }
}

/// Every rank's area, indexed by rank, as one rank sees them.
#[derive(Debug)]
pub struct Area {
    rank: usize,
    segments: Vec<Arc<AreaSegment>>,
    /// Each rank's process held by a pidfd, where one could be opened (never this rank's).
    processes: Vec<Option<Arc<Process>>>,
    /// Whether this rank may read and write each rank's memory directly (its process is
    /// proven to be the rank's).
    readable: Vec<bool>,
    direct: bool,
    /// Whether this process is registered for the kernel's global memory barrier
    /// ([`fenced_by_sleepers`]): then a change costs waking nobody no fence.
    light: bool,
    /// Slots in the ring, less one: turn `seq` lies in slot `seq & mask`.
    mask: u64,
}

/// Whether sleepers fence for wakers here: this process is registered for
/// `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` (Linux 4.16 on), so a sleeper's call runs a
/// full memory barrier on every running thread of every registered process. A rank that
/// changes a word peers may sleep on then only needs its stores kept in order before it loads
/// the sleeper count (the pattern is asymmetric Dekker: the rare side, going to sleep, pays
/// for both). Without it, every change pays a locked instruction, which waits for the store
/// of the change itself to reach the peer spinning on it: on 2 ranks that was half the cost
/// of an 8-byte broadcast. Registered once per process; ranks of one host share the kernel,
/// so all of them agree (one that did not register fences as before; a peer's missed
/// wake-up would then cost a nap, never correctness: every sleep has a timeout).
fn fenced_by_sleepers() -> bool {
    use rustix::thread::{MembarrierCommand, MembarrierQuery, membarrier, membarrier_query};
    static LIGHT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LIGHT.get_or_init(|| {
        membarrier_query().contains(MembarrierQuery::GLOBAL_EXPEDITED)
            && membarrier(MembarrierCommand::RegisterGlobalExpedited).is_ok()
    })
}

/// What a published buffer holds.
#[derive(Clone, Copy, Debug)]
pub struct Published {
    /// The [`tag`] of the owner's descriptor.
    pub tag: u64,
    /// The owner's full descriptor (read it only if the tag differs from the reader's).
    pub desc: *const [u8; DESC_BYTES],
    /// Its data.
    pub data: *const u8,
    /// Data length in bytes.
    pub len: usize,
}

impl Area {
    /// The area of `rank`, given in rank order every rank's segment, its process held by a
    /// pidfd (`None` where none could be opened; this rank's is not used), and whether this
    /// rank may reach its memory directly (only where its process is proven to be that rank's).
    pub fn new(
        rank: usize,
        segments: Vec<Arc<AreaSegment>>,
        processes: Vec<Option<Arc<Process>>>,
        readable: Vec<bool>,
    ) -> Area {
        assert!(
            processes.len() == segments.len() && readable.len() == segments.len(),
            "one process and one flag per rank"
        );
        let readable: Vec<bool> = (0..segments.len())
            .map(|r| r == rank || (readable[r] && processes[r].is_some()))
            .collect();
        let direct = readable.iter().all(|&r| r);
        Area {
            rank,
            segments,
            processes,
            readable,
            direct,
            light: fenced_by_sleepers(),
            mask: SLOTS - 1,
        }
    }

    /// The same area with a ring of [`WIDE_SLOTS`], for where some rank of it is crowded:
    /// every rank must agree before any uses it (each rank's ring is read by every other).
    pub fn widened(mut self) -> Area {
        for s in &self.segments {
            // A hint, as at creation: the rest of the ring, in this process's mappings.
            let _ = s.seg.prefault(RING_END);
        }
        self.mask = WIDE_SLOTS - 1;
        self
    }

    /// Slots in the ring: a lag may be half of it at most.
    #[inline]
    pub fn slots(&self) -> u64 {
        self.mask + 1
    }

    /// The slot of turn `seq`.
    #[inline(always)]
    fn slot(&self, seq: u64) -> usize {
        (seq & self.mask) as usize
    }

    /// Whether this rank can read and write every peer's memory directly (each peer held by a
    /// pidfd and proven to be that rank).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Rank `r`'s process, if this rank may reach its memory directly.
    fn reach(&self, r: usize) -> io::Result<&Process> {
        match &self.processes[r] {
            Some(p) if r != self.rank && self.readable[r] => Ok(p),
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("no direct access to rank {r}'s memory"),
            )),
        }
    }

    /// Reads `len` bytes at address `remote` in rank `r`'s process into `local`.
    ///
    /// The process is held by a pidfd opened at setup: every transfer is preceded by a check
    /// that it has not exited, and fails with an error ([`crate::cma::is_exit`]) instead of
    /// reaching anything once it has; [`Process::read`] says why a recycled pid is never
    /// reached. Also an error (`Unsupported`) for this rank and for ranks without direct
    /// access ([`Area::direct`]).
    ///
    /// # Safety
    ///
    /// `local..local+len` must be valid for writes and not accessed by anyone else during the
    /// call.
    pub unsafe fn read_from(
        &self,
        r: usize,
        remote: usize,
        local: *mut u8,
        len: usize,
    ) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.reach(r)?.read(remote, local, len) }
    }

    /// Writes `len` bytes from `local` to address `remote` in rank `r`'s process; errors as
    /// [`Area::read_from`] (a peer that exited is never written).
    ///
    /// # Safety
    ///
    /// `local..local+len` must be valid for reads and not written by anyone during the call.
    pub unsafe fn write_to(
        &self,
        r: usize,
        remote: usize,
        local: *const u8,
        len: usize,
    ) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.reach(r)?.write(remote, local, len) }
    }

    /// Whether rank `r`'s process is alive, by its pidfd: false once it has exited (a zombie
    /// counts as exited). True for this rank, and for a rank held by no pidfd (its pid is not
    /// visible here, or the kernel has none): there the answer is unknown, and the caller's
    /// deadline must catch a dead peer.
    pub fn peer_alive(&self, r: usize) -> bool {
        r == self.rank || self.processes[r].as_ref().is_none_or(|p| !p.exited())
    }

    /// Publishes that this rank finished `parts` parts of direct collective `seq`.
    pub fn set_progress(&self, seq: u64, parts: u64) {
        let v = ((seq + 1) << PROGRESS_BITS) | parts.min(MAX_PARTS);
        self.segments[self.rank]
            .header()
            .progress
            .store(v, Ordering::Release);
        self.ring();
    }

    /// Parts of collective `seq` rank `r` has finished (0 while it is not there yet; all once
    /// it is further).
    pub fn progress(&self, r: usize, seq: u64) -> u64 {
        let v = self.segments[r].header().progress.load(Ordering::Acquire);
        let at = v >> PROGRESS_BITS;
        if at == seq + 1 {
            v & MAX_PARTS
        } else if at > seq + 1 {
            // Already in a later collective: everything of `seq` is done.
            MAX_PARTS
        } else {
            0
        }
    }

    /// Ranks in the area.
    #[inline]
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Whether the area has no ranks (never).
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Whether `bytes` of data for one turn go in the large buffer rather than the slot.
    #[inline]
    pub fn in_buffer(bytes: usize) -> bool {
        bytes > SLOT_BYTES
    }

    /// Where `bytes` of data for one turn go ([`PLACE`] bits).
    #[inline(always)]
    fn place(bytes: usize) -> u64 {
        if Area::in_buffer(bytes) {
            IN_BUFFER
        } else if bytes > INLINE_BYTES {
            IN_BODY
        } else {
            0
        }
    }

    /// This rank's place for `bytes` (at most [`AREA_BYTES`]) of data of turn `seq`, to fill
    /// before [`Area::publish`]: the turn's slot, or ([`Area::in_buffer`]) its large buffer.
    /// Writable once every rank has published `seq - lag` (the writer's lag, at most
    /// [`Area::slots`] / 2; [`Area::published`]), and for a large buffer `seq - 1`.
    #[inline]
    pub fn my_buffer(&self, seq: u64, bytes: usize) -> *mut u8 {
        self.segments[self.rank].data(seq, self.slot(seq), Area::place(bytes))
    }

    /// Rank `r`'s large buffer of turn `seq`, as mapped in this process: read it only where
    /// `r` says it wrote it for this turn (and keeps it until this rank is done).
    #[inline]
    pub fn buffer_of(&self, r: usize, seq: u64) -> *const u8 {
        self.segments[r].data(seq, 0, IN_BUFFER).cast_const()
    }

    /// Publishes this rank's turn `seq`: a descriptor, the length of the call's data `len`, and
    /// `bytes` of data written to [`Area::my_buffer`] (given the same `bytes`).
    #[inline]
    pub fn publish(&self, seq: u64, desc: &[u8; DESC_BYTES], tag: u64, len: usize, bytes: usize) {
        let s = &self.segments[self.rank];
        let k = self.slot(seq);
        // SAFETY: this rank owns its slot until it stamps it; peers read the descriptor only
        // after acquiring the stamp stored below.
        unsafe { s.desc(k).write(*desc) };
        let h = s.head(k);
        h.tag.store(tag, Ordering::Relaxed);
        h.len
            .store(len as u64 & !PLACE | Area::place(bytes), Ordering::Relaxed);
        h.stamp.store(seq + 1, Ordering::Release);
        self.ring();
    }

    /// Rank `r`'s publication of turn `seq` if it is there (its data valid until this rank
    /// publishes `seq + 1`; its descriptor until every rank has published `seq + slots - lag`,
    /// with `r`'s lag). A stamp beyond `seq` means `r` is already further: `Err`.
    #[inline]
    pub fn observe(&self, r: usize, seq: u64) -> Result<Option<Published>, u64> {
        let s = &self.segments[r];
        let k = self.slot(seq);
        let h = s.head(k);
        let stamp = h.stamp.load(Ordering::Acquire);
        if stamp == seq + 1 {
            // Not clamped: a direct collective publishes its message length, larger than the
            // buffer, with addresses as data; readers check it against their own call first.
            let len = h.len.load(Ordering::Relaxed);
            let tag = h.tag.load(Ordering::Relaxed);
            return Ok(Some(Published {
                tag,
                desc: s.desc(k),
                data: s.data(seq, k, len & PLACE),
                len: (len & !PLACE) as usize,
            }));
        }
        if stamp > seq + 1 {
            Err(stamp - 1)
        } else {
            Ok(None)
        }
    }

    /// Hints that rank `r`'s head of turn `seq` (its stamp, call and first data bytes: one
    /// cache line) will be read soon, so that its trip from `r`'s core overlaps this rank's
    /// work on the turn before. Never faults and changes nothing; a no-op off x86-64.
    #[inline(always)]
    pub fn prefetch(&self, r: usize, seq: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let h: *const BufferHead = self.segments[r].head(self.slot(seq));
            // SAFETY: a prefetch only hints the cache; it never faults or reads memory into
            // the program (and the head lies in the mapping).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(h.cast::<i8>()) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (r, seq);
    }

    /// The tag and data length (without the place) rank `r` published for turn `seq`: what
    /// [`Area::observe`] says of the call there, without working out where its data and
    /// descriptor lie (the lagged check compares only these). Errors as `observe`.
    #[inline]
    pub fn call_of(&self, r: usize, seq: u64) -> Result<Option<(u64, u64)>, u64> {
        let h = self.segments[r].head(self.slot(seq));
        let stamp = h.stamp.load(Ordering::Acquire);
        if stamp == seq + 1 {
            let tag = h.tag.load(Ordering::Relaxed);
            return Ok(Some((tag, h.len.load(Ordering::Relaxed) & !PLACE)));
        }
        if stamp > seq + 1 {
            Err(stamp - 1)
        } else {
            Ok(None)
        }
    }

    /// Whether rank `r` has published turn `seq` (and so every turn before it).
    #[inline]
    pub fn published(&self, r: usize, seq: u64) -> bool {
        // A slot's stamps only grow: a later turn in the same slot is later still.
        self.segments[r]
            .head(self.slot(seq))
            .stamp
            .load(Ordering::Acquire)
            > seq
    }

    /// Says this rank may touch peers' memory in direct collective `seq` from now on. Look at
    /// [`Area::abandoned`] after this and before each touch: with [`Area::abandon`] and
    /// [`Area::touching`] this is Dekker's pattern (all four accesses sequentially consistent),
    /// so a rank that saw a peer not touching after it gave up knows the peer will see that
    /// and never touch.
    pub fn enter(&self, seq: u64) {
        self.segments[self.rank]
            .header()
            .touching
            .store(seq + 1, Ordering::SeqCst);
    }

    /// Says this rank no longer touches peers' memory.
    pub fn leave(&self) {
        self.segments[self.rank]
            .header()
            .touching
            .store(0, Ordering::SeqCst);
        self.ring();
    }

    /// Whether rank `r` may be touching peers' memory in direct collective `seq`.
    pub fn touching(&self, r: usize, seq: u64) -> bool {
        self.segments[r].header().touching.load(Ordering::SeqCst) == seq + 1
    }

    /// Says this rank gave up direct collective `seq`: peers stop touching its memory.
    pub fn abandon(&self, seq: u64) {
        self.segments[self.rank]
            .header()
            .abandoned
            .store(seq + 1, Ordering::SeqCst);
        self.ring();
    }

    /// Says this rank's communicator failed, `origin` being the rank at the root of the
    /// failure (this one, or a peer it saw fail): peers fail their next call through the area.
    pub fn fail(&self, origin: usize) {
        let h = self.segments[self.rank].header();
        // The first word stands.
        let _ =
            h.failed
                .compare_exchange(0, origin as u64 + 1, Ordering::AcqRel, Ordering::Acquire);
        self.ring();
    }

    /// The first other rank whose communicator failed ([`Area::fail`]), if any, and the rank
    /// it named at the root of the failure (itself where what it wrote is not a rank).
    #[inline]
    pub fn failed_peer(&self) -> Option<(usize, usize)> {
        (0..self.segments.len()).find_map(|r| {
            let v = self.segments[r].header().failed.load(Ordering::Acquire);
            let origin = (v as usize).wrapping_sub(1);
            (r != self.rank && v != 0).then_some((r, if origin < self.len() { origin } else { r }))
        })
    }

    /// The first rank that gave up direct collective `seq`, if any.
    pub fn abandoned(&self, seq: u64) -> Option<usize> {
        self.segments
            .iter()
            .position(|s| s.header().abandoned.load(Ordering::SeqCst) == seq + 1)
    }

    /// Records that this rank has read every buffer of `seq`.
    pub fn finish(&self, seq: u64) {
        self.segments[self.rank]
            .header()
            .done
            .store(seq + 1, Ordering::Release);
        self.ring();
    }

    /// Wakes peers sleeping on this rank (after a change they may wait for).
    #[inline]
    fn ring(&self) {
        use std::sync::atomic::Ordering::{Relaxed, SeqCst};
        let bell = &self.segments[self.rank].header().bell;
        if self.light {
            // Sleepers fence for us (`fenced_by_sleepers`): keep the change before the load.
            std::sync::atomic::compiler_fence(SeqCst);
            if bell.sleepers.load(Relaxed) == 0 {
                return;
            }
        }
        bell.event.fetch_add(1, SeqCst);
        if bell.sleepers.load(SeqCst) > 0 {
            let _ = rustix::thread::futex::wake(
                &bell.event,
                rustix::thread::futex::Flags::empty(),
                u32::MAX,
            );
        }
    }

    /// Sleeps until rank `r` changes something, `ready` says yes, or `max` passes (spurious
    /// wake-ups allowed: callers check again).
    pub fn sleep_on(&self, r: usize, max: std::time::Duration, ready: impl FnOnce() -> bool) {
        use std::sync::atomic::Ordering::SeqCst;
        let bell = &self.segments[r].header().bell;
        bell.sleepers.fetch_add(1, SeqCst);
        if self.light {
            // Every registered thread now runs a full barrier: `r` either sees us sleeping
            // from here on, or made its change visible before this returns (Dekker's pattern
            // with the owner's `ring`, the fence on this side only).
            let _ = rustix::thread::membarrier(rustix::thread::MembarrierCommand::GlobalExpedited);
        }
        // A change after this load changes `event`, so the wait below returns at once; a change
        // before it is seen by `ready` (Dekker's pattern with the owner's `ring`).
        let seen = bell.event.load(SeqCst);
        if !ready() {
            let t = rustix::thread::futex::Timespec {
                tv_sec: max.as_secs() as i64,
                tv_nsec: i64::from(max.subsec_nanos()),
            };
            let _ = rustix::thread::futex::wait(
                &bell.event,
                rustix::thread::futex::Flags::empty(),
                seen,
                Some(&t),
            );
        }
        bell.sleepers.fetch_sub(1, SeqCst);
    }

    /// The first rank that has not finished `seq` ([`Area::finish`]), if any.
    pub fn unfinished(&self, seq: u64) -> Option<usize> {
        self.segments
            .iter()
            .position(|s| s.header().done.load(Ordering::Acquire) <= seq)
    }
}

// SAFETY: the area is shared memory governed by the stamp/done protocol; the handle is
// immutable.
unsafe impl Send for Area {}
// SAFETY: as above.
unsafe impl Sync for Area {}

// Loom's atomics work only inside a loom model (`tests/loom.rs` models the ring).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// Page faults this thread has taken so far (minor: pages mapped on first touch).
    fn minor_faults() -> i64 {
        // SAFETY: all-zero is a valid `rusage`, which getrusage fills.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `u` is a valid `rusage` to write.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
        u.ru_minflt
    }

    /// Two ranks' areas as their two processes map them: each segment created by one, and
    /// mapped again (opened) for the other.
    fn pair() -> (Area, Area) {
        let made: Vec<Arc<AreaSegment>> = (0..2)
            .map(|_| Arc::new(AreaSegment::create().unwrap()))
            .collect();
        let opened = made
            .iter()
            .map(|s| {
                let fd = s.fd().as_fd().try_clone_to_owned().unwrap();
                Arc::new(AreaSegment::open(fd).unwrap())
            })
            .collect();
        let area = |rank, segs| Area::new(rank, segs, vec![None, None], vec![false, false]);
        (area(0, made), area(1, opened))
    }

    /// One trip around the ring: both ranks publish `bytes` (8 or more, at most a slot) in
    /// every slot, the turn's number first (and past 8 bytes a mark in the last byte), each
    /// reading the other's: 8 bytes lie in the heads, more in the bodies.
    fn round(areas: [&Area; 2], bytes: usize) {
        let desc = [7u8; DESC_BYTES];
        for seq in 0..areas[0].slots() {
            for a in areas {
                let at = a.my_buffer(seq, bytes);
                // SAFETY: this rank's place for `bytes` of turn `seq`, which nobody reads
                // before it is published.
                unsafe {
                    at.add(bytes - 1).write(seq as u8 ^ 0x5a);
                    at.cast::<u64>().write_unaligned(seq);
                };
                a.publish(seq, &desc, tag(&desc), bytes, bytes);
            }
            for (me, a) in areas.into_iter().enumerate() {
                let p = a.observe(1 - me, seq).unwrap().unwrap();
                // SAFETY: published `bytes`, left alone until the next round.
                let (first, last) = unsafe {
                    (
                        p.data.cast::<u64>().read_unaligned(),
                        p.data.add(bytes - 1).read(),
                    )
                };
                let mark = if bytes > 8 {
                    seq as u8 ^ 0x5a
                } else {
                    (seq >> 56) as u8
                };
                assert_eq!((first, last), (seq, mark));
            }
        }
    }

    #[test]
    fn the_ring_of_slots_is_mapped_before_the_first_call() {
        let probe = AreaSegment::create().unwrap();
        if let Err(e) = probe.seg.prefault(RING_END) {
            eprintln!("skipped: MADV_POPULATE_WRITE is not available here ({e}; Linux 5.14+)");
            return;
        }
        // The same calls on another pair first, so that the code and the stack they run on are
        // mapped already and only the fresh pair's memory could fault below.
        let (a, b) = pair();
        round([&a, &b], 8);
        round([&a, &b], SLOT_BYTES);
        for (wide, bytes) in [
            (false, 8),
            (false, SLOT_BYTES),
            (true, 8),
            (true, SLOT_BYTES),
        ] {
            let (mut a, mut b) = pair();
            if wide {
                (a, b) = (a.widened(), b.widened());
            }
            let before = minor_faults();
            round([&a, &b], bytes);
            let faults = minor_faults() - before;
            assert_eq!(
                faults,
                0,
                "the first trip around a fresh ring of {} with {bytes} bytes a turn took {faults} \
                 page faults",
                a.slots()
            );
        }
    }

    /// Publishes turns `0..n` of rank 0, 8 bytes each (the turn's number).
    fn publish_turns(a: &Area, n: u64) {
        let desc = [3u8; DESC_BYTES];
        for seq in 0..n {
            // SAFETY: rank 0's place for 8 bytes of turn `seq`; nobody reads it meanwhile.
            unsafe { a.my_buffer(seq, 8).cast::<u64>().write_unaligned(seq) };
            a.publish(seq, &desc, tag(&desc), 8, 8);
        }
    }

    /// Data of every size lands where a peer finds it, whole, with its length as given: in
    /// the head (up to 40 bytes), the slot's body (up to a slot), or the large buffer; and
    /// consecutive turns in each place leave each other's data alone.
    #[test]
    fn data_of_every_size_reaches_the_peer_from_head_body_or_buffer() {
        let (a, b) = pair();
        let desc = [5u8; DESC_BYTES];
        let sizes = [0, 1, 39, 40, 41, 64, 1000, 4095, 4096, 4097, 9000];
        let fill = |seq: u64, len: usize| -> Vec<u8> {
            (0..len)
                .map(|i| (i as u64 * 31 + seq * 7 + 1) as u8)
                .collect()
        };
        for (seq, &len) in (0u64..).zip(&sizes) {
            let v = fill(seq, len);
            // SAFETY: rank 0's place for `len` bytes of turn `seq` (at most a large buffer);
            // nobody reads it before it is published.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), a.my_buffer(seq, len), len) };
            a.publish(seq, &desc, tag(&desc), len, len);
        }
        // (Large buffers alternate: only the last two sizes go there, both still in place.)
        for (seq, &len) in (0u64..).zip(&sizes) {
            let p = b.observe(0, seq).unwrap().unwrap();
            assert_eq!((p.len, p.tag), (len, tag(&desc)), "turn {seq}");
            assert_eq!(b.call_of(0, seq), Ok(Some((tag(&desc), len as u64))));
            // SAFETY: published `len` bytes, left alone from here on.
            let got = unsafe { std::slice::from_raw_parts(p.data, len) };
            assert_eq!(got, &fill(seq, len)[..], "turn {seq}, {len} bytes");
            // SAFETY: the full descriptor, published with the stamp.
            assert_eq!(unsafe { *p.desc }, desc);
        }
    }

    /// A widened ring keeps a whole trip of [`WIDE_SLOTS`] turns, every one where the peer
    /// finds it; a narrow one only the last [`SLOTS`] (an earlier turn's slot says it was
    /// overwritten by a later turn).
    #[test]
    fn a_widened_ring_keeps_every_turn_of_a_trip_of_its_slots() {
        let (a, b) = pair();
        let (a, b) = (a.widened(), b.widened());
        assert_eq!((a.slots(), b.slots()), (WIDE_SLOTS, WIDE_SLOTS));
        publish_turns(&a, WIDE_SLOTS);
        for seq in 0..WIDE_SLOTS {
            let p = b
                .observe(0, seq)
                .unwrap()
                .unwrap_or_else(|| panic!("turn {seq}"));
            // SAFETY: published 8 bytes, left alone from here on.
            assert_eq!(unsafe { p.data.cast::<u64>().read_unaligned() }, seq);
            assert!(b.published(0, seq));
        }
        assert!(b.observe(0, WIDE_SLOTS).unwrap().is_none());

        let (a, b) = pair();
        assert_eq!(b.slots(), SLOTS);
        publish_turns(&a, WIDE_SLOTS);
        assert_eq!(b.observe(0, 0).err(), Some(WIDE_SLOTS - SLOTS));
        let p = b.observe(0, WIDE_SLOTS - 1).unwrap().unwrap();
        // SAFETY: as above.
        let last = unsafe { p.data.cast::<u64>().read_unaligned() };
        assert_eq!(last, WIDE_SLOTS - 1);
    }
}
