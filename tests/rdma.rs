//! The RDMA transport end to end, as processes: every collective of the selftest (five types,
//! sizes 0 to 65537, every collective and point-to-point, each checked against results every
//! rank computes itself) on 2 and 4 ranks forced onto `OXCCL_TRANSPORTS=rdma`, and a rank
//! killed mid-collective failing the others within 2 s with heartbeats off (so the transport
//! alone notices), and a message larger than its receive failing both ranks at once.
//!
//! They need an active RDMA device: CI runs them inside the Soft-RoCE VM
//! (tools/rxe-vm/run-rxe-vm.sh, see .ci/run), where `OXCCL_REQUIRE_RDMA=1` makes a missing
//! device a failure. Elsewhere they print "skipped: …".

mod util;

use std::time::{Duration, Instant};

use util::procs;

/// Why RDMA cannot be tested here, if it cannot.
fn unavailable() -> Option<String> {
    let why = match oxccl_transport_rdma::verbs_available() {
        Err(e) => Some(e),
        Ok(()) => {
            let ports = oxccl_transport_rdma::device::discover(std::path::Path::new("/"));
            oxccl_transport_rdma::device::choose(&ports, None, None).err()
        }
    };
    if let Some(w) = &why {
        assert!(
            std::env::var_os("OXCCL_REQUIRE_RDMA").is_none(),
            "OXCCL_REQUIRE_RDMA is set but RDMA is unavailable: {w}"
        );
        println!("skipped: {w}");
    }
    why
}

fn rdma_env(_: usize) -> Vec<(&'static str, String)> {
    vec![
        ("OXCCL_TRANSPORTS", "rdma".into()),
        ("OXCCL_TIMEOUT", "120".into()),
    ]
}

fn selftest(n: usize) {
    let t = Instant::now();
    let (_store, mut ranks) = procs::launch(n, "selftest", &[], rdma_env);
    for (r, rank) in ranks.iter_mut().enumerate() {
        let line = rank
            .lines
            .recv_timeout(Duration::from_secs(240))
            .unwrap_or_else(|_| panic!("rank {r} of {n}: no result"));
        assert!(line.contains("selftest ok"), "rank {r} of {n}: {line}");
        assert!(
            line.contains("rdma") && !line.contains("tcp") && !line.contains("shm"),
            "rank {r} of {n}: links not all rdma: {line}"
        );
        assert!(
            rank.child.wait().expect("wait").success(),
            "rank {r} of {n}"
        );
        println!("{line}");
    }
    println!(
        "RDMA selftest on {n} ranks passed in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn every_collective_over_rdma_on_2_and_4_ranks() {
    if unavailable().is_some() {
        return;
    }
    selftest(2);
    selftest(4);
}

#[test]
fn a_killed_rank_fails_the_others_within_2_s_over_rdma() {
    if unavailable().is_some() {
        return;
    }
    // 256 Ki floats per all-reduce: under emulation each takes long enough for the kill to land
    // mid-collective. Heartbeats off: the transport itself must notice.
    let (_store, mut ranks) = procs::launch(3, "fault_worker", &["262144", "100000"], |r| {
        let mut e = rdma_env(r);
        e.push(("OXCCL_HEARTBEAT", "off".into()));
        e
    });
    for (r, rank) in ranks.iter().enumerate() {
        for want in ["ready", "iter", "iter"] {
            let line = rank
                .lines
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("rank {r}: no {want:?} line"));
            assert!(line.starts_with(want), "rank {r}: {line}");
        }
    }
    let killed = Instant::now();
    ranks[1].child.kill().expect("kill rank 1");
    for (r, rank) in ranks.iter_mut().enumerate().filter(|(r, _)| *r != 1) {
        let error = loop {
            let line = rank
                .lines
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("rank {r} did not notice rank 1's death"));
            if line.starts_with("error") {
                break line;
            }
        };
        let noticed = killed.elapsed();
        assert!(
            error.contains("PeerFailed") && error.contains("peer: 1"),
            "rank {r}: {error}"
        );
        assert!(
            noticed < Duration::from_secs(2),
            "rank {r} noticed after {noticed:?}: {error}"
        );
        println!("rank {r} noticed rank 1's death over rdma after {noticed:?}");
        assert_eq!(rank.child.wait().expect("wait").code(), Some(2), "rank {r}");
    }
    let _ = ranks[1].child.wait();
}

/// A message larger than the receive its peer posted: the receiver finds the mismatch, and its
/// notice reaches the sender over the link's side connection although the message broke the
/// link's protocol (the sender, whose data nobody will read, waited for its deadline before).
#[test]
fn a_message_larger_than_the_receive_fails_both_ranks_fast_over_rdma() {
    if unavailable().is_some() {
        return;
    }
    for (r, took) in procs::oversized_message_fails_both("rdma", Duration::from_secs(20))
        .iter()
        .enumerate()
    {
        println!("rank {r} failed with the mismatch over rdma after {took:?}");
    }
}
