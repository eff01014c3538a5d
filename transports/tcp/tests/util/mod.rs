//! Shared helpers for the TCP transport's tests: ranks as threads over loopback, raw peers that
//! speak the protocol by hand, and deterministic message contents.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use oxccl_transport::auth::{self, Secret};
use oxccl_transport::{Completion, Link, PeerInfo, Token, Transport, TransportError};
use oxccl_transport_tcp::wire::{self, ACK, ClientHello, FrameHeader};
use oxccl_transport_tcp::{TcpConfig, TcpLink, TcpTransport};

pub const V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
pub const V6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);
pub const CONTEXT: &[u8] = b"test-comm";

/// Shows the transport's log in a test's output (`RUST_LOG=debug` for more).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
}

/// Whether `::1` can be bound here.
pub fn have_ipv6() -> bool {
    TcpListener::bind((V6, 0)).is_ok()
}

pub fn config(rank: usize, nranks: usize, secret: &Secret, ip: IpAddr, max: usize) -> TcpConfig {
    TcpConfig {
        rank,
        nranks,
        secret: secret.clone(),
        bind_ip: ip,
        max_message: max,
        context: CONTEXT.to_vec(),
    }
}

/// Transports of `nranks` ranks, listening, with their published infos.
pub fn listen_all(
    nranks: usize,
    ip: IpAddr,
    max: usize,
    secret: &Secret,
) -> (Vec<TcpTransport>, Vec<PeerInfo>) {
    let mut ts = Vec::new();
    let mut infos = Vec::new();
    for r in 0..nranks {
        let mut t = TcpTransport::new(config(r, nranks, secret, ip, max)).unwrap();
        let e = t.listen().unwrap();
        infos.push(PeerInfo {
            rank: r,
            host: "h".into(),
            endpoints: vec![("tcp".into(), e)],
        });
        ts.push(t);
    }
    (ts, infos)
}

pub fn addr_of(info: &PeerInfo) -> SocketAddr {
    wire::decode_endpoint(info.endpoint("tcp").unwrap()).unwrap()
}

/// Connects `nranks` ranks pairwise, one thread per rank; `links[r]` are rank r's links to the
/// other ranks in rank order.
pub fn connect_all(nranks: usize, ip: IpAddr, max: usize) -> Vec<Vec<TcpLink>> {
    connect_all_with(nranks, ip, max, None)
}

/// As [`connect_all`], with every link's socket buffers set to `sockbuf` bytes (`None`: the
/// kernel's auto-tuning).
pub fn connect_all_with(
    nranks: usize,
    ip: IpAddr,
    max: usize,
    sockbuf: Option<usize>,
) -> Vec<Vec<TcpLink>> {
    let secret = Secret::random().unwrap();
    let (ts, infos) = listen_all(nranks, ip, max, &secret);
    let deadline = Instant::now() + Duration::from_secs(10);
    std::thread::scope(|s| {
        let handles: Vec<_> = ts
            .into_iter()
            .enumerate()
            .map(|(r, t)| {
                let infos = &infos;
                let mut t = t.with_socket_buffers(sockbuf);
                s.spawn(move || {
                    let peers: Vec<&PeerInfo> = infos.iter().filter(|p| p.rank != r).collect();
                    t.connect_links(&peers, deadline).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Two connected ranks' links: (rank 0's, rank 1's).
pub fn pair(max: usize) -> (TcpLink, TcpLink) {
    pair_with(max, None)
}

/// As [`pair`], with socket buffers of `sockbuf` bytes (`None`: the kernel's auto-tuning).
pub fn pair_with(max: usize, sockbuf: Option<usize>) -> (TcpLink, TcpLink) {
    let mut links = connect_all_with(2, V4, max, sockbuf);
    let b = links.pop().unwrap().pop().unwrap();
    let a = links.pop().unwrap().pop().unwrap();
    (a, b)
}

/// Authenticates to a rank's listener by hand, as `hello` says; returns the stream once the
/// accepting side has acknowledged, or why it did not.
pub fn raw_rank(
    addr: SocketAddr,
    secret: &Secret,
    context: &[u8],
    hello: ClientHello,
) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let ctx = [wire::AUTH_CONTEXT, context].concat();
    auth::client_handshake(&mut s, secret, &ctx, &hello.encode()).map_err(|e| e.to_string())?;
    let mut ack = [0u8; 1];
    match s.read(&mut ack) {
        Ok(1) if ack[0] == ACK => Ok(s),
        Ok(_) => Err("no acknowledgement".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Writes one frame by hand.
pub fn write_frame(s: &mut TcpStream, kind: u32, payload: &[u8]) {
    let h = FrameHeader {
        len: payload.len() as u32,
        kind,
    };
    s.write_all(&h.encode()).unwrap();
    s.write_all(payload).unwrap();
}

/// Polls `link` until `done` holds for everything collected, or panics after `limit`.
pub fn poll_until(
    link: &mut dyn Link,
    out: &mut Vec<Completion>,
    limit: Duration,
    mut done: impl FnMut(&[Completion]) -> bool,
) -> Result<(), TransportError> {
    let t = Instant::now();
    loop {
        link.poll(out)?;
        if done(out) {
            return Ok(());
        }
        assert!(
            t.elapsed() < limit,
            "nothing happened in {limit:?}: {out:?}"
        );
        std::thread::yield_now();
    }
}

/// Polls until the link fails, returning the error and how long it took.
pub fn poll_until_error(link: &mut dyn Link, limit: Duration) -> (TransportError, Duration) {
    let t = Instant::now();
    let mut out = Vec::new();
    loop {
        if let Err(e) = link.poll(&mut out) {
            return (e, t.elapsed());
        }
        assert!(t.elapsed() < limit, "no error within {limit:?}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Tokens of the `Sent` completions.
pub fn sent(out: &[Completion]) -> Vec<Token> {
    out.iter()
        .filter_map(|c| match c {
            Completion::Sent(t) => Some(*t),
            _ => None,
        })
        .collect()
}

/// A small deterministic generator (splitmix64).
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// The contents of message `i` of stream `seed`, `len` bytes.
pub fn contents(seed: u64, i: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng(seed ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&rng.next().to_le_bytes());
    }
    v.truncate(len);
    v
}
