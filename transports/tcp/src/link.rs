//! [`TcpLink`]: two authenticated, non-blocking TCP connections carrying framed messages, one
//! each way (see [`crate::wire::Lane`]); an [`Outbox`] writes to one, an [`Inbox`] reads from
//! the other, and this module ties them to the [`Link`] contract.
//!
//! It checks what callers post, makes a broken link stay broken (every later `poll` reports
//! the same error), and names the peer in every error. It must not block or buffer payloads
//! itself.

use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;

use oxccl_transport::{
    Completion, Link, Rank, Readiness, RecvInto, Result, SendBuf, Token, TransportError,
};
use rustix::io::Errno;

use crate::inbox::Inbox;
use crate::outbox::Outbox;
use crate::wire::MAX_CONTROL;

/// Counters of one link's work, for benchmarks and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// `sendmsg` calls, including those that found the socket full.
    pub write_calls: u64,
    /// `read`/`readv` calls, including those that found nothing.
    pub read_calls: u64,
    /// Payload bytes the kernel read straight into receivers' memory.
    pub bytes_direct: u64,
    /// Payload bytes copied from the receive ring into receivers' memory.
    pub bytes_copied: u64,
    /// Payload bytes lent out of the receive ring.
    pub bytes_lent: u64,
}

/// Why a link stopped working.
#[derive(Clone, Debug)]
pub(crate) enum Broken {
    /// End of stream or a reset: the peer is gone.
    Closed,
    /// The peer broke the protocol.
    Protocol(String),
    /// The socket failed while doing this (`"send to"`, `"receive from"`).
    Io(&'static str, Errno),
}

impl Broken {
    /// The failure of a socket call: a closed peer if the error says so.
    pub(crate) fn io(doing: &'static str, e: Errno) -> Broken {
        match e {
            Errno::CONNRESET | Errno::PIPE | Errno::CONNABORTED | Errno::TIMEDOUT => Broken::Closed,
            _ => Broken::Io(doing, e),
        }
    }

    fn error(&self, peer: Rank) -> TransportError {
        match self {
            Broken::Closed => TransportError::PeerClosed { peer },
            Broken::Protocol(what) => TransportError::Protocol {
                peer,
                what: what.clone(),
            },
            Broken::Io(doing, e) => {
                TransportError::io(format!("tcp: {doing} rank {peer}"), (*e).into())
            }
        }
    }
}

/// One rank's end of the two TCP connections to a peer, with the guarantees of
/// `oxccl-transport`'s crate docs. With no receive posted it buffers one full message (or 64 KiB
/// of small ones); its receive ring holds two full messages, so one can stay lent while the
/// next arrives.
#[derive(Debug)]
pub struct TcpLink {
    peer: Rank,
    /// The connection this side writes frames to (and reads nothing from).
    tx: TcpStream,
    /// The connection this side reads frames from (and writes nothing to).
    rx: TcpStream,
    max_message: usize,
    outbox: Outbox,
    inbox: Inbox,
    broken: Option<Broken>,
}

impl TcpLink {
    /// Wraps the authenticated connections to `peer`, `tx` to send on and `rx` to receive
    /// from: sets `TCP_NODELAY`, non-blocking mode and, if given, the socket buffer sizes, and
    /// maps the receive ring.
    pub(crate) fn new(
        peer: Rank,
        tx: TcpStream,
        rx: TcpStream,
        max_message: usize,
        socket_buffer: Option<usize>,
    ) -> Result<TcpLink> {
        let what = |w: &str| format!("tcp: {w} of the link to rank {peer}");
        for sock in [&tx, &rx] {
            sock.set_nodelay(true)
                .map_err(|e| TransportError::io(what("set TCP_NODELAY"), e))?;
            sock.set_nonblocking(true)
                .map_err(|e| TransportError::io(what("set non-blocking mode"), e))?;
        }
        if let Some(bytes) = socket_buffer {
            rustix::net::sockopt::set_socket_send_buffer_size(&tx, bytes)
                .and_then(|()| rustix::net::sockopt::set_socket_recv_buffer_size(&rx, bytes))
                .map_err(|e| TransportError::io(what("set the socket buffer sizes"), e.into()))?;
        }
        let inbox = Inbox::new(max_message)
            .map_err(|e| TransportError::io(what("map the receive ring"), e))?;
        Ok(TcpLink {
            peer,
            tx,
            rx,
            max_message,
            outbox: Outbox::new(),
            inbox,
            broken: None,
        })
    }

    /// What this link has done so far.
    pub fn stats(&self) -> LinkStats {
        LinkStats {
            write_calls: self.outbox.write_calls,
            ..self.inbox.stats
        }
    }

    /// Whether the peer has closed its end (end of stream was read): nothing more arrives.
    /// A link used only for control messages learns of it in [`Link::poll`].
    pub fn peer_closed(&self) -> bool {
        self.inbox.eof()
    }

    /// Bytes in the receive ring.
    pub fn ring_capacity(&self) -> usize {
        self.inbox.capacity()
    }

    fn poll_inner(&mut self, out: &mut Vec<Completion>) -> Result<(), Broken> {
        if !self.outbox.is_empty() {
            self.outbox
                .flush(&self.tx, out)
                .map_err(|e| Broken::io("send to", e))?;
        }
        self.inbox.progress(&self.rx, out)?;
        // The peer writes its last byte to us only as it closes, and it reads nothing after
        // that: what the socket still refuses will never be taken.
        if self.inbox.eof() && self.outbox.blocked() {
            return Err(Broken::Closed);
        }
        Ok(())
    }

    fn too_long(&self, what: &str, len: usize, limit: usize) -> TransportError {
        TransportError::Protocol {
            peer: self.peer,
            what: format!("{what} of {len} bytes exceeds the limit of {limit}"),
        }
    }
}

impl Link for TcpLink {
    fn peer(&self) -> Rank {
        self.peer
    }

    fn max_message(&self) -> usize {
        self.max_message
    }

    unsafe fn post_send(&mut self, token: Token, buf: SendBuf) -> Result<()> {
        if buf.len() > self.max_message {
            return Err(self.too_long("send", buf.len(), self.max_message));
        }
        self.outbox.push_data(token, buf);
        Ok(())
    }

    unsafe fn post_recv(&mut self, token: Token, into: RecvInto) -> Result<()> {
        if into.len() > self.max_message {
            return Err(self.too_long("receive", into.len(), self.max_message));
        }
        self.inbox.post(token, into);
        Ok(())
    }

    fn post_control(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_CONTROL {
            return Err(self.too_long("control message", bytes.len(), MAX_CONTROL));
        }
        match &self.broken {
            // What the peer sent broke the protocol: the other connection, which carries what
            // this side says, still takes a notice of why this side's call failed (the peer
            // otherwise waits for this rank until its deadline).
            None | Some(Broken::Protocol(_)) => {}
            Some(b) => return Err(b.error(self.peer)),
        }
        self.outbox.push_control(bytes);
        Ok(())
    }

    fn control_pending(&self) -> bool {
        self.outbox.controls_pending()
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        if self.broken.is_none()
            && let Err(b) = self.poll_inner(out)
        {
            self.broken = Some(b);
        }
        if matches!(self.broken, Some(Broken::Protocol(_))) && self.outbox.controls_pending() {
            // Notices posted since (see post_control) go out; a failure here leaves them.
            let mut sent = Vec::new();
            let _ = self.outbox.flush(&self.tx, &mut sent);
        }
        match &self.broken {
            Some(b) => Err(b.error(self.peer)),
            None => Ok(()),
        }
    }

    fn release(&mut self, token: Token) {
        self.inbox.release(token);
    }

    fn peek(&mut self, buf: &mut [u8]) -> usize {
        self.inbox.peek(buf)
    }

    fn readiness(&self, out: &mut Vec<Readiness>) -> bool {
        // With no interest, poll(2) still reports an error or hang-up on the socket; readable
        // alone would wake the executor at once, again and again, for bytes it will not take.
        out.push(Readiness {
            fd: self.rx.as_raw_fd(),
            read: self.inbox.wants_read(),
            write: false,
        });
        if self.outbox.blocked() {
            out.push(Readiness {
                fd: self.tx.as_raw_fd(),
                read: false,
                write: true,
            });
        }
        true
    }

    fn cancel(&mut self) {
        self.outbox.cancel();
        self.inbox.cancel();
    }

    fn close(&mut self) {
        // Errors mean the connection is already gone, which is what close wants.
        let _ = self.tx.shutdown(Shutdown::Both);
        let _ = self.rx.shutdown(Shutdown::Both);
    }
}
