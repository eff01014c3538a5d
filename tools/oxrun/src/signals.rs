//! oxrun's signal handling: SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGCHLD turn into bytes in a
//! self-pipe that the
//! main loop sleeps on, so it wakes at once when a rank exits or the user interrupts. The
//! handler must do only async-signal-safe work: one atomic store and one non-blocking write.

use std::io::{self, PipeReader, PipeWriter, Read};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::Signal;

/// The write end of the self-pipe, for the handler (-1 before [`Signals::install`]).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The last terminating signal received (0: none).
static TERMINATE: AtomicI32 = AtomicI32::new(0);

/// `SIG_ERR` as `signal` returns it.
const SIG_ERR: usize = usize::MAX;

unsafe extern "C" {
    /// signal(2) from the C library that std links: installs a handler with BSD semantics
    /// (stays installed, interrupted system calls restart).
    fn signal(signum: c_int, handler: extern "C" fn(c_int)) -> usize;
}

extern "C" fn on_signal(sig: c_int) {
    if sig != Signal::CHILD.as_raw() {
        TERMINATE.store(sig, Ordering::SeqCst);
    }
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: `fd` is the write end of the pipe owned by the `Signals` that stored it, which
        // lives until the process exits (it is never dropped before `main` returns). `write` is
        // async-signal-safe; a full pipe (EAGAIN) already holds a wake-up, so the result is moot.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = rustix::io::write(fd, &[0]);
    }
}

/// The installed handlers and their self-pipe.
pub struct Signals {
    read: PipeReader,
    _write: PipeWriter,
}

impl Signals {
    /// Installs the handlers for SIGINT, SIGTERM, SIGHUP (a closed terminal or ssh session),
    /// SIGQUIT and SIGCHLD: each of the first four stops every rank in order, where the default
    /// action killed oxrun alone and left what the ranks had started running. Call once, before
    /// any child is started, and keep the result alive until the process exits.
    pub fn install() -> io::Result<Signals> {
        let (read, write) = io::pipe()?;
        rustix::io::ioctl_fionbio(&read, true)?;
        rustix::io::ioctl_fionbio(&write, true)?;
        WAKE_FD.store(write.as_raw_fd(), Ordering::SeqCst);
        for sig in [
            Signal::INT,
            Signal::TERM,
            Signal::HUP,
            Signal::QUIT,
            Signal::CHILD,
        ] {
            // SAFETY: `on_signal` only does async-signal-safe work (atomics and write(2)), and
            // replacing the default disposition of these signals affects no other code of this
            // program. Children get default dispositions back at exec.
            if unsafe { signal(sig.as_raw(), on_signal) } == SIG_ERR {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Signals {
            read,
            _write: write,
        })
    }

    /// Sleeps until a signal arrives or `timeout` passes (`None`: no limit), then empties the
    /// pipe. Spurious wake-ups are possible; callers re-check their state.
    pub fn wait(&self, timeout: Option<Duration>) {
        let timeout = timeout.and_then(|t| Timespec::try_from(t).ok());
        let mut fds = [PollFd::new(&self.read, PollFlags::IN)];
        // EINTR just means a signal came in, which is what we wait for.
        let _ = rustix::event::poll(&mut fds, timeout.as_ref());
        let mut buf = [0u8; 64];
        while matches!((&self.read).read(&mut buf), Ok(n) if n > 0) {}
    }

    /// The terminating signal received (SIGINT, SIGTERM, SIGHUP or SIGQUIT), if any.
    pub fn terminate_requested(&self) -> Option<c_int> {
        match TERMINATE.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

/// A signal's conventional name, for messages.
pub fn name(sig: c_int) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => "signal",
    }
}
