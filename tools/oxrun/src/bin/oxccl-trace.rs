//! oxccl-trace: reads the flight-recorder dumps of a job's ranks (a directory, as
//! `OXCCL_TRACE_DIR` or oxrun leaves it, or files) and says in one line per communicator who
//! the job waits for; `--calls K` also lists each rank's last K calls.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use oxccl::trace::{Trace, blame};

/// Names the rank a failed or hung oxccl job waits for, from its ranks' flight recorders.
#[derive(Debug, Parser)]
#[command(name = "oxccl-trace", version)]
struct Args {
    /// Also list each rank's last K calls.
    #[arg(long, value_name = "K", default_value_t = 0)]
    calls: usize,

    /// Dump directories (every `*.json` in them) or dump files.
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut traces = Vec::new();
    for p in &args.paths {
        let read = if p.is_dir() {
            Trace::read_dir(p)
        } else {
            std::fs::read_to_string(p)
                .map_err(|e| oxccl::Error::Io {
                    what: format!("read {}", p.display()),
                    source: e,
                })
                .and_then(|s| Trace::from_json(&s))
                .map(|t| vec![t])
        };
        match read {
            Ok(t) => traces.extend(t),
            Err(e) => {
                eprintln!("oxccl-trace: {}: {e}", p.display());
                return ExitCode::FAILURE;
            }
        }
    }
    if traces.is_empty() {
        eprintln!("oxccl-trace: no dumps found");
        return ExitCode::FAILURE;
    }
    for (comm, line) in blame(&traces) {
        let of: Vec<&Trace> = traces.iter().filter(|t| t.comm == comm).collect();
        println!(
            "communicator {comm} ({} ranks, {} dumps): {line}",
            of.iter().map(|t| t.size).max().unwrap_or(0),
            of.len()
        );
        if args.calls == 0 {
            continue;
        }
        for t in of {
            println!(
                "  rank {} (pid {} on {}, dumped on {}{}):",
                t.rank,
                t.pid,
                t.host,
                t.reason,
                t.error
                    .as_deref()
                    .map(|e| format!("; {e}"))
                    .unwrap_or_default()
            );
            let skip = t.entries.len().saturating_sub(args.calls);
            for e in &t.entries[skip..] {
                let took = e
                    .end_ns
                    .zip(e.begin_ns)
                    .map(|(end, b)| format!("{:.1} µs", (end - b.min(end)) as f64 / 1e3))
                    .unwrap_or_else(|| "-".into());
                println!(
                    "    {:<28} {:<9} {:>10} {:<8} {:<22} {:<8} {}{}",
                    e.name(),
                    e.dtype.as_deref().unwrap_or("-"),
                    e.count,
                    e.op.as_deref().unwrap_or("-"),
                    e.route.as_deref().unwrap_or("-"),
                    format!("{:?}", e.state).to_lowercase(),
                    took,
                    e.peer.map(|p| format!(" (rank {p})")).unwrap_or_default()
                );
            }
        }
    }
    ExitCode::SUCCESS
}
