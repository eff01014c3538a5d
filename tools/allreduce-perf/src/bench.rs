//! Measurement of one row on one rank: buffers, warm-up, the timed repeats, the combination of
//! ranks' times (`-a`) and the check. Every rank runs the same calls in the same order; only
//! the communicator's collectives cross ranks, so every wait has the communicator's deadline.
//! Nothing here prints.

use std::sync::Arc;
use std::time::Instant;

use oxccl::algo::Plan;
use oxccl::reduce::cuda::CudaSlice;
use oxccl::reduce::cuda::cudarc::driver::{CudaContext, CudaStream};
use oxccl::types::{DataType, ReduceOp};
use oxccl::{Communicator, Registration};

use crate::args::{Combine, Device, Settings};
use crate::check::{self, Case, Pattern};
use crate::coll::Coll;

/// Most timed iterations per repeat that `--min-time` may ask for.
const MAX_ITERS: u64 = 1_000_000;

/// Most calls per repeat timed one by one for p50/p99 (evenly spaced; every call of shorter
/// repeats).
const TIMED_SINGLY: u64 = 4096;

/// The route `plan` takes, for people: on device memory (`device`) the device route, and for a
/// call staged through host memory the host route the staged call then takes.
pub fn route_name(comm: &Communicator, plan: &Plan, device: bool) -> String {
    let host = comm.explain(plan).route.name();
    if !device {
        return host;
    }
    match comm.explain(&plan.on_device(true)).route {
        oxccl::Route::Device(oxccl::DeviceWay::Staged) => format!("staged: {host}"),
        r => r.name(),
    }
}

/// One row of the table: what is measured.
#[derive(Clone, Debug)]
pub struct Row {
    /// The collective.
    pub coll: Coll,
    /// Element type.
    pub dtype: DataType,
    /// The operator, for collectives that reduce.
    pub op: Option<ReduceOp>,
    /// The root, for rooted collectives.
    pub root: Option<usize>,
    /// Bytes of the whole logical array (the size column).
    pub size: u64,
    /// The count passed to the collective (the count column).
    pub count: usize,
    /// The algorithm oxccl runs for it (`p2p` for send/receive).
    pub algorithm: String,
}

/// Where the output goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// Separate input and output buffers.
    OutOfPlace,
    /// One buffer, as oxccl's `*_in_place` calls lay it out.
    InPlace,
}

/// One placement of one row, combined over ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// Median over repeats of the mean time per call, µs.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s (1e9 bytes per second).
    pub alg_bw: f64,
    /// Bus bandwidth, GB/s.
    pub bus_bw: f64,
    /// Wrong elements summed over ranks; `None` without `-c`.
    pub nwrong: Option<u64>,
    /// Median duration of a single timed iteration, µs.
    pub p50_us: f64,
    /// 99th percentile of a single timed iteration, µs.
    pub p99_us: f64,
    /// Timed iterations per repeat.
    pub iterations: u64,
    /// Each repeat's mean time per call, µs, in the order they ran (ranks combined by `-a`):
    /// the k-th of one placement ran right after (or before) the k-th of the other.
    pub repeats_us: Vec<f64>,
}

/// One placement of a row under measurement.
struct Trial {
    /// The buffers' registrations (`--register`); they end before the buffers are freed
    /// (fields drop in order).
    _registered: Vec<Registration>,
    shape: Shape,
    pattern: Pattern,
    bufs: Buffers,
    /// Timed iterations per repeat.
    iters: u64,
    /// Each repeat's mean time per call, seconds (with room for `durations` after them).
    means: Vec<f64>,
    /// The durations of the calls timed singly (up to [`TIMED_SINGLY`] per repeat), seconds.
    durations: Vec<f64>,
}

/// A rank's buffers for one placement: in host memory, and with `--device cuda` their copies
/// on the device, which the calls use (the host ones are filled and checked).
struct Buffers {
    host: Bufs,
    device: Option<Bufs<CudaSlice<u8>>>,
}

/// Buffers of one placement (`B`: host memory, or a device buffer).
enum Bufs<B = Buf> {
    Separate { send: B, recv: B },
    Shared(B),
}

/// This rank's GPU (`--device cuda`): the stream the calls are ordered on (it holds its
/// context).
struct Gpu {
    stream: Arc<CudaStream>,
}

/// Host memory starting on a page boundary, as device allocations do (`cudaMalloc` aligns to
/// at least 256 bytes, in practice to pages), so that every buffer has the same offset within
/// its page: where a buffer starts relative to the library's own page-aligned buffers changes
/// how fast copies between them run (4 KiB aliasing), and would otherwise differ by chance
/// between the out-of-place and in-place buffers.
struct Buf {
    words: Vec<u64>,
    /// Where the buffer starts in `words`.
    at: usize,
    len: usize,
}

/// Buffers' alignment, bytes.
const BUF_ALIGN: usize = 4096;

impl Buf {
    /// Registers the buffer with `comm`.
    fn register(&self, comm: &Communicator) -> Result<Registration, String> {
        let b = self.bytes();
        // SAFETY: a Buf's memory never moves or shrinks, and the registration is dropped
        // before the Buf (`Trial`'s field order).
        unsafe { comm.register(b.as_ptr(), b.len()) }.map_err(|e| e.to_string())
    }

    /// `len` bytes starting `offset` bytes (a multiple of 8) past a page boundary.
    fn new(len: usize, offset: usize) -> Result<Buf, String> {
        debug_assert!(offset.is_multiple_of(8) && offset < BUF_ALIGN);
        let mut words = Vec::new();
        let n = len.div_ceil(8) + (BUF_ALIGN + offset) / 8;
        words
            .try_reserve_exact(n)
            .map_err(|_| format!("cannot allocate a buffer of {len} bytes"))?;
        words.resize(n, 0);
        let at = words.as_ptr().align_offset(BUF_ALIGN) + offset / 8;
        Ok(Buf { words, at, len })
    }

    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words[self.at..])[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words[self.at..])[..self.len]
    }
}

/// Where this rank's input and output lie, in elements.
#[derive(Clone, Copy, Debug)]
struct Shape {
    input: usize,
    output: usize,
    /// In place: the element where the input starts, and where the output starts
    /// ([`Plan::layout`]).
    input_at: usize,
    output_at: usize,
}

/// Runs rows on one rank's communicator.
pub struct Bench<'a> {
    comm: &'a Communicator,
    settings: &'a Settings,
    /// Times each call (the time-stamp counter where it is steady: a clock_gettime per call
    /// was 4% of an 8-byte broadcast's time on each rank, which the peers' benchmarks, timing
    /// only the whole loop, do not pay).
    clock: oxccl::trace::Clock,
    /// With `--device cuda`: the GPU of this rank (its local rank modulo the devices present).
    gpu: Option<Gpu>,
}

impl<'a> Bench<'a> {
    /// A bench over `comm` with the run's settings, in host memory.
    pub fn new(comm: &'a Communicator, settings: &'a Settings) -> Bench<'a> {
        Bench {
            comm,
            settings,
            clock: oxccl::trace::Clock::new(),
            gpu: None,
        }
    }

    /// The same bench on `local_rank`'s GPU (modulo the GPUs present) with `--device cuda`.
    pub fn on_device(self, local_rank: usize) -> Result<Bench<'a>, String> {
        let gpu = match self.settings.device {
            Device::Cpu => None,
            Device::Cuda => {
                let rank = self.comm.rank();
                let count =
                    oxccl::reduce::cuda::device_count().map_err(|e| format!("rank {rank}: {e}"))?;
                if count == 0 {
                    return Err(format!("rank {rank}: no CUDA device"));
                }
                let ctx = CudaContext::new(local_rank % count)
                    .map_err(|e| format!("rank {rank}: CUDA context: {e}"))?;
                let stream = ctx
                    .new_stream()
                    .map_err(|e| format!("rank {rank}: CUDA stream: {e}"))?;
                Some(Gpu { stream })
            }
        };
        Ok(Bench { gpu, ..self })
    }

    /// The device copy of `host` (zeros: the data is uploaded by `prepare`).
    fn device_copy(&self, host: &Bufs) -> Result<Option<Bufs<CudaSlice<u8>>>, String> {
        let Some(gpu) = &self.gpu else {
            return Ok(None);
        };
        let alloc = |b: &Buf| {
            gpu.stream.alloc_zeros::<u8>(b.len).map_err(|e| {
                format!(
                    "rank {}: allocating {} bytes on the device: {e}",
                    self.comm.rank(),
                    b.len
                )
            })
        };
        Ok(Some(match host {
            Bufs::Separate { send, recv } => Bufs::Separate {
                send: alloc(send)?,
                recv: alloc(recv)?,
            },
            Bufs::Shared(b) => Bufs::Shared(alloc(b)?),
        }))
    }

    /// The row for a requested `size` in bytes.
    pub fn row(&self, dtype: DataType, op: Option<ReduceOp>, size: u64) -> Row {
        let coll = self.settings.coll;
        let n = self.comm.size();
        let (elements, count) = coll.counts(size, dtype.size(), n);
        let root = coll.rooted().then_some(self.settings.root);
        let algorithm = match coll.collective() {
            Some(c) => {
                let plan = Plan::new(c, count, dtype)
                    .op(op.unwrap_or(ReduceOp::Sum))
                    .root(root.unwrap_or(0));
                let device = self.settings.device == Device::Cuda;
                let out_of_place = route_name(self.comm, &plan, device);
                let in_place = route_name(self.comm, &plan.in_place(true), device);
                if in_place == out_of_place {
                    out_of_place
                } else {
                    format!("{out_of_place}; in place {in_place}")
                }
            }
            None => "p2p".to_owned(),
        };
        Row {
            coll,
            dtype,
            op,
            root,
            size: (elements * dtype.size()) as u64,
            count,
            algorithm,
        }
    }

    /// Measures `row` out of place and in place (`None` where oxccl has no in-place call: gather,
    /// scatter and send/receive). The two placements' timed repeats alternate in pairs whose order
    /// turns (out, in; in, out; out, in; ...), so drift in the machine's speed over the row's
    /// run, and whatever the first of a pair leaves behind for the second, fall on both columns
    /// alike instead of on whichever ran second. Every rank gets the same
    /// combined results.
    pub fn measure(&self, row: &Row) -> Result<(Option<Measured>, Option<Measured>), String> {
        let mut trials = [
            self.start(row, Placement::OutOfPlace)?,
            self.start(row, Placement::InPlace)?,
        ];
        for k in 0..self.settings.repeats {
            // Which placement runs first alternates too (out, in; in, out; ...): the one that
            // follows the other meets the caches and the peer as the other left them.
            let order: [usize; 2] = if k % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let Some(t) = trials[i].as_mut() else {
                    continue;
                };
                self.comm.barrier().map_err(|e| e.to_string())?;
                let total = self.timed(row, &mut t.bufs, t.iters, &mut t.durations)?;
                t.means.push(total / t.iters as f64);
            }
        }
        let [oop, ip] = trials;
        let oop = oop.map(|t| self.finish(row, t)).transpose()?;
        Ok((oop, ip.map(|t| self.finish(row, t)).transpose()?))
    }

    /// Buffers for `row` in `placement`, filled, warmed up, and the iteration count per repeat.
    fn start(&self, row: &Row, placement: Placement) -> Result<Option<Trial>, String> {
        if placement == Placement::InPlace && !row.coll.has_in_place() {
            return Ok(None);
        }
        let s = self.settings;
        let shape = self.shape(row);
        let esize = row.dtype.size();
        let offset = s.buffer_offset.of(self.comm.rank());
        let host = match placement {
            Placement::OutOfPlace => Bufs::Separate {
                send: Buf::new(shape.input * esize, offset)?,
                recv: Buf::new(shape.output * esize, offset)?,
            },
            Placement::InPlace => {
                Bufs::Shared(Buf::new(shape.input.max(shape.output) * esize, offset)?)
            }
        };
        let device = self.device_copy(&host)?;
        let mut bufs = Buffers { host, device };
        let registered = match (&bufs.host, s.register) {
            (_, false) => Vec::new(),
            (Bufs::Separate { send, recv }, true) => {
                vec![send.register(self.comm)?, recv.register(self.comm)?]
            }
            (Bufs::Shared(buf), true) => vec![buf.register(self.comm)?],
        };
        let pattern = Pattern::new(row.coll, row.op, row.dtype, self.comm.size());
        self.prepare(row, &shape, &pattern, &mut bufs)?;

        for _ in 0..s.warmup {
            self.call(row, &mut bufs)?;
        }
        let iters = match s.min_time {
            Some(t) => self.calibrate(row, &mut bufs, t.as_secs_f64())?,
            None => s.iters,
        };
        let repeats = s.repeats as usize;
        let timed = repeats.saturating_mul(iters.min(TIMED_SINGLY) as usize);
        let (mut means, mut durations) = (Vec::new(), Vec::new());
        means
            .try_reserve_exact(timed.saturating_add(repeats))
            .and_then(|()| durations.try_reserve_exact(timed))
            .map_err(|_| format!("cannot hold the times of {timed} iterations"))?;
        Ok(Some(Trial {
            _registered: registered,
            shape,
            pattern,
            bufs,
            iters,
            means,
            durations,
        }))
    }

    /// Combines a placement's times over ranks, checks its output, and sums it up.
    fn finish(&self, row: &Row, t: Trial) -> Result<Measured, String> {
        let Trial {
            _registered: registered,
            shape,
            pattern,
            mut bufs,
            iters,
            means: mut samples,
            mut durations,
        } = t;
        // samples = [mean of each repeat..., each timed iteration...]
        let repeats = samples.len();
        samples.append(&mut durations);
        self.combine(&mut samples)?;
        let (means, iterations) = samples.split_at_mut(repeats);
        let repeats_us: Vec<f64> = means.iter().map(|t| t * 1e6).collect();
        let time = median(means);
        iterations.sort_by(f64::total_cmp);

        let nwrong = if self.settings.check > 0 {
            Some(self.check(row, &shape, &pattern, &mut bufs))
        } else {
            None
        };
        // The registrations end before the buffers go.
        drop(registered);
        let nwrong = nwrong.transpose()?;
        let alg_bw = if time > 0.0 {
            row.size as f64 / time / 1e9
        } else {
            0.0
        };
        Ok(Measured {
            time_us: time * 1e6,
            alg_bw,
            bus_bw: alg_bw * row.coll.bus_factor(self.comm.size()),
            nwrong,
            p50_us: percentile(iterations, 50.0) * 1e6,
            p99_us: percentile(iterations, 99.0) * 1e6,
            iterations: iters,
            repeats_us,
        })
    }

    fn shape(&self, row: &Row) -> Shape {
        let (rank, n) = (self.comm.rank(), self.comm.size());
        let Some(c) = row.coll.collective() else {
            return Shape {
                input: row.count,
                output: row.count,
                input_at: 0,
                output_at: 0,
            };
        };
        let plan = Plan::new(c, row.count, row.dtype)
            .root(row.root.unwrap_or(0))
            .in_place(true);
        // Where oxccl reads and writes inside the one in-place buffer (unused out of place).
        let layout = plan.layout(rank, n);
        let esize = row.dtype.size();
        Shape {
            input: plan.input_count(rank, n),
            output: plan.output_count(rank, n),
            input_at: layout.input.1 / esize,
            output_at: layout.output.1 / esize,
        }
    }

    /// Poisons the outputs and writes the known inputs.
    fn prepare(
        &self,
        row: &Row,
        shape: &Shape,
        pattern: &Pattern,
        bufs: &mut Buffers,
    ) -> Result<(), String> {
        let (rank, esize) = (self.comm.rank(), row.dtype.size());
        match &mut bufs.host {
            Bufs::Separate { send, recv } => {
                check::poison(recv.bytes_mut());
                check::fill_input(pattern, row.dtype, rank, send.bytes_mut())?;
            }
            Bufs::Shared(buf) => {
                let b = buf.bytes_mut();
                check::poison(b);
                let at = shape.input_at * esize;
                check::fill_input(
                    pattern,
                    row.dtype,
                    rank,
                    &mut b[at..at + shape.input * esize],
                )?;
            }
        }
        // On the device: the same bytes, there before the next call.
        if let (Some(gpu), Some(dev)) = (&self.gpu, &mut bufs.device) {
            let up =
                |host: &Buf, dev: &mut CudaSlice<u8>| gpu.stream.memcpy_htod(host.bytes(), dev);
            match (&bufs.host, dev) {
                (Bufs::Separate { send, recv }, Bufs::Separate { send: ds, recv: dr }) => {
                    up(send, ds).and_then(|()| up(recv, dr))
                }
                (Bufs::Shared(b), Bufs::Shared(d)) => up(b, d),
                _ => unreachable!("host and device buffers are made alike"),
            }
            .and_then(|()| gpu.stream.synchronize())
            .map_err(|e| format!("rank {rank}: copying the inputs to the device: {e}"))?;
        }
        Ok(())
    }

    /// This rank's output elements (copied from the device first, with `--device cuda`).
    fn output<'b>(
        &self,
        row: &Row,
        shape: &Shape,
        bufs: &'b mut Buffers,
    ) -> Result<&'b mut [u8], String> {
        if let (Some(gpu), Some(dev)) = (&self.gpu, &bufs.device) {
            let (host, dev) = match (&mut bufs.host, dev) {
                (Bufs::Separate { recv, .. }, Bufs::Separate { recv: d, .. }) => (recv, d),
                (Bufs::Shared(b), Bufs::Shared(d)) => (b, d),
                _ => unreachable!("host and device buffers are made alike"),
            };
            gpu.stream
                .memcpy_dtoh(dev, host.bytes_mut())
                .and_then(|()| gpu.stream.synchronize())
                .map_err(|e| {
                    format!(
                        "rank {}: copying the output from the device: {e}",
                        self.comm.rank()
                    )
                })?;
        }
        let esize = row.dtype.size();
        Ok(match &mut bufs.host {
            Bufs::Separate { recv, .. } => recv.bytes_mut(),
            Bufs::Shared(buf) => {
                let at = shape.output_at * esize;
                &mut buf.bytes_mut()[at..at + shape.output * esize]
            }
        })
    }

    /// Runs the row once.
    fn call(&self, row: &Row, bufs: &mut Buffers) -> Result<(), String> {
        let c = self.comm;
        let (dt, op, root) = (
            row.dtype,
            row.op.unwrap_or(ReduceOp::Sum),
            row.root.unwrap_or(0),
        );
        if let (Some(gpu), Some(dev)) = (&self.gpu, &mut bufs.device) {
            return self.call_device(row, &gpu.stream, dev);
        }
        let result = match &mut bufs.host {
            Bufs::Separate { send, recv } => {
                let (s, r) = (send.bytes(), recv.bytes_mut());
                match row.coll {
                    Coll::AllReduce => c.all_reduce_bytes(s, r, dt, op),
                    Coll::AllGather => c.all_gather_bytes(s, r, dt),
                    Coll::ReduceScatter => c.reduce_scatter_bytes(s, r, dt, op),
                    Coll::Broadcast => c.broadcast_bytes(s, r, dt, root),
                    Coll::Reduce => c.reduce_bytes(s, r, dt, op, root),
                    Coll::AllToAll => c.all_to_all_bytes(s, r, dt),
                    Coll::Gather => c.gather_bytes(s, r, dt, root),
                    Coll::Scatter => c.scatter_bytes(s, r, dt, root),
                    Coll::SendRecv => {
                        let (rank, n) = (c.rank(), c.size());
                        let mut g = c.group();
                        g.send(s, (rank + 1) % n)
                            .and_then(|g| g.recv(r, (rank + n - 1) % n).map(|_| ()))
                            .and_then(|()| g.run())
                    }
                }
            }
            Bufs::Shared(buf) => {
                let b = buf.bytes_mut();
                match row.coll {
                    Coll::AllReduce => c.all_reduce_in_place_bytes(b, dt, op),
                    Coll::AllGather => c.all_gather_in_place_bytes(b, dt),
                    Coll::ReduceScatter => c.reduce_scatter_in_place_bytes(b, dt, op),
                    Coll::Broadcast => c.broadcast_in_place_bytes(b, dt, root),
                    Coll::Reduce => c.reduce_in_place_bytes(b, dt, op, root),
                    Coll::AllToAll => c.all_to_all_in_place_bytes(b, dt),
                    Coll::Gather | Coll::Scatter | Coll::SendRecv => {
                        return Err(format!("{} has no in-place form", row.coll));
                    }
                }
            }
        };
        result.map_err(|e| e.to_string())
    }

    /// Runs the row once on device buffers (`--device cuda`), ordered on `stream`.
    fn call_device(
        &self,
        row: &Row,
        stream: &Arc<CudaStream>,
        dev: &mut Bufs<CudaSlice<u8>>,
    ) -> Result<(), String> {
        let c = self.comm;
        let (dt, op, root) = (
            row.dtype,
            row.op.unwrap_or(ReduceOp::Sum),
            row.root.unwrap_or(0),
        );
        let result = match dev {
            Bufs::Separate { send, recv } => match row.coll {
                Coll::AllReduce => c.all_reduce_device(send, recv, dt, op, stream),
                Coll::AllGather => c.all_gather_device(send, recv, dt, stream),
                Coll::ReduceScatter => c.reduce_scatter_device(send, recv, dt, op, stream),
                Coll::Broadcast => c.broadcast_device(send, recv, dt, root, stream),
                Coll::Reduce => c.reduce_device(send, recv, dt, op, root, stream),
                Coll::AllToAll => c.all_to_all_device(send, recv, dt, stream),
                Coll::Gather | Coll::Scatter | Coll::SendRecv => {
                    return Err(format!("{} on device memory is not built yet", row.coll));
                }
            },
            Bufs::Shared(buf) => match row.coll {
                Coll::AllReduce => c.all_reduce_device_in_place(buf, dt, op, stream),
                Coll::AllGather => c.all_gather_device_in_place(buf, dt, stream),
                Coll::ReduceScatter => c.reduce_scatter_device_in_place(buf, dt, op, stream),
                Coll::Broadcast => c.broadcast_device_in_place(buf, dt, root, stream),
                Coll::Reduce => c.reduce_device_in_place(buf, dt, op, root, stream),
                Coll::AllToAll => c.all_to_all_device_in_place(buf, dt, stream),
                Coll::Gather | Coll::Scatter | Coll::SendRecv => {
                    return Err(format!("{} has no in-place form", row.coll));
                }
            },
        };
        result.map_err(|e| e.to_string())
    }

    /// `iters` calls back to back (a barrier after each with `-z 1`); appends the durations
    /// of up to [`TIMED_SINGLY`] of them, evenly spaced, to `durations` and returns the total,
    /// in seconds. Timing every call cost a reading of the time-stamp counter per call (23 ns
    /// in a 2-core VM, 2026-11-27) and a push, which the peers' loops do not pay: 7% of an
    /// 8-byte broadcast. Every rank times the same calls, so `-a` combines them call by call.
    fn timed(
        &self,
        row: &Row,
        bufs: &mut Buffers,
        iters: u64,
        durations: &mut Vec<f64>,
    ) -> Result<f64, String> {
        let first = durations.len();
        // A countdown, not `i % every`: a division per call would cost what was saved.
        let every = iters.div_ceil(TIMED_SINGLY).max(1);
        let mut until_single = 0u64;
        let start = Instant::now();
        for _ in 0..iters {
            let before = (until_single == 0).then(|| self.clock.ticks());
            until_single = until_single.checked_sub(1).unwrap_or(every - 1);
            self.call(row, bufs)?;
            if self.settings.blocking {
                self.comm.barrier().map_err(|e| e.to_string())?;
            }
            if let Some(before) = before {
                durations.push(self.clock.ticks().wrapping_sub(before) as f64);
            }
        }
        // On the device the last call's result is enqueued, not yet there: wait for it, as
        // nccl-tests waits for its stream.
        if let Some(gpu) = &self.gpu {
            gpu.stream
                .synchronize()
                .map_err(|e| format!("rank {}: CUDA stream: {e}", self.comm.rank()))?;
        }
        let total = start.elapsed().as_secs_f64();
        // Ticks to seconds.
        let secs = self.clock.ns_per_tick() * 1e-9;
        for d in &mut durations[first..] {
            *d *= secs;
        }
        Ok(total)
    }

    /// The iteration count that makes one repeat last at least `target` seconds, from rank 0's
    /// timing of growing batches (broadcast, so every rank takes the same decisions).
    fn calibrate(&self, row: &Row, bufs: &mut Buffers, target: f64) -> Result<u64, String> {
        let mut batch = 1u64;
        let mut scratch = Vec::new();
        let per_call = loop {
            scratch.clear();
            let mut t = [self.timed(row, bufs, batch, &mut scratch)?];
            self.comm
                .broadcast_in_place(&mut t, 0)
                .map_err(|e| e.to_string())?;
            if t[0] >= target / 8.0 || batch >= 1 << 20 {
                break t[0] / batch as f64;
            }
            batch *= 4;
        };
        let wanted = if per_call > 0.0 {
            (target / per_call).ceil() as u64
        } else {
            MAX_ITERS
        };
        Ok(wanted.min(MAX_ITERS).max(self.settings.iters))
    }

    /// Combines every rank's `values` element-wise per `-a`; every rank gets the result.
    fn combine(&self, values: &mut [f64]) -> Result<(), String> {
        let c = self.comm;
        let r = match self.settings.combine {
            Combine::Rank0 => c.broadcast_in_place(values, 0),
            Combine::Average => c.all_reduce_in_place(values, ReduceOp::Avg),
            Combine::Min => c.all_reduce_in_place(values, ReduceOp::Min),
            Combine::Max => c.all_reduce_in_place(values, ReduceOp::Max),
        };
        r.map_err(|e| e.to_string())
    }

    /// Runs `-c` checked calls and returns the wrong elements summed over ranks.
    fn check(
        &self,
        row: &Row,
        shape: &Shape,
        pattern: &Pattern,
        bufs: &mut Buffers,
    ) -> Result<u64, String> {
        let rank = self.comm.rank();
        let case = Case {
            coll: row.coll,
            op: row.op,
            dtype: row.dtype,
            rank,
            n: self.comm.size(),
            count: row.count,
            root: row.root.unwrap_or(0),
        };
        let mut wrong = 0;
        for _ in 0..self.settings.check {
            self.prepare(row, shape, pattern, bufs)?;
            self.call(row, bufs)?;
            let out = self.output(row, shape, bufs)?;
            if self.settings.corrupt_rank == Some(rank) {
                check::corrupt(out, row.dtype.size());
            }
            wrong += check::count_wrong(pattern, &case, out)?;
        }
        let mut total = [wrong];
        self.comm
            .all_reduce_in_place(&mut total, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        Ok(total[0])
    }
}

/// The median of `v` (the mean of the middle two for an even length); 0 when empty.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The `p`-th percentile of sorted `v` by the nearest-rank method; 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn buffers_are_aligned_for_every_type() {
        for offset in [0, 16, 64, 4088] {
            for len in [1, 13, 4096, 100_000] {
                let mut b = Buf::new(len, offset).unwrap();
                assert_eq!(b.bytes().len(), len);
                let at = b.bytes().as_ptr() as usize;
                assert_eq!(at % BUF_ALIGN, offset, "{len} bytes at offset {offset}");
                b.bytes_mut().fill(0xa5);
                assert!(b.bytes().iter().all(|&x| x == 0xa5));
            }
            assert!(Buf::new(0, offset).unwrap().bytes().is_empty());
        }
    }
}
