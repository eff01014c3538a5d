//! A host with nothing cached is probed at the first communicator's creation, and the probe is
//! cached for the next ones of that rank count, which probe again until it is the fastest of
//! `PROBE_ROUNDS` probes: through the benchmark's own ranks (processes), as a user's first runs
//! would meet it.

mod util;

use std::path::Path;
use std::process::Output;

use util::{perf, scratch, stderr, stdout};

/// One 2-rank run with `XDG_CACHE_HOME` at `cache` and `OXCCL_TUNE` as given.
fn run_in(cache: &Path, tune: Option<&str>) -> Output {
    let mut c = perf();
    c.env("XDG_CACHE_HOME", cache)
        .env("OXCCL_LOG", "oxccl::comm::tuning=debug")
        .env("NO_COLOR", "1")
        .env_remove("OXCCL_TUNE_FILE")
        .env_remove("OXCCL_TUNE")
        .env_remove("OXCCL_AREA_WAY")
        .env_remove("OXCCL_ALGO");
    if let Some(t) = tune {
        c.env("OXCCL_TUNE", t);
    }
    c.args([
        "--ranks", "2", "-b", "8", "-e", "64K", "-f", "64", "-n", "3", "-w", "1",
    ]);
    let o = c.output().expect("allreduce-perf starts");
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    o
}

/// How many ranks said they probed.
fn probes(o: &Output) -> usize {
    stderr(o).matches("probed the group area's ways").count()
}

#[test]
fn a_fresh_host_is_probed_by_its_first_processes_and_the_joined_probe_is_cached() {
    let cache = scratch("xdg");
    std::fs::create_dir_all(&cache).unwrap();
    let first = run_in(&cache, None);
    assert_eq!(probes(&first), 2, "{}", stderr(&first));
    let files: Vec<_> = std::fs::read_dir(cache.join("oxccl"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_owned();
    assert!(
        name.starts_with("costs-") && name.ends_with(&format!("-2r-{}-probe.txt", oxccl::VERSION)),
        "{name}"
    );
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let costs = oxccl::tune::Costs::parse(&text).expect("the probe's table parses");
    assert!(
        costs.source().starts_with("probed on"),
        "{}",
        costs.source()
    );
    assert_eq!(costs.ranks(), 2);
    // Every way of the all-reduce is priced at the probed sizes and at the defaults' others.
    let key = |way| oxccl::tune::Key {
        collective: oxccl::algo::Collective::AllReduce,
        way,
        in_place: true,
    };
    for way in [oxccl::tune::Way::OneShot, oxccl::tune::Way::TwoShot] {
        for bytes in [8, 4096, 1 << 20] {
            let t = costs.estimate(key(way), bytes).expect("priced");
            assert!(t > 0.0 && t < 1.0, "{way:?} {bytes}: {t}");
        }
    }

    assert_eq!(costs.probes(), 1);

    // The next communicators of 2 ranks probe again until the file is made of PROBE_ROUNDS
    // probes, rank 0 keeping each point's fastest; then they take it as it is.
    let mut last = costs;
    for round in 2..=oxccl::PROBE_ROUNDS {
        let o = run_in(&cache, None);
        assert_eq!(probes(&o), 2, "round {round}: {}", stderr(&o));
        let now = oxccl::tune::Costs::parse(&std::fs::read_to_string(&files[0]).unwrap())
            .expect("the joined table parses");
        assert_eq!(now.probes(), round);
        assert!(
            now.source()
                .ends_with(&format!("each point the fastest of {round} probes")),
            "{}",
            now.source()
        );
        // No point got slower than it was.
        for way in [oxccl::tune::Way::OneShot, oxccl::tune::Way::TwoShot] {
            for bytes in [8, 4096, 1 << 20] {
                let (was, is) = (
                    last.estimate(key(way), bytes),
                    now.estimate(key(way), bytes),
                );
                assert!(
                    is.unwrap() <= was.unwrap(),
                    "{way:?} {bytes}: {is:?} > {was:?}"
                );
            }
        }
        last = now;
    }
    assert_eq!(probes(&run_in(&cache, None)), 0);
    // `probe` probes again and starts the count over; `defaults` never probes.
    assert_eq!(probes(&run_in(&cache, Some("probe"))), 2);
    let again = oxccl::tune::Costs::parse(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert_eq!(again.probes(), 1);
    assert_eq!(probes(&run_in(&cache, Some("defaults"))), 0);
    let _ = std::fs::remove_dir_all(&cache);
}
