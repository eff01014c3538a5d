//! Host reduction kernels next to `memcpy`.
//!
//! Throughput is bytes of the destination buffer per second, so a reduction that keeps up with
//! `memcpy` shows the same figure. Every benchmark of a size uses the same buffers (refilled for
//! its element type), so page placement does not differ between them. Run with
//! `cargo bench --bench reduce_cpu`.

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use half::{bf16, f16};
use oxccl::reduce::cpu::{reduce, reduce_into};
use oxccl::types::{Element, F8E4M3, ReduceOp};

const LARGE: usize = 64 << 20;
const SMALL: usize = 256 << 10;

/// Three buffers of one size, 8-byte aligned: destination and two sources.
struct Buffers {
    dst: Vec<u64>,
    a: Vec<u64>,
    b: Vec<u64>,
}

impl Buffers {
    fn new(bytes: usize) -> Self {
        let words = bytes / 8;
        // Filled (not just allocated), so every page is mapped before timing starts.
        Buffers {
            dst: vec![1; words],
            a: vec![1; words],
            b: vec![1; words],
        }
    }

    /// The buffers viewed as `T`, each element set to `f(i)`.
    fn fill<T: Element>(&mut self, f: impl Fn(usize) -> T) -> (&mut [T], &[T], &[T]) {
        for buf in [&mut self.dst, &mut self.a, &mut self.b] {
            let view: &mut [T] = bytemuck::cast_slice_mut(buf);
            for (i, x) in view.iter_mut().enumerate() {
                *x = f(i);
            }
        }
        (
            bytemuck::cast_slice_mut(&mut self.dst),
            bytemuck::cast_slice(&self.a),
            bytemuck::cast_slice(&self.b),
        )
    }
}

fn group<'a>(c: &'a mut Criterion, name: &str, bytes: usize) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Bytes(bytes as u64));
    g
}

/// `copy_from_slice` of the whole buffer: the yardstick.
fn memcpy(g: &mut BenchmarkGroup<'_, WallTime>, bufs: &mut Buffers) {
    let (dst, src, _) = bufs.fill(|i| i as u64);
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(src));
            black_box(&mut *dst);
        })
    });
}

/// `reduce(dst, src, op)`: `dst ⊕= src` in place.
fn in_place<T: Element>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    bufs: &mut Buffers,
    op: ReduceOp,
    f: impl Fn(usize) -> T,
) {
    let (dst, src, _) = bufs.fill(f);
    g.bench_function(name, |b| {
        b.iter(|| reduce(black_box(&mut *dst), black_box(src), op).unwrap())
    });
}

/// `reduce_into(out, a, b, op)`: `out = a ⊕ b`.
fn out_of_place<T: Element>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    bufs: &mut Buffers,
    op: ReduceOp,
    f: impl Fn(usize) -> T,
) {
    let (out, a, b) = bufs.fill(f);
    g.bench_function(name, |bench| {
        bench.iter(|| reduce_into(black_box(&mut *out), black_box(a), black_box(b), op).unwrap())
    });
}

/// Values that stay normal under repeated in-place sums (they grow, saturate or reach infinity,
/// never subnormal), so no iteration takes a slow path.
fn f32_val(i: usize) -> f32 {
    (i % 97) as f32 * 0.25 + 0.5
}

fn large(c: &mut Criterion) {
    let mut bufs = Buffers::new(LARGE);
    let mut g = group(c, "reduce_64MiB", LARGE);
    memcpy(&mut g, &mut bufs);
    in_place(&mut g, "f32_sum", &mut bufs, ReduceOp::Sum, f32_val);
    out_of_place(&mut g, "f32_sum_into", &mut bufs, ReduceOp::Sum, f32_val);
    in_place(&mut g, "f32_max", &mut bufs, ReduceOp::Max, |i| {
        f32_val(i) - 12.0
    });
    in_place(&mut g, "bf16_sum", &mut bufs, ReduceOp::Sum, |i| {
        bf16::from_f32(f32_val(i))
    });
    in_place(&mut g, "f16_sum", &mut bufs, ReduceOp::Sum, |i| {
        f16::from_f32(f32_val(i))
    });
    // Values that saturate under repeated sums (at 448), never NaN.
    in_place(&mut g, "f8e4m3_sum", &mut bufs, ReduceOp::Sum, |i| {
        F8E4M3::from_f32(f32_val(i))
    });
    in_place(&mut g, "i32_sum", &mut bufs, ReduceOp::Sum, |i| i as i32);
    g.finish();
}

fn small(c: &mut Criterion) {
    let mut bufs = Buffers::new(SMALL);
    let mut g = group(c, "reduce_256KiB", SMALL);
    memcpy(&mut g, &mut bufs);
    in_place(&mut g, "f32_sum", &mut bufs, ReduceOp::Sum, f32_val);
    // In cache, the half types' conversions are what costs.
    in_place(&mut g, "bf16_sum", &mut bufs, ReduceOp::Sum, |i| {
        bf16::from_f32(f32_val(i))
    });
    out_of_place(&mut g, "bf16_sum_into", &mut bufs, ReduceOp::Sum, |i| {
        bf16::from_f32(f32_val(i))
    });
    in_place(&mut g, "f16_sum", &mut bufs, ReduceOp::Sum, |i| {
        f16::from_f32(f32_val(i))
    });
    g.finish();
}

criterion_group!(benches, large, small);
criterion_main!(benches);
