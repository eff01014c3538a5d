//! Property tests of every algorithm × collective in the simulator: for n in 1..=33, counts
//! including 0 and < n, every dtype and op, any root, in place or not, any slice size and
//! scratch depth and link buffering, every rank's result equals an independent reference, no
//! schedule deadlocks or races, and traffic and rounds are what theory says.

mod util;

use oxccl::algo::partition::block;
use oxccl::algo::{Algorithm, Choice, Collective, Hosts, Plan};
use oxccl::types::{DataType, ReduceOp};
use proptest::prelude::*;
use util::{Case, Rng};

/// A random case for `algorithm`.
fn case(algorithm: Algorithm) -> impl Strategy<Value = Case> {
    (
        1usize..=33,
        any::<u64>(),
        1usize..=48,
        1usize..=4,
        1usize..=3,
    )
        .prop_map(move |(n, seed, slice_elems, slots, link_buffer)| {
            let mut rng = Rng(seed ^ 0x5EED);
            let colls: Vec<_> = Collective::ALL
                .into_iter()
                .filter(|&c| algorithm.supports(c))
                .collect();
            let collective = colls[rng.below(colls.len() as u64) as usize];
            let dtype = DataType::ALL[rng.below(DataType::ALL.len() as u64) as usize];
            let ops: Vec<_> = ReduceOp::ALL
                .into_iter()
                .filter(|o| o.supports(dtype))
                .collect();
            let op = if collective.reduces() {
                ops[rng.below(ops.len() as u64) as usize]
            } else {
                ReduceOp::Sum
            };
            let count = match rng.below(5) {
                0 => 0,
                1 => 1 + rng.below(n as u64) as usize, // up to n: some blocks empty
                2 => n * (1 + rng.below(4) as usize) + 1, // uneven by one
                _ => rng.below(if n > 16 { 160 } else { 400 }) as usize,
            };
            let plan = Plan::new(collective, count, dtype)
                .op(op)
                .root(rng.below(n as u64) as usize)
                .in_place(rng.below(2) == 0);
            let choice = Choice::new(algorithm)
                .slice_bytes(slice_elems * dtype.size())
                .scratch_slots(slots);
            Case {
                plan,
                choice,
                n,
                seed,
                link_buffer,
            }
        })
}

/// Checks traffic and round counts against theory where they are exact.
fn check_theory(case: &Case, report: &oxccl::algo::sim::SimReport) -> Result<(), String> {
    let Case {
        plan, choice, n, ..
    } = case;
    let (n, size) = (*n, plan.dtype.size());
    let s = plan.count * size; // bytes of the vector being all-reduced / broadcast
    let one_slice = plan.count * size <= choice.slice_bytes;
    let log2 = |x: usize| (usize::BITS - (x - 1).leading_zeros()) as usize; // ceil(log2 x)
    match (choice.algorithm, plan.collective) {
        (Algorithm::Ring, Collective::AllReduce) if n > 1 => {
            let total: usize = report.ranks.iter().map(|r| r.bytes_sent).sum();
            if total != 2 * (n - 1) * s {
                return Err(format!(
                    "ring all-reduce moved {total} bytes, want {}",
                    2 * (n - 1) * s
                ));
            }
            for (r, st) in report.ranks.iter().enumerate() {
                let ideal = 2.0 * (n - 1) as f64 / n as f64 * s as f64;
                if (st.bytes_sent as f64 - ideal).abs() >= 2.0 * size as f64 {
                    return Err(format!(
                        "rank {r} sent {} bytes, ideal {ideal}",
                        st.bytes_sent
                    ));
                }
            }
            // One message per block per step when every block is non-empty and fits a slice.
            if plan.count >= n
                && block(plan.count, n, 0).len() * size <= choice.slice_bytes
                && report.rounds != 2 * (n - 1)
            {
                return Err(format!("ring all-reduce took {} rounds", report.rounds));
            }
        }
        (Algorithm::HalvingDoubling, Collective::AllReduce) if n > 1 && one_slice => {
            let p = 1 << (usize::BITS - 1 - n.leading_zeros());
            let bound = 2 * log2(p) + if p == n { 0 } else { 2 };
            if report.rounds > bound {
                return Err(format!("hd took {} rounds, bound {bound}", report.rounds));
            }
            if p == n && plan.count >= n {
                let ideal = 2.0 * (n - 1) as f64 / n as f64 * s as f64;
                for (r, st) in report.ranks.iter().enumerate() {
                    // Halving rounds down at each of log2 n levels: allow one element per level.
                    if (st.bytes_sent as f64 - ideal).abs() > (2 * log2(n) * size) as f64 {
                        return Err(format!(
                            "hd rank {r} sent {} bytes, ideal {ideal}",
                            st.bytes_sent
                        ));
                    }
                }
            }
        }
        (Algorithm::Tree, Collective::AllReduce) if n > 1 && one_slice && plan.count > 1 => {
            let bound = 2 * (usize::BITS - 1 - n.leading_zeros()) as usize;
            if report.rounds > bound {
                return Err(format!(
                    "double tree took {} rounds, bound {bound}",
                    report.rounds
                ));
            }
        }
        (Algorithm::Tree, Collective::Broadcast | Collective::Reduce)
            if n > 1 && one_slice && plan.count > 0 =>
        {
            // The longest chain of hops reaches the relative rank with the most set bits; the
            // root's sends to its children are sequential but not dependent on each other.
            let depth = (0..n).map(|v| v.count_ones() as usize).max().unwrap_or(0);
            if report.rounds != depth || depth > log2(n) {
                return Err(format!(
                    "binomial tree took {} rounds, want {depth}",
                    report.rounds
                ));
            }
        }
        (Algorithm::Direct, Collective::Barrier) if n > 1 && report.rounds != log2(n) => {
            return Err(format!(
                "barrier took {} rounds, want {}",
                report.rounds,
                log2(n)
            ));
        }
        _ => {}
    }
    Ok(())
}

fn check(case: Case) -> Result<(), TestCaseError> {
    let report = util::run(&case).map_err(TestCaseError::fail)?;
    check_theory(&case, &report).map_err(|e| TestCaseError::fail(format!("{case:?}: {e}")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn ring(case in case(Algorithm::Ring)) { check(case)?; }

    #[test]
    fn tree(case in case(Algorithm::Tree)) { check(case)?; }

    #[test]
    fn halving_doubling(case in case(Algorithm::HalvingDoubling)) { check(case)?; }

    #[test]
    fn direct(case in case(Algorithm::Direct)) { check(case)?; }
}

/// Every algorithm × collective × dtype × op once, on a few awkward rank counts, in and out of
/// place: the exhaustive sweep the random cases sample from.
#[test]
fn every_combination_on_awkward_sizes() {
    let mut seed = 1;
    for algorithm in Algorithm::ALL {
        for collective in Collective::ALL
            .into_iter()
            .filter(|&c| algorithm.supports(c))
        {
            for dtype in DataType::ALL {
                for op in ReduceOp::ALL.into_iter().filter(|o| o.supports(dtype)) {
                    if !collective.reduces() && op != ReduceOp::Sum {
                        continue;
                    }
                    for (n, count) in [(1, 5), (3, 2), (5, 11), (6, 23)] {
                        for in_place in [false, true] {
                            seed += 1;
                            let plan = Plan::new(collective, count, dtype)
                                .op(op)
                                .root(seed as usize % n)
                                .in_place(in_place);
                            let choice = Choice::new(algorithm).slice_bytes(3 * dtype.size());
                            let case = Case {
                                plan,
                                choice,
                                n,
                                seed,
                                link_buffer: 1,
                            };
                            check(case).unwrap();
                        }
                    }
                }
            }
        }
    }
}

/// Algorithms refuse collectives they do not implement, and bad plans are errors.
#[test]
fn unsupported_and_invalid_plans_are_errors() {
    let plan = Plan::new(Collective::Gather, 10, DataType::F32);
    assert!(oxccl::algo::schedule(&plan, &Choice::new(Algorithm::Ring), 0, 4).is_err());
    let bad_root = Plan::new(Collective::Broadcast, 10, DataType::F32).root(4);
    assert!(oxccl::algo::schedule(&bad_root, &Choice::new(Algorithm::Tree), 0, 4).is_err());
    let bad_op = Plan::new(Collective::AllReduce, 10, DataType::F32).op(ReduceOp::BXor);
    assert!(oxccl::algo::schedule(&bad_op, &Choice::new(Algorithm::Ring), 0, 4).is_err());
    let huge = Plan::new(Collective::AllGather, usize::MAX / 2, DataType::F64);
    assert!(oxccl::algo::schedule(&huge, &Choice::new(Algorithm::Ring), 0, 4).is_err());
    let plan = Plan::new(Collective::AllReduce, 10, DataType::F32);
    assert!(oxccl::algo::schedule(&plan, &Choice::new(Algorithm::Ring), 4, 4).is_err());
}

/// A random hierarchical case: 1–24 ranks spread over 1–6 hosts in any order (hosts of
/// different sizes, a host's ranks not numbered together), either leg between hosts.
fn hierarchical_case() -> impl Strategy<Value = (Case, Vec<usize>)> {
    (
        case(Algorithm::Hierarchical),
        any::<u64>(),
        1usize..=6,
        any::<bool>(),
    )
        .prop_map(|(mut case, seed, hosts, direct)| {
            case.n = case.n.min(24);
            case.plan = case.plan.root(case.plan.root % case.n);
            let leg = if direct {
                Algorithm::Direct
            } else {
                Algorithm::Ring
            };
            case.choice = case.choice.leg(leg);
            let mut rng = Rng(seed);
            let labels = (0..case.n)
                .map(|_| rng.below(hosts as u64) as usize)
                .collect();
            (case, labels)
        })
}

/// Bytes `schedules` send between ranks of one host and between ranks of different hosts.
fn traffic(schedules: &[oxccl::algo::Schedule], hosts: &Hosts) -> (usize, usize) {
    let (mut inside, mut between) = (0, 0);
    for (r, s) in schedules.iter().enumerate() {
        for step in s.steps() {
            if let oxccl::algo::Op::Send { to, src } = step.op {
                if hosts.host(to) == hosts.host(r) {
                    inside += src.len;
                } else {
                    between += src.len;
                }
            }
        }
    }
    (inside, between)
}

/// Hierarchical all-reduce moves exactly the bytes theory says: inside each host of m ranks a
/// ring reduce-scatter and all-gather, 2(m−1)·S; between the H hosts 2(H−1)·S with the ring
/// leg and H(H−1)·S with the direct one (every stretch's owners exchange it whole).
///
/// Hierarchical all-gather of blocks of B bytes on n ranks: every block crosses to each other
/// host once, n(H−1)·B, and a ring all-gather inside each host of m ranks, (m−1)·n·B; the
/// reduce-scatter, its mirror, moves the same.
fn check_hierarchical_traffic(case: &Case, hosts: &Hosts) -> Result<(), String> {
    let plan = &case.plan;
    let schedules: Vec<_> = (0..case.n)
        .map(|r| oxccl::algo::schedule_on(plan, &case.choice, r, hosts).unwrap())
        .collect();
    let s = plan.count * plan.dtype.size();
    let (h, n) = (hosts.count(), case.n);
    let (want_inside, want_between): (usize, usize) = match plan.collective {
        Collective::AllReduce => (
            (0..h).map(|x| 2 * (hosts.members(x).len() - 1) * s).sum(),
            if case.choice.leg == Algorithm::Direct {
                h * (h - 1) * s
            } else {
                2 * (h - 1) * s
            },
        ),
        Collective::AllGather | Collective::ReduceScatter => (
            (0..h).map(|x| (hosts.members(x).len() - 1) * n * s).sum(),
            n * (h - 1) * s,
        ),
        _ => return Ok(()),
    };
    let got = traffic(&schedules, hosts);
    if got != (want_inside, want_between) {
        return Err(format!(
            "{case:?} on {hosts:?}: sent (inside, between) hosts {got:?}, want {:?}",
            (want_inside, want_between)
        ));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn hierarchical((case, labels) in hierarchical_case()) {
        let hosts = Hosts::from_labels(&labels);
        util::run_on(&case, &hosts, true).map_err(TestCaseError::fail)?;
        check_hierarchical_traffic(&case, &hosts).map_err(TestCaseError::fail)?;
    }
}

/// Uneven hosts named in the issue (2 + 1 + 3), interleaved ranks, every collective the
/// hierarchical algorithm has, every dtype and op, both legs, in and out of place.
#[test]
fn hierarchical_on_uneven_interleaved_hosts() {
    let layouts: [&[usize]; 4] = [
        &[0, 0, 1, 2, 2, 2],
        &[1, 0, 2, 2, 0, 2],
        &[0, 1, 0, 1],
        &[0],
    ];
    let mut seed = 7;
    for labels in layouts {
        let hosts = Hosts::from_labels(labels);
        let n = labels.len();
        for collective in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            for dtype in DataType::ALL {
                for op in ReduceOp::ALL.into_iter().filter(|o| o.supports(dtype)) {
                    if !collective.reduces() && op != ReduceOp::Sum {
                        continue;
                    }
                    for leg in [Algorithm::Ring, Algorithm::Direct] {
                        for count in [1, 5, 37] {
                            seed += 1;
                            let plan = Plan::new(collective, count, dtype)
                                .op(op)
                                .root(seed as usize % n)
                                .in_place(seed % 2 == 0);
                            let choice = Choice::new(Algorithm::Hierarchical)
                                .slice_bytes(4 * dtype.size())
                                .scratch_slots(2)
                                .leg(leg);
                            let case = Case {
                                plan,
                                choice,
                                n,
                                seed,
                                link_buffer: 1,
                            };
                            util::run_on(&case, &hosts, true).unwrap();
                            check_hierarchical_traffic(&case, &hosts).unwrap();
                        }
                    }
                }
            }
        }
    }
}
