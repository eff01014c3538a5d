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
