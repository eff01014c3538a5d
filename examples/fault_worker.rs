//! A rank that all-reduces in a loop and reports how it ends; the rank program of the fault
//! tests (tests/faults.rs), which kill one such process and watch the others.
//!
//! Usage (under a launcher that sets `OXCCL_*`): `fault_worker COUNT ITERATIONS`. Prints `ready`
//! after joining, `iter K` after each all-reduce of COUNT floats, and on failure
//! `error after MS ms: DEBUG` (MS: time since the last success) before exiting with code 2.
//! With a third argument `canary`, a failed rank then fills its buffer with a pattern, waits
//! 300 ms and prints `canary intact` or `canary broken at I` (a peer wrote into memory the call
//! had handed back); it also prints `route R`, the route its all-reduce takes, after `ready`.
//! `FAULT_WORKER_PAUSE_MS` makes it sleep that long after each all-reduce (a rank busy
//! elsewhere, idle to the communicator). `FAULT_WORKER_SECONDS` makes ITERATIONS a minimum:
//! the ranks go on until rank 0 has run that long (it says so through the all-reduce itself,
//! so every rank stops after the same one) and then print `done K` (all-reduces run).
//! `FAULT_WORKER_SHRINK=N`: on `PeerFailed`, a rank shrinks the communicator without the
//! failed peer, prints `shrunk to S ranks without R in MS ms`, runs N all-reduces of checked
//! sums on the new one, prints `checked N` and exits 0 (3 if any of that fails).
//! `FAULT_WORKER_BROADCASTS=K` replaces the all-reduces by K broadcasts of COUNT floats from
//! rank 0 (call k sends k + 1): rank 0 sends them and prints `sent K` (then leaves, dropping
//! the communicator), the others sleep `FAULT_WORKER_PAUSE_MS` first, then receive and check
//! them and print `received K` (or `wrong in call k` and exit 2, or an `error after` line).

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
    let pause = std::env::var("FAULT_WORKER_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis);
    let seconds: Option<f64> = std::env::var("FAULT_WORKER_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok());
    let shrink: Option<usize> = std::env::var("FAULT_WORKER_SHRINK")
        .ok()
        .and_then(|v| v.parse().ok());
    if let Some(k) = std::env::var("FAULT_WORKER_BROADCASTS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return broadcasts(&comm, count, k, pause);
    }
    let began = Instant::now();
    let mut last = Instant::now();
    let mut k = 0usize;
    loop {
        if k >= iterations && seconds.is_none() {
            break;
        }
        if let Some(secs) = seconds {
            // Max of every rank's flag: 2 once rank 0 has run long enough.
            let over = comm.rank() == 0 && began.elapsed().as_secs_f64() >= secs;
            buf[0] = if over { 2.0 } else { 1.0 };
        }
        if k > 0
            && let Some(p) = pause
        {
            std::thread::sleep(p);
        }
        if let Err(e) = comm.all_reduce_in_place(&mut buf, ReduceOp::Max) {
            let _ = writeln!(out, "error after {} ms: {e:?}", last.elapsed().as_millis());
            let _ = out.flush();
            if let (Some(n), oxccl::Error::PeerFailed { peer, .. }) = (shrink, &e) {
                go_on(&comm, *peer, n);
            }
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
        k += 1;
        if seconds.is_some() && buf[0] == 2.0 && k >= iterations {
            let _ = writeln!(out, "done {k}");
            let _ = out.flush();
            break;
        }
    }
}

/// `calls` broadcasts of `count` floats from rank 0, the others checking what they get after
/// sleeping `pause` (so that rank 0 runs ahead of them, and may leave before they read).
fn broadcasts(comm: &Communicator, count: usize, calls: usize, pause: Option<std::time::Duration>) {
    let mut out = std::io::stdout();
    if comm.rank() != 0
        && let Some(p) = pause
    {
        std::thread::sleep(p);
    }
    let began = Instant::now();
    for k in 0..calls {
        let want = (k + 1) as f32;
        let mut buf = vec![if comm.rank() == 0 { want } else { 0.0 }; count];
        if let Err(e) = comm.broadcast_in_place(&mut buf, 0) {
            let _ = writeln!(out, "error after {} ms: {e:?}", began.elapsed().as_millis());
            let _ = out.flush();
            std::process::exit(2);
        }
        if buf.iter().any(|&x| x != want) {
            let _ = writeln!(out, "wrong in call {k}");
            let _ = out.flush();
            std::process::exit(2);
        }
    }
    let word = if comm.rank() == 0 { "sent" } else { "received" };
    let _ = writeln!(out, "{word} {calls}");
    let _ = out.flush();
}

/// Shrinks `comm` without `failed` and runs `n` checked all-reduces on what is left; exits.
fn go_on(comm: &Communicator, failed: oxccl::Rank, n: usize) -> ! {
    let mut out = std::io::stdout();
    let t = Instant::now();
    let small = match comm.shrink(&[failed]) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(out, "shrink failed: {e:?}");
            std::process::exit(3);
        }
    };
    let _ = writeln!(
        out,
        "shrunk to {} ranks without {failed} in {} ms",
        small.size(),
        t.elapsed().as_millis()
    );
    let size = small.size() as f64;
    let want = size * (size + 1.0) / 2.0;
    for k in 0..n {
        let mut x = vec![small.rank() as f64 + 1.0; 4096 + k];
        if let Err(e) = small.all_reduce_in_place(&mut x, ReduceOp::Sum) {
            let _ = writeln!(out, "error on the shrunk communicator: {e:?}");
            std::process::exit(3);
        }
        if let Some(i) = x.iter().position(|&v| v != want) {
            let _ = writeln!(out, "wrong element {i}: {} (want {want})", x[i]);
            std::process::exit(3);
        }
    }
    let _ = writeln!(out, "checked {n}");
    let _ = out.flush();
    std::process::exit(0);
}
