//! Command-line flags: nccl-tests' all_reduce_perf flags with their meanings, our long options,
//! and their resolution into [`Settings`] (the size sweep, the type and operator lists).
//! Parsing and validation only: nothing here starts ranks, opens files or reads the clock.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};
use oxccl::algo::Algorithm;
use oxccl::config::TransportFilter;
use oxccl::types::{DataType, ReduceOp};

use crate::coll::Coll;

/// Most rows a sweep may have (a guard against `-i 1 -e 1G`).
const MAX_SIZES: usize = 10_000;

const AFTER_HELP: &str = "\
Sizes take K, M and G suffixes (powers of 1024, any case): -b 8 -e 64M.

--op / -o has two meanings. A reduction operator (sum prod min max avg band bor bxor, or all)
is nccl-tests' -o; a collective name (allreduce allgather reducescatter broadcast reduce alltoall
gather scatter sendrecv, underscores optional) selects what is measured. Both may be given:
--op reducescatter -o min,max. `-o all` is every operator defined on each type (the bitwise
ones on integer types only).

Columns follow nccl-tests: size is the whole array in bytes (rounded down to n equal blocks for
allgather, reducescatter, alltoall, gather and scatter), count is the count passed to the call
(the per-rank block for those), busbw = algbw x nccl-tests' factor for the collective. time is the
median over -R repeats of each repeat's mean time per call, ranks combined by -a; the
out-of-place and in-place repeats alternate in pairs whose order turns (out, in; in, out; ...),
so the two columns see the same machine and neither always runs second. The JSON and
CSV also give the fastest repeat's mean (best_us; the JSON every repeat's, repeats_us) and p50/p99
of single iterations (up to 4096 evenly spaced calls per repeat, the same on every rank,
combined by -a call by call; timed with the time-stamp counter where it is steady, a third of
a clock_gettime; the time column's calls are not timed singly). oxccl has
no in-place gather, scatter or sendrecv: those columns read N/A.

Run plainly, allreduce-perf starts --ranks local ranks itself. Under oxrun, torchrun, mpirun or
srun it is one rank of the launched job and --ranks is ignored.

Exit status: 0 when every checked element is right, 1 when any is wrong, 2 for a usage error or
an unavailable feature, 3 when a rank fails.";

/// oxccl's benchmark: nccl-tests' flags and table for every collective.
#[derive(Debug, Parser)]
#[command(name = "allreduce-perf", version, disable_version_flag = true,
          after_long_help = AFTER_HELP,
          after_help = "--op also takes a collective name (allgather, broadcast, ...); see --help.")]
pub struct Cli {
    /// Print the version and exit (long form only: -V is nccl-tests' device_cta_count).
    #[arg(long, action = ArgAction::Version)]
    pub version: Option<bool>,

    /// Smallest size in bytes.
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", default_value = "8",
          value_parser = parse_size)]
    pub min_bytes: u64,

    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", default_value = "64M",
          value_parser = parse_size)]
    pub max_bytes: u64,

    /// Multiply the size by FACTOR from one row to the next [default: 4, or 1 when only -i is
    /// given]. A factor of 1 steps by -i bytes instead.
    #[arg(short = 'f', long = "stepfactor", value_name = "FACTOR",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub step_factor: Option<u64>,

    /// Add SIZE bytes from one row to the next, when the factor is 1 [default: 1M].
    #[arg(short = 'i', long = "stepbytes", value_name = "SIZE", value_parser = parse_size)]
    pub step_bytes: Option<u64>,

    /// Timed iterations per repeat.
    #[arg(short = 'n', long = "iters", value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: u64,

    /// Untimed warm-up iterations before each measurement.
    #[arg(
        short = 'w',
        long = "warmup_iters",
        visible_alias = "warmup-iters",
        value_name = "N",
        default_value_t = 5
    )]
    pub warmup: u64,

    /// Correctness checks per measurement (0: none, and #wrong reads N/A).
    #[arg(short = 'c', long = "check", value_name = "N", default_value_t = 1)]
    pub check: u32,

    /// Reduction operators (sum prod min max avg band bor bxor, all; comma lists) or the
    /// collective to measure (see below) [default: sum, allreduce].
    #[arg(short = 'o', long = "op", value_name = "OP|COLLECTIVE", action = ArgAction::Append,
          value_parser = parse_op_list)]
    pub op: Vec<Vec<OpItem>>,

    /// Data types (int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3
    /// f8e5m2, all; comma lists) [default: float].
    #[arg(short = 'd', long = "datatype", value_name = "TYPE", action = ArgAction::Append,
          value_parser = parse_dtype_list)]
    pub datatype: Vec<Vec<DataType>>,

    /// Root rank of broadcast, reduce, gather and scatter.
    #[arg(short = 'r', long = "root", value_name = "RANK", default_value_t = 0)]
    pub root: usize,

    /// 1: a barrier after every timed call (0: calls back to back).
    #[arg(short = 'z', long = "blocking", value_name = "0|1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub blocking: u8,

    /// How ranks' times combine: 0 rank 0's, 1 the average, 2 the minimum, 3 the maximum.
    #[arg(short = 'a', long = "average", value_name = "0-3", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(0..=3))]
    pub average: u8,

    /// Deadline of every wait, in seconds (OXCCL_TIMEOUT) [default: 300].
    #[arg(short = 'T', long = "timeout", value_name = "SECONDS", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,

    /// Write every row, the configuration and the host to this JSON file.
    #[arg(
        short = 'J',
        long = "output_file",
        visible_alias = "json",
        value_name = "FILE"
    )]
    pub json: Option<PathBuf>,

    /// Ranks to start when run plainly (not under a launcher) [default: 2].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub ranks: Option<u32>,

    /// When run plainly: bind each rank to a core of its own (`core`, when ranks fit the
    /// available cores) or leave placement to the scheduler (`none`).
    #[arg(long = "bind-to", value_name = "core|none", default_value = "core")]
    pub bind_to: oxccl::launch::Bind,

    /// Force an algorithm (ring, tree, hd, direct, hierarchical; auto: the tuner's choice) (OXCCL_ALGO).
    #[arg(long, value_name = "NAME", value_parser = parse_algo)]
    pub algo: Option<AlgoChoice>,

    /// Allowed transports, in order (tcp, shm,tcp, ^shm) (OXCCL_TRANSPORTS).
    #[arg(long, value_name = "LIST", value_parser = parse_transport)]
    pub transport: Option<String>,

    /// Repeat the timed loop N times and report the median of the repeats' mean times
    /// (out-of-place and in-place repeats alternate, in pairs whose order turns). Not
    /// nccl-tests' -R (local_register): that is --register here.
    #[arg(short = 'R', long = "repeats", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub repeats: u64,

    /// Raise each size's iteration count so one repeat lasts at least this long (rank 0
    /// decides); 0: off, -n iterations.
    #[arg(long = "min-time", value_name = "SECONDS", default_value = "0",
          value_parser = parse_min_time)]
    pub min_time: Duration,

    /// Write every row and placement to this CSV file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,

    /// Draw bus bandwidth against size to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    /// Also draw the rows of this JSON file (ours, or a peer's from scripts/peer2json.py);
    /// repeatable.
    #[arg(long, value_name = "FILE.json", action = ArgAction::Append, requires = "plot")]
    pub overlay: Vec<PathBuf>,

    /// Only draw --plot from the --overlay files; run nothing.
    #[arg(long, requires = "plot")]
    pub plot_only: bool,

    /// Where buffers live.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,

    /// Test only: this rank flips one element of its output before every check.
    #[arg(long, value_name = "RANK", hide = true)]
    pub corrupt_rank: Option<usize>,

    /// Before the sweep, measure every way through the shared group area and the links the
    /// schedules run over (shared memory inside a host, TCP between hosts) on this machine and
    /// let the tuner price calls with the result (rank 0 caches it for later runs; see
    /// OXCCL_TUNE, OXCCL_TUNE_FILE).
    #[arg(long)]
    pub calibrate: bool,

    /// Register every buffer with the communicator before its row runs (as nccl-tests'
    /// `--local_register 1` does with ncclCommRegister): over rdma links sends then go
    /// straight from the buffers, without a copy.
    #[arg(long)]
    pub register: bool,

    /// Print the job's topology (hosts x ranks, NUMA nodes, caches, NICs, GPUs, each rank's
    /// binding and NIC) and exit without measuring
    #[arg(long)]
    pub topo: bool,

    /// Run the --ranks ranks as threads of this one process (Communicator::init_local)
    /// instead of processes: with --device cuda, ranks on one GPU then reduce on the device
    /// between each other's buffers, as NCCL programs with one thread per rank do
    #[arg(long)]
    pub threads: bool,

    /// Start every host buffer this many bytes past a page boundary (a multiple of 8 below
    /// 4096) [default: 0]; a comma list gives rank r the (r mod length)-th (`0,16`: ranks
    /// place their buffers differently). `malloc` puts large blocks 16 bytes past one (Rust
    /// `Vec`s, numpy arrays, C programs' buffers); where a buffer lies against the library's
    /// own page-aligned ones, or a peer's, changes how fast copies between them run.
    #[arg(long = "buffer-offset", value_name = "BYTES[,BYTES...]", default_value = "0",
          value_parser = parse_buffer_offsets)]
    pub buffer_offset: Offsets,

    /// nccl-tests' threads per process: 1 only (ranks are processes here: --ranks).
    #[arg(short = 't', long = "nthreads", value_name = "1", help_heading = NCCL_TESTS)]
    pub nthreads: Option<u64>,

    /// nccl-tests' GPUs per thread: 1 only (one device per rank).
    #[arg(short = 'g', long = "ngpus", value_name = "1", help_heading = NCCL_TESTS)]
    pub ngpus: Option<u64>,

    /// nccl-tests' aggregated iterations: 1 only (every call is timed on its own).
    #[arg(short = 'm', long = "agg_iters", value_name = "1", help_heading = NCCL_TESTS)]
    pub agg_iters: Option<u64>,

    /// nccl-tests' run cycles: 1 only (one sweep; repeat it with -R).
    #[arg(short = 'N', long = "run_cycles", value_name = "1", help_heading = NCCL_TESTS)]
    pub run_cycles: Option<u64>,

    /// nccl-tests' parallel init: 0 or 1, the same here (every rank creates its own).
    #[arg(short = 'p', long = "parallel_init", value_name = "0|1", help_heading = NCCL_TESTS)]
    pub parallel_init: Option<u64>,

    /// nccl-tests' NULL stream: 0 only.
    #[arg(short = 'y', long = "stream_null", value_name = "0", help_heading = NCCL_TESTS)]
    pub stream_null: Option<u64>,

    /// nccl-tests' CUDA graph launches: 0 only.
    #[arg(short = 'G', long = "cudagraph", value_name = "0", help_heading = NCCL_TESTS)]
    pub cudagraph: Option<u64>,

    /// nccl-tests' CPU-time report: 0 only.
    #[arg(short = 'C', long = "report_cputime", value_name = "0", help_heading = NCCL_TESTS)]
    pub report_cputime: Option<u64>,

    /// nccl-tests' CTAs per device: not a setting here.
    #[arg(short = 'V', long = "device_cta_count", value_name = "N", help_heading = NCCL_TESTS)]
    pub device_cta_count: Option<u64>,
}

/// The help section of nccl-tests' options that take one value here.
const NCCL_TESTS: &str = "nccl-tests options (accepted where they mean what runs here)";

impl Cli {
    /// Fails naming the first nccl-tests option given a value that means something else than
    /// what runs here (so that its command lines run as they are where they can).
    fn nccl_tests_options(&self) -> Result<(), String> {
        let only = |flag: &str, value: Option<u64>, ok: &[u64], why: &str| match value {
            Some(v) if !ok.contains(&v) => Err(format!("{flag} {v}: {why}")),
            _ => Ok(()),
        };
        only(
            "-t",
            self.nthreads,
            &[1],
            "one thread per process here: ranks are processes (--ranks N)",
        )?;
        only(
            "-g",
            self.ngpus,
            &[1],
            "one device per rank here: ranks are processes (--ranks N)",
        )?;
        only(
            "-m",
            self.agg_iters,
            &[1],
            "calls are timed one by one here (-n sets how many)",
        )?;
        only(
            "-N",
            self.run_cycles,
            &[1],
            "one sweep per run here (-R repeats each size)",
        )?;
        only("-p", self.parallel_init, &[0, 1], "0 or 1")?;
        only("-y", self.stream_null, &[0], "no NULL-stream mode here")?;
        only("-G", self.cudagraph, &[0], "no CUDA graph launches here")?;
        only("-C", self.report_cputime, &[0], "no CPU-time report here")?;
        match self.device_cta_count {
            Some(v) => Err(format!(
                "-V {v}: nccl-tests' CTAs per device is no setting here"
            )),
            None => Ok(()),
        }
    }
}

/// Where buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// CUDA device memory: each rank on its local rank's GPU (modulo the GPUs present), the
    /// buffers copied there and the calls made on device memory (staged through the host).
    Cuda,
}

/// One word of an `--op` list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpItem {
    /// A reduction operator.
    Reduce(ReduceOp),
    /// `all`: every operator.
    AllReductions,
    /// A collective to measure.
    Collective(Coll),
}

/// `--algo`: the tuner's choice or a forced algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlgoChoice {
    /// Whatever the tuner picks per call.
    Auto,
    /// This algorithm wherever it implements the collective.
    Forced(Algorithm),
}

impl AlgoChoice {
    /// The value for `OXCCL_ALGO` (empty for auto).
    pub fn env_value(self) -> &'static str {
        match self {
            AlgoChoice::Auto => "",
            AlgoChoice::Forced(a) => a.name(),
        }
    }
}

/// How the size advances from row to row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Multiply by this factor (> 1).
    Factor(u64),
    /// Add this many bytes (> 0).
    Bytes(u64),
}

/// How ranks' times combine into the reported one (`-a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// Rank 0's time.
    Rank0,
    /// The mean over ranks.
    Average,
    /// The fastest rank's.
    Min,
    /// The slowest rank's.
    Max,
}

/// The flags resolved and checked: what to run and what to write.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The collective measured.
    pub coll: Coll,
    /// Reduction operators, in order (only for collectives that reduce).
    pub ops: Vec<ReduceOp>,
    /// Data types, in order.
    pub dtypes: Vec<DataType>,
    /// Requested sizes in bytes, ascending.
    pub sizes: Vec<u64>,
    /// `-b`, bytes.
    pub min_bytes: u64,
    /// `-e`, bytes.
    pub max_bytes: u64,
    /// `-f` / `-i`.
    pub step: Step,
    /// Timed iterations per repeat (`-n`).
    pub iters: u64,
    /// Warm-up iterations (`-w`).
    pub warmup: u64,
    /// Checks per measurement (`-c`).
    pub check: u32,
    /// Root (`-r`).
    pub root: usize,
    /// A barrier after each timed call (`-z 1`).
    pub blocking: bool,
    /// `-a`.
    pub combine: Combine,
    /// `-T`, when given.
    pub timeout: Option<Duration>,
    /// `-J`.
    pub json: Option<PathBuf>,
    /// `--ranks`, when given.
    pub ranks: Option<usize>,
    /// `--bind-to`.
    pub bind_to: oxccl::launch::Bind,
    /// `--algo`, when given.
    pub algo: Option<AlgoChoice>,
    /// `--transport`, when given (already validated).
    pub transport: Option<String>,
    /// `-R`.
    pub repeats: u64,
    /// `--min-time`, when not zero.
    pub min_time: Option<Duration>,
    /// `--csv`.
    pub csv: Option<PathBuf>,
    /// `--plot`.
    pub plot: Option<PathBuf>,
    /// `--overlay` files.
    pub overlays: Vec<PathBuf>,
    /// `--plot-only`.
    pub plot_only: bool,
    /// `--device`.
    pub device: Device,
    /// `--corrupt-rank` (tests).
    pub corrupt_rank: Option<usize>,
    /// `--calibrate`.
    pub calibrate: bool,
    /// `--register`.
    pub register: bool,
    /// `--topo`.
    pub topo: bool,
    /// `--threads`.
    pub threads: bool,
    /// `--buffer-offset`, bytes past a page boundary.
    pub buffer_offset: Offsets,
}

/// `--buffer-offset`'s bytes past a page boundary, by rank (rank r takes the (r mod
/// length)-th); never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offsets(Vec<usize>);

impl Offsets {
    /// Rank `rank`'s offset.
    pub fn of(&self, rank: usize) -> usize {
        self.0[rank % self.0.len()]
    }

    /// Whether every rank's buffers start on a page boundary.
    pub fn none(&self) -> bool {
        self.0.iter().all(|&o| o == 0)
    }
}

impl Cli {
    /// Checks the flags against each other and resolves lists, defaults and the sweep; the
    /// error is a message for the user.
    pub fn resolve(self) -> Result<Settings, String> {
        self.nccl_tests_options()?;
        let mut coll = None;
        let mut ops: Vec<ReduceOp> = Vec::new();
        for item in self.op.iter().flatten() {
            match *item {
                OpItem::Collective(c) => match coll {
                    Some(prev) if prev != c => {
                        return Err(format!(
                            "--op names two collectives ({prev} and {c}); measure one per run"
                        ));
                    }
                    _ => coll = Some(c),
                },
                OpItem::Reduce(op) => push_new(&mut ops, op),
                OpItem::AllReductions => ReduceOp::ALL
                    .into_iter()
                    .for_each(|o| push_new(&mut ops, o)),
            }
        }
        if ops.is_empty() {
            ops.push(ReduceOp::Sum);
        }
        let mut dtypes = Vec::new();
        for d in self.datatype.iter().flatten() {
            push_new(&mut dtypes, *d);
        }
        if dtypes.is_empty() {
            dtypes.push(DataType::F32);
        }
        let coll = coll.unwrap_or(Coll::AllReduce);
        if self.register && self.device == Device::Cuda {
            return Err(
                "--register registers host buffers with the links; with --device cuda the calls \
                 stage device buffers through memory of the library's own"
                    .into(),
            );
        }
        if !self.buffer_offset.none() && self.device == Device::Cuda {
            return Err(
                "--buffer-offset places host buffers; with --device cuda the buffers are \
                 device allocations"
                    .into(),
            );
        }
        if coll.reduces() && !dtypes.iter().any(|d| ops.iter().any(|o| o.supports(*d))) {
            return Err(format!(
                "no requested operator ({}) is defined on any requested type ({}): the bitwise \
                 operators take integer types",
                names(&ops, |o| o.name()),
                names(&dtypes, |d| d.name())
            ));
        }
        let step = match (self.step_factor, self.step_bytes) {
            (Some(f), _) if f > 1 => Step::Factor(f),
            (Some(_), bytes) | (None, bytes @ Some(_)) => Step::Bytes(bytes.unwrap_or(1 << 20)),
            (None, None) => Step::Factor(4),
        };
        let sizes = sweep(self.min_bytes, self.max_bytes, step)?;
        Ok(Settings {
            coll,
            ops,
            dtypes,
            sizes,
            min_bytes: self.min_bytes,
            max_bytes: self.max_bytes,
            step,
            iters: self.iters,
            warmup: self.warmup,
            check: self.check,
            root: self.root,
            blocking: self.blocking == 1,
            combine: match self.average {
                0 => Combine::Rank0,
                2 => Combine::Min,
                3 => Combine::Max,
                _ => Combine::Average,
            },
            timeout: self.timeout.filter(|t| !t.is_zero()),
            json: self.json,
            ranks: self.ranks.map(|r| r as usize),
            bind_to: self.bind_to,
            algo: self.algo,
            transport: self.transport,
            repeats: self.repeats,
            min_time: Some(self.min_time).filter(|t| !t.is_zero()),
            csv: self.csv,
            plot: self.plot,
            overlays: self.overlay,
            plot_only: self.plot_only,
            device: self.device,
            corrupt_rank: self.corrupt_rank,
            calibrate: self.calibrate,
            register: self.register,
            threads: self.threads,
            topo: self.topo,
            buffer_offset: self.buffer_offset,
        })
    }
}

impl Settings {
    /// The operators one type's rows run: every requested one defined on `dtype`, or just
    /// `None` for collectives that do not reduce.
    pub fn ops_for(&self, dtype: DataType) -> Vec<Option<ReduceOp>> {
        if self.coll.reduces() {
            self.ops
                .iter()
                .filter(|o| o.supports(dtype))
                .map(|o| Some(*o))
                .collect()
        } else {
            vec![None]
        }
    }
}

fn push_new<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

fn names<T>(v: &[T], name: impl Fn(&T) -> &'static str) -> String {
    v.iter().map(name).collect::<Vec<_>>().join(",")
}

/// The sizes from `min` to `max` inclusive, stepping by `step` (nccl-tests' loop).
pub fn sweep(min: u64, max: u64, step: Step) -> Result<Vec<u64>, String> {
    if min > max {
        return Err(format!(
            "-b {min} is larger than -e {max}: the sweep would be empty"
        ));
    }
    match step {
        Step::Factor(_) if min == 0 => {
            return Err("-b 0 with a step factor never grows: give -b > 0 or -f 1 -i SIZE".into());
        }
        Step::Bytes(0) => return Err("-i 0 never grows: give -i > 0".into()),
        _ => {}
    }
    let mut sizes = Vec::new();
    let mut size = min;
    while size <= max {
        if sizes.len() == MAX_SIZES {
            return Err(format!(
                "the sweep from {min} to {max} bytes has more than {MAX_SIZES} sizes; use a \
                 larger -f or -i"
            ));
        }
        sizes.push(size);
        let next = match step {
            Step::Factor(f) => size.checked_mul(f),
            Step::Bytes(b) => size.checked_add(b),
        };
        match next {
            Some(n) => size = n,
            None => break,
        }
    }
    Ok(sizes)
}

/// Parses a byte count with an optional K, M or G suffix (powers of 1024, any case; a trailing
/// `B` or `iB` is also accepted: `64M`, `64MiB`, `1g`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        _ => (body, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{s:?} is not a size: an integer with an optional K, M or G suffix (64M)"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is too large a size"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large a size"))
}

/// Parses an `--op` value: a comma list of reduction operators, `all`, and collective names.
pub fn parse_op_list(s: &str) -> Result<Vec<OpItem>, String> {
    list(s, |w| {
        if w.eq_ignore_ascii_case("all") {
            return Ok(OpItem::AllReductions);
        }
        if let Ok(op) = w.parse::<ReduceOp>() {
            return Ok(OpItem::Reduce(op));
        }
        Coll::parse(w).map(OpItem::Collective).ok_or_else(|| {
            format!(
                "{w:?} is neither a reduction operator (sum prod min max avg band bor bxor all) \
                 nor a collective ({})",
                Coll::ALL.map(|c| c.name().replace('_', "")).join(" ")
            )
        })
    })
}

/// `--buffer-offset`: a comma list of bytes past a page boundary, each a multiple of 8 (every
/// type's alignment) below 4096.
pub fn parse_buffer_offsets(s: &str) -> Result<Offsets, String> {
    let one = |w: &str| -> Result<usize, String> {
        let n: usize = w
            .trim()
            .parse()
            .map_err(|_| format!("--buffer-offset {w:?}: not a number of bytes"))?;
        if n >= 4096 || !n.is_multiple_of(8) {
            return Err(format!(
                "--buffer-offset {n}: must be a multiple of 8 (the widest type's alignment) \
                 below 4096 (a page)"
            ));
        }
        Ok(n)
    };
    let v = s.split(',').map(one).collect::<Result<Vec<_>, _>>()?;
    if v.len() > 4096 {
        return Err(format!(
            "--buffer-offset: {} offsets, at most 4096",
            v.len()
        ));
    }
    Ok(Offsets(v))
}

/// Parses a `-d` value: a comma list of nccl-tests type names, or `all`.
pub fn parse_dtype_list(s: &str) -> Result<Vec<DataType>, String> {
    let words = list(s, |w| Ok(w.to_owned()))?;
    let mut out = Vec::new();
    for w in words {
        if w.eq_ignore_ascii_case("all") {
            out.extend(DataType::ALL);
        } else {
            out.push(w.parse::<DataType>().map_err(|e| {
                format!(
                    "{e} (known: int8 uint8 int32 uint32 int64 uint64 half float double \
                     bfloat16 f8e4m3 f8e5m2, all)"
                )
            })?);
        }
    }
    Ok(out)
}

fn list<T>(s: &str, word: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    let words: Vec<&str> = s
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .collect();
    if words.is_empty() {
        return Err("an empty list".into());
    }
    words.into_iter().map(word).collect()
}

fn parse_algo(s: &str) -> Result<AlgoChoice, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(AlgoChoice::Auto);
    }
    s.trim()
        .parse::<Algorithm>()
        .map(AlgoChoice::Forced)
        .map_err(|e| format!("{e} (known: ring tree hd direct auto)"))
}

fn parse_transport(s: &str) -> Result<String, String> {
    s.parse::<TransportFilter>().map_err(|e| e.to_string())?;
    Ok(s.trim().to_owned())
}

fn seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is not a number of seconds"))
}

/// -T's seconds; 0 (nccl-tests' default: none of its own) leaves the library's deadline
/// (`OXCCL_TIMEOUT`).
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = seconds(s)?;
    if d.is_zero() {
        return Ok(d);
    }
    let (lo, hi) = (oxccl::Config::MIN_TIMEOUT, oxccl::Config::MAX_TIMEOUT);
    if d < lo || d > hi {
        return Err(format!(
            "the timeout must be from {} s to {} s",
            lo.as_secs_f64(),
            hi.as_secs()
        ));
    }
    Ok(d)
}

fn parse_min_time(s: &str) -> Result<Duration, String> {
    seconds(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(args: &[&str]) -> Result<Settings, String> {
        let argv = std::iter::once("allreduce-perf").chain(args.iter().copied());
        Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .resolve()
    }

    #[test]
    fn timeouts_outside_what_the_library_takes_are_refused_here() {
        for bad in ["-1", "nan", "1e20", "inf", "0.0001", "soon"] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_timeout("2.5"), Ok(Duration::from_millis(2500)));
        // nccl-tests' -T 0: no timeout of its own, the library's.
        assert_eq!(settings(&["-T", "0"]).unwrap().timeout, None);
    }

    #[test]
    fn nccl_tests_options_run_where_they_mean_what_runs_here() {
        let ok = [
            "-t", "1", "-g", "1", "-m", "1", "-N", "1", "-p", "1", "-y", "0", "-G", "0", "-C", "0",
        ];
        assert!(settings(&ok).is_ok(), "{:?}", settings(&ok).err());
        for (args, says) in [
            (&["-g", "2"][..], "-g 2: one device per rank"),
            (&["-t", "4"], "-t 4: one thread per process"),
            (&["-m", "8"], "-m 8: calls are timed one by one"),
            (&["-N", "0"], "-N 0: one sweep per run"),
            (&["-G", "1"], "-G 1: no CUDA graph"),
            (&["-V", "16"], "-V 16: nccl-tests' CTAs per device"),
        ] {
            let e = settings(args).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
        // --version only in its long form.
        let argv = ["allreduce-perf", "--version"];
        let e = Cli::try_parse_from(argv).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayVersion);
    }

    #[test]
    fn buffer_offsets_keep_every_type_aligned_within_a_page() {
        let at = |args: &[&str], rank| settings(args).unwrap().buffer_offset.of(rank);
        assert_eq!(at(&[], 3), 0);
        assert_eq!(at(&["--buffer-offset", "16"], 0), 16);
        assert_eq!(at(&["--buffer-offset", "16"], 5), 16);
        assert_eq!(at(&["--buffer-offset", "4088"], 1), 4088);
        for (rank, want) in [(0, 0), (1, 16), (2, 4088), (3, 0), (4, 16)] {
            assert_eq!(at(&["--buffer-offset", "0,16,4088"], rank), want);
        }
        for bad in ["4", "4096", "sixteen", "", "16,", "0,4"] {
            let e = settings(&["--buffer-offset", bad]).unwrap_err();
            assert!(e.contains("--buffer-offset"), "{bad:?}: {e}");
        }
        let e = settings(&["--buffer-offset", "16", "--device", "cuda"]).unwrap_err();
        assert!(e.contains("device"), "{e}");
    }

    #[test]
    fn sizes_take_binary_suffixes_in_any_case() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("100b"), Ok(100));
        for bad in [
            "",
            "M",
            "1.5M",
            "-1",
            "1T",
            "12X",
            "99999999999999999999",
            "17179869184G",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.coll, Coll::AllReduce);
        assert_eq!(s.ops, vec![ReduceOp::Sum]);
        assert_eq!(s.dtypes, vec![DataType::F32]);
        assert_eq!((s.min_bytes, s.max_bytes), (8, 64 << 20));
        assert_eq!(s.step, Step::Factor(4));
        assert_eq!(s.sizes.first(), Some(&8));
        assert_eq!(s.sizes.last(), Some(&(32 << 20)));
        assert_eq!((s.iters, s.warmup, s.check, s.root), (20, 5, 1, 0));
        assert_eq!(
            (s.blocking, s.combine, s.repeats),
            (false, Combine::Average, 1)
        );
        assert_eq!((s.timeout, s.ranks, s.min_time), (None, None, None));
        assert_eq!(s.device, Device::Cpu);
    }

    #[test]
    fn the_sweep_multiplies_or_adds_like_nccl_tests() {
        assert_eq!(
            sweep(8, 128, Step::Factor(2)).unwrap(),
            vec![8, 16, 32, 64, 128]
        );
        assert_eq!(sweep(8, 100, Step::Factor(4)).unwrap(), vec![8, 32]);
        assert_eq!(sweep(0, 3, Step::Bytes(1)).unwrap(), vec![0, 1, 2, 3]);
        assert!(sweep(9, 8, Step::Factor(2)).is_err());
        assert!(sweep(0, 8, Step::Factor(2)).is_err());
        assert!(sweep(1, 1 << 30, Step::Bytes(1)).is_err());
        assert_eq!(
            settings(&["-b", "1K", "-e", "3K", "-i", "1K"])
                .unwrap()
                .sizes,
            vec![1024, 2048, 3072]
        );
        let s = settings(&["-b", "1K", "-e", "3K", "-f", "1", "-i", "512"]).unwrap();
        assert_eq!(s.step, Step::Bytes(512));
        assert_eq!(s.sizes.len(), 5);
        let s = settings(&["-b", "1K", "-e", "4K", "-f", "2", "-i", "512"]).unwrap();
        assert_eq!(s.sizes, vec![1024, 2048, 4096]);
        let s = settings(&["-b", "1", "-e", "3", "-f", "1"]).unwrap();
        assert_eq!(s.step, Step::Bytes(1 << 20));
        assert_eq!(s.sizes, vec![1]);
    }

    #[test]
    fn op_is_a_reduction_or_a_collective() {
        let s = settings(&["-o", "max"]).unwrap();
        assert_eq!(
            (s.coll, s.ops.as_slice()),
            (Coll::AllReduce, &[ReduceOp::Max][..])
        );
        let s = settings(&["--op", "all_gather"]).unwrap();
        assert_eq!(
            (s.coll, s.ops.as_slice()),
            (Coll::AllGather, &[ReduceOp::Sum][..])
        );
        let s = settings(&["--op", "reducescatter", "-o", "min,max", "--op", "sum"]).unwrap();
        assert_eq!(s.coll, Coll::ReduceScatter);
        assert_eq!(s.ops, vec![ReduceOp::Min, ReduceOp::Max, ReduceOp::Sum]);
        let s = settings(&["--op", "sendrecv,prod"]).unwrap();
        assert_eq!(
            (s.coll, s.ops.as_slice()),
            (Coll::SendRecv, &[ReduceOp::Prod][..])
        );
        let s = settings(&["-o", "all"]).unwrap();
        assert_eq!(s.ops, ReduceOp::ALL.to_vec());
        assert_eq!(s.ops_for(DataType::F32).len(), 5);
        assert_eq!(s.ops_for(DataType::I32).len(), 8);
        let s = settings(&["--op", "allgather", "-o", "all"]).unwrap();
        assert_eq!(s.ops_for(DataType::F32), vec![None]);
        let e = settings(&["--op", "allgather", "--op", "broadcast"]).unwrap_err();
        assert!(e.contains("two collectives"), "{e}");
        let e = settings(&["-o", "mulsum"]).unwrap_err();
        assert!(e.contains("neither a reduction operator"), "{e}");
        let e = settings(&["-o", "band", "-d", "float"]).unwrap_err();
        assert!(e.contains("integer types"), "{e}");
    }

    #[test]
    fn datatypes_take_lists_and_all() {
        let s = settings(&["-d", "int8,bfloat16", "-d", "half"]).unwrap();
        assert_eq!(s.dtypes, vec![DataType::I8, DataType::BF16, DataType::F16]);
        let s = settings(&["-d", "all"]).unwrap();
        assert_eq!(s.dtypes, DataType::ALL.to_vec());
        let s = settings(&["-d", "float,all"]).unwrap();
        assert_eq!(s.dtypes.len(), 12);
        assert_eq!(s.dtypes[0], DataType::F32);
        let s = settings(&["-d", "f8e4m3,f8e5m2"]).unwrap();
        assert_eq!(s.dtypes, vec![DataType::F8E4M3, DataType::F8E5M2]);
        let e = settings(&["-d", "f8e4m2"]).unwrap_err();
        assert!(e.contains("unknown data type"), "{e}");
        assert!(settings(&["-d", ","]).is_err());
    }

    #[test]
    fn other_flags_are_checked() {
        let s = settings(&[
            "-a",
            "3",
            "-z",
            "1",
            "-T",
            "2.5",
            "--ranks",
            "3",
            "--algo",
            "ring",
            "--transport",
            "tcp",
            "-R",
            "5",
            "--min-time",
            "0.25",
            "-r",
            "2",
            "-c",
            "0",
            "-J",
            "x.json",
        ])
        .unwrap();
        assert_eq!(s.combine, Combine::Max);
        assert!(s.blocking);
        assert_eq!(s.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(s.ranks, Some(3));
        assert_eq!(s.algo, Some(AlgoChoice::Forced(Algorithm::Ring)));
        assert_eq!(s.transport.as_deref(), Some("tcp"));
        assert_eq!((s.repeats, s.root, s.check), (5, 2, 0));
        assert_eq!(s.min_time, Some(Duration::from_millis(250)));
        assert_eq!(s.json, Some(PathBuf::from("x.json")));
        assert_eq!(
            settings(&["--algo", "auto"]).unwrap().algo,
            Some(AlgoChoice::Auto)
        );
        for bad in [
            &["-a", "4"][..],
            &["-z", "2"],
            &["-n", "0"],
            &["-T", "soon"],
            &["--ranks", "0"],
            &["--algo", "bogus"],
            &["--transport", "pigeon"],
            &["-R", "0"],
            &["-f", "0"],
            &["--plot-only"],
            &["--overlay", "a.json"],
            &["--device", "tpu"],
            &["--device", "cuda", "--register"],
        ] {
            assert!(settings(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            settings(&["--device", "cuda"]).unwrap().device,
            Device::Cuda
        );
    }
}
