//! CUDA device memory through a collective's stream argument: with a non-NULL
//! `cudaStream_t`, the buffers must be device memory (checked with `cuPointerGetAttribute`; a
//! host buffer with a stream is `oxcclInvalidArgument`), and the call stages them through host
//! memory as the Rust API's `*_device` methods do: it copies what the call reads from the
//! device on that stream (after everything the stream already holds), runs the collective on
//! the host engine, and enqueues the copy of the result back on the stream, so the stream's
//! later work sees it. The call returns once the result is on the device. The host copies are
//! page-locked buffers from a pool, reused from call to call.
//!
//! A NULL stream is CUDA's default stream where the program uses CUDA (it had loaded libcuda
//! when it made the communicator) and the first buffer is device memory, as NCCL programs pass
//! it; otherwise it means host memory, and nothing asks CUDA about the buffers.
//!
//! Sends and receives take device memory the same way (a send copies its bytes to the host
//! first; a receive copies what came to the device after). Inside `oxcclGroupStart` /
//! `oxcclGroupEnd` the inputs are copied to the host when the call is made, and the outermost
//! `oxcclGroupEnd` runs the group and then copies the results to the device. Not yet: device
//! buffers on a non-blocking communicator (`oxcclInvalidUsage`, saying so).

use std::ffi::c_void;
use std::sync::Arc;

use oxccl_core::algo::Plan;
use oxccl_core::reduce::cuda::{self, Staging, cudarc::driver::sys};

use crate::abi::*;
use crate::boundary::{Failure, Outcome, Region};
use crate::collectives::Buffers;
use crate::dispatch::{Job, hold, in_group, issue};
use crate::entry::Entry;

fn cuda_failure(what: &str, e: impl std::fmt::Display) -> Failure {
    Failure {
        code: oxcclUnhandledCudaError,
        message: format!("CUDA: {what}: {e}"),
    }
}

fn check(what: &str, r: sys::CUresult) -> Result<(), Failure> {
    r.result().map_err(|e| cuda_failure(what, e))
}

/// Whether the program has loaded libcuda (and the driver works): asked when a communicator is
/// made (`dlopen` with `RTLD_NOLOAD`, which never loads it), so the calls of a program without
/// CUDA never ask CUDA anything.
pub(crate) fn cuda_in_process() -> bool {
    // glibc's values (dlfcn.h); libloading names RTLD_LAZY but not RTLD_NOLOAD.
    const RTLD_LAZY: i32 = 0x1;
    const RTLD_NOLOAD: i32 = 0x4;
    // SAFETY: RTLD_NOLOAD only looks the library up among those already loaded: no initialiser
    // runs. Dropping the handle gives back the reference the lookup took.
    let found = unsafe {
        libloading::os::unix::Library::open(Some("libcuda.so.1"), RTLD_LAZY | RTLD_NOLOAD)
    };
    found.is_ok() && cuda::device_count().is_ok()
}

/// Whether a collective with a NULL stream on `entry` is on device memory: the program used
/// CUDA when the communicator was made and any buffer the call reads or writes is device
/// memory (then the call takes CUDA's default stream, and the device path refuses a host
/// buffer beside it as an invalid argument: taking the host path because the first buffer
/// was host memory had the host engine write into a device address).
pub(crate) fn default_stream_device(entry: &Entry, buffers: &Buffers) -> bool {
    if !entry.cuda {
        return false;
    }
    let on_device = |b: &Region| b.len > 0 && !b.ptr.is_null() && is_device(b.ptr);
    match buffers {
        Buffers::Shared(b) => on_device(b),
        Buffers::Apart { send, recv } => on_device(send) || on_device(recv),
    }
}

/// Whether the driver says `ptr` is device (or managed) memory.
pub(crate) fn is_device(ptr: *const c_void) -> bool {
    let mut kind: u32 = 0;
    // SAFETY: the driver is loaded and initialised (`cuda::device_count` succeeded before any
    // call here); the attribute is written as an unsigned int, which `kind` is. Any address may
    // be asked about.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut kind as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr as sys::CUdeviceptr,
        )
    };
    r == sys::CUresult::CUDA_SUCCESS
        && (kind == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
            || kind == sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32)
}

/// Whether `ptr` (of the argument `name`) is device memory with `len` bytes in its allocation;
/// a host buffer (pinned, registered or unknown to CUDA), or a length past the end of the
/// allocation (a count no buffer has: the call stages `len` bytes through host memory), is an
/// `oxcclInvalidArgument`. Where the driver does not say an allocation's extent, the length
/// is the caller's word.
fn device_memory(ptr: *const c_void, len: usize, name: &str) -> Result<(), Failure> {
    if is_device(ptr) {
        if let Some((start, size)) = allocation_of(ptr)
            && (ptr as usize)
                .checked_add(len)
                .is_none_or(|end| end > start.saturating_add(size))
        {
            return Err(Failure::invalid(format!(
                "{name}: {len} bytes at {ptr:p} run past the end of its device allocation \
                 ({size} bytes at {start:#x}): the count is larger than the buffer"
            )));
        }
        return Ok(());
    }
    Err(Failure {
        code: oxcclInvalidArgument,
        message: format!(
            "{name} ({ptr:p}) is not CUDA device memory, but the call is on device memory (a \
             CUDA stream, or another buffer on the device): pass host buffers with a NULL \
             stream"
        ),
    })
}

/// The (start, size in bytes) of the device allocation `ptr` lies in, where the driver says.
fn allocation_of(ptr: *const c_void) -> Option<(usize, usize)> {
    let (mut start, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: as in `is_device`; the range attributes are written as a CUdeviceptr and a
    // size_t, which `start` and `size` are.
    let ok = unsafe {
        sys::cuPointerGetAttribute(
            (&mut start as *mut sys::CUdeviceptr).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            ptr as sys::CUdeviceptr,
        ) == sys::CUresult::CUDA_SUCCESS
            && sys::cuPointerGetAttribute(
                (&mut size as *mut usize).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                ptr as sys::CUdeviceptr,
            ) == sys::CUresult::CUDA_SUCCESS
    };
    (ok && size > 0).then_some((start as usize, size))
}

/// The context `ptr` was allocated in: NULL for memory of no context (from a pool,
/// `cuMemAllocAsync`, or the virtual memory calls).
fn context_of(ptr: *const c_void) -> Result<sys::CUcontext, Failure> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: as in `is_device`; a context attribute is written as a CUcontext.
    check("cuPointerGetAttribute(CONTEXT)", unsafe {
        sys::cuPointerGetAttribute(
            (&mut ctx as *mut sys::CUcontext).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
            ptr as sys::CUdeviceptr,
        )
    })?;
    Ok(ctx)
}

/// The context a call's device work runs in, current on this thread until dropped (then the
/// thread's own is current again).
struct Pushed {
    /// The device whose primary context was retained for the call, released on drop.
    primary: Option<sys::CUdevice>,
}

impl Pushed {
    /// For a stream the caller gave, that stream's context. For CUDA's default stream (NULL),
    /// the thread's current context, else the context `ptr` was allocated in, else (memory from
    /// a pool, `cuMemAllocAsync`, or the virtual memory calls belongs to no context) the primary
    /// context of the device it is on.
    fn for_call(ptr: *const c_void, stream: sys::CUstream) -> Result<Pushed, Failure> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        if !stream.is_null() {
            // SAFETY: a stream handle of the caller's (the buffer contract); `ctx` is writable.
            check("cuStreamGetCtx", unsafe {
                sys::cuStreamGetCtx(stream, &mut ctx)
            })?;
        }
        if ctx.is_null() {
            // SAFETY: `ctx` is writable; NULL when the thread has no context.
            check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
        }
        if ctx.is_null() {
            ctx = context_of(ptr)?;
        }
        let mut primary = None;
        if ctx.is_null() {
            let mut ordinal: std::ffi::c_int = -1;
            // SAFETY: as above; the device ordinal is written as an int.
            check("cuPointerGetAttribute(DEVICE_ORDINAL)", unsafe {
                sys::cuPointerGetAttribute(
                    (&mut ordinal as *mut std::ffi::c_int).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    ptr as sys::CUdeviceptr,
                )
            })?;
            let mut dev: sys::CUdevice = 0;
            // SAFETY: writable out-parameters; the driver checks the ordinal.
            check("cuDeviceGet", unsafe {
                sys::cuDeviceGet(&mut dev, ordinal)
            })?;
            // SAFETY: as above; released in `drop` (or below, when the push fails).
            check("cuDevicePrimaryCtxRetain", unsafe {
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
            })?;
            primary = Some(dev);
        }
        let pushed = Pushed { primary };
        // SAFETY: a context the driver just named; popped in `drop`.
        if let Err(f) = check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) }) {
            if let Some(dev) = pushed.primary {
                // SAFETY: retained above, and nothing was pushed.
                let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
            }
            std::mem::forget(pushed);
            return Err(f);
        }
        Ok(pushed)
    }
}

impl Drop for Pushed {
    fn drop(&mut self) {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops what `for_call` pushed on this thread.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut ctx) };
        if let Some(dev) = self.primary {
            // SAFETY: retained by `for_call`, released once.
            let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
        }
    }
}

/// Device allocations of [`mem_alloc`] that [`mem_free`] has not freed yet: their addresses.
static DEVICE_ALLOCATED: std::sync::Mutex<std::collections::BTreeSet<usize>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// `ncclMemAlloc`'s memory where the program has loaded CUDA: `size` bytes of device memory
/// (`cuMemAlloc`) on the calling thread's current context, as NCCL's is on the current device;
/// where the thread has none, on device 0's primary context (retained for good, as CUDA's
/// runtime would). `None` where the program has not loaded CUDA, or there is no device (host
/// memory then).
pub(crate) fn mem_alloc(size: usize) -> Option<Result<*mut c_void, Failure>> {
    if !cuda_in_process() || !cuda::device_count().is_ok_and(|n| n > 0) {
        return None;
    }
    Some((|| {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is writable.
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
        let _pushed = if ctx.is_null() {
            let mut dev: sys::CUdevice = 0;
            // SAFETY: writable out-parameters; ordinal 0 exists (`cuda_in_process` counted
            // the devices).
            check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, 0) })?;
            // SAFETY: as above; never released (the allocation's context must outlive it).
            check("cuDevicePrimaryCtxRetain", unsafe {
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
            })?;
            // SAFETY: a context the driver just named; popped when `Pushed` drops.
            check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
            Some(Pushed { primary: None })
        } else {
            None
        };
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: a context is current; `p` is writable.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, size) }).map_err(|mut f| {
            if f.message.contains("OUT_OF_MEMORY") {
                f.code = oxcclSystemError;
            }
            f.message = format!("{size} bytes of device memory: {}", f.message);
            f
        })?;
        DEVICE_ALLOCATED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(p as usize);
        Ok(p as usize as *mut c_void)
    })())
}

/// Frees `ptr` when [`mem_alloc`] gave it (`cuMemFree`, in its context); `None` when it did not.
pub(crate) fn mem_free(ptr: *mut c_void) -> Option<Outcome> {
    let mine = DEVICE_ALLOCATED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&(ptr as usize));
    if !mine {
        return None;
    }
    Some((|| {
        // `cuMemAlloc`'s memory has a context.
        let ctx = context_of(ptr)?;
        // SAFETY: the context the driver just named; popped when `_ctx` drops.
        check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
        let _ctx = Pushed { primary: None };
        // SAFETY: allocated by `mem_alloc` and removed from its table, so freed once; the
        // caller guarantees nothing uses it any more.
        check("cuMemFree", unsafe {
            sys::cuMemFree_v2(ptr as sys::CUdeviceptr)
        })
    })())
}

/// Waits for `stream` for at most `timeout`: `oxcclTimeout` (naming `rank` and `what`) when
/// it ran out.
///
/// # Safety
///
/// `stream` is a stream of the current context (NULL: the default stream).
unsafe fn wait(
    stream: sys::CUstream,
    (rank, timeout): (usize, std::time::Duration),
    what: &str,
) -> Outcome {
    // SAFETY: the function's contract; the driver is loaded (a copy ran on the stream).
    let done = unsafe { cuda::wait_stream(stream, timeout) }.map_err(Failure::from)?;
    if done {
        return Ok(());
    }
    Err(Failure {
        code: oxcclTimeout,
        message: format!(
            "rank {rank}: {what} waited {timeout:?} for the CUDA stream (OXCCL_TIMEOUT)"
        ),
    })
}

/// Copies `len` bytes of device memory at `src` into a staging buffer (page-locked where the
/// driver gives it), on `stream` after its earlier work; returns once they are on the host, or
/// fails with `oxcclTimeout` when the stream has not got there within the communicator's
/// timeout (`rank` names it).
///
/// # Safety
///
/// `src` is device memory of at least `len` bytes (checked kind; the length is the caller's
/// contract), `stream` a stream of the current context.
unsafe fn download(
    src: *const c_void,
    len: usize,
    stream: sys::CUstream,
    deadline: (usize, std::time::Duration),
) -> Result<Staging, Failure> {
    // SAFETY: the driver is loaded (the caller checked the buffer with it); the buffer is
    // waited for below, or abandoned.
    let mut host = unsafe { Staging::new(len) };
    if len == 0 {
        return Ok(host);
    }
    // SAFETY: the function's contract; `host` holds `len` bytes.
    let copied = check("cuMemcpyDtoHAsync", unsafe {
        sys::cuMemcpyDtoHAsync_v2(
            host.as_mut_ptr().cast(),
            src as sys::CUdeviceptr,
            len,
            stream,
        )
    })
    // SAFETY: as above.
    .and_then(|()| unsafe { wait(stream, deadline, "the copy from the device") });
    match copied {
        Ok(()) => Ok(host),
        Err(f) => {
            host.abandon();
            Err(f)
        }
    }
}

/// Copies `host` to device memory at `dst` on `stream` and waits for the copy (at most the
/// communicator's timeout), so that the staging buffer may be reused.
///
/// # Safety
///
/// `dst` is device memory of at least `host.len()` bytes, `stream` a stream of the current
/// context.
unsafe fn upload(
    host: Staging,
    dst: *mut c_void,
    stream: sys::CUstream,
    deadline: (usize, std::time::Duration),
) -> Outcome {
    if host.is_empty() {
        return Ok(());
    }
    // SAFETY: the function's contract.
    let copied = check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(
            dst as sys::CUdeviceptr,
            host.as_ptr().cast(),
            host.len(),
            stream,
        )
    })
    // SAFETY: as above.
    .and_then(|()| unsafe { wait(stream, deadline, "the copy of the result to the device") });
    if copied.is_err() {
        host.abandon();
    }
    copied
}

/// Runs `plan` (its operator already applied; `premul` a pre-multiplied sum's scalar) on device
/// `buffers`, ordered on `stream` (NULL: CUDA's default stream).
pub(crate) fn collective(
    entry: &Arc<Entry>,
    plan: Plan,
    premul: Option<[u8; 8]>,
    buffers: Buffers,
    stream: oxcclStream_t,
) -> Outcome {
    let rank = entry.comm()?.rank();
    on_device_collective(entry, plan, premul, buffers, stream).map_err(|f| f.naming_rank(rank))
}

/// [`collective`], its failures not yet naming the rank.
fn on_device_collective(
    entry: &Arc<Entry>,
    plan: Plan,
    premul: Option<[u8; 8]>,
    buffers: Buffers,
    stream: oxcclStream_t,
) -> Outcome {
    let (stream, deadline) = device_call(entry, stream)?;
    if premul.is_none() && native(entry, plan, &buffers, stream)? {
        return Ok(());
    }
    match buffers {
        Buffers::Shared(buf) => {
            let (p, len) = buf.write()?;
            if len == 0 {
                return issue(entry, host_job(plan.in_place(true), &mut [], None, premul));
            }
            device_memory(p.cast(), len, buf.name)?;
            let _ctx = Pushed::for_call(p.cast(), stream)?;
            // SAFETY: `p` is device memory (checked) of `len` bytes (the caller's contract).
            let mut host = unsafe { download(p.cast(), len, stream, deadline) }?;
            issue(
                entry,
                host_job(plan.in_place(true), &mut host, None, premul),
            )?;
            if in_group() {
                hold(Held::back(host, p.cast(), stream, deadline));
                return Ok(());
            }
            // SAFETY: as above.
            unsafe { upload(host, p.cast(), stream, deadline) }
        }
        Buffers::Apart { send, recv } => {
            let (sp, slen) = send.read()?;
            let (rp, rlen) = recv.write()?;
            let mut first = None;
            if slen > 0 {
                device_memory(sp.cast(), slen, send.name)?;
                first = Some(sp.cast::<c_void>());
            }
            if rlen > 0 {
                device_memory(rp.cast_const().cast(), rlen, recv.name)?;
                first = first.or(Some(rp.cast_const().cast()));
            }
            // Host memory with a stream is named first; overlapping device buffers after.
            send.disjoint(&recv)?;
            let _ctx = first.map(|p| Pushed::for_call(p, stream)).transpose()?;
            // SAFETY: device memory (checked) of `slen` bytes (the caller's contract).
            let input = unsafe { download(sp.cast(), slen, stream, deadline) }?;
            // SAFETY: the driver is loaded (the buffers were checked with it); the buffer is
            // waited for by `upload`, or abandoned.
            let mut output = unsafe { Staging::new(rlen) };
            issue(entry, host_job(plan, &mut output, Some(&input), premul))?;
            if in_group() {
                hold(Held::input(input));
                hold(Held::back(output, rp.cast(), stream, deadline));
                return Ok(());
            }
            drop(input);
            // SAFETY: device memory (checked) of `rlen` bytes (the caller's contract).
            unsafe { upload(output, rp.cast(), stream, deadline) }
        }
    }
}

/// Runs `plan` on the device between the ranks' buffers when every rank of the communicator is
/// in this process (oxccl's `Communicator::device_deposit`): `Ok(true)` when it did (enqueued on
/// `stream`, or, inside a group, deposited and completed by `oxcclGroupEnd`), `Ok(false)` when
/// the call is to be staged through host memory.
fn native(
    entry: &Arc<Entry>,
    plan: Plan,
    buffers: &Buffers,
    stream: sys::CUstream,
) -> Result<bool, Failure> {
    let comm = entry.comm()?;
    if !comm.device_native() {
        return Ok(false);
    }
    let (plan, send, recv) = match buffers {
        Buffers::Shared(buf) => {
            let (p, len) = buf.write()?;
            if len > 0 {
                device_memory(p.cast(), len, buf.name)?;
            }
            (plan.in_place(true), p as u64, p as u64)
        }
        Buffers::Apart { send, recv } => {
            let (sp, slen) = send.read()?;
            let (rp, rlen) = recv.write()?;
            if slen > 0 {
                device_memory(sp.cast(), slen, send.name)?;
            }
            if rlen > 0 {
                device_memory(rp.cast_const().cast(), rlen, recv.name)?;
            }
            send.disjoint(recv)?;
            let s = if slen > 0 { sp as u64 } else { 0 };
            let r = if rlen > 0 { rp as u64 } else { 0 };
            (plan, s, r)
        }
    };
    let first = [send, recv].into_iter().find(|&p| p != 0).unwrap_or(0);
    let _ctx = Pushed::for_call(first as *const c_void, stream)?;
    // SAFETY: the buffers are device memory (checked) of the sizes the plan was made from (the
    // caller's contract), the stream's context is current; the call is completed below or, in
    // a group, by `oxcclGroupEnd`, as NCCL's contract keeps the buffers until then.
    let call = unsafe { comm.device_deposit(plan, send, recv, stream) }.map_err(Failure::from)?;
    let Some(call) = call else {
        return Ok(false);
    };
    if in_group() {
        hold(Held {
            host: None,
            back: None,
            native: Some((call, first, stream)),
        });
        return Ok(true);
    }
    call.complete().map_err(Failure::from)
}

/// A pre-multiplied sum's scalar of `dtype` in device memory at `at`: copied to the host on
/// `stream` (NULL: CUDA's default stream) after the stream's earlier work, as NCCL reads an
/// `ncclScalarDevice` scalar when the call runs; at most the communicator's timeout.
pub(crate) fn scalar_at(
    entry: &Arc<Entry>,
    at: usize,
    dtype: oxccl_core::DataType,
    stream: oxcclStream_t,
) -> Result<[u8; 8], Failure> {
    let rank = entry.comm()?.rank();
    (|| {
        let (stream, deadline) = device_call(entry, stream)?;
        let size = dtype.size();
        device_memory(at as *const c_void, size, "the operator's scalar")?;
        let _ctx = Pushed::for_call(at as *const c_void, stream)?;
        // SAFETY: device memory (checked) holding `size` bytes (checked where the driver says
        // the allocation's extent; the operator's contract otherwise).
        let host = unsafe { download(at as *const c_void, size, stream, deadline) }?;
        let mut v = [0u8; 8];
        v[..size].copy_from_slice(&host[..size]);
        Ok(v)
    })()
    .map_err(|f: Failure| f.naming_rank(rank))
}

/// The checks every call on device memory makes: a blocking communicator and a loaded driver.
/// Gives the stream as the driver's type and the deadline of the call's waits (the rank that
/// names a timeout, and the communicator's timeout).
fn device_call(
    entry: &Arc<Entry>,
    stream: oxcclStream_t,
) -> Result<(sys::CUstream, (usize, std::time::Duration)), Failure> {
    if !entry.blocking {
        return Err(Failure {
            code: oxcclInvalidUsage,
            message: "device buffers (a CUDA stream) on a non-blocking communicator are not \
                      supported yet"
                .into(),
        });
    }
    cuda::device_count().map_err(|e| cuda_failure("a CUDA stream was given", e))?;
    let c = entry.comm()?;
    Ok((stream as sys::CUstream, (c.rank(), c.timeout())))
}

/// Whether a send or receive of `len` bytes at `ptr` on `stream` is on device memory: a CUDA
/// stream was given, or CUDA's default stream (NULL) with device memory in a program that uses
/// CUDA (as for collectives).
pub(crate) fn on_device(
    entry: &Entry,
    ptr: *const c_void,
    len: usize,
    stream: oxcclStream_t,
) -> bool {
    !stream.is_null() || (entry.cuda && len > 0 && !ptr.is_null() && is_device(ptr))
}

/// A send (`send`) or receive of `len` bytes of device memory at `ptr` with `peer`, ordered on
/// `stream`, staged through host memory as collectives are: a send copies its bytes to the host
/// first (after the stream's earlier work), a receive copies what came back to the device and
/// waits for that copy. Inside a group the host copies are kept until `oxcclGroupEnd`, which
/// runs the group and then copies the received bytes to the device.
///
/// # Safety
///
/// `ptr` is device memory of `len` bytes (its kind is checked), `stream` a stream of the
/// caller's (NULL: the default stream).
pub(crate) unsafe fn message(
    entry: &Arc<Entry>,
    peer: usize,
    send: bool,
    buffer: (*mut c_void, usize, &str),
    stream: oxcclStream_t,
) -> Outcome {
    let rank = entry.comm()?.rank();
    // SAFETY: forwarded from the caller.
    unsafe { on_device_message(entry, peer, send, buffer, stream) }.map_err(|f| f.naming_rank(rank))
}

/// [`message`], its failures not yet naming the rank.
///
/// # Safety
///
/// As for [`message`].
unsafe fn on_device_message(
    entry: &Arc<Entry>,
    peer: usize,
    send: bool,
    (ptr, len, name): (*mut c_void, usize, &str),
    stream: oxcclStream_t,
) -> Outcome {
    let (stream, deadline) = device_call(entry, stream)?;
    let _ctx = if len > 0 {
        device_memory(ptr.cast_const(), len, name)?;
        Some(Pushed::for_call(ptr.cast_const(), stream)?)
    } else {
        None
    };
    let mut host = if send {
        // SAFETY: device memory (checked) of `len` bytes (the caller's contract).
        unsafe { download(ptr.cast_const(), len, stream, deadline) }?
    } else {
        // SAFETY: the driver is loaded (`device_call`); the buffer is waited for by `upload`,
        // or abandoned.
        unsafe { Staging::new(len) }
    };
    let job = Job::Message(oxccl_core::RawMessage {
        peer,
        send,
        ptr: host.as_mut_ptr(),
        len,
        tag: 0,
    });
    issue(entry, job)?;
    match (send, in_group()) {
        (true, true) => hold(Held::input(host)),
        (false, true) => hold(Held::back(host, ptr, stream, deadline)),
        (true, false) => {}
        // SAFETY: device memory (checked) of `len` bytes (the caller's contract).
        (false, false) => return unsafe { upload(host, ptr, stream, deadline) },
    }
    Ok(())
}

/// A host copy of device memory that an open group's kept operation uses, and where the result
/// goes back once the group has run (`None`: an input).
pub(crate) struct Held {
    host: Option<Staging>,
    back: Option<(*mut c_void, sys::CUstream, (usize, std::time::Duration))>,
    /// A call run on the device (`native`): completed at the group's end, in the context of
    /// its first buffer and stream.
    native: Option<(oxccl_core::NativeCall, u64, sys::CUstream)>,
}

impl Held {
    fn back(
        host: Staging,
        dst: *mut c_void,
        stream: sys::CUstream,
        deadline: (usize, std::time::Duration),
    ) -> Held {
        Held {
            host: Some(host),
            back: Some((dst, stream, deadline)),
            native: None,
        }
    }

    fn input(host: Staging) -> Held {
        Held {
            host: Some(host),
            back: None,
            native: None,
        }
    }
}

/// Copies a group's held results to the device, each on its stream in its buffer's context,
/// waiting for each; the first failure is returned after all were tried.
pub(crate) fn put_back(held: Vec<Held>) -> Outcome {
    let mut first = Ok(());
    for Held { host, back, native } in held {
        if let Some((call, ptr, stream)) = native {
            // Completed whatever happened to the group: other ranks' kernels may be enqueued
            // on this rank's buffers, and its stream must wait for them.
            let r = Pushed::for_call(ptr as *const c_void, stream).and_then(|ctx| {
                let r = match call.complete() {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(Failure {
                        code: oxcclInvalidUsage,
                        message: "a collective on device memory inside a group that the \
                                  ranks' device group must stage (their streams of different \
                                  CUDA contexts, or an in-place all-to-all): not supported yet"
                            .into(),
                    }),
                    Err(e) => Err(Failure::from(e)),
                };
                drop(ctx);
                r
            });
            if first.is_ok() {
                first = r;
            }
            continue;
        }
        let Some(host) = host else {
            continue;
        };
        // An input, or an empty result (a non-root's receive buffer, maybe NULL): nothing to
        // copy, and no context to look for.
        let Some((dst, stream, deadline)) = back.filter(|_| !host.is_empty()) else {
            continue;
        };
        let r = Pushed::for_call(dst.cast_const(), stream)
            .and_then(|ctx| {
                // SAFETY: `dst` was checked to be device memory of `host.len()` bytes when the
                // call was made, and the caller keeps it until the group ends (NCCL's contract).
                let r = unsafe { upload(host, dst, stream, deadline) };
                drop(ctx);
                r
            })
            .map_err(|f| f.naming_rank(deadline.0));
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// Completes a failed group's device collectives (each in its context, as [`put_back`] does)
/// and drops its staged copies without copying them back: whether there were any.
pub(crate) fn complete_native(held: Vec<Held>) -> bool {
    let native: Vec<Held> = held.into_iter().filter(|h| h.native.is_some()).collect();
    let any = !native.is_empty();
    let _ = put_back(native);
    any
}

/// The host job over the staging buffers: `input` None means in place in `output`.
fn host_job(plan: Plan, output: &mut [u8], input: Option<&[u8]>, premul: Option<[u8; 8]>) -> Job {
    let out = if output.is_empty() {
        (std::ptr::null_mut(), 0)
    } else {
        (output.as_mut_ptr(), output.len())
    };
    let input = match input {
        None => (out.0.cast_const(), out.1),
        Some([]) => (std::ptr::null(), 0),
        Some(i) => (i.as_ptr(), i.len()),
    };
    Job::Collective {
        plan,
        input,
        output: out,
        premul,
    }
}
