//! Liveness: a rank whose process stops answering (SIGSTOP: the process and its heartbeat
//! thread freeze, while its kernel still acknowledges TCP) fails the others within
//! `OXCCL_HEARTBEAT` — during a collective over TCP and over shared memory, and at the next
//! call of ranks that were idle — with `PeerFailed` naming it; ranks busy elsewhere for several
//! periods are not declared failed.

mod util;

use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use util::procs;

/// One test at a time: each starts 2-3 busy ranks on a 2-core machine, and the bounds below
/// are about the heartbeat, not about how the scheduler shares the cores between tests.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts `n` fault workers with the heartbeat `hb` and extra variables `env`.
fn launch(
    n: usize,
    args: &[&str],
    hb: &str,
    env: &[(&'static str, &str)],
) -> (oxccl::bootstrap::StoreServer, Vec<procs::Rank>) {
    let hb = hb.to_string();
    let env: Vec<(&'static str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
    procs::launch(n, "fault_worker", args, move |_| {
        let mut e = env.clone();
        e.push(("OXCCL_HEARTBEAT", hb.clone()));
        e
    })
}

/// Waits until every rank printed `ready` and then `iter K` `iters` times.
fn until_iterating(ranks: &[procs::Rank], iters: usize) {
    for (r, rank) in ranks.iter().enumerate() {
        let mut seen = 0;
        while seen < iters {
            let line = rank
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("rank {r} did not start"));
            assert!(!line.starts_with("error"), "rank {r}: {line}");
            seen += usize::from(line.starts_with("iter"));
        }
    }
}

/// The first error line of `rank` and when it came, within `limit`.
fn error_of(rank: &procs::Rank, r: usize, limit: Duration) -> (String, Instant) {
    let until = Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let line = rank
            .lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("rank {r} reported no error within {limit:?}"));
        if line.starts_with("error") {
            return (line, Instant::now());
        }
    }
}

fn pid(rank: &procs::Rank) -> Pid {
    Pid::from_raw(rank.child.id() as i32).expect("pid")
}

/// SIGSTOPs rank 1 of 3 mid-run and checks that ranks 0 and 2 fail naming it within `bound`.
fn stopped_rank_is_named(args: &[&str], env: &[(&'static str, &str)], bound: Duration) {
    let (_store, mut ranks) = launch(3, args, "1", env);
    until_iterating(&ranks, 2);
    let stopped = Instant::now();
    kill_process(pid(&ranks[1]), Signal::STOP).expect("SIGSTOP rank 1");
    for r in [0, 2] {
        let (line, at) = error_of(&ranks[r], r, Duration::from_secs(20));
        let took = at - stopped;
        assert!(
            line.contains("PeerFailed") && line.contains("peer: 1") && line.contains("heartbeat"),
            "rank {r}: {line}"
        );
        assert!(took < bound, "rank {r} noticed after {took:?}: {line}");
        eprintln!("rank {r} noticed rank 1's stop after {took:?}");
        assert_eq!(ranks[r].child.wait().expect("wait").code(), Some(2));
    }
    let _ = ranks[1].child.kill();
    let _ = ranks[1].child.wait();
}

// The bound is OXCCL_HEARTBEAT (1 s) plus the time to see and report the failure; the ranks
// share 2 cores with the rest of the test suite here.

#[test]
fn a_stopped_rank_fails_a_large_all_reduce_over_tcp() {
    let _alone = alone();
    stopped_rank_is_named(
        &["2097152", "1000000"],
        &[("OXCCL_TRANSPORTS", "tcp")],
        Duration::from_millis(1800),
    );
}

#[test]
fn a_stopped_rank_fails_small_all_reduces_over_shared_memory() {
    let _alone = alone();
    stopped_rank_is_named(&["256", "100000000"], &[], Duration::from_millis(1800));
}

#[test]
fn idle_ranks_learn_of_a_stopped_rank_at_their_next_call() {
    let _alone = alone();
    let (_store, mut ranks) = launch(3, &["1024", "3"], "1", &[("FAULT_WORKER_PAUSE_MS", "3000")]);
    until_iterating(&ranks, 1);
    // Every rank now sleeps 3 s before its next call; rank 1 never wakes.
    kill_process(pid(&ranks[1]), Signal::STOP).expect("SIGSTOP rank 1");
    for r in [0, 2] {
        let (line, _) = error_of(&ranks[r], r, Duration::from_secs(20));
        assert!(
            line.contains("PeerFailed") && line.contains("peer: 1") && line.contains("heartbeat"),
            "rank {r}: {line}"
        );
        // "error after MS ms": since the last success — the 3 s pause, then a prompt failure.
        let ms: u64 = line
            .split_whitespace()
            .nth(2)
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("rank {r}: {line}"));
        assert!(
            (3000..3800).contains(&ms),
            "rank {r} failed {ms} ms after: {line}"
        );
        assert_eq!(ranks[r].child.wait().expect("wait").code(), Some(2));
    }
    let _ = ranks[1].child.kill();
    let _ = ranks[1].child.wait();
}

#[test]
fn ranks_busy_elsewhere_for_several_periods_are_not_declared_failed() {
    let _alone = alone();
    let (_store, mut ranks) = launch(
        3,
        &["1024", "3"],
        "0.5",
        &[("FAULT_WORKER_PAUSE_MS", "2000")],
    );
    for (r, rank) in ranks.iter_mut().enumerate() {
        let (status, lines) = rank.finish();
        assert!(status.success(), "rank {r}: {status:?} {lines:?}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("iter")).count(), 3);
    }
}

/// Why simulated hosts (tools/sim-hosts/hosts.sh) cannot run here, if they cannot.
fn no_sim_hosts() -> Option<String> {
    use std::process::Command;
    let id = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&id.stdout).trim() != "0" {
        return Some("simulated hosts need root (network namespaces)".into());
    }
    for tool in ["ip", "tc", "unshare", "nsenter", "setsid"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!(
                "simulated hosts need {tool} (iproute2, util-linux)"
            ));
        }
    }
    None
}

/// Each simulated host's rank, with torchrun's variables; host 1 takes its own link down once
/// its rank has done 3 all-reduces (its host vanishes from the network: no reset, no FIN).
const VANISH: &str = r#"
export RANK=$SIM_RANK WORLD_SIZE=$SIM_WORLD_SIZE LOCAL_RANK=$SIM_LOCAL_RANK
export LOCAL_WORLD_SIZE=$SIM_RANKS_PER_HOST MASTER_ADDR=$SIM_MASTER_ADDR MASTER_PORT=29500
if [ "$SIM_HOST_INDEX" != 1 ]; then exec "$0" "$@"; fi
out=$(mktemp)
"$0" "$@" > "$out" &
worker=$!
while [ "$(grep -c '^iter' "$out")" -lt 3 ]; do sleep 0.01; done
ip link set "$SIM_IFNAME" down
echo "LINK DOWN"
sleep 3
kill -9 $worker
"#;

#[test]
fn a_host_that_drops_off_the_network_is_named() {
    let _alone = alone();
    if let Some(why) = no_sim_hosts() {
        if std::env::var_os("OXCCL_REQUIRE_SIMHOSTS").is_some() {
            panic!("OXCCL_REQUIRE_SIMHOSTS is set but {why}");
        }
        println!("skipped: {why}");
        return;
    }
    let hosts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/sim-hosts/hosts.sh");
    let worker = procs::example("fault_worker");
    let out = std::process::Command::new("bash")
        .arg(hosts)
        .args(["-n", "2", "-r", "1", "-t", "60", "--", "sh", "-c", VANISH])
        .arg(worker)
        .args(["1048576", "1000000"])
        .env("OXCCL_HEARTBEAT", "1")
        .env("OXCCL_TIMEOUT", "60")
        .env("OXCCL_TUNE", "defaults")
        .output()
        .expect("run hosts.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[h1r0] LINK DOWN"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("[h0r0] error"))
        .unwrap_or_else(|| panic!("rank 0 reported no error: {text}"));
    assert!(
        line.contains("PeerFailed") && line.contains("peer: 1") && line.contains("heartbeat"),
        "{line}"
    );
    // Declared after a silence shorter than the heartbeat period (1 s), where without
    // heartbeats the stalled connection would have held the call to the 60 s deadline.
    let quiet = line
        .split("no heartbeat from it for ")
        .nth(1)
        .and_then(|t| t.split("ms").next())
        .and_then(|ms| ms.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        quiet < 1000.0,
        "declared after {quiet} ms of silence: {line}"
    );
    eprintln!("rank 0 named the vanished host's rank after {quiet} ms without a heartbeat");
}

/// A dropped communicator leaves no heartbeat thread behind: its watch is woken and joined
/// (it lingered up to a tenth of the period, so that a loop making and dropping
/// communicators piled threads and sockets up). Run in a child process, alone, so that no
/// other test's communicators are counted.
#[test]
fn a_dropped_communicator_leaves_no_heartbeat_thread() {
    const CHILD: &str = "OXCCL_TEST_HEARTBEAT_CHILD";
    let heartbeats = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter(|t| {
                let comm = t.as_ref().unwrap().path().join("comm");
                std::fs::read_to_string(comm).is_ok_and(|c| c.starts_with("oxccl-heartbea"))
            })
            .count()
    };
    if std::env::var_os(CHILD).is_some() {
        use oxccl::{Communicator, Config, ReduceOp, bootstrap::UniqueId};
        for round in 0..3 {
            let id = UniqueId::new().unwrap();
            let comms: Vec<Communicator> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2)
                    .map(|rank| {
                        let id = id.clone();
                        s.spawn(move || {
                            let config = Config::default().timeout(Duration::from_secs(30));
                            Communicator::init_rank(&id, 2, rank, config).unwrap()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            // A thread names itself once it runs: wait until both have.
            let named = Instant::now() + Duration::from_secs(5);
            while heartbeats() < 2 && Instant::now() < named {
                std::thread::sleep(Duration::from_millis(5));
            }
            let during = heartbeats();
            std::thread::scope(|s| {
                for c in &comms {
                    s.spawn(move || {
                        let mut v = [1.0f32; 4];
                        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    });
                }
            });
            drop(comms);
            println!("ROUND {round} during {during} after {}", heartbeats());
        }
        return;
    }
    let out = procs::rerun_alone(
        "a_dropped_communicator_leaves_no_heartbeat_thread",
        CHILD,
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (The harness's "test ... " may share the first line.)
    let rounds: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_once("ROUND").map(|r| r.1))
        .collect();
    assert_eq!(rounds.len(), 3, "{stdout}");
    for l in rounds {
        // Each rank watches its neighbour while the communicators live; none once dropped.
        assert!(l.ends_with("during 2 after 0"), "{l}");
    }
}

/// A rank that leaves (drops its communicator) ahead of a peer in the group area waits for
/// that peer to reach its last call, unless the peer dies, fails, or stops answering: a peer
/// SIGSTOPped then is let go once the heartbeat declares it silent, in about a second (the
/// drop waited out the whole OXCCL_TIMEOUT, 60 s here, before).
#[test]
fn a_drop_lets_go_of_a_stopped_peer_once_the_heartbeat_says_so() {
    let _alone = alone();
    let (_store, mut ranks) = launch(
        2,
        &["16", "4"],
        "1",
        &[
            ("FAULT_WORKER_BROADCASTS", "4"),
            ("FAULT_WORKER_PAUSE_MS", "8000"),
            ("OXCCL_TIMEOUT", "60"),
        ],
    );
    // Rank 0 (the root) sends its 4 broadcasts while rank 1 sleeps before reading them.
    let line = ranks[0]
        .lines
        .recv_timeout(Duration::from_secs(30))
        .expect("rank 0 reported nothing");
    assert_eq!(line, "ready");
    let line = ranks[0]
        .lines
        .recv_timeout(Duration::from_secs(30))
        .expect("rank 0 did not finish sending");
    assert_eq!(line, "sent 4");
    kill_process(pid(&ranks[1]), Signal::STOP).expect("SIGSTOP rank 1");
    let stopped = Instant::now();
    let status = loop {
        if let Some(s) = ranks[0].child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(90),
            "rank 0 still dropping its communicator"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = stopped.elapsed();
    eprintln!("rank 0 left {took:?} after rank 1 stopped");
    assert!(status.success(), "{status:?}");
    // About the heartbeat's period (1 s); far below the timeout, with room for a loaded
    // machine, whose stalls the heartbeat does not count as silence.
    assert!(took < Duration::from_secs(30), "rank 0 left after {took:?}");
    let _ = ranks[1].child.kill();
    let _ = ranks[1].child.wait();
}
