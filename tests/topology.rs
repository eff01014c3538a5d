//! The topology a communicator holds: discovered and exchanged (every rank sees every rank's
//! host and place), written by rank 0 to `OXCCL_TOPO_DUMP_FILE`, and read instead from an
//! `OXCCL_TOPO_FILE` fixture — whose hosts the tuner then sees, so a fixture of two hosts makes
//! the all-reduce hierarchical on this one machine — with a fixture of the wrong size refused.

mod util;

use std::path::PathBuf;

use oxccl::algo::{Algorithm, Collective, Plan};
use oxccl::config::TransportFilter;
use oxccl::topo::Topology;
use oxccl::types::{DataType, ReduceOp};
use oxccl::{Communicator, Config, Route};

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("oxccl-topology-{}-{name}", std::process::id()))
}

/// `n` ranks over shared memory, on the defaults' costs (no test probes the machine under the
/// load of the other tests and caches that for the developer's runs).
fn shm(n: usize, config: Config) -> oxccl::Result<Vec<Communicator>> {
    let config = config.tune(oxccl::Tune::Defaults);
    Communicator::init_local(n, config.transports(TransportFilter::only(&["shm"])))
}

#[test]
fn discovered_topology_is_exchanged_and_dumped_by_rank_0() {
    let dump = scratch("dump.json");
    let config = Config::default().topo_dump_file(Some(dump.clone()));
    let comms = shm(3, config).unwrap();
    let t = comms[0].topology();
    assert_eq!((t.nranks(), t.nhosts(), t.machines.len()), (3, 1, 1));
    assert!(!t.machines[0].numa.is_empty(), "{t:?}");
    assert!(
        t.ranks
            .iter()
            .all(|p| p.host == 0 && p.pid == std::process::id())
    );
    for c in &comms {
        assert_eq!(c.topology(), t, "rank {} sees another topology", c.rank());
    }
    let written = Topology::load(&dump).unwrap();
    std::fs::remove_file(&dump).unwrap();
    assert_eq!(&written, t);
    let text = t.to_string();
    assert!(text.starts_with("topology: 3 ranks on 1 hosts\n"), "{text}");
}

#[test]
fn a_fixture_of_two_hosts_is_what_the_tuner_sees() {
    // Discover this machine once, then describe 4 ranks on two hosts of 2 with it.
    let dump = scratch("one.json");
    let config = Config::default().topo_dump_file(Some(dump.clone()));
    drop(shm(1, config).unwrap());
    let mut t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dump).unwrap()).unwrap();
    std::fs::remove_file(&dump).unwrap();
    let machine = t["machines"][0].clone();
    let place = t["ranks"][0].clone();
    let mut machines = Vec::new();
    let mut ranks = Vec::new();
    let mut hosts = Vec::new();
    for h in 0..2 {
        let mut m = machine.clone();
        m["id"] = format!("fixture-host{h}").into();
        m["name"] = format!("node{h}").into();
        machines.push(m);
        for _ in 0..2 {
            let mut p = place.clone();
            p["host"] = h.into();
            ranks.push(p);
            hosts.push(serde_json::Value::from(format!("fixture-host{h}")));
        }
    }
    t["machines"] = machines.into();
    t["ranks"] = ranks.into();
    t["hosts"] = hosts.into();
    let fixture = scratch("fixture.json");
    std::fs::write(&fixture, serde_json::to_string(&t).unwrap()).unwrap();

    let config = Config::default().topo_file(Some(fixture.clone()));
    let comms = shm(4, config.clone()).unwrap();
    for c in &comms {
        let topo = c.topology();
        assert_eq!(
            (topo.nhosts(), topo.machines[1].name.as_str()),
            (2, "node1")
        );
        // The tuner prices the hierarchical routes the fixture's hosts allow (the links are
        // all shared memory here, so which wins is the costs' business) and takes the cheapest.
        let plan = Plan::new(Collective::AllReduce, 1 << 20, DataType::F32);
        let priced = c.candidates(&plan);
        assert!(
            priced.iter().any(|(r, t)| t.is_some()
                && matches!(r, Route::Schedule(ch) if ch.algorithm == Algorithm::Hierarchical)),
            "rank {}: {priced:?}",
            c.rank()
        );
        util::takes_a_cheapest_route(c, &plan).unwrap();
    }
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mine: Vec<f32> = (0..100_003).map(|i| (i % 7 + c.rank()) as f32).collect();
                    let mut out = vec![0f32; mine.len()];
                    c.all_reduce(&mine, &mut out, ReduceOp::Sum).map(|()| out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (r, out) in results.into_iter().enumerate() {
        let out = out.unwrap();
        for (i, &x) in out.iter().enumerate() {
            assert_eq!(x, (4 * (i % 7) + 6) as f32, "rank {r} element {i}");
        }
    }
    drop(comms);

    let e = shm(3, config).expect_err("a fixture of 4 ranks on 3 must fail");
    assert!(e.to_string().contains("describes 4 ranks"), "{e}");
    std::fs::write(&fixture, "{\"version\": 1").unwrap();
    let config = Config::default().topo_file(Some(fixture.clone()));
    let e = shm(2, config).expect_err("a broken fixture must fail");
    assert!(e.to_string().contains("OXCCL_TOPO_FILE"), "{e}");
    std::fs::remove_file(&fixture).unwrap();
}
