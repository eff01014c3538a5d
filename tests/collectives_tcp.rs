//! Every collective × every dtype × every valid op × counts {0, 1, n−1, 1001} (and ~1 MiB + odd
//! with one op per dtype, rotating through the ops) ×
//! n ∈ {1, 2, 3, 4, 5, 8} × every algorithm that implements the collective, run by threads as
//! ranks over TCP on loopback and checked against the independent reference in `util`. In-place
//! and out-of-place alternate from case to case; roots rotate.

mod util;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use oxccl::algo::{Algorithm, Collective, Plan};
use oxccl::config::TransportFilter;
use oxccl::types::{DataType, ReduceOp};
use oxccl::{Communicator, Config};
use util::Rng;

type Job = Box<dyn FnOnce(&Communicator) -> oxccl::Result<Vec<u8>> + Send>;

/// One thread per rank, each owning its communicator and running the jobs it is sent.
struct Ranks {
    jobs: Vec<mpsc::Sender<Job>>,
    results: mpsc::Receiver<(usize, oxccl::Result<Vec<u8>>)>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Ranks {
    fn new(comms: Vec<Communicator>) -> Ranks {
        let (rtx, results) = mpsc::channel();
        let mut jobs = Vec::new();
        let mut threads = Vec::new();
        for c in comms {
            let (tx, rx) = mpsc::channel::<Job>();
            let rtx = rtx.clone();
            jobs.push(tx);
            threads.push(std::thread::spawn(move || {
                for job in rx {
                    let r = job(&c);
                    if rtx.send((c.rank(), r)).is_err() {
                        return;
                    }
                }
            }));
        }
        Ranks {
            jobs,
            results,
            threads,
        }
    }

    /// Runs one job per rank; returns the per-rank results in rank order.
    fn run(&self, jobs: Vec<Job>) -> Vec<oxccl::Result<Vec<u8>>> {
        for (tx, job) in self.jobs.iter().zip(jobs) {
            tx.send(job).expect("rank thread alive");
        }
        let mut out: Vec<Option<oxccl::Result<Vec<u8>>>> =
            (0..self.jobs.len()).map(|_| None).collect();
        for _ in 0..self.jobs.len() {
            let (r, res) = self
                .results
                .recv_timeout(Duration::from_secs(120))
                .expect("a rank hung");
            out[r] = Some(res);
        }
        out.into_iter()
            .map(|r| r.expect("every rank answered"))
            .collect()
    }

    fn finish(self) {
        drop(self.jobs);
        for t in self.threads {
            t.join().expect("rank thread");
        }
    }
}

/// The job rank `r` runs for `plan`, given its input bytes; it returns its logical output.
fn job(plan: Plan, n: usize, r: usize, input: Vec<u8>) -> Job {
    let size = plan.dtype.size();
    let c = plan.count;
    let (dt, op, root) = (plan.dtype, plan.op, plan.root);
    Box::new(move |comm: &Communicator| -> oxccl::Result<Vec<u8>> {
        let mut input = input;
        Ok(match (plan.collective, plan.in_place) {
            (Collective::AllReduce, false) => {
                let mut out = vec![0u8; c * size];
                comm.all_reduce_bytes(&input, &mut out, dt, op)?;
                out
            }
            (Collective::AllReduce, true) => {
                comm.all_reduce_in_place_bytes(&mut input, dt, op)?;
                input
            }
            (Collective::Reduce, false) => {
                let mut out = vec![0u8; if r == root { c * size } else { 0 }];
                comm.reduce_bytes(&input, &mut out, dt, op, root)?;
                out
            }
            (Collective::Reduce, true) => {
                comm.reduce_in_place_bytes(&mut input, dt, op, root)?;
                if r == root { input } else { vec![] }
            }
            (Collective::Broadcast, false) => {
                let mut out = vec![0u8; c * size];
                comm.broadcast_bytes(&input, &mut out, dt, root)?;
                out
            }
            (Collective::Broadcast, true) => {
                let mut buf = if r == root {
                    input
                } else {
                    vec![0u8; c * size]
                };
                comm.broadcast_in_place_bytes(&mut buf, dt, root)?;
                buf
            }
            (Collective::AllGather, false) => {
                let mut out = vec![0u8; n * c * size];
                comm.all_gather_bytes(&input, &mut out, dt)?;
                out
            }
            (Collective::AllGather, true) => {
                let mut buf = vec![0u8; n * c * size];
                buf[r * c * size..(r + 1) * c * size].copy_from_slice(&input);
                comm.all_gather_in_place_bytes(&mut buf, dt)?;
                buf
            }
            (Collective::ReduceScatter, false) => {
                let mut out = vec![0u8; c * size];
                comm.reduce_scatter_bytes(&input, &mut out, dt, op)?;
                out
            }
            (Collective::ReduceScatter, true) => {
                comm.reduce_scatter_in_place_bytes(&mut input, dt, op)?;
                input[r * c * size..(r + 1) * c * size].to_vec()
            }
            (Collective::Gather, _) => {
                let mut out = vec![0u8; if r == root { n * c * size } else { 0 }];
                comm.gather_bytes(&input, &mut out, dt, root)?;
                out
            }
            (Collective::Scatter, _) => {
                let mut out = vec![0u8; c * size];
                comm.scatter_bytes(&input, &mut out, dt, root)?;
                out
            }
            (Collective::AllToAll, false) => {
                let mut out = vec![0u8; n * c * size];
                comm.all_to_all_bytes(&input, &mut out, dt)?;
                out
            }
            (Collective::AllToAll, true) => {
                comm.all_to_all_in_place_bytes(&mut input, dt)?;
                input
            }
            (Collective::Barrier, _) => {
                comm.barrier()?;
                vec![]
            }
        })
    })
}

fn check_case(ranks: &Ranks, plan: Plan, n: usize, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let ins: Vec<Vec<u8>> = (0..n)
        .map(|r| util::input_bytes(plan.dtype, plan.op, r, plan.input_count(r, n), &mut rng))
        .collect();
    let jobs = (0..n).map(|r| job(plan, n, r, ins[r].clone())).collect();
    let outs = ranks.run(jobs);
    let red = util::reduced_bytes(&plan, n, &ins);
    for (r, out) in outs.into_iter().enumerate() {
        let got = out.map_err(|e| format!("{plan:?} n={n}: rank {r} failed: {e}"))?;
        let want = util::expected_bytes(&plan, &ins, &red, r);
        if let Some(i) = util::first_difference(plan.dtype, &got, &want) {
            let show =
                |b: &[u8]| (i * plan.dtype.size() < b.len()).then(|| util::value(plan.dtype, b, i));
            return Err(format!(
                "{plan:?} n={n}: rank {r} element {i} of {}: got {:?}, want {:?}",
                want.len() / plan.dtype.size(),
                show(&got),
                show(&want)
            ));
        }
    }
    Ok(())
}

/// Runs the whole matrix for one communicator size.
fn matrix(n: usize) {
    let start = Instant::now();
    let mut cases = 0;
    let big = |d: DataType| (1 << 20) / d.size() + 1;
    // On one host the hierarchical algorithm is a ring inside it; tests/hierarchy.rs runs it
    // across hosts.
    for algorithm in Algorithm::ALL
        .into_iter()
        .filter(|&a| a != Algorithm::Hierarchical)
    {
        let config = Config::default()
            .transports(TransportFilter::only(&["tcp"]))
            .algorithm(Some(algorithm))
            .timeout(Duration::from_secs(60));
        let ranks = Ranks::new(Communicator::init_local(n, config).expect("init over TCP"));
        for (ci, collective) in Collective::ALL
            .into_iter()
            .enumerate()
            .filter(|&(_, c)| algorithm.supports(c))
        {
            for (d, dtype) in DataType::ALL.into_iter().enumerate() {
                let ops: Vec<ReduceOp> = if collective.reduces() {
                    ReduceOp::ALL
                        .into_iter()
                        .filter(|o| o.supports(dtype))
                        .collect()
                } else {
                    vec![ReduceOp::Sum]
                };
                // The ~1 MiB count (the chunked, pipelined path, which does not depend on the
                // operator) runs with one operator per type, rotating with the type and the
                // collective so that every operator meets it; 1001 already runs each
                // operator's vector body and tail. Every operator at that size was 90% of this
                // file's time (272 of 291 s for 8 ranks).
                let big_op = ops[(d + 5 * ci) % ops.len()];
                for &op in &ops {
                    let counts: Vec<usize> = if collective == Collective::Barrier {
                        vec![0]
                    } else if op == big_op {
                        vec![0, 1, n.saturating_sub(1), 1001, big(dtype)]
                    } else {
                        vec![0, 1, n.saturating_sub(1), 1001]
                    };
                    for count in counts {
                        cases += 1;
                        let plan = Plan::new(collective, count, dtype)
                            .op(op)
                            .root(cases % n)
                            .in_place(cases % 2 == 0);
                        if let Err(e) = check_case(&ranks, plan, n, cases as u64) {
                            panic!("{algorithm}: {e}");
                        }
                    }
                }
            }
        }
        ranks.finish();
    }
    println!("n={n}: {cases} cases in {:.1?}", start.elapsed());
}

#[test]
fn matrix_1_rank() {
    matrix(1);
}

#[test]
fn matrix_2_ranks() {
    matrix(2);
}

#[test]
fn matrix_3_ranks() {
    matrix(3);
}

#[test]
fn matrix_4_ranks() {
    matrix(4);
}

#[test]
fn matrix_5_ranks() {
    matrix(5);
}

#[test]
fn matrix_8_ranks() {
    matrix(8);
}
