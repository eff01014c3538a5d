//! The executor over the in-process loopback transport: what a collective costs once the
//! network is taken away (planning, descriptors, progress, reduction, copies). Two ranks run
//! as threads; the partner mirrors every iteration the measured thread performs.

use std::hint::black_box;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use oxccl::config::TransportFilter;
use oxccl::{Communicator, Config, ReduceOp};

fn all_reduce(c: &mut Criterion) {
    let config = Config::default().transports(TransportFilter::only(&["loopback"]));
    let mut comms = Communicator::init_local(2, config).expect("init_local");
    let partner = comms.pop().expect("rank 1");
    let me = comms.pop().expect("rank 0");
    let (tx, rx) = mpsc::channel::<(u64, usize)>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let helper = std::thread::spawn(move || {
        for (iters, len) in rx {
            let mut buf = vec![1.0f32; len];
            for _ in 0..iters {
                partner
                    .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                    .expect("partner");
            }
            let _ = done_tx.send(());
        }
    });
    let mut g = c.benchmark_group("executor/loopback/all_reduce");
    g.measurement_time(Duration::from_secs(3));
    for bytes in [8usize, 64 << 10, 1 << 20, 16 << 20] {
        let len = bytes / 4;
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(format!("{bytes}B"), |b| {
            let mut buf = vec![1.0f32; len];
            b.iter_custom(|iters| {
                tx.send((iters, len)).expect("partner alive");
                let t = Instant::now();
                for _ in 0..iters {
                    me.all_reduce_in_place(black_box(&mut buf), ReduceOp::Sum)
                        .expect("rank 0");
                }
                let took = t.elapsed();
                done_rx.recv().expect("partner finished");
                took
            })
        });
    }
    g.finish();
    drop(tx);
    let _ = helper.join();
}

criterion_group!(benches, all_reduce);
criterion_main!(benches);
