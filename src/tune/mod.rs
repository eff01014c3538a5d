//! The routing decision: from a plan and what the communicator offers to a [`Decision`] — the
//! one answer to "how does this call run", made here and nowhere else.
//!
//! A call runs either through the shared group area of ranks on one host ([`Route::Area`],
//! with one of its [`Way`]s) or as an `algo` schedule over the links ([`Route::Schedule`]).
//! The decision depends only on the plan (which every rank's descriptor checks), the
//! communicator's configuration and what setup agreed on (whether the area exists and whether
//! every rank can reach every peer's memory) — so every form of a call (blocking,
//! asynchronous, grouped) on every rank takes the same route. The one exception is placement
//! (in place or not, which ranks may choose differently): it only changes whether a rank
//! *asks* for the direct way, and the area's first turn lets all ranks agree (see
//! [`Way::Direct`]).
//!
//! The size rules are taken from the α-β table in `docs/cost-model.md` and the measured
//! crossovers in the README (all-reduce: one-shot up to 16 KiB, direct from `OXCCL_DIRECT_MIN`
//! to `OXCCL_DIRECT_MAX` and in place at any size, two-shot beyond; all-gather,
//! reduce-scatter, broadcast and reduce: staged, or direct from `OXCCL_DIRECT_COPY_MIN`); the
//! measured cost model replaces them later. `OXCCL_ALGO` forces a schedule algorithm wherever that algorithm
//! implements the collective.

use crate::algo::{Algorithm, Choice, Collective, Plan};
use crate::config::Config;

/// Largest all-reduce, in bytes, done one-shot through the area (every rank reads every
/// contribution whole).
pub(crate) const ONE_SHOT_MAX: usize = 16 * 1024;

/// How one call runs, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// The route.
    pub route: Route,
    /// A line saying why this route.
    pub why: &'static str,
}

/// Where a call's bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Route {
    /// Through the shared group area of ranks on one host (all-reduce, all-gather,
    /// reduce-scatter, broadcast, reduce), one of its ways.
    Area(Way),
    /// An `algo` schedule run over the links with this algorithm and slicing.
    Schedule(Choice),
}

/// The ways through the shared group area.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Way {
    /// Every rank publishes its whole contribution and folds everybody's (small messages).
    OneShot,
    /// Each rank reduces its slice reading peers' inputs and writes the result into every
    /// peer's output, by system calls (`process_vm_readv`/`writev`). Ranks publish whether
    /// they ask for it; if any does not (ranks may be configured or placed differently), all
    /// of them run [`Way::TwoShot`] instead.
    Direct,
    /// Reduce-scatter then all-gather through shared buffers, piece by piece.
    TwoShot,
    /// The collectives other than all-reduce through shared buffers, piece by piece: each
    /// rank publishes what the others need and copies (or folds) what it needs.
    Staged,
}

impl Way {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Way::OneShot => "one-shot",
            Way::Direct => "direct",
            Way::TwoShot => "two-shot",
            Way::Staged => "staged",
        }
    }
}

impl Route {
    /// What runs, for people: `shm one-shot`, `ring`, ...
    pub fn name(&self) -> String {
        match self {
            Route::Area(w) => format!("shm {}", w.name()),
            Route::Schedule(c) => c.algorithm.name().to_owned(),
        }
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.route.name(), self.why)
    }
}

/// What a communicator offers the decision, fixed when it is created and the same on every
/// rank (setup agrees on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Means {
    /// Number of ranks.
    pub nranks: usize,
    /// The shared group area exists (every rank on one host, every link shared memory).
    pub area: bool,
    /// Every rank can reach every peer's memory directly.
    pub direct: bool,
    /// Largest message every link carries, capped by the configured slice size.
    pub slice_bytes: usize,
}

/// The route for `plan` on a communicator offering `means`, configured by `config`.
pub(crate) fn decide(plan: &Plan, means: &Means, config: &Config) -> Decision {
    let bytes = plan.count.saturating_mul(plan.dtype.size());
    if means.area && plan.collective == Collective::AllReduce && config.algorithm.is_none() {
        let (way, why) = if bytes <= ONE_SHOT_MAX {
            (Way::OneShot, "at most 16 KiB: one exchange, no system call")
        } else if !means.direct {
            (Way::TwoShot, "ranks cannot reach each other's memory")
        } else if bytes >= config.direct_min && plan.in_place {
            (Way::Direct, "in place: the writes land on lines just read")
        } else if bytes >= config.direct_min && bytes <= config.direct_max {
            (
                Way::Direct,
                "between OXCCL_DIRECT_MIN and OXCCL_DIRECT_MAX: buffers in cache",
            )
        } else {
            (
                Way::TwoShot,
                "outside the direct sizes: user-space streams through the area",
            )
        };
        return Decision {
            route: Route::Area(way),
            why,
        };
    }
    if means.area && on_area(plan.collective) && config.algorithm.is_none() {
        let (way, why) = if means.direct && bytes >= config.direct_copy_min {
            (
                Way::Direct,
                "from OXCCL_DIRECT_COPY_MIN: one copy per byte, by the kernel",
            )
        } else if means.direct {
            (
                Way::Staged,
                "below OXCCL_DIRECT_COPY_MIN: through the area, user-space copies",
            )
        } else {
            (Way::Staged, "ranks cannot reach each other's memory")
        };
        return Decision {
            route: Route::Area(way),
            why,
        };
    }
    let (algorithm, why) = match config.algorithm {
        Some(a) if a.supports(plan.collective) => (a, "forced by OXCCL_ALGO"),
        _ => default_algorithm(plan.collective, bytes, means.nranks),
    };
    let choice = Choice::new(algorithm)
        .slice_bytes(means.slice_bytes)
        .scratch_slots(config.scratch_slots);
    Decision {
        route: Route::Schedule(choice),
        why,
    }
}

/// Whether `c`, other than all-reduce, has ways through the shared group area.
fn on_area(c: Collective) -> bool {
    matches!(
        c,
        Collective::AllGather
            | Collective::ReduceScatter
            | Collective::Broadcast
            | Collective::Reduce
    )
}

fn default_algorithm(collective: Collective, bytes: usize, n: usize) -> (Algorithm, &'static str) {
    match collective {
        Collective::AllReduce if n <= 2 && bytes <= 64 << 10 => (
            Algorithm::Direct,
            "one-shot: one exchange is the least latency for 2 ranks",
        ),
        Collective::AllReduce if n <= 8 && bytes <= 4 << 10 => {
            (Algorithm::Direct, "one-shot: few ranks, tiny message")
        }
        Collective::AllReduce if bytes <= 1 << 20 => (
            Algorithm::HalvingDoubling,
            "halving-doubling: latency-bound size",
        ),
        Collective::AllReduce => (Algorithm::Ring, "ring: bandwidth-bound size"),
        Collective::Broadcast | Collective::Reduce if bytes <= 256 << 10 => {
            (Algorithm::Tree, "binomial tree: latency-bound size")
        }
        Collective::Broadcast | Collective::Reduce => {
            (Algorithm::Ring, "pipelined chain: bandwidth-bound size")
        }
        Collective::AllGather | Collective::ReduceScatter if n <= 4 && bytes <= 16 << 10 => {
            (Algorithm::Direct, "direct: few ranks, small blocks")
        }
        Collective::AllGather | Collective::ReduceScatter => (Algorithm::Ring, "ring"),
        Collective::Gather | Collective::Scatter | Collective::AllToAll | Collective::Barrier => {
            (Algorithm::Direct, "direct: the only algorithm")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DataType;

    fn means(nranks: usize, area: bool, direct: bool) -> Means {
        Means {
            nranks,
            area,
            direct,
            slice_bytes: Choice::DEFAULT_SLICE_BYTES,
        }
    }

    #[test]
    fn every_choice_supports_its_collective_and_forcing_applies_where_valid() {
        for c in Collective::ALL {
            for count in [0, 1, 1000, 10_000_000] {
                let plan = Plan::new(c, count, DataType::F32);
                for m in [means(5, false, false), means(5, true, true)] {
                    let d = decide(&plan, &m, &Config::default());
                    match d.route {
                        Route::Schedule(choice) => {
                            assert!(choice.algorithm.supports(c), "{c} -> {}", choice.algorithm)
                        }
                        Route::Area(_) => {
                            assert!(m.area && (c == Collective::AllReduce || on_area(c)))
                        }
                    }
                    let forced = Config::default().algorithm(Some(Algorithm::Tree));
                    let Route::Schedule(choice) = decide(&plan, &m, &forced).route else {
                        panic!("a forced algorithm runs a schedule");
                    };
                    assert!(choice.algorithm.supports(c));
                    if Algorithm::Tree.supports(c) {
                        assert_eq!(choice.algorithm, Algorithm::Tree);
                    }
                }
            }
        }
    }

    #[test]
    fn area_ways_follow_size_placement_and_reach() {
        let c = Config::default();
        let way = |bytes: usize, in_place: bool, direct: bool| {
            let plan =
                Plan::new(Collective::AllReduce, bytes / 4, DataType::F32).in_place(in_place);
            match decide(&plan, &means(2, true, direct), &c).route {
                Route::Area(w) => w,
                r => panic!("{r:?}"),
            }
        };
        assert_eq!(way(16 << 10, false, true), Way::OneShot);
        assert_eq!(way((16 << 10) + 4, false, true), Way::Direct);
        assert_eq!(way(4 << 20, false, true), Way::Direct);
        assert_eq!(way(8 << 20, false, true), Way::TwoShot);
        assert_eq!(way(8 << 20, true, true), Way::Direct);
        assert_eq!(way(1 << 20, false, false), Way::TwoShot);
        // The other collectives that have area ways: staged unless told to reach peers
        // directly from a size, and able to.
        for coll in [
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            let way = |bytes: usize, config: &Config, direct: bool| {
                let plan = Plan::new(coll, bytes / 4, DataType::F32);
                match decide(&plan, &means(3, true, direct), config).route {
                    Route::Area(w) => w,
                    r => panic!("{coll}: {r:?}"),
                }
            };
            assert_eq!(way(64 << 20, &c, true), Way::Staged);
            let from_1m = c.clone().direct_copy_min(1 << 20);
            assert_eq!(way((1 << 20) - 4, &from_1m, true), Way::Staged);
            assert_eq!(way(1 << 20, &from_1m, true), Way::Direct);
            assert_eq!(way(1 << 20, &from_1m, false), Way::Staged);
        }
        // Gather, scatter, all-to-all and barrier run schedules.
        for coll in [
            Collective::Gather,
            Collective::Scatter,
            Collective::AllToAll,
        ] {
            let plan = Plan::new(coll, 1000, DataType::F32);
            assert!(matches!(
                decide(&plan, &means(3, true, true), &c).route,
                Route::Schedule(_)
            ));
        }
        // The slice size is the communicator's, whatever was configured.
        let plan = Plan::new(Collective::Broadcast, 10, DataType::F32);
        let m = Means {
            slice_bytes: 4096,
            ..means(3, false, false)
        };
        let Route::Schedule(choice) = decide(&plan, &m, &c).route else {
            panic!("broadcast runs a schedule");
        };
        assert_eq!(choice.slice_bytes, 4096);
    }
}
