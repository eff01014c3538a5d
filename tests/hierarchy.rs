//! Ranks on several hosts, simulated by host identities (`Config::host_id`) on threads of one
//! process: shared memory links ranks of one host and TCP ranks of different hosts, as on a
//! cluster. The topology shows the hosts; every rank takes the route the tuner priced cheapest,
//! the hierarchical one only where ranks both span hosts and share them, and always for large
//! all-reduces, all-gathers and reduce-scatters on hosts of equal size (priced with a 10 Gb/s
//! network between hosts); and every collective's result matches sums computed here
//! (2 hosts × 2 ranks, 3 hosts × 1 rank, 2 + 1 ranks, and 2 + 1 + 3 with interleaved ranks).

mod util;

use std::time::Duration;

use oxccl::algo::{Algorithm, Collective, Plan};
use oxccl::config::TransportFilter;
use oxccl::tune::{Costs, LinkCost, LinkKind};
use oxccl::types::{DataType, ReduceOp};
use oxccl::{Communicator, Config, Route, UniqueId};
use util::procs::on_each;

/// One communicator per rank, rank r on host `labels[r]`, over shared memory and TCP, priced by
/// the defaults but for TCP, which costs what a 10 Gb/s network does (20 µs a message, 1.25
/// GB/s): between threads the TCP links are loopback, as fast as shared memory, and would
/// not show what the tuner does between hosts.
fn cluster(labels: &[usize]) -> Vec<Communicator> {
    let n = labels.len();
    let id = UniqueId::new().expect("unique id");
    let network = Costs::defaults().clone().with_link(
        LinkKind::Tcp,
        LinkCost {
            alpha: 20e-6,
            beta: 0.8e-9,
            stream: None,
        },
    );
    let table = std::env::temp_dir().join(format!(
        "oxccl-hierarchy-{}-{n}r-{}.txt",
        std::process::id(),
        labels.iter().map(|h| h.to_string()).collect::<String>()
    ));
    let text = network
        .to_text()
        .replace("\nranks 2\n", &format!("\nranks {n}\n"));
    std::fs::write(&table, text).expect("cost table");
    std::thread::scope(|s| {
        let handles: Vec<_> = labels
            .iter()
            .enumerate()
            .map(|(r, &h)| {
                let (id, table) = (&id, &table);
                s.spawn(move || {
                    let mut config = Config::default()
                        .transports(TransportFilter::only(&["shm", "tcp"]))
                        .timeout(Duration::from_secs(60));
                    config.host_id = Some(format!("host{h}"));
                    let config = config.tune_file(Some(table.clone()));
                    Communicator::init_rank(id, n, r, config).expect("init")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("init thread"))
            .collect()
    })
}

/// Rank `r`'s value at `i`: small integers, so float sums are exact in any order.
fn value(r: usize, i: usize) -> f32 {
    ((i * 7 + r * 13) % 23) as f32 - 11.0
}

const COUNTS: [usize; 5] = [0, 1, 7, 1001, 300_007];

/// Every collective on every rank, each result checked against the values computed here.
fn check_collectives(comms: &[Communicator]) {
    let n = comms.len();
    let results = on_each(comms, |c| -> Result<(), String> {
        let r = c.rank();
        let fail = |what: &str, count: usize| format!("rank {r}: {what} of {count} wrong");
        for (k, &count) in COUNTS.iter().enumerate() {
            let mine: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
            let sum: Vec<f32> = (0..count)
                .map(|i| (0..n).map(|q| value(q, i)).sum())
                .collect();
            let max: Vec<f32> = (0..count)
                .map(|i| (0..n).map(|q| value(q, i)).fold(f32::MIN, f32::max))
                .collect();
            let root = (k + 1) % n;

            let mut out = vec![0f32; count];
            c.all_reduce(&mine, &mut out, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            if out != sum {
                return Err(fail("all_reduce sum", count));
            }
            let mut buf = mine.clone();
            c.all_reduce_in_place(&mut buf, ReduceOp::Max)
                .map_err(|e| e.to_string())?;
            if buf != max {
                return Err(fail("all_reduce max in place", count));
            }
            let mut avg = mine.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            c.all_reduce_in_place(&mut avg, ReduceOp::Avg)
                .map_err(|e| e.to_string())?;
            let want: Vec<f64> = sum.iter().map(|&s| f64::from(s) / n as f64).collect();
            if avg != want {
                return Err(fail("all_reduce avg", count));
            }

            let mut out = vec![0f32; count];
            c.broadcast(&mine, &mut out, root)
                .map_err(|e| e.to_string())?;
            if out != (0..count).map(|i| value(root, i)).collect::<Vec<_>>() {
                return Err(fail("broadcast", count));
            }
            let mut out = vec![0f32; count];
            c.reduce(&mine, &mut out, ReduceOp::Sum, root)
                .map_err(|e| e.to_string())?;
            if r == root && out != sum {
                return Err(fail("reduce", count));
            }

            let mut gathered = vec![0f32; count * n];
            c.all_gather(&mine, &mut gathered)
                .map_err(|e| e.to_string())?;
            let want: Vec<f32> = (0..n)
                .flat_map(|q| (0..count).map(move |i| value(q, i)))
                .collect();
            if gathered != want {
                return Err(fail("all_gather", count));
            }
            let mut block = vec![0f32; count];
            c.reduce_scatter(&want, &mut block, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            let rs: Vec<f32> = (0..count).map(|i| n as f32 * value(r, i)).collect();
            if block != rs {
                return Err(fail("reduce_scatter", count));
            }
        }
        Ok(())
    });
    for (r, (result, _)) in results.into_iter().enumerate() {
        result.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}

/// Links, topology and routes as the layout implies, then every collective.
fn check_layout(labels: &[usize]) {
    let comms = cluster(labels);
    let n = labels.len();
    let nhosts = {
        let mut h = labels.to_vec();
        h.sort();
        h.dedup();
        h.len()
    };
    let shared = (0..n).any(|a| (0..n).any(|b| a != b && labels[a] == labels[b]));
    let on = |h: usize| labels.iter().filter(|&&l| l == h).count();
    let even = labels.iter().all(|&h| on(h) == on(labels[0]));
    for c in &comms {
        let r = c.rank();
        let want: Vec<Option<&str>> = (0..n)
            .map(|q| (q != r).then_some(if labels[q] == labels[r] { "shm" } else { "tcp" }))
            .collect();
        assert_eq!(c.transports(), &want[..], "rank {r}'s links");
        assert_eq!(c.topology().nhosts(), nhosts, "rank {r}'s topology");
        for collective in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            for bytes in [8, 1 << 20] {
                let plan = Plan::new(collective, bytes / 4, DataType::F32);
                let route = c.explain(&plan).route;
                assert_eq!(route, comms[0].explain(&plan).route, "every rank alike");
                util::takes_a_cheapest_route(c, &plan).unwrap();
                let hierarchical = matches!(route,
                    Route::Schedule(ch) if ch.algorithm == Algorithm::Hierarchical);
                if !(nhosts > 1 && shared) {
                    assert!(!hierarchical, "{collective} on {labels:?} took {route:?}");
                } else if even
                    && bytes > 8
                    && collective != Collective::Broadcast
                    && collective != Collective::Reduce
                {
                    // Bandwidth-bound on hosts of equal size: each byte crosses between hosts
                    // once per host pair. (Where a host has one rank, all its traffic goes
                    // through it either way, and a flat ring may cost the same.)
                    assert!(
                        hierarchical,
                        "rank {r}: {collective} of {bytes} B on {labels:?} took {route:?}"
                    );
                }
            }
        }
    }
    check_collectives(&comms);
}

#[test]
fn two_hosts_of_two_ranks() {
    check_layout(&[0, 0, 1, 1]);
}

#[test]
fn three_hosts_of_one_rank() {
    check_layout(&[0, 1, 2]);
}

#[test]
fn hosts_of_two_and_one_ranks() {
    check_layout(&[0, 1, 0]);
}

#[test]
fn hosts_of_two_one_and_three_ranks_interleaved() {
    check_layout(&[2, 0, 2, 1, 0, 2]);
}

/// A calibration across hosts measures both kinds of link — shared memory between the two
/// ranks of the second host (whose first rank sends the result to rank 0), TCP between rank 0
/// and that host — and the fold rate; every rank takes rank 0's table, and the collectives
/// still give the right sums on the routes it prices.
#[test]
fn calibration_measures_each_kind_of_link() {
    let comms = cluster(&[0, 1, 1]);
    let before = comms[0].costs();
    let tables: Vec<Costs> = on_each(&comms, |c| c.calibrate())
        .into_iter()
        .map(|(r, _)| r.expect("calibrate"))
        .collect();
    assert!(tables.iter().all(|t| t == &tables[0]), "every rank alike");
    let costs = &tables[0];
    assert!(
        costs.source().starts_with("links calibrated on"),
        "{}",
        costs.source()
    );
    assert_eq!(
        costs.ranks(),
        3,
        "a cache is checked against the rank count"
    );
    for kind in [LinkKind::Shm, LinkKind::Tcp] {
        let l = costs
            .link(kind)
            .unwrap_or_else(|| panic!("{kind:?} not measured"));
        assert!(l.alpha > 0.0 && l.alpha < 0.1, "{kind:?}: {l:?}");
        assert!(l.beta > 0.0 && l.beta < 1e-6, "{kind:?}: {l:?}");
        assert_ne!(Some(l), before.link(kind), "{kind:?} measured, not kept");
    }
    assert!(costs.gamma().is_some_and(|g| g > 0.0 && g < 1e-6));
    check_collectives(&comms);
}
