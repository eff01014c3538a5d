//! Meeting a local peer: an authenticated connection on an abstract Unix socket, over which each
//! side hands the other its incoming ring segment and its doorbell (an eventfd), and learns
//! whether the other can read its memory directly (`process_vm_readv`). The connection stays
//! open afterwards: its end tells a rank that the peer is gone, and it carries control messages.
//!
//! Abstract sockets have no file system name and vanish with the process; the job secret's
//! challenge-response (and the peer's credentials: same user) keep strangers out.
//!
//! Abstract sockets belong to the network namespace, so a peer may sit in a pid namespace this
//! one cannot see (two containers of one pod): the kernel then reports its pid as 0. The rings
//! need no pid and work as ever; only direct access to its memory is off (see [`exchange`]).

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_transport::auth::{self, Secret};
use oxccl_transport::{Rank, Result, TransportError};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::cma::Process;

/// Authentication context of these connections.
pub const AUTH_CONTEXT: &[u8] = b"oxccl-shm";

/// What the two sides exchange after authenticating.
#[derive(Debug)]
pub struct Exchanged {
    /// The peer's incoming ring segment for this rank (this rank's outgoing ring).
    pub segment: OwnedFd,
    /// The peer's doorbell.
    pub bell: OwnedFd,
    /// The peer's group area segment.
    pub area: OwnedFd,
    /// The peer's process held by a pidfd, when one could be opened: to tell whether it lives.
    /// Proven to be the peer only when `we_read_peer`; otherwise it is the peer unless the
    /// peer died during the hand-over (so "exited" is always right, "alive" may not be).
    pub process: Option<Arc<Process>>,
    /// Whether this rank may hand the peer addresses to read directly (the peer proved it can
    /// read this process's memory).
    pub peer_reads_us: bool,
    /// Whether this rank can read the peer's memory directly: `process` is proven to be the
    /// peer (it held our random probe at the address we named).
    pub we_read_peer: bool,
}

/// The abstract socket address for rank `rank` of the communicator named by `tag`.
pub fn socket_name(tag: &str, rank: Rank) -> Vec<u8> {
    format!("oxccl-shm-{tag}-{rank}").into_bytes()
}

/// Listens on the abstract socket `name`.
pub fn listen(name: &[u8]) -> io::Result<UnixListener> {
    let addr = SocketAddr::from_abstract_name(name)?;
    let l = UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Connects to `name`, retrying while nobody listens yet, until `deadline`.
pub fn connect(name: &[u8], deadline: Instant) -> Result<UnixStream> {
    let addr = SocketAddr::from_abstract_name(name)
        .map_err(|e| TransportError::io("shm: socket name", e))?;
    let mut wait = Duration::from_millis(1);
    loop {
        match UnixStream::connect_addr(&addr) {
            Ok(s) => return Ok(s),
            Err(e)
                if Instant::now() < deadline
                    && matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                    ) =>
            {
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_millis(50));
            }
            Err(e) => {
                return Err(TransportError::io(
                    format!("shm: connect to {}", String::from_utf8_lossy(name)),
                    e,
                ));
            }
        }
    }
}

/// Accepts one connection from `listener` before `deadline` (None when the deadline passes).
pub fn accept(listener: &UnixListener, deadline: Instant) -> Result<Option<UnixStream>> {
    loop {
        match listener.accept() {
            Ok((s, _)) => return Ok(Some(s)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                let mut fds = [rustix::event::PollFd::new(
                    listener,
                    rustix::event::PollFlags::IN,
                )];
                let ts = rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: 20_000_000,
                };
                let _ = rustix::event::poll(&mut fds, Some(&ts));
            }
            Err(e) => return Err(TransportError::io("shm: accept", e)),
        }
    }
}

/// The credentials of the process on the other end of `s`, as the kernel reports them at
/// connection time: pid 0 when that process is in a pid namespace this one cannot see.
///
/// Read raw (`SO_PEERCRED` into `libc::ucred`) because the pid may be 0, which no non-zero pid
/// type may hold.
pub(crate) fn peer_credentials(s: &impl AsFd) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are ours and describe `cred`'s size; the kernel writes at most
    // `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            s.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size_of::<libc::ucred>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "SO_PEERCRED returned a short answer",
        ));
    }
    Ok(cred)
}

/// Holds the peer whose credentials report `pid` by a pidfd, or says why it cannot be held
/// (then this rank never reaches its memory directly).
pub(crate) fn hold_peer(pid: i32) -> std::result::Result<Process, String> {
    if pid == 0 {
        return Err(
            "its process is in a pid namespace this one cannot see (its pid reads 0)".into(),
        );
    }
    Process::open(pid).map_err(|e| match e.kind() {
        io::ErrorKind::Unsupported => format!("{e}; a bare pid could be recycled"),
        _ if e.raw_os_error() == Some(libc::ESRCH) => format!("its process (pid {pid}) is gone"),
        _ => format!("pidfd_open({pid}): {e}"),
    })
}

/// Authenticates a connection (the connecting side calls with `client = true`) and returns
/// the peer's rank. Refuses peers of another user and peers claiming a rank other than
/// `expect` (when given).
pub fn authenticate(
    s: &mut UnixStream,
    secret: &Secret,
    context: &[u8],
    me: Rank,
    client: bool,
    expect: Option<Rank>,
    deadline: Instant,
) -> Result<Rank> {
    let cred = peer_credentials(s)
        .map_err(|e| TransportError::io("shm: read the peer's credentials", e))?;
    if cred.uid != rustix::process::getuid().as_raw() {
        return Err(TransportError::Auth(format!(
            "shm: connection from another user (uid {})",
            cred.uid
        )));
    }
    let ctx = [AUTH_CONTEXT, context].concat();
    let hello = (me as u32).to_le_bytes();
    // The whole handshake by `deadline`, however slowly the peer's bytes come.
    let mut d = oxccl_transport::deadline::Deadlined {
        stream: &mut *s,
        deadline,
    };
    let theirs = if client {
        auth::client_handshake(&mut d, secret, &ctx, &hello)?
    } else {
        auth::server_handshake(&mut d, secret, &ctx, |_| Ok(hello.to_vec()))?
    };
    let peer =
        decode_hello(&theirs).ok_or_else(|| TransportError::Auth("shm: malformed hello".into()))?;
    if expect.is_some_and(|e| e != peer) {
        return Err(TransportError::Auth(format!(
            "shm: expected rank {expect:?}, met rank {peer}"
        )));
    }
    Ok(peer)
}

const FD_MAGIC: u32 = 0x4F58_4644; // "OXFD"

/// The peer's rank from its authenticated hello (its first 4 bytes).
pub fn decode_hello(hello: &[u8]) -> Option<Rank> {
    let b: [u8; 4] = hello.get(..4)?.try_into().ok()?;
    Some(u32::from_le_bytes(b) as Rank)
}

/// The peer's segment hand-over — magic, the address of its probe, the probe's value — with
/// `fds` descriptors beside it: `(address, value)`, or `None` unless it is exactly 20 bytes
/// with the magic and three descriptors.
pub fn decode_hand_over(msg: &[u8], fds: usize) -> Option<(u64, u64)> {
    let msg: &[u8; 20] = msg.try_into().ok()?;
    if msg[..4] != FD_MAGIC.to_le_bytes() || fds != 3 {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(msg[i..i + 8].try_into().expect("8 bytes"));
    Some((word(4), word(12)))
}

/// Hands over this side's incoming segment, doorbell and area, receives the peer's, and probes
/// in both directions whether memory can be read directly.
///
/// Direct access to the peer needs its process held by a pidfd and proven to be the peer: the
/// pidfd is opened from the pid the kernel reports, then this side reads the peer's random
/// probe through it and checks the pidfd's process is still alive afterwards (so the pid named
/// it during the read). A peer whose pid reads 0 (another pid namespace), a kernel without
/// pidfds, or a failed probe leave direct access off for this peer, logged, and the link
/// copies every message through the ring; the area's direct path is then off as well.
pub fn exchange(
    s: &mut UnixStream,
    segment: BorrowedFd<'_>,
    bell: BorrowedFd<'_>,
    area: BorrowedFd<'_>,
    peer: Rank,
    deadline: Instant,
) -> Result<Exchanged> {
    let ctx = |w: &str| format!("shm: {w} with rank {peer}");
    // Every call below ends by `deadline`, however slowly the peer answers.
    let mut s = oxccl_transport::deadline::Deadlined {
        stream: s,
        deadline,
    };
    // A random value the peer will try to read from this process: finding it proves the peer
    // reached this very process.
    let nonce = oxccl_transport::auth::random_bytes()?;
    let probe: Box<u64> = Box::new(u64::from_le_bytes(nonce[..8].try_into().expect("8 bytes")));
    let mut msg = Vec::with_capacity(24);
    msg.extend(FD_MAGIC.to_le_bytes());
    msg.extend((&*probe as *const u64 as u64).to_le_bytes());
    msg.extend(probe.to_le_bytes());
    let fds = [segment, bell, area];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    anc.push(SendAncillaryMessage::ScmRights(&fds));
    // A signal (SIGUSR1 asks for a trace dump) interrupts a call with a timeout even under
    // SA_RESTART: try again, within the deadline.
    let sent = loop {
        let r = s.arm().and_then(|()| {
            rustix::net::sendmsg(
                &*s.stream,
                &[IoSlice::new(&msg)],
                &mut anc,
                SendFlags::empty(),
            )
            .map_err(Into::into)
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r,
        }
    };
    sent.map_err(|e| TransportError::io(ctx("send the segment"), e))?;

    let mut buf = [0u8; 20];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        let r = s.arm().and_then(|()| {
            rustix::net::recvmsg(
                &*s.stream,
                &mut [IoSliceMut::new(&mut buf)],
                &mut anc,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(Into::into)
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r,
        }
    };
    let got = got.map_err(|e| TransportError::io(ctx("receive the segment"), e))?;
    let mut received: Vec<OwnedFd> = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            received.extend(fds);
        }
    }
    let Some((addr, want)) = decode_hand_over(&buf[..got.bytes.min(buf.len())], received.len())
    else {
        return Err(TransportError::Protocol {
            peer,
            what: "malformed segment hand-over".into(),
        });
    };
    let cred =
        peer_credentials(s.stream).map_err(|e| TransportError::io(ctx("read credentials"), e))?;
    let process = match hold_peer(cred.pid) {
        Ok(p) => Some(Arc::new(p)),
        Err(why) => {
            tracing::info!(
                peer,
                "shm: no direct memory access to rank {peer}: {why}; copying through the ring"
            );
            None
        }
    };
    let we_read_peer = process.as_ref().is_some_and(|p| {
        let mut seen = 0u64;
        // SAFETY: `seen` is our own 8 bytes; the remote range is only read by the kernel.
        let read = unsafe { p.read(addr as usize, (&mut seen as *mut u64).cast(), 8) };
        // Alive after the read: the pid named the pidfd's process throughout, and it held our
        // peer's random probe, so it is the peer.
        let proven = read.is_ok() && seen == want && !p.exited();
        if !proven {
            tracing::debug!(
                peer,
                ?read,
                "shm: cannot read rank {peer}'s memory directly"
            );
        }
        proven
    });
    s.write_all(&[u8::from(we_read_peer)])
        .map_err(|e| TransportError::io(ctx("send the probe result"), e))?;
    let mut verdict = [0u8];
    s.read_exact(&mut verdict)
        .map_err(|e| TransportError::io(ctx("read the probe result"), e))?;
    drop(probe);
    let mut it = received.into_iter();
    let (segment, bell, area) = (
        it.next().expect("three fds"),
        it.next().expect("three fds"),
        it.next().expect("three fds"),
    );
    Ok(Exchanged {
        segment,
        bell,
        area,
        process,
        peer_reads_us: verdict[0] == 1,
        we_read_peer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_peer_credentials_name_this_process_for_a_socketpair() {
        let (a, b) = UnixStream::pair().unwrap();
        for s in [&a, &b] {
            let cred = peer_credentials(s).unwrap();
            assert_eq!(cred.pid, std::process::id() as i32);
            assert_eq!(cred.uid, rustix::process::getuid().as_raw());
            assert_eq!(cred.gid, rustix::process::getgid().as_raw());
        }
    }

    #[test]
    fn the_hand_over_ends_by_its_deadline() {
        use std::os::fd::AsFd;
        let (mut a, b) = UnixStream::pair().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        // The peer takes our descriptors but never sends its own (nor anything else).
        let start = Instant::now();
        let r = exchange(
            &mut a,
            null.as_fd(),
            null.as_fd(),
            null.as_fd(),
            1,
            Instant::now() + std::time::Duration::from_millis(300),
        );
        let took = start.elapsed();
        assert!(r.is_err());
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
        drop(b);
    }

    #[test]
    fn a_peer_whose_pid_reads_0_is_refused_direct_access() {
        let why = hold_peer(0).unwrap_err();
        assert!(why.contains("pid namespace"), "{why}");
        assert!(hold_peer(-1).is_err());
    }

    #[test]
    fn a_visible_live_peer_is_held() {
        let me = std::process::id() as i32;
        let p = hold_peer(me).unwrap();
        assert_eq!(p.pid(), me);
        assert!(!p.exited());
    }

    #[test]
    fn a_reaped_peer_is_refused() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        child.kill().unwrap();
        child.wait().unwrap();
        // (Unless the pid was handed out again meanwhile: then it is held, as any live pid.)
        if let Err(why) = hold_peer(pid) {
            assert!(why.contains("gone"), "{why}");
        }
    }
}
