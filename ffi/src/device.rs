//! CUDA device memory through a collective's stream argument: with a non-NULL
//! `cudaStream_t`, the buffers must be device memory (checked with `cuPointerGetAttribute`; a
//! host buffer with a stream is `oxcclInvalidArgument`), and the call stages them through host
//! memory as the Rust API's `*_device` methods do: it copies what the call reads from the
//! device on that stream (after everything the stream already holds), runs the collective on
//! the host engine, and enqueues the copy of the result back on the stream, so the stream's
//! later work sees it. The call returns once that copy is enqueued.
//!
//! A NULL stream is CUDA's default stream where the program uses CUDA (it had loaded libcuda
//! when it made the communicator) and the first buffer is device memory, as NCCL programs pass
//! it; otherwise it means host memory, and nothing asks CUDA about the buffers.
//!
//! Not yet: device buffers inside `oxcclGroupStart`/`oxcclGroupEnd` or on a non-blocking
//! communicator (`oxcclInvalidUsage`, saying so), and point-to-point calls with a stream.

use std::ffi::c_void;
use std::sync::Arc;

use oxccl_core::algo::Plan;
use oxccl_core::reduce::cuda::{self, cudarc::driver::sys};

use crate::abi::*;
use crate::boundary::{Failure, Outcome};
use crate::collectives::Buffers;
use crate::dispatch::{Job, in_group, issue};
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
/// CUDA when the communicator was made and the first buffer the call reads or writes is device
/// memory (then the call takes CUDA's default stream).
pub(crate) fn default_stream_device(entry: &Entry, buffers: &Buffers) -> bool {
    if !entry.cuda {
        return false;
    }
    let first = match buffers {
        Buffers::Shared(b) => (b.len > 0).then_some(b.ptr),
        Buffers::Apart { send, recv } => [send, recv]
            .into_iter()
            .find(|r| r.len > 0 && !r.ptr.is_null())
            .map(|r| r.ptr),
    };
    match first {
        Some(p) if !p.is_null() => is_device(p),
        _ => false,
    }
}

/// Whether the driver says `ptr` is device (or managed) memory.
fn is_device(ptr: *const c_void) -> bool {
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

/// Whether `ptr` (of the argument `name`) is device memory; a host buffer (pinned, registered or
/// unknown to CUDA) is an `oxcclInvalidArgument`.
fn device_memory(ptr: *const c_void, name: &str) -> Result<(), Failure> {
    if is_device(ptr) {
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

/// The context a device buffer belongs to, current on this thread until dropped.
struct Pushed;

impl Pushed {
    fn context_of(ptr: *const c_void) -> Result<Pushed, Failure> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: as in `device_memory`; a context attribute is a CUcontext.
        check("cuPointerGetAttribute(CONTEXT)", unsafe {
            sys::cuPointerGetAttribute(
                (&mut ctx as *mut sys::CUcontext).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
                ptr as sys::CUdeviceptr,
            )
        })?;
        // SAFETY: a context the driver just named; popped in `drop`.
        check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
        Ok(Pushed)
    }
}

impl Drop for Pushed {
    fn drop(&mut self) {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops what `context_of` pushed on this thread.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut ctx) };
    }
}

/// Copies `len` bytes of device memory at `src` into a new host buffer, on `stream` after its
/// earlier work; returns once they are on the host, or fails with `oxcclTimeout` when the stream
/// has not got there within the communicator's timeout (`rank` names it).
///
/// # Safety
///
/// `src` is device memory of at least `len` bytes (checked kind; the length is the caller's
/// contract), `stream` a stream of the current context.
unsafe fn download(
    src: *const c_void,
    len: usize,
    stream: sys::CUstream,
    (rank, timeout): (usize, std::time::Duration),
) -> Result<Vec<u8>, Failure> {
    let mut host = vec![0u8; len];
    if len > 0 {
        // SAFETY: the function's contract; `host` holds `len` bytes.
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                host.as_mut_ptr().cast(),
                src as sys::CUdeviceptr,
                len,
                stream,
            )
        })?;
        // SAFETY: a stream of the current context; the driver is loaded.
        let done = unsafe { cuda::wait_stream(stream, timeout) }.map_err(Failure::from)?;
        if !done {
            return Err(Failure {
                code: oxcclTimeout,
                message: format!(
                    "rank {rank}: the copy from the device waited {timeout:?} for the CUDA \
                     stream's earlier work (OXCCL_TIMEOUT)"
                ),
            });
        }
    }
    Ok(host)
}

/// Enqueues the copy of `host` to device memory at `dst` on `stream`. From pageable memory the
/// driver returns once it has taken the bytes, so `host` may go afterwards.
///
/// # Safety
///
/// `dst` is device memory of at least `host.len()` bytes, `stream` a stream of the current
/// context.
unsafe fn upload(host: &[u8], dst: *mut c_void, stream: sys::CUstream) -> Outcome {
    if host.is_empty() {
        return Ok(());
    }
    // SAFETY: the function's contract.
    check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(
            dst as sys::CUdeviceptr,
            host.as_ptr().cast(),
            host.len(),
            stream,
        )
    })
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
    if in_group() || !entry.blocking {
        return Err(Failure {
            code: oxcclInvalidUsage,
            message: "device buffers (a CUDA stream) inside a group or on a non-blocking \
                      communicator are not supported yet"
                .into(),
        });
    }
    cuda::device_count().map_err(|e| cuda_failure("a CUDA stream was given", e))?;
    let stream = stream as sys::CUstream;
    let (rank, timeout) = {
        let c = entry.comm()?;
        (c.rank(), c.timeout())
    };
    match buffers {
        Buffers::Shared(buf) => {
            let (p, len) = buf.write()?;
            if len == 0 {
                return issue(entry, host_job(plan.in_place(true), &mut [], None, premul));
            }
            device_memory(p.cast(), buf.name)?;
            let _ctx = Pushed::context_of(p.cast())?;
            // SAFETY: `p` is device memory (checked) of `len` bytes (the caller's contract).
            let mut host = unsafe { download(p.cast(), len, stream, (rank, timeout)) }?;
            issue(
                entry,
                host_job(plan.in_place(true), &mut host, None, premul),
            )?;
            // SAFETY: as above.
            unsafe { upload(&host, p.cast(), stream) }
        }
        Buffers::Apart { send, recv } => {
            send.disjoint(&recv)?;
            let (sp, slen) = send.read()?;
            let (rp, rlen) = recv.write()?;
            let mut first = None;
            if slen > 0 {
                device_memory(sp.cast(), send.name)?;
                first = Some(sp.cast::<c_void>());
            }
            if rlen > 0 {
                device_memory(rp.cast_const().cast(), recv.name)?;
                first = first.or(Some(rp.cast_const().cast()));
            }
            let _ctx = first.map(Pushed::context_of).transpose()?;
            // SAFETY: device memory (checked) of `slen` bytes (the caller's contract).
            let input = unsafe { download(sp.cast(), slen, stream, (rank, timeout)) }?;
            let mut output = vec![0u8; rlen];
            issue(entry, host_job(plan, &mut output, Some(&input), premul))?;
            // SAFETY: device memory (checked) of `rlen` bytes (the caller's contract).
            unsafe { upload(&output, rp.cast(), stream) }
        }
    }
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
