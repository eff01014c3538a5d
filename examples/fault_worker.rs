//! A rank that all-reduces in a loop and reports how it ends; the rank program of the fault
//! tests (tests/faults.rs), which kill one such process and watch the others.
//!
//! Usage (under a launcher that sets `OXCCL_*`): `fault_worker COUNT ITERATIONS`. Prints `ready`
//! after joining, `iter K` after each all-reduce of COUNT floats, and on failure
//! `error after MS ms: DEBUG` (MS: time since the last success) before exiting with code 2.
//! With a third argument `canary`, a failed rank then fills its buffer with a pattern, waits
//! 300 ms and prints `canary intact` or `canary broken at I` (a peer wrote into memory the call
//! had handed back); it also prints `route R`, the route its all-reduce takes, after `ready`.

use std::io::Write;
use std::time::Instant;

use oxccl::{Communicator, Config, ReduceOp};

fn main() {
    let canary = std::env::args().nth(3).is_some_and(|a| a == "canary");
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
    if canary {
        let plan = oxccl::algo::Plan::new(
            oxccl::algo::Collective::AllReduce,
            count,
            oxccl::DataType::F32,
        )
        .in_place(true);
        let _ = writeln!(out, "route {}", comm.explain(&plan).route.name());
    }
    let _ = out.flush();
    let mut buf = vec![1.0f32; count];
    let mut last = Instant::now();
    for k in 0..iterations {
        if let Err(e) = comm.all_reduce_in_place(&mut buf, ReduceOp::Max) {
            let _ = writeln!(out, "error after {} ms: {e:?}", last.elapsed().as_millis());
            let _ = out.flush();
            if canary {
                let pattern = f32::from_bits(0x7f4d_a5a5);
                buf.fill(pattern);
                std::thread::sleep(std::time::Duration::from_millis(300));
                match buf.iter().position(|x| x.to_bits() != pattern.to_bits()) {
                    None => {
                        let _ = writeln!(out, "canary intact");
                    }
                    Some(i) => {
                        let _ = writeln!(out, "canary broken at {i}");
                    }
                }
                let _ = out.flush();
            }
            std::process::exit(2);
        }
        last = Instant::now();
        let _ = writeln!(out, "iter {k}");
        let _ = out.flush();
    }
}
