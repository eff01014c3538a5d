//! The tuner's costs: rank 0's table steers every rank, a calibration measures every way
//! through the group area and is cached, damaged caches fall back to the defaults, and every
//! way the tuner may pick gives the reference's results.

mod util;

use std::path::PathBuf;
use std::time::Duration;

use oxccl::algo::{Collective, Plan};
use oxccl::bootstrap::UniqueId;
use oxccl::config::TransportFilter;
use oxccl::tune::{Costs, Key, Route, Way};
use oxccl::types::DataType;
use oxccl::{Calibration, Communicator, Config, ReduceOp, Tune};
use util::procs::on_each;

fn shm(config: Config) -> Config {
    config
        .transports(TransportFilter::only(&["shm"]))
        .timeout(Duration::from_secs(60))
}

/// A fresh directory for cache files.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxccl-tuner-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Ranks created by `init_rank` on threads, rank r with `configs[r]`.
fn ranks(configs: Vec<Config>) -> Vec<Communicator> {
    let id = UniqueId::new().expect("unique id");
    let n = configs.len();
    let handles: Vec<_> = configs
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            let id = id.clone();
            std::thread::spawn(move || Communicator::init_rank(&id, n, r, shm(c)))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("thread").expect("init_rank"))
        .collect()
}

fn all_reduce(bytes: usize) -> Plan {
    Plan::new(Collective::AllReduce, bytes / 4, DataType::F32)
}

#[test]
fn rank_zeros_cached_costs_steer_every_rank() {
    // A table where direct is far cheapest from 64 KiB: rank 0 has it, rank 1 points at
    // nothing. Both take direct, and the sums are right.
    let dir = scratch("steer");
    let file = dir.join("costs.txt");
    let mut text = String::from("oxccl-costs 1\nsource hand-written\nranks 2\n");
    for ip in ["in-place", "out-of-place"] {
        text += &format!("all_reduce one-shot {ip} 8=1e-7 65536=1e-3\n");
        text += &format!("all_reduce two-shot {ip} 8=1e-6 65536=1e-4 67108864=1\n");
        text += &format!("all_reduce direct {ip} 8=1e-4 65536=1e-5 67108864=1e-3\n");
    }
    std::fs::write(&file, &text).unwrap();
    let comms = ranks(vec![
        Config::default().tune_file(Some(file)),
        Config::default().tune_file(Some(dir.join("absent.txt"))),
    ]);
    for c in &comms {
        assert_eq!(c.costs().source(), "hand-written", "rank {}", c.rank());
        assert_eq!(c.explain(&all_reduce(8)).route, Route::Area(Way::OneShot));
        for b in [64 << 10, 1 << 20] {
            for p in [all_reduce(b), all_reduce(b).in_place(true)] {
                assert_eq!(c.explain(&p).route, Route::Area(Way::Direct), "{p:?}");
            }
        }
        // Two-shot is cheapest at 32 KiB.
        assert_eq!(
            c.explain(&all_reduce(32 << 10)).route,
            Route::Area(Way::TwoShot)
        );
    }
    let n = 1 << 18;
    let results = on_each(&comms, |c| {
        let mine: Vec<f32> = (0..n).map(|i| (i % 97) as f32 + c.rank() as f32).collect();
        let mut out = vec![0f32; n];
        c.all_reduce(&mine, &mut out, ReduceOp::Sum).map(|()| out)
    });
    for (r, (res, _)) in results.into_iter().enumerate() {
        let out = res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert!(
            out.iter()
                .enumerate()
                .all(|(i, &x)| x == 2.0 * (i % 97) as f32 + 1.0),
            "rank {r}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_damaged_or_foreign_cache_falls_back_to_the_defaults() {
    let dir = scratch("damaged");
    let cases = [
        ("garbage", "not a cost table at all\n".to_string()),
        (
            "bad number",
            "oxccl-costs 1\nranks 2\nall_reduce direct in-place 8=NaN\n".into(),
        ),
        (
            "three ranks",
            "oxccl-costs 1\nranks 3\nall_reduce direct in-place 8=1e-9\n".into(),
        ),
        ("huge", "#".repeat(1 << 20)),
    ];
    for (what, text) in cases {
        let file = dir.join(format!("{}.txt", what.replace(' ', "-")));
        std::fs::write(&file, text).unwrap();
        let comms =
            Communicator::init_local(2, shm(Config::default().tune_file(Some(file)))).unwrap();
        for c in &comms {
            assert_eq!(&c.costs(), Costs::defaults(), "{what}, rank {}", c.rank());
        }
        let results = on_each(&comms, |c| {
            let mut v = vec![c.rank() as i32 + 1; 5000];
            c.all_reduce_in_place(&mut v, ReduceOp::Sum).map(|()| v)
        });
        for (res, _) in results {
            assert!(res.unwrap().iter().all(|&x| x == 3), "{what}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn calibration_measures_every_way_caches_it_and_every_rank_takes_rank_zeros_table() {
    let dir = scratch("calibrate");
    let file = dir.join("costs.txt");
    let config = Config::default().tune_file(Some(file.clone()));
    let comms = Communicator::init_local(2, shm(config.clone())).unwrap();
    assert_eq!(&comms[0].costs(), Costs::defaults(), "nothing cached yet");
    let calibration = Calibration::up_to(256 << 10);
    let results = on_each(&comms, |c| c.calibrate_with(&calibration));
    let tables: Vec<Costs> = results.into_iter().map(|(r, _)| r.unwrap()).collect();
    assert_eq!(tables[0], tables[1], "every rank takes rank 0's table");
    let costs = &tables[0];
    assert!(
        costs.source().starts_with("calibrated on"),
        "{}",
        costs.source()
    );
    assert_eq!(costs.ranks(), 2);
    // Threads of one process reach each other's memory: every way was measured.
    for c in [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
    ] {
        let ways: &[Way] = if c == Collective::AllReduce {
            &[Way::OneShot, Way::TwoShot, Way::Direct]
        } else {
            &[Way::Staged, Way::Direct]
        };
        for &way in ways {
            for in_place in [false, true] {
                let key = Key {
                    collective: c,
                    way,
                    in_place,
                };
                assert!(costs.has(key), "{key}");
                let t = costs.estimate(key, 64 << 10).unwrap();
                assert!(t > 0.0 && t < 1.0, "{key}: {t}");
            }
        }
    }
    // The decision follows the new table (the area's ways and the schedules over the links,
    // whose link models the calibration measured too): the cheapest of the candidates.
    for c in &comms {
        assert_eq!(&c.costs(), costs);
        for b in [4 << 10, 64 << 10, 256 << 10] {
            for p in [all_reduce(b), all_reduce(b).in_place(true)] {
                let priced = c.candidates(&p);
                let price = |p: &Plan, r: Route| {
                    c.candidates(p)
                        .iter()
                        .find(|x| x.0 == r)
                        .and_then(|x| x.1)
                        .unwrap()
                };
                let way = match c.explain(&p).route {
                    Route::Area(way) => way,
                    Route::Schedule(choice) => {
                        // A schedule over the links beats every way through the area in both
                        // placements together, and is the cheapest schedule.
                        let mine = price(&p, Route::Schedule(choice));
                        for (r, t) in &priced {
                            match r {
                                Route::Area(w) => {
                                    let both = t.unwrap() + price(&p.in_place(!p.in_place), *r);
                                    assert!(2.0 * mine < both, "{p:?}: {choice:?} over {w:?}");
                                }
                                Route::Schedule(_) => {
                                    assert!(mine <= t.unwrap() * (1.0 + oxccl::tune::TIE))
                                }
                                _ => unreachable!(),
                            }
                        }
                        continue;
                    }
                    other => panic!("{p:?}: {other:?}"),
                };
                let t = |w: Way| {
                    priced
                        .iter()
                        .find(|x| x.0 == Route::Area(w))
                        .and_then(|x| x.1)
                        .unwrap()
                };
                if way != Way::OneShot {
                    let others = priced.iter().filter_map(|x| match x.0 {
                        Route::Area(w) if w != Way::OneShot => Some(w),
                        _ => None,
                    });
                    for other in others {
                        assert!(t(way) <= t(other), "{p:?}: {way:?} over {other:?}");
                    }
                }
            }
        }
    }
    // Rank 0 cached it; a later communicator of this rank count starts from it, unless told
    // to use the defaults.
    let cached = Costs::parse(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(cached.to_text(), costs.to_text());
    let again = Communicator::init_local(2, shm(config.clone())).unwrap();
    assert_eq!(again[1].costs().to_text(), costs.to_text());
    let defaults = Communicator::init_local(2, shm(config.tune(Tune::Defaults))).unwrap();
    assert_eq!(&defaults[1].costs(), Costs::defaults());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tune_calibrate_calibrates_at_creation_when_nothing_is_cached() {
    let dir = scratch("at-creation");
    let file = dir.join("costs.txt");
    let config = Config::default()
        .tune_file(Some(file.clone()))
        .tune(Tune::Calibrate);
    let comms = Communicator::init_local(2, shm(config)).unwrap();
    let costs = comms[0].costs();
    assert!(
        costs.source().starts_with("calibrated on"),
        "{}",
        costs.source()
    );
    assert_eq!(comms[1].costs(), costs);
    assert_eq!(
        Costs::parse(&std::fs::read_to_string(&file).unwrap())
            .unwrap()
            .to_text(),
        costs.to_text()
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Every way the tuner may pick gives the reference's bits, at sizes the defaults never send
/// that way (one-shot up to a whole area buffer, direct and two-shot from 8 bytes), in both
/// placements.
#[test]
fn every_way_forced_at_any_size_matches_the_reference() {
    let sizes = [1, 7, 4096, 100_003, 1 << 20];
    let ways = [Way::OneShot, Way::TwoShot, Way::Direct];
    for way in ways {
        let comms = Communicator::init_local(
            3,
            shm(Config::default().area_way(Some(way)).tune(Tune::Defaults)),
        )
        .unwrap();
        for &n in &sizes {
            let p = all_reduce(n * 4);
            assert_eq!(comms[0].explain(&p).route, Route::Area(way));
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                let results = on_each(&comms, |c| {
                    let r = c.rank();
                    let mine: Vec<f32> = (0..n).map(|i| ((i * 7 + r * 13) % 23) as f32).collect();
                    let mut out = vec![0f32; n];
                    c.all_reduce(&mine, &mut out, op)?;
                    let mut inplace = mine.clone();
                    c.all_reduce_in_place(&mut inplace, op)?;
                    Ok::<_, oxccl::Error>((out, inplace))
                });
                for (r, (res, _)) in results.into_iter().enumerate() {
                    let (out, inplace) = res.unwrap_or_else(|e| panic!("{way:?} rank {r}: {e}"));
                    for i in 0..n {
                        let v = (0..3).map(|q| ((i * 7 + q * 13) % 23) as f32);
                        let want = match op {
                            ReduceOp::Sum => v.sum::<f32>(),
                            ReduceOp::Max => v.fold(f32::MIN, f32::max),
                            _ => v.sum::<f32>() / 3.0,
                        };
                        assert_eq!(out[i], want, "{way:?} {op:?} n={n} rank {r} [{i}]");
                        assert_eq!(
                            inplace[i], want,
                            "{way:?} {op:?} n={n} rank {r} [{i}] in place"
                        );
                    }
                }
            }
        }
    }
}

/// One rank has no link to time and no peer to wait for: its calibration still completes, is
/// stated for one rank, and leaves the communicator working.
#[test]
fn a_single_rank_calibrates() {
    let dir = scratch("single");
    let config = Config::default().tune_file(Some(dir.join("costs.txt")));
    let comms = Communicator::init_local(1, shm(config)).unwrap();
    let costs = comms[0]
        .calibrate_with(&Calibration::up_to(4 << 10))
        .unwrap();
    assert_eq!(costs.ranks(), 1);
    let mut v = vec![1.5f32, -2.0, 3.25];
    comms[0].all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v, [1.5, -2.0, 3.25]);
}

#[test]
fn tune_probe_probes_at_creation_and_every_rank_takes_rank_zeros_table() {
    // A named file is the user's: the probe is made but not written there.
    let dir = scratch("probe");
    let file = dir.join("costs.txt");
    let config = Config::default()
        .tune_file(Some(file.clone()))
        .tune(Tune::Probe);
    let comms = Communicator::init_local(2, shm(config.clone())).unwrap();
    let costs = comms[0].costs();
    assert!(
        costs.source().starts_with("probed on"),
        "{}",
        costs.source()
    );
    assert_eq!(comms[1].costs(), costs);
    assert_ne!(&costs, Costs::defaults());
    assert!(!file.exists());
    // Every area way of the all-reduce is priced, from 8 bytes to beyond the probed sizes.
    for way in [Way::OneShot, Way::TwoShot, Way::Direct] {
        for in_place in [false, true] {
            let key = Key {
                collective: Collective::AllReduce,
                way,
                in_place,
            };
            for bytes in [8, 3000, 1 << 20, 64 << 20] {
                let t = costs.estimate(key, bytes).expect("priced");
                assert!(t.is_finite() && t > 0.0, "{key} {bytes}: {t}");
            }
        }
    }
    // The caller's calls are numbered from 0 and the flight recorder holds only them: the
    // probe's thousands of calls are not the caller's.
    on_each(&comms, |c| {
        let mut v = [1.0f32; 4];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, [2.0; 4]);
    });
    for c in &comms {
        let t = c.trace();
        let names: Vec<String> = t.entries.iter().map(|e| e.name()).collect();
        assert_eq!((names, t.recorded), (vec!["all_reduce #0".to_string()], 1));
    }
    // Where OXCCL_ALGO forces the algorithm, no call takes the area: no probe.
    let forced = config.algorithm(Some(oxccl::algo::Algorithm::Ring));
    let forced = Communicator::init_local(2, shm(forced)).unwrap();
    assert_eq!(&forced[0].costs(), Costs::defaults());
    let _ = std::fs::remove_dir_all(dir);
}
