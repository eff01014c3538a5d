//! The flight recorder end to end: ranks that fail write their dumps by themselves, and
//! `trace::blame` names the rank the others wait for (one that never called, one that called
//! something else); SIGUSR1 and the API dump on demand.

mod util;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oxccl::algo::{Collective, Plan};
use oxccl::trace::{CallState, Trace, blame};
use oxccl::{Communicator, Config, DataType, ReduceOp};
use util::procs::on_each;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxccl-trace-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn comms(n: usize, dir: &Path, timeout: Duration) -> Vec<Communicator> {
    let config = Config::default()
        .timeout(timeout)
        .trace_dir(Some(dir.to_path_buf()))
        .trace_signal(false);
    Communicator::init_local(n, config).expect("init")
}

#[test]
fn the_dumps_name_a_rank_that_never_called() {
    let d = dir("never");
    let comms = comms(4, &d, Duration::from_millis(800));
    let results = on_each(&comms, |c| {
        let mut x = vec![1.0f32; 1000];
        for _ in 0..3 {
            c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        }
        if c.rank() == 3 {
            // Rank 3 skips all_reduce #3 and only dumps, after the others gave up.
            std::thread::sleep(Duration::from_millis(2500));
            c.dump_trace().map(|_| ())
        } else {
            c.all_reduce_in_place(&mut x, ReduceOp::Sum)
        }
    });
    for (r, (res, _)) in results.iter().enumerate().take(3) {
        assert!(
            res.is_err(),
            "rank {r} finished all_reduce #3 without rank 3"
        );
    }
    assert!(results[3].0.is_ok(), "{:?}", results[3].0);
    let traces = Trace::read_dir(&d).unwrap();
    assert_eq!(traces.len(), 4, "one dump per rank in {}", d.display());
    // Ranks 0-2 wrote theirs when they failed, with the failing call marked.
    for t in &traces[..3] {
        assert!(t.failure.is_some(), "rank {}: {t:?}", t.rank);
        let last = t.entries.last().unwrap();
        assert_eq!(
            (last.name().as_str(), last.state),
            ("all_reduce #3", CallState::Failed)
        );
        // The route recorded is the routing decision's.
        let plan = Plan::new(Collective::AllReduce, 1000, DataType::F32).in_place(true);
        let want = comms[t.rank]
            .explain(&plan)
            .route
            .name_for(Collective::AllReduce);
        assert_eq!(last.route.as_deref(), Some(want.as_str()));
        assert_eq!((last.count, last.op.as_deref()), (1000, Some("sum")));
    }
    let lines = blame(&traces);
    assert_eq!(lines.len(), 1);
    assert_eq!(
        lines[0].1,
        "rank 3 never called all_reduce #3 (rank 3's last call: all_reduce #2, done); \
         ranks 0–2 wait for it"
    );
    let without_3: Vec<Trace> = traces.into_iter().filter(|t| t.rank != 3).collect();
    assert_eq!(
        blame(&without_3)[0].1,
        "rank 3 never called all_reduce #3 (rank 3 left no dump); ranks 0–2 wait for it"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_dumps_name_a_rank_that_called_something_else() {
    let d = dir("mismatch");
    let comms = comms(3, &d, Duration::from_secs(20));
    let results = on_each(&comms, |c| {
        let mut x = vec![2i64; 8];
        c.all_reduce_in_place(&mut x, ReduceOp::Max)?;
        if c.rank() == 1 {
            c.broadcast_in_place(&mut x, 0)
        } else {
            c.all_reduce_in_place(&mut x, ReduceOp::Max)
        }
    });
    assert!(results.iter().all(|(r, _)| r.is_err()));
    let traces = Trace::read_dir(&d).unwrap();
    assert_eq!(traces.len(), 3);
    assert_eq!(
        blame(&traces)[0].1,
        "rank 1 called broadcast #1 where the others called all_reduce"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn sigusr1_dumps_every_communicator() {
    let d = dir("signal");
    let config = Config::default()
        .trace_dir(Some(d.clone()))
        .trace_signal(true);
    let comms = Communicator::init_local(2, config).unwrap();
    on_each(&comms, |c| {
        let mut x = vec![c.rank() as f32; 16];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
    });
    let asked = Instant::now();
    rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::USR1)
        .unwrap();
    let traces = loop {
        let t = Trace::read_dir(&d).unwrap_or_default();
        if t.len() == 2 || asked.elapsed() > Duration::from_secs(10) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(traces.len(), 2, "SIGUSR1 wrote {traces:?}");
    for t in &traces {
        assert_eq!(t.reason, "SIGUSR1");
        assert_eq!(t.entries.len(), 1);
        assert_eq!(t.entries[0].state, CallState::Done);
    }
    assert_eq!(
        blame(&traces)[0].1,
        "every call recorded by ranks 0, 1 finished"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_recorder_of_no_entries_keeps_nothing() {
    let d = dir("off");
    let config = Config::default()
        .trace_dir(Some(d.clone()))
        .trace_entries(0);
    let comms = Communicator::init_local(2, config).unwrap();
    on_each(&comms, |c| {
        let mut x = vec![1u8; 4];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
    });
    assert!(comms[0].trace().entries.is_empty());
    assert!(!d.exists());
}
