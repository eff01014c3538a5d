//! Meeting a local peer: an authenticated connection on an abstract Unix socket, over which each
//! side hands the other its incoming ring segment and its doorbell (an eventfd), and learns
//! whether the other can read its memory directly (`process_vm_readv`). The connection stays
//! open afterwards: its end tells a rank that the peer is gone, and it carries control messages.
//!
//! Abstract sockets have no file system name and vanish with the process; the job secret's
//! challenge-response (and the peer's credentials: same user) keep strangers out.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use oxccl_transport::auth::{self, Secret};
use oxccl_transport::{Rank, Result, TransportError};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

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
    /// The peer's process id, as the kernel reports it.
    pub pid: i32,
    /// Whether this rank may hand the peer addresses to read directly (the peer proved it can
    /// read this process's memory).
    pub peer_reads_us: bool,
    /// Whether this rank can read the peer's memory directly.
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
    timeout: Duration,
) -> Result<Rank> {
    let cred = rustix::net::sockopt::socket_peercred(&*s)
        .map_err(|e| TransportError::io("shm: read the peer's credentials", e.into()))?;
    if cred.uid != rustix::process::getuid() {
        return Err(TransportError::Auth(format!(
            "shm: connection from another user ({:?})",
            cred.uid
        )));
    }
    s.set_read_timeout(Some(timeout))
        .map_err(|e| TransportError::io("shm: set timeout", e))?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| TransportError::io("shm: set timeout", e))?;
    let ctx = [AUTH_CONTEXT, context].concat();
    let hello = (me as u32).to_le_bytes();
    let theirs = if client {
        auth::client_handshake(s, secret, &ctx, &hello)?
    } else {
        auth::server_handshake(s, secret, &ctx, |_| Ok(hello.to_vec()))?
    };
    let peer = theirs
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(|b| u32::from_le_bytes(b) as Rank)
        .ok_or_else(|| TransportError::Auth("shm: malformed hello".into()))?;
    if expect.is_some_and(|e| e != peer) {
        return Err(TransportError::Auth(format!(
            "shm: expected rank {expect:?}, met rank {peer}"
        )));
    }
    Ok(peer)
}

const FD_MAGIC: u32 = 0x4F58_4644; // "OXFD"

/// Hands over this side's incoming segment, doorbell and area, receives the peer's, and probes
/// in both directions whether memory can be read directly.
pub fn exchange(
    s: &mut UnixStream,
    segment: BorrowedFd<'_>,
    bell: BorrowedFd<'_>,
    area: BorrowedFd<'_>,
    peer: Rank,
) -> Result<Exchanged> {
    let ctx = |w: &str| format!("shm: {w} with rank {peer}");
    // A value the peer will try to read from this process.
    let probe: Box<u64> = Box::new(
        0x6F78_6363_6C21_u64 ^ u64::from(rustix::process::getpid().as_raw_nonzero().get() as u32),
    );
    let mut msg = Vec::with_capacity(24);
    msg.extend(FD_MAGIC.to_le_bytes());
    msg.extend((&*probe as *const u64 as u64).to_le_bytes());
    msg.extend(probe.to_le_bytes());
    let fds = [segment, bell, area];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    anc.push(SendAncillaryMessage::ScmRights(&fds));
    rustix::net::sendmsg(&*s, &[IoSlice::new(&msg)], &mut anc, SendFlags::empty())
        .map_err(|e| TransportError::io(ctx("send the segment"), e.into()))?;

    let mut buf = [0u8; 20];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        &*s,
        &mut [IoSliceMut::new(&mut buf)],
        &mut anc,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| TransportError::io(ctx("receive the segment"), e.into()))?;
    let mut received: Vec<OwnedFd> = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            received.extend(fds);
        }
    }
    if got.bytes != buf.len() || buf[..4] != FD_MAGIC.to_le_bytes() || received.len() != 3 {
        return Err(TransportError::Protocol {
            peer,
            what: "malformed segment hand-over".into(),
        });
    }
    let (addr, want) = (
        u64::from_le_bytes(buf[4..12].try_into().expect("8 bytes")),
        u64::from_le_bytes(buf[12..20].try_into().expect("8 bytes")),
    );
    let cred = rustix::net::sockopt::socket_peercred(&*s)
        .map_err(|e| TransportError::io(ctx("read credentials"), e.into()))?;
    let pid = cred.pid.as_raw_nonzero().get();
    let mut seen = 0u64;
    // SAFETY: `seen` is our own 8 bytes; the remote range is only read by the kernel.
    let we_read_peer =
        unsafe { crate::cma::read(pid, addr as usize, (&mut seen as *mut u64).cast(), 8) }.is_ok()
            && seen == want;
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
        pid,
        peer_reads_us: verdict[0] == 1,
        we_read_peer,
    })
}
