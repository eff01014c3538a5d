//! The smallest useful oxccl program: every rank contributes a vector, every rank gets the sum.
//!
//! ```text
//! cargo build --release --workspace --bin oxrun --example allreduce
//! target/release/oxrun -n 4 target/release/examples/allreduce
//! ```
//!
//! Under `oxrun` (or torchrun, srun, mpirun) each process is one rank; `Communicator::init`
//! finds the others through the launcher's environment.

use std::time::Instant;

use oxccl::{Communicator, Config, ReduceOp};

fn main() -> Result<(), oxccl::Error> {
    let comm = Communicator::init(Config::from_env()?)?;
    let (rank, size) = (comm.rank(), comm.size());

    // Rank r contributes r + i at position i; the sum over ranks is known in advance.
    let n = 1 << 20;
    let mut grads: Vec<f32> = (0..n).map(|i| (rank + i % 1000) as f32).collect();
    let t = Instant::now();
    comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
    let took = t.elapsed();

    let base = (size * (size - 1) / 2) as f32;
    let ok = grads
        .iter()
        .enumerate()
        .all(|(i, &g)| g == base + (size * (i % 1000)) as f32);
    println!(
        "rank {rank} of {size}: all-reduce of {n} floats in {took:.2?} over {:?}: {}",
        comm.transports()
            .iter()
            .flatten()
            .next()
            .unwrap_or(&"nothing"),
        if ok { "correct" } else { "WRONG" }
    );
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
