//! Page-locked host memory for staging device data through the host (the device paths of
//! `comm::device` and of the C ABI).
//!
//! The driver moves page-locked memory by DMA at the bus's rate. A copy from pageable memory
//! goes through the driver's own bounce buffer instead, and a fresh `Vec` per call also pays a
//! page fault per page on every call (measured on an H200 machine, 2026-11-27: a 128 MiB
//! all-reduce of 2 ranks on one GPU took 297 ms staged through fresh `Vec`s).
//!
//! Buffers are kept in a process-wide pool and reused, their capacities rounded up to a power
//! of two. The pool keeps at most [`POOL_LIMIT`] bytes; a buffer given back beyond that is
//! freed. Where page-locked memory cannot be had (the driver refuses, or no context is current),
//! a heap buffer stands in: slower, with the same results.

use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

use cudarc::driver::sys;

/// The most page-locked bytes the pool keeps for reuse.
pub const POOL_LIMIT: usize = 2 << 30;

/// The smallest capacity handed out, so that small calls share buffers.
const MIN_CAPACITY: usize = 64 << 10;

/// Page-locked buffers not in use: (address, capacity).
static POOL: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// A host buffer of `len` bytes for staging device data, page-locked where the driver gives
/// such memory. Its bytes are initialised (zeros when new, else what its last user left).
#[derive(Debug)]
pub struct Staging {
    mem: Mem,
    len: usize,
}

#[derive(Debug)]
enum Mem {
    Locked { ptr: NonNull<u8>, capacity: usize },
    Heap(Vec<u8>),
}

// SAFETY: the buffer is owned memory like a Vec's; nothing else refers to it while it is
// handed out (the pool holds only buffers not in use).
unsafe impl Send for Staging {}

impl Staging {
    /// A buffer of `len` bytes, from the pool where one is large enough, else newly allocated
    /// (`cuMemHostAlloc`, portable to every context), else from the heap.
    ///
    /// # Safety
    ///
    /// The driver is loaded ([`super::device_count`] succeeded). Device copies enqueued from or
    /// into the buffer must have finished before it is dropped (or [`Staging::abandon`] is
    /// called instead): it goes back to the pool, and another caller writes it.
    pub unsafe fn new(len: usize) -> Staging {
        if len == 0 {
            return Staging {
                mem: Mem::Heap(Vec::new()),
                len,
            };
        }
        let Some(capacity) = len.checked_next_power_of_two().map(|c| c.max(MIN_CAPACITY)) else {
            return Staging::heap(len);
        };
        let reused = {
            let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
            pool.iter()
                .position(|&(_, c)| c == capacity)
                .map(|i| pool.swap_remove(i))
        };
        if let Some((addr, capacity)) = reused
            && let Some(ptr) = NonNull::new(addr as *mut u8)
        {
            return Staging {
                mem: Mem::Locked { ptr, capacity },
                len,
            };
        }
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `p` is writable; the driver is loaded (the caller's contract). Without a
        // current context the driver fails, and the heap stands in.
        let r = unsafe { sys::cuMemHostAlloc(&mut p, capacity, sys::CU_MEMHOSTALLOC_PORTABLE) };
        match NonNull::new(p.cast::<u8>()) {
            Some(ptr) if r == sys::CUresult::CUDA_SUCCESS => {
                // SAFETY: `capacity` bytes the driver just allocated, not yet shared; zeroed so
                // that every byte a slice shows is initialised.
                unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, capacity) };
                Staging {
                    mem: Mem::Locked { ptr, capacity },
                    len,
                }
            }
            _ => Staging::heap(len),
        }
    }

    fn heap(len: usize) -> Staging {
        Staging {
            mem: Mem::Heap(vec![0; len]),
            len,
        }
    }

    /// Whether the buffer is page-locked (else it is on the heap).
    pub fn is_locked(&self) -> bool {
        matches!(self.mem, Mem::Locked { .. })
    }

    /// Gives the buffer up without reusing or freeing it: for a buffer a device copy may still
    /// use (a wait for it ran out of time). A leak, in exchange for no race.
    pub fn abandon(self) {
        std::mem::forget(self);
    }
}

impl std::ops::Deref for Staging {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.mem {
            // SAFETY: `len` ≤ `capacity` initialised bytes, owned by this buffer.
            Mem::Locked { ptr, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), self.len)
            },
            Mem::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for Staging {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            // SAFETY: as in `deref`, borrowed mutably through `self`.
            Mem::Locked { ptr, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), self.len)
            },
            Mem::Heap(v) => v,
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let Mem::Locked { ptr, capacity } = self.mem else {
            return;
        };
        let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
        let kept: usize = pool.iter().map(|&(_, c)| c).sum();
        if kept + capacity <= POOL_LIMIT {
            pool.push((ptr.as_ptr() as usize, capacity));
            return;
        }
        drop(pool);
        // SAFETY: allocated by cuMemHostAlloc, not in the pool, and no copy uses it any more
        // (the contract of `new`). A failure leaves it allocated.
        let _ = unsafe { sys::cuMemFreeHost(ptr.as_ptr().cast()) };
    }
}
