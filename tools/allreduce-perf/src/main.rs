//! allreduce-perf: oxccl's benchmark, with nccl-tests' flags and table for every collective.
//!
//! Run plainly it starts `--ranks` local ranks of itself (`launch`); under oxrun, torchrun,
//! mpirun or srun it is one rank of the launched job (`rank`). Each rank measures every row
//! (`bench`) and checks it against exactly known results (`check`); rank 0 prints the table
//! (`report`) and writes JSON, CSV (`record`) and SVG (`plot`). This file only dispatches.

mod args;
mod bench;
mod cfmt;
mod check;
mod coll;
mod launch;
mod plot;
mod rank;
mod record;
mod report;

use std::process::ExitCode;

use clap::Parser;
use oxccl::bootstrap::Rendezvous;

use args::{Cli, Device, Settings};

/// Exit status of a usage error or an unavailable feature (as clap's).
const USAGE: u8 = 2;
/// Exit status when a rank fails.
const FAILED: u8 = 3;

fn main() -> ExitCode {
    let settings = match Cli::parse().resolve() {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("allreduce-perf: {msg}");
            return ExitCode::from(USAGE);
        }
    };
    ExitCode::from(run(&settings))
}

fn run(s: &Settings) -> u8 {
    if s.device == Device::Cuda
        && let Err(e) = oxccl::reduce::cuda::device_count().and_then(|n| {
            if n > 0 {
                Ok(n)
            } else {
                Err(oxccl::Error::Unavailable("no CUDA device".into()))
            }
        })
    {
        eprintln!("allreduce-perf: --device cuda: {e}");
        return USAGE;
    }
    if s.plot_only {
        return plot_only(s);
    }
    if s.threads {
        return rank::threads(s);
    }
    match Rendezvous::from_env() {
        Ok(Some(rv)) => rank::run(s, &rv),
        Ok(None) => match launch::standalone(s) {
            Ok(code) => code,
            Err(msg) => {
                eprintln!("allreduce-perf: {msg}");
                FAILED
            }
        },
        Err(e) => {
            eprintln!("allreduce-perf: cannot read the launcher's environment: {e}");
            USAGE
        }
    }
}

/// `--plot-only`: draws the overlays and runs nothing.
fn plot_only(s: &Settings) -> u8 {
    let Some(path) = &s.plot else {
        eprintln!("allreduce-perf: --plot-only needs --plot FILE.svg");
        return USAGE;
    };
    if s.overlays.is_empty() {
        eprintln!("allreduce-perf: --plot-only needs at least one --overlay FILE.json");
        return USAGE;
    }
    let drawn = plot::overlay_series(&s.overlays)
        .and_then(|series| plot::draw(path, "bus bandwidth", &series));
    match drawn {
        Ok(()) => 0,
        Err(msg) => {
            eprintln!("allreduce-perf: {msg}");
            FAILED
        }
    }
}
