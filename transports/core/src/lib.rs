//! oxccl-transport: the interface between oxccl's executor and the ways bytes travel.
//!
//! A [`Transport`] says whether it can reach a peer, publishes the information peers need to
//! connect to it, and creates one [`Link`] per peer. A `Link` is completion-based, like verbs and
//! NCCL's net plugin: the executor posts sends and receives, then polls for completions. Nothing
//! blocks, and a transport never reduces: it only moves bytes.
//!
//! Every transport must provide, per link:
//!
//! - **order**: messages arrive in the order they were posted, and the k-th data message matches
//!   the k-th posted receive; sizes must agree exactly (a mismatch is a
//!   [`TransportError::Protocol`] error, never a truncation);
//! - **buffering of at least one message** of up to [`Link::max_message`] bytes with no
//!   receive posted, so a send can complete before the peer asks for it (oxccl's schedules are
//!   deadlock-free under exactly this guarantee);
//! - **zero-copy sends** where the medium allows: the bytes are read from the caller's memory
//!   until the send completes;
//! - **lent receives**: a receive posted as [`RecvInto::Lend`] completes with a pointer into the
//!   transport's own memory, valid until [`Link::release`], so the executor can reduce straight
//!   out of it; at most one lent message per link is outstanding at a time;
//! - a small **control** channel, outside the data order, for error notices;
//! - **prompt failure**: once the peer has closed or died, [`Link::poll`] fails with
//!   [`TransportError::PeerClosed`] as soon as a posted operation can no longer complete — at
//!   once for a pending send or for a receive that the data already delivered cannot satisfy.
//!   Messages that arrived before the close are delivered first, and a closed link with nothing
//!   posted is not an error (a peer that finished its last operation and exited is normal).
//!
//! Transports live in sibling crates (`oxccl-transport-tcp`, `-shm`, `-rdma`); this crate holds
//! the traits, [`TransportError`], and [`loopback`], an in-process transport for threads-as-ranks.

use std::fmt;
use std::os::fd::RawFd;
use std::time::Instant;

pub mod auth;
pub mod deadline;
pub mod loopback;
pub mod shared;

/// A process's index in its communicator.
pub type Rank = usize;

/// The executor's name for one posted operation, echoed in its [`Completion`].
pub type Token = u64;

/// Errors a transport reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The operating system refused an operation.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (`"connect to rank 3 at 10.0.0.2:5000"`).
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The peer closed the link or its process died.
    #[error("rank {peer} closed the connection")]
    PeerClosed {
        /// The peer.
        peer: Rank,
    },
    /// The peer sent something that breaks the protocol (wrong size, garbage, oversized frame).
    #[error("protocol error from rank {peer}: {what}")]
    Protocol {
        /// The peer.
        peer: Rank,
        /// What was wrong.
        what: String,
    },
    /// A connecting party failed to prove it belongs to the job.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// A deadline passed while setting up links.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The transport cannot work here (no device, no permission, unsupported peer).
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl TransportError {
    /// An [`TransportError::Io`] with context.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> TransportError {
        TransportError::Io {
            what: what.into(),
            source,
        }
    }
}

/// `Result` with [`TransportError`].
pub type Result<T, E = TransportError> = std::result::Result<T, E>;

/// Memory a send reads from, owned by the caller until the send completes.
#[derive(Clone, Copy, Debug)]
pub struct SendBuf {
    ptr: *const u8,
    len: usize,
}

impl SendBuf {
    /// Describes `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must stay readable, and not be written, until the send's completion has
    /// been returned by [`Link::poll`] (or the link is dropped).
    pub unsafe fn new(ptr: *const u8, len: usize) -> SendBuf {
        SendBuf { ptr, len }
    }

    /// A send buffer over a slice the caller promises to keep alive and unchanged until the send
    /// completes.
    ///
    /// # Safety
    ///
    /// As for [`SendBuf::new`].
    pub unsafe fn from_slice(bytes: &[u8]) -> SendBuf {
        SendBuf {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    /// Start of the memory.
    pub fn ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

// SAFETY: a SendBuf only describes memory; whoever built it (an unsafe constructor) promised the
// memory stays valid and unchanged until the send completes, whichever thread drives the link.
unsafe impl Send for SendBuf {}

/// Memory a receive writes into, owned by the caller until the receive completes.
#[derive(Clone, Copy, Debug)]
pub struct RecvBuf {
    ptr: *mut u8,
    len: usize,
}

impl RecvBuf {
    /// Describes `len` writable bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must stay writable, and not be accessed by anyone else, until the
    /// receive's completion has been returned by [`Link::poll`] (or the link is dropped).
    pub unsafe fn new(ptr: *mut u8, len: usize) -> RecvBuf {
        RecvBuf { ptr, len }
    }

    /// Start of the memory.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

// SAFETY: as for SendBuf: the unsafe constructor's caller vouches for the memory until the receive
// completes, whichever thread drives the link.
unsafe impl Send for RecvBuf {}

/// Where a received message should go.
#[derive(Clone, Copy, Debug)]
pub enum RecvInto {
    /// Into the caller's memory; the message must be exactly as long.
    Memory(RecvBuf),
    /// Kept in the transport's memory and lent out on completion; the message must be exactly
    /// `len` bytes.
    Lend {
        /// Expected length.
        len: usize,
    },
}

impl RecvInto {
    /// The expected message length.
    pub fn len(&self) -> usize {
        match self {
            RecvInto::Memory(b) => b.len(),
            RecvInto::Lend { len } => *len,
        }
    }

    /// Whether the expected message is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A finished operation, or an out-of-band message.
#[derive(Debug)]
pub enum Completion {
    /// The send with this token has left the caller's memory.
    Sent(Token),
    /// The receive with this token has written the caller's memory.
    Received(Token),
    /// The receive with this token holds its message in transport memory at `ptr..ptr+len`,
    /// valid and unchanged until [`Link::release`] is called with the token.
    Lent {
        /// The receive's token.
        token: Token,
        /// Start of the message.
        ptr: *const u8,
        /// Its length.
        len: usize,
    },
    /// A control message from the peer (error notices), outside the data order.
    Control(Vec<u8>),
}

// SAFETY: `Lent` points into memory owned by the link, which stays valid until `release`; the
// completion carries no other pointers.
unsafe impl Send for Completion {}

/// What a blocked executor should wait for on a link's file descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// The descriptor.
    pub fd: RawFd,
    /// Wake when readable.
    pub read: bool,
    /// Wake when writable.
    pub write: bool,
}

/// A connection to one peer. See the crate docs for what every implementation guarantees.
pub trait Link: Send {
    /// The peer's rank.
    fn peer(&self) -> Rank;

    /// Largest data message this link carries, in bytes.
    fn max_message(&self) -> usize;

    /// Queues a send of `buf` (at most [`Link::max_message`] bytes).
    ///
    /// # Safety
    ///
    /// The memory behind `buf` must satisfy [`SendBuf::new`]'s contract.
    unsafe fn post_send(&mut self, token: Token, buf: SendBuf) -> Result<()>;

    /// Queues a receive of the next data message.
    ///
    /// # Safety
    ///
    /// For [`RecvInto::Memory`], the memory must satisfy [`RecvBuf::new`]'s contract.
    unsafe fn post_recv(&mut self, token: Token, into: RecvInto) -> Result<()>;

    /// Sends a small control message (copied; at most 4 KiB), ahead of queued data if the medium
    /// allows.
    fn post_control(&mut self, bytes: &[u8]) -> Result<()>;

    /// Whether a control message posted with [`Link::post_control`] has not yet been handed
    /// whole to the medium ([`Link::poll`] moves it on). A failing rank polls until its
    /// failure notices are out.
    fn control_pending(&self) -> bool {
        false
    }

    /// Makes whatever progress is possible without blocking and appends completions to `out`.
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()>;

    /// Returns the memory of a [`Completion::Lent`] receive to the transport.
    fn release(&mut self, token: Token);

    /// What to wait on when nothing progresses: appends the descriptors to `out` and returns
    /// true, or returns false if the link cannot be waited on (the executor then backs off by
    /// sleeping briefly).
    fn readiness(&self, out: &mut Vec<Readiness>) -> bool;

    /// Called right before the executor blocks on [`Link::readiness`]: a transport whose peers
    /// only wake sleepers that announced themselves (shared memory) announces this one here.
    /// Returns false if work may already be possible, in which case the executor polls again
    /// instead of blocking. [`Link::disarm`] follows every `arm`.
    fn arm(&mut self) -> bool {
        true
    }

    /// Withdraws what [`Link::arm`] announced, after waking.
    fn disarm(&mut self) {}

    /// Whether the peer is known to have closed its end or died, checked now (possibly with a
    /// system call); for waits that have nothing posted on the link.
    fn peer_gone(&mut self) -> bool {
        false
    }

    /// Whether a data message has arrived that no posted receive has taken yet.
    fn has_incoming(&mut self) -> bool {
        false
    }

    /// Copies the first bytes (up to `buf.len()`) of the oldest data message that has arrived
    /// and that no posted receive has taken yet, without taking it, and returns how many; 0
    /// where there is none, or the transport cannot tell (the default). For an executor that
    /// looks at what a peer sent ahead of the call that will receive it.
    fn peek(&mut self, buf: &mut [u8]) -> usize {
        let _ = buf;
        0
    }

    /// Registers `len` bytes at `ptr` under `id` (a caller's buffer it will send from again),
    /// where the transport can then send without copying (rdma: the device reads it). A
    /// transport that needs no registration ignores it (the default). Registering an id again
    /// does nothing.
    ///
    /// # Safety
    ///
    /// The memory stays mapped and readable until [`Link::deregister`] of `id` returns or the
    /// link is dropped.
    unsafe fn register(&mut self, id: u64, ptr: *const u8, len: usize) -> Result<()> {
        let _ = (id, ptr, len);
        Ok(())
    }

    /// Ends registration `id` (unknown ids are ignored); on return the transport no longer
    /// reads that memory, for sends posted before as well.
    fn deregister(&mut self, id: u64) {
        let _ = id;
    }

    /// Forgets every posted operation without closing the link: from the return of this call
    /// the link never reads or writes the memory of an operation posted before it — nor does
    /// the peer, where it reads this side's memory directly — and none of them completes. A send already partly on the wire is finished from the transport's own
    /// copy, so the stream stays well-formed and later control messages still reach the peer;
    /// data that arrives for a cancelled receive is discarded.
    fn cancel(&mut self);

    /// Closes the link at once (abort): the peer sees [`TransportError::PeerClosed`].
    fn close(&mut self);
}

/// What one rank publishes about itself so peers can pick a transport and connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The rank.
    pub rank: Rank,
    /// Identity of the host the rank runs on (ranks with equal ids share memory).
    pub host: String,
    /// Per transport name, the bytes its `listen` produced.
    pub endpoints: Vec<(String, Vec<u8>)>,
}

impl PeerInfo {
    /// The endpoint a transport called `name` published, if any.
    pub fn endpoint(&self, name: &str) -> Option<&[u8]> {
        self.endpoints
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, e)| e.as_slice())
    }

    /// The wire form published through the store: rank u32, host (u16 length + bytes),
    /// endpoint count u16, then per endpoint its name (u16 length + bytes) and bytes (u32 length
    /// + bytes); little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend((self.rank as u32).to_le_bytes());
        b.extend((self.host.len() as u16).to_le_bytes());
        b.extend(self.host.as_bytes());
        b.extend((self.endpoints.len() as u16).to_le_bytes());
        for (name, e) in &self.endpoints {
            b.extend((name.len() as u16).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend((e.len() as u32).to_le_bytes());
            b.extend(e);
        }
        b
    }

    /// Parses [`PeerInfo::encode`]'s form; `None` for anything malformed or truncated.
    pub fn decode(b: &[u8]) -> Option<PeerInfo> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = b.get(at..at.checked_add(n)?)?;
            at += n;
            Some(s)
        };
        let rank = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let hl = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
        let host = String::from_utf8(take(hl)?.to_vec()).ok()?;
        let n = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
        let mut endpoints = Vec::with_capacity(n.min(16));
        for _ in 0..n {
            let nl = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
            let name = String::from_utf8(take(nl)?.to_vec()).ok()?;
            let el = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
            endpoints.push((name, take(el)?.to_vec()));
        }
        (at == b.len()).then_some(PeerInfo {
            rank,
            host,
            endpoints,
        })
    }
}

/// A way of reaching peers. Created per communicator, before links exist.
pub trait Transport: Send {
    /// Short name (`"tcp"`, `"shm"`, `"loopback"`), as `OXCCL_TRANSPORTS` spells it.
    fn name(&self) -> &'static str;

    /// Prepares to accept connections and returns what peers need to reach this rank.
    fn listen(&mut self) -> Result<Vec<u8>>;

    /// Whether this transport can connect `me` and `peer` (both must agree: the answer may
    /// only depend on the two infos, not on which side asks).
    fn can_connect(&self, me: &PeerInfo, peer: &PeerInfo) -> bool;

    /// Connects to every peer in `peers` (accepting from some, connecting to others, as the
    /// transport decides) and returns one link per peer, in the order given. Fails if any peer
    /// is not connected by `deadline`.
    fn connect(&mut self, peers: &[&PeerInfo], deadline: Instant) -> Result<Vec<Box<dyn Link>>>;
}

impl fmt::Display for PeerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} on {}", self.rank, self.host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_info_round_trips_and_garbage_is_rejected() {
        let p = PeerInfo {
            rank: 7,
            host: "node-3".into(),
            endpoints: vec![("tcp".into(), vec![1, 2, 3]), ("loopback".into(), vec![])],
        };
        assert_eq!(PeerInfo::decode(&p.encode()), Some(p.clone()));
        let e = p.encode();
        for cut in 0..e.len() {
            assert_eq!(PeerInfo::decode(&e[..cut]), None);
        }
        assert_eq!(PeerInfo::decode(&[0xff; 64]), None);
    }
}
