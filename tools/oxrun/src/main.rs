//! oxrun: starts N local ranks of a program, like `mpirun -np N` or `torchrun
//! --nproc-per-node N`. It hosts the job's store, gives each rank its `OXCCL_*` variables,
//! prefixes every output line with the rank, and tears the whole job down when any rank fails,
//! the job times out, or oxrun itself is interrupted. It must never leave a rank running after
//! it exits.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use oxccl::bootstrap::{Secret, StoreServer};
use oxccl::launch::TraceDir;
use rustix::process::{Pid, Signal};

mod output;
mod signals;

use output::{Forwarders, Target};
use signals::Signals;

/// How long ranks get to exit after SIGTERM before they are killed.
const GRACE: Duration = Duration::from_secs(2);
/// How long oxrun waits for the last output lines once every rank has exited.
const DRAIN: Duration = Duration::from_secs(2);
/// Exit status when the job ran past `--timeout` (as timeout(1)).
const TIMED_OUT: u8 = 124;
/// Exit status when the program cannot be started (as a shell's "command not found").
const NOT_STARTED: u8 = 127;

/// Starts N local ranks of an oxccl program.
///
/// Each rank gets OXCCL_RANK, OXCCL_WORLD_SIZE, OXCCL_LOCAL_RANK, OXCCL_LOCAL_WORLD_SIZE,
/// OXCCL_STORE (the store oxrun hosts) and OXCCL_TOKEN (the job secret). Output lines are
/// prefixed with `[rank] `. When a rank fails, the others are stopped (SIGTERM, then SIGKILL
/// after 2 s) and oxrun exits with the failed rank's status (128 + signal for a signal).
#[derive(Debug, Parser)]
#[command(name = "oxrun", version)]
struct Args {
    /// Number of ranks to start.
    #[arg(short = 'n', long = "nranks", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    nranks: u32,

    /// Stop every rank and fail (status 124) if the job runs longer than this.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    timeout: Option<Duration>,

    /// Bind each rank to a core of its own (`core`, when ranks fit the available cores) or
    /// leave placement to the scheduler (`none`).
    #[arg(long = "bind-to", value_name = "core|none", default_value = "core")]
    bind_to: oxccl::launch::Bind,

    /// The program to run, and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    command: Vec<OsString>,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!("{s:?} is not a positive number of seconds"));
    }
    let d = Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))?;
    if d > oxccl::Config::MAX_TIMEOUT {
        return Err(format!(
            "{s:?}: at most {} s (a year)",
            oxccl::Config::MAX_TIMEOUT.as_secs()
        ));
    }
    Ok(d)
}

/// One started rank.
struct Rank {
    rank: usize,
    child: Child,
    /// Its pid, which is also its process group id.
    pid: Pid,
    status: Option<ExitStatus>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(msg) => {
            eprintln!("oxrun: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<u8, String> {
    let signals = Signals::install().map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let secret = Secret::random().map_err(|e| format!("cannot make a job secret: {e}"))?;
    let server = StoreServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), secret.clone())
        .map_err(|e| format!("cannot start the job's store: {e}"))?;
    let deadline = args.timeout.map(|t| Instant::now() + t);
    let forwarders = Forwarders::default();
    let n = args.nranks as usize;
    let cpus = oxccl::launch::cpu_plan(n, args.bind_to);
    let trace = TraceDir::for_job().map_err(|e| format!("cannot make a trace directory: {e}"))?;

    let mut ranks = Vec::with_capacity(n);
    for rank in 0..n {
        match start(
            args,
            rank,
            cpus.as_ref().map(|c| c[rank]),
            (server.local_addr(), &secret),
            &trace,
            &forwarders,
        ) {
            Ok(r) => ranks.push(r),
            Err(msg) => {
                eprintln!("oxrun: {msg}");
                terminate(&mut ranks, &signals);
                return Ok(NOT_STARTED);
            }
        }
    }

    let code = loop {
        if let Some((rank, status)) = reap(&mut ranks).into_iter().find(|(_, s)| !s.success()) {
            let running = ranks.iter().filter(|r| r.status.is_none()).count();
            eprintln!(
                "oxrun: rank {rank} {}; stopping the {running} other running ranks",
                describe(status)
            );
            report(&trace, &ranks, false);
            terminate(&mut ranks, &signals);
            break failure_code(status);
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break 0;
        }
        if let Some(sig) = signals.terminate_requested() {
            eprintln!("oxrun: received {}; stopping all ranks", signals::name(sig));
            terminate(&mut ranks, &signals);
            break (128 + sig).clamp(0, 255) as u8;
        }
        let now = Instant::now();
        if let Some(d) = deadline
            && now >= d
        {
            eprintln!(
                "oxrun: the job ran longer than --timeout {:?}; stopping all ranks",
                args.timeout.unwrap_or_default()
            );
            report(&trace, &ranks, true);
            terminate(&mut ranks, &signals);
            break TIMED_OUT;
        }
        // SIGCHLD wakes this at once; the cap only guards against a lost wake-up.
        let cap = Duration::from_secs(1);
        signals.wait(Some(
            deadline.map_or(cap, |d| d.saturating_duration_since(now).min(cap)),
        ));
    };
    forwarders.wait(DRAIN);
    drop(server);
    if code == 0 {
        trace.remove();
    }
    Ok(code)
}

/// Prints who the failed job waited for, from the ranks' flight recorders (the ranks still
/// running are asked for their dumps first).
fn report(trace: &TraceDir, ranks: &[Rank], hung: bool) {
    let running: Vec<(usize, Pid)> = ranks
        .iter()
        .filter(|r| r.status.is_none())
        .map(|r| (r.rank, r.pid))
        .collect();
    for line in trace.blame(&running, hung) {
        eprintln!(
            "oxrun: flight recorder: {line} (dumps in {}; oxccl-trace reads them)",
            trace.path().display()
        );
    }
}

/// Starts one rank in its own process group, with its output piped to forwarders.
fn start(
    args: &Args,
    rank: usize,
    cpu: Option<usize>,
    (store, secret): (SocketAddr, &Secret),
    trace: &TraceDir,
    forwarders: &Forwarders,
) -> Result<Rank, String> {
    let program = &args.command[0];
    let n = args.nranks.to_string();
    let mut cmd = Command::new(program);
    cmd.args(&args.command[1..])
        .env("OXCCL_RANK", rank.to_string())
        .env("OXCCL_WORLD_SIZE", &n)
        .env("OXCCL_LOCAL_RANK", rank.to_string())
        .env("OXCCL_LOCAL_WORLD_SIZE", &n)
        .env("OXCCL_STORE", store.to_string())
        .env("OXCCL_TOKEN", secret.to_hex())
        // The job's own secret: one the user's environment names by file would be a second.
        .env_remove("OXCCL_TOKEN_FILE")
        .env("OXCCL_TRACE_DIR", trace.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own process group: a terminal's Ctrl-C reaches only oxrun, which stops the ranks in
    // order, and a whole group (the rank and what it started) can be signalled at once.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    oxccl::launch::prepare(&mut cmd, cpu);
    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "cannot start rank {rank} ({}): {e}",
            program.to_string_lossy()
        )
    })?;
    let pid = Pid::from_child(&child);
    let forwarded = match (child.stdout.take(), child.stderr.take()) {
        (Some(out), Some(err)) => forwarders
            .spawn(rank, out, Target::Stdout)
            .and_then(|()| forwarders.spawn(rank, err, Target::Stderr))
            .map_err(|e| format!("cannot forward the output of rank {rank}: {e}")),
        _ => Err(format!("rank {rank} has no output pipes")),
    };
    if let Err(msg) = forwarded {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
        let _ = child.wait();
        return Err(msg);
    }
    Ok(Rank {
        rank,
        child,
        pid,
        status: None,
    })
}

/// Collects the status of every rank that has exited since the last call.
fn reap(ranks: &mut [Rank]) -> Vec<(usize, ExitStatus)> {
    let mut exited = Vec::new();
    for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
        if let Ok(Some(status)) = r.child.try_wait() {
            r.status = Some(status);
            exited.push((r.rank, status));
        }
    }
    exited
}

/// Stops every rank: SIGTERM to each rank's process group, SIGKILL to the groups still there
/// after the grace period, then waits for every rank.
fn terminate(ranks: &mut [Rank], signals: &Signals) {
    let signal_all = |ranks: &[Rank], sig: Signal| {
        for r in ranks {
            // ESRCH: the group is gone already.
            let _ = rustix::process::kill_process_group(r.pid, sig);
        }
    };
    signal_all(ranks, Signal::TERM);
    let grace = Instant::now() + GRACE;
    loop {
        reap(ranks);
        let left = grace.saturating_duration_since(Instant::now());
        if ranks.iter().all(|r| r.status.is_some()) || left.is_zero() {
            break;
        }
        signals.wait(Some(left));
    }
    // Also reaches what the ranks started in their groups and left behind.
    signal_all(ranks, Signal::KILL);
    for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
        if let Ok(status) = r.child.wait() {
            r.status = Some(status);
        }
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig} ({})", signals::name(sig)),
        _ => format!("ended with {status}"),
    }
}

/// oxrun's exit status for a failed rank: its code, or 128 + the signal that killed it.
fn failure_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    };
    u8::try_from(code).ok().filter(|&c| c != 0).unwrap_or(1)
}
