//! A soak: COUNT mixed calls (default 100,000) — a random collective (all-reduce, reduce,
//! broadcast, all-gather, reduce-scatter, gather, scatter, all-to-all, barrier, a send/recv
//! ring), size 0 to 4 MiB (log-uniform), element type, operator, root and placement, the same
//! sequence on every rank (one seed) — each result checked against what every rank computes
//! itself (inputs are small integers, exact in every type). Every rank also samples its open
//! file descriptors, resident memory and mapped shared memory after a warm-up and at the end,
//! and fails when any grew: a leak of a descriptor, a segment or a buffer per call shows up as
//! growth over tens of thousands of calls.
//!
//! ```text
//! cargo run --release -p oxrun -- -n 4 target/release/examples/soak [COUNT]
//! ```
//!
//! Prints `soak ok: K calls, fds A -> B, rss A -> B KiB, shm A -> B KiB` on rank 0 and exits
//! 0; on a wrong element, an error or growth it prints what and exits 1.

use oxccl::types::{DataType, ReduceOp};
use oxccl::{Communicator, Config};

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
];
/// Largest call, in bytes per rank.
const MAX_BYTES: usize = 4 << 20;
/// Calls before the first resource sample (buffers, caches and pools settle).
const WARM_UP: usize = 2000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Writes small integer `v` as element `i` of `buf` in `dtype`.
fn put(dtype: DataType, buf: &mut [u8], i: usize, v: f64) {
    let s = dtype.size();
    let at = &mut buf[i * s..(i + 1) * s];
    match dtype {
        DataType::I8 => at.copy_from_slice(&(v as i8).to_le_bytes()),
        DataType::U8 => at.copy_from_slice(&(v as u8).to_le_bytes()),
        DataType::I32 => at.copy_from_slice(&(v as i32).to_le_bytes()),
        DataType::U32 => at.copy_from_slice(&(v as u32).to_le_bytes()),
        DataType::I64 => at.copy_from_slice(&(v as i64).to_le_bytes()),
        DataType::U64 => at.copy_from_slice(&(v as u64).to_le_bytes()),
        DataType::F16 => at.copy_from_slice(&half::f16::from_f64(v).to_le_bytes()),
        DataType::BF16 => at.copy_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
        DataType::F32 => at.copy_from_slice(&(v as f32).to_le_bytes()),
        _ => at.copy_from_slice(&v.to_le_bytes()),
    }
}

/// Fills `buf` with `blocks` equal blocks, block `j` all `v(j)` (a copy of one element).
fn fill(dtype: DataType, buf: &mut [u8], blocks: usize, v: impl Fn(usize) -> f64) {
    let s = dtype.size();
    let per = buf.len() / blocks.max(1);
    for (j, block) in buf.chunks_mut(per.max(s)).enumerate() {
        let mut one = [0u8; 8];
        put(dtype, &mut one, 0, v(j));
        for e in block.chunks_exact_mut(s) {
            e.copy_from_slice(&one[..s]);
        }
    }
}

/// `op` over the contributions 1..=n (rank r gives r + 1), as `dtype` computes it.
fn folded(op: ReduceOp, n: usize, dtype: DataType) -> f64 {
    let vals = (1..=n).map(|v| v as f64);
    match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Max => n as f64,
        ReduceOp::Min => 1.0,
        _ => {
            let avg = vals.sum::<f64>() / n as f64;
            if dtype.is_float() { avg } else { avg.trunc() }
        }
    }
}

/// Open descriptors, resident KiB, mapped shared KiB of this process.
fn resources() -> (usize, u64, u64) {
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let shm: u64 = maps
        .lines()
        .filter(|l| l.contains("memfd:") || l.contains("/dev/shm"))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some(u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?)
        })
        .sum::<u64>()
        / 1024;
    (fds, rss, shm)
}

fn fail(rank: usize, what: String) -> ! {
    println!("soak FAILED on rank {rank}: {what}");
    std::process::exit(1);
}

fn main() {
    let calls: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let comm = Communicator::init(Config::from_env().unwrap_or_default())
        .unwrap_or_else(|e| fail(usize::MAX, format!("init: {e}")));
    let (me, n) = (comm.rank(), comm.size());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Every type but the 8-bit floats, whose few significand bits cannot hold the sums of
    // the small integers the checks rely on.
    let types: Vec<DataType> = DataType::ALL
        .into_iter()
        .filter(|d| !matches!(d, DataType::F8E4M3 | DataType::F8E5M2))
        .collect();
    let mut before = None;
    let mut send = Vec::new();
    let mut recv = Vec::new();
    for k in 0..calls {
        if k == WARM_UP.min(calls / 2) {
            before = Some(resources());
        }
        let dtype = types[rng.below(types.len())];
        let op = OPS[rng.below(OPS.len())];
        let root = rng.below(n);
        let what = rng.below(10);
        let in_place = rng.below(2) == 0;
        // Log-uniform bytes per rank from 0 to 4 MiB, in whole elements.
        let bytes = if rng.below(50) == 0 {
            0
        } else {
            (1usize << rng.below(23)).min(MAX_BYTES) + rng.below(64)
        };
        let count = bytes / dtype.size();
        let sz = dtype.size();
        let mine = (me + 1) as f64;
        let name = [
            "all_reduce",
            "reduce",
            "broadcast",
            "all_gather",
            "reduce_scatter",
            "gather",
            "scatter",
            "all_to_all",
            "barrier",
            "send/recv",
        ][what];
        let call = format!(
            "call {k}: {name} of {count} {dtype} op {op} root {root}{}",
            if in_place { " in place" } else { "" }
        );
        // Checks the first and last elements and 62 others (the whole buffer is moved by the
        // same code; the soak is after leaks and mix-ups, full checks are elsewhere).
        let seed = rng.next() | 1;
        let check = |got: &[u8], want: &dyn Fn(usize) -> f64| {
            let len = got.len() / sz;
            if len == 0 {
                return;
            }
            let mut pick = Rng(seed);
            let at = [0, len - 1]
                .into_iter()
                .chain((0..62).map(|_| pick.below(len)));
            for i in at {
                let mut e = [0u8; 8];
                put(dtype, &mut e, 0, want(i));
                if got[i * sz..(i + 1) * sz] != e[..sz] {
                    fail(
                        me,
                        format!(
                            "{call}: element {i} is {:02x?}, want {:02x?}",
                            &got[i * sz..(i + 1) * sz],
                            &e[..sz]
                        ),
                    );
                }
            }
        };
        let r = match what {
            0 => {
                send.resize(count * sz, 0);
                fill(dtype, &mut send, 1, |_| mine);
                let r = if in_place {
                    comm.all_reduce_in_place_bytes(&mut send, dtype, op)
                } else {
                    recv.resize(count * sz, 0);
                    let r = comm.all_reduce_bytes(&send, &mut recv, dtype, op);
                    std::mem::swap(&mut send, &mut recv);
                    r
                };
                r.map(|()| check(&send, &|_| folded(op, n, dtype)))
            }
            1 => {
                send.resize(count * sz, 0);
                recv.resize(count * sz, 0);
                fill(dtype, &mut send, 1, |_| mine);
                comm.reduce_bytes(&send, &mut recv, dtype, op, root)
                    .map(|()| {
                        if me == root {
                            check(&recv, &|_| folded(op, n, dtype));
                        }
                    })
            }
            2 => {
                send.resize(count * sz, 0);
                fill(dtype, &mut send, 1, |_| mine);
                comm.broadcast_in_place_bytes(&mut send, dtype, root)
                    .map(|()| check(&send, &|_| (root + 1) as f64))
            }
            3 => {
                send.resize(count * sz, 0);
                recv.resize(n * count * sz, 0);
                fill(dtype, &mut send, 1, |_| mine);
                comm.all_gather_bytes(&send, &mut recv, dtype)
                    .map(|()| check(&recv, &|i| (i / count.max(1) + 1) as f64))
            }
            4 => {
                send.resize(n * count * sz, 0);
                recv.resize(count * sz, 0);
                fill(dtype, &mut send, 1, |_| mine);
                comm.reduce_scatter_bytes(&send, &mut recv, dtype, op)
                    .map(|()| check(&recv, &|_| folded(op, n, dtype)))
            }
            5 => {
                send.resize(count * sz, 0);
                recv.resize(n * count * sz, 0);
                fill(dtype, &mut send, 1, |_| mine);
                comm.gather_bytes(&send, &mut recv, dtype, root).map(|()| {
                    if me == root {
                        check(&recv, &|i| (i / count.max(1) + 1) as f64);
                    }
                })
            }
            6 => {
                send.resize(n * count * sz, 0);
                recv.resize(count * sz, 0);
                fill(dtype, &mut send, n, |j| (j + 1) as f64);
                comm.scatter_bytes(&send, &mut recv, dtype, root)
                    .map(|()| check(&recv, &|_| mine))
            }
            7 => {
                send.resize(n * count * sz, 0);
                recv.resize(n * count * sz, 0);
                // Block j goes to rank j; what arrives in block j came from rank j.
                fill(dtype, &mut send, 1, |_| mine);
                comm.all_to_all_bytes(&send, &mut recv, dtype)
                    .map(|()| check(&recv, &|i| (i / count.max(1) + 1) as f64))
            }
            8 => comm.barrier(),
            _ => {
                // A ring: send to the next rank, receive from the previous.
                send.resize(count * sz, 0);
                recv.resize(count * sz, 0);
                fill(dtype, &mut send, 1, |_| mine);
                let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                let mut g = comm.group();
                let r = g
                    .send(&send[..], next)
                    .and_then(|g| g.recv(&mut recv[..], prev))
                    .map(|_| ());
                r.and_then(|()| g.run())
                    .map(|()| check(&recv, &|_| (prev + 1) as f64))
            }
        };
        if let Err(e) = r {
            fail(me, format!("{call}: {e}"));
        }
    }
    let (f0, r0, s0) = before.unwrap_or_else(resources);
    let (f1, r1, s1) = resources();
    // Flat: no new descriptor or shared mapping; resident memory within what the largest call's
    // buffers (send and receive, n blocks each) and allocator slack explain.
    let slack = 2 * (n as u64 * MAX_BYTES as u64 * 2) / 1024 + 16 * 1024;
    if f1 > f0 || s1 > s0 || r1 > r0 + slack {
        fail(
            me,
            format!("resources grew: fds {f0} -> {f1}, rss {r0} -> {r1} KiB, shm {s0} -> {s1} KiB"),
        );
    }
    comm.barrier()
        .unwrap_or_else(|e| fail(me, format!("final barrier: {e}")));
    if me == 0 {
        println!(
            "soak ok: {calls} calls, fds {f0} -> {f1}, rss {r0} -> {r1} KiB, shm {s0} -> {s1} KiB"
        );
    }
}
