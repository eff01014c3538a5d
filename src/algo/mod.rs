//! Collective algorithms as pure functions: `(plan, choice, rank, nranks) -> Schedule`.
//!
//! This module does no I/O, spawns no threads, reads no clock and knows no transport; it imports
//! nothing from the crate but [`crate::types`] (a test checks). A [`Schedule`] is data that the
//! executor drives over links and that [`sim`] runs for any number of ranks in memory.
//!
//! | algorithm | collectives |
//! |---|---|
//! | [`Algorithm::Ring`] | all-reduce (reduce-scatter + all-gather), reduce-scatter, all-gather, pipelined chain broadcast and reduce |
//! | [`Algorithm::Tree`] | double binary tree all-reduce, binomial broadcast and reduce |
//! | [`Algorithm::HalvingDoubling`] | Rabenseifner all-reduce with the non-power-of-two fold |
//! | [`Algorithm::Direct`] | every collective: one-shot all-reduce, pairwise all-to-all and reduce-scatter, flat gather/scatter/broadcast/reduce/all-gather, dissemination barrier |
//! | [`Algorithm::Hierarchical`] | all-reduce (inside hosts, between hosts by every rank on its share, inside hosts), all-gather (between hosts, then inside), reduce-scatter (inside, then between), broadcast and reduce (chains through host leaders) |
//!
//! Only the hierarchical algorithms read where ranks run ([`Hosts`], given to [`schedule_on`]);
//! [`schedule`] puts every rank on a host of its own.
//!
//! Every message is at most [`Choice::slice_bytes`] long, so the executor can overlap the
//! transfer of one slice with the reduction of the previous one; scratch memory is at most
//! `scratch_slots × slice_bytes` per pool, never proportional to the message.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::types::{DataType, Rank, ReduceOp};

mod direct;
mod halving_doubling;
mod hierarchical;
mod hosts;
pub mod partition;
mod ring;
mod schedule;
pub mod sim;
mod tree;

pub use hosts::Hosts;
pub use schedule::{Buffer, Op, Region, Schedule, ScheduleBuilder, Step, StepId};

/// Which collective a [`Plan`] describes.
///
/// `count` in a [`Plan`] means, per collective (as in nccl.h):
///
/// | collective | input elements | output elements | in place |
/// |---|---|---|---|
/// | AllReduce, Broadcast, Reduce | count | count | input = output |
/// | AllGather | count | n·count | input = output[rank·count..] |
/// | ReduceScatter | n·count | count | output = input[rank·count..] |
/// | Gather | count | n·count (root only) | at the root, input = output[root·count..] |
/// | Scatter | n·count (root only) | count | at the root, output = input[root·count..] |
/// | AllToAll | n·count | n·count | input = output |
/// | Barrier | 0 | 0 | — |
///
/// For Broadcast only the root's input is read; for Reduce only the root's output is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank gets the reduction of all inputs.
    AllReduce,
    /// Every rank gets the root's input.
    Broadcast,
    /// The root gets the reduction of all inputs.
    Reduce,
    /// Every rank gets every rank's input, concatenated in rank order.
    AllGather,
    /// Rank r gets block r of the reduction of all inputs.
    ReduceScatter,
    /// The root gets every rank's input, concatenated in rank order.
    Gather,
    /// Rank r gets block r of the root's input.
    Scatter,
    /// Rank r gets block r of every rank's input, concatenated in rank order.
    AllToAll,
    /// Nobody leaves until everybody has arrived.
    Barrier,
}

impl Collective {
    /// Every collective.
    pub const ALL: [Collective; 9] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Gather,
        Collective::Scatter,
        Collective::AllToAll,
        Collective::Barrier,
    ];

    /// snake_case name (`all_reduce`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::AllToAll => "all_to_all",
            Collective::Barrier => "barrier",
        }
    }

    /// Whether the collective combines values with a [`ReduceOp`].
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
        )
    }

    /// Whether the collective has a root.
    pub const fn rooted(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter
        )
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One collective call, as every rank sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    /// The collective.
    pub collective: Collective,
    /// Element count; its meaning per collective is in [`Collective`]'s table.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction operator (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Root rank (ignored by rootless collectives).
    pub root: Rank,
    /// Whether input and output share memory, as [`Collective`]'s table says.
    pub in_place: bool,
    /// Whether the buffers are CUDA device memory (the `*_device` calls): such calls take a
    /// [`crate::tune::Route::Device`] route.
    pub on_device: bool,
}

impl Plan {
    /// A plan with operator `Sum`, root 0, out of place.
    pub fn new(collective: Collective, count: usize, dtype: DataType) -> Plan {
        Plan {
            collective,
            count,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
            in_place: false,
            on_device: false,
        }
    }

    /// The same plan with operator `op`.
    pub fn op(self, op: ReduceOp) -> Plan {
        Plan { op, ..self }
    }

    /// The same plan with root `root`.
    pub fn root(self, root: Rank) -> Plan {
        Plan { root, ..self }
    }

    /// The same plan, in place or not.
    pub fn in_place(self, in_place: bool) -> Plan {
        Plan { in_place, ..self }
    }

    /// The same plan on CUDA device memory or on host memory.
    pub fn on_device(self, on_device: bool) -> Plan {
        Plan { on_device, ..self }
    }

    /// Checks the plan against the communicator size: root in range, operator defined on the
    /// type, sizes that fit in memory.
    pub fn validate(&self, nranks: usize) -> Result<(), AlgoError> {
        let bad = |why: String| Err(AlgoError::InvalidPlan(why));
        if nranks == 0 {
            return bad("a communicator needs at least one rank".into());
        }
        if self.collective.rooted() && self.root >= nranks {
            return bad(format!(
                "{}: root {} is not a rank of a communicator of {} ranks",
                self.collective, self.root, nranks
            ));
        }
        if self.collective.reduces() && !self.op.supports(self.dtype) {
            return bad(format!(
                "{}: operator {} is not defined on {}",
                self.collective, self.op, self.dtype
            ));
        }
        let fits = self
            .count
            .checked_mul(nranks)
            .and_then(|c| c.checked_mul(self.dtype.size()))
            .is_some_and(|b| b <= isize::MAX as usize);
        if !fits {
            return bad(format!(
                "{}: {} elements of {} on {} ranks overflow the address space",
                self.collective, self.count, self.dtype, nranks
            ));
        }
        Ok(())
    }

    /// Elements of input that rank `rank` provides (0 when it provides none).
    pub fn input_count(&self, rank: Rank, nranks: usize) -> usize {
        let c = self.count;
        match self.collective {
            Collective::AllReduce | Collective::Reduce | Collective::AllGather => c,
            Collective::Gather => c,
            Collective::Broadcast => {
                if rank == self.root {
                    c
                } else {
                    0
                }
            }
            Collective::ReduceScatter | Collective::AllToAll => nranks * c,
            Collective::Scatter => {
                if rank == self.root {
                    nranks * c
                } else {
                    0
                }
            }
            Collective::Barrier => 0,
        }
    }

    /// Elements of output that rank `rank` receives (0 when it receives none).
    pub fn output_count(&self, rank: Rank, nranks: usize) -> usize {
        let c = self.count;
        match self.collective {
            Collective::AllReduce | Collective::Broadcast | Collective::ReduceScatter => c,
            Collective::Scatter => c,
            Collective::Reduce => {
                if rank == self.root {
                    c
                } else {
                    0
                }
            }
            Collective::AllGather | Collective::AllToAll => nranks * c,
            Collective::Gather => {
                if rank == self.root {
                    nranks * c
                } else {
                    0
                }
            }
            Collective::Barrier => 0,
        }
    }

    /// Where rank `rank`'s input and output lie in the schedule's buffers: out of place they are
    /// [`Buffer::Input`] and [`Buffer::Output`] at offset 0; in place one of them lies inside
    /// the other, as [`Collective`]'s table says.
    pub fn layout(&self, rank: Rank, nranks: usize) -> Layout {
        let _ = nranks;
        let plain = Layout {
            input: (Buffer::Input, 0),
            output: (Buffer::Output, 0),
        };
        if !self.in_place {
            return plain;
        }
        let block = self.count * self.dtype.size();
        match self.collective {
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::AllToAll => Layout {
                input: (Buffer::Output, 0),
                output: (Buffer::Output, 0),
            },
            Collective::AllGather => Layout {
                input: (Buffer::Output, rank * block),
                output: (Buffer::Output, 0),
            },
            Collective::Gather if rank == self.root => Layout {
                input: (Buffer::Output, rank * block),
                output: (Buffer::Output, 0),
            },
            Collective::ReduceScatter => Layout {
                input: (Buffer::Input, 0),
                output: (Buffer::Input, rank * block),
            },
            Collective::Scatter if rank == self.root => Layout {
                input: (Buffer::Input, 0),
                output: (Buffer::Input, rank * block),
            },
            Collective::Gather | Collective::Scatter | Collective::Barrier => plain,
        }
    }
}

/// Where a rank's logical input and output start: (buffer, byte offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The buffer and byte offset of element 0 of the input.
    pub input: (Buffer, usize),
    /// The buffer and byte offset of element 0 of the output.
    pub output: (Buffer, usize),
}

/// The family of algorithm that moves the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring (and, for rooted collectives, a pipelined chain): bandwidth-optimal, 2(n−1) hops.
    Ring,
    /// Trees: double binary tree all-reduce, binomial broadcast and reduce; O(log n) hops.
    Tree,
    /// Recursive halving-doubling (Rabenseifner) all-reduce; O(log n) hops, optimal bytes.
    HalvingDoubling,
    /// Every rank talks to every rank it needs to directly: one hop, most messages.
    Direct,
    /// A leg inside each host, one between hosts ([`Choice::leg`]), one inside each host again:
    /// the slow links between hosts carry each byte as few times as possible.
    Hierarchical,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::HalvingDoubling,
        Algorithm::Direct,
        Algorithm::Hierarchical,
    ];

    /// Lower-case name, as `OXCCL_ALGO` accepts it.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::HalvingDoubling => "hd",
            Algorithm::Direct => "direct",
            Algorithm::Hierarchical => "hierarchical",
        }
    }

    /// Whether this algorithm implements `collective`.
    pub const fn supports(self, collective: Collective) -> bool {
        use Collective::*;
        match self {
            Algorithm::Ring => {
                matches!(
                    collective,
                    AllReduce | ReduceScatter | AllGather | Broadcast | Reduce
                )
            }
            Algorithm::Tree => matches!(collective, AllReduce | Broadcast | Reduce),
            Algorithm::HalvingDoubling => matches!(collective, AllReduce),
            Algorithm::Direct => true,
            Algorithm::Hierarchical => {
                matches!(
                    collective,
                    AllReduce | AllGather | ReduceScatter | Broadcast | Reduce
                )
            }
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = crate::types::UnknownName;

    /// Parses `ring`, `tree`, `hd` (also `halving_doubling`, `rabenseifner`), `direct`
    /// (also `oneshot`, `pairwise`), `hierarchical` (also `hier`), ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "ring" => Algorithm::Ring,
            "tree" => Algorithm::Tree,
            "hd" | "halving_doubling" | "rabenseifner" => Algorithm::HalvingDoubling,
            "direct" | "oneshot" | "one_shot" | "pairwise" => Algorithm::Direct,
            "hierarchical" | "hier" => Algorithm::Hierarchical,
            _ => {
                return Err(crate::types::UnknownName {
                    kind: "algorithm",
                    name: s.to_owned(),
                });
            }
        })
    }
}

/// How to run a plan: the algorithm and the pipelining parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Choice {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Largest message in bytes (rounded down to whole elements, at least one element).
    pub slice_bytes: usize,
    /// Scratch slots per pool, each `slice_bytes`: the pipeline depth where scratch is used.
    pub scratch_slots: usize,
    /// The algorithm of [`Algorithm::Hierarchical`]'s all-reduce between hosts:
    /// [`Algorithm::Direct`] (one hop, for small messages) or anything else for a ring. Ignored
    /// by the other algorithms.
    pub leg: Algorithm,
}

impl Choice {
    /// Default slice size: large enough to amortise per-message cost, small enough to pipeline.
    pub const DEFAULT_SLICE_BYTES: usize = 256 * 1024;
    /// Default scratch slots per pool.
    pub const DEFAULT_SCRATCH_SLOTS: usize = 4;

    /// `algorithm` with the default slice size and scratch depth.
    pub fn new(algorithm: Algorithm) -> Choice {
        Choice {
            algorithm,
            slice_bytes: Self::DEFAULT_SLICE_BYTES,
            scratch_slots: Self::DEFAULT_SCRATCH_SLOTS,
            leg: Algorithm::Ring,
        }
    }

    /// The same choice with another leg between hosts (see [`Choice::leg`]).
    pub fn leg(self, leg: Algorithm) -> Choice {
        Choice { leg, ..self }
    }

    /// The same choice with another slice size.
    pub fn slice_bytes(self, slice_bytes: usize) -> Choice {
        Choice {
            slice_bytes,
            ..self
        }
    }

    /// The same choice with another scratch depth.
    pub fn scratch_slots(self, scratch_slots: usize) -> Choice {
        Choice {
            scratch_slots,
            ..self
        }
    }
}

/// Why no schedule could be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AlgoError {
    /// The algorithm does not implement the collective.
    Unsupported {
        /// The algorithm asked for.
        algorithm: Algorithm,
        /// The collective asked for.
        collective: Collective,
    },
    /// The plan is inconsistent with the communicator (see [`Plan::validate`]).
    InvalidPlan(String),
}

impl fmt::Display for AlgoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AlgoError::Unsupported {
                algorithm,
                collective,
            } => {
                write!(f, "algorithm {algorithm} does not implement {collective}")
            }
            AlgoError::InvalidPlan(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for AlgoError {}

/// Rank `rank`'s schedule for `plan` on a communicator of `nranks`, using `choice`, with every
/// rank on a host of its own (see [`schedule_on`]).
pub fn schedule(
    plan: &Plan,
    choice: &Choice,
    rank: Rank,
    nranks: usize,
) -> Result<Schedule, AlgoError> {
    schedule_on(plan, choice, rank, &Hosts::flat(nranks))
}

/// Rank `rank`'s schedule for `plan` using `choice`, on a communicator whose ranks run on
/// `hosts` (which only [`Algorithm::Hierarchical`] reads).
pub fn schedule_on(
    plan: &Plan,
    choice: &Choice,
    rank: Rank,
    hosts: &Hosts,
) -> Result<Schedule, AlgoError> {
    let nranks = hosts.nranks();
    plan.validate(nranks)?;
    if rank >= nranks {
        return Err(AlgoError::InvalidPlan(format!(
            "rank {rank} is not a rank of a communicator of {nranks} ranks"
        )));
    }
    if !choice.algorithm.supports(plan.collective) {
        return Err(AlgoError::Unsupported {
            algorithm: choice.algorithm,
            collective: plan.collective,
        });
    }
    let mut g = Gen::new(plan, choice, rank, hosts);
    match choice.algorithm {
        Algorithm::Ring => ring::build(&mut g),
        Algorithm::Tree => tree::build(&mut g),
        Algorithm::HalvingDoubling => halving_doubling::build(&mut g),
        Algorithm::Direct => direct::build(&mut g),
        Algorithm::Hierarchical => hierarchical::build(&mut g),
    }
    Ok(g.b.finish())
}

/// What every generator works with: the plan, this rank, the builder, and element-indexed
/// views of the input and output.
pub(crate) struct Gen<'a> {
    pub plan: &'a Plan,
    pub choice: &'a Choice,
    pub rank: Rank,
    pub n: usize,
    pub hosts: &'a Hosts,
    pub b: ScheduleBuilder,
    layout: Layout,
    elem: usize,
    /// Elements per message.
    pub slice: usize,
}

impl<'a> Gen<'a> {
    fn new(plan: &'a Plan, choice: &'a Choice, rank: Rank, hosts: &'a Hosts) -> Gen<'a> {
        let elem = plan.dtype.size();
        let n = hosts.nranks();
        Gen {
            plan,
            choice,
            rank,
            n,
            hosts,
            b: ScheduleBuilder::new(plan.dtype),
            layout: plan.layout(rank, n),
            elem,
            slice: (choice.slice_bytes / elem).max(1),
        }
    }

    /// Elements `range` of this rank's input.
    pub fn input(&self, range: Range<usize>) -> Region {
        let (buf, base) = self.layout.input;
        Region::new(buf, base + range.start * self.elem, range.len() * self.elem)
    }

    /// Elements `range` of this rank's output.
    pub fn output(&self, range: Range<usize>) -> Region {
        let (buf, base) = self.layout.output;
        Region::new(buf, base + range.start * self.elem, range.len() * self.elem)
    }

    /// Reserves a scratch pool of the configured depth, one slice per slot.
    pub fn reserve_scratch(&mut self) {
        self.b
            .reserve_scratch(self.choice.scratch_slots, self.slice * self.elem);
    }

    /// The next scratch slot, sized for `elems` elements (at most one slice).
    pub fn scratch(&mut self, elems: usize) -> Region {
        self.b.scratch_slot(elems * self.elem)
    }

    /// `range` cut into consecutive slices of at most one slice each.
    pub fn slices(&self, range: Range<usize>) -> partition::Slices {
        partition::Slices::new(range, self.slice)
    }
}
