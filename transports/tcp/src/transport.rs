//! [`TcpTransport`]: the listener, and the connect loop that turns peers' endpoints into
//! authenticated [`TcpLink`]s, one per peer, each over two connections (one per direction of
//! data: see [`Lane`]).
//!
//! The loop is one thread multiplexing every connection with mio: outgoing connects to lower
//! ranks (retried while refused), incoming connections from higher ranks, each authenticated by
//! its own [`Handshake`]. It must never block on one connection, and never hand out a link whose
//! peer has not proven it knows the secret and is a rank this side still waits for.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token as MioToken};
use oxccl_transport::auth::Secret;
use oxccl_transport::{Link, PeerInfo, Rank, Result, Transport, TransportError};

use crate::handshake::{Handshake, Local, Step};
use crate::link::TcpLink;
use crate::wire::{self, AUTH_CONTEXT, Lane};

/// How long a stranger may take to authenticate before its connection is dropped.
const ACCEPT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// First and largest pause between attempts to reach a peer that is not listening.
const RETRY_FIRST: Duration = Duration::from_millis(2);
const RETRY_MAX: Duration = Duration::from_millis(100);
/// Unauthenticated incoming connections held at once, beyond two per expected peer; when more
/// arrive, the oldest is dropped (a legitimate peer caught in a flood reconnects).
const SPARE_INCOMING: usize = 32;
const LISTENER: MioToken = MioToken(usize::MAX);

/// Settings of one rank's TCP transport.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// This process's rank.
    pub rank: Rank,
    /// Ranks in the communicator (at most `u32::MAX`).
    pub nranks: usize,
    /// The job's secret; every connection proves knowledge of it.
    pub secret: Secret,
    /// The address to listen on and to publish; peers must be able to reach it.
    pub bind_ip: IpAddr,
    /// Largest data message in bytes (at most `u32::MAX`); each link's receive ring holds two
    /// of them plus headers.
    pub max_message: usize,
    /// Distinguishes communicators sharing a secret: goes into the authentication context
    /// (`b"oxccl-tcp"` followed by these bytes), so links of different communicators never
    /// connect to each other.
    pub context: Vec<u8>,
}

/// One rank's TCP transport: a listener, then one [`TcpLink`] per peer.
#[derive(Debug)]
pub struct TcpTransport {
    cfg: TcpConfig,
    listener: Option<TcpListener>,
    endpoint: Option<Vec<u8>>,
    socket_buffer: Option<usize>,
}

impl TcpTransport {
    /// A transport with these settings; nothing is bound until [`Transport::listen`].
    pub fn new(cfg: TcpConfig) -> Result<TcpTransport> {
        if cfg.rank >= cfg.nranks || cfg.nranks > u32::MAX as usize {
            return Err(TransportError::Unavailable(format!(
                "tcp: rank {} of {} ranks is out of range",
                cfg.rank, cfg.nranks
            )));
        }
        if cfg.max_message > u32::MAX as usize {
            return Err(TransportError::Unavailable(format!(
                "tcp: messages of {} bytes do not fit a frame's 32-bit length",
                cfg.max_message
            )));
        }
        Ok(TcpTransport {
            cfg,
            listener: None,
            endpoint: None,
            socket_buffer: None,
        })
    }

    /// Sets `SO_SNDBUF` of every link's sending socket and `SO_RCVBUF` of its receiving one
    /// to `bytes`. `None`, the
    /// default, leaves the kernel's auto-tuning alone: fixed 4 MiB buffers measured no faster
    /// on loopback (`examples/tcp_perf.rs --sockbuf`), and fixing them turns auto-tuning off.
    pub fn with_socket_buffers(mut self, bytes: Option<usize>) -> TcpTransport {
        self.socket_buffer = bytes;
        self
    }

    /// The settings.
    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    /// As [`Transport::connect`], returning the concrete links (for their statistics).
    pub fn connect_links(
        &mut self,
        peers: &[&PeerInfo],
        deadline: Instant,
    ) -> Result<Vec<TcpLink>> {
        // Whatever happens, the listener closes here: later strangers are refused.
        let listener = self.listener.take();
        let me = self.cfg.rank;
        let mut addrs = BTreeMap::new();
        for p in peers {
            if p.rank == me || p.rank >= self.cfg.nranks {
                return Err(TransportError::Unavailable(format!(
                    "tcp: rank {me} cannot link to rank {} of {}",
                    p.rank, self.cfg.nranks
                )));
            }
            let addr = p
                .endpoint("tcp")
                .and_then(wire::decode_endpoint)
                .ok_or_else(|| {
                    TransportError::Unavailable(format!(
                        "tcp: rank {} published no tcp endpoint",
                        p.rank
                    ))
                })?;
            if addrs.insert(p.rank, addr).is_some() {
                return Err(TransportError::Unavailable(format!(
                    "tcp: rank {} is listed twice among rank {me}'s peers",
                    p.rank
                )));
            }
        }
        let context = [AUTH_CONTEXT, &self.cfg.context].concat();
        let session = oxccl_transport::auth::random_bytes()?;
        let local = Local {
            secret: &self.cfg.secret,
            context: &context,
            rank: me,
            nranks: self.cfg.nranks,
            session: u64::from_le_bytes(session[..8].try_into().expect("8 of 32 bytes")),
        };
        let mut streams = ConnectLoop::new(&local, listener, &addrs, deadline)?.run()?;
        peers
            .iter()
            .map(|p| {
                let mut lane = |lane: Lane| {
                    streams.remove(&(p.rank, lane)).ok_or_else(|| {
                        TransportError::Unavailable(format!(
                            "tcp: rank {me} has no {lane:?} connection with rank {}",
                            p.rank
                        ))
                    })
                };
                let out = Lane::sending(me, p.rank);
                let (tx, rx) = (lane(out)?, lane(out.reverse())?);
                TcpLink::new(p.rank, tx, rx, self.cfg.max_message, self.socket_buffer)
            })
            .collect()
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn listen(&mut self) -> Result<Vec<u8>> {
        if let Some(e) = &self.endpoint {
            return Ok(e.clone());
        }
        let what = || format!("tcp: rank {} listen on {}", self.cfg.rank, self.cfg.bind_ip);
        let l =
            TcpListener::bind((self.cfg.bind_ip, 0)).map_err(|e| TransportError::io(what(), e))?;
        l.set_nonblocking(true)
            .map_err(|e| TransportError::io(what(), e))?;
        let addr = l.local_addr().map_err(|e| TransportError::io(what(), e))?;
        let e = wire::encode_endpoint(&addr);
        self.listener = Some(l);
        self.endpoint = Some(e.clone());
        Ok(e)
    }

    fn can_connect(&self, me: &PeerInfo, peer: &PeerInfo) -> bool {
        me.endpoint(self.name()).is_some() && peer.endpoint(self.name()).is_some()
    }

    fn connect(&mut self, peers: &[&PeerInfo], deadline: Instant) -> Result<Vec<Box<dyn Link>>> {
        Ok(self
            .connect_links(peers, deadline)?
            .into_iter()
            .map(|l| Box::new(l) as Box<dyn Link>)
            .collect())
    }
}

/// An outgoing connection to a lower rank, between attempts or during one.
#[derive(Debug)]
struct Outgoing {
    addr: SocketAddr,
    next_try: Instant,
    backoff: Duration,
    attempt: Option<usize>,
    last_error: Option<String>,
}

/// The state of one `connect_links` call.
struct ConnectLoop<'a> {
    local: &'a Local<'a>,
    poll: Poll,
    listener: Option<mio::net::TcpListener>,
    deadline: Instant,
    /// Handshakes in progress, indexed by their mio token.
    slots: Vec<Option<Handshake<'a>>>,
    /// Connections to lower ranks, one per lane.
    outgoing: BTreeMap<(Rank, Lane), Outgoing>,
    /// Higher ranks this side accepts from, and along which lanes.
    incoming: BTreeSet<(Rank, Lane)>,
    done: BTreeMap<(Rank, Lane), TcpStream>,
    /// The session of each higher rank's first accepted connection: its other one must match.
    sessions: BTreeMap<Rank, u64>,
    expected: usize,
}

impl<'a> ConnectLoop<'a> {
    fn new(
        local: &'a Local<'a>,
        listener: Option<TcpListener>,
        addrs: &BTreeMap<Rank, SocketAddr>,
        deadline: Instant,
    ) -> Result<ConnectLoop<'a>> {
        let me = local.rank;
        let what = |w: &str| format!("tcp: rank {me} connecting to its peers: {w}");
        let poll = Poll::new().map_err(|e| TransportError::io(what("create a poller"), e))?;
        let incoming: BTreeSet<(Rank, Lane)> = addrs
            .keys()
            .copied()
            .filter(|&r| r > me)
            .flat_map(|r| Lane::BOTH.map(|l| (r, l)))
            .collect();
        let listener = match listener {
            Some(l) if !incoming.is_empty() => {
                let mut l = mio::net::TcpListener::from_std(l);
                poll.registry()
                    .register(&mut l, LISTENER, Interest::READABLE)
                    .map_err(|e| TransportError::io(what("watch the listener"), e))?;
                Some(l)
            }
            Some(_) => None,
            None if incoming.is_empty() => None,
            None => {
                let from: BTreeSet<Rank> = incoming.iter().map(|&(r, _)| r).collect();
                return Err(TransportError::Unavailable(format!(
                    "tcp: rank {me} must listen() before accepting ranks {from:?}"
                )));
            }
        };
        let now = Instant::now();
        let outgoing = addrs
            .iter()
            .filter(|(r, _)| **r < me)
            .flat_map(|(&r, &addr)| {
                Lane::BOTH.map(|lane| {
                    let o = Outgoing {
                        addr,
                        next_try: now,
                        backoff: RETRY_FIRST,
                        attempt: None,
                        last_error: None,
                    };
                    ((r, lane), o)
                })
            })
            .collect();
        Ok(ConnectLoop {
            local,
            poll,
            listener,
            deadline,
            slots: Vec::new(),
            outgoing,
            incoming,
            done: BTreeMap::new(),
            sessions: BTreeMap::new(),
            expected: 2 * addrs.len(),
        })
    }

    fn run(mut self) -> Result<BTreeMap<(Rank, Lane), TcpStream>> {
        let mut events = Events::with_capacity(64);
        loop {
            let now = Instant::now();
            self.start_attempts(now);
            self.expire(now);
            if self.done.len() == self.expected {
                for h in self.slots.iter().flatten().filter(|h| h.incoming) {
                    tracing::warn!(
                        me = self.local.rank,
                        addr = %h.addr,
                        "tcp: dropped a connection that had not authenticated when all peers were in"
                    );
                }
                return Ok(self.done);
            }
            if now >= self.deadline {
                return Err(self.timeout());
            }
            let wake = self
                .outgoing
                .values()
                .filter(|o| o.attempt.is_none())
                .map(|o| o.next_try)
                .chain(self.slots.iter().flatten().map(|h| h.expires))
                .fold(self.deadline, Instant::min);
            let timeout = wake.saturating_duration_since(now);
            if let Err(e) = self.poll.poll(&mut events, Some(timeout))
                && e.kind() != io::ErrorKind::Interrupted
            {
                let me = self.local.rank;
                return Err(TransportError::io(
                    format!("tcp: rank {me} waiting for peers"),
                    e,
                ));
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    MioToken(slot) => self.drive(slot),
                }
            }
        }
    }

    /// The ranks not yet connected and what went wrong with each, as a Timeout error.
    fn timeout(&self) -> TransportError {
        let missing: BTreeSet<Rank> = self
            .outgoing
            .keys()
            .chain(self.incoming.iter())
            .filter(|k| !self.done.contains_key(k))
            .map(|&(r, _)| r)
            .collect();
        let missing: Vec<Rank> = missing.into_iter().collect();
        let mut why: Vec<String> = self
            .outgoing
            .iter()
            .filter(|(k, _)| !self.done.contains_key(k))
            .filter_map(|((r, _), o)| {
                Some(format!(
                    "rank {r} at {}: {}",
                    o.addr,
                    o.last_error.as_ref()?
                ))
            })
            .collect();
        why.dedup();
        let mut msg = format!(
            "tcp: rank {} could not connect to ranks {missing:?} by the deadline",
            self.local.rank
        );
        if !why.is_empty() {
            msg += &format!(" ({})", why.join("; "));
        }
        TransportError::Timeout(msg)
    }

    fn start_attempts(&mut self, now: Instant) {
        let due: Vec<(Rank, Lane)> = self
            .outgoing
            .iter()
            .filter(|(k, o)| o.attempt.is_none() && o.next_try <= now && !self.done.contains_key(k))
            .map(|(k, _)| *k)
            .collect();
        for key @ (peer, lane) in due {
            let Some(o) = self.outgoing.get(&key) else {
                continue;
            };
            let addr = o.addr;
            let started = mio::net::TcpStream::connect(addr).and_then(|mut s| {
                let slot = self.free_slot();
                self.poll.registry().register(
                    &mut s,
                    MioToken(slot),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                Ok((slot, s))
            });
            match started {
                Ok((slot, s)) => {
                    let h = Handshake::connecting(self.local, s, addr, peer, lane, self.deadline);
                    self.slots[slot] = Some(h);
                    if let Some(o) = self.outgoing.get_mut(&key) {
                        o.attempt = Some(slot);
                    }
                    self.drive(slot);
                }
                Err(e) => self.retry_later(key, format!("connect: {e}"), now),
            }
        }
    }

    fn retry_later(&mut self, key: (Rank, Lane), reason: String, now: Instant) {
        if let Some(o) = self.outgoing.get_mut(&key) {
            o.attempt = None;
            o.next_try = now + o.backoff;
            o.backoff = (o.backoff * 2).min(RETRY_MAX);
            o.last_error = Some(reason);
        }
    }

    fn free_slot(&mut self) -> usize {
        match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].as_ref().is_some_and(|h| h.expires <= now) {
                // An attempt of ours runs until the deadline, so one cut off there says less
                // than the failure of the attempt before it ("authentication failed", say),
                // which the timeout's error must still name.
                let before = self
                    .outgoing
                    .values()
                    .find(|o| o.attempt == Some(slot))
                    .and_then(|o| o.last_error.as_deref());
                let reason = match before {
                    Some(b) => format!("handshake timed out; the attempt before: {b}"),
                    None => "handshake timed out".into(),
                };
                self.fail(slot, reason, false);
            }
        }
    }

    fn accept(&mut self) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            match listener.accept() {
                Ok((mut stream, addr)) => {
                    self.make_room_for_incoming();
                    let slot = self.free_slot();
                    if let Err(e) = self.poll.registry().register(
                        &mut stream,
                        MioToken(slot),
                        Interest::READABLE | Interest::WRITABLE,
                    ) {
                        tracing::warn!(%addr, error = %e, "tcp: dropped a connection: cannot watch it");
                        continue;
                    }
                    let expires = (Instant::now() + ACCEPT_HANDSHAKE_TIMEOUT).min(self.deadline);
                    self.slots[slot] =
                        Some(Handshake::accepting(self.local, stream, addr, expires));
                    self.drive(slot);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if is_transient_accept_error(&e) => {}
                Err(e) => {
                    // Out of descriptors or similar: the next connection's event retries.
                    tracing::warn!(error = %e, rank = self.local.rank, "tcp: accept failed");
                    return;
                }
            }
        }
    }

    /// Drops the oldest unauthenticated incoming connection if too many are waiting.
    fn make_room_for_incoming(&mut self) {
        let limit = self.incoming.len() + SPARE_INCOMING;
        let pending: Vec<(Instant, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.as_ref().filter(|h| h.incoming).map(|h| (h.expires, i)))
            .collect();
        if pending.len() >= limit
            && let Some(&(_, oldest)) = pending.iter().min()
        {
            self.fail(
                oldest,
                "too many connections waiting to authenticate".into(),
                false,
            );
        }
    }

    fn drive(&mut self, slot: usize) {
        let Some(h) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let done = &self.done;
        let incoming = &self.incoming;
        let sessions = &self.sessions;
        let admit = |r: Rank, lane: Lane, session: u64| -> Result<(), String> {
            if !incoming.contains(&(r, lane)) {
                Err(format!(
                    "claims rank {r}, which this rank does not accept from"
                ))
            } else if done.contains_key(&(r, lane)) {
                Err(format!(
                    "claims rank {r}, which is already connected ({lane:?} lane)"
                ))
            } else if sessions.get(&r).is_some_and(|&s| s != session) {
                Err(format!(
                    "claims rank {r}, whose other connection came from another process"
                ))
            } else {
                Ok(())
            }
        };
        match h.drive(&admit) {
            Step::Pending => {}
            Step::Failed(f) => self.fail(slot, f.reason, f.refused),
            Step::Done(rank, lane, session) => {
                let Some(mut h) = self.slots[slot].take() else {
                    return;
                };
                let _ = self.poll.registry().deregister(&mut h.stream);
                tracing::debug!(me = self.local.rank, peer = rank, ?lane, addr = %h.addr, "tcp: connected");
                if let Some(o) = self.outgoing.get_mut(&(rank, lane)) {
                    o.attempt = None;
                }
                if h.incoming {
                    self.sessions.insert(rank, session);
                }
                self.done.insert((rank, lane), TcpStream::from(h.stream));
            }
        }
    }

    /// Drops the connection in `slot`, logging why; an outgoing one is retried later.
    fn fail(&mut self, slot: usize, reason: String, refused: bool) {
        let Some(mut h) = self.slots.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut h.stream);
        let me = self.local.rank;
        let target = self
            .outgoing
            .iter()
            .find(|(_, o)| o.attempt == Some(slot))
            .map(|(k, _)| *k);
        match target {
            Some(key @ (peer, _)) => {
                if refused {
                    tracing::debug!(me, peer, addr = %h.addr, %reason, "tcp: peer not listening yet");
                } else {
                    tracing::warn!(me, peer, addr = %h.addr, %reason, "tcp: connecting to a peer failed; retrying");
                }
                self.retry_later(key, reason, Instant::now());
            }
            None => {
                tracing::warn!(me, addr = %h.addr, %reason, "tcp: rejected an incoming connection");
            }
        }
    }
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}
