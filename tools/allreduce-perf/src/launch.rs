//! Standalone mode: with no launcher in the environment, this process hosts the job's store and
//! starts `--ranks` copies of its own executable with the same arguments and oxrun's `OXCCL_*`
//! variables, then waits for them. It runs no collective itself and prints nothing unless a
//! rank cannot be started. No rank outlives it: each dies with it (PR_SET_PDEATHSIG), and when
//! one rank fails the others are killed.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use oxccl::bootstrap::{Secret, StoreServer};
use oxccl::launch::TraceDir;
use rustix::process::Pid;

use crate::args::{AlgoChoice, Settings};

/// Ranks started when `--ranks` is not given.
pub const DEFAULT_RANKS: usize = 2;

/// Set in the ranks' environment so they can report that they were started standalone.
pub const STANDALONE_VAR: &str = "ALLREDUCE_PERF_STANDALONE";

/// How often the parent looks for exited ranks.
const POLL: Duration = Duration::from_millis(10);
/// How long the other ranks get to report a failure before they are killed.
const GRACE: Duration = Duration::from_secs(2);

/// Starts the ranks and waits for them; returns the exit status for this process: 0 when every
/// rank succeeded, else the first failed rank's (128 + signal when killed by one).
pub fn standalone(s: &Settings) -> Result<u8, String> {
    let n = s.ranks.unwrap_or(DEFAULT_RANKS);
    let secret = Secret::random().map_err(|e| format!("cannot make a job secret: {e}"))?;
    let server = StoreServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), secret.clone())
        .map_err(|e| format!("cannot start the job's store: {e}"))?;
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this program's executable: {e}"))?;
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();

    let cpus = oxccl::launch::cpu_plan(n, s.bind_to);
    let trace = TraceDir::for_job().map_err(|e| format!("cannot make a trace directory: {e}"))?;
    let mut ranks: Vec<Child> = Vec::with_capacity(n);
    for rank in 0..n {
        let cpu = cpus.as_ref().map(|c| c[rank]);
        let store = (server.local_addr(), &secret);
        match start(&exe, &argv, (rank, n), cpu, store, &trace, s) {
            Ok(child) => ranks.push(child),
            Err(e) => {
                kill_all(&mut ranks);
                return Err(e);
            }
        }
    }
    let code = wait(&mut ranks, &trace);
    drop(server);
    if code == 0 {
        trace.remove();
    }
    Ok(code)
}

/// Starts rank `rank` of `n`.
fn start(
    exe: &Path,
    argv: &[OsString],
    (rank, n): (usize, usize),
    cpu: Option<usize>,
    (store, secret): (SocketAddr, &Secret),
    trace: &TraceDir,
    s: &Settings,
) -> Result<Child, String> {
    let mut cmd = Command::new(exe);
    cmd.args(argv)
        .env("OXCCL_RANK", rank.to_string())
        .env("OXCCL_WORLD_SIZE", n.to_string())
        .env("OXCCL_LOCAL_RANK", rank.to_string())
        .env("OXCCL_LOCAL_WORLD_SIZE", n.to_string())
        .env("OXCCL_STORE", store.to_string())
        .env("OXCCL_TOKEN", secret.to_hex())
        // The job's own secret: one the user's environment names by file would be a second.
        .env_remove("OXCCL_TOKEN_FILE")
        .env(STANDALONE_VAR, "1")
        .stdin(Stdio::null());
    trace.apply(&mut cmd);
    if let Some(t) = &s.transport {
        cmd.env("OXCCL_TRANSPORTS", t);
    }
    match s.algo {
        Some(AlgoChoice::Auto) => {
            cmd.env_remove("OXCCL_ALGO");
        }
        Some(a) => {
            cmd.env("OXCCL_ALGO", a.env_value());
        }
        None => {}
    }
    if let Some(t) = s.timeout {
        cmd.env("OXCCL_TIMEOUT", t.as_secs_f64().to_string());
    }
    oxccl::launch::prepare(&mut cmd, cpu);
    cmd.spawn()
        .map_err(|e| format!("cannot start rank {rank} ({}): {e}", exe.display()))
}

/// Waits for every rank. A rank that exits 1 finished its run (with wrong elements, which its
/// table reports), so the others are left to finish theirs; after any other failure they get
/// [`GRACE`] to notice it and report their side, then are killed. Returns 0, or the status of
/// the first rank that failed (preferring a real failure to wrong elements). After a real
/// failure it prints who the job waited for, from the ranks' flight recorders.
fn wait(ranks: &mut [Child], trace: &TraceDir) -> u8 {
    let mut done = vec![false; ranks.len()];
    let mut code = 0u8;
    let mut deadline: Option<Instant> = None;
    loop {
        for (i, child) in ranks.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            let status = match child.try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("allreduce-perf: cannot wait for rank {i}: {e}");
                    kill_all(ranks);
                    return 3;
                }
            };
            done[i] = true;
            if status.success() {
                continue;
            }
            let failed = failure_code(status);
            if code == 0 || (code == 1 && failed != 1) {
                code = failed;
            }
            if failed != 1 && deadline.is_none() {
                eprintln!(
                    "allreduce-perf: rank {i} {}; stopping the job",
                    describe(status)
                );
                deadline = Some(Instant::now() + GRACE);
            }
        }
        let all_done = done.iter().all(|d| *d);
        if all_done || deadline.is_some_and(|d| Instant::now() >= d) {
            if deadline.is_some() {
                let running: Vec<(usize, Pid)> = (0..ranks.len())
                    .filter(|&i| !done[i])
                    .filter_map(|i| Some((i, Pid::from_raw(ranks[i].id() as i32)?)))
                    .collect();
                for line in trace.blame(&running, false) {
                    eprintln!(
                        "allreduce-perf: flight recorder: {line} (dumps in {})",
                        trace.path().display()
                    );
                }
            }
            kill_all(ranks);
            return code;
        }
        std::thread::sleep(POLL);
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => format!("ended with {status}"),
    }
}

/// Kills every rank still running and reaps them all.
fn kill_all(ranks: &mut [Child]) {
    for child in ranks.iter_mut() {
        if matches!(child.try_wait(), Ok(None)) {
            // An error means it exited in the meantime.
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// The exit status for a failed rank: its code, or 128 + the signal that killed it.
fn failure_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    };
    u8::try_from(code).ok().filter(|&c| c != 0).unwrap_or(1)
}
