//! Ranks as processes (oxccl's examples started with a store, as a launcher would, their
//! standard output read line by line) and as threads ([`on_each`]).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oxccl::Communicator;
use oxccl::bootstrap::{Secret, StoreServer};

/// Runs test `name` of this test binary again in a child process, alone, with `var` set (the
/// test then takes its child branch) and `env` added: for tests that must be the only ones in
/// their process (a global tracing subscriber, a count of the process's threads).
#[allow(dead_code)]
pub fn rerun_alone(
    name: &str,
    var: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(var, "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run the test in a child process")
}

/// Runs `f(comm)` on every rank's thread and returns (result, time taken) per rank.
pub fn on_each<T: Send>(
    comms: &[Communicator],
    f: impl Fn(&Communicator) -> T + Sync,
) -> Vec<(T, Duration)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || {
                    let t = Instant::now();
                    (f(c), t.elapsed())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// The example `name`, next to this test's binary: built when missing or older than any source
/// it is made from (`cargo test --test x` does not build examples, and a stale one would test
/// old code), in the profile of this test binary (`OXCCL_EXAMPLES_CURRENT` set: never rebuilt). Not rebuilt when current: a build of one
/// package resolves features apart from the workspace's and would compile everything again.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join("examples").join(name);
    let built = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    // Set where the examples were just built and cannot be rebuilt (the RDMA VM's read-only
    // view of the host).
    if built.is_some() && std::env::var_os("OXCCL_EXAMPLES_CURRENT").is_some() {
        return path;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources = ["src", "examples", "transports", "Cargo.toml", "Cargo.lock"];
    let newest = sources.iter().filter_map(|s| newest(&root.join(s))).max();
    if built.is_none() || newest.is_some_and(|n| Some(n) > built) {
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "-p", "oxccl", "--example", name]);
        if dir.file_name().is_some_and(|d| d == "release") {
            build.arg("--release");
        }
        let ok = build.status().expect("cargo").success();
        assert!(ok, "building example {name} failed");
    }
    path
}

/// The latest modification time of `path` or anything under it (skipping `target` folders).
fn newest(path: &std::path::Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    let own = meta.modified().ok();
    if !meta.is_dir() {
        return own;
    }
    let entries = std::fs::read_dir(path).ok()?;
    entries
        .flatten()
        .filter(|e| e.file_name() != "target")
        .filter_map(|e| newest(&e.path()))
        .chain(own)
        .max()
}

/// A rank process and its output lines.
pub struct Rank {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Rank {
    /// Waits for the process to end, then for every line it printed: the thread forwarding
    /// its output may still be behind when the process has ended, so the lines are read to
    /// the end of the output rather than taken as they stand.
    #[allow(dead_code)]
    pub fn finish(&mut self) -> (std::process::ExitStatus, Vec<String>) {
        let status = self.child.wait().expect("wait");
        (status, self.lines.iter().collect())
    }
}

/// Starts `n` processes of example `name` with `args`; `env(r)` adds variables for rank `r`.
pub fn launch(
    n: usize,
    name: &str,
    args: &[&str],
    env: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> (StoreServer, Vec<Rank>) {
    launch_after(n, name, args, env, |_| ())
}

/// As [`launch`], but calls `before(store address)` after the store is listening and before
/// any rank starts.
pub fn launch_after(
    n: usize,
    name: &str,
    args: &[&str],
    env: impl Fn(usize) -> Vec<(&'static str, String)>,
    before: impl FnOnce(std::net::SocketAddr),
) -> (StoreServer, Vec<Rank>) {
    let secret = Secret::random().expect("random");
    let server =
        StoreServer::bind("127.0.0.1:0".parse().expect("addr"), secret.clone()).expect("store");
    before(server.local_addr());
    let exe = example(name);
    let ranks = (0..n)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            cmd.args(args)
                .env("OXCCL_RANK", r.to_string())
                .env("OXCCL_WORLD_SIZE", n.to_string())
                .env("OXCCL_STORE", server.local_addr().to_string())
                .env("OXCCL_TOKEN", secret.to_hex())
                .env("OXCCL_TIMEOUT", "60")
                .env_remove("OXCCL_TRANSPORTS")
                .env_remove("OXCCL_HOST_ID")
                // Routes as the defaults price them, whatever this machine has cached.
                .env("OXCCL_TUNE", "defaults")
                .stdout(Stdio::piped());
            for (k, v) in env(r) {
                cmd.env(k, v);
            }
            let mut child = cmd.spawn().expect("spawn rank");
            let out = child.stdout.take().expect("stdout");
            let (tx, lines) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
            Rank { child, lines }
        })
        .collect();
    (server, ranks)
}

/// 2 ranks over `transport` only: rank 0 sends 4 MiB to rank 1, which posted a 16-byte
/// receive. Each rank must fail with `Mismatch` naming the other and the 4 MiB send, within
/// `bound` (the deadline is far beyond it); returns how long each took.
pub fn oversized_message_fails_both(transport: &str, bound: Duration) -> Vec<Duration> {
    use oxccl::config::TransportFilter;
    use oxccl::{Config, Error};
    let config = Config::default()
        .transports(TransportFilter::only(&[transport]))
        .timeout(bound * 6);
    let comms = Communicator::init_local(2, config).expect("init");
    let results = on_each(&comms, |c| {
        if c.rank() == 0 {
            c.send(&vec![1.0f32; 1 << 20], 1)
        } else {
            c.recv(&mut [0.0f32; 4], 0)
        }
    });
    results
        .into_iter()
        .enumerate()
        .map(|(r, (res, took))| {
            match &res {
                Err(e @ Error::Mismatch { rank, peer, .. }) => {
                    assert_eq!((*rank, *peer), (r, 1 - r), "{transport}: {e}");
                    assert!(e.to_string().contains("4194304 B"), "{transport}: {e}");
                }
                other => panic!("{transport}: rank {r}: expected a mismatch, got {other:?}"),
            }
            assert!(
                took < bound,
                "{transport}: rank {r} took {took:?} to notice"
            );
            took
        })
        .collect()
}
