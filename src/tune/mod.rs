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
//! Ways through the area are priced by [`Costs`] — a piecewise α-β model per (collective,
//! way, placement) measured by [`crate::Communicator::calibrate`] on the machine the job runs
//! on, or the defaults measured on the reference machine — and the cheapest is taken. So that
//! ranks placed differently still meet, only direct against two-shot may depend on placement
//! (they agree at their first turn); one-shot or not, and staged or direct, are priced over
//! both placements. Set thresholds override the costs (`OXCCL_DIRECT_MIN` / `_MAX`,
//! `OXCCL_DIRECT_COPY_MIN`), `OXCCL_AREA_WAY` forces a way, and `OXCCL_ALGO` forces a schedule
//! algorithm wherever that algorithm implements the collective. Schedules over links are still
//! chosen by size rules from the α-β table in `docs/cost-model.md`, and across hosts by the
//! shape of the job (the hierarchical algorithm where ranks span hosts and share them).

use oxccl_transport_shm::area::AREA_BYTES;

use crate::algo::{Algorithm, Choice, Collective, Plan};
use crate::config::Config;

pub mod cost;

pub use cost::{Costs, Key};

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
    /// Every way.
    pub const ALL: [Way; 4] = [Way::OneShot, Way::Direct, Way::TwoShot, Way::Staged];

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
    /// Number of hosts the ranks run on.
    pub hosts: usize,
    /// The most ranks any one host has.
    pub per_host: usize,
}

/// The route for `plan` on a communicator offering `means`, configured by `config`, with the
/// ways through the group area priced by `costs`.
pub(crate) fn decide(plan: &Plan, means: &Means, config: &Config, costs: &Costs) -> Decision {
    let bytes = plan.count.saturating_mul(plan.dtype.size());
    if means.area && on_area(plan.collective) && config.algorithm.is_none() {
        let (way, why) = area_way(plan, bytes, means, config, costs);
        return Decision {
            route: Route::Area(way),
            why,
        };
    }
    let (algorithm, why) = match config.algorithm {
        Some(a) if a.supports(plan.collective) => (a, "forced by OXCCL_ALGO"),
        _ => hierarchical(plan.collective, bytes, means)
            .unwrap_or_else(|| default_algorithm(plan.collective, bytes, means.nranks)),
    };
    let mut choice = Choice::new(algorithm)
        .slice_bytes(means.slice_bytes)
        .scratch_slots(config.scratch_slots);
    if algorithm == Algorithm::Hierarchical {
        choice = choice.leg(leg(bytes, means));
    }
    Decision {
        route: Route::Schedule(choice),
        why,
    }
}

/// Every way `plan` may take through the group area here, with its estimated time in seconds
/// (`None`: never measured), in the order the tuner considers them; empty when the call does
/// not go through the area. What `explain`'s table and the tuner's debug log show.
pub(crate) fn price(
    plan: &Plan,
    means: &Means,
    config: &Config,
    costs: &Costs,
) -> Vec<(Way, Option<f64>)> {
    if !(means.area && on_area(plan.collective) && config.algorithm.is_none()) {
        return Vec::new();
    }
    let bytes = plan.count.saturating_mul(plan.dtype.size());
    candidates(plan.collective, bytes, means)
        .into_iter()
        .flatten()
        .map(|way| {
            (
                way,
                costs.estimate(key(plan.collective, way, plan.in_place), bytes),
            )
        })
        .collect()
}

/// `way ≈ time` for each priced candidate, for logs and tables.
pub fn table_line(table: &[(Way, Option<f64>)]) -> String {
    if table.is_empty() {
        return "none priced (a schedule over the links)".into();
    }
    let each = table.iter().map(|(w, t)| match t {
        Some(t) => format!("{} ≈ {:.2} µs", w.name(), t * 1e6),
        None => format!("{} (not measured)", w.name()),
    });
    each.collect::<Vec<_>>().join(", ")
}

/// The ways `collective` of `bytes` per rank may take through the area given `means`.
fn candidates(collective: Collective, bytes: usize, means: &Means) -> [Option<Way>; 3] {
    let direct = means.direct.then_some(Way::Direct);
    if collective == Collective::AllReduce {
        let one_shot = (bytes <= AREA_BYTES).then_some(Way::OneShot);
        [one_shot, Some(Way::TwoShot), direct]
    } else {
        [Some(Way::Staged), direct, None]
    }
}

fn key(collective: Collective, way: Way, in_place: bool) -> Key {
    Key {
        collective,
        way,
        in_place,
    }
}

/// The way through the area: forced (`OXCCL_AREA_WAY`), by the fixed thresholds when the
/// configuration sets them, else the cheapest by `costs`.
fn area_way(
    plan: &Plan,
    bytes: usize,
    means: &Means,
    config: &Config,
    costs: &Costs,
) -> (Way, &'static str) {
    let c = plan.collective;
    let ways = candidates(c, bytes, means);
    if let Some(w) = config.area_way
        && ways.contains(&Some(w))
    {
        return (w, "forced by OXCCL_AREA_WAY");
    }
    if c == Collective::AllReduce {
        if config.direct_min.is_some() || config.direct_max.is_some() {
            return fixed_all_reduce(plan, bytes, means, config);
        }
    } else if let Some(min) = config.direct_copy_min {
        return if means.direct && bytes >= min {
            (
                Way::Direct,
                "from OXCCL_DIRECT_COPY_MIN: one copy per byte, by the kernel",
            )
        } else {
            (
                Way::Staged,
                "below OXCCL_DIRECT_COPY_MIN: through the area, user-space copies",
            )
        };
    }
    let cost = |w: Way, in_place: bool| costs.estimate(key(c, w, in_place), bytes);
    // The cheapest of `ways` in one placement; unmeasured ways only when nothing is measured.
    let cheapest = |ways: &[Way], in_place: bool| {
        ways.iter()
            .filter_map(|&w| cost(w, in_place).map(|t| (w, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    };
    let (fallback, why) = if c == Collective::AllReduce {
        (Way::TwoShot, "the cost model's cheapest way")
    } else {
        (Way::Staged, "the cost model's cheapest way")
    };
    let mut large = [Way::TwoShot; 2];
    let mut k = 0;
    for w in ways.into_iter().flatten().filter(|&w| w != Way::OneShot) {
        large[k] = w;
        k += 1;
    }
    let large = &large[..k];
    // Ranks may be placed differently, so only the choice between ways that agree at their
    // first turn (direct, and two-shot on a communicator where ranks can reach each other)
    // may depend on placement; one-shot or not, and staged or direct, are priced over both
    // placements so that every rank makes the same choice.
    if ways.contains(&Some(Way::OneShot)) {
        let both =
            |w: &[Way]| -> Option<f64> { Some(cheapest(w, false)?.1 + cheapest(w, true)?.1) };
        if let (Some(one), Some(other)) = (both(&[Way::OneShot]), both(large)) {
            if one <= other {
                return (Way::OneShot, why);
            }
        } else if bytes <= ONE_SHOT_MAX {
            return (Way::OneShot, "unmeasured: one-shot up to 16 KiB");
        }
    }
    if c == Collective::AllReduce {
        return cheapest(large, plan.in_place).map_or((fallback, "unmeasured"), |(w, _)| (w, why));
    }
    let total = |w: Way| Some(cost(w, false)? + cost(w, true)?);
    let best = large
        .iter()
        .filter_map(|&w| total(w).map(|t| (w, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    best.map_or((fallback, "unmeasured"), |(w, _)| (w, why))
}

/// The fixed all-reduce rule of `OXCCL_DIRECT_MIN` / `OXCCL_DIRECT_MAX`, when either is set.
fn fixed_all_reduce(
    plan: &Plan,
    bytes: usize,
    means: &Means,
    config: &Config,
) -> (Way, &'static str) {
    let min = config.direct_min.unwrap_or(Config::DEFAULT_DIRECT_MIN);
    let max = config.direct_max.unwrap_or(Config::DEFAULT_DIRECT_MAX);
    if bytes <= ONE_SHOT_MAX {
        (Way::OneShot, "at most 16 KiB: one exchange, no system call")
    } else if !means.direct {
        (Way::TwoShot, "ranks cannot reach each other's memory")
    } else if bytes >= min && plan.in_place {
        (Way::Direct, "OXCCL_DIRECT_MIN set: in place from it")
    } else if bytes >= min && bytes <= max {
        (Way::Direct, "between OXCCL_DIRECT_MIN and OXCCL_DIRECT_MAX")
    } else {
        (Way::TwoShot, "outside OXCCL_DIRECT_MIN .. OXCCL_DIRECT_MAX")
    }
}

/// Whether `c` has ways through the shared group area.
fn on_area(c: Collective) -> bool {
    matches!(
        c,
        Collective::AllReduce
            | Collective::AllGather
            | Collective::ReduceScatter
            | Collective::Broadcast
            | Collective::Reduce
    )
}

/// The hierarchical algorithm where ranks span several hosts and share some: all-reduce,
/// all-gather and reduce-scatter at every size; broadcast and reduce (chains through one
/// leader per host) on up to 4 hosts or, beyond, from 256 KiB, where the pipelined chain's
/// bandwidth beats a tree's fewer hops. A rule from the measurements on simulated hosts
/// (README, "Several hosts"), not yet a priced choice.
fn hierarchical(
    collective: Collective,
    bytes: usize,
    means: &Means,
) -> Option<(Algorithm, &'static str)> {
    if means.hosts < 2 || means.per_host < 2 {
        return None;
    }
    match collective {
        Collective::AllReduce => Some((
            Algorithm::Hierarchical,
            "hierarchical: ranks share hosts; inside each host, between hosts by every rank \
             on its share, inside each host",
        )),
        Collective::AllGather => Some((
            Algorithm::Hierarchical,
            "hierarchical: each block once to each other host, then inside each host",
        )),
        Collective::ReduceScatter => Some((
            Algorithm::Hierarchical,
            "hierarchical: folded inside each host, then once to each block's rank",
        )),
        Collective::Broadcast | Collective::Reduce if means.hosts <= 4 || bytes > 256 << 10 => {
            Some((
                Algorithm::Hierarchical,
                "hierarchical: chains through one leader per host",
            ))
        }
        _ => None,
    }
}

/// The leg between hosts of a hierarchical all-reduce: one exchange (direct) between two
/// hosts, where a ring's two half-size steps move the same bytes in two rounds, and for
/// latency-bound sizes; a ring beyond.
fn leg(bytes: usize, means: &Means) -> Algorithm {
    if means.hosts <= 2 || bytes <= 64 << 10 {
        Algorithm::Direct
    } else {
        Algorithm::Ring
    }
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
            hosts: 1,
            per_host: nranks,
        }
    }

    #[test]
    fn every_choice_supports_its_collective_and_forcing_applies_where_valid() {
        let costs = Costs::defaults();
        for c in Collective::ALL {
            for count in [0, 1, 1000, 10_000_000] {
                let plan = Plan::new(c, count, DataType::F32);
                for m in [means(5, false, false), means(5, true, true)] {
                    let d = decide(&plan, &m, &Config::default(), costs);
                    match d.route {
                        Route::Schedule(choice) => {
                            assert!(choice.algorithm.supports(c), "{c} -> {}", choice.algorithm)
                        }
                        Route::Area(_) => assert!(m.area && on_area(c)),
                    }
                    let forced = Config::default().algorithm(Some(Algorithm::Tree));
                    let Route::Schedule(choice) = decide(&plan, &m, &forced, costs).route else {
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

    fn area(plan: &Plan, m: &Means, config: &Config, costs: &Costs) -> Way {
        match decide(plan, m, config, costs).route {
            Route::Area(w) => w,
            r => panic!("{plan:?}: {r:?}"),
        }
    }

    /// Costs with one straight line per (collective, way, placement): `lines` gives α (s) and
    /// β (s/B) for the ways listed, for every area collective alike.
    fn lines(lines: &[(Way, bool, f64, f64)]) -> Costs {
        let pts = |a: f64, b: f64| vec![(1, a + b), (1 << 30, a + b * (1u64 << 30) as f64)];
        Costs::from_points(
            "test",
            2,
            cost::AREA_COLLECTIVES.into_iter().flat_map(|c| {
                lines.iter().map(move |&(way, in_place, a, b)| {
                    (
                        Key {
                            collective: c,
                            way,
                            in_place,
                        },
                        pts(a, b),
                    )
                })
            }),
        )
    }

    #[test]
    fn area_ways_are_the_cheapest_and_agree_where_placement_may_differ() {
        let c = Config::default();
        let m = means(2, true, true);
        // One-shot: cheap start, steep; two-shot: in between; direct: dear start, cheapest per
        // byte in place only.
        let costs = lines(&[
            (Way::OneShot, false, 0.2e-6, 1e-9),
            (Way::OneShot, true, 0.2e-6, 1e-9),
            (Way::TwoShot, false, 1e-6, 0.2e-9),
            (Way::TwoShot, true, 1e-6, 0.2e-9),
            (Way::Direct, false, 4e-6, 0.3e-9),
            (Way::Direct, true, 4e-6, 0.1e-9),
        ]);
        let ar = |bytes: usize, in_place: bool, m: &Means, costs: &Costs| {
            let plan =
                Plan::new(Collective::AllReduce, bytes / 4, DataType::F32).in_place(in_place);
            area(&plan, m, &c, costs)
        };
        // One-shot below the 1 KiB crossover, for both placements.
        assert_eq!(ar(512, false, &m, &costs), Way::OneShot);
        assert_eq!(ar(512, true, &m, &costs), Way::OneShot);
        assert_eq!(ar(2048, true, &m, &costs), Way::TwoShot);
        // Direct overtakes two-shot in place from 30 KB; out of place never.
        assert_eq!(ar(16 << 10, true, &m, &costs), Way::TwoShot);
        assert_eq!(ar(64 << 10, true, &m, &costs), Way::Direct);
        assert_eq!(ar(64 << 20, true, &m, &costs), Way::Direct);
        assert_eq!(ar(64 << 20, false, &m, &costs), Way::TwoShot);
        // Not reachable: two-shot.
        assert_eq!(
            ar(64 << 20, true, &means(2, true, false), &costs),
            Way::TwoShot
        );
        // One-shot never past what an area buffer holds, however cheap.
        let cheap = lines(&[
            (Way::OneShot, false, 0.0, 0.0),
            (Way::OneShot, true, 0.0, 0.0),
            (Way::TwoShot, false, 1e-6, 1e-9),
            (Way::TwoShot, true, 1e-6, 1e-9),
        ]);
        assert_eq!(ar(AREA_BYTES, false, &m, &cheap), Way::OneShot);
        assert_eq!(ar(AREA_BYTES + 4, false, &m, &cheap), Way::TwoShot);
        // Nothing measured: one-shot up to 16 KiB, then two-shot; staged.
        let none = Costs::from_points("none", 2, []);
        assert_eq!(ar(ONE_SHOT_MAX, true, &m, &none), Way::OneShot);
        assert_eq!(ar(ONE_SHOT_MAX + 4, true, &m, &none), Way::TwoShot);
        // The fixed rule when OXCCL_DIRECT_MIN / _MAX are set.
        let fixed = c.clone().direct_min(0).direct_max(4 << 20);
        let plan =
            |b: usize, ip| Plan::new(Collective::AllReduce, b / 4, DataType::F32).in_place(ip);
        assert_eq!(area(&plan(8 << 20, true), &m, &fixed, &costs), Way::Direct);
        assert_eq!(
            area(&plan(8 << 20, false), &m, &fixed, &costs),
            Way::TwoShot
        );
        assert_eq!(area(&plan(1 << 20, false), &m, &fixed, &costs), Way::Direct);
        let off = c.clone().direct_min(usize::MAX);
        assert_eq!(area(&plan(64 << 20, true), &m, &off, &costs), Way::TwoShot);
        // Forcing applies where the way exists.
        let forced = c.clone().area_way(Some(Way::Direct));
        assert_eq!(area(&plan(64, false), &m, &forced, &costs), Way::Direct);
        assert_eq!(
            area(&plan(64, false), &means(2, true, false), &forced, &costs),
            Way::OneShot
        );
        let staged = c.clone().area_way(Some(Way::Staged));
        assert_eq!(
            area(&plan(64 << 20, true), &m, &staged, &costs),
            Way::Direct
        );

        // The other collectives: staged or direct, priced over both placements so that ranks
        // placed differently agree.
        let costs = lines(&[
            (Way::Staged, false, 0.2e-6, 0.2e-9),
            (Way::Staged, true, 0.2e-6, 0.2e-9),
            (Way::Direct, false, 2e-6, 0.3e-9),
            (Way::Direct, true, 2e-6, 0.05e-9),
        ]);
        for coll in [
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            let way = |bytes: usize, in_place: bool, config: &Config, m: &Means| {
                let plan = Plan::new(coll, bytes / 4, DataType::F32).in_place(in_place);
                area(&plan, m, config, &costs)
            };
            // In place direct wins from 12 KB, out of place never; summed, from 72 KB.
            for ip in [false, true] {
                assert_eq!(way(64 << 10, ip, &c, &m), Way::Staged, "{coll}");
                assert_eq!(way(80 << 10, ip, &c, &m), Way::Direct, "{coll}");
                assert_eq!(way(80 << 10, ip, &c, &means(3, true, false)), Way::Staged);
            }
            let from_1m = c.clone().direct_copy_min(1 << 20);
            assert_eq!(way((1 << 20) - 4, false, &from_1m, &m), Way::Staged);
            assert_eq!(way(1 << 20, false, &from_1m, &m), Way::Direct);
            assert_eq!(
                way(1 << 20, false, &from_1m, &means(3, true, false)),
                Way::Staged
            );
        }
        // Gather, scatter, all-to-all and barrier run schedules.
        for coll in [
            Collective::Gather,
            Collective::Scatter,
            Collective::AllToAll,
        ] {
            let plan = Plan::new(coll, 1000, DataType::F32);
            assert!(matches!(
                decide(&plan, &m, &c, &costs).route,
                Route::Schedule(_)
            ));
            assert!(price(&plan, &m, &c, &costs).is_empty());
        }
        // The slice size is the communicator's, whatever was configured.
        let plan = Plan::new(Collective::Broadcast, 10, DataType::F32);
        let m = Means {
            slice_bytes: 4096,
            ..means(3, false, false)
        };
        let Route::Schedule(choice) = decide(&plan, &m, &c, &costs).route else {
            panic!("broadcast runs a schedule");
        };
        assert_eq!(choice.slice_bytes, 4096);
    }

    /// Over random costs and sizes: ranks placed differently never take ways that cannot meet
    /// (one-shot against another way, staged against direct), and the way taken in each
    /// placement is never dearer than another way that placement could take alone.
    #[test]
    fn random_costs_keep_placements_compatible_and_pick_a_cheapest_way() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let c = Config::default();
        for _ in 0..500 {
            let mut l = Vec::new();
            for way in Way::ALL {
                for ip in [false, true] {
                    let a = (next() % 10_000) as f64 * 1e-9;
                    let b = (next() % 1000) as f64 * 1e-12;
                    l.push((way, ip, a, b));
                }
            }
            let costs = lines(&l);
            let direct = next() % 2 == 0;
            let m = means(2, true, direct);
            for coll in cost::AREA_COLLECTIVES {
                let bytes = 4usize << (next() % 26);
                let plan = Plan::new(coll, bytes / 4, DataType::F32);
                let (op, ip) = (
                    area(&plan, &m, &c, &costs),
                    area(&plan.in_place(true), &m, &c, &costs),
                );
                if coll != Collective::AllReduce || op == Way::OneShot || ip == Way::OneShot {
                    assert_eq!(op, ip, "{coll} {bytes}");
                }
                assert!(direct || (op != Way::Direct && ip != Way::Direct));
                if coll == Collective::AllReduce && op != Way::OneShot {
                    for (p, w) in [(plan, op), (plan.in_place(true), ip)] {
                        let t = price(&p, &m, &c, &costs);
                        let mine = t.iter().find(|x| x.0 == w).unwrap().1.unwrap();
                        for (other, cost) in &t {
                            if *other != Way::OneShot {
                                assert!(mine <= cost.unwrap(), "{p:?}: {w:?} over {other:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ranks_spanning_hosts_that_share_them_go_hierarchical() {
        let (c, costs) = (Config::default(), Costs::defaults());
        let across = |hosts, per_host| Means {
            hosts,
            per_host,
            ..means(hosts * per_host, false, false)
        };
        let pick = |coll, bytes: usize, m: &Means| {
            let plan = Plan::new(coll, bytes / 4, DataType::F32);
            match decide(&plan, m, &c, costs).route {
                Route::Schedule(choice) => (choice.algorithm, choice.leg),
                other => panic!("{other:?}"),
            }
        };
        let two = across(2, 2);
        for coll in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            assert_eq!(pick(coll, 8, &two).0, Algorithm::Hierarchical, "{coll}");
        }
        assert_eq!(pick(Collective::AllToAll, 8, &two).0, Algorithm::Direct);
        // Between two hosts one exchange; between many, a ring from 64 KiB.
        assert_eq!(
            pick(Collective::AllReduce, 64 << 20, &two).1,
            Algorithm::Direct
        );
        let many = across(8, 4);
        assert_eq!(
            pick(Collective::AllReduce, 64 << 10, &many).1,
            Algorithm::Direct
        );
        assert_eq!(
            pick(Collective::AllReduce, 64 << 20, &many).1,
            Algorithm::Ring
        );
        // Chains through 8 leaders are too long for small broadcasts: a binomial tree.
        assert_eq!(pick(Collective::Broadcast, 8, &many).0, Algorithm::Tree);
        assert_eq!(
            pick(Collective::Broadcast, 1 << 20, &many).0,
            Algorithm::Hierarchical
        );
        // One rank per host, or one host: the flat rules.
        assert_ne!(
            pick(Collective::AllReduce, 8, &across(3, 1)).0,
            Algorithm::Hierarchical
        );
        assert_ne!(
            pick(Collective::AllReduce, 8, &across(1, 4)).0,
            Algorithm::Hierarchical
        );
    }
}
