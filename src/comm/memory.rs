//! Registering a caller's memory with the communicator's links (nccl.h's `ncclCommRegister`):
//! sends out of registered memory then go without a copy where the transport can (rdma: the
//! device reads the caller's memory instead of a staging copy). Shared memory and TCP need no
//! registration and ignore it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::{Communicator, Inner};
use crate::error::Result;

/// Registration ids, unique in the process (so one from another communicator matches nothing).
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Memory registered with a communicator ([`Communicator::register`]); dropping it (or
/// [`Communicator::deregister`]) ends the registration, after which the links no longer read
/// the memory.
#[derive(Debug)]
pub struct Registration {
    id: u64,
    ptr: usize,
    len: usize,
    inner: Weak<Inner>,
}

impl Registration {
    /// The registered bytes: start address and length.
    pub fn range(&self) -> (usize, usize) {
        (self.ptr, self.len)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.lock().engine.deregister(self.id);
        }
    }
}

impl Communicator {
    /// Registers `len` bytes at `ptr` with this communicator's links, for sends from that
    /// memory without a copy where the transport can (rdma). Worth it for buffers used by many
    /// calls: registering pins the pages and costs system calls. The registration ends when the
    /// returned [`Registration`] is dropped or passed to [`Communicator::deregister`].
    ///
    /// # Safety
    ///
    /// The memory stays mapped and readable until the registration ends (or the communicator
    /// is dropped): a device may read it for any send out of it, and a registration that
    /// outlives its memory would let it read the old pages for a new buffer at the same
    /// address. Its contents may change freely between calls.
    pub unsafe fn register(&self, ptr: *const u8, len: usize) -> Result<Registration> {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's promise, passed on: the registration ends (deregister in
        // `Registration::drop`) before the memory may go.
        unsafe { self.inner.lock().engine.register(id, ptr, len)? };
        Ok(Registration {
            id,
            ptr: ptr as usize,
            len,
            inner: Arc::downgrade(&self.inner),
        })
    }

    /// Ends `registration` (as dropping it does); on return no link reads its memory.
    pub fn deregister(&self, registration: Registration) {
        drop(registration);
    }
}
