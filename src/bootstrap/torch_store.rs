//! A client of PyTorch's c10d `TCPStore`, so that oxccl can meet its peers through a store that
//! torch already runs — torchrun's agent store on `MASTER_PORT`, or the store of
//! `torch.distributed.init_process_group` — instead of hosting its own. Blocking requests over
//! plain TCP; every socket operation has a timeout derived from the request's deadline, and
//! every length read from the wire is checked before anything is allocated for it.
//!
//! # The protocol
//!
//! As PyTorch 2.15 speaks it, the same for both servers (the libuv one, torch's default, and the
//! classic one), in `torch/csrc/distributed/c10d/TCPStore.cpp` (client),
//! `store/TCPStoreBackend.{hpp,cpp}` and `store/TCPStoreLibUvBackend.cpp` (servers), and
//! `Utils.hpp` (`tcputil`): no framing, no authentication; integers in the host's byte order
//! (little-endian on every platform oxccl runs on); a string or byte vector is a `u64` length
//! and the bytes.
//!
//! ```text
//! connect     client → VALIDATE (0), magic 0x3C85F7CE (u32)        no answer (the server drops
//!                                                                   a client that starts otherwise)
//! PING (13)   nonce (u32)                                           → the nonce (u32)
//! SET (1)     key, value                                            no answer
//! GET (3)     key                                                   → value (the libuv server
//!                                                                   answers a missing key with an
//!                                                                   empty value, the classic one
//!                                                                   drops the connection)
//! ADD (4)     key, delta (i64)                                      → new value (i64); the value is
//!                                                                   kept as decimal text
//! CHECK (5)   count (u64), count × key                              → READY 0 / NOT_READY 1 (u8)
//! WAIT (6)    count (u64), count × key                              → STOP_WAITING 0 (u8), when all
//!                                                                   are set; no timeout on the server
//! CANCEL_WAIT (12)                                                  → WAIT_CANCELED 1 (u8), after a
//!                                                                   STOP_WAITING that raced it
//! ```
//!
//! torch's own client puts `/` in front of every key (`TCPStore::keyPrefix_`); this one does the
//! same, so a key `k` here is the key `k` of `torch.distributed.TCPStore`. The libuv server
//! refuses keys over 8 KiB, values over 8 MiB and more than 128 Ki keys in one request by
//! closing the connection; this client refuses them before sending. A WAIT that runs out is
//! cancelled with CANCEL_WAIT, as torch's client does, so the connection stays usable.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use oxccl_transport::deadline::Deadlined;

use super::client::connect;
use super::wire::MAX_FRAME;
use super::{Store, not_set};
use crate::{Error, Result};

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const ADD: u8 = 4;
const CHECK: u8 = 5;
const WAIT: u8 = 6;
const CANCEL_WAIT: u8 = 12;
const PING: u8 = 13;

/// What a client sends after VALIDATE to prove it speaks the protocol.
const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

const STOP_WAITING: u8 = 0;
const WAIT_CANCELED: u8 = 1;
const READY: u8 = 0;
const NOT_READY: u8 = 1;

/// Prefix torch's client puts before every key.
const KEY_PREFIX: &str = "/";

/// Longest key the libuv server accepts (with the `/` prefix), in bytes.
pub const MAX_KEY: usize = 8 << 10;
/// Largest value the libuv server accepts, in bytes.
pub const MAX_VALUE: usize = 8 << 20;
/// Most keys one CHECK or WAIT may name (the libuv server's limit).
pub const MAX_KEYS: usize = 128 << 10;

/// How long the server gets to answer a CANCEL_WAIT, and a wait's deadline before then.
const ANSWER_MARGIN: Duration = Duration::from_secs(3);
/// Default bound on requests that carry no deadline of their own (set, add, check).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A [`Store`] kept by a PyTorch c10d `TCPStore` server (see the module documentation for the
/// protocol).
///
/// Thread-safe: each request borrows an idle connection from a small pool (or opens one), so a
/// thread parked in [`Store::get`] never blocks another thread's [`Store::set`]. A connection
/// that fails is dropped. Differences from oxccl's own store: the connection is not
/// authenticated (anyone who can reach the server can read and write every key), and an
/// [`Store::add`] to a value that is not a decimal counter makes the server drop the
/// connection, which this client reports as an error naming the key (torch's server does not
/// detect overflow).
pub struct TorchStore {
    addr: SocketAddr,
    timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
}

/// The outcome of a WAIT on the wire.
enum Waited {
    /// Every key is set.
    Done,
    /// The deadline passed with this key still missing.
    Missing(String),
}

impl TorchStore {
    /// Connects to the `TCPStore` server at `addr` and checks that it answers like one (a
    /// VALIDATE, then a PING whose nonce must come back). Connection refused is retried (with
    /// backoff) until `deadline`, since the server may start after its clients.
    pub fn connect(addr: SocketAddr, deadline: Instant) -> Result<TorchStore> {
        let store = TorchStore {
            addr,
            timeout: DEFAULT_TIMEOUT,
            idle: Mutex::new(Vec::new()),
        };
        let conn = store.open(deadline, true)?;
        store.idle().push(conn);
        Ok(store)
    }

    /// Bounds requests without a deadline of their own (set, add, check) by `timeout`
    /// (default 300 s).
    pub fn with_timeout(mut self, timeout: Duration) -> TorchStore {
        self.timeout = timeout;
        self
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn idle(&self) -> MutexGuard<'_, Vec<TcpStream>> {
        // The pool holds only connections that finished a request cleanly; a panic elsewhere
        // cannot corrupt it.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens one connection and runs the VALIDATE + PING handshake.
    fn open(&self, deadline: Instant, retry_refused: bool) -> Result<TcpStream> {
        let addr = self.addr;
        let mut stream = connect(addr, deadline, retry_refused)?;
        let nonce = next_nonce();
        let mut hello = Request::new(VALIDATE).u32(VALIDATION_MAGIC);
        hello.0.push(PING);
        let hello = hello.u32(nonce);
        // The whole handshake by `deadline`, however slowly the bytes come.
        let mut d = Deadlined {
            stream: &mut stream,
            deadline,
        };
        let answer = d.write_all(&hello.0).and_then(|()| read_array::<4>(&mut d));
        match answer {
            Ok(echo) if u32::from_le_bytes(echo) == nonce => Ok(stream),
            Ok(echo) => Err(Error::Bootstrap(format!(
                "torch store at {addr}: answered the handshake's ping with {echo:02x?} instead \
                 of its nonce: is it a PyTorch TCPStore?"
            ))),
            Err(e) => Err(self.failure(
                "the handshake",
                e,
                " (is it a PyTorch TCPStore? oxccl's own store is not one)",
            )),
        }
    }

    /// Runs `exchange` on a pooled connection, answering by `reply_by`; the connection goes
    /// back to the pool only when the exchange went through cleanly.
    fn request<T>(
        &self,
        what: &dyn Fn() -> String,
        hint: &str,
        reply_by: Instant,
        exchange: impl FnOnce(&mut Conn<'_>) -> io::Result<T>,
    ) -> Result<T> {
        let pooled = self.idle().pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.open(reply_by.max(Instant::now() + ANSWER_MARGIN), false)?,
        };
        // One deadline for the whole exchange (a wait moves it on purpose), not one per read.
        let result = exchange(&mut Deadlined {
            stream: &mut conn,
            deadline: reply_by,
        });
        match result {
            Ok(t) => {
                self.idle().push(conn);
                Ok(t)
            }
            Err(e) => Err(self.failure(&what(), e, hint)),
        }
    }

    fn failure(&self, what: &str, e: io::Error, hint: &str) -> Error {
        let addr = self.addr;
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Bootstrap(format!(
                "torch store at {addr}: no answer to {what} in time{hint}"
            )),
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Error::Bootstrap(format!(
                "torch store at {addr} closed the connection during {what}{hint}: {e}"
            )),
            io::ErrorKind::InvalidData => {
                Error::Bootstrap(format!("torch store at {addr}: {what}: {e}"))
            }
            _ => Error::Io {
                what: format!("{what} at the torch store {addr}"),
                source: e,
            },
        }
    }

    fn invalid(&self, what: String) -> Error {
        Error::InvalidArgument(format!("torch store at {}: {what}", self.addr))
    }

    /// The wire form of `key`, or why the server would refuse it.
    fn key(&self, key: &str) -> Result<String> {
        let wire = format!("{KEY_PREFIX}{key}");
        if wire.len() > MAX_KEY {
            let head: String = key.chars().take(64).collect();
            return Err(self.invalid(format!(
                "key {head:?}... is {} bytes, more than a TCPStore takes ({MAX_KEY} with its \
                 prefix)",
                key.len()
            )));
        }
        Ok(wire)
    }

    fn keys(&self, keys: &[&str]) -> Result<Vec<String>> {
        if keys.len() > MAX_KEYS {
            return Err(self.invalid(format!(
                "{} keys in one request, more than a TCPStore takes ({MAX_KEYS})",
                keys.len()
            )));
        }
        keys.iter().map(|k| self.key(k)).collect()
    }
}

impl std::fmt::Debug for TorchStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchStore")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Store for TorchStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let wire = self.key(key)?;
        if value.len() > MAX_VALUE {
            return Err(self.invalid(format!(
                "value of {} bytes for key {key:?} is more than a TCPStore takes ({MAX_VALUE})",
                value.len()
            )));
        }
        // SET has no answer: a PING behind it on the same connection returns once the server
        // has applied the SET, and shows that the server is still there.
        let nonce = next_nonce();
        let mut req = Request::new(SET).string(&wire).bytes(value);
        req.0.push(PING);
        let req = req.u32(nonce);
        let what = || format!("set {key:?}");
        let reply_by = Instant::now() + self.timeout;
        self.request(&what, "", reply_by, |s| set_on(s, &req.0, nonce))
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        let wire = self.key(key)?;
        let what = || format!("get {key:?}");
        let start = Instant::now();
        let waited = self.request(&what, "", deadline.max(start), |s| {
            get_on(s, &wire, deadline)
        })?;
        waited.map_err(|k| {
            not_set(
                &format!("torch store at {}", self.addr),
                unprefixed(&k),
                start.elapsed(),
            )
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let wire = self.key(key)?;
        let req = Request::new(ADD).string(&wire).i64(delta);
        let what = || format!("add {delta} to {key:?}");
        let hint = " (the server drops the connection when the key's value is not a decimal \
                    counter)";
        self.request(&what, hint, Instant::now() + self.timeout, |s| {
            add_on(s, &req.0)
        })
    }

    fn wait(&self, keys: &[&str], deadline: Instant) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let wire = self.keys(keys)?;
        let what = || format!("wait for {keys:?}");
        let start = Instant::now();
        match self.request(&what, "", deadline.max(start), |s| {
            wait_on(s, &wire, deadline)
        })? {
            Waited::Done => Ok(()),
            Waited::Missing(k) => Err(not_set(
                &format!("torch store at {}", self.addr),
                unprefixed(&k),
                start.elapsed(),
            )),
        }
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        if keys.is_empty() {
            return Ok(true);
        }
        let wire = self.keys(keys)?;
        let what = || format!("check {keys:?}");
        self.request(&what, "", Instant::now() + self.timeout, |s| {
            check_on(s, &wire)
        })
    }
}

/// A pooled connection during one request: every read and write ends by its deadline.
type Conn<'a> = Deadlined<'a, TcpStream>;

/// A request's conversation with the server: reads and writes end by a deadline that the
/// request may move (a wait's, then a short one for what follows).
trait Conversation: Read + Write {
    fn set_deadline(&mut self, deadline: Instant);
}

impl Conversation for Conn<'_> {
    fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }
}

/// A SET with a PING behind it (`req`): the echo of `nonce` says the server applied it.
fn set_on(s: &mut impl Conversation, req: &[u8], nonce: u32) -> io::Result<()> {
    s.write_all(req)?;
    let echo = u32::from_le_bytes(read_array::<4>(s)?);
    if echo != nonce {
        return Err(bad_data(format!(
            "the ping after the set answered {echo:#x} instead of {nonce:#x}"
        )));
    }
    Ok(())
}

/// A GET of `wire` (a key in wire form) once a WAIT for it returns by `deadline`: the value,
/// or the key still missing then.
fn get_on(
    s: &mut impl Conversation,
    wire: &str,
    deadline: Instant,
) -> io::Result<std::result::Result<Vec<u8>, String>> {
    match wait_on(s, std::slice::from_ref(&wire.to_owned()), deadline)? {
        Waited::Missing(k) => Ok(Err(k)),
        Waited::Done => {
            s.set_deadline(Instant::now() + ANSWER_MARGIN);
            s.write_all(&Request::new(GET).string(wire).0)?;
            let len = u64::from_le_bytes(read_array::<8>(s)?);
            // The value's bytes get the margin again plus a second per 8 MiB (a slow link).
            s.set_deadline(
                Instant::now()
                    + ANSWER_MARGIN
                    + Duration::from_secs(len.min(MAX_FRAME as u64) >> 23),
            );
            Ok(Ok(read_body(s, len, MAX_FRAME, "value")?))
        }
    }
}

/// An ADD (`req`) and the counter's new value.
fn add_on(s: &mut impl Conversation, req: &[u8]) -> io::Result<i64> {
    s.write_all(req)?;
    Ok(i64::from_le_bytes(read_array::<8>(s)?))
}

/// A request under construction.
struct Request(Vec<u8>);

impl Request {
    fn new(query: u8) -> Request {
        Request(vec![query])
    }

    fn u32(mut self, v: u32) -> Request {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn u64(mut self, v: u64) -> Request {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn i64(mut self, v: i64) -> Request {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn bytes(self, b: &[u8]) -> Request {
        let mut r = self.u64(b.len() as u64);
        r.0.extend_from_slice(b);
        r
    }

    fn string(self, s: &str) -> Request {
        self.bytes(s.as_bytes())
    }

    fn key_list(self, keys: &[String]) -> Request {
        keys.iter()
            .fold(self.u64(keys.len() as u64), |r, k| r.string(k))
    }
}

/// Sends a WAIT for `keys` (in wire form) and reads its answer until `deadline`; past it,
/// cancels the wait and finds a key that is still missing. Leaves the connection clean either
/// way.
fn wait_on(s: &mut impl Conversation, keys: &[String], deadline: Instant) -> io::Result<Waited> {
    // Sending is not waiting: even a wait already past its deadline is sent (and cancelled).
    s.set_deadline(Instant::now() + ANSWER_MARGIN);
    s.write_all(&Request::new(WAIT).key_list(keys).0)?;
    s.set_deadline(deadline);
    match read_array::<1>(s) {
        Ok([STOP_WAITING]) => return Ok(Waited::Done),
        Ok([b]) => return Err(bad_data(format!("answered a wait with {b}"))),
        // A timed-out read of one byte consumed nothing: the connection is still in step.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) => {}
        Err(e) => return Err(e),
    }
    s.set_deadline(Instant::now() + ANSWER_MARGIN);
    s.write_all(&[CANCEL_WAIT])?;
    match read_array::<1>(s)? {
        [WAIT_CANCELED] => {}
        // The keys were set just as the wait was cancelled: the cancel's answer follows.
        [STOP_WAITING] => {
            return match read_array::<1>(s)? {
                [WAIT_CANCELED] => Ok(Waited::Done),
                [b] => Err(bad_data(format!("answered a cancelled wait with {b}"))),
            };
        }
        [b] => return Err(bad_data(format!("answered a wait's cancel with {b}"))),
    }
    // Name a key that is missing (the first one, when several are).
    if let [only] = keys {
        return Ok(Waited::Missing(only.clone()));
    }
    for k in keys {
        s.set_deadline(Instant::now() + ANSWER_MARGIN);
        if !check_on(s, std::slice::from_ref(k))? {
            return Ok(Waited::Missing(k.clone()));
        }
    }
    // All set by now, after the deadline: like a get past its deadline, that counts.
    Ok(Waited::Done)
}

/// A CHECK of `keys` (in wire form) on a connection.
fn check_on(s: &mut impl Conversation, keys: &[String]) -> io::Result<bool> {
    s.write_all(&Request::new(CHECK).key_list(keys).0)?;
    match read_array::<1>(s)? {
        [READY] => Ok(true),
        [NOT_READY] => Ok(false),
        [b] => Err(bad_data(format!("answered a check with {b}"))),
    }
}

fn read_array<const N: usize>(s: &mut impl Read) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Reads a `u64` length and that many bytes, refusing a length over `max` before allocating,
/// and growing the buffer only as bytes actually arrive.
#[cfg(test)]
fn read_vec(s: &mut impl Read, max: usize, what: &str) -> io::Result<Vec<u8>> {
    let len = u64::from_le_bytes(read_array::<8>(s)?);
    read_body(s, len, max, what)
}

/// Reads `len` bytes (a length already read), refusing one over `max` before allocating.
fn read_body(s: &mut impl Read, len: u64, max: usize, what: &str) -> io::Result<Vec<u8>> {
    if len > max as u64 {
        return Err(bad_data(format!(
            "{what} of {len} bytes exceeds the limit of {max}"
        )));
    }
    let mut v = Vec::new();
    s.take(len).read_to_end(&mut v)?;
    if (v.len() as u64) < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{what} ended after {} of {len} bytes", v.len()),
        ));
    }
    Ok(v)
}

fn bad_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn unprefixed(wire: &str) -> &str {
    wire.strip_prefix(KEY_PREFIX).unwrap_or(wire)
}

/// A nonce for PING: distinct per call in this process, and unlikely to be echoed by chance.
fn next_nonce() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (std::process::id().rotate_left(16) ^ n).wrapping_mul(0x9E37_79B1) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_laid_out_as_torch_sends_them() {
        // Bytes recorded between torch 2.15's Python TCPStore client and server.
        let set = Request::new(SET).string("/k").bytes(b"vv");
        assert_eq!(
            set.0,
            [
                1, 2, 0, 0, 0, 0, 0, 0, 0, b'/', b'k', 2, 0, 0, 0, 0, 0, 0, 0, b'v', b'v'
            ]
        );
        let wait = Request::new(WAIT).key_list(&["/k".into()]);
        assert_eq!(
            wait.0,
            [
                6, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, b'/', b'k'
            ]
        );
        let add = Request::new(ADD).string("/c").i64(5);
        assert_eq!(
            add.0,
            [
                4, 2, 0, 0, 0, 0, 0, 0, 0, b'/', b'c', 5, 0, 0, 0, 0, 0, 0, 0
            ]
        );
        let validate = Request::new(VALIDATE).u32(VALIDATION_MAGIC);
        assert_eq!(validate.0, [0, 0xce, 0xf7, 0x85, 0x3c]);
    }

    #[test]
    fn lengths_are_checked_before_allocating() {
        let mut huge = &u64::MAX.to_le_bytes()[..];
        let err = read_vec(&mut huge, MAX_FRAME, "value").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("exceeds the limit"), "{err}");

        let mut short: Vec<u8> = 10u64.to_le_bytes().to_vec();
        short.extend_from_slice(b"abc");
        let err = read_vec(&mut short.as_slice(), MAX_FRAME, "value").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);

        let mut ok: Vec<u8> = 3u64.to_le_bytes().to_vec();
        ok.extend_from_slice(b"abcdef");
        assert_eq!(
            read_vec(&mut ok.as_slice(), MAX_FRAME, "v").unwrap(),
            b"abc"
        );
    }

    /// The server's bytes, and a sink for what the client sends.
    struct Wire<'a>(&'a [u8]);

    impl Read for Wire<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.0.read(buf)
        }
    }

    impl Write for Wire<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Conversation for Wire<'_> {
        fn set_deadline(&mut self, _: Instant) {}
    }

    /// Every reader of the server's answers (set, get, add, wait, check), on a million
    /// generated answers each round: errors, never panics or allocations a length field asked
    /// for before the bytes came.
    #[test]
    fn answers_are_fuzzed() {
        let value = |v: &[u8]| {
            let mut a = vec![STOP_WAITING];
            a.extend((v.len() as u64).to_le_bytes());
            a.extend_from_slice(v);
            a
        };
        let seeds = vec![
            value(b"hello"),
            value(&[7; 300]),
            vec![WAIT_CANCELED, READY],
            vec![STOP_WAITING, WAIT_CANCELED, NOT_READY, READY],
            42i64.to_le_bytes().to_vec(),
            0x1234_5678u32.to_le_bytes().to_vec(),
        ];
        // A well-formed answer reads as such: the readers are really exercised.
        let past = Instant::now();
        assert_eq!(
            get_on(&mut Wire(&seeds[0]), "/k", past).unwrap(),
            Ok(b"hello".to_vec())
        );
        assert_eq!(add_on(&mut Wire(&seeds[4]), b"").unwrap(), 42);
        let keys: Vec<String> = ["/a", "/b"].iter().map(|k| k.to_string()).collect();
        crate::fuzz::run("torch store answers", &seeds, |b| {
            let _ = std::hint::black_box(get_on(&mut Wire(b), "/k", past));
            let _ = std::hint::black_box(add_on(&mut Wire(b), b""));
            let _ = std::hint::black_box(set_on(&mut Wire(b), b"", 0x1234_5678));
            let _ = std::hint::black_box(wait_on(&mut Wire(b), &keys, past));
            let _ = std::hint::black_box(check_on(&mut Wire(b), &keys));
        });
    }
}
