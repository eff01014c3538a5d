//! Schedule generation and simulation cost: how long a rank takes to plan a collective (on the
//! hot path of every call until plans are cached), and how fast the simulator runs.

use criterion::{Criterion, criterion_group, criterion_main};
use oxccl::algo::sim::{self, SimConfig};
use oxccl::algo::{self, Algorithm, Choice, Collective, Plan};
use oxccl::types::DataType;
use std::hint::black_box;

fn generation(c: &mut Criterion) {
    let mut g = c.benchmark_group("schedule");
    for (algorithm, n, bytes) in [
        (Algorithm::Ring, 2, 8),
        (Algorithm::Ring, 2, 64 << 20),
        (Algorithm::Ring, 64, 64 << 20),
        (Algorithm::Tree, 64, 64 << 20),
        (Algorithm::HalvingDoubling, 64, 64 << 20),
        (Algorithm::Direct, 8, 1024),
        (Algorithm::Ring, 1024, 1 << 20),
    ] {
        let plan = Plan::new(Collective::AllReduce, bytes / 4, DataType::F32);
        let choice = Choice::new(algorithm);
        g.bench_function(format!("{algorithm}/n={n}/{bytes}B"), |b| {
            b.iter(|| algo::schedule(black_box(&plan), &choice, n / 2, n).unwrap())
        });
    }
    g.finish();
}

fn pricing(c: &mut Criterion) {
    let mut g = c.benchmark_group("sim");
    g.sample_size(10);
    let plan = Plan::new(Collective::AllReduce, 16 << 20, DataType::F32);
    for algorithm in [Algorithm::Ring, Algorithm::Tree, Algorithm::HalvingDoubling] {
        let choice = Choice::new(algorithm);
        let schedules: Vec<_> = (0..64)
            .map(|r| algo::schedule(&plan, &choice, r, 64).unwrap())
            .collect();
        let config = SimConfig {
            check_races: false,
            ..SimConfig::default()
        };
        g.bench_function(format!("price/{algorithm}/n=64/64MiB"), |b| {
            b.iter(|| sim::price(black_box(&schedules), DataType::F32, &config).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, generation, pricing);
criterion_main!(benches);
