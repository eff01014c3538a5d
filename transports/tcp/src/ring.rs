//! A receive ring mapped twice, back to back, so that any run of up to `capacity` bytes starting
//! anywhere in it is contiguous in memory: a lent message never straddles the wrap, and a read
//! into the free space is always one buffer.
//!
//! This module only owns the mapping; it keeps no positions and knows nothing of frames. It must
//! not hand out memory outside the mapping: every pointer it returns is `base + (pos % cap)`
//! with room for `cap` bytes after it.

use std::ffi::c_void;
use std::io;
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, ftruncate, memfd_create};
use rustix::mm::{MapFlags, ProtFlags, mmap, mmap_anonymous, munmap};

/// A double-mapped ring of `cap` bytes (`2 * cap` bytes of address space).
#[derive(Debug)]
pub(crate) struct Ring {
    base: NonNull<u8>,
    cap: usize,
}

// SAFETY: the ring exclusively owns its mapping; nothing about it is tied to the creating thread.
unsafe impl Send for Ring {}

impl Ring {
    /// A ring of at least `min_cap` bytes, rounded up to whole pages.
    pub(crate) fn new(min_cap: usize) -> io::Result<Ring> {
        let page = rustix::param::page_size();
        let cap = min_cap
            .max(1)
            .checked_next_multiple_of(page)
            .filter(|c| c.checked_mul(2).is_some())
            .ok_or_else(|| io::Error::other(format!("receive ring of {min_cap} bytes")))?;
        let fd = memfd_create("oxccl-tcp-ring", MemfdFlags::CLOEXEC)?;
        ftruncate(&fd, cap as u64)?;
        // SAFETY: a fresh anonymous reservation at an address the kernel picks; it overlaps no
        // existing memory, and it is inaccessible until the two views below replace it.
        let base = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                2 * cap,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )?
        };
        let ring = Ring {
            // mmap never returns null on success.
            base: NonNull::new(base.cast::<u8>())
                .ok_or_else(|| io::Error::other("mmap gave null"))?,
            cap,
        };
        for half in 0..2 {
            // SAFETY: both views lie inside the reservation made above, which `ring` owns (and
            // unmaps on drop, including if this fails); MAP_FIXED replaces only reserved pages.
            // They map the same memfd pages, shared with nothing but this ring.
            unsafe {
                mmap(
                    base.cast::<u8>().add(half * cap).cast::<c_void>(),
                    cap,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED | MapFlags::FIXED,
                    &fd,
                    0,
                )?;
            }
        }
        Ok(ring)
    }

    /// Bytes in the ring.
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// Address of stream position `pos`; `cap` bytes from there are valid and contiguous.
    pub(crate) fn at(&self, pos: u64) -> *mut u8 {
        let off = (pos % self.cap as u64) as usize;
        // SAFETY: off < cap, and the mapping is 2 * cap bytes long.
        unsafe { self.base.as_ptr().add(off) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the whole reservation belongs to this ring; lent pointers into it are only
        // valid while the link (and so the ring) lives.
        if let Err(e) = unsafe { munmap(self.base.as_ptr().cast::<c_void>(), 2 * self.cap) } {
            tracing::warn!(error = %e, "tcp: unmapping a receive ring failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_view_mirrors_the_first() {
        let ring = Ring::new(1).unwrap();
        let cap = ring.capacity();
        assert!(cap >= 1 && cap.is_power_of_two());
        let end = cap as u64 - 3;
        // SAFETY: 8 bytes from `at(end)` lie inside the double mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(b"abcdefgh".as_ptr(), ring.at(end), 8);
            // The last 3 bytes of the ring and the first 5 hold the run.
            assert_eq!(std::slice::from_raw_parts(ring.at(0), 5), b"defgh");
            assert_eq!(
                std::slice::from_raw_parts(ring.at(end + cap as u64), 8),
                b"abcdefgh"
            );
        }
    }
}
