//! What the C ABI costs over the Rust API on the same path: an 8-byte all-reduce (2 × f32, sum)
//! of two ranks in one process, through `oxcclAllReduce` and through `Communicator::all_reduce`,
//! out of place and in place, in one run. Both pairs of communicators come from `init_local`
//! with the `OXCCL_*` configuration (`OXCCL_TRANSPORTS` defaults to `shm` here), so both take the
//! same route: the shared area's one-shot way, checked before measuring. Rank 1 runs on a
//! helper thread that mirrors rank 0 call for call; the time is rank 0's, per call.
//!
//! Then the handle lookup on its own: `oxcclCommUserRank` (the guard and lookup of every call,
//! with no collective behind them) against `Communicator::rank`, on one rank and on both at
//! once; and last, the difference C − Rust measured in pairs (alternating blocks of C and Rust
//! calls: a busy machine disturbs their difference less than two benchmarks seconds apart).

use std::ffi::c_int;
use std::hint::black_box;
use std::ptr;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use oxccl::{
    oxcclAllReduce, oxcclComm_t, oxcclCommDestroy, oxcclCommInitAll, oxcclCommUserRank,
    oxcclFloat32, oxcclSuccess, oxcclSum,
};
use oxccl_core::algo::{Collective, Plan};
use oxccl_core::{Communicator, Config, DataType, ReduceOp, Route, Way};

/// Which side of the boundary a call enters by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    C,
    Rust,
}

/// What each rank does once per iteration.
#[derive(Clone, Copy, Debug)]
enum Call {
    /// All-reduce from `send` into `recv`.
    OutOfPlace(Api),
    /// All-reduce of `buf` in place (for C: `sendbuff == recvbuff`).
    InPlace(Api),
    /// The rank's number: for C, the guard and the handle lookup with no collective behind them.
    Query(Api),
}

/// One rank: its communicator of the C pair and of the Rust pair, and its buffers.
struct Rank {
    /// The C handle. An id, never an address: kept as an integer so that the rank can move to
    /// its thread.
    handle: usize,
    comm: Communicator,
    send: [f32; 2],
    recv: [f32; 2],
    /// Stays 0 under in-place sums, so that no value grows into infinities.
    buf: [f32; 2],
}

impl Rank {
    fn handle(&self) -> oxcclComm_t {
        ptr::without_provenance_mut(self.handle)
    }

    fn call(&mut self, call: Call) {
        match call {
            Call::OutOfPlace(Api::C) => {
                let (send, recv) = (black_box(&self.send), black_box(&mut self.recv));
                // SAFETY: `send` and `recv` are this rank's own 8-byte buffers, disjoint, and
                // nothing else touches them during the call.
                let r = unsafe {
                    oxcclAllReduce(
                        send.as_ptr().cast(),
                        recv.as_mut_ptr().cast(),
                        2,
                        oxcclFloat32,
                        oxcclSum,
                        self.handle(),
                        ptr::null_mut(),
                    )
                };
                assert_eq!(r, oxcclSuccess, "oxcclAllReduce");
            }
            Call::InPlace(Api::C) => {
                let buf = black_box(&mut self.buf).as_mut_ptr().cast();
                // SAFETY: `buf` is this rank's own 8-byte buffer, and nothing else touches it
                // during the call.
                let r = unsafe {
                    oxcclAllReduce(
                        buf,
                        buf,
                        2,
                        oxcclFloat32,
                        oxcclSum,
                        self.handle(),
                        ptr::null_mut(),
                    )
                };
                assert_eq!(r, oxcclSuccess, "oxcclAllReduce in place");
            }
            Call::OutOfPlace(Api::Rust) => self
                .comm
                .all_reduce(
                    black_box(&self.send),
                    black_box(&mut self.recv),
                    ReduceOp::Sum,
                )
                .expect("all_reduce"),
            Call::InPlace(Api::Rust) => self
                .comm
                .all_reduce_in_place(black_box(&mut self.buf), ReduceOp::Sum)
                .expect("all_reduce_in_place"),
            Call::Query(Api::C) => {
                let mut rank: c_int = -1;
                // SAFETY: `rank` is a writable int.
                let r = unsafe { oxcclCommUserRank(self.handle(), &mut rank) };
                assert_eq!(r, oxcclSuccess, "oxcclCommUserRank");
                black_box(rank);
            }
            Call::Query(Api::Rust) => {
                black_box(black_box(&self.comm).rank());
            }
        }
    }
}

/// Rank 0, driven by the measuring thread, and rank 1 on its helper thread.
struct Pair {
    me: Rank,
    jobs: Sender<(Call, u64)>,
    start: Arc<Barrier>,
    done: Receiver<()>,
    peer: JoinHandle<Rank>,
}

impl Pair {
    /// Both pairs of communicators, with the route of an 8-byte all-reduce checked.
    fn new() -> Pair {
        if std::env::var_os("OXCCL_TRANSPORTS").is_none() {
            // init_local links ranks through in-process queues by default, and the shared area
            // exists only over shared memory: the route of ranks in separate processes on one
            // host, the one to compare on. The C pair reads its configuration from here.
            // SAFETY: no other thread exists yet to read or write the environment: criterion
            // runs benchmarks on this, its only thread, and no communicator exists yet.
            unsafe { std::env::set_var("OXCCL_TRANSPORTS", "shm") };
        }
        let mut handles: [oxcclComm_t; 2] = [ptr::null_mut(); 2];
        // SAFETY: `handles` has room for the 2 handles; no device list.
        let r = unsafe { oxcclCommInitAll(handles.as_mut_ptr(), 2, ptr::null()) };
        assert_eq!(r, oxcclSuccess, "oxcclCommInitAll");
        // The C pair is made by the same call with the same configuration (`Config::from_env`)
        // and size, so the route decided here is its route too.
        let config = Config::from_env().expect("the OXCCL_* configuration");
        let mut comms = Communicator::init_local(2, config).expect("init_local");
        let plan = Plan::new(Collective::AllReduce, 2, DataType::F32).op(ReduceOp::Sum);
        for plan in [plan, plan.in_place(true)] {
            let d = comms[0].explain(&plan);
            assert_eq!(
                d.route,
                Route::Area(Way::OneShot),
                "an 8-byte all-reduce of 2 local ranks should take the one-shot area, not {d}"
            );
        }
        println!("route: {}", comms[0].explain(&plan));
        let rank = |handle: oxcclComm_t, comm| Rank {
            handle: handle as usize,
            comm,
            send: [1.0, 2.0],
            recv: [0.0; 2],
            buf: [0.0; 2],
        };
        let mut partner = rank(handles[1], comms.pop().expect("rank 1"));
        let me = rank(handles[0], comms.pop().expect("rank 0"));
        let (jobs, rx) = mpsc::channel::<(Call, u64)>();
        let (done_tx, done) = mpsc::channel();
        let start = Arc::new(Barrier::new(2));
        let barrier = start.clone();
        let peer = std::thread::spawn(move || {
            for (call, iters) in rx {
                barrier.wait();
                for _ in 0..iters {
                    partner.call(call);
                }
                let _ = done_tx.send(());
            }
            partner
        });
        Pair {
            me,
            jobs,
            start,
            done,
            peer,
        }
    }

    /// Rank 0's time for `iters` calls of `call`, which rank 1 makes too, both starting
    /// together.
    fn time(&mut self, call: Call, iters: u64) -> Duration {
        self.jobs.send((call, iters)).expect("rank 1 alive");
        self.start.wait();
        let t = Instant::now();
        for _ in 0..iters {
            self.me.call(call);
        }
        let took = t.elapsed();
        self.done.recv().expect("rank 1 finished");
        took
    }

    /// Rank 0's time for `iters` calls of `call` that rank 1 does not make (a query).
    fn time_alone(&mut self, call: Call, iters: u64) -> Duration {
        let t = Instant::now();
        for _ in 0..iters {
            self.me.call(call);
        }
        t.elapsed()
    }

    /// Stops rank 1's thread and destroys the C handles (the Rust communicators drop).
    fn close(self) {
        drop(self.jobs);
        let partner = self.peer.join().expect("rank 1 thread");
        for rank in [&self.me, &partner] {
            assert_eq!(oxcclCommDestroy(rank.handle()), oxcclSuccess);
        }
    }
}

fn all_reduce(c: &mut Criterion, pair: &mut Pair) {
    for (form, calls) in [
        (
            "out_of_place",
            [Call::OutOfPlace(Api::C), Call::OutOfPlace(Api::Rust)],
        ),
        (
            "in_place",
            [Call::InPlace(Api::C), Call::InPlace(Api::Rust)],
        ),
    ] {
        let mut g = c.benchmark_group(format!("overhead/all_reduce_8B/{form}"));
        g.warm_up_time(Duration::from_secs(1));
        g.measurement_time(Duration::from_secs(3));
        for call in calls {
            let (Call::OutOfPlace(api) | Call::InPlace(api) | Call::Query(api)) = call;
            g.bench_function(format!("{api:?}"), |b| {
                b.iter_custom(|iters| pair.time(call, iters))
            });
        }
        g.finish();
    }
}

fn lookup(c: &mut Criterion, pair: &mut Pair) {
    let mut g = c.benchmark_group("overhead/query");
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(2));
    for api in [Api::C, Api::Rust] {
        g.bench_function(format!("{api:?}/one_rank"), |b| {
            b.iter_custom(|iters| pair.time_alone(Call::Query(api), iters))
        });
        g.bench_function(format!("{api:?}/both_ranks"), |b| {
            b.iter_custom(|iters| pair.time(Call::Query(api), iters))
        });
    }
    g.finish();
}

/// Nanoseconds per call.
fn per_call(d: Duration, calls: u64) -> f64 {
    d.as_secs_f64() * 1e9 / calls as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// C − Rust from alternating blocks of calls: the median over rounds of each block's time per
/// call, and of the difference within a round.
fn difference(pair: &mut Pair) {
    const ROUNDS: usize = 101;
    const CALLS: u64 = 1_000;
    println!("C − Rust, median of {ROUNDS} rounds of {CALLS} calls each way, alternating:");
    for (form, c, rust) in [
        (
            "out of place",
            Call::OutOfPlace(Api::C),
            Call::OutOfPlace(Api::Rust),
        ),
        ("in place", Call::InPlace(Api::C), Call::InPlace(Api::Rust)),
    ] {
        let (mut cs, mut rs, mut ds) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            // Each goes first in every other round, so that neither always follows the other.
            let (tc, tr) = if round % 2 == 0 {
                let tc = pair.time(c, CALLS);
                (tc, pair.time(rust, CALLS))
            } else {
                let tr = pair.time(rust, CALLS);
                (pair.time(c, CALLS), tr)
            };
            let (tc, tr) = (per_call(tc, CALLS), per_call(tr, CALLS));
            cs.push(tc);
            rs.push(tr);
            ds.push(tc - tr);
        }
        println!(
            "  {form:<12} C {:8.1} ns   Rust {:8.1} ns   C − Rust {:+7.1} ns",
            median(&mut cs),
            median(&mut rs),
            median(&mut ds)
        );
    }
}

fn overhead(c: &mut Criterion) {
    let mut pair = Pair::new();
    all_reduce(c, &mut pair);
    lookup(c, &mut pair);
    difference(&mut pair);
    pair.close();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
