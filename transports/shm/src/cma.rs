//! Cross-memory attach: reading and writing a local peer's memory directly with
//! `process_vm_readv` / `process_vm_writev`, one copy instead of copy-in, copy-out. The peer hands
//! over an address it keeps valid until this side says it is done.

use std::io;

/// Reads `len` bytes at `addr` in process `pid` into `dst`.
///
/// # Safety
///
/// `dst..dst+len` must be valid for writes and not accessed by anyone else during the call.
pub unsafe fn read(pid: i32, addr: usize, dst: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { transfer(pid, addr, dst, len, Way::Read) }
}

/// Writes `len` bytes from `src` to `addr` in process `pid`.
///
/// # Safety
///
/// `src..src+len` must be valid for reads and not written by anyone during the call.
pub unsafe fn write(pid: i32, addr: usize, src: *const u8, len: usize) -> io::Result<()> {
    // SAFETY: forwarded from the caller (the kernel only reads local memory when writing).
    unsafe { transfer(pid, addr, src.cast_mut(), len, Way::Write) }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Read,
    Write,
}

/// # Safety
///
/// As [`read`] or [`write`], by `way`.
unsafe fn transfer(pid: i32, addr: usize, local: *mut u8, len: usize, way: Way) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let here = libc::iovec {
            iov_base: local.wrapping_add(done).cast(),
            iov_len: len - done,
        };
        let there = libc::iovec {
            iov_base: (addr + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: one iovec each, both described above; the kernel checks the remote range and
        // the caller guarantees the local one.
        let n = unsafe {
            match way {
                Way::Read => libc::process_vm_readv(pid, &here, 1, &there, 1, 0),
                Way::Write => libc::process_vm_writev(pid, &here, 1, &there, 1, 0),
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_readv/writev moved nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}
