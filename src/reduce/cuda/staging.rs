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
//! freed. The memory is this library's own (page-aligned heap memory), page-locked with
//! `cuMemHostRegister`, not memory the driver allocates (`cuMemHostAlloc`): that belongs to a
//! context and is freed with it, so a program that drops or resets its last context
//! (`cudaDeviceReset`, the last cudarc `CudaContext`) would leave the pool holding freed memory.
//! A registration that goes with its context leaves ordinary host memory, which the driver then
//! copies the slower pageable way; where registering fails (no context current, say) the buffer
//! is used unregistered the same way.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

use cudarc::driver::sys;

/// The most page-locked bytes the pool keeps for reuse.
pub const POOL_LIMIT: usize = 2 << 30;

/// The smallest capacity handed out, so that small calls share buffers.
const MIN_CAPACITY: usize = 64 << 10;

/// Buffers not in use: (address, capacity, registered).
static POOL: Mutex<Vec<(usize, usize, bool)>> = Mutex::new(Vec::new());

/// Alignment of the buffers: a page (what registration pins).
const ALIGN: usize = 4096;

/// A host buffer of `len` bytes for staging device data, page-locked where the driver allows.
/// Its bytes are initialised (zeros when new, else what its last user left).
#[derive(Debug)]
pub struct Staging {
    /// `capacity` bytes from the global allocator with [`ALIGN`] (dangling when 0).
    ptr: NonNull<u8>,
    capacity: usize,
    registered: bool,
    len: usize,
}

// SAFETY: the buffer is owned memory like a Vec's; nothing else refers to it while it is
// handed out (the pool holds only buffers not in use).
unsafe impl Send for Staging {}

impl Staging {
    /// A buffer of `len` bytes, from the pool where one of its capacity is free, else newly
    /// allocated and registered with the driver (`cuMemHostRegister`, portable to every
    /// context).
    ///
    /// # Safety
    ///
    /// The driver is loaded ([`super::device_count`] succeeded). Device copies enqueued from or
    /// into the buffer must have finished before it is dropped (or [`Staging::abandon`] is
    /// called instead): it goes back to the pool, and another caller writes it.
    pub unsafe fn new(len: usize) -> Staging {
        let Some(capacity) = (len > 0)
            .then(|| len.checked_next_power_of_two())
            .flatten()
            .map(|c| c.max(MIN_CAPACITY))
        else {
            // Empty, or too large to round (an allocation of that size fails anyway).
            return Staging::plain(len);
        };
        let reused = {
            let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
            pool.iter()
                .position(|&(_, c, _)| c == capacity)
                .map(|i| pool.swap_remove(i))
        };
        if let Some((addr, capacity, registered)) = reused
            && let Some(ptr) = NonNull::new(addr as *mut u8)
        {
            return Staging {
                ptr,
                capacity,
                registered,
                len,
            };
        }
        let Ok(layout) = Layout::from_size_align(capacity, ALIGN) else {
            return Staging::plain(len);
        };
        // SAFETY: the layout's size is not zero.
        let Some(ptr) = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }) else {
            std::alloc::handle_alloc_error(layout);
        };
        // SAFETY: `capacity` bytes of this buffer's own; the driver is loaded (the caller's
        // contract). Without a current context the driver refuses, and the buffer stays
        // pageable.
        let registered = unsafe {
            sys::cuMemHostRegister_v2(
                ptr.as_ptr().cast(),
                capacity,
                sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        } == sys::CUresult::CUDA_SUCCESS;
        Staging {
            ptr,
            capacity,
            registered,
            len,
        }
    }

    /// An unpooled buffer of `len` bytes: empty, or for a length no capacity can hold.
    fn plain(len: usize) -> Staging {
        if len == 0 {
            return Staging {
                ptr: NonNull::dangling(),
                capacity: 0,
                registered: false,
                len,
            };
        }
        let layout = Layout::from_size_align(len, ALIGN)
            .unwrap_or_else(|_| panic!("a staging buffer of {len} bytes cannot be laid out"));
        // SAFETY: the layout's size is not zero.
        let Some(ptr) = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }) else {
            std::alloc::handle_alloc_error(layout);
        };
        Staging {
            ptr,
            capacity: len,
            registered: false,
            len,
        }
    }

    /// Whether the buffer was page-locked (registered with the driver) when it was allocated.
    pub fn is_locked(&self) -> bool {
        self.registered
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
        // SAFETY: `len` ≤ `capacity` initialised bytes owned by this buffer (dangling and empty
        // when 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Staging {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.capacity == 0 {
            return;
        }
        let pooled = self.capacity >= MIN_CAPACITY && self.capacity.is_power_of_two();
        if pooled {
            let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
            let kept: usize = pool.iter().map(|&(_, c, _)| c).sum();
            if kept + self.capacity <= POOL_LIMIT {
                pool.push((self.ptr.as_ptr() as usize, self.capacity, self.registered));
                return;
            }
        }
        if self.registered {
            // SAFETY: registered by `new`; no copy uses it any more (the contract of `new`). A
            // registration gone with its context makes this fail, which changes nothing.
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr.as_ptr().cast()) };
        }
        // SAFETY: allocated by `new` or `plain` with this layout (capacity, ALIGN), not in the
        // pool, freed once.
        unsafe {
            std::alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.capacity, ALIGN),
            )
        };
    }
}
