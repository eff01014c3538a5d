//! The TCP store client: blocking requests over authenticated connections to a
//! [`StoreServer`](super::StoreServer). Every socket operation has a timeout derived from the
//! request's deadline, so a server that stops or disappears gives an error, never a hang.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use oxccl_transport::auth::{self, Secret};
use oxccl_transport::deadline::Deadlined;

use super::wire::{self, MAX_FRAME, Response, STORE_CONTEXT};
use super::{Store, not_set};
use crate::{Error, Result};

/// How much longer than a request's own deadline the client waits for the server's answer
/// (the server answers a timed-out wait itself, a little after the deadline).
const ANSWER_MARGIN: Duration = Duration::from_secs(3);
/// Default bound on requests that carry no deadline of their own (set, add, check).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// What an authentication failure says: the store holds another secret than this client.
pub(crate) const NOT_OUR_SECRET: &str =
    "authentication failed: the store holds another job secret than this rank";
/// Backoff between connection attempts while the server is not up yet.
const RETRY_MIN: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// A [`Store`] served by a [`StoreServer`](super::StoreServer) over TCP.
///
/// Thread-safe: each request borrows an idle authenticated connection from a small pool (or
/// opens a new one), so a thread parked in [`Store::get`] never blocks another thread's
/// [`Store::set`] through the same `TcpStore`. A connection that fails is discarded; when the
/// server is gone, the next request fails at once with connection refused.
pub struct TcpStore {
    addr: SocketAddr,
    secret: Secret,
    timeout: Duration,
    /// Idle connections, each with whether the server has answered a request on it (before
    /// that, the server may still drop it as a handshake it had no room for).
    idle: Mutex<Vec<(TcpStream, bool)>>,
}

impl TcpStore {
    /// Connects to the store at `addr` and authenticates with `secret`. Connection refused is
    /// retried (with backoff) until `deadline`, since the server may start after its clients.
    pub fn connect(addr: SocketAddr, secret: &Secret, deadline: Instant) -> Result<TcpStore> {
        let store = TcpStore {
            addr,
            secret: secret.clone(),
            timeout: DEFAULT_TIMEOUT,
            idle: Mutex::new(Vec::new()),
        };
        let conn = store.open(deadline, true)?;
        store.idle().push((conn, false));
        Ok(store)
    }

    /// Bounds requests without a deadline of their own (set, add, check) by `timeout`
    /// (default 300 s).
    pub fn with_timeout(mut self, timeout: Duration) -> TcpStore {
        self.timeout = timeout;
        self
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(TcpStream, bool)>> {
        // The pool holds only connections that finished a request cleanly; a panic elsewhere
        // cannot corrupt it.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens and authenticates one connection. The handshake has the whole of `deadline`, not
    /// a timeout per read; a server that drops the connection before answering (it was busy
    /// with strangers) is tried again, with backoff, until then.
    fn open(&self, deadline: Instant, retry_refused: bool) -> Result<TcpStream> {
        let addr = self.addr;
        let mut backoff = RETRY_MIN;
        loop {
            let mut stream = connect(addr, deadline, retry_refused)?;
            let shaken = auth::client_handshake(
                &mut Deadlined {
                    stream: &mut stream,
                    deadline,
                },
                &self.secret,
                STORE_CONTEXT,
                b"",
            );
            match shaken {
                Ok(_) => {
                    set_timeouts(&stream, deadline).map_err(|source| Error::Io {
                        what: format!("set timeouts on the connection to the store at {addr}"),
                        source,
                    })?;
                    return Ok(stream);
                }
                Err(oxccl_transport::TransportError::Io { source, .. })
                    if dropped(&source) && Instant::now() + backoff < deadline =>
                {
                    tracing::debug!(%addr, "store dropped the connection in the handshake \
                        ({source}); trying again in {backoff:?}");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
                Err(oxccl_transport::TransportError::Auth(e))
                    if e == auth::SERVER_HAS_ANOTHER_SECRET =>
                {
                    return Err(Error::Bootstrap(format!(
                        "store at {addr}: {NOT_OUR_SECRET} ({e})"
                    )));
                }
                Err(e) => {
                    return Err(Error::Bootstrap(format!(
                        "store at {addr}: authentication handshake failed: {e}"
                    )));
                }
            }
        }
    }

    /// Sends one request frame and reads the response, answering by `reply_by`.
    fn request(
        &self,
        what: &dyn Fn() -> String,
        frame: Result<Vec<u8>, usize>,
        reply_by: Instant,
    ) -> Result<Response> {
        let frame = frame.map_err(|len| {
            Error::InvalidArgument(format!(
                "{}: request of {len} bytes exceeds the store's limit of {MAX_FRAME}",
                what()
            ))
        })?;
        let reply_by = reply_by.checked_add(ANSWER_MARGIN).unwrap_or(reply_by);
        let pooled = self.idle().pop();
        let (mut conn, mut proven) = match pooled {
            Some(c) => c,
            None => (self.open(reply_by, false)?, false),
        };
        let mut backoff = RETRY_MIN;
        loop {
            match exchange(&mut conn, &frame, reply_by) {
                Ok(response) => {
                    self.idle().push((conn, true));
                    return Ok(response);
                }
                // Dropped before the server ever answered on it: it had no room for our
                // handshake (strangers); nothing was done, so ask again on a new connection.
                Err(e) if !proven && dropped(&e) && Instant::now() + backoff < reply_by => {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(RETRY_MAX);
                    conn = self.open(reply_by, false)?;
                    proven = false;
                }
                Err(e) => return Err(self.failure(&what(), e)),
            }
        }
    }

    fn failure(&self, what: &str, e: io::Error) -> Error {
        let addr = self.addr;
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                Error::Bootstrap(format!("store at {addr}: no answer to {what} in time"))
            }
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Error::Bootstrap(format!(
                "store at {addr} closed the connection during {what} (did the store stop?): {e}"
            )),
            io::ErrorKind::InvalidData => Error::Bootstrap(format!("store at {addr}: {what}: {e}")),
            _ => Error::Io {
                what: format!("{what} at the store {addr}"),
                source: e,
            },
        }
    }

    fn unexpected(&self, what: &str, r: Response) -> Error {
        let addr = self.addr;
        match r {
            Response::Error(m) => Error::Bootstrap(format!("store at {addr}: {m}")),
            other => Error::Bootstrap(format!(
                "store at {addr}: unexpected answer to {what}: {other:?}"
            )),
        }
    }
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStore")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let what = || format!("set {key:?}");
        match self.request(&what, wire::set(key, value), Instant::now() + self.timeout)? {
            Response::Ok(_) => Ok(()),
            r => Err(self.unexpected(&what(), r)),
        }
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        let what = || format!("get {key:?}");
        let start = Instant::now();
        let frame = wire::get(key, deadline.saturating_duration_since(start));
        match self.request(&what, frame, deadline.max(start))? {
            Response::Ok(v) => Ok(v),
            Response::Timeout(k) => Err(not_set(
                &format!("store at {}", self.addr),
                &k,
                start.elapsed(),
            )),
            r => Err(self.unexpected(&what(), r)),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let what = || format!("add to {key:?}");
        match self.request(&what, wire::add(key, delta), Instant::now() + self.timeout)? {
            Response::Ok(v) => match <[u8; 8]>::try_from(v.as_slice()) {
                Ok(b) => Ok(i64::from_le_bytes(b)),
                Err(_) => Err(self.unexpected(&what(), Response::Ok(v))),
            },
            r => Err(self.unexpected(&what(), r)),
        }
    }

    fn wait(&self, keys: &[&str], deadline: Instant) -> Result<()> {
        let what = || format!("wait for {keys:?}");
        let start = Instant::now();
        let frame = wire::wait(keys, deadline.saturating_duration_since(start));
        match self.request(&what, frame, deadline.max(start))? {
            Response::Ok(_) => Ok(()),
            Response::Timeout(k) => Err(not_set(
                &format!("store at {}", self.addr),
                &k,
                start.elapsed(),
            )),
            r => Err(self.unexpected(&what(), r)),
        }
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let what = || format!("check {keys:?}");
        match self.request(&what, wire::check(keys), Instant::now() + self.timeout)? {
            Response::Ok(v) if v.len() == 1 => Ok(v[0] != 0),
            r => Err(self.unexpected(&what(), r)),
        }
    }
}

/// Opens a TCP connection to a store at `addr` with both socket timeouts set to `deadline` and
/// Nagle's algorithm off. With `retry_refused`, connection refused is retried (with backoff)
/// until `deadline`, since a server may start after its clients. Shared by [`TcpStore`] and
/// [`TorchStore`](super::TorchStore).
pub(super) fn connect(
    addr: SocketAddr,
    deadline: Instant,
    retry_refused: bool,
) -> Result<TcpStream> {
    let mut backoff = RETRY_MIN;
    let stream = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Bootstrap(format!(
                "could not connect to the store at {addr} before the deadline (connection refused: is the store running?)"
            )));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => break s,
            Err(e) if retry_refused && retryable(&e) => {
                std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                backoff = (backoff * 2).min(RETRY_MAX);
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(Error::Bootstrap(format!(
                    "could not connect to the store at {addr} before the deadline: {e}"
                )));
            }
            Err(source) => {
                return Err(Error::Io {
                    what: format!("connect to the store at {addr}"),
                    source,
                });
            }
        }
    };
    set_timeouts(&stream, deadline).map_err(|source| Error::Io {
        what: format!("set timeouts on the connection to the store at {addr}"),
        source,
    })?;
    // Requests are small and latency-bound; a failure here only costs speed.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Whether the server dropped the connection (rather than refusing our proof).
fn dropped(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// Errors worth retrying while the server may not be listening yet.
fn retryable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::Interrupted
    )
}

/// Sets both socket timeouts to what is left until `deadline` (at least 1 ms: zero would mean
/// "no timeout").
pub(super) fn set_timeouts(s: &TcpStream, deadline: Instant) -> io::Result<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left))?;
    s.set_write_timeout(Some(left))
}

/// One request-response round trip. The response length is checked before anything is
/// allocated for it.
fn exchange(s: &mut TcpStream, frame: &[u8], reply_by: Instant) -> io::Result<Response> {
    // One deadline for the whole exchange, however the bytes trickle in.
    let mut s = Deadlined {
        stream: s,
        deadline: reply_by,
    };
    s.write_all(frame)?;
    let mut header = [0u8; 4];
    s.read_exact(&mut header)?;
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("response of {len} bytes exceeds the limit of {MAX_FRAME}"),
        ));
    }
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload)?;
    Response::decode(&payload).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
