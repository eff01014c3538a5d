//! oxrun end to end: output prefixed by rank, each rank's OXCCL_* variables and a working
//! store, a failing rank stopping the job, and no rank outliving oxrun however it ends.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use oxccl::bootstrap::Rendezvous;
use rustix::process::{Pid, Signal};

fn oxrun() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oxrun"))
}

fn run(args: &[&str]) -> Output {
    oxrun().args(args).output().unwrap()
}

fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A fresh file path for ranks to write their pids to.
fn pid_file() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let path = std::env::temp_dir().join(format!("oxrun-test-{}-{n}.pids", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// Waits until `path` holds `n` pids, then removes it.
fn read_pids(path: &PathBuf, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<i32> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.len() >= n {
            let _ = std::fs::remove_file(path);
            return pids;
        }
        assert!(
            Instant::now() < deadline,
            "ranks did not write {n} pids to {path:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is a live process (`kill -0` succeeds and it is not a zombie waiting for a
/// reaper that this container may not have).
fn alive(pid: i32) -> bool {
    let Some(p) = Pid::from_raw(pid) else {
        return false;
    };
    if rustix::process::test_kill_process(p).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            !matches!(state, Some('Z') | Some('X'))
        }
        Err(_) => false,
    }
}

fn assert_gone_within(pids: &[i32], limit: Duration) {
    let deadline = Instant::now() + limit;
    while pids.iter().any(|&p| alive(p)) {
        let left: Vec<_> = pids.iter().filter(|&&p| alive(p)).collect();
        assert!(
            Instant::now() < deadline,
            "ranks {left:?} still alive after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_with_limit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "oxrun did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn output_lines_are_prefixed_with_the_rank() {
    let out = run(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo out $OXCCL_RANK; echo err $OXCCL_RANK >&2; printf 'no newline'",
    ]);
    assert!(out.status.success(), "{out:?}");
    let stdout: BTreeSet<String> = lines(&out.stdout).into_iter().collect();
    let stderr: BTreeSet<String> = lines(&out.stderr).into_iter().collect();
    for r in 0..3 {
        assert!(stdout.contains(&format!("[{r}] out {r}")), "{stdout:?}");
        assert!(stdout.contains(&format!("[{r}] no newline")), "{stdout:?}");
        assert!(stderr.contains(&format!("[{r}] err {r}")), "{stderr:?}");
    }
    assert_eq!(stdout.len(), 6, "{stdout:?}");
}

#[test]
fn lines_of_busy_ranks_never_interleave() {
    let x = "x".repeat(200);
    let script = format!(
        "i=0; while [ $i -lt 300 ]; do echo \"$OXCCL_RANK {x} $OXCCL_RANK\"; i=$((i+1)); done"
    );
    let out = run(&["-n", "4", "sh", "-c", &script]);
    assert!(out.status.success(), "{out:?}");
    let lines = lines(&out.stdout);
    assert_eq!(lines.len(), 4 * 300);
    for line in lines {
        let r = &line[1..2];
        assert_eq!(line, format!("[{r}] {r} {x} {r}"));
    }
}

#[test]
fn each_rank_sees_its_variables() {
    // A secret file named in the user's environment does not clash with the job's own token.
    let out = oxrun()
        .args([
            "-n",
            "2",
            "sh",
            "-c",
            "echo $OXCCL_RANK $OXCCL_WORLD_SIZE $OXCCL_LOCAL_RANK $OXCCL_LOCAL_WORLD_SIZE $OXCCL_STORE $OXCCL_TOKEN ${OXCCL_TOKEN_FILE:-unset}",
        ])
        .env("OXCCL_TOKEN_FILE", "/nonexistent/oxccl-token")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut seen = Vec::new();
    for line in lines(&out.stdout) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 8, "{line}");
        assert_eq!(f[7], "unset", "{line}");
        assert_eq!(f[0], format!("[{}]", f[1]));
        assert_eq!((f[2], f[3], f[4]), ("2", f[1], "2"), "{line}");
        assert!(f[5].starts_with("127.0.0.1:"), "{line}");
        assert!(
            f[6].len() == 64 && f[6].bytes().all(|b| b.is_ascii_hexdigit()),
            "{line}"
        );
        seen.push((f[1].to_owned(), f[5].to_owned(), f[6].to_owned()));
    }
    seen.sort();
    assert_eq!(seen.len(), 2);
    assert_eq!((seen[0].0.as_str(), seen[1].0.as_str()), ("0", "1"));
    assert_eq!(
        (&seen[0].1, &seen[0].2),
        (&seen[1].1, &seen[1].2),
        "one store and token per job"
    );
}

/// Not a test of its own: the body of each rank in `ranks_meet_through_the_store`, run when
/// this test binary is started by oxrun.
#[test]
fn rank_body() {
    if std::env::var_os("OXRUN_TEST_RANK_BODY").is_none() {
        return;
    }
    let r = Rendezvous::from_env()
        .unwrap()
        .expect("oxrun sets the OXCCL_* variables");
    assert_eq!((r.source, r.host_store), ("oxccl", false));
    let deadline = Instant::now() + Duration::from_secs(10);
    let opened = r.open_store(deadline).unwrap();
    assert!(opened.server.is_none());
    let store = opened.store;
    store
        .set(
            &format!("hello/{}", r.rank),
            format!("rank {}", r.rank).as_bytes(),
        )
        .unwrap();
    let mut heard = Vec::new();
    for peer in 0..r.world_size {
        heard.push(
            String::from_utf8(store.get(&format!("hello/{peer}"), deadline).unwrap()).unwrap(),
        );
    }
    // A line of its own: libtest has printed "test rank_body ... " without a newline.
    println!(
        "\nMET rank {} of {} heard {}",
        r.rank,
        r.world_size,
        heard.join(",")
    );
}

#[test]
fn ranks_meet_through_the_store() {
    let me = std::env::current_exe().unwrap();
    let out = oxrun()
        .env("OXRUN_TEST_RANK_BODY", "1")
        .args(["-n", "3", "--timeout", "30", "--"])
        .arg(me)
        .args(["--exact", "rank_body", "--nocapture", "--test-threads=1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let met: BTreeSet<String> = lines(&out.stdout)
        .into_iter()
        .filter(|l| l.contains("MET"))
        .collect();
    let want: BTreeSet<String> = (0..3)
        .map(|r| format!("[{r}] MET rank {r} of 3 heard rank 0,rank 1,rank 2"))
        .collect();
    assert_eq!(met, want, "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_failing_rank_stops_the_job() {
    let pids = pid_file();
    let script = format!(
        "echo $$ >> {p}; \
         if [ \"$OXCCL_RANK\" = 1 ]; then \
           while [ $(wc -l < {p}) -lt 3 ]; do sleep 0.02; done; exit 3; \
         fi; exec sleep 30",
        p = pids.display()
    );
    let start = Instant::now();
    let out = run(&["-n", "3", "--", "sh", "-c", &script]);
    let took = start.elapsed();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rank 1 exited with code 3"), "{stderr}");
    assert!(took < Duration::from_secs(8), "took {took:?}");
    let pids = read_pids(&pids, 3);
    assert_gone_within(&pids, Duration::from_millis(200));
}

#[test]
fn a_rank_killed_by_a_signal_is_reported() {
    let out = run(&[
        "-n",
        "2",
        "sh",
        "-c",
        "if [ $OXCCL_RANK = 0 ]; then kill -9 $$; fi; exec sleep 30",
    ]);
    assert_eq!(out.status.code(), Some(128 + 9), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rank 0 was killed by signal 9 (SIGKILL)"),
        "{stderr}"
    );
}

#[test]
fn no_rank_outlives_a_killed_oxrun() {
    let pids = pid_file();
    let script = format!("echo $$ >> {}; exec sleep 30", pids.display());
    let mut child = oxrun()
        .args(["-n", "3", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ranks = read_pids(&pids, 3);
    assert!(ranks.iter().all(|&p| alive(p)));
    child.kill().unwrap(); // SIGKILL: oxrun gets no chance to clean up
    child.wait().unwrap();
    assert_gone_within(&ranks, Duration::from_secs(2));
}

/// SIGTERM, and SIGHUP (a closed terminal or ssh session) and SIGQUIT, to oxrun stop every
/// rank and what it started (here a `sleep` under the rank's shell); SIGHUP killed oxrun alone
/// and left the sleeps running before.
#[test]
fn sigterm_to_oxrun_stops_every_rank() {
    for (sig, code) in [(Signal::TERM, 15), (Signal::HUP, 1), (Signal::QUIT, 3)] {
        let pids = pid_file();
        let script = format!(
            "echo $$ >> {p}; sleep 30 & echo $! >> {p}; wait",
            p = pids.display()
        );
        let mut child = oxrun()
            .args(["-n", "2", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = read_pids(&pids, 4);
        let oxrun_pid = Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(oxrun_pid, sig).unwrap();
        let status = wait_with_limit(&mut child, Duration::from_secs(5));
        assert_eq!(status.code(), Some(128 + code), "{sig:?}");
        assert_gone_within(&started, Duration::from_millis(500));
    }
}

#[test]
fn the_timeout_stops_a_job_that_runs_too_long() {
    let start = Instant::now();
    let out = run(&["-n", "2", "--timeout", "0.3", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--timeout"));
}

#[test]
fn success_needs_every_rank_to_succeed_and_bad_usage_fails() {
    assert!(run(&["-n", "4", "true"]).status.success());
    assert_eq!(
        run(&["-n", "2", "sh", "-c", "exit $OXCCL_RANK"])
            .status
            .code(),
        Some(1)
    );
    let missing = run(&["-n", "2", "/nonexistent/program"]);
    assert_eq!(missing.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/program"));
    assert!(!run(&["true"]).status.success(), "-n is required");
    assert!(!run(&["-n", "0", "true"]).status.success());
    assert!(!run(&["-n", "2"]).status.success(), "a program is required");
    assert!(
        !run(&["-n", "2", "--timeout", "-1", "true"])
            .status
            .success()
    );
}

/// Not a test of its own: each rank of `a_failed_job_names_the_rank_it_waits_for`. Three
/// all-reduces together, then rank 2 stays away from the fourth.
#[test]
fn trace_body() {
    if std::env::var_os("OXRUN_TEST_TRACE_BODY").is_none() {
        return;
    }
    let comm = oxccl::Communicator::init(oxccl::Config::from_env().unwrap()).unwrap();
    let mut x = vec![1.0f32; 256];
    for _ in 0..3 {
        comm.all_reduce_in_place(&mut x, oxccl::ReduceOp::Sum)
            .unwrap();
    }
    if comm.rank() == 2 {
        std::thread::sleep(Duration::from_secs(30));
        return;
    }
    if let Err(e) = comm.all_reduce_in_place(&mut x, oxccl::ReduceOp::Sum) {
        println!("\nFAILED {e}");
        std::process::exit(2);
    }
}

#[test]
fn a_failed_job_names_the_rank_it_waits_for() {
    let me = std::env::current_exe().unwrap();
    let start = Instant::now();
    let out = oxrun()
        .env("OXRUN_TEST_TRACE_BODY", "1")
        .env("OXCCL_TIMEOUT", "1")
        // No probe at creation under a 1 s deadline (oxccl's tests check that a probe leaves
        // the numbering and the recorder to the caller's calls).
        .env("OXCCL_TUNE", "defaults")
        .env_remove("OXCCL_TRACE_DIR")
        .args(["-n", "3", "--timeout", "60", "--"])
        .arg(me)
        .args(["--exact", "trace_body", "--nocapture", "--test-threads=1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(start.elapsed() < Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = "oxrun: flight recorder: rank 2 never called all_reduce #3 \
                (rank 2's last call: all_reduce #2, done); ranks 0, 1 wait for it (dumps in ";
    let line = stderr
        .lines()
        .find(|l| l.starts_with("oxrun: flight recorder"))
        .unwrap_or_else(|| panic!("no flight recorder line in: {stderr}"));
    assert!(line.starts_with(want), "{line}");
    // The dumps stay for oxccl-trace, which says the same.
    let dir = line[want.len()..].split(';').next().unwrap();
    let read = Command::new(env!("CARGO_BIN_EXE_oxccl-trace"))
        .args(["--calls", "2", dir])
        .output()
        .unwrap();
    assert!(read.status.success(), "{read:?}");
    let text = String::from_utf8_lossy(&read.stdout);
    assert!(
        text.contains(
            "(3 ranks, 3 dumps): rank 2 never called all_reduce #3 (rank 2's last call: \
             all_reduce #2, done); ranks 0, 1 wait for it"
        ),
        "{text}"
    );
    assert!(text.contains("all_reduce #3"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_job_that_succeeds_leaves_no_dumps() {
    let out = run(&["-n", "2", "sh", "-c", "echo \"DIR $OXCCL_TRACE_DIR\""]);
    assert!(out.status.success(), "{out:?}");
    let dirs: BTreeSet<String> = lines(&out.stdout)
        .iter()
        .filter_map(|l| l.split_once("DIR ").map(|(_, d)| d.to_owned()))
        .collect();
    assert_eq!(dirs.len(), 1, "one trace directory per job: {dirs:?}");
    let d = dirs.into_iter().next().unwrap();
    assert!(!d.is_empty() && !std::path::Path::new(&d).exists(), "{d}");
}
