//! Runs every collective on a few types and sizes and checks each rank's result: a quick "does
//! this machine (or cluster) work" check, and the rank program of the multi-process tests.
//!
//! ```text
//! cargo run --release -p oxrun -- -n 4 target/release/examples/selftest
//! ```
//!
//! Inputs are small integers known to every rank (so every rank computes every expected result
//! itself, exactly, in every type). Exits 0 and prints `selftest ok` on success; prints the first
//! failure and exits 1 otherwise.

use oxccl::types::{DataType, ReduceOp};
use oxccl::{Communicator, Config, Element};

/// The value rank `r` contributes at element `i`: a small integer, exact in every type.
fn v(r: usize, i: usize) -> i64 {
    ((r * 7 + i * 3) % 13) as i64 - 6
}

fn cast<T: Element + FromI64>(x: i64) -> T {
    T::from_i64(x)
}

/// Conversion from the small integers used here.
trait FromI64 {
    fn from_i64(x: i64) -> Self;
}

macro_rules! from_i64 {
    ($($t:ty => $e:expr),*) => {$(
        impl FromI64 for $t {
            fn from_i64(x: i64) -> Self {
                let f: fn(i64) -> $t = $e;
                f(x)
            }
        }
    )*};
}

from_i64!(f32 => |x| x as f32, i32 => |x| x as i32, u8 => |x| x as u8,
    half::bf16 => |x| half::bf16::from_f32(x as f32), f64 => |x| x as f64);

fn check<T: Element>(what: &str, got: &[T], want: &[T]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, want {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} is {:?}, want {:?}",
            got[i], want[i]
        )),
    }
}

fn run<T: Element + FromI64>(c: &Communicator, count: usize) -> Result<usize, String> {
    let (n, r) = (c.size(), c.rank());
    let e = |what: &str, err: oxccl::Error| format!("{what} of {count} × {}: {err}", T::DTYPE);
    let mine: Vec<T> = (0..count).map(|i| cast(v(r, i))).collect();
    let sum: Vec<T> = (0..count)
        .map(|i| cast::<T>((0..n).map(|q| v(q, i)).sum::<i64>()))
        .collect();
    let max: Vec<T> = (0..count)
        .map(|i| cast::<T>((0..n).map(|q| v(q, i)).max().unwrap_or(0)))
        .collect();
    let root = count % n;
    let mut checks = 0;

    // all-reduce, both placements; sums of small signed integers wrap identically in u8.
    let mut out = vec![cast::<T>(0); count];
    c.all_reduce(&mine, &mut out, ReduceOp::Sum)
        .map_err(|x| e("all_reduce", x))?;
    check("all_reduce sum", &out, &sum)?;
    let mut buf = mine.clone();
    c.all_reduce_in_place(&mut buf, ReduceOp::Max)
        .map_err(|x| e("all_reduce_in_place", x))?;
    if T::DTYPE != DataType::U8 {
        check("all_reduce max", &buf, &max)?;
    }
    checks += 2;

    // reduce and broadcast.
    let mut out = vec![cast::<T>(0); count];
    c.reduce(&mine, &mut out, ReduceOp::Sum, root)
        .map_err(|x| e("reduce", x))?;
    if r == root {
        check("reduce", &out, &sum)?;
    }
    let mut buf = if r == root {
        mine.clone()
    } else {
        vec![cast::<T>(0); count]
    };
    c.broadcast_in_place(&mut buf, root)
        .map_err(|x| e("broadcast", x))?;
    let theirs: Vec<T> = (0..count).map(|i| cast(v(root, i))).collect();
    check("broadcast", &buf, &theirs)?;
    checks += 2;

    // all-gather, reduce-scatter, gather, scatter, all-to-all.
    let all: Vec<T> = (0..n)
        .flat_map(|q| (0..count).map(move |i| cast::<T>(v(q, i))))
        .collect();
    let mut out = vec![cast::<T>(0); n * count];
    c.all_gather(&mine, &mut out)
        .map_err(|x| e("all_gather", x))?;
    check("all_gather", &out, &all)?;
    let big: Vec<T> = (0..n * count).map(|i| cast(v(r, i))).collect();
    let mut out = vec![cast::<T>(0); count];
    c.reduce_scatter(&big, &mut out, ReduceOp::Sum)
        .map_err(|x| e("reduce_scatter", x))?;
    let want: Vec<T> = (r * count..(r + 1) * count)
        .map(|i| cast::<T>((0..n).map(|q| v(q, i)).sum()))
        .collect();
    check("reduce_scatter", &out, &want)?;
    let mut out = vec![cast::<T>(0); if r == root { n * count } else { 0 }];
    c.gather(&mine, &mut out, root)
        .map_err(|x| e("gather", x))?;
    if r == root {
        check("gather", &out, &all)?;
    }
    let src: Vec<T> = if r == root {
        (0..n * count).map(|i| cast(v(root, i))).collect()
    } else {
        vec![]
    };
    let mut out = vec![cast::<T>(0); count];
    c.scatter(&src, &mut out, root)
        .map_err(|x| e("scatter", x))?;
    let want: Vec<T> = (r * count..(r + 1) * count)
        .map(|i| cast(v(root, i)))
        .collect();
    check("scatter", &out, &want)?;
    let mut out = vec![cast::<T>(0); n * count];
    c.all_to_all(&big, &mut out)
        .map_err(|x| e("all_to_all", x))?;
    let want: Vec<T> = (0..n)
        .flat_map(|q| (r * count..(r + 1) * count).map(move |i| cast::<T>(v(q, i))))
        .collect();
    check("all_to_all", &out, &want)?;
    checks += 5;

    // point-to-point around the ring, as one group so it cannot deadlock.
    if n > 1 {
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let mut got = vec![cast::<T>(0); count];
        let mut g = c.group();
        g.send(&mine, next).map_err(|x| e("send", x))?;
        g.recv(&mut got, prev).map_err(|x| e("recv", x))?;
        g.run().map_err(|x| e("send/recv", x))?;
        let want: Vec<T> = (0..count).map(|i| cast(v(prev, i))).collect();
        check("send/recv", &got, &want)?;
        checks += 1;
    }
    c.barrier().map_err(|x| e("barrier", x))?;
    Ok(checks + 1)
}

fn main() {
    let comm = match Communicator::init(Config::from_env().unwrap_or_default()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("selftest: {e}");
            std::process::exit(1);
        }
    };
    let mut checks = 0;
    for count in [0, 1, 1001, 65537] {
        let r = run::<f32>(&comm, count)
            .and_then(|a| run::<i32>(&comm, count).map(|b| a + b))
            .and_then(|a| run::<half::bf16>(&comm, count).map(|b| a + b))
            .and_then(|a| run::<u8>(&comm, count).map(|b| a + b))
            .and_then(|a| run::<f64>(&comm, count).map(|b| a + b));
        match r {
            Ok(k) => checks += k,
            Err(e) => {
                eprintln!("rank {}: selftest FAILED: {e}", comm.rank());
                std::process::exit(1);
            }
        }
    }
    println!(
        "rank {} of {}: selftest ok ({checks} checks, links {:?})",
        comm.rank(),
        comm.size(),
        comm.transports()
    );
}
