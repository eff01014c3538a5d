//! How the ranks come to be and go: one rank of a launched job (OXCCL_* variables as oxrun
//! sets them), ranks that die with the standalone parent, a killed rank failing the job fast,
//! and the exit statuses of usage errors and the unbuilt CUDA path.

mod util;

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use oxccl::bootstrap::{Secret, StoreServer};
use util::{perf, rows, run, stderr, stdout};

/// Starts rank `rank` of `n` of a job whose store the test hosts, as oxrun would.
fn launched(rank: usize, n: usize, store: SocketAddr, secret: &Secret, args: &[&str]) -> Child {
    perf()
        .args(args)
        .env("OXCCL_RANK", rank.to_string())
        .env("OXCCL_WORLD_SIZE", n.to_string())
        .env("OXCCL_LOCAL_RANK", rank.to_string())
        .env("OXCCL_LOCAL_WORLD_SIZE", n.to_string())
        .env("OXCCL_STORE", store.to_string())
        .env("OXCCL_TOKEN", secret.to_hex())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn store() -> (StoreServer, Secret) {
    let secret = Secret::random().unwrap();
    let server =
        StoreServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), secret.clone()).unwrap();
    (server, secret)
}

#[test]
fn under_a_launcher_each_process_is_one_rank_and_only_rank_0_prints() {
    let (server, secret) = store();
    let args = [
        "-b", "8", "-e", "512", "-n", "2", "-w", "1", "--ranks", "7", "--algo", "ring",
    ];
    let children: Vec<Child> = (0..3)
        .map(|r| launched(r, 3, server.local_addr(), &secret, &args))
        .collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (r, o) in outputs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", stderr(o));
    }
    let table = stdout(&outputs[0]);
    assert_eq!(rows(&table).len(), 4, "{table}");
    assert_eq!(table.matches("#  Rank ").count(), 3, "{table}");
    assert!(table.contains("; algorithm ring"), "{table}");
    assert!(stdout(&outputs[1]).is_empty() && stdout(&outputs[2]).is_empty());
    assert!(
        stderr(&outputs[0]).contains("--ranks 7 ignored"),
        "{}",
        stderr(&outputs[0])
    );
}

#[test]
fn a_killed_rank_fails_the_job_promptly() {
    let (server, secret) = store();
    let args = ["-b", "16M", "-e", "16M", "-n", "100000", "-w", "1"];
    let mut r0 = launched(0, 2, server.local_addr(), &secret, &args);
    let mut r1 = launched(1, 2, server.local_addr(), &secret, &args);
    // Wait until rank 0 has printed the column headers: the sweep is running.
    let mut lines = BufReader::new(r0.stdout.take().unwrap()).lines();
    let started = lines
        .by_ref()
        .any(|l| l.is_ok_and(|l| l.contains("(elements)")));
    assert!(started, "rank 0 never started the sweep");
    r1.kill().unwrap();
    r1.wait().unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = r0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "rank 0 hangs after rank 1 died"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(3));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut r0.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("allreduce-perf: rank 0:") && err.contains("rank 1"),
        "{err}"
    );
}

/// Whether `pid` is alive and not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next()),
            Some('Z') | Some('X')
        ),
        Err(_) => false,
    }
}

#[test]
fn ranks_die_with_the_standalone_parent() {
    let mut parent = perf()
        .args(["-b", "16M", "-e", "16M", "-n", "100000", "-w", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut pids = Vec::new();
    for line in BufReader::new(parent.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("#  Rank ") {
            let pid = rest
                .split("Pid")
                .nth(1)
                .and_then(|s| s.split_whitespace().next());
            pids.push(pid.unwrap().parse::<i32>().unwrap());
        }
        if line.contains("(elements)") {
            break;
        }
    }
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|p| alive(*p)));
    parent.kill().unwrap();
    parent.wait().unwrap();
    // The kernel delivers PR_SET_PDEATHSIG: no rank may keep running.
    let t = Instant::now();
    while pids.iter().any(|p| alive(*p)) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "ranks {pids:?} outlived their parent"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_dead_rank_stops_the_standalone_job_with_a_message() {
    let mut parent = perf()
        .args(["-b", "16M", "-e", "16M", "-n", "100000", "-w", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pid1 = None;
    for line in BufReader::new(parent.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.starts_with("#  Rank  1 ") {
            let pid = line
                .split("Pid")
                .nth(1)
                .and_then(|s| s.split_whitespace().next());
            pid1 = pid.and_then(|p| p.parse::<i32>().ok());
        }
        if line.contains("(elements)") {
            break;
        }
    }
    let pid1 = rustix::process::Pid::from_raw(pid1.unwrap()).unwrap();
    rustix::process::kill_process(pid1, rustix::process::Signal::KILL).unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = parent.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the job hangs after rank 1 died"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(128 + 9));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut parent.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("rank 1 was killed by signal 9; stopping the job"),
        "{err}"
    );
    // Rank 0's flight recorder names rank 1.
    let line = err
        .lines()
        .find(|l| l.starts_with("allreduce-perf: flight recorder: "))
        .unwrap_or_else(|| panic!("no flight recorder line in: {err}"));
    assert!(
        line.contains(": rank 1 failed in or before all_reduce #")
            && line.contains("and left no dump (killed or crashed?); rank 0 failed because of it"),
        "{line}"
    );
}

#[test]
fn usage_errors_and_unavailable_features_exit_2() {
    for (args, says) in [
        (&["-b", "1X"][..], "is not a size"),
        (&["-d", "float8"], "unknown data type"),
        (&["-o", "mulsum"], "neither a reduction operator"),
        (&["--op", "allgather", "--op", "reduce"], "two collectives"),
        (&["-b", "2M", "-e", "1M"], "larger than -e"),
        (&["-a", "7"], "-a"),
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let o = run(&["--device", "cuda"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--device cuda: unavailable: no CUDA"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty());
}

#[test]
fn rank_errors_exit_3_on_every_rank() {
    let o = run(&["--op", "broadcast", "-r", "5", "-b", "8", "-e", "8"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("-r 5: not a rank of this job of 2 ranks"),
        "{}",
        stderr(&o)
    );
}

/// A setting whose value is not UTF-8 is an error naming it, not taken for unset (which gave
/// the default quietly: a garbled OXCCL_TIMEOUT became 300 s).
#[test]
fn a_setting_that_is_not_utf8_is_an_error_naming_it() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    for var in ["OXCCL_TIMEOUT", "OXCCL_TRANSPORTS", "OXCCL_SOCKET_IFNAME"] {
        let o = perf()
            .args(["--ranks", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0"])
            .env(var, OsStr::from_bytes(b"\xff\xfe"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(3), "{var}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("{var}: its value is not valid UTF-8")),
            "{var}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn help_documents_both_meanings_of_op() {
    let o = run(&["--help"]);
    assert!(o.status.success());
    let help = stdout(&o);
    for flag in [
        "--minbytes",
        "--maxbytes",
        "--stepfactor",
        "--stepbytes",
        "--iters",
        "--warmup_iters",
        "--check",
        "--op",
        "--datatype",
        "--root",
        "--blocking",
        "--average",
        "--timeout",
        "--output_file",
        "--ranks",
        "--algo",
        "--transport",
        "--repeats",
        "--min-time",
        "--csv",
        "--plot",
        "--overlay",
        "--plot-only",
        "--device",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    assert!(help.contains("a collective name"), "{help}");
    assert!(!help.contains("corrupt"), "the test switch is hidden");
}

/// `--ranks` gives its ranks the job's own token: a secret file the user's environment names
/// (`OXCCL_TOKEN_FILE`, which oxccl refuses beside `OXCCL_TOKEN`) is not passed on; every rank
/// failed to start before.
#[test]
fn a_token_file_in_the_environment_does_not_stop_local_ranks() {
    let out = util::perf()
        .args(["--ranks", "2", "-b", "8", "-e", "8", "-n", "2", "-w", "1"])
        .env("OXCCL_TOKEN_FILE", "/nonexistent/oxccl-token")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(rows(&stdout(&out)).len(), 1, "{}", stdout(&out));
}
