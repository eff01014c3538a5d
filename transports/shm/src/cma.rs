//! Cross-memory attach: reading and writing a local peer's memory directly with
//! `process_vm_readv` / `process_vm_writev`, one copy instead of copy-in, copy-out. The peer hands
//! over an address it keeps valid until this side says it is done.
//!
//! The target is always a [`Process`] held by a pidfd, never a bare pid: a pid outlives nothing,
//! and a peer that exited may have left its number to a stranger. No pidfd (a kernel before 5.3,
//! a peer whose pid this namespace cannot see) means no direct access, never a bare-pid fallback.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};

/// A local process this one may read or write directly, held by a pidfd.
#[derive(Debug)]
pub struct Process {
    /// Its pid in this process's pid namespace (what `process_vm_readv` takes).
    pid: i32,
    /// Refers to that process for as long as it is open, even after the pid is reused.
    pidfd: OwnedFd,
    /// When the pidfd last said the process was alive (monotonic nanoseconds).
    alive_at: std::sync::atomic::AtomicU64,
}

/// How long a check that the process lives covers the transfers after it: see
/// [`Process::read`].
const ALIVE_FOR_NS: u64 = 1_000_000;

/// [`Process::alive_at`] before the first check.
const NEVER: u64 = u64::MAX;

/// Nanoseconds since this process first asked (monotonic; never 0 for long).
fn monotonic_ns() -> u64 {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(std::time::Instant::now);
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The error of a transfer to or from a [`Process`] that has exited.
#[derive(Debug)]
struct Exited {
    pid: i32,
}

impl fmt::Display for Exited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the peer process (pid {}) exited", self.pid)
    }
}

impl std::error::Error for Exited {}

/// Whether a transfer failed because the peer process is gone (exited, or `ESRCH` from the
/// kernel).
pub fn is_exit(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ESRCH) || e.get_ref().is_some_and(|i| i.is::<Exited>())
}

impl Process {
    /// Holds process `pid` (as this pid namespace numbers it) by a pidfd.
    ///
    /// Errors: `InvalidInput` for a pid of 0 or less (the kernel reports 0 for a process in a pid
    /// namespace this one cannot see); `Unsupported` on kernels without `pidfd_open` (before
    /// Linux 5.3); `ESRCH` when no such process exists. The caller must know by other means that
    /// `pid` names the process it means (see `setup::exchange`, which proves it): a pid read
    /// earlier may already have been reused.
    pub fn open(pid: i32) -> io::Result<Process> {
        if pid <= 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pid {pid} names no process visible in this pid namespace"),
            ));
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no memory
        // is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOSYS) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "this kernel has no pidfd_open (Linux 5.3 or later needed)",
                ));
            }
            return Err(e);
        }
        // SAFETY: a descriptor the kernel just created, owned by nobody else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(Process {
            pid,
            pidfd,
            // Never checked yet: the first transfer checks.
            alive_at: std::sync::atomic::AtomicU64::new(NEVER),
        })
    }

    /// Its pid in this pid namespace.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the process has exited: its pidfd reads as ready once the whole process has
    /// exited, zombie included (a zombie's pid is not reused until it is reaped, and the
    /// kernel refuses to reach its memory anyway). False while it runs, and when the kernel
    /// cannot say.
    pub fn exited(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &self.pidfd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        loop {
            match rustix::event::poll(&mut fds, Some(&zero)) {
                Ok(0) => return false,
                Ok(_) => {
                    return fds[0]
                        .revents()
                        .intersects(rustix::event::PollFlags::IN | rustix::event::PollFlags::HUP);
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return false,
            }
        }
    }

    /// Reads `len` bytes at `addr` in this process into `dst`; an error ([`is_exit`]) instead
    /// of any transfer once the process has exited.
    ///
    /// # Why a recycled pid is never read or written
    ///
    /// `process_vm_readv`/`writev` take a pid, not a pidfd, so each system call is preceded by a
    /// check that the pidfd's process is still there ([`Process::exited`]), at most a
    /// millisecond old (a fresh check costs a system call of its own, as much as a small
    /// transfer). The pidfd pins the process, not its number; the number is freed only when
    /// the process is reaped, which the check sees. For the kernel's lookup of the pid, within
    /// a millisecond of the check, to find another process, the peer would have to exit and be
    /// reaped in that millisecond *and* the pid allocator, which hands out numbers cyclically
    /// up to `pid_max` (at least 32768, usually 4194304 on 64-bit systems) skipping those in
    /// use, would have to come all the way round to this number: tens of thousands of process
    /// creations within a millisecond. That is impossible in practice, not in principle; Linux
    /// has no pidfd-taking `process_vm_*` that would close the window entirely.
    ///
    /// # Safety
    ///
    /// `dst..dst+len` must be valid for writes and not accessed by anyone else during the call.
    pub unsafe fn read(&self, addr: usize, dst: *mut u8, len: usize) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.transfer(addr, dst, len, Way::Read) }
    }

    /// Writes `len` bytes from `src` to `addr` in this process; an error ([`is_exit`]) instead
    /// of any transfer once the process has exited (see [`Process::read`] for why a recycled
    /// pid is never written).
    ///
    /// # Safety
    ///
    /// `src..src+len` must be valid for reads and not written by anyone during the call.
    pub unsafe fn write(&self, addr: usize, src: *const u8, len: usize) -> io::Result<()> {
        // SAFETY: forwarded from the caller (the kernel only reads local memory when writing).
        unsafe { self.transfer(addr, src.cast_mut(), len, Way::Write) }
    }

    /// # Safety
    ///
    /// As [`Process::read`] or [`Process::write`], by `way`.
    unsafe fn transfer(&self, addr: usize, local: *mut u8, len: usize, way: Way) -> io::Result<()> {
        let mut done = 0usize;
        while done < len {
            // Before every system call that names the pid, a check at most ALIVE_FOR_NS old:
            // see `read`.
            let now = monotonic_ns();
            let at = self.alive_at.load(std::sync::atomic::Ordering::Relaxed);
            if at == NEVER || now.saturating_sub(at) >= ALIVE_FOR_NS {
                if self.exited() {
                    return Err(io::Error::other(Exited { pid: self.pid }));
                }
                self.alive_at
                    .store(now, std::sync::atomic::Ordering::Relaxed);
            }
            let here = libc::iovec {
                iov_base: local.wrapping_add(done).cast(),
                iov_len: len - done,
            };
            let there = libc::iovec {
                iov_base: (addr + done) as *mut libc::c_void,
                iov_len: len - done,
            };
            // SAFETY: one iovec each, both described above; the kernel checks the remote range
            // and the caller guarantees the local one.
            let n = unsafe {
                match way {
                    Way::Read => libc::process_vm_readv(self.pid, &here, 1, &there, 1, 0),
                    Way::Write => libc::process_vm_writev(self.pid, &here, 1, &there, 1, 0),
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
}

/// The pidfd, to poll: it becomes readable when the process exits.
impl AsFd for Process {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.pidfd.as_fd()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Read,
    Write,
}
