//! The Schedule: one rank's part of a collective as data — numbered steps over byte regions,
//! each with the steps it must wait for.
//!
//! # Semantics (what an executor must do, and what [`super::sim`] checks)
//!
//! - A step may start once every step in its `deps` has completed. Step ids are topologically
//!   ordered: a step's dependencies always have smaller ids.
//! - Messages between two ranks match in order: the k-th `Send` to rank p (in step-id order)
//!   is the k-th `Recv`/`RecvReduce` from this rank on p (in step-id order). An executor posts
//!   the sends of one link in id order, and consumes that link's incoming messages in id order.
//! - A `Send` reads its source region until it completes. A receive's data may arrive (into
//!   the transport's memory) before the receive step's dependencies are done; it is applied to
//!   the destination only once they are. Transports guarantee buffering of at least one message
//!   per link, and every schedule here is deadlock-free under exactly that guarantee.
//! - Dependencies are derived from the regions steps touch (see [`ScheduleBuilder`]): a step
//!   that writes a region waits for earlier readers and writers of it, a step that reads waits
//!   for earlier writers. Program order (the order steps were added) is therefore the meaning.

use std::collections::BTreeMap;
use std::fmt;

use crate::types::{DataType, Rank, ReduceOp};

/// Index of a step in its [`Schedule`].
pub type StepId = u32;

/// Which memory a [`Region`] lies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buffer {
    /// The user's send buffer (read-only to the collective).
    Input,
    /// The user's receive buffer.
    Output,
    /// Per-collective scratch memory owned by the executor, [`Schedule::scratch_len`] bytes.
    Scratch,
}

/// A byte range of one buffer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer.
    pub buffer: Buffer,
    /// First byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Region {
    /// A region of `len` bytes at `offset` in `buffer`.
    pub const fn new(buffer: Buffer, offset: usize, len: usize) -> Region {
        Region {
            buffer,
            offset,
            len,
        }
    }

    /// One past the last byte.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }

    /// Whether the two regions share a byte.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.buffer == other.buffer
            && self.offset < other.end()
            && other.offset < self.end()
            && self.len > 0
            && other.len > 0
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}[{}..{}]", self.buffer, self.offset, self.end())
    }
}

/// What a step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Send the bytes of `src` to rank `to`.
    Send {
        /// Destination rank.
        to: Rank,
        /// Bytes to send.
        src: Region,
    },
    /// Receive the next message from `from` into `dst` (sizes must match).
    Recv {
        /// Source rank.
        from: Rank,
        /// Where the bytes go.
        dst: Region,
    },
    /// Receive the next message from `from` and store `dst = src ⊕ message` (`src` may equal
    /// `dst`). The executor reduces straight out of the transport's memory.
    RecvReduce {
        /// Source rank.
        from: Rank,
        /// Where the result goes.
        dst: Region,
        /// The local operand.
        src: Region,
        /// The combining operator (already [`ReduceOp::combiner`]-ed: never `Avg`).
        op: ReduceOp,
    },
    /// `dst = src` (regions do not overlap).
    Copy {
        /// Destination.
        dst: Region,
        /// Source.
        src: Region,
    },
    /// `dst = a ⊕ b` (`dst` may equal `a` or `b`).
    Reduce {
        /// Destination.
        dst: Region,
        /// Left operand.
        a: Region,
        /// Right operand.
        b: Region,
        /// The combining operator (never `Avg`).
        op: ReduceOp,
    },
    /// `dst = dst / by`: the final division of `avg`.
    Divide {
        /// The region divided in place.
        dst: Region,
        /// The divisor (the number of ranks).
        by: usize,
    },
}

impl Op {
    /// The peer this step exchanges a message with, if any.
    pub fn peer(&self) -> Option<Rank> {
        match *self {
            Op::Send { to, .. } => Some(to),
            Op::Recv { from, .. } | Op::RecvReduce { from, .. } => Some(from),
            _ => None,
        }
    }

    /// Whether this step receives a message.
    pub fn is_receive(&self) -> bool {
        matches!(self, Op::Recv { .. } | Op::RecvReduce { .. })
    }

    /// Bytes moved by this step's message (0 for local steps).
    pub fn message_len(&self) -> usize {
        match *self {
            Op::Send { src, .. } => src.len,
            Op::Recv { dst, .. } | Op::RecvReduce { dst, .. } => dst.len,
            _ => 0,
        }
    }

    /// The regions this step reads, then the one it writes.
    pub fn accesses(&self) -> ([Option<Region>; 2], Option<Region>) {
        match *self {
            Op::Send { src, .. } => ([Some(src), None], None),
            Op::Recv { dst, .. } => ([None, None], Some(dst)),
            Op::RecvReduce { dst, src, .. } => ([Some(src), None], Some(dst)),
            Op::Copy { dst, src } => ([Some(src), None], Some(dst)),
            Op::Reduce { dst, a, b, .. } => ([Some(a), Some(b)], Some(dst)),
            Op::Divide { dst, .. } => ([Some(dst), None], Some(dst)),
        }
    }
}

/// One step: an [`Op`] and (in the owning [`Schedule`]) the steps it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// What to do.
    pub op: Op,
    deps_start: u32,
    deps_end: u32,
}

/// One rank's part of one collective.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    steps: Vec<Step>,
    deps: Vec<StepId>,
    scratch_len: usize,
}

impl Schedule {
    /// A schedule from explicit steps and their dependencies, taken as given (nothing is
    /// derived from regions): for hand-written schedules and for testing the simulator.
    pub fn from_steps(
        steps: impl IntoIterator<Item = (Op, Vec<StepId>)>,
        scratch_len: usize,
    ) -> Schedule {
        let mut schedule = Schedule {
            scratch_len,
            ..Schedule::default()
        };
        for (op, deps) in steps {
            let start = schedule.deps.len() as u32;
            schedule.deps.extend(deps);
            schedule.steps.push(Step {
                op,
                deps_start: start,
                deps_end: schedule.deps.len() as u32,
            });
        }
        schedule
    }

    /// The steps, indexed by [`StepId`].
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The steps `id` waits for (all smaller than `id`).
    pub fn deps(&self, id: StepId) -> &[StepId] {
        let s = &self.steps[id as usize];
        &self.deps[s.deps_start as usize..s.deps_end as usize]
    }

    /// Scratch bytes the executor must provide ([`Buffer::Scratch`]).
    pub fn scratch_len(&self) -> usize {
        self.scratch_len
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Total bytes this rank sends.
    pub fn bytes_sent(&self) -> usize {
        self.steps
            .iter()
            .map(|s| match s.op {
                Op::Send { src, .. } => src.len,
                _ => 0,
            })
            .sum()
    }

    /// Total bytes this rank receives.
    pub fn bytes_received(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| s.op.is_receive())
            .map(|s| s.op.message_len())
            .sum()
    }

    /// The distinct peers this rank exchanges messages with, ascending.
    pub fn peers(&self) -> Vec<Rank> {
        let mut p: Vec<Rank> = self.steps.iter().filter_map(|s| s.op.peer()).collect();
        p.sort_unstable();
        p.dedup();
        p
    }
}

/// Builds a [`Schedule`] from steps given in program order, deriving each step's
/// dependencies from the regions it touches (read-after-write, write-after-read,
/// write-after-write), plus any explicit ones.
pub struct ScheduleBuilder {
    schedule: Schedule,
    /// Per buffer: disjoint segments keyed by start offset, each remembering the last writer and
    /// the readers since.
    segments: [BTreeMap<usize, Segment>; 3],
    /// The current pool of scratch slots: where it starts, slot size, slot count, next slot.
    pool_base: usize,
    slot_bytes: usize,
    slots: usize,
    next_slot: usize,
    /// Element size: scratch slots are rounded to it so every slot is aligned.
    elem: usize,
    /// Reused buffer for the uncovered gaps of an access.
    gaps: Vec<(usize, usize)>,
}

#[derive(Clone, Debug)]
struct Segment {
    end: usize,
    writer: Option<StepId>,
    readers: Vec<StepId>,
}

impl ScheduleBuilder {
    /// An empty builder for a collective on elements of `dtype`.
    pub fn new(dtype: DataType) -> ScheduleBuilder {
        ScheduleBuilder {
            schedule: Schedule::default(),
            segments: Default::default(),
            pool_base: 0,
            slot_bytes: 0,
            slots: 0,
            next_slot: 0,
            elem: dtype.size(),
            gaps: Vec::new(),
        }
    }

    /// Reserves a new pool of `slots` scratch slots of `bytes` each, after any earlier pool;
    /// [`ScheduleBuilder::scratch_slot`] then hands them out round-robin.
    pub fn reserve_scratch(&mut self, slots: usize, bytes: usize) {
        // Keep every slot 8-byte aligned whatever the element size.
        let bytes = bytes.next_multiple_of(8.max(self.elem));
        self.pool_base = self.schedule.scratch_len;
        self.slot_bytes = bytes;
        self.slots = slots.max(1);
        self.next_slot = 0;
        self.schedule.scratch_len += self.slots * bytes;
    }

    /// The next scratch slot (round-robin over the reserved ones), `len` bytes of it. Reusing a
    /// slot waits, through region dependencies, for every earlier use of it.
    pub fn scratch_slot(&mut self, len: usize) -> Region {
        assert!(
            self.slots > 0 && len <= self.slot_bytes,
            "scratch slot too small for {len} bytes"
        );
        let i = self.next_slot % self.slots;
        self.next_slot += 1;
        Region::new(Buffer::Scratch, self.pool_base + i * self.slot_bytes, len)
    }

    /// Appends `op`, waiting for the steps its regions require and for `extra`.
    pub fn push(&mut self, op: Op, extra: &[StepId]) -> StepId {
        let id = self.schedule.steps.len() as StepId;
        let start = self.schedule.deps.len();
        self.schedule.deps.extend_from_slice(extra);
        let (reads, write) = op.accesses();
        for r in reads.into_iter().flatten() {
            self.access(r, id, false);
        }
        if let Some(w) = write {
            self.access(w, id, true);
        }
        let deps = &mut self.schedule.deps[start..];
        deps.sort_unstable();
        let mut kept = 0;
        for i in 0..deps.len() {
            if deps[i] != id && (kept == 0 || deps[kept - 1] != deps[i]) {
                deps[kept] = deps[i];
                kept += 1;
            }
        }
        self.schedule.deps.truncate(start + kept);
        self.schedule.steps.push(Step {
            op,
            deps_start: start as u32,
            deps_end: self.schedule.deps.len() as u32,
        });
        id
    }

    /// Appends a send of `src` to `to`.
    pub fn send(&mut self, to: Rank, src: Region) -> StepId {
        self.push(Op::Send { to, src }, &[])
    }

    /// Appends a receive from `from` into `dst`.
    pub fn recv(&mut self, from: Rank, dst: Region) -> StepId {
        self.push(Op::Recv { from, dst }, &[])
    }

    /// Appends `dst = src ⊕ (message from `from`)`.
    pub fn recv_reduce(&mut self, from: Rank, dst: Region, src: Region, op: ReduceOp) -> StepId {
        self.push(
            Op::RecvReduce {
                from,
                dst,
                src,
                op: op.combiner(),
            },
            &[],
        )
    }

    /// Appends `dst = src`, or nothing when they are the same region.
    pub fn copy(&mut self, dst: Region, src: Region) -> Option<StepId> {
        (dst != src && dst.len > 0).then(|| self.push(Op::Copy { dst, src }, &[]))
    }

    /// Appends `dst = a ⊕ b`.
    pub fn reduce(&mut self, dst: Region, a: Region, b: Region, op: ReduceOp) -> StepId {
        self.push(
            Op::Reduce {
                dst,
                a,
                b,
                op: op.combiner(),
            },
            &[],
        )
    }

    /// Appends the division of `avg` when `op` is `Avg` and `by > 1`.
    pub fn finish_avg(&mut self, dst: Region, op: ReduceOp, by: usize) -> Option<StepId> {
        (op == ReduceOp::Avg && by > 1 && dst.len > 0)
            .then(|| self.push(Op::Divide { dst, by }, &[]))
    }

    /// The finished schedule.
    pub fn finish(self) -> Schedule {
        self.schedule
    }

    /// Records an access of `region` by step `id`, adding the dependencies it implies.
    fn access(&mut self, region: Region, id: StepId, write: bool) {
        if region.len == 0 {
            return;
        }
        let map = &mut self.segments[region.buffer as usize];
        split_at(map, region.offset);
        split_at(map, region.end());
        // Fill gaps so that the whole range is covered by segments.
        let mut cursor = region.offset;
        self.gaps.clear();
        for (&start, seg) in map.range(region.offset..region.end()) {
            if start > cursor {
                self.gaps.push((cursor, start));
            }
            cursor = seg.end;
        }
        if cursor < region.end() {
            self.gaps.push((cursor, region.end()));
        }
        for &(s, e) in &self.gaps {
            map.insert(
                s,
                Segment {
                    end: e,
                    writer: None,
                    readers: Vec::new(),
                },
            );
        }
        let deps = &mut self.schedule.deps;
        for (_, seg) in map.range_mut(region.offset..region.end()) {
            deps.extend(seg.writer);
            if write {
                deps.extend_from_slice(&seg.readers);
                seg.readers.clear();
                seg.writer = Some(id);
            } else if seg.readers.last() != Some(&id) {
                seg.readers.push(id);
            }
        }
    }
}

/// Splits the segment containing `at` (if any) so that a segment starts exactly at `at`.
fn split_at(map: &mut BTreeMap<usize, Segment>, at: usize) {
    let Some((&start, seg)) = map.range_mut(..at).next_back() else {
        return;
    };
    if seg.end <= at {
        return;
    }
    let tail = Segment {
        end: seg.end,
        writer: seg.writer,
        readers: seg.readers.clone(),
    };
    seg.end = at;
    debug_assert!(start < at);
    map.insert(at, tail);
}
