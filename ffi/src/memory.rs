//! Memory calls: `oxcclMemAlloc`/`oxcclMemFree` hand out page-aligned host memory, and
//! registrations (`oxcclCommRegister`, `oxcclCommWindowRegister`) register the memory with the
//! communicator's links ([`Communicator::register`]): sends out of it then go without a copy
//! where the transport can (rdma); shared memory and TCP need nothing and only keep the handle
//! to check it at deregistration.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, PoisonError};

use crate::abi::*;
use crate::boundary::{Failure, Region, guard, non_null};
use crate::collectives::Buffers;
use crate::handles;

/// Alignment of `oxcclMemAlloc`'s memory: a page.
const ALIGN: usize = 4096;

/// Live allocations: address → layout.
static ALLOCATED: Mutex<BTreeMap<usize, Layout>> = Mutex::new(BTreeMap::new());

/// Allocates `size` bytes of host memory, aligned to a page, in `*ptr`; free it with
/// `oxcclMemFree`. The memory is not initialized.
///
/// # Safety
///
/// `ptr` is NULL (an error) or valid for writing one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclMemAlloc(ptr: *mut *mut c_void, size: usize) -> oxcclResult_t {
    guard("oxcclMemAlloc", || {
        non_null(ptr, "ptr")?;
        let p = host_alloc(size)?;
        // SAFETY: not NULL, and the caller guarantees it is writable.
        unsafe { ptr.write(p) };
        Ok(())
    })
}

/// `size` page-aligned bytes of host memory, recorded for `oxcclMemFree`.
fn host_alloc(size: usize) -> Result<*mut c_void, Failure> {
    if size == 0 {
        return Err(Failure::invalid("size: 0 bytes"));
    }
    let layout = Layout::from_size_align(size, ALIGN)
        .map_err(|_| Failure::invalid(format!("size: {size} bytes cannot be allocated")))?;
    // SAFETY: the layout's size is not zero.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        return Err(Failure {
            code: oxcclSystemError,
            message: format!("out of memory allocating {size} bytes"),
        });
    }
    ALLOCATED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(p as usize, layout);
    Ok(p.cast())
}

/// The drop-in libnccl's `ncclMemAlloc`: as NCCL's, device memory where the program uses CUDA
/// (it has loaded libcuda): on the calling thread's current context, or device 0's primary
/// context where it has none. In a program without CUDA, host memory as `oxcclMemAlloc`'s.
/// Free it with [`nccl_mem_free`].
///
/// # Safety
///
/// As `oxcclMemAlloc`.
#[doc(hidden)]
pub unsafe fn nccl_mem_alloc(ptr: *mut *mut c_void, size: usize) -> oxcclResult_t {
    guard("ncclMemAlloc", || {
        non_null(ptr, "ptr")?;
        if size == 0 {
            return Err(Failure::invalid("size: 0 bytes"));
        }
        let p = match crate::device::mem_alloc(size) {
            Some(device) => device?,
            None => host_alloc(size)?,
        };
        // SAFETY: not NULL, and the caller guarantees it is writable.
        unsafe { ptr.write(p) };
        Ok(())
    })
}

/// The drop-in libnccl's `ncclMemFree`: frees memory of [`nccl_mem_alloc`], on the device or
/// the host; NULL is ignored, any other pointer is an error.
///
/// # Safety
///
/// As `oxcclMemFree`.
#[doc(hidden)]
pub unsafe fn nccl_mem_free(ptr: *mut c_void) -> oxcclResult_t {
    if let Some(outcome) = crate::device::mem_free(ptr) {
        return guard("ncclMemFree", || outcome);
    }
    // SAFETY: the caller's contract, oxcclMemFree's.
    unsafe { oxcclMemFree(ptr) }
}

/// Frees memory from `oxcclMemAlloc`; NULL is ignored, any other pointer is an error.
///
/// # Safety
///
/// No operation still uses the memory, and nothing touches it afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclMemFree(ptr: *mut c_void) -> oxcclResult_t {
    guard("oxcclMemFree", || {
        if ptr.is_null() {
            return Ok(());
        }
        let layout = ALLOCATED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(ptr as usize))
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "ptr ({ptr:p}) did not come from oxcclMemAlloc, or was freed already"
                ))
            })?;
        // SAFETY: allocated by oxcclMemAlloc with this layout, and removed from the table, so
        // freed once; the caller guarantees nothing uses it any more.
        unsafe { std::alloc::dealloc(ptr.cast(), layout) };
        Ok(())
    })
}

/// Registers `size` bytes at `buff` with `comm` and returns its handle.
///
/// # Safety
///
/// The memory stays mapped and readable until the registration ends (deregistration or the
/// communicator's destruction).
unsafe fn register(comm: oxcclComm_t, buff: *mut c_void, size: usize) -> Result<usize, Failure> {
    let entry = handles::get(comm, "comm")?;
    let c = entry.comm()?;
    if size > 0 {
        non_null(buff, "buff")?;
    }
    (buff as usize)
        .checked_add(size)
        .ok_or_else(|| Failure::invalid(format!("size: {size} bytes at {buff:p} wrap around")))?;
    // Host memory must be this process's, all of it: a size larger than the buffer would
    // otherwise be pinned (rdma) or trusted as is. Device memory is the driver's to check.
    let region = || Region::new(buff.cast_const(), size, "buff");
    if !crate::device::default_stream_device(&entry, &Buffers::Shared(region())) {
        region().all_mapped()?;
    }
    // SAFETY: the caller's promise, passed on; the registration ends when it is dropped
    // (deregistration, or with the entry).
    let registration = unsafe { c.register(buff.cast_const().cast(), size) }?;
    let id = handles::fresh_id();
    entry
        .registered
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id, registration);
    Ok(id)
}

/// Forgets registration `id` of `comm`.
fn deregister(comm: oxcclComm_t, id: usize, what: &str) -> Result<(), Failure> {
    let entry = handles::get(comm, "comm")?;
    entry
        .registered
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&id)
        .map(|_| ())
        .ok_or_else(|| {
            Failure::invalid(format!(
                "{what} ({id:#x}) is not a registration of this comm (or was deregistered)"
            ))
        })
}

/// Registers `size` bytes at `buff` with `comm` (nccl.h's `ncclCommRegister`) and writes a
/// handle to `*handle`. Over rdma links, sends out of registered memory go without a copy
/// (registering pins the pages); shared memory and TCP need no registration.
///
/// # Safety
///
/// `handle` is NULL (an error) or valid for writing one pointer; the `size` bytes at `buff`
/// stay mapped until `oxcclCommDeregister` of the handle (or the communicator's destruction)
/// returns.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommRegister(
    comm: oxcclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> oxcclResult_t {
    guard("oxcclCommRegister", || {
        non_null(handle, "handle")?;
        // SAFETY: the caller keeps the memory mapped until the registration ends.
        let id = unsafe { register(comm, buff, size) }?;
        // SAFETY: not NULL, and the caller guarantees it is writable.
        unsafe { handle.write(std::ptr::without_provenance_mut(id)) };
        Ok(())
    })
}

/// Ends a registration of `oxcclCommRegister`.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclCommDeregister(comm: oxcclComm_t, handle: *mut c_void) -> oxcclResult_t {
    guard("oxcclCommDeregister", || {
        deregister(comm, handle as usize, "handle")
    })
}

/// nccl.h's `NCCL_WIN_DEFAULT`.
pub const OXCCL_WIN_DEFAULT: c_int = 0;
/// nccl.h's `NCCL_WIN_COLL_SYMMETRIC`: every rank registers a buffer of the same size.
pub const OXCCL_WIN_COLL_SYMMETRIC: c_int = 1;

/// Registers `size` bytes at `buff` as a window of `comm` (nccl.h's `ncclCommWindowRegister`,
/// called by every rank) and writes its handle to `*win`. Registered as by
/// `oxcclCommRegister`; `winFlags` is `OXCCL_WIN_DEFAULT` or `OXCCL_WIN_COLL_SYMMETRIC`.
///
/// # Safety
///
/// `win` is NULL (an error) or valid for writing one `oxcclWindow_t`; the memory stays mapped
/// until `oxcclCommWindowDeregister` (or the communicator's destruction) returns.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommWindowRegister(
    comm: oxcclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut oxcclWindow_t,
    winFlags: c_int,
) -> oxcclResult_t {
    guard("oxcclCommWindowRegister", || {
        non_null(win, "win")?;
        if winFlags != OXCCL_WIN_DEFAULT && winFlags != OXCCL_WIN_COLL_SYMMETRIC {
            return Err(Failure::invalid(format!(
                "winFlags: {winFlags} is not OXCCL_WIN_DEFAULT (0) or \
                 OXCCL_WIN_COLL_SYMMETRIC (1)"
            )));
        }
        // SAFETY: the caller keeps the memory mapped until the registration ends.
        let id = unsafe { register(comm, buff, size) }?;
        // SAFETY: not NULL, and the caller guarantees it is writable.
        unsafe { win.write(std::ptr::without_provenance_mut(id)) };
        Ok(())
    })
}

/// Ends a registration of `oxcclCommWindowRegister`.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclCommWindowDeregister(
    comm: oxcclComm_t,
    win: oxcclWindow_t,
) -> oxcclResult_t {
    guard("oxcclCommWindowDeregister", || {
        deregister(comm, win as usize, "win")
    })
}

/// The drop-in libnccl's answer to a function of NCCL after 2.27 that it exports but does not
/// implement (`name`): `oxcclInvalidUsage`, and a last error saying so. Programs built against a
/// newer NCCL (PyTorch's libtorch_cuda) reference these, so the library must define them to be
/// loaded in NVIDIA's place at all.
#[doc(hidden)]
pub fn nccl_unsupported(name: &str) -> oxcclResult_t {
    guard(name, || {
        Err(Failure::usage(
            "a function of NCCL after 2.27 that oxccl's libnccl.so.2 (NCCL 2.27.5's API) does \
             not implement",
        ))
    })
}
