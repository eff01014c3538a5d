//! The TCP store server: one background thread running a mio event loop that authenticates
//! every connection, then answers set/get/add/wait/check requests, parking get and wait until
//! their keys are set or their timeout passes. It must never block, never allocate from a
//! length before checking it, and never let one bad connection disturb the others.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use oxccl_transport::auth::{self, HELLO_HEADER, MAC_LEN, MAX_HELLO, Secret};

use super::wire::{self, MAX_FRAME, Request, Response, STORE_CONTEXT};
use super::{add_counter, first_missing};
use crate::{Error, Result};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// Largest read into a connection's buffer at once.
const READ_CHUNK: usize = 64 << 10;
/// A connection whose unread input reaches this stops being read (its requests are waiting on
/// a parked request or on output the client does not read).
const INPUT_CAP: usize = 4 + MAX_FRAME + READ_CHUNK;
/// A connection with this much unsent output gets no more requests processed until it drains.
const OUTPUT_CAP: usize = 2 * MAX_FRAME;
/// Longest wait a request may ask for (longer ones are cut to this).
const MAX_WAIT: Duration = Duration::from_secs(30 * 24 * 3600);
/// Buffers bigger than this are given back to the allocator once empty.
const KEEP_CAPACITY: usize = 1 << 20;
/// How soon to retry `accept` after it failed (out of file descriptors, say).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Limits a [`StoreServer`] enforces on its connections.
#[derive(Clone, Debug)]
pub struct ServerLimits {
    /// How long a new connection has to complete the authentication handshake before it is
    /// dropped (default 5 s; the handshake is two messages each way).
    pub handshake_timeout: Duration,
    /// Most connections open at once; further ones are closed as soon as they are accepted,
    /// so a flood cannot exhaust the process (default: three quarters of this process's
    /// descriptor limit, at most 4096).
    pub max_connections: usize,
    /// Most connections still in their handshake at once (default 128): when a new one
    /// arrives over the limit, the oldest of them is dropped, so strangers that connect and
    /// say nothing (or too slowly) cannot hold the store, and clients that were dropped retry
    /// within their deadline.
    pub max_unauthenticated: usize,
}

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        let fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(4096);
        ServerLimits {
            handshake_timeout: Duration::from_secs(5),
            max_connections: usize::try_from(fds / 4 * 3).unwrap_or(4096).clamp(16, 4096),
            max_unauthenticated: 128,
        }
    }
}

/// A running TCP store: a background thread serving the [store protocol](super#the-tcp-store-protocol)
/// to clients that know the job secret ([`super::TcpStore`]).
///
/// Connections that fail authentication, send garbage or oversized frames, or do not finish the
/// handshake in time are dropped and logged (`tracing::warn`, with the peer address and the
/// reason); the server goes on serving everyone else. Dropping the `StoreServer` stops the
/// thread and closes every connection, so clients see an error rather than a hang.
pub struct StoreServer {
    addr: SocketAddr,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Listens on `addr` (port 0 picks a free port) with the default [`ServerLimits`].
    pub fn bind(addr: SocketAddr, secret: Secret) -> Result<StoreServer> {
        StoreServer::bind_with(addr, secret, ServerLimits::default())
    }

    /// Listens on `addr` with explicit limits.
    pub fn bind_with(
        addr: SocketAddr,
        secret: Secret,
        limits: ServerLimits,
    ) -> Result<StoreServer> {
        let io = |what: String| move |source| Error::Io { what, source };
        let poll = Poll::new().map_err(io("create the store server's poller".into()))?;
        let mut listener =
            TcpListener::bind(addr).map_err(io(format!("bind the store server to {addr}")))?;
        let addr = listener.local_addr().map_err(io(format!(
            "read the store server's address (bound to {addr})"
        )))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(io(format!("register the store listener on {addr}")))?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(io(format!(
            "create the waker of the store server on {addr}"
        )))?);
        let thread = std::thread::Builder::new()
            .name("oxccl-store".into())
            .spawn(move || EventLoop::new(&secret, limits, poll, listener, addr).run())
            .map_err(io(format!("start the store server thread for {addr}")))?;
        tracing::debug!(%addr, "store server listening");
        Ok(StoreServer {
            addr,
            waker,
            thread: Some(thread),
        })
    }

    /// The address the server listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        if let Err(e) = self.waker.wake() {
            // Without a wake-up the thread would serve on; leave it detached rather than hang.
            tracing::error!(addr = %self.addr, "cannot stop the store server: {e}");
            return;
        }
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!(addr = %self.addr, "the store server thread panicked");
        }
    }
}

/// Why a connection is closed; `warn` ones are logged as warnings, the rest at debug level
/// (unauthenticated connections always warn).
struct Close {
    reason: String,
    warn: bool,
}

impl Close {
    fn warn(reason: impl Into<String>) -> Close {
        Close {
            reason: reason.into(),
            warn: true,
        }
    }

    fn quiet(reason: impl Into<String>) -> Close {
        Close {
            reason: reason.into(),
            warn: false,
        }
    }
}

enum Phase<'s> {
    /// Waiting for the ClientHello.
    Hello,
    /// ServerHello sent, waiting for the ClientProof.
    Proof(auth::Server<'s>),
    /// Authenticated: requests flow.
    Ready,
}

/// A get or wait that must wait for keys.
struct Parked {
    keys: Vec<String>,
    /// GET answers with the value of its one key; WAIT with nothing.
    reply_value: bool,
    deadline: Instant,
}

struct Conn<'s> {
    stream: TcpStream,
    peer: SocketAddr,
    phase: Phase<'s>,
    handshake_deadline: Instant,
    input: Vec<u8>,
    output: Vec<u8>,
    written: usize,
    parked: Option<Parked>,
    /// The deadline this connection has in the event loop's timer set.
    timer: Option<Instant>,
}

impl<'s> Conn<'s> {
    fn authenticated(&self) -> bool {
        matches!(self.phase, Phase::Ready)
    }

    /// The deadline the event loop must wake this connection at.
    fn wanted_timer(&self) -> Option<Instant> {
        match (&self.phase, &self.parked) {
            (Phase::Ready, Some(p)) => Some(p.deadline),
            (Phase::Ready, None) => None,
            _ => Some(self.handshake_deadline),
        }
    }

    fn respond(&mut self, r: &Response) {
        self.output.extend_from_slice(&wire::response(r));
    }

    /// Writes pending output until the socket would block.
    fn flush(&mut self) -> std::result::Result<(), Close> {
        while self.written < self.output.len() {
            match self.stream.write(&self.output[self.written..]) {
                Ok(0) => return Err(Close::warn("the socket accepts no more data")),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Close::quiet(format!("write failed: {e}"))),
            }
        }
        self.output.clear();
        self.written = 0;
        if self.output.capacity() > KEEP_CAPACITY {
            self.output.shrink_to(0);
        }
        Ok(())
    }

    /// How many bytes the next read may bring in: during the handshake no more than the message
    /// being waited for, so a stranger cannot make the server buffer anything sizeable.
    fn read_budget(&self) -> usize {
        match self.phase {
            Phase::Hello => (HELLO_HEADER + MAX_HELLO).saturating_sub(self.input.len()),
            Phase::Proof(_) => MAC_LEN.saturating_sub(self.input.len()),
            Phase::Ready => READ_CHUNK.min(INPUT_CAP.saturating_sub(self.input.len())),
        }
    }

    /// Serves the connection as far as it can go without blocking: writes pending output,
    /// handles buffered messages, reads more. Sets `changed` when the store's data changed —
    /// also when the connection then fails, since others may be waiting for that change.
    fn pump(
        &mut self,
        secret: &'s Secret,
        data: &mut HashMap<String, Vec<u8>>,
        changed: &mut bool,
    ) -> std::result::Result<(), Close> {
        loop {
            self.process(secret, data, changed)?;
            self.flush()?;
            let budget = self.read_budget();
            if budget == 0 {
                return Ok(());
            }
            let len = self.input.len();
            self.input.resize(len + budget, 0);
            let read = self.stream.read(&mut self.input[len..]);
            self.input.truncate(len + *read.as_ref().unwrap_or(&0));
            match read {
                Ok(0) if self.authenticated() => {
                    return Err(Close::quiet("the client closed the connection"));
                }
                Ok(0) => return Err(Close::warn("closed the connection during the handshake")),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Close::quiet(format!("read failed: {e}"))),
            }
        }
    }

    /// Handles every complete message in the input buffer, in order, until one parks or the
    /// output backs up. Sets `changed` when the store's data changed.
    fn process(
        &mut self,
        secret: &'s Secret,
        data: &mut HashMap<String, Vec<u8>>,
        changed: &mut bool,
    ) -> std::result::Result<(), Close> {
        let mut pos = 0;
        let result = loop {
            if self.parked.is_some() || self.output.len() - self.written > OUTPUT_CAP {
                break Ok(());
            }
            let avail = &self.input[pos..];
            match &self.phase {
                Phase::Hello => {
                    let Some(header) = avail.first_chunk::<HELLO_HEADER>() else {
                        break Ok(());
                    };
                    let (nonce, len) = match auth::parse_hello_header(header) {
                        Ok(h) => h,
                        Err(e) => break Err(Close::warn(format!("bad hello: {e}"))),
                    };
                    let Some(hello) = avail.get(HELLO_HEADER..HELLO_HEADER + len) else {
                        break Ok(());
                    };
                    match auth::Server::answer(secret, STORE_CONTEXT, nonce, hello, b"") {
                        Ok((server, msg)) => {
                            self.output.extend_from_slice(&msg);
                            self.phase = Phase::Proof(server);
                            pos += HELLO_HEADER + len;
                        }
                        Err(e) => break Err(Close::warn(format!("cannot answer the hello: {e}"))),
                    }
                }
                Phase::Proof(_) => {
                    let Some(proof) = avail.first_chunk::<MAC_LEN>().copied() else {
                        break Ok(());
                    };
                    pos += MAC_LEN;
                    let Phase::Proof(server) = std::mem::replace(&mut self.phase, Phase::Ready)
                    else {
                        break Ok(());
                    };
                    if let Err(e) = server.finish(&proof) {
                        break Err(Close::warn(format!("authentication failed: {e}")));
                    }
                    tracing::debug!(peer = %self.peer, "store client authenticated");
                }
                Phase::Ready => {
                    let Some(header) = avail.first_chunk::<4>() else {
                        break Ok(());
                    };
                    let len = u32::from_le_bytes(*header) as usize;
                    if len > MAX_FRAME {
                        break Err(Close::warn(format!(
                            "frame of {len} bytes exceeds the limit of {MAX_FRAME}"
                        )));
                    }
                    let Some(payload) = avail.get(4..4 + len) else {
                        break Ok(());
                    };
                    let request = match Request::decode(payload) {
                        Ok(r) => r,
                        Err(e) => break Err(Close::warn(format!("malformed request: {e}"))),
                    };
                    pos += 4 + len;
                    *changed |= self.handle(request, data);
                }
            }
        };
        self.input.drain(..pos);
        if self.input.is_empty() && self.input.capacity() > KEEP_CAPACITY {
            self.input.shrink_to(0);
        }
        result
    }

    /// Answers one request or parks it. Returns whether the store's data changed.
    fn handle(&mut self, request: Request, data: &mut HashMap<String, Vec<u8>>) -> bool {
        let (keys, reply_value, timeout) = match request {
            Request::Set { key, value } => {
                data.insert(key, value);
                self.respond(&Response::Ok(Vec::new()));
                return true;
            }
            Request::Add { key, delta } => {
                let r = add_counter(data, &key, delta);
                self.respond(&match &r {
                    Ok(v) => Response::Ok(v.to_le_bytes().to_vec()),
                    Err(why) => Response::Error(why.clone()),
                });
                return r.is_ok();
            }
            Request::Check { keys } => {
                let all = first_missing(data, &keys).is_none();
                self.respond(&Response::Ok(vec![u8::from(all)]));
                return false;
            }
            Request::Get { key, timeout } => (vec![key], true, timeout),
            Request::Wait { keys, timeout } => (keys, false, timeout),
        };
        let now = Instant::now();
        let deadline = now.checked_add(timeout.min(MAX_WAIT)).unwrap_or(now);
        self.parked = Some(Parked {
            keys,
            reply_value,
            deadline,
        });
        self.try_unpark(data, now);
        false
    }

    /// Answers the parked request if its keys are all set, or with TIMEOUT if its deadline has
    /// passed. Returns whether it was answered.
    fn try_unpark(&mut self, data: &HashMap<String, Vec<u8>>, now: Instant) -> bool {
        let Some(p) = &self.parked else {
            return false;
        };
        let response = match first_missing(data, &p.keys) {
            None if p.reply_value => Response::Ok(
                p.keys
                    .first()
                    .and_then(|k| data.get(k))
                    .cloned()
                    .unwrap_or_default(),
            ),
            None => Response::Ok(Vec::new()),
            Some(missing) if now >= p.deadline => Response::Timeout(missing.to_owned()),
            Some(_) => return false,
        };
        self.parked = None;
        self.respond(&response);
        true
    }
}

struct EventLoop<'s> {
    secret: &'s Secret,
    limits: ServerLimits,
    addr: SocketAddr,
    poll: Poll,
    listener: TcpListener,
    conns: HashMap<Token, Conn<'s>>,
    next_token: usize,
    /// (deadline, connection): handshake deadlines and parked requests' deadlines.
    timers: BTreeSet<(Instant, Token)>,
    /// Connections with a parked request.
    parked: BTreeSet<Token>,
    data: HashMap<String, Vec<u8>>,
    /// Connections to pump before the next poll.
    work: Vec<Token>,
    /// When to try `accept` again after it failed.
    accept_retry: Option<Instant>,
    refused: u64,
    last_refusal_warning: Option<Instant>,
    evicted: u64,
    last_eviction_warning: Option<Instant>,
}

impl<'s> EventLoop<'s> {
    fn new(
        secret: &'s Secret,
        limits: ServerLimits,
        poll: Poll,
        listener: TcpListener,
        addr: SocketAddr,
    ) -> EventLoop<'s> {
        EventLoop {
            secret,
            limits,
            addr,
            poll,
            listener,
            conns: HashMap::new(),
            next_token: FIRST_CONN,
            timers: BTreeSet::new(),
            parked: BTreeSet::new(),
            data: HashMap::new(),
            work: Vec::new(),
            accept_retry: None,
            refused: 0,
            last_refusal_warning: None,
            evicted: 0,
            last_eviction_warning: None,
        }
    }

    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            let next_wake = self
                .timers
                .first()
                .map(|&(t, _)| t)
                .into_iter()
                .chain(self.accept_retry)
                .min();
            let timeout = next_wake.map(|t| t.saturating_duration_since(Instant::now()));
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(addr = %self.addr, "store server stops: poll failed: {e}");
                return;
            }
            for event in events.iter() {
                match event.token() {
                    WAKER => {
                        tracing::debug!(addr = %self.addr, "store server stopping");
                        return;
                    }
                    LISTENER => self.accept(),
                    token => self.work.push(token),
                }
            }
            let now = Instant::now();
            if self.accept_retry.is_some_and(|t| t <= now) {
                self.accept_retry = None;
                self.accept();
            }
            self.expire(now);
            self.drain_work();
        }
    }

    fn accept(&mut self) {
        loop {
            let (mut stream, peer) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(addr = %self.addr, "store server: accept failed: {e}");
                    self.accept_retry = Some(Instant::now() + ACCEPT_RETRY);
                    return;
                }
            };
            self.make_room();
            if self.conns.len() >= self.limits.max_connections {
                self.refuse(peer);
                continue;
            }
            let token = Token(self.next_token);
            self.next_token += 1;
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                token,
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(%peer, "store server: dropping connection: cannot register it: {e}");
                continue;
            }
            // Requests are small and latency-bound; a failure here only costs speed.
            let _ = stream.set_nodelay(true);
            let conn = Conn {
                stream,
                peer,
                phase: Phase::Hello,
                handshake_deadline: Instant::now() + self.limits.handshake_timeout,
                input: Vec::new(),
                output: Vec::new(),
                written: 0,
                parked: None,
                timer: None,
            };
            self.conns.insert(token, conn);
            self.reconcile(token);
            self.work.push(token);
        }
    }

    /// At the limit of connections in their handshake, drops the oldest of them (the first
    /// handshake deadline) that has not said hello yet, or else the oldest; warns at most once
    /// a second, with a count.
    fn make_room(&mut self) {
        let unauthenticated = self.conns.values().filter(|c| !c.authenticated()).count();
        // Never all the connections: clients that got in must keep room to.
        let limit = self
            .limits
            .max_unauthenticated
            .min(self.limits.max_connections / 2)
            .max(1);
        if unauthenticated < limit {
            return;
        }
        // Those that have not even said hello go first: a client that did is one message from
        // done.
        let silent = |c: &Conn<'_>| matches!(c.phase, Phase::Hello);
        let oldest_where = |want: &dyn Fn(&Conn<'_>) -> bool| {
            self.timers.iter().map(|&(_, t)| t).find(|t| {
                self.conns
                    .get(t)
                    .is_some_and(|c| !c.authenticated() && want(c))
            })
        };
        let oldest = oldest_where(&silent).or_else(|| oldest_where(&|_| true));
        let Some(token) = oldest else { return };
        let Some(mut conn) = self.conns.remove(&token) else {
            return;
        };
        if let Some(t) = conn.timer {
            self.timers.remove(&(t, token));
        }
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.evicted += 1;
        let now = Instant::now();
        if self
            .last_eviction_warning
            .is_none_or(|t| now - t >= Duration::from_secs(1))
        {
            tracing::warn!(peer = %conn.peer,
                "store server: dropping the oldest of {unauthenticated} connections still in their \
                 handshake (the limit); {} dropped so far", self.evicted);
            self.last_eviction_warning = Some(now);
        }
    }

    /// Closes a connection over the limit; warns at most once a second, with a count.
    fn refuse(&mut self, peer: SocketAddr) {
        self.refused += 1;
        let now = Instant::now();
        if self
            .last_refusal_warning
            .is_none_or(|t| now - t >= Duration::from_secs(1))
        {
            tracing::warn!(
                %peer,
                "store server: refusing connection: {} connections open (the limit); {} refused so far",
                self.conns.len(),
                self.refused
            );
            self.last_refusal_warning = Some(now);
        }
    }

    /// Fires every timer that is due: handshakes that took too long, waits that timed out.
    fn expire(&mut self, now: Instant) {
        while let Some(&(t, token)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            let Some(conn) = self.conns.get_mut(&token) else {
                continue;
            };
            conn.timer = None;
            if !conn.authenticated() {
                let why = format!(
                    "did not finish the authentication handshake within {:?}",
                    self.limits.handshake_timeout
                );
                self.close(token, Close::warn(why));
                continue;
            }
            conn.try_unpark(&self.data, now);
            self.reconcile(token);
            self.work.push(token);
        }
    }

    fn drain_work(&mut self) {
        while let Some(token) = self.work.pop() {
            let Some(conn) = self.conns.get_mut(&token) else {
                continue;
            };
            let mut changed = false;
            match conn.pump(self.secret, &mut self.data, &mut changed) {
                Ok(()) => self.reconcile(token),
                Err(close) => self.close(token, close),
            }
            if changed {
                self.wake_parked();
            }
        }
    }

    /// Answers every parked request whose keys are now all set.
    fn wake_parked(&mut self) {
        let now = Instant::now();
        let parked: Vec<Token> = self.parked.iter().copied().collect();
        for token in parked {
            if let Some(conn) = self.conns.get_mut(&token)
                && conn.try_unpark(&self.data, now)
            {
                self.reconcile(token);
                self.work.push(token);
            }
        }
    }

    /// Brings the timer and parked sets in line with the connection's state.
    fn reconcile(&mut self, token: Token) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let wanted = conn.wanted_timer();
        if wanted != conn.timer {
            if let Some(old) = conn.timer {
                self.timers.remove(&(old, token));
            }
            if let Some(new) = wanted {
                self.timers.insert((new, token));
            }
            conn.timer = wanted;
        }
        if conn.parked.is_some() {
            self.parked.insert(token);
        } else {
            self.parked.remove(&token);
        }
    }

    fn close(&mut self, token: Token, close: Close) {
        let Some(mut conn) = self.conns.remove(&token) else {
            return;
        };
        if let Some(t) = conn.timer {
            self.timers.remove(&(t, token));
        }
        self.parked.remove(&token);
        // Closing the socket removes it from epoll anyway; deregistering first is mio's rule.
        let _ = self.poll.registry().deregister(&mut conn.stream);
        let peer = conn.peer;
        if close.warn || !conn.authenticated() {
            tracing::warn!(%peer, "store server: dropping connection: {}", close.reason);
        } else {
            tracing::debug!(%peer, "store connection closed: {}", close.reason);
        }
    }
}
