//! Scale: schedules for 1,024 ranks generate and simulate, with correct results, in seconds
//! (the test only checks results; speed is printed, never asserted).

mod util;

use std::time::Instant;

use oxccl::algo::{Algorithm, Choice, Collective, Plan};
use oxccl::types::{DataType, ReduceOp};
use util::Case;

fn at_scale(algorithm: Algorithm, collective: Collective, count: usize) {
    let n = 1024;
    let plan = Plan::new(collective, count, DataType::F32)
        .op(ReduceOp::Sum)
        .root(517);
    let case = Case {
        plan,
        choice: Choice::new(algorithm),
        n,
        seed: 7,
        link_buffer: 1,
    };
    let t = Instant::now();
    let report = util::run_checked(&case, false).unwrap();
    println!(
        "{algorithm} {collective} n={n} count={count}: {} rounds, {:.3} ms simulated, {:.2?} wall",
        report.rounds,
        report.time * 1e3,
        t.elapsed()
    );
}

#[test]
fn ring_all_reduce_1024_ranks() {
    at_scale(Algorithm::Ring, Collective::AllReduce, 4 * 1024 + 3);
}

#[test]
fn double_tree_all_reduce_1024_ranks() {
    at_scale(Algorithm::Tree, Collective::AllReduce, 4 * 1024 + 3);
}

#[test]
fn halving_doubling_all_reduce_1000_and_1024_ranks() {
    at_scale(
        Algorithm::HalvingDoubling,
        Collective::AllReduce,
        4 * 1024 + 3,
    );
    let plan = Plan::new(Collective::AllReduce, 3001, DataType::I32).op(ReduceOp::Max);
    let choice = Choice::new(Algorithm::HalvingDoubling);
    util::run_checked(
        &Case {
            plan,
            choice,
            n: 1000,
            seed: 3,
            link_buffer: 1,
        },
        false,
    )
    .unwrap();
}

#[test]
fn binomial_broadcast_and_reduce_1024_ranks() {
    at_scale(Algorithm::Tree, Collective::Broadcast, 1000);
    at_scale(Algorithm::Tree, Collective::Reduce, 1000);
}

#[test]
fn ring_all_gather_and_barrier_1024_ranks() {
    at_scale(Algorithm::Ring, Collective::AllGather, 3);
    at_scale(Algorithm::Direct, Collective::Barrier, 0);
}

#[test]
fn hierarchical_1024_ranks_on_128_hosts() {
    let n = 1024;
    // 128 hosts of 8 ranks, a host's ranks strided (rank r on host r % 128); and uneven hosts
    // of 1 to 15 ranks.
    let even: Vec<usize> = (0..n).map(|r| r % 128).collect();
    let mut uneven = Vec::with_capacity(n);
    let mut h = 0;
    while uneven.len() < n {
        uneven.extend(std::iter::repeat_n(h, 1 + h % 15).take(n - uneven.len()));
        h += 1;
    }
    for (name, labels) in [("128 x 8", even), ("uneven", uneven)] {
        let hosts = oxccl::algo::Hosts::from_labels(&labels);
        for (collective, count) in [
            (Collective::AllReduce, 4 * 1024 + 3),
            (Collective::AllGather, 3),
            (Collective::ReduceScatter, 3),
            (Collective::Broadcast, 1000),
            (Collective::Reduce, 1000),
        ] {
            for leg in [Algorithm::Ring, Algorithm::Direct] {
                if leg == Algorithm::Direct && collective != Collective::AllReduce {
                    continue;
                }
                let case = Case {
                    plan: Plan::new(collective, count, DataType::F32).root(517),
                    choice: Choice::new(Algorithm::Hierarchical).leg(leg),
                    n,
                    seed: 11,
                    link_buffer: 1,
                };
                let t = Instant::now();
                let report = util::run_on(&case, &hosts, false).unwrap();
                println!(
                    "hierarchical ({leg} leg) {collective} on {} hosts ({name}): {} rounds, \
                     {:.3} ms simulated, {:.2?} wall",
                    hosts.count(),
                    report.rounds,
                    report.time * 1e3,
                    t.elapsed()
                );
            }
        }
    }
}
