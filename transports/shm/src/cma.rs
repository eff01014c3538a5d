//! Cross-memory attach: reading a local peer's memory directly with `process_vm_readv`, one
//! copy instead of copy-in, copy-out. The peer hands over an address it keeps valid until this
//! side says it is done.

use std::io;

/// Reads `len` bytes at `addr` in process `pid` into `dst`.
///
/// # Safety
///
/// `dst..dst+len` must be valid for writes and not accessed by anyone else during the call.
pub unsafe fn read(pid: i32, addr: usize, dst: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let local = libc::iovec {
            iov_base: dst.wrapping_add(done).cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: one iovec each, both described above; the kernel checks the remote range and
        // the caller guarantees the local one.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
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
                "process_vm_readv read nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}
