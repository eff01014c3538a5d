//! The flight recorder's cost on the call path: recording a call and its end, as the 8-byte
//! all-reduce through the shared area does (`Communicator::run`), with the default 2,000
//! entries and with the recorder off.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use oxccl::DataType;
use oxccl::algo::{Collective, Plan};
use oxccl::trace::{BenchRecorder, DEFAULT_ENTRIES};

fn record(c: &mut Criterion) {
    let plan = Plan::new(Collective::AllReduce, 2, DataType::F32);
    let mut g = c.benchmark_group("trace/call");
    for entries in [DEFAULT_ENTRIES, 0] {
        let r = BenchRecorder::new(entries);
        let mut seq = 0u64;
        g.bench_function(format!("{entries}_entries"), |b| {
            b.iter(|| {
                r.call(black_box(seq), black_box(&plan));
                seq += 1;
            })
        });
        if entries > 0 {
            assert_eq!(r.snapshot().entries.len(), entries.min(seq as usize));
        }
    }
    g.finish();
}

criterion_group!(benches, record);
criterion_main!(benches);
