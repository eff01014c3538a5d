//! Reductions on CUDA device memory: the kernels of `kernels/reduce.cu`, compiled by NVRTC at run
//! time for the device's architecture and launched in stream order. Same operations and the same
//! arithmetic contract as [`super::cpu`], bit for bit (any NaN matches any NaN); this module never
//! communicates and never touches host memory except to upload and download.
//!
//! # Loading, and machines without CUDA
//!
//! cudarc loads `libcuda.so.1` and `libnvrtc.so.13` (or `.so.12`) when first needed, through the
//! dynamic loader's search path (`LD_LIBRARY_PATH` included), so the crate builds and runs on
//! machines without CUDA: [`CudaReducer::new`] then returns [`Error::Unavailable`] saying what is
//! missing, and never panics. The bindings are CUDA 13.0's: the driver must be 13.0 or newer
//! (driver 580+); NVRTC may be 12.x or 13.x. The kernels include no toolkit header (not even
//! `cuda_fp16.h`), so a driver and libnvrtc are all a machine needs.
//!
//! [`compile_ptx`] and [`compile_all_ptx`] need libnvrtc only (no driver, no device): CI uses them
//! to prove that every kernel compiles, through the same code path a device uses.
//!
//! # Kernels and caching
//!
//! One NVRTC program per [`Kernel`] (element type × operator, or element type's division) is
//! compiled on first use, to a CUBIN for the device's `sm_XY` (or, for a device newer than NVRTC,
//! to PTX that the driver compiles), and cached for the life of the process per (architecture,
//! kernel); each [`CudaReducer`] loads the modules it uses once. [`CudaReducer::prepare`] does this
//! ahead of time.
//!
//! # Buffers
//!
//! Device memory is cudarc's: [`CudaSlice<u8>`] owns it, [`CudaView`]/[`CudaViewMut`] borrow a byte
//! range of it (`buf.slice(a..b)`), and cudarc orders uses across streams with events. Operands
//! hold elements of the `dtype` passed along: their lengths must be equal whole numbers of
//! elements, and their addresses multiples of the element size. Operands whose addresses are
//! equal modulo 16 run with 16-byte vector accesses; others run element by element (correct,
//! slower). The `*_raw` methods take device pointers instead, for memory cudarc does not own.
//!
//! `avg` combines as `sum` ([`CudaReducer::reduce`] with [`ReduceOp::Avg`] sums), and
//! [`CudaReducer::divide`] applies its one division at the end, as on the CPU.

mod nvrtc;
mod staging;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, DeviceSlice, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

pub use cudarc;
pub use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

mod sealed {
    /// Only cudarc's own buffers and views: see [`super::DeviceBuf`].
    pub trait Sealed {}
    impl Sealed for super::CudaSlice<u8> {}
    impl Sealed for super::CudaView<'_, u8> {}
    impl Sealed for super::CudaViewMut<'_, u8> {}
}

/// Device memory that oxccl reads from safe code: cudarc's [`CudaSlice`], [`CudaView`] and
/// [`CudaViewMut`] of bytes, whose address and length cudarc vouches for (making one from a
/// raw address is `unsafe` there). Sealed: cudarc's [`DevicePtr`] is a safe trait any type
/// can implement with any address and length, which a kernel would then read or write.
///
/// cudarc's buffers go in:
///
/// ```no_run
/// use std::sync::Arc;
/// use oxccl::reduce::cuda::{CudaSlice, CudaStream};
/// use oxccl::{Communicator, DataType, ReduceOp};
/// fn sum(c: &Communicator, s: &CudaSlice<u8>, r: &mut CudaSlice<u8>, st: &Arc<CudaStream>) {
///     c.all_reduce_device(s, r, DataType::F32, ReduceOp::Sum, st).unwrap();
/// }
/// ```
///
/// and a type of one's own that claims any address does not compile:
///
/// ```compile_fail
/// use std::sync::Arc;
/// use oxccl::reduce::cuda::cudarc::driver::{DevicePtr, DeviceSlice, SyncOnDrop, sys};
/// use oxccl::reduce::cuda::{CudaSlice, CudaStream};
/// use oxccl::{Communicator, DataType, ReduceOp};
/// struct Fake(Arc<CudaStream>, u64);
/// impl DeviceSlice<u8> for Fake {
///     fn len(&self) -> usize { 1 << 30 }
///     fn stream(&self) -> &Arc<CudaStream> { &self.0 }
/// }
/// impl DevicePtr<u8> for Fake {
///     fn device_ptr<'a>(&'a self, _: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
///         (self.1, SyncOnDrop::Sync(None))
///     }
/// }
/// fn sum(c: &Communicator, s: &Fake, r: &mut CudaSlice<u8>, st: &Arc<CudaStream>) {
///     c.all_reduce_device(s, r, DataType::F32, ReduceOp::Sum, st).unwrap();
/// }
/// ```
pub trait DeviceBuf: sealed::Sealed + DevicePtr<u8> {}
/// Device memory that oxccl writes from safe code ([`DeviceBuf`]'s mutable kinds).
pub trait DeviceBufMut: sealed::Sealed + DevicePtrMut<u8> {}

impl DeviceBuf for CudaSlice<u8> {}
impl DeviceBuf for CudaView<'_, u8> {}
impl DeviceBuf for CudaViewMut<'_, u8> {}
impl DeviceBufMut for CudaSlice<u8> {}
impl DeviceBufMut for CudaViewMut<'_, u8> {}
pub use nvrtc::{
    Kernel, MULTI_MAX, SOURCE, Target, compile_all_ptx, compile_cubin, compile_ptx, nvrtc_version,
    supported_archs,
};
pub use staging::{POOL_LIMIT, Staging};

use crate::error::{Error, Result};
use crate::types::{DataType, Element, ReduceOp};
use nvrtc::{DIVIDE, Image, REDUCE, REDUCE_INTO, REDUCE_MULTI, THREADS, UNROLL};

/// The parameters of `oxccl_reduce_multi`, laid out as `struct Multi` in `kernels/reduce.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Multi {
    ins: [u64; MULTI_MAX],
    outs: [u64; MULTI_MAX],
    n: u64,
    by: u64,
    n_in: u32,
    n_out: u32,
}

// SAFETY: plain data (integers), laid out as the kernel's by-value parameter.
unsafe impl cudarc::driver::DeviceRepr for Multi {}

/// The oldest CUDA driver API version this build works with (13.0, as `1000 × major + 10 ×
/// minor`): cudarc's bindings are CUDA 13.0's, and some of their entry points (such as
/// `cuEventElapsedTime_v2`) are missing from older drivers.
pub const MIN_DRIVER_VERSION: i32 = 13000;

/// Whether `libcuda` can be loaded: probed once per process.
fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: loading libcuda runs its initialisers, which are sound to run at any time.
    *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

/// The CUDA driver's API version (`1000 × major + 10 × minor`: 13000 for CUDA 13.0).
///
/// Fails with [`Error::Unavailable`] when no CUDA driver (`libcuda.so.1`) can be loaded.
pub fn driver_version() -> Result<i32> {
    if !driver_present() {
        return Err(Error::Unavailable(
            "no CUDA driver (libcuda.so.1 not found)".into(),
        ));
    }
    let mut v = 0;
    // SAFETY: libcuda is loaded (checked above); cuDriverGetVersion needs no cuInit and only
    // writes through the valid pointer.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| driver_error("cuDriverGetVersion", e))?;
    Ok(v)
}

/// The number of CUDA devices.
///
/// Fails with [`Error::Unavailable`] when there is no usable driver (none, too old, or one whose
/// `cuInit` fails, as it does on a machine without a GPU).
pub fn device_count() -> Result<usize> {
    let version = driver_version()?;
    if version < MIN_DRIVER_VERSION {
        return Err(Error::Unavailable(format!(
            "CUDA driver {}.{} is older than 13.0, which this build needs (driver 580 or newer)",
            version / 1000,
            version % 1000 / 10
        )));
    }
    cudarc::driver::result::init()
        .map_err(|e| Error::Unavailable(format!("no CUDA device: cuInit failed: {e}")))?;
    let n = cudarc::driver::result::device::get_count()
        .map_err(|e| driver_error("cuDeviceGetCount", e))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Waits until `stream` has run everything enqueued on it, for at most `timeout`: polls
/// `cuStreamQuery`, yielding between looks for the first [`SPIN`] (a small copy is done within
/// microseconds, and a sleep costs tens of them), then sleeping (from 20 µs, doubling up to
/// 1 ms) between looks, where `cuStreamSynchronize` would wait without a deadline (a kernel
/// that never ends on the caller's stream). `Ok(false)` when the time ran out.
///
/// # Safety
///
/// `stream` is a live stream (NULL: the default stream) of the context current on this thread,
/// and the driver is loaded ([`device_count`] succeeded).
pub unsafe fn wait_stream(
    stream: cudarc::driver::sys::CUstream,
    timeout: std::time::Duration,
) -> Result<bool> {
    use cudarc::driver::sys::{CUresult, cuStreamQuery};
    use std::time::Duration;
    let start = std::time::Instant::now();
    let mut pause = Duration::from_micros(20);
    loop {
        // SAFETY: the function's contract.
        match unsafe { cuStreamQuery(stream) } {
            CUresult::CUDA_SUCCESS => return Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => {}
            e => return Err(driver_error("cuStreamQuery", DriverError(e))),
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Ok(false);
        }
        if waited < SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

/// How long [`wait_stream`] looks without sleeping.
pub const SPIN: std::time::Duration = std::time::Duration::from_micros(200);

fn driver_error(what: &str, e: DriverError) -> Error {
    Error::Unavailable(format!("CUDA: {what} failed: {e}"))
}

/// How many blocks a launch gets. Blocks loop over the buffer, so every choice computes the same
/// result; they differ only in speed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GridSize {
    /// As many blocks as the device runs at once (occupancy × multiprocessors), fewer for small
    /// buffers: the default.
    #[default]
    Resident,
    /// At most this many blocks per multiprocessor.
    PerSm(u32),
    /// One block per `THREADS × UNROLL` vectors: no block loops.
    Unbounded,
}

/// A loaded entry point and how many of its blocks the device runs at once.
#[derive(Clone, Debug)]
struct Loaded {
    func: CudaFunction,
    resident_blocks: u32,
}

/// The reduction kernels on one CUDA device, launched on one stream of their own.
///
/// Every operation is enqueued on [`CudaReducer::stream`] and returns before it has run (except
/// downloads, which wait); [`CudaReducer::synchronize`] waits for all of them. Buffers made by
/// other streams of the same context may be passed: cudarc's events order the uses.
#[derive(Debug)]
pub struct CudaReducer {
    // Fields drop in order: modules before the stream before the context.
    functions: Mutex<HashMap<(Kernel, &'static str), Loaded>>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    device: usize,
    capability: (u32, u32),
    multiprocessors: u32,
    target: Target,
    grid: GridSize,
}

impl CudaReducer {
    /// Opens device `device` (its primary context) and makes a stream on it.
    ///
    /// Fails with [`Error::Unavailable`] when there is no CUDA driver, no device, a driver older
    /// than [`MIN_DRIVER_VERSION`], no NVRTC library, or an NVRTC that cannot compile for the
    /// device; with [`Error::InvalidArgument`] when `device` is not below [`device_count`].
    /// Never panics for want of a library.
    pub fn new(device: usize) -> Result<CudaReducer> {
        let count = device_count()?;
        if count == 0 {
            return Err(Error::Unavailable("no CUDA device".into()));
        }
        if device >= count {
            return Err(Error::InvalidArgument(format!(
                "CUDA device {device} does not exist ({count} present)"
            )));
        }
        nvrtc_version()?;
        let ctx = CudaContext::new(device).map_err(|e| driver_error("creating a context", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_error("reading the compute capability", e))?;
        let capability = (
            u32::try_from(major).unwrap_or(0),
            u32::try_from(minor).unwrap_or(0),
        );
        let target = target_for(capability.0 * 10 + capability.1, &supported_archs()?)?;
        let multiprocessors = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| driver_error("reading the multiprocessor count", e))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_error("creating a stream", e))?;
        Ok(CudaReducer {
            functions: Mutex::default(),
            stream,
            ctx,
            device,
            capability,
            multiprocessors: u32::try_from(multiprocessors).unwrap_or(1).max(1),
            target,
            grid: GridSize::default(),
        })
    }

    /// The device's ordinal.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub fn name(&self) -> Result<String> {
        self.ctx
            .name()
            .map_err(|e| driver_error("reading the device name", e))
    }

    /// The device's compute capability `(major, minor)`: `(9, 0)` for the H100.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.capability
    }

    /// The device's number of multiprocessors.
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// What the kernels are compiled to for this device.
    pub fn target(&self) -> Target {
        self.target
    }

    /// Compiles for `target` from now on (a CUBIN for the device's own architecture is the
    /// default; PTX makes the driver compile). Kernels already loaded are dropped.
    pub fn set_target(&mut self, target: Target) {
        self.target = target;
        lock(&self.functions).clear();
    }

    /// The grid size launches use.
    pub fn grid(&self) -> GridSize {
        self.grid
    }

    /// Uses `grid` for the launches from now on.
    pub fn set_grid(&mut self, grid: GridSize) {
        self.grid = grid;
    }

    /// The stream every operation is enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Compiles (if no device of this architecture has yet) and loads the kernels that `op` on
    /// `dtype` needs (for `Avg`, the division too), so that the first call does not pay for it.
    ///
    /// Fails with [`Error::InvalidArgument`] when `op` is not defined on `dtype`.
    pub fn prepare(&self, dtype: DataType, op: ReduceOp) -> Result<()> {
        let kernel = Kernel::combine(dtype, op)?;
        self.function(kernel, REDUCE)?;
        if op == ReduceOp::Avg {
            self.function(Kernel::Divide { dtype }, DIVIDE)?;
        }
        Ok(())
    }

    /// Waits until everything enqueued so far has run, and reports any error the device met.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_error("synchronizing the stream", e))?;
        self.ctx
            .check_err()
            .map_err(|e| driver_error("an earlier asynchronous operation", e))
    }

    /// A new zero-filled device buffer of `bytes` bytes.
    pub fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        self.stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| driver_error(&format!("allocating {bytes} bytes"), e))
    }

    /// A new device buffer holding `host`'s elements (as bytes).
    pub fn upload<T: Element>(&self, host: &[T]) -> Result<CudaSlice<u8>> {
        self.upload_bytes(bytemuck::cast_slice(host))
    }

    /// A new device buffer holding `host`.
    pub fn upload_bytes(&self, host: &[u8]) -> Result<CudaSlice<u8>> {
        self.stream
            .clone_htod(host)
            .map_err(|e| driver_error(&format!("copying {} bytes to the device", host.len()), e))
    }

    /// Copies `host` into the device memory `dst` (of the same length in bytes).
    pub fn upload_into<T: Element, D: DeviceBufMut>(&self, host: &[T], dst: &mut D) -> Result<()> {
        let host: &[u8] = bytemuck::cast_slice(host);
        self.same_context(dst)?;
        same_lengths("upload", dst.len(), host.len())?;
        self.stream
            .memcpy_htod(host, dst)
            .map_err(|e| driver_error(&format!("copying {} bytes to the device", host.len()), e))
    }

    /// Copies the device memory `src` into `host` (of the same length in bytes), after every
    /// operation enqueued before; returns once the data is in `host`.
    pub fn download<T: Element, S: DeviceBuf>(&self, src: &S, host: &mut [T]) -> Result<()> {
        let host: &mut [u8] = bytemuck::cast_slice_mut(host);
        self.same_context(src)?;
        same_lengths("download", src.len(), host.len())?;
        self.stream.memcpy_dtoh(src, host).map_err(|e| {
            driver_error(&format!("copying {} bytes from the device", src.len()), e)
        })?;
        self.synchronize()
    }

    /// Copies `src` to `dst` on the device (`cuMemcpyDtoDAsync`), in stream order.
    pub fn copy<D: DeviceBufMut, S: DeviceBuf>(&self, dst: &mut D, src: &S) -> Result<()> {
        self.same_context(dst)?;
        self.same_context(src)?;
        same_lengths("copy", dst.len(), src.len())?;
        self.stream
            .memcpy_dtod(src, dst)
            .map_err(|e| driver_error("copying on the device", e))
    }

    /// `dst[i] = dst[i] ⊕ src[i]` for every element of `dtype`, in stream order.
    ///
    /// Fails with [`Error::InvalidArgument`] when the lengths differ, are not whole numbers of
    /// elements, an operand is not aligned to the element size or belongs to another context,
    /// or `op` is not defined on `dtype`.
    pub fn reduce<D, S>(&self, dst: &mut D, src: &S, dtype: DataType, op: ReduceOp) -> Result<()>
    where
        D: DeviceBufMut,
        S: DeviceBuf,
    {
        let kernel = Kernel::combine(dtype, op)?;
        self.same_context(dst)?;
        self.same_context(src)?;
        let count = element_count(dtype, dst.len(), &[src.len()])?;
        let (d, _dst_done) = dst.device_ptr_mut(&self.stream);
        let (s, _src_done) = src.device_ptr(&self.stream);
        // SAFETY: both pointers come from live buffers of this context holding `count` elements,
        // and the guards order this stream after their earlier uses and later uses after it.
        unsafe { self.launch_combine(kernel, REDUCE, &[d, s], count) }
    }

    /// `out[i] = a[i] ⊕ b[i]` for every element of `dtype`, in stream order: one pass instead
    /// of copy-then-reduce.
    ///
    /// Fails as [`CudaReducer::reduce`] does.
    pub fn reduce_into<O, A, B>(
        &self,
        out: &mut O,
        a: &A,
        b: &B,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()>
    where
        O: DeviceBufMut,
        A: DeviceBuf,
        B: DeviceBuf,
    {
        let kernel = Kernel::combine(dtype, op)?;
        self.same_context(out)?;
        self.same_context(a)?;
        self.same_context(b)?;
        let count = element_count(dtype, out.len(), &[a.len(), b.len()])?;
        let (o, _out_done) = out.device_ptr_mut(&self.stream);
        let (x, _a_done) = a.device_ptr(&self.stream);
        let (y, _b_done) = b.device_ptr(&self.stream);
        // SAFETY: as in `reduce`.
        unsafe { self.launch_combine(kernel, REDUCE_INTO, &[o, x, y], count) }
    }

    /// `dst[i] = dst[i] / by` for every element of `dtype`, in stream order: the final step of
    /// `avg`. Integers truncate toward zero; floats are correctly rounded, as
    /// [`super::cpu::divide`] (bit for bit). `by == 1` leaves the bits untouched.
    ///
    /// Fails with [`Error::InvalidArgument`] when `by` is zero or the buffer is not a whole
    /// number of aligned elements.
    pub fn divide<D: DeviceBufMut>(&self, dst: &mut D, dtype: DataType, by: usize) -> Result<()> {
        self.same_context(dst)?;
        let count = element_count(dtype, dst.len(), &[])?;
        let (d, _dst_done) = dst.device_ptr_mut(&self.stream);
        // SAFETY: as in `reduce`.
        unsafe { self.divide_raw(d, count, dtype, by) }
    }

    /// [`CudaReducer::reduce`] on device pointers: `count` elements of `dtype` at `dst` and
    /// `src`.
    ///
    /// # Safety
    ///
    /// Both pointers must be device memory of this reducer's context, valid for `count`
    /// elements (`dst` for writes too), either equal or not overlapping, and not written by
    /// other streams until this stream has run the reduction.
    pub unsafe fn reduce_raw(
        &self,
        dst: u64,
        src: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let kernel = Kernel::combine(dtype, op)?;
        // SAFETY: the caller's promise.
        unsafe { self.launch_combine(kernel, REDUCE, &[dst, src], count) }
    }

    /// [`CudaReducer::reduce_into`] on device pointers.
    ///
    /// # Safety
    ///
    /// As [`CudaReducer::reduce_raw`], for all three pointers (`out` may equal `a` or `b`).
    pub unsafe fn reduce_into_raw(
        &self,
        out: u64,
        a: u64,
        b: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let kernel = Kernel::combine(dtype, op)?;
        // SAFETY: the caller's promise.
        unsafe { self.launch_combine(kernel, REDUCE_INTO, &[out, a, b], count) }
    }

    /// [`CudaReducer::divide`] on a device pointer.
    ///
    /// # Safety
    ///
    /// As [`CudaReducer::reduce_raw`], for `dst`.
    pub unsafe fn divide_raw(
        &self,
        dst: u64,
        count: usize,
        dtype: DataType,
        by: usize,
    ) -> Result<()> {
        if by == 0 {
            return Err(Error::InvalidArgument("divide: divisor is zero".into()));
        }
        aligned(dtype, &[dst])?;
        if by == 1 || count == 0 {
            return Ok(());
        }
        let kernel = Kernel::Divide { dtype };
        let f = self.function(kernel, DIVIDE)?;
        let cfg = self.config(&f, dtype, count);
        let (n, by) = (count as u64, by as u64);
        let mut launch = self.stream.launch_builder(&f.func);
        launch.arg(&dst).arg(&n).arg(&by);
        // SAFETY: `oxccl_divide(T*, u64, u64)` takes exactly these arguments; the caller vouches
        // for the memory.
        unsafe { launch.launch(cfg) }
            .map(drop)
            .map_err(|e| driver_error(&format!("launching the {kernel} kernel"), e))
    }

    /// `out[i] = ins[0][i] ⊕ ins[1][i] ⊕ ... ⊕ ins[k][i]` (folded in that order) for every
    /// output `out` of `outs` and each of the `count` elements of `dtype`, then divided by
    /// `divide_by` when it is not zero (avg: `op` is [`ReduceOp::Avg`] or `Sum`); one input makes
    /// it a copy to every output. One pass on [`CudaReducer::stream`]: each input element is
    /// read once and each output element written once. An output may equal an input (in
    /// place), but must not otherwise overlap one.
    ///
    /// Fails with [`Error::InvalidArgument`] when there are no inputs or outputs, more than
    /// [`MULTI_MAX`] of either, a misaligned pointer, or `op` is not defined on `dtype`.
    ///
    /// # Safety
    ///
    /// Every pointer is device memory this reducer's context can access, valid for `count`
    /// elements (outputs for writes), not written by other work until this stream has run the
    /// launch (nor, for the outputs, read by it).
    pub unsafe fn reduce_multi_raw(
        &self,
        ins: &[u64],
        outs: &[u64],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        divide_by: usize,
    ) -> Result<()> {
        let kernel = Kernel::combine(dtype, op)?;
        if ins.is_empty() || outs.is_empty() || ins.len() > MULTI_MAX || outs.len() > MULTI_MAX {
            return Err(Error::InvalidArgument(format!(
                "reduce: {} inputs and {} outputs (1 to {MULTI_MAX} each)",
                ins.len(),
                outs.len()
            )));
        }
        aligned(dtype, ins)?;
        aligned(dtype, outs)?;
        if count == 0 {
            return Ok(());
        }
        let mut m = Multi {
            ins: [0; MULTI_MAX],
            outs: [0; MULTI_MAX],
            n: count as u64,
            by: divide_by as u64,
            n_in: ins.len() as u32,
            n_out: outs.len() as u32,
        };
        m.ins[..ins.len()].copy_from_slice(ins);
        m.outs[..outs.len()].copy_from_slice(outs);
        let f = self.function(kernel, REDUCE_MULTI)?;
        let cfg = self.config(&f, dtype, count);
        let mut launch = self.stream.launch_builder(&f.func);
        launch.arg(&m);
        // SAFETY: `oxccl_reduce_multi(Multi)` takes exactly this by-value struct; the caller
        // vouches for the memory.
        unsafe { launch.launch(cfg) }
            .map(drop)
            .map_err(|e| driver_error(&format!("launching the {kernel} multi-operand kernel"), e))
    }

    /// The context the reducer's stream and kernels belong to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Launches `entry` (`oxccl_reduce` or `oxccl_reduce_into`) of `kernel` on `ptrs` (its
    /// pointer arguments, in order) and `count`.
    ///
    /// # Safety
    ///
    /// As [`CudaReducer::reduce_raw`], for every pointer.
    unsafe fn launch_combine(
        &self,
        kernel: Kernel,
        entry: &'static str,
        ptrs: &[u64],
        count: usize,
    ) -> Result<()> {
        let dtype = kernel.dtype();
        aligned(dtype, ptrs)?;
        if count == 0 {
            return Ok(());
        }
        let f = self.function(kernel, entry)?;
        let cfg = self.config(&f, dtype, count);
        let n = count as u64;
        let mut launch = self.stream.launch_builder(&f.func);
        for p in ptrs {
            launch.arg(p);
        }
        launch.arg(&n);
        // SAFETY: `oxccl_reduce(T*, const T*, u64)` and `oxccl_reduce_into(T*, const T*,
        // const T*, u64)` take exactly these arguments; the caller vouches for the memory.
        unsafe { launch.launch(cfg) }
            .map(drop)
            .map_err(|e| driver_error(&format!("launching the {kernel} kernel"), e))
    }

    /// The grid for `count` elements of `dtype`.
    fn config(&self, f: &Loaded, dtype: DataType, count: usize) -> LaunchConfig {
        let per_block = (16 / dtype.size()) as u64 * u64::from(UNROLL) * u64::from(THREADS);
        let needed = (count as u64).div_ceil(per_block).max(1);
        let cap = match self.grid {
            GridSize::Resident => u64::from(f.resident_blocks),
            GridSize::PerSm(k) => u64::from(k.max(1)) * u64::from(self.multiprocessors),
            GridSize::Unbounded => u64::MAX,
        };
        let blocks = needed.min(cap).min(i32::MAX as u64) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Entry point `entry` of `kernel`, loaded into this context (compiled first if need be).
    fn function(&self, kernel: Kernel, entry: &'static str) -> Result<Loaded> {
        if let Some(f) = lock(&self.functions).get(&(kernel, entry)) {
            return Ok(f.clone());
        }
        let image = nvrtc::cached(kernel, self.target)?;
        let ptx = match &*image {
            Image::Ptx(text) => Ptx::from_src(text.clone()),
            Image::Cubin(bytes) => Ptx::from_binary(bytes.clone()),
        };
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(|e| driver_error(&format!("loading the {kernel} kernels"), e))?;
        let mut functions = lock(&self.functions);
        for &name in kernel.entry_points() {
            let func = module
                .load_function(name)
                .map_err(|e| driver_error(&format!("finding {name} ({kernel})"), e))?;
            let per_sm = func
                .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)
                .map_err(|e| driver_error(&format!("reading {name}'s occupancy"), e))?;
            let resident_blocks = per_sm.max(1).saturating_mul(self.multiprocessors);
            functions.insert(
                (kernel, name),
                Loaded {
                    func,
                    resident_blocks,
                },
            );
        }
        functions.get(&(kernel, entry)).cloned().ok_or_else(|| {
            Error::InvalidArgument(format!("the {kernel} kernels have no entry point {entry}"))
        })
    }

    /// Fails unless `buf` belongs to this reducer's context.
    fn same_context<B: DeviceSlice<u8>>(&self, buf: &B) -> Result<()> {
        if **buf.stream().context() == *self.ctx {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "a device buffer belongs to another CUDA context than device {}'s",
                self.device
            )))
        }
    }
}

/// The CUDA target for a device of architecture `arch`, given what NVRTC supports: a CUBIN for
/// `sm_arch` when NVRTC knows it, else PTX for the newest older architecture it knows (which
/// the driver compiles for the device).
fn target_for(arch: u32, supported: &[u32]) -> Result<Target> {
    if supported.contains(&arch) {
        return Ok(Target::Cubin(arch));
    }
    match supported.iter().copied().filter(|&a| a < arch).max() {
        Some(older) => Ok(Target::Ptx(older)),
        None => Err(Error::Unavailable(format!(
            "this NVRTC cannot compile for compute capability {}.{} (it supports {supported:?})",
            arch / 10,
            arch % 10
        ))),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The map is only read or inserted into whole; a panic elsewhere cannot leave it torn.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn same_lengths(what: &str, device: usize, host: usize) -> Result<()> {
    if device == host {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what}: the device buffer has {device} bytes and the host buffer {host}"
        )))
    }
}

/// The number of elements of `dtype` in operands of `len` bytes, after checking that the others
/// have as many.
fn element_count(dtype: DataType, len: usize, others: &[usize]) -> Result<usize> {
    if !len.is_multiple_of(dtype.size()) {
        return Err(Error::InvalidArgument(format!(
            "reduce: {len} bytes is not a whole number of {dtype} elements"
        )));
    }
    if let Some(&bad) = others.iter().find(|&&l| l != len) {
        return Err(Error::InvalidArgument(format!(
            "reduce: operand lengths differ ({len} and {bad} bytes)"
        )));
    }
    Ok(len / dtype.size())
}

/// Fails unless every pointer is a multiple of the element size (the device cannot load a
/// misaligned element).
fn aligned(dtype: DataType, ptrs: &[u64]) -> Result<()> {
    match ptrs.iter().find(|&&p| p % dtype.size() as u64 != 0) {
        None => Ok(()),
        Some(p) => Err(Error::InvalidArgument(format!(
            "reduce: device address {p:#x} is not aligned to the {}-byte {dtype} elements",
            dtype.size()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_prefers_the_devices_own_architecture() {
        let nvrtc13 = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];
        assert_eq!(target_for(90, &nvrtc13).unwrap(), Target::Cubin(90));
        assert_eq!(target_for(130, &nvrtc13).unwrap(), Target::Ptx(121));
        assert!(matches!(
            target_for(70, &nvrtc13),
            Err(Error::Unavailable(_))
        ));
    }

    #[test]
    fn operands_are_checked_before_any_device_work() {
        assert_eq!(element_count(DataType::F32, 12, &[12, 12]).unwrap(), 3);
        assert!(element_count(DataType::F32, 10, &[10]).is_err());
        assert!(element_count(DataType::U8, 10, &[11]).is_err());
        assert!(aligned(DataType::F64, &[0x1000, 0x1008]).is_ok());
        assert!(aligned(DataType::F64, &[0x1000, 0x1004]).is_err());
        assert!(aligned(DataType::I8, &[0x1001]).is_ok());
    }
}
