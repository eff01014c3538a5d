//! One rank's run: join the job, gather the device lines, sweep every (type, operator, size)
//! row through the bench, and — on rank 0 only — print the table, show progress and write the
//! JSON, CSV and SVG files. Every rank takes the same path through the collectives; only
//! rank 0 prints to stdout or writes files.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use oxccl::bootstrap::Rendezvous;
use oxccl::{Communicator, Config};

use crate::args::{AlgoChoice, Device, Settings};
use crate::bench::Bench;
use crate::launch::STANDALONE_VAR;
use crate::plot;
use crate::record::{self, Doc, RankRecord, RowRecord};
use crate::report::{self, RankInfo};

/// Bytes each rank contributes to the gather of device lines.
const INFO_BYTES: usize = 512;

/// Runs this rank; returns its exit status (0 all right, 1 wrong elements, 3 failure).
pub fn run(s: &Settings, rv: &Rendezvous) -> u8 {
    let place = Place {
        local_rank: rv.local_rank,
        source: rv.source,
    };
    let ran = config(s).and_then(|c| {
        let comm = Communicator::init(c.clone()).map_err(|e| e.to_string())?;
        job(s, &c, comm, &place)
    });
    exit_status(rv.rank, ran)
}

/// `--threads`: the `--ranks` ranks as threads of this process (`Communicator::init_local`);
/// returns the worst exit status of any rank.
pub fn threads(s: &Settings) -> u8 {
    let n = s.ranks.unwrap_or(crate::launch::DEFAULT_RANKS);
    let made = config(s).and_then(|c| {
        let comms = Communicator::init_local(n, c.clone()).map_err(|e| e.to_string())?;
        Ok((c, comms))
    });
    let (config, comms) = match made {
        Ok(m) => m,
        Err(e) => {
            eprintln!("allreduce-perf: --threads: {e}");
            return 3;
        }
    };
    let config = &config;
    std::thread::scope(|sc| {
        let runs: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                sc.spawn(move || {
                    let place = Place {
                        local_rank: Some(rank),
                        source: "threads",
                    };
                    exit_status(rank, job(s, config, comm, &place))
                })
            })
            .collect();
        runs.into_iter()
            .map(|h| h.join().unwrap_or(3))
            .max()
            .unwrap_or(0)
    })
}

/// Where a rank runs: its local rank (its GPU, modulo those present) and how it was started.
struct Place<'a> {
    local_rank: Option<usize>,
    source: &'a str,
}

/// A rank's exit status (0 all right, 1 wrong elements, 3 failure), its error printed.
fn exit_status(rank: usize, result: Result<u64, String>) -> u8 {
    match result {
        Ok(0) => 0,
        Ok(_) => 1,
        Err(e) => {
            // oxccl's errors name the rank already.
            if e.starts_with(&format!("rank {rank}:")) {
                eprintln!("allreduce-perf: {e}");
            } else {
                eprintln!("allreduce-perf: rank {rank}: {e}");
            }
            3
        }
    }
}

/// A file rank 0 writes, created before the sweep so that a bad path fails at once.
struct Sink {
    path: PathBuf,
    file: BufWriter<File>,
}

impl Sink {
    fn create(path: &Path) -> Result<Sink, String> {
        let file =
            File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(Sink {
            path: path.to_owned(),
            file: BufWriter::new(file),
        })
    }

    fn write(
        mut self,
        content: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
    ) -> Result<(), String> {
        content(&mut self.file)
            .and_then(|()| self.file.flush())
            .map_err(|e| format!("cannot write {}: {e}", self.path.display()))
    }
}

/// What the sweep found, the same on every rank except `records` (rank 0 only).
struct Summary {
    records: Vec<RowRecord>,
    wrong: u64,
    avg_bus_bw: f64,
}

/// The communicator's configuration: the environment's, with the flags that set it.
fn config(s: &Settings) -> Result<Config, String> {
    let mut config = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(t) = s.timeout {
        config = config.timeout(t);
    }
    match s.algo {
        Some(AlgoChoice::Auto) => config = config.algorithm(None),
        Some(AlgoChoice::Forced(a)) => config = config.algorithm(Some(a)),
        None => {}
    }
    if let Some(t) = &s.transport {
        config = config.transports(t.parse().map_err(|e| format!("--transport: {e}"))?);
    }
    Ok(config)
}

/// Returns the number of wrong elements over the whole run of `comm`, made with `config`.
fn job(
    s: &Settings,
    config: &Config,
    comm: Communicator,
    place: &Place<'_>,
) -> Result<u64, String> {
    let start_time = record::now_rfc3339();
    let algo = config.algorithm.map_or("auto", |a| a.name()).to_owned();
    let allowed: Vec<String> = config.transports.order().map(str::to_owned).collect();
    let timeout_s = config.timeout.as_secs_f64();
    let (rank, n) = (comm.rank(), comm.size());
    if s.coll.rooted() && s.root >= n {
        return Err(format!(
            "-r {}: not a rank of this job of {n} ranks",
            s.root
        ));
    }
    if let Some(r) = s.corrupt_rank.filter(|&r| r >= n) {
        return Err(format!(
            "--corrupt-rank {r}: not a rank of this job of {n} ranks"
        ));
    }
    if s.topo {
        if rank == 0 {
            print!("{}", comm.topology());
        }
        // Rank 0 may host the store: it leaves only once every rank is done with it.
        comm.barrier().map_err(|e| e.to_string())?;
        return Ok(0);
    }
    if s.calibrate {
        let started = std::time::Instant::now();
        let costs = comm.calibrate().map_err(|e| e.to_string())?;
        if rank == 0 {
            eprintln!(
                "# tuner costs {} (calibration took {:.2} s)",
                costs.source(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let mut transports: Vec<String> = Vec::new();
    for t in comm.transports().iter().flatten() {
        if !transports.iter().any(|x| x == t) {
            transports.push((*t).to_owned());
        }
    }
    // What actually runs over the sweep, in order, as the routing decision says.
    let mut routes: Vec<String> = Vec::new();
    if let (Some(&dtype), Some(c)) = (s.dtypes.first(), s.coll.collective()) {
        let bench = Bench::new(&comm, s);
        for &size in &s.sizes {
            let row = bench.row(dtype, s.ops_for(dtype).first().copied().flatten(), size);
            let plan = oxccl::algo::Plan::new(c, row.count, dtype)
                .op(row.op.unwrap_or(oxccl::ReduceOp::Sum))
                .root(row.root.unwrap_or(0));
            for p in [plan, plan.in_place(true)] {
                let r = crate::bench::route_name(&comm, &p, s.device == Device::Cuda);
                if !routes.contains(&r) {
                    routes.push(r);
                }
            }
        }
    }
    let algo_line = if routes.is_empty() {
        algo.clone()
    } else {
        format!("{algo} ({})", routes.join(", "))
    };
    let me = RankInfo {
        rank,
        host: host_name(),
        pid: std::process::id(),
        device: place.local_rank.unwrap_or(rank),
        transports,
        algorithm: algo_line,
    };
    let infos = gather_infos(&comm, &me)?;
    let standalone = std::env::var_os(STANDALONE_VAR).is_some() || place.source == "threads";
    let version = env!("CARGO_PKG_VERSION");

    let (mut json, mut csv) = (None, None);
    if rank == 0 {
        json = s.json.as_deref().map(Sink::create).transpose()?;
        csv = s.csv.as_deref().map(Sink::create).transpose()?;
        if !standalone && s.ranks.is_some_and(|r| r != n) {
            eprintln!(
                "allreduce-perf: --ranks {} ignored: the launcher started {n} ranks",
                s.ranks.unwrap_or(n)
            );
        }
        let mut text = report::header(s, version);
        for info in &infos {
            text += &report::rank_line(
                info,
                match s.device {
                    crate::args::Device::Cpu => "cpu",
                    crate::args::Device::Cuda => "cuda",
                },
            );
        }
        text += &report::columns();
        print_now(&text);
    }

    let summary = sweep(&comm, s, place.local_rank.unwrap_or(rank))?;
    if rank != 0 {
        return Ok(summary.wrong);
    }
    print_now(&report::footer(
        s.coll.name(),
        summary.wrong,
        summary.avg_bus_bw,
    ));
    let doc = Doc {
        tool: "allreduce-perf".into(),
        version: Some(version.into()),
        oxccl_version: Some(oxccl::VERSION.into()),
        label: Some(format!("oxccl {} {n} ranks", s.coll.name())),
        host: Some(me.host.clone()),
        args: std::env::args().collect(),
        start_time: Some(start_time),
        end_time: Some(record::now_rfc3339()),
        config: record::Config::new(
            s,
            n,
            if standalone && place.source != "threads" {
                "standalone"
            } else {
                place.source
            },
            timeout_s,
            &algo,
            allowed,
        ),
        ranks: infos.iter().map(RankRecord::from).collect(),
        rows: summary.records,
        avg_bus_bw: Some(summary.avg_bus_bw),
        out_of_bounds: Some(summary.wrong),
    };
    if let Some(sink) = json {
        sink.write(|f| record::write_json(&doc, f))?;
    }
    if let Some(sink) = csv {
        sink.write(|f| record::write_csv(&doc.rows, f))?;
    }
    if let Some(path) = &s.plot {
        draw(s, &doc, path)?;
    }
    Ok(summary.wrong)
}

/// Measures every (type, operator, size) row in both placements; rank 0 prints each row as it
/// completes and keeps its record.
fn sweep(comm: &Communicator, s: &Settings, local_rank: usize) -> Result<Summary, String> {
    let rank0 = comm.rank() == 0;
    let progress = progress_bar(rank0, s);
    let bench = Bench::new(comm, s).on_device(local_rank)?;
    let mut summary = Summary {
        records: Vec::new(),
        wrong: 0,
        avg_bus_bw: 0.0,
    };
    let mut measured = 0usize;
    for &dtype in &s.dtypes {
        for op in s.ops_for(dtype) {
            for &size in &s.sizes {
                let row = bench.row(dtype, op, size);
                progress.set_message(format!(
                    "{} {} {} {} B",
                    s.coll.name(),
                    dtype.name(),
                    op.map_or("none", |o| o.name()),
                    row.size
                ));
                let both = bench.measure(&row);
                progress.inc(2);
                let (oop, ip) = both.inspect_err(|_| progress.finish_and_clear())?;
                for m in [&oop, &ip].into_iter().flatten() {
                    summary.wrong += m.nwrong.unwrap_or(0);
                    summary.avg_bus_bw += m.bus_bw;
                    measured += 1;
                }
                if rank0 {
                    let line = report::row_line(&row, oop.as_ref(), ip.as_ref());
                    progress.suspend(|| print_now(&line));
                    summary
                        .records
                        .push(RowRecord::new(&row, oop.as_ref(), ip.as_ref()));
                }
            }
        }
    }
    progress.finish_and_clear();
    if measured > 0 {
        summary.avg_bus_bw /= measured as f64;
    }
    Ok(summary)
}

/// Draws this run's rows and the overlays.
fn draw(s: &Settings, doc: &Doc, path: &Path) -> Result<(), String> {
    let ours: plot::PlotDoc = serde_json::to_value(doc)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("cannot convert the results for the plot: {e}"))?;
    let mut series = plot::series(&ours, "oxccl");
    series.extend(plot::overlay_series(&s.overlays)?);
    plot::draw(path, &format!("{} bus bandwidth", s.coll.name()), &series)
}

/// Gathers every rank's device line to rank 0 (in rank order); empty elsewhere.
fn gather_infos(comm: &Communicator, me: &RankInfo) -> Result<Vec<RankInfo>, String> {
    let mut mine = [0u8; INFO_BYTES];
    let text = me.encode();
    let len = text.len().min(INFO_BYTES);
    mine[..len].copy_from_slice(&text.as_bytes()[..len]);
    let mut all = if comm.rank() == 0 {
        vec![0u8; INFO_BYTES * comm.size()]
    } else {
        Vec::new()
    };
    comm.gather(&mine[..], &mut all, 0)
        .map_err(|e| e.to_string())?;
    all.chunks(INFO_BYTES)
        .enumerate()
        .map(|(r, chunk)| {
            let end = chunk.iter().position(|b| *b == 0).unwrap_or(chunk.len());
            RankInfo::decode(&String::from_utf8_lossy(&chunk[..end]))
                .ok_or_else(|| format!("rank {r} sent a malformed device line"))
        })
        .collect()
}

/// This host's name up to the first dot.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name = name.trim().split('.').next().unwrap_or("").to_owned();
    if name.is_empty() {
        "localhost".to_owned()
    } else {
        name
    }
}

/// Progress on rank 0's stderr; indicatif draws nothing when stderr is not a terminal.
fn progress_bar(rank0: bool, s: &Settings) -> ProgressBar {
    if !rank0 {
        return ProgressBar::hidden();
    }
    let rows: usize = s.dtypes.iter().map(|d| s.ops_for(*d).len()).sum::<usize>() * s.sizes.len();
    let bar = ProgressBar::new(2 * rows as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {elapsed} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn print_now(text: &str) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (`| head`) must not fail the job for the other ranks.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}
