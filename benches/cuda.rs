//! Bandwidth of every CUDA reduction kernel beside a device-to-device copy (`cuMemcpyDtoDAsync`)
//! measured in the same run on the same buffers.
//!
//! Bandwidth counts bytes read plus bytes written: 2·S for a copy or a division of S bytes,
//! 3·S for `dst = dst ⊕ src` and `out = a ⊕ b`. Each figure is the median of `--reps` runs
//! (default 20) after 3 warm-up runs, each timed with CUDA events around the one operation;
//! operands are `--bytes` each (default 256 MiB), filled with random data (never zeros), and
//! every kernel is compiled and loaded before it is timed. Before each run, outside the timed
//! region, the in-place operand gets its original values back (so repeated runs never reduce
//! it to zeros or infinities) and a buffer larger than L2 is written, so that every run, the
//! copy's too, starts with none of its operands cached and with the GPU busy while the timed
//! work is enqueued.
//!
//! Measured: the copy; `f32` sum in place and out of place under each grid size; every data
//! type × every operator defined on it (`avg` combines with `sum`'s kernel), in place and out of
//! place; every data type's division; the copy again. The faster of the two copies is the
//! reference. The output ends with two tables (data type × operator, GB/s and share of the
//! copy) and one line per `f32` sum saying whether it reaches 90% of the copy.
//!
//! `cargo bench --bench cuda` runs it in full (cargo passes `--bench`); without `--bench` (as
//! `cargo test --benches` runs it) it does a quick pass on 4 MiB. Without a CUDA device it prints
//! "skipped: no CUDA device (...)" and succeeds, unless `OXCCL_REQUIRE_CUDA` is set. `--csv PATH`
//! also writes every row to PATH. In full mode the exit status is 2 when an `f32` sum misses
//! the target.

#![allow(missing_docs)]

use std::fmt::Write as _;
use std::process::ExitCode;

use oxccl::Error;
use oxccl::reduce::cuda::cudarc::driver::sys::CUevent_flags;
use oxccl::reduce::cuda::{self, CudaReducer, CudaSlice, GridSize};
use oxccl::types::{DataType, ReduceOp};

/// The share of the copy's bandwidth the `f32` sums must reach.
const TARGET: f64 = 0.90;
const WARMUP: usize = 3;

/// The operators that have kernels of their own, in table order (`avg` runs `sum`'s).
const OPS: [ReduceOp; 7] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::BAnd,
    ReduceOp::BOr,
    ReduceOp::BXor,
];

struct Args {
    full: bool,
    bytes: usize,
    reps: usize,
    csv: Option<String>,
}

fn parse_size(s: &str) -> Option<usize> {
    let (num, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.parse::<usize>().ok().map(|n| n << shift)
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        full: false,
        bytes: 0,
        reps: 0,
        csv: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" => args.full = true,
            "--bytes" => {
                let v = it.next().ok_or("--bytes needs a size")?;
                args.bytes = parse_size(&v).ok_or(format!("bad size {v:?}"))?;
            }
            "--reps" => {
                let v = it.next().ok_or("--reps needs a count")?;
                args.reps = v.parse().map_err(|_| format!("bad count {v:?}"))?;
            }
            "--csv" => args.csv = Some(it.next().ok_or("--csv needs a path")?),
            // Flags cargo's test runner may pass.
            _ => {}
        }
    }
    if args.bytes == 0 {
        args.bytes = if args.full { 256 << 20 } else { 4 << 20 };
    }
    if args.reps == 0 {
        args.reps = if args.full { 20 } else { 3 };
    }
    // Whole 16-byte vectors of every type.
    args.bytes = (args.bytes / 16).max(1) * 16;
    Ok(args)
}

/// What a row measured.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Copy,
    /// `dst = dst ⊕ src`.
    InPlace,
    /// `out = a ⊕ b`.
    Into,
    /// `dst = dst / 3`.
    Divide,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Copy => "copy DtoD",
            Kind::InPlace => "reduce in place",
            Kind::Into => "reduce_into",
            Kind::Divide => "divide by 3",
        }
    }

    /// Passes over S bytes: reads plus writes.
    fn passes(self) -> usize {
        match self {
            Kind::Copy | Kind::Divide => 2,
            Kind::InPlace | Kind::Into => 3,
        }
    }
}

/// One measured operation.
struct Row {
    kind: Kind,
    dtype: Option<DataType>,
    op: Option<ReduceOp>,
    grid: Option<GridSize>,
    moved: usize,
    seconds: f64,
}

impl Row {
    fn gbps(&self) -> f64 {
        self.moved as f64 / self.seconds / 1e9
    }
}

fn or_dash<T: ToString>(x: Option<T>) -> String {
    x.map_or_else(|| "-".to_owned(), |x| x.to_string())
}

fn grid_name(g: GridSize) -> String {
    match g {
        GridSize::Resident => "resident".into(),
        GridSize::PerSm(k) => format!("{k}/SM"),
        GridSize::Unbounded => "unbounded".into(),
    }
}

/// The operands: `a` (destination in place), `b` (source), `out` (out-of-place result);
/// `pristine` holds `a`'s original values, and `flush` is written to evict the others from L2.
struct Buffers {
    a: CudaSlice<u8>,
    b: CudaSlice<u8>,
    out: CudaSlice<u8>,
    pristine: CudaSlice<u8>,
    flush: CudaSlice<u8>,
}

/// Bytes of the buffer written before each run: several times any GPU's L2 (50 MB on the H100).
const FLUSH_BYTES: usize = 256 << 20;

/// SplitMix64.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `bytes` of random elements of `dtype`: random bits for integers, small non-zero finite values
/// for floats (so that repeated sums stay ordinary numbers, as real data would).
fn random_bytes(dtype: DataType, bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(bytes + 8);
    while out.len() < bytes {
        let r = splitmix(&mut state);
        if !dtype.is_float() {
            out.extend_from_slice(&r.to_le_bytes());
            continue;
        }
        // ±(1/8 .. 8), never zero.
        let small = ((r % 64) as f64 + 1.0) / 8.0 * if r & 64 == 0 { 1.0 } else { -1.0 };
        let word: u64 = match dtype {
            DataType::F16 => u64::from(half::f16::from_f64(small).to_bits()),
            DataType::BF16 => u64::from(half::bf16::from_f64(small).to_bits()),
            DataType::F32 => u64::from((small as f32).to_bits()),
            DataType::F8E4M3 => u64::from(oxccl::F8E4M3::from_f64(small).to_bits()),
            DataType::F8E5M2 => u64::from(oxccl::F8E5M2::from_f64(small).to_bits()),
            _ => small.to_bits(),
        };
        out.extend_from_slice(&word.to_le_bytes()[..dtype.size()]);
    }
    out.truncate(bytes);
    out
}

fn driver(what: &str, e: cuda::cudarc::driver::DriverError) -> Error {
    Error::Unavailable(format!("{what}: {e}"))
}

struct Bench {
    r: CudaReducer,
    bufs: Buffers,
    reps: usize,
    rows: Vec<Row>,
}

impl Bench {
    /// Refills the buffers with fresh random elements of `dtype`.
    fn fill(&mut self, dtype: DataType) -> Result<(), Error> {
        let bytes = self.bufs.a.len();
        let Buffers {
            a,
            b,
            out,
            pristine,
            ..
        } = &mut self.bufs;
        for (seed, buf) in [(1, &mut *pristine), (2, b), (3, out)] {
            self.r.upload_into(&random_bytes(dtype, bytes, seed), buf)?;
        }
        self.r.copy(a, pristine)?;
        self.r.synchronize()
    }

    /// The median time of `reps` runs of `f` after warm-up runs, each timed by events around
    /// it. Before each run, untimed: `a` gets its original values back, and the flush buffer is
    /// written.
    fn time(
        &mut self,
        mut f: impl FnMut(&CudaReducer, &mut Buffers) -> Result<(), Error>,
    ) -> Result<f64, Error> {
        let Bench { r, bufs, reps, .. } = self;
        let stream = r.stream().clone();
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let ctx = stream.context();
        let start = ctx
            .new_event(flags)
            .map_err(|e| driver("creating an event", e))?;
        let end = ctx
            .new_event(flags)
            .map_err(|e| driver("creating an event", e))?;
        let mut times = Vec::with_capacity(*reps);
        for run in 0..WARMUP + (*reps).max(1) {
            r.copy(&mut bufs.a, &bufs.pristine)?;
            stream
                .memset_zeros(&mut bufs.flush)
                .map_err(|e| driver("writing the flush buffer", e))?;
            start
                .record(&stream)
                .map_err(|e| driver("recording an event", e))?;
            f(r, bufs)?;
            end.record(&stream)
                .map_err(|e| driver("recording an event", e))?;
            end.synchronize()
                .map_err(|e| driver("waiting for an event", e))?;
            if run >= WARMUP {
                let ms = start
                    .elapsed_ms(&end)
                    .map_err(|e| driver("reading an event's time", e))?;
                times.push(f64::from(ms) / 1e3);
            }
        }
        // Reports an error any of the runs met.
        r.synchronize()?;
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    fn push(&mut self, kind: Kind, dtype: Option<DataType>, op: Option<ReduceOp>, s: f64) {
        let grid = (kind != Kind::Copy).then(|| self.r.grid());
        let row = Row {
            kind,
            dtype,
            op,
            grid,
            moved: kind.passes() * self.bufs.a.len(),
            seconds: s,
        };
        println!(
            "  {:<16} {:<9} {:<5} {:<9} {:>10.1} us {:>8.1} GB/s",
            kind.name(),
            or_dash(dtype),
            or_dash(op),
            or_dash(grid.map(grid_name)),
            s * 1e6,
            row.gbps()
        );
        self.rows.push(row);
    }

    fn copy(&mut self) -> Result<f64, Error> {
        let s = self.time(|r, bufs| r.copy(&mut bufs.out, &bufs.a))?;
        self.push(Kind::Copy, None, None, s);
        Ok(s)
    }

    /// `a = a ⊕ b` in place and `out = a ⊕ b`: their times.
    fn combine(&mut self, dtype: DataType, op: ReduceOp) -> Result<(f64, f64), Error> {
        self.r.prepare(dtype, op)?;
        let inplace = self.time(|r, bufs| r.reduce(&mut bufs.a, &bufs.b, dtype, op))?;
        let into =
            self.time(|r, bufs| r.reduce_into(&mut bufs.out, &bufs.a, &bufs.b, dtype, op))?;
        self.push(Kind::InPlace, Some(dtype), Some(op), inplace);
        self.push(Kind::Into, Some(dtype), Some(op), into);
        Ok((inplace, into))
    }

    fn divide(&mut self, dtype: DataType) -> Result<(), Error> {
        self.r.prepare(dtype, ReduceOp::Avg)?;
        let s = self.time(|r, bufs| r.divide(&mut bufs.a, dtype, 3))?;
        self.push(Kind::Divide, Some(dtype), None, s);
        Ok(())
    }

    /// The GB/s of the resident-grid row of `kind` on `dtype` and `op`, if measured.
    fn gbps(&self, kind: Kind, dtype: DataType, op: Option<ReduceOp>) -> Option<f64> {
        self.rows
            .iter()
            .rev()
            .find(|r| {
                r.kind == kind
                    && r.dtype == Some(dtype)
                    && r.op == op
                    && r.grid == Some(GridSize::Resident)
            })
            .map(Row::gbps)
    }
}

/// A data type × operator table of one kind (with the division as the last column).
fn matrix(bench: &Bench, kind: Kind, copy_gbps: f64) -> String {
    let mut t = String::new();
    let _ = write!(t, "{:<6}", "dtype");
    for op in OPS {
        let _ = write!(t, " {:>12}", op.to_string());
    }
    let _ = writeln!(t, " {:>12}", "divide");
    let cell = |t: &mut String, g: Option<f64>| {
        let _ = match g {
            Some(g) => write!(t, " {:>6.0} {:>4.0}%", g, 100.0 * g / copy_gbps),
            None => write!(t, " {:>12}", "-"),
        };
    };
    for dtype in DataType::ALL {
        let _ = write!(t, "{:<6}", dtype.to_string());
        for op in OPS {
            cell(&mut t, bench.gbps(kind, dtype, Some(op)));
        }
        cell(&mut t, bench.gbps(Kind::Divide, dtype, None));
        t.push('\n');
    }
    t
}

fn run(args: &Args) -> Result<ExitCode, Error> {
    let r = match CudaReducer::new(0) {
        Ok(r) => r,
        Err(Error::Unavailable(why)) => {
            println!("skipped: no CUDA device ({why})");
            return Ok(if std::env::var_os("OXCCL_REQUIRE_CUDA").is_some() {
                eprintln!("cuda bench: OXCCL_REQUIRE_CUDA is set, but there is no device");
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            });
        }
        Err(e) => return Err(e),
    };
    let (major, minor) = r.compute_capability();
    let (nv_major, nv_minor) = cuda::nvrtc_version()?;
    let header = format!(
        "# oxccl CUDA reduction kernels on {} (compute {major}.{minor}, {} SMs), driver API {}, \
         NVRTC {nv_major}.{nv_minor}, kernels as {}\n# {} MiB per operand, median of {} runs \
         after {WARMUP} warm-ups; GB/s = (bytes read + bytes written) / time",
        r.name()?,
        r.multiprocessors(),
        cuda::driver_version()?,
        r.target(),
        args.bytes >> 20,
        args.reps
    );
    println!("{header}");
    let bufs = Buffers {
        a: r.alloc(args.bytes)?,
        b: r.alloc(args.bytes)?,
        out: r.alloc(args.bytes)?,
        pristine: r.alloc(args.bytes)?,
        flush: r.alloc(if args.full { FLUSH_BYTES } else { 4 << 20 })?,
    };
    let mut bench = Bench {
        r,
        bufs,
        reps: args.reps,
        rows: Vec::new(),
    };

    bench.fill(DataType::F32)?;
    let copy_before = bench.copy()?;

    // f32 sum under each grid size; the default (resident) last, for the headline figure.
    let grids: &[GridSize] = if args.full {
        &[
            GridSize::PerSm(1),
            GridSize::PerSm(2),
            GridSize::PerSm(4),
            GridSize::PerSm(8),
            GridSize::PerSm(16),
            GridSize::Unbounded,
            GridSize::Resident,
        ]
    } else {
        &[GridSize::Resident]
    };
    let mut f32_sum = (f64::INFINITY, f64::INFINITY);
    for &grid in grids {
        bench.r.set_grid(grid);
        f32_sum = bench.combine(DataType::F32, ReduceOp::Sum)?;
    }

    for dtype in DataType::ALL {
        bench.fill(dtype)?;
        for op in OPS.into_iter().filter(|op| op.supports(dtype)) {
            if (dtype, op) != (DataType::F32, ReduceOp::Sum) {
                bench.combine(dtype, op)?;
            }
        }
        bench.divide(dtype)?;
    }
    bench.fill(DataType::F32)?;
    let copy_after = bench.copy()?;

    // The faster copy is the reference: the stricter comparison.
    let copy = copy_before.min(copy_after);
    let copy_gbps = 2.0 * args.bytes as f64 / copy / 1e9;

    if let Some(path) = &args.csv {
        let mut csv =
            String::from("kernel,dtype,op,grid,bytes_moved,median_seconds,gbps,fraction_of_copy\n");
        for row in &bench.rows {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{:.9},{:.3},{:.4}",
                row.kind.name(),
                or_dash(row.dtype),
                or_dash(row.op),
                or_dash(row.grid.map(grid_name)),
                row.moved,
                row.seconds,
                row.gbps(),
                row.gbps() / copy_gbps
            );
        }
        std::fs::write(path, csv).map_err(|source| Error::Io {
            what: format!("writing {path}"),
            source,
        })?;
    }

    println!("\n{header}");
    println!(
        "copy DtoD (cuMemcpyDtoDAsync): {:.0} GB/s before, {:.0} GB/s after; the reference is \
         {copy_gbps:.0} GB/s",
        2.0 * args.bytes as f64 / copy_before / 1e9,
        2.0 * args.bytes as f64 / copy_after / 1e9
    );
    println!("\nf32 sum by grid size (GB/s, share of the copy):");
    for row in bench
        .rows
        .iter()
        .filter(|r| r.dtype == Some(DataType::F32) && r.op == Some(ReduceOp::Sum))
    {
        println!(
            "  {:<16} {:<9} {:>7.0} {:>5.1}%",
            row.kind.name(),
            or_dash(row.grid.map(grid_name)),
            row.gbps(),
            100.0 * row.gbps() / copy_gbps
        );
    }
    println!(
        "\ndst = dst op src (in place): GB/s and share of the copy\n{}",
        matrix(&bench, Kind::InPlace, copy_gbps)
    );
    println!(
        "out = a op b (reduce_into): GB/s and share of the copy; divide: dst = dst / 3\n{}",
        matrix(&bench, Kind::Into, copy_gbps)
    );

    let mut ok = true;
    for (what, s) in [("in place", f32_sum.0), ("out of place", f32_sum.1)] {
        let share = (3.0 * args.bytes as f64 / s / 1e9) / copy_gbps;
        let pass = share >= TARGET;
        ok &= pass;
        println!(
            "f32 sum {what}: {:.0} GB/s = {:.1}% of the copy's {copy_gbps:.0} GB/s (target \
             {:.0}%): {}",
            3.0 * args.bytes as f64 / s / 1e9,
            100.0 * share,
            100.0 * TARGET,
            if pass { "PASS" } else { "FAIL" }
        );
    }
    if !args.full {
        println!("(a quick pass on small buffers: run with --bench for the real figures)");
    }
    Ok(if ok || !args.full {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cuda bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cuda bench: {e}");
            ExitCode::FAILURE
        }
    }
}
