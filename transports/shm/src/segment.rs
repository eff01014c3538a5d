//! Shared memory segments: anonymous `memfd`s mapped shared, passed between processes as file
//! descriptors. They have no name anywhere, so nothing is left behind however a job ends.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

/// A mapped memory segment, unmapped on drop.
#[derive(Debug)]
pub struct Segment {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory; access to its contents is governed by the ring
// protocol and the atomics placed in it, not by which thread holds the handle.
unsafe impl Send for Segment {}
// SAFETY: as above; the handle itself is immutable.
unsafe impl Sync for Segment {}

impl Segment {
    /// A new zero-filled segment of `len` bytes, sealed so that its size can never change
    /// (a peer that shrank it would make this process's accesses fault).
    pub fn create(name: &str, len: usize) -> io::Result<Segment> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Segment::map(fd)
    }

    /// Maps a segment received from a peer (its size is the file's size); refuses one whose
    /// size is not sealed, since a peer could shrink it under us.
    pub fn map(fd: OwnedFd) -> io::Result<Segment> {
        use rustix::fs::SealFlags;
        let seals = rustix::fs::fcntl_get_seals(&fd)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared segment not sealed against resizing",
            ));
        }
        let len = rustix::fs::fstat(&fd)?.st_size as usize;
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "empty shared segment",
            ));
        }
        // SAFETY: a fresh shared mapping of a file we hold; nothing else in this process refers
        // to the address range the kernel picks.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Segment { ptr, len, fd })
    }

    /// Maps the first `len` bytes (at most the whole segment) into this process now, as if
    /// written, without changing them (`MADV_POPULATE_WRITE`, Linux 5.14; an error on older
    /// kernels, where the pages are mapped as they are first touched, as before): so that the
    /// first calls through them take no page faults.
    pub fn prefault(&self, len: usize) -> io::Result<()> {
        let len = len.min(self.len);
        // SAFETY: the range lies inside our mapping; populating changes no byte of it.
        unsafe {
            rustix::mm::madvise(
                self.ptr.as_ptr().cast(),
                len,
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        }?;
        Ok(())
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the segment is empty (never: creation refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file descriptor, to pass to a peer.
    pub fn fd(&self) -> impl AsFd + '_ {
        &self.fd
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range and nothing refers to it after drop (links own
        // their segments and are dropped as a whole).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_sealed_and_unsealed_ones_are_refused() {
        let seg = Segment::create("oxccl-test", 4096).unwrap();
        assert!(
            rustix::fs::ftruncate(seg.fd(), 1024).is_err(),
            "shrinking must fail"
        );
        assert!(
            rustix::fs::ftruncate(seg.fd(), 8192).is_err(),
            "growing must fail"
        );
        // A peer's segment arrives as a descriptor: the same file maps again.
        let again = rustix::io::dup(seg.fd()).unwrap();
        assert_eq!(Segment::map(again).unwrap().len(), 4096);

        let plain =
            rustix::fs::memfd_create("oxccl-plain", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&plain, 4096).unwrap();
        let e = Segment::map(plain).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
