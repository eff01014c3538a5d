//! Collectives on CUDA device memory through the communicator (`Communicator::*_device`,
//! feature `cuda`): 4 (also 2 and 3) ranks as threads on device 0, each with a stream of its
//! own, so the calls take the device path (`comm/native.rs`); every collective with device
//! buffers, in place and out of place, for every data type family and operator, on an odd
//! element count, against a reference computed here element by element. Calls enqueued back to
//! back, calls that differ between ranks and a rank that never calls are checked too.
//! Rooted collectives must leave the device memory they ignore untouched, bad sizes must be an
//! error naming the rank and the call, and the stream's order must hold: the input is written by
//! stream work enqueued just before the call, and the output read by stream work enqueued just
//! after it, with no host synchronisation in between.
//!
//! Without a device these tests print "skipped: ..." and pass, unless `OXCCL_REQUIRE_CUDA` is
//! set (tools/gpu-check sets it), which makes that a failure.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use oxccl::reduce::cuda::cudarc::driver::{CudaContext, CudaStream};
use oxccl::reduce::cuda::{self, CudaSlice};
use oxccl::types::{DataType, ReduceOp};
use oxccl::{Communicator, Config, Error};

const RANKS: usize = 4;
/// Elements per block: odd, and not a multiple of any vector width.
const N: usize = 1001;

/// Device 0's context, or `None` after printing why the test is skipped.
fn context_or_skip() -> Option<Arc<CudaContext>> {
    let why = match cuda::device_count() {
        Ok(0) => "no CUDA device".to_owned(),
        Ok(_) => match CudaContext::new(0) {
            Ok(ctx) => return Some(ctx),
            Err(e) => format!("no context on device 0: {e}"),
        },
        Err(e) => e.to_string(),
    };
    assert!(
        std::env::var_os("OXCCL_REQUIRE_CUDA").is_none(),
        "OXCCL_REQUIRE_CUDA is set, but {why}"
    );
    println!("skipped: {why}");
    None
}

/// One element type the tests run: its data type and how to make and combine its values.
trait Value: Copy + PartialEq + std::fmt::Debug + bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: DataType;
    fn of(x: i64) -> Self;
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
    /// `sum / n` (floats only: Avg is not run on integers here).
    fn over(sum: Self, n: usize) -> Self;
}

/// The float types: exact here, since every value is a small integer.
macro_rules! float_value {
    ($t:ty, $d:expr) => {
        impl Value for $t {
            const DTYPE: DataType = $d;
            fn of(x: i64) -> Self {
                x as $t
            }
            fn over(sum: $t, n: usize) -> $t {
                sum / n as $t
            }
            fn combine(op: ReduceOp, a: $t, b: $t) -> $t {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    _ => unreachable!("{op:?}"),
                }
            }
        }
    };
}
float_value!(f32, DataType::F32);
float_value!(f64, DataType::F64);

/// The 16-bit floats: `half` rounds to the type after every operation, as the kernels do
/// (products of 4 ranks' values are inexact in bf16, and rounded the same way in both).
macro_rules! half_value {
    ($t:ty, $d:expr) => {
        impl Value for $t {
            const DTYPE: DataType = $d;
            fn of(x: i64) -> Self {
                <$t>::from_f64(x as f64)
            }
            fn over(sum: $t, n: usize) -> $t {
                <$t>::from_f64(sum.to_f64() / n as f64)
            }
            fn combine(op: ReduceOp, a: $t, b: $t) -> $t {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    _ => unreachable!("{op:?}"),
                }
            }
        }
    };
}
half_value!(half::f16, DataType::F16);
half_value!(half::bf16, DataType::BF16);

/// The integers: wrapping arithmetic and the bitwise operators.
macro_rules! int_value {
    ($t:ty, $d:expr) => {
        impl Value for $t {
            const DTYPE: DataType = $d;
            fn of(x: i64) -> Self {
                x as $t
            }
            fn over(_: $t, _: usize) -> $t {
                unreachable!("Avg is not run on integers here")
            }
            fn combine(op: ReduceOp, a: $t, b: $t) -> $t {
                match op {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::BAnd => a & b,
                    ReduceOp::BOr => a | b,
                    ReduceOp::BXor => a ^ b,
                    _ => unreachable!("{op:?}"),
                }
            }
        }
    };
}
int_value!(i8, DataType::I8);
int_value!(u8, DataType::U8);
int_value!(i32, DataType::I32);
int_value!(i64, DataType::I64);
int_value!(u64, DataType::U64);

/// Rank `r`'s element `i`: small integers (exact in every type, products of 4 stay small),
/// negative for some ranks so min and max differ from first and last.
fn v<T: Value>(r: usize, i: usize) -> T {
    T::of(((i * 7 + r * 3) % 5) as i64 + 1 - (r % 2) as i64 * 3)
}

/// The reference: `op` over the element `i` of every one of `ranks` ranks, in rank order (Avg:
/// the sum over the rank count).
fn folded<T: Value>(op: ReduceOp, i: usize, ranks: usize) -> T {
    let mut acc = v::<T>(0, i);
    for r in 1..ranks {
        acc = T::combine(op, acc, v(r, i));
    }
    if op == ReduceOp::Avg {
        return T::over(acc, ranks);
    }
    acc
}

fn bytes<T: Value>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Rank `r`'s `blocks × N` input elements, element `i` of the whole being `v(r, i)`.
fn input<T: Value>(r: usize, blocks: usize) -> Vec<T> {
    (0..blocks * N).map(|i| v(r, i)).collect()
}

/// Copies `host` to a new device buffer with stream work, enqueued (not waited for).
fn put(stream: &Arc<CudaStream>, host: &[u8]) -> CudaSlice<u8> {
    stream.clone_htod(host).unwrap()
}

/// Reads a device buffer back after everything enqueued on `stream`.
fn get<T: Value>(stream: &Arc<CudaStream>, dev: &CudaSlice<u8>) -> Vec<T> {
    let b = stream.clone_dtoh(dev).unwrap();
    bytemuck::cast_slice(&b).to_vec()
}

/// What one rank checks: its rank, its communicator and its stream.
type Rank<'a> = (usize, &'a Communicator, Arc<CudaStream>);

/// Runs `f` on every rank at once, each on a thread with a stream of its own.
fn on_every_rank(ctx: &Arc<CudaContext>, f: impl Fn(Rank<'_>) + Sync) {
    on_ranks(ctx, RANKS, f)
}

/// [`on_every_rank`] with `ranks` ranks.
fn on_ranks(ctx: &Arc<CudaContext>, ranks: usize, f: impl Fn(Rank<'_>) + Sync) {
    let comms = Communicator::init_local(ranks, Config::default()).unwrap();
    std::thread::scope(|s| {
        for (r, c) in comms.iter().enumerate() {
            let stream = ctx.new_stream().unwrap();
            let f = &f;
            s.spawn(move || f((r, c, stream)));
        }
    });
}

const SENTINEL: u8 = 0xab;

fn every_collective<T: Value>(ctx: &Arc<CudaContext>, ops: &[ReduceOp], ranks: usize) {
    let dtype = T::DTYPE;
    on_ranks(ctx, ranks, |(r, c, s)| {
        // Threads of one process: the device path, not host staging.
        assert!(c.device_native(), "rank {r} of {ranks}: not device-native");
        let what = |name: &str, op: Option<ReduceOp>| {
            format!("rank {r} of {ranks}: {name} {dtype} {op:?}")
        };
        for &op in ops {
            // all-reduce, out of place and in place.
            let want: Vec<T> = (0..N).map(|i| folded(op, i, ranks)).collect();
            let send = put(&s, &bytes(&input::<T>(r, 1)));
            let mut recv = s.alloc_zeros::<u8>(N * dtype.size()).unwrap();
            c.all_reduce_device(&send, &mut recv, dtype, op, &s)
                .unwrap();
            assert_eq!(
                get::<T>(&s, &recv),
                want,
                "{}",
                what("all-reduce", Some(op))
            );
            let mut buf = put(&s, &bytes(&input::<T>(r, 1)));
            c.all_reduce_device_in_place(&mut buf, dtype, op, &s)
                .unwrap();
            assert_eq!(
                get::<T>(&s, &buf),
                want,
                "{}",
                what("all-reduce in place", Some(op))
            );

            // reduce to rank 2: the others' output is left alone.
            let root = ranks - 1;
            let send = put(&s, &bytes(&input::<T>(r, 1)));
            let mut recv = put(&s, &vec![SENTINEL; N * dtype.size()]);
            c.reduce_device(&send, &mut recv, dtype, op, root, &s)
                .unwrap();
            if r == root {
                assert_eq!(get::<T>(&s, &recv), want, "{}", what("reduce", Some(op)));
            } else {
                let b = s.clone_dtoh(&recv).unwrap();
                assert!(
                    b.iter().all(|&x| x == SENTINEL),
                    "{}",
                    what("reduce (non-root)", Some(op))
                );
            }
            // In place: the root's buffer becomes the result, the others' keep their input.
            let mut buf = put(&s, &bytes(&input::<T>(r, 1)));
            c.reduce_device_in_place(&mut buf, dtype, op, root, &s)
                .unwrap();
            let kept = if r == root {
                want.clone()
            } else {
                input::<T>(r, 1)
            };
            assert_eq!(
                get::<T>(&s, &buf),
                kept,
                "{}",
                what("reduce in place", Some(op))
            );

            // reduce-scatter: block r of the fold of every rank's ranks blocks.
            let want: Vec<T> = (0..N).map(|i| folded(op, r * N + i, ranks)).collect();
            let send = put(&s, &bytes(&input::<T>(r, ranks)));
            let mut recv = s.alloc_zeros::<u8>(N * dtype.size()).unwrap();
            c.reduce_scatter_device(&send, &mut recv, dtype, op, &s)
                .unwrap();
            assert_eq!(
                get::<T>(&s, &recv),
                want,
                "{}",
                what("reduce-scatter", Some(op))
            );
            // In place: block r of the whole buffer.
            let mut buf = put(&s, &bytes(&input::<T>(r, ranks)));
            c.reduce_scatter_device_in_place(&mut buf, dtype, op, &s)
                .unwrap();
            let got = get::<T>(&s, &buf);
            let what = what("reduce-scatter in place", Some(op));
            assert_eq!(got[r * N..(r + 1) * N], want[..], "{what}");
        }

        // broadcast from rank 1, out of place (the others' input is never read) and in place.
        let root = 1;
        let want = input::<T>(root, 1);
        let send = put(&s, &bytes(&input::<T>(r, 1)));
        let mut recv = s.alloc_zeros::<u8>(N * dtype.size()).unwrap();
        c.broadcast_device(&send, &mut recv, dtype, root, &s)
            .unwrap();
        assert_eq!(get::<T>(&s, &recv), want, "{}", what("broadcast", None));
        let mut buf = put(&s, &bytes(&input::<T>(r, 1)));
        c.broadcast_device_in_place(&mut buf, dtype, root, &s)
            .unwrap();
        assert_eq!(
            get::<T>(&s, &buf),
            want,
            "{}",
            what("broadcast in place", None)
        );

        // all-gather: block q is rank q's input.
        let want: Vec<T> = (0..ranks * N).map(|i| v(i / N, i % N)).collect();
        let send = put(&s, &bytes(&input::<T>(r, 1)));
        let mut recv = s.alloc_zeros::<u8>(ranks * N * dtype.size()).unwrap();
        c.all_gather_device(&send, &mut recv, dtype, &s).unwrap();
        assert_eq!(get::<T>(&s, &recv), want, "{}", what("all-gather", None));
        // In place: this rank's input already at block r of the whole buffer.
        let mut whole = vec![T::of(0); ranks * N];
        whole[r * N..(r + 1) * N].copy_from_slice(&input::<T>(r, 1));
        let mut buf = put(&s, &bytes(&whole));
        c.all_gather_device_in_place(&mut buf, dtype, &s).unwrap();
        assert_eq!(
            get::<T>(&s, &buf),
            want,
            "{}",
            what("all-gather in place", None)
        );

        // all-to-all: block q comes from rank q's block r.
        let want: Vec<T> = (0..ranks * N).map(|i| v(i / N, r * N + i % N)).collect();
        let send = put(&s, &bytes(&input::<T>(r, ranks)));
        let mut recv = s.alloc_zeros::<u8>(ranks * N * dtype.size()).unwrap();
        c.all_to_all_device(&send, &mut recv, dtype, &s).unwrap();
        assert_eq!(get::<T>(&s, &recv), want, "{}", what("all-to-all", None));
        let mut buf = put(&s, &bytes(&input::<T>(r, ranks)));
        c.all_to_all_device_in_place(&mut buf, dtype, &s).unwrap();
        assert_eq!(
            get::<T>(&s, &buf),
            want,
            "{}",
            what("all-to-all in place", None)
        );
    });
}

#[test]
fn every_collective_on_device_memory_matches_the_reference() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    let floats = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];
    let ints = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::BAnd,
        ReduceOp::BOr,
        ReduceOp::BXor,
    ];
    for ranks in [RANKS, 2, 3] {
        every_collective::<f32>(&ctx, &floats, ranks);
        every_collective::<i32>(&ctx, &ints, ranks);
    }
    every_collective::<f64>(&ctx, &floats, RANKS);
    every_collective::<half::f16>(&ctx, &floats, RANKS);
    every_collective::<half::bf16>(&ctx, &floats, RANKS);
    every_collective::<i8>(&ctx, &ints, RANKS);
    every_collective::<u8>(&ctx, &ints, RANKS);
    every_collective::<i64>(&ctx, &ints, RANKS);
    every_collective::<u64>(&ctx, &ints, RANKS);
}

#[test]
fn stream_order_holds_on_both_sides_of_a_call() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    on_every_rank(&ctx, |(r, c, s)| {
        for round in 0..3i64 {
            // Enqueued, not waited for: the fill of the input, the call, the copy of the output.
            let host: Vec<f32> = (0..N)
                .map(|i| (i as i64 + r as i64 + round) as f32)
                .collect();
            let mut send = s.alloc_zeros::<u8>(N * 4).unwrap();
            s.memcpy_htod(&bytes(&host), &mut send).unwrap();
            let mut recv = s.alloc_zeros::<u8>(N * 4).unwrap();
            c.all_reduce_device(&send, &mut recv, DataType::F32, ReduceOp::Sum, &s)
                .unwrap();
            let mut after = s.alloc_zeros::<u8>(N * 4).unwrap();
            s.memcpy_dtod(&recv, &mut after).unwrap();
            let got = get::<f32>(&s, &after);
            let want: Vec<f32> = (0..N)
                .map(|i| {
                    (0..RANKS)
                        .map(|q| (i as i64 + q as i64 + round) as f32)
                        .sum()
                })
                .collect();
            assert_eq!(got, want, "rank {r} round {round}");
        }
    });
}

/// Calls enqueued back to back with no host synchronisation: every call's result is the next
/// one's input (in place), so a reused event that let a call run early would show.
#[test]
fn back_to_back_device_calls_keep_their_order() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    const ROUNDS: i32 = 12;
    on_every_rank(&ctx, |(r, c, s)| {
        let mut buf = put(&s, &bytes(&vec![1.0f32; N]));
        for _ in 0..ROUNDS {
            c.all_reduce_device_in_place(&mut buf, DataType::F32, ReduceOp::Sum, &s)
                .unwrap();
        }
        let want = (RANKS as f32).powi(ROUNDS);
        assert!(
            get::<f32>(&s, &buf).iter().all(|&x| x == want),
            "rank {r}: not {want} after {ROUNDS} in-place sums"
        );
    });
}

/// Ranks whose device calls differ get a mismatch naming both calls; a rank whose peer never
/// calls gets a timeout naming that peer, and leaves its buffers alone (the call that peer
/// makes later does not run on them: it waits for a partner and times out in turn).
#[test]
fn device_calls_that_differ_or_never_come_are_errors() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    let config = Config {
        timeout: std::time::Duration::from_millis(1500),
        ..Config::default()
    };
    let comms = Communicator::init_local(2, config).unwrap();
    std::thread::scope(|sc| {
        for (r, c) in comms.iter().enumerate() {
            let s = ctx.new_stream().unwrap();
            sc.spawn(move || {
                let n = if r == 0 { N } else { N + 1 };
                let mut buf = s.alloc_zeros::<u8>(n * 4).unwrap();
                let e = c
                    .all_reduce_device_in_place(&mut buf, DataType::F32, ReduceOp::Sum, &s)
                    .unwrap_err();
                assert!(matches!(e, Error::Mismatch { .. }), "rank {r}: {e}");
                let msg = e.to_string();
                assert!(msg.contains(&format!("rank {r}")), "{msg}");
                assert!(
                    msg.contains(&N.to_string()) && msg.contains(&(N + 1).to_string()),
                    "{msg}"
                );
            });
        }
    });
    // Rank 1 calls only after rank 0 gave up: both time out, rank 0 naming rank 1.
    let s0 = ctx.new_stream().unwrap();
    let mut b0 = put(&s0, &bytes(&vec![7.0f32; N]));
    let t = std::time::Instant::now();
    let e = comms[0]
        .all_reduce_device_in_place(&mut b0, DataType::F32, ReduceOp::Sum, &s0)
        .unwrap_err();
    assert!(t.elapsed() < std::time::Duration::from_secs(10), "{e}");
    assert!(
        matches!(
            e,
            Error::Timeout {
                rank: 0,
                peer: Some(1),
                ..
            }
        ),
        "{e}"
    );
    let s1 = ctx.new_stream().unwrap();
    let mut b1 = put(&s1, &bytes(&vec![5.0f32; N]));
    let e = comms[1]
        .all_reduce_device_in_place(&mut b1, DataType::F32, ReduceOp::Sum, &s1)
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { rank: 1, .. }), "{e}");
    assert!(
        get::<f32>(&s0, &b0).iter().all(|&x| x == 7.0),
        "rank 0's buffer was touched"
    );
    assert!(
        get::<f32>(&s1, &b1).iter().all(|&x| x == 5.0),
        "rank 1's buffer was touched"
    );
}

#[test]
fn bad_sizes_on_device_memory_are_errors_naming_rank_and_call() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    let comms = Communicator::init_local(1, Config::default()).unwrap();
    let s = ctx.new_stream().unwrap();
    let send = s.alloc_zeros::<u8>(40).unwrap();
    let mut short = s.alloc_zeros::<u8>(36).unwrap();
    let e = comms[0]
        .all_reduce_device(&send, &mut short, DataType::F32, ReduceOp::Sum, &s)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("rank 0") && msg.contains("all_reduce"),
        "{msg}"
    );
    let mut odd = s.alloc_zeros::<u8>(39).unwrap();
    let e = comms[0]
        .all_reduce_device_in_place(&mut odd, DataType::F32, ReduceOp::Sum, &s)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

/// The staging buffers are page-locked where a context is current, handed out zeroed when
/// new, and reused: a buffer given back comes out again for the next call of its size class
/// with what its last user left (the pool is process-wide; this test's sizes are its own).
#[test]
fn staging_buffers_are_page_locked_and_reused() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    ctx.bind_to_thread().unwrap();
    const LEN: usize = (3 << 20) + 17; // capacity 4 MiB, used by no other test here
    // SAFETY: the driver is loaded; no device copy touches the buffers.
    let mut a = unsafe { cuda::Staging::new(LEN) };
    assert!(
        a.is_locked(),
        "no page-locked memory with a current context"
    );
    assert_eq!(a.len(), LEN);
    assert!(a.iter().all(|&b| b == 0), "a new buffer is not zeroed");
    let at = a.as_ptr();
    a.fill(0xa5);
    drop(a);
    // SAFETY: as above.
    let b = unsafe { cuda::Staging::new(LEN - 1000) };
    assert_eq!(b.as_ptr(), at, "the buffer given back was not reused");
    assert_eq!(b.len(), LEN - 1000);
    assert!(b.iter().all(|&x| x == 0xa5));
    // A second buffer of the class while the first is out is another one.
    // SAFETY: as above.
    let c = unsafe { cuda::Staging::new(LEN) };
    assert_ne!(c.as_ptr(), at);
    assert!(c.is_locked());
}

/// A pooled staging buffer outlives the context it was registered in: the memory is the
/// library's own, so after the program drops its context (here perhaps the last reference to
/// device 0's primary context, which then goes with everything allocated in it) the buffer is
/// still there with its bytes, and still stages copies.
#[test]
fn staging_buffers_outlive_their_context() {
    if context_or_skip().is_none() {
        return;
    }
    const LEN: usize = (5 << 20) + 3; // capacity 8 MiB, used by no other test here
    {
        let ctx = CudaContext::new(0).unwrap();
        ctx.bind_to_thread().unwrap();
        // SAFETY: the driver is loaded; no device copy touches the buffer.
        let mut a = unsafe { cuda::Staging::new(LEN) };
        a.fill(1);
    }
    let ctx = CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    // SAFETY: as above; the copies below are synchronous.
    let mut b = unsafe { cuda::Staging::new(LEN) };
    assert!(
        b.iter().all(|&x| x == 1),
        "the pooled buffer lost its bytes"
    );
    b.fill(2);
    let s = ctx.new_stream().unwrap();
    let on_device = s.clone_htod(&b[..]).unwrap();
    assert_eq!(s.clone_dtoh(&on_device).unwrap(), &b[..]);
}
