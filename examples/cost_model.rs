//! Prices all-reduce schedules under an α-β link model with the simulator and prints, for
//! n ∈ {8, 64, 1024} and sizes 8 B … 1 GiB, the estimated time of ring, double binary tree and
//! recursive halving-doubling: the first evidence for the tuner.
//!
//! ```text
//! cargo run --release --example cost_model [-- --alpha-us 5 --gbps 12.5]
//! ```
//!
//! Each rank sends and receives one message's bytes at a time (single-port); reduction is free;
//! links buffer one message. Messages are cut into slices of max(256 KiB, S/256) so that large
//! messages pipeline without millions of simulated steps.

use std::time::Instant;

use oxccl::algo::sim::{self, LinkModel, SimConfig};
use oxccl::algo::{self, Algorithm, Choice, Collective, Plan};
use oxccl::types::DataType;

fn main() {
    let mut alpha_us = 5.0;
    let mut gbps = 12.5;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).and_then(|v| v.parse::<f64>().ok());
        match (args[i].as_str(), value) {
            ("--alpha-us", Some(v)) => alpha_us = v,
            ("--gbps", Some(v)) => gbps = v,
            _ => {
                eprintln!("usage: cost_model [--alpha-us MICROSECONDS] [--gbps GIGABYTES_PER_S]");
                std::process::exit(2);
            }
        }
        i += 2;
    }
    let model = LinkModel::new(alpha_us * 1e-6, gbps * 1e9);
    let config = SimConfig {
        check_races: false,
        model,
        ..SimConfig::default()
    };
    let algorithms = [Algorithm::Ring, Algorithm::Tree, Algorithm::HalvingDoubling];
    let sizes: [(u64, &str); 7] = [
        (8, "8 B"),
        (1 << 10, "1 KiB"),
        (64 << 10, "64 KiB"),
        (1 << 20, "1 MiB"),
        (16 << 20, "16 MiB"),
        (256 << 20, "256 MiB"),
        (1 << 30, "1 GiB"),
    ];
    println!(
        "All-reduce, float32, α = {alpha_us} µs per message, β = 1/({gbps} GB/s), single-port \
         ranks, free reduction, one buffered message per link.\n"
    );
    for n in [8usize, 64, 1024] {
        println!("n = {n}\n");
        println!("| size | ring | double tree | halving-doubling | fastest |");
        println!("|---|---|---|---|---|");
        for (bytes, label) in sizes {
            let count = (bytes / 4) as usize;
            let slice = (256 << 10).max(bytes as usize / 256);
            let plan = Plan::new(Collective::AllReduce, count, DataType::F32);
            let mut row = Vec::new();
            for a in algorithms {
                let choice = Choice::new(a).slice_bytes(slice);
                let t = Instant::now();
                let schedules: Vec<_> = (0..n)
                    .map(|r| algo::schedule(&plan, &choice, r, n).expect("valid plan"))
                    .collect();
                let report = sim::price(&schedules, DataType::F32, &config)
                    .unwrap_or_else(|e| panic!("{a} n={n} {label}: {e}"));
                eprintln!(
                    "  {a:>6} n={n:<5} {label:>8}: priced in {:.2?}",
                    t.elapsed()
                );
                row.push(report.time);
            }
            let best = (0..row.len())
                .min_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap_or(0);
            let cells: Vec<String> = row.iter().map(|&t| human(t)).collect();
            println!(
                "| {label} | {} | {} | {} | {} |",
                cells[0], cells[1], cells[2], algorithms[best]
            );
        }
        println!();
    }
}

fn human(seconds: f64) -> String {
    if seconds < 1e-3 {
        format!("{:.1} µs", seconds * 1e6)
    } else if seconds < 1.0 {
        format!("{:.2} ms", seconds * 1e3)
    } else {
        format!("{:.2} s", seconds)
    }
}
