//! The authentication handshake of one connection, as a non-blocking state machine: the
//! transport's connect loop drives many at once, so a silent or slow stranger holds only its
//! own connection, never the others.
//!
//! This module decides nothing about which ranks are welcome (the caller's `admit` does) and
//! never reads past the handshake: the first frame byte stays in the socket for the link.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

use oxccl_transport::Rank;
use oxccl_transport::auth::{self, Client, HELLO_HEADER, MAC_LEN, NONCE_LEN, Secret, Server};

use crate::wire::{ACK, ClientHello, Lane, ServerHello};

/// What both sides of every handshake of one transport share.
#[derive(Debug)]
pub(crate) struct Local<'a> {
    pub secret: &'a Secret,
    /// `b"oxccl-tcp"` followed by the communicator's context.
    pub context: &'a [u8],
    pub rank: Rank,
    pub nranks: usize,
    /// Random, the same in the hellos of both connections this side opens to each peer, so
    /// that the peer can tell they come from one process.
    pub session: u64,
}

/// Why a handshake failed, in words for the log, and whether the peer simply was not
/// listening (worth retrying quietly).
#[derive(Debug)]
pub(crate) struct Failure {
    pub reason: String,
    pub refused: bool,
}

impl Failure {
    fn new(reason: impl Into<String>) -> Failure {
        Failure {
            reason: reason.into(),
            refused: false,
        }
    }
}

/// The outcome of driving a handshake.
#[derive(Debug)]
pub(crate) enum Step {
    /// Waiting for the socket.
    Pending,
    /// Authenticated and accepted: the peer is this rank, the connection carries data along
    /// this lane, and the connecting side's hellos carry this session.
    Done(Rank, Lane, u64),
    /// Give up on this connection.
    Failed(Failure),
}

#[derive(Debug)]
enum Phase<'a> {
    /// Connecting side: the non-blocking connect has not finished.
    Connecting { peer: Rank, lane: Lane },
    /// Either side: reading the other's hello header.
    HelloHeader {
        client: Option<Client<'a>>,
        peer: Option<(Rank, Lane)>,
    },
    /// Either side: reading the hello payload (and, on the connecting side, the server's MAC).
    HelloBody {
        client: Option<Client<'a>>,
        peer: Option<(Rank, Lane)>,
        nonce: [u8; NONCE_LEN],
        len: usize,
    },
    /// Accepting side: reading the connecting rank's proof.
    Proof {
        server: Server<'a>,
        claimed: Rank,
        lane: Lane,
        session: u64,
    },
    /// Connecting side: waiting for the accepting side's verdict.
    Ack { peer: Rank, lane: Lane },
    /// Finished (or failed); nothing more to drive.
    Over,
}

/// One connection being authenticated.
#[derive(Debug)]
pub(crate) struct Handshake<'a> {
    pub stream: mio::net::TcpStream,
    pub addr: SocketAddr,
    /// When to give up on it.
    pub expires: Instant,
    /// Whether the other side connected to this one (a possible stranger).
    pub incoming: bool,
    local: &'a Local<'a>,
    phase: Phase<'a>,
    out: Vec<u8>,
    out_pos: usize,
    inp: Vec<u8>,
    need: usize,
}

impl<'a> Handshake<'a> {
    /// The accepting side of a connection from `addr`.
    pub fn accepting(
        local: &'a Local<'a>,
        stream: mio::net::TcpStream,
        addr: SocketAddr,
        expires: Instant,
    ) -> Handshake<'a> {
        Handshake {
            stream,
            addr,
            expires,
            incoming: true,
            local,
            phase: Phase::HelloHeader {
                client: None,
                peer: None,
            },
            out: Vec::new(),
            out_pos: 0,
            inp: Vec::with_capacity(HELLO_HEADER),
            need: HELLO_HEADER,
        }
    }

    /// The connecting side of a connection to rank `peer` at `addr` (`stream` still
    /// connecting), to carry data along `lane`.
    pub fn connecting(
        local: &'a Local<'a>,
        stream: mio::net::TcpStream,
        addr: SocketAddr,
        peer: Rank,
        lane: Lane,
        expires: Instant,
    ) -> Handshake<'a> {
        Handshake {
            stream,
            addr,
            expires,
            incoming: false,
            local,
            phase: Phase::Connecting { peer, lane },
            out: Vec::new(),
            out_pos: 0,
            inp: Vec::new(),
            need: 0,
        }
    }

    /// Makes all the progress the socket allows. `admit(rank, lane, session)` says whether the
    /// accepting side still waits for `rank`'s connection along `lane` from that session (and
    /// why not); it is asked when the hello arrives and again just before accepting.
    pub fn drive(&mut self, admit: &dyn Fn(Rank, Lane, u64) -> Result<(), String>) -> Step {
        match self.advance(admit) {
            Ok(Some((rank, lane, session))) => {
                self.phase = Phase::Over;
                Step::Done(rank, lane, session)
            }
            Ok(None) => Step::Pending,
            Err(f) => {
                self.phase = Phase::Over;
                Step::Failed(f)
            }
        }
    }

    fn advance(
        &mut self,
        admit: &dyn Fn(Rank, Lane, u64) -> Result<(), String>,
    ) -> Result<Option<(Rank, Lane, u64)>, Failure> {
        loop {
            if !self.flush()? {
                return Ok(None);
            }
            if let Phase::Connecting { peer, lane } = self.phase {
                if !self.connected()? {
                    return Ok(None);
                }
                let hello = ClientHello {
                    from: self.local.rank,
                    to: peer,
                    nranks: self.local.nranks,
                    lane,
                    session: self.local.session,
                }
                .encode();
                let (client, msg) = Client::start(self.local.secret, self.local.context, &hello)
                    .map_err(|e| Failure::new(e.to_string()))?;
                self.send(msg);
                self.expect(HELLO_HEADER);
                self.phase = Phase::HelloHeader {
                    client: Some(client),
                    peer: Some((peer, lane)),
                };
                continue;
            }
            if matches!(self.phase, Phase::Over) {
                return Err(Failure::new("handshake driven after it ended"));
            }
            let proving = matches!(self.phase, Phase::Proof { .. });
            let filled = self.fill().map_err(|mut f| {
                if proving {
                    // The client checks this side's MAC before proving its own: hanging up
                    // here is how a client with another secret or context says no.
                    f.reason += " (it rejected this side's proof: wrong secret or communicator?)";
                }
                f
            })?;
            if !filled {
                return Ok(None);
            }
            let phase = std::mem::replace(&mut self.phase, Phase::Over);
            self.phase = match phase {
                Phase::HelloHeader { client, peer } => {
                    let header: [u8; HELLO_HEADER] = self.inp[..]
                        .try_into()
                        .map_err(|_| Failure::new("short hello header"))?;
                    let (nonce, len) = auth::parse_hello_header(&header)
                        .map_err(|e| Failure::new(e.to_string()))?;
                    // The connecting side also reads the server's MAC with the payload.
                    self.expect(len + if client.is_some() { MAC_LEN } else { 0 });
                    Phase::HelloBody {
                        client,
                        peer,
                        nonce,
                        len,
                    }
                }
                Phase::HelloBody {
                    client: Some(client),
                    peer: Some((peer, lane)),
                    nonce,
                    len,
                } => {
                    let (hello, mac) = self.inp.split_at(len);
                    let mac: &[u8; MAC_LEN] = mac
                        .try_into()
                        .map_err(|_| Failure::new("short server MAC"))?;
                    let (proof, server_hello) = client
                        .finish(nonce, hello, mac)
                        .map_err(|e| Failure::new(e.to_string()))?;
                    let want = ServerHello {
                        rank: peer,
                        nranks: self.local.nranks,
                    };
                    match ServerHello::decode(&server_hello) {
                        Some(h) if h == want => {}
                        Some(h) => {
                            return Err(Failure::new(format!(
                                "the listener is rank {} of {}, not rank {} of {}",
                                h.rank, h.nranks, want.rank, want.nranks
                            )));
                        }
                        None => return Err(Failure::new("malformed server hello")),
                    }
                    self.send(proof);
                    self.expect(1);
                    Phase::Ack { peer, lane }
                }
                Phase::HelloBody { nonce, .. } => {
                    let hello = ClientHello::decode(&self.inp).ok_or_else(|| {
                        Failure::new(format!("malformed hello of {} bytes", self.inp.len()))
                    })?;
                    self.check_hello(&hello, admit)?;
                    let reply = ServerHello {
                        rank: self.local.rank,
                        nranks: self.local.nranks,
                    }
                    .encode();
                    let (server, msg) = Server::answer(
                        self.local.secret,
                        self.local.context,
                        nonce,
                        &self.inp,
                        &reply,
                    )
                    .map_err(|e| Failure::new(e.to_string()))?;
                    self.send(msg);
                    self.expect(MAC_LEN);
                    Phase::Proof {
                        server,
                        claimed: hello.from,
                        lane: hello.lane,
                        session: hello.session,
                    }
                }
                Phase::Proof {
                    server,
                    claimed,
                    lane,
                    session,
                } => {
                    let proof: &[u8; MAC_LEN] = self.inp[..]
                        .try_into()
                        .map_err(|_| Failure::new("short proof"))?;
                    server
                        .finish(proof)
                        .map_err(|e| Failure::new(format!("rank {claimed}: {e}")))?;
                    admit(claimed, lane, session).map_err(Failure::new)?;
                    // The verdict must reach the kernel now, while `admit`'s answer still holds:
                    // one byte on a fresh connection never finds the send buffer full.
                    match (&self.stream).write(&[ACK]) {
                        Ok(1) => return Ok(Some((claimed, lane, session))),
                        Ok(_) => return Err(Failure::new("could not send the acknowledgement")),
                        Err(e) => return Err(io_failure("acknowledge", e)),
                    }
                }
                Phase::Ack { peer, lane } => {
                    if self.inp[..] != [ACK] {
                        return Err(Failure::new("bad acknowledgement"));
                    }
                    return Ok(Some((peer, lane, self.local.session)));
                }
                Phase::Connecting { .. } | Phase::Over => {
                    return Err(Failure::new("handshake in an impossible state"));
                }
            };
        }
    }

    fn check_hello(
        &self,
        hello: &ClientHello,
        admit: &dyn Fn(Rank, Lane, u64) -> Result<(), String>,
    ) -> Result<(), Failure> {
        if hello.nranks != self.local.nranks {
            return Err(Failure::new(format!(
                "rank {} belongs to a communicator of {} ranks, not {}",
                hello.from, hello.nranks, self.local.nranks
            )));
        }
        if hello.to != self.local.rank {
            return Err(Failure::new(format!(
                "rank {} wants rank {}, but this is rank {}",
                hello.from, hello.to, self.local.rank
            )));
        }
        admit(hello.from, hello.lane, hello.session).map_err(Failure::new)
    }

    /// Whether the non-blocking connect has finished.
    fn connected(&self) -> Result<bool, Failure> {
        if let Some(e) = self
            .stream
            .take_error()
            .map_err(|e| io_failure("connect", e))?
        {
            return Err(io_failure("connect", e));
        }
        match self.stream.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(io_failure("connect", e)),
        }
    }

    fn send(&mut self, msg: Vec<u8>) {
        self.out = msg;
        self.out_pos = 0;
    }

    fn expect(&mut self, n: usize) {
        self.inp.clear();
        self.need = n;
    }

    /// Writes pending output; `Ok(false)` if the socket would block.
    fn flush(&mut self) -> Result<bool, Failure> {
        while self.out_pos < self.out.len() {
            match (&self.stream).write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(Failure::new("the connection closed")),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_failure("send", e)),
            }
        }
        Ok(true)
    }

    /// Reads until exactly `need` bytes are in `inp` (never more); `Ok(false)` if the socket
    /// would block first.
    fn fill(&mut self) -> Result<bool, Failure> {
        let mut chunk = [0u8; 512];
        while self.inp.len() < self.need {
            let want = (self.need - self.inp.len()).min(chunk.len());
            match (&self.stream).read(&mut chunk[..want]) {
                Ok(0) => return Err(Failure::new("the connection closed mid-handshake")),
                Ok(n) => self.inp.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_failure("receive", e)),
            }
        }
        Ok(true)
    }
}

fn io_failure(what: &str, e: io::Error) -> Failure {
    Failure {
        refused: e.kind() == io::ErrorKind::ConnectionRefused,
        reason: format!("{what}: {e}"),
    }
}
