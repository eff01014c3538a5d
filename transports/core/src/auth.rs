//! Proof of membership in a job: every connection between oxccl processes (to the store, between
//! ranks) starts with a mutual HMAC-SHA256 challenge-response over the job's [`Secret`], so a
//! stranger — another job, a port scanner, a confused client — is turned away before it can send
//! or read anything else.
//!
//! The exchange, for a `context` naming the service (`b"oxccl-store"`, `b"oxccl-tcp"`):
//!
//! ```text
//! client → server  ClientHello  = MAGIC, client nonce (32 B), hello length (u16 LE), hello
//! server → client  ServerHello  = MAGIC, server nonce (32 B), hello length (u16 LE), hello,
//!                                 HMAC(secret, "server", context, both nonces, both hellos)
//! client → server  ClientProof  = HMAC(secret, "client", context, both nonces, both hellos)
//! ```
//!
//! Hellos are short (at most [`MAX_HELLO`] bytes) application data, authenticated by the MACs:
//! the TCP transport puts the connecting rank there. Fresh nonces on both sides make a recorded
//! exchange useless to replay. The functions here are pure (build and check messages) plus a
//! blocking driver for a `Read + Write` stream; non-blocking servers drive the same messages.

use std::fmt;
use std::io::{Read, Write};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::{Result, TransportError};

/// First bytes of every hello: rejects non-oxccl clients at once.
pub const MAGIC: [u8; 8] = *b"OXCCL\x00\x01\x00";
/// Nonce length.
pub const NONCE_LEN: usize = 32;
/// MAC length.
pub const MAC_LEN: usize = 32;
/// The client's [`TransportError::Auth`] message when the server proved a different secret.
pub const SERVER_HAS_ANOTHER_SECRET: &str = "the server does not know the job secret";
/// Largest hello payload.
pub const MAX_HELLO: usize = 1024;

/// A job's shared secret: 32 bytes, printed only as `Secret(..)`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl Secret {
    /// A fresh secret from the operating system's random source.
    pub fn random() -> Result<Secret> {
        Ok(Secret(random_bytes()?))
    }

    /// The secret with these bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Secret {
        Secret(bytes)
    }

    /// A secret derived from `material` (for jobs launched without a token: it tells jobs apart
    /// but is not secret from anyone who knows the material).
    pub fn derive(material: &[u8]) -> Secret {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(b"oxccl derived secret v1")
            .expect("HMAC accepts keys of any length");
        mac.update(material);
        Secret(mac.finalize().into_bytes().into())
    }

    /// A secret derived from this one, used as a key, and `material` (a job's public facts):
    /// HMAC-SHA256 under a label of its own, so knowing the material without the key tells
    /// nothing, and different material gives unrelated secrets.
    pub fn keyed(&self, material: &[u8]) -> Secret {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .expect("HMAC accepts keys of any length");
        mac.update(b"oxccl keyed job secret v1\0");
        mac.update(material);
        Secret(mac.finalize().into_bytes().into())
    }

    /// The secret as 64 lower-case hex digits (for `OXCCL_TOKEN`).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits.
    pub fn from_hex(hex: &str) -> Option<Secret> {
        let hex = hex.trim().as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            let s = std::str::from_utf8(pair).ok()?;
            out[i] = u8::from_str_radix(s, 16).ok()?;
        }
        Some(Secret(out))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    fn mac(&self, role: &[u8], context: &[u8], transcript: &Transcript) -> [u8; MAC_LEN] {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .expect("HMAC accepts keys of any length");
        for part in [
            role,
            context,
            &transcript.client_nonce,
            &transcript.server_nonce,
        ] {
            mac.update(&(part.len() as u32).to_le_bytes());
            mac.update(part);
        }
        for part in [&transcript.client_hello, &transcript.server_hello] {
            mac.update(&(part.len() as u32).to_le_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// 32 random bytes from the operating system.
pub fn random_bytes() -> Result<[u8; 32]> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)
        .map_err(|e| TransportError::Unavailable(format!("no randomness: {e}")))?;
    Ok(b)
}

/// Everything both MACs cover.
#[derive(Clone, Debug, Default)]
pub struct Transcript {
    /// The client's nonce.
    pub client_nonce: [u8; NONCE_LEN],
    /// The server's nonce.
    pub server_nonce: [u8; NONCE_LEN],
    /// The client's hello payload.
    pub client_hello: Vec<u8>,
    /// The server's hello payload.
    pub server_hello: Vec<u8>,
}

fn hello_message(nonce: &[u8; NONCE_LEN], hello: &[u8]) -> Result<Vec<u8>> {
    if hello.len() > MAX_HELLO {
        return Err(TransportError::Auth(format!(
            "hello of {} bytes is too long",
            hello.len()
        )));
    }
    let mut m = Vec::with_capacity(MAGIC.len() + NONCE_LEN + 2 + hello.len() + MAC_LEN);
    m.extend_from_slice(&MAGIC);
    m.extend_from_slice(nonce);
    m.extend_from_slice(&(hello.len() as u16).to_le_bytes());
    m.extend_from_slice(hello);
    Ok(m)
}

/// Length of a hello message's fixed header (magic, nonce, length).
pub const HELLO_HEADER: usize = MAGIC.len() + NONCE_LEN + 2;

/// Parses a hello header: the nonce and the payload length that follows. Rejects wrong magic and
/// oversized payloads before anything is allocated.
pub fn parse_hello_header(header: &[u8; HELLO_HEADER]) -> Result<([u8; NONCE_LEN], usize)> {
    if header[..MAGIC.len()] != MAGIC {
        return Err(TransportError::Auth("not an oxccl peer (bad magic)".into()));
    }
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&header[MAGIC.len()..MAGIC.len() + NONCE_LEN]);
    let len = u16::from_le_bytes([header[HELLO_HEADER - 2], header[HELLO_HEADER - 1]]) as usize;
    if len > MAX_HELLO {
        return Err(TransportError::Auth(format!(
            "hello of {len} bytes is too long"
        )));
    }
    Ok((nonce, len))
}

/// The client's side, step by step.
#[derive(Debug)]
pub struct Client<'a> {
    secret: &'a Secret,
    context: &'a [u8],
    transcript: Transcript,
}

impl<'a> Client<'a> {
    /// Starts a handshake: returns the state and the ClientHello to send.
    pub fn start(
        secret: &'a Secret,
        context: &'a [u8],
        hello: &[u8],
    ) -> Result<(Client<'a>, Vec<u8>)> {
        let nonce = random_bytes()?;
        let msg = hello_message(&nonce, hello)?;
        let transcript = Transcript {
            client_nonce: nonce,
            client_hello: hello.to_vec(),
            ..Transcript::default()
        };
        Ok((
            Client {
                secret,
                context,
                transcript,
            },
            msg,
        ))
    }

    /// Checks the server's nonce, hello and MAC; returns the ClientProof to send and the
    /// server's hello.
    pub fn finish(
        mut self,
        server_nonce: [u8; NONCE_LEN],
        server_hello: &[u8],
        server_mac: &[u8; MAC_LEN],
    ) -> Result<(Vec<u8>, Vec<u8>)> {
        self.transcript.server_nonce = server_nonce;
        self.transcript.server_hello = server_hello.to_vec();
        let want = self.secret.mac(b"server", self.context, &self.transcript);
        if !constant_time_eq(&want, server_mac) {
            return Err(TransportError::Auth(SERVER_HAS_ANOTHER_SECRET.into()));
        }
        let proof = self.secret.mac(b"client", self.context, &self.transcript);
        Ok((proof.to_vec(), self.transcript.server_hello))
    }
}

/// The server's side, step by step.
#[derive(Debug)]
pub struct Server<'a> {
    secret: &'a Secret,
    context: &'a [u8],
    transcript: Transcript,
}

impl<'a> Server<'a> {
    /// Answers a ClientHello (already parsed into nonce and payload): returns the state and the
    /// ServerHello to send.
    pub fn answer(
        secret: &'a Secret,
        context: &'a [u8],
        client_nonce: [u8; NONCE_LEN],
        client_hello: &[u8],
        hello: &[u8],
    ) -> Result<(Server<'a>, Vec<u8>)> {
        let nonce = random_bytes()?;
        let transcript = Transcript {
            client_nonce,
            server_nonce: nonce,
            client_hello: client_hello.to_vec(),
            server_hello: hello.to_vec(),
        };
        let mut msg = hello_message(&nonce, hello)?;
        msg.extend_from_slice(&secret.mac(b"server", context, &transcript));
        Ok((
            Server {
                secret,
                context,
                transcript,
            },
            msg,
        ))
    }

    /// Checks the ClientProof; returns the client's hello on success.
    pub fn finish(self, proof: &[u8; MAC_LEN]) -> Result<Vec<u8>> {
        let want = self.secret.mac(b"client", self.context, &self.transcript);
        if !constant_time_eq(&want, proof) {
            return Err(TransportError::Auth(
                "the client does not know the job secret".into(),
            ));
        }
        Ok(self.transcript.client_hello)
    }
}

/// Whether two MACs are equal, in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8; MAC_LEN], b: &[u8; MAC_LEN]) -> bool {
    subtle::ConstantTimeEq::ct_eq(&a[..], &b[..]).into()
}

fn read_exact(s: &mut impl Read, buf: &mut [u8]) -> Result<()> {
    s.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            TransportError::Timeout("authentication handshake".into())
        }
        _ => TransportError::io("authentication handshake", e),
    })
}

fn write_all(s: &mut impl Write, buf: &[u8]) -> Result<()> {
    s.write_all(buf)
        .map_err(|e| TransportError::io("authentication handshake", e))
}

/// Runs the client side on a blocking stream (set its timeouts for a deadline); returns the
/// server's hello.
pub fn client_handshake<S: Read + Write>(
    s: &mut S,
    secret: &Secret,
    context: &[u8],
    hello: &[u8],
) -> Result<Vec<u8>> {
    let (client, msg) = Client::start(secret, context, hello)?;
    write_all(s, &msg)?;
    let mut header = [0u8; HELLO_HEADER];
    read_exact(s, &mut header)?;
    let (nonce, len) = parse_hello_header(&header)?;
    let mut rest = vec![0u8; len + MAC_LEN];
    read_exact(s, &mut rest)?;
    let mac: [u8; MAC_LEN] = rest[len..].try_into().expect("sized above");
    let (proof, server_hello) = client.finish(nonce, &rest[..len], &mac)?;
    write_all(s, &proof)?;
    Ok(server_hello)
}

/// Runs the server side on a blocking stream (set its timeouts for a deadline); returns the
/// client's hello. `hello` may depend on the client's hello.
pub fn server_handshake<S: Read + Write>(
    s: &mut S,
    secret: &Secret,
    context: &[u8],
    hello: impl FnOnce(&[u8]) -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    let mut header = [0u8; HELLO_HEADER];
    read_exact(s, &mut header)?;
    let (nonce, len) = parse_hello_header(&header)?;
    let mut client_hello = vec![0u8; len];
    read_exact(s, &mut client_hello)?;
    let reply = hello(&client_hello)?;
    let (server, msg) = Server::answer(secret, context, nonce, &client_hello, &reply)?;
    write_all(s, &msg)?;
    let mut proof = [0u8; MAC_LEN];
    read_exact(s, &mut proof)?;
    server.finish(&proof)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn run(client_secret: Secret, server_secret: Secret) -> (Result<Vec<u8>>, Result<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            server_handshake(&mut s, &server_secret, b"test", |h| {
                Ok([h, b"-ack"].concat())
            })
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let client = client_handshake(&mut c, &client_secret, b"test", b"rank 3");
        drop(c);
        (client, t.join().unwrap())
    }

    #[test]
    fn same_secret_authenticates_both_ways_and_carries_hellos() {
        let s = Secret::random().unwrap();
        let (c, srv) = run(s.clone(), s);
        assert_eq!(c.unwrap(), b"rank 3-ack");
        assert_eq!(srv.unwrap(), b"rank 3");
    }

    #[test]
    fn wrong_secret_is_refused_by_both_sides() {
        let (c, srv) = run(Secret::random().unwrap(), Secret::random().unwrap());
        assert!(matches!(c, Err(TransportError::Auth(_))), "{c:?}");
        assert!(srv.is_err());
    }

    #[test]
    fn keyed_secrets_need_the_key() {
        let key = Secret::from_bytes([7; 32]);
        let job = b"oxccl job\0store=h:1\0world_size=2";
        // Deterministic for the same key and facts (every rank derives the same secret) ...
        assert_eq!(key.keyed(job), Secret::from_bytes([7; 32]).keyed(job));
        // ... and unrelated to the key, to the facts alone, to another job or another key.
        let others = [
            key.clone(),
            Secret::derive(job),
            key.keyed(b"oxccl job\0store=h:1\0world_size=3"),
            Secret::from_bytes([8; 32]).keyed(job),
        ];
        assert!(others.iter().all(|o| *o != key.keyed(job)));
        // Matches HMAC-SHA256(key, label || facts), computed independently.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&[7; 32]).unwrap();
        mac.update(b"oxccl keyed job secret v1\0");
        mac.update(job);
        let want: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(key.keyed(job).as_bytes(), &want);
    }

    #[test]
    fn hex_round_trip_and_garbage() {
        let s = Secret::random().unwrap();
        assert_eq!(Secret::from_hex(&s.to_hex()), Some(s.clone()));
        assert_eq!(Secret::from_hex("zz"), None);
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert!(parse_hello_header(&[0u8; HELLO_HEADER]).is_err());
        let mut h = [0u8; HELLO_HEADER];
        h[..8].copy_from_slice(&MAGIC);
        h[HELLO_HEADER - 2..].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(parse_hello_header(&h).is_err());
    }
}
