//! A rank that all-reduces in a loop and reports how it ends; the rank program of the fault
//! tests (tests/faults.rs), which kill one such process and watch the others.
//!
//! Usage (under a launcher that sets `OXCCL_*`): `fault_worker COUNT ITERATIONS`. Prints `ready`
//! after joining, `iter K` after each all-reduce of COUNT floats, and on failure
//! `error after MS ms: DEBUG` (MS: time since the last success) before exiting with code 2.

use std::io::Write;
use std::time::Instant;

use oxccl::{Communicator, Config, ReduceOp};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (count, iterations) = (
        args.first().copied().unwrap_or(1 << 20),
        args.get(1).copied().unwrap_or(10),
    );
    let comm = match Communicator::init(Config::from_env().unwrap_or_default()) {
        Ok(c) => c,
        Err(e) => {
            println!("error after 0 ms: {e:?}");
            std::process::exit(2);
        }
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    let mut buf = vec![1.0f32; count];
    let mut last = Instant::now();
    for k in 0..iterations {
        if let Err(e) = comm.all_reduce_in_place(&mut buf, ReduceOp::Max) {
            let _ = writeln!(out, "error after {} ms: {e:?}", last.elapsed().as_millis());
            let _ = out.flush();
            std::process::exit(2);
        }
        last = Instant::now();
        let _ = writeln!(out, "iter {k}");
        let _ = out.flush();
    }
}
