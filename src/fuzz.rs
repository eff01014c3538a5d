//! Fuzzing on stable Rust, for the unit tests: every decoder that reads bytes a peer or a
//! stranger sent is run on [`INPUTS`] generated inputs — random bytes of random lengths, and
//! mutations (bit flips, byte changes, truncations, extensions, splices, length fields set to
//! extremes) of valid encodings — and must neither panic nor make one allocation larger than
//! [`ALLOCATION_CAP`] (a length field trusted before it was checked against what arrived).
//! The global allocator of the test binary counts the largest allocation of the fuzzing
//! thread. Decoders in private modules run their own `fuzz::run` from their module's tests;
//! the public decoders of the transport crates run here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Inputs per decoder.
pub(crate) const INPUTS: usize = 1_000_000;
/// The largest allocation a decoder may make for an input of at most [`MAX_LEN`] bytes.
pub(crate) const ALLOCATION_CAP: usize = 64 << 10;
/// The longest generated input.
pub(crate) const MAX_LEN: usize = 4096;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

struct Counting;

fn note(size: usize) {
    let _ = TRACKING.try_with(|t| {
        if t.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

// SAFETY: every call forwards to the system allocator with the caller's arguments; `note` only
// touches const-initialised thread-locals (no allocation, no reentry).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A small, fast generator (xorshift64*), seeded per decoder so runs repeat.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The `i`-th input: random bytes, or a mutation of one of `seeds`.
pub(crate) fn input(rng: &mut Rng, seeds: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    if seeds.is_empty() || rng.below(4) == 0 {
        let len = match rng.below(3) {
            0 => rng.below(16),
            1 => rng.below(256),
            _ => rng.below(MAX_LEN),
        };
        out.extend((0..len).map(|_| rng.next() as u8));
        return;
    }
    out.extend_from_slice(&seeds[rng.below(seeds.len())]);
    for _ in 0..1 + rng.below(4) {
        let n = out.len();
        match rng.below(8) {
            0 if n > 0 => {
                let i = rng.below(n);
                out[i] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let i = rng.below(n);
                out[i] = rng.next() as u8;
            }
            2 => out.truncate(rng.below(n + 1)),
            3 if n < MAX_LEN => {
                let extra = rng.below(64.min(MAX_LEN - n));
                out.extend((0..extra).map(|_| rng.next() as u8));
            }
            4 if n >= 4 => {
                // A length-sized field at a random place, set to an extreme.
                let i = rng.below(n - 3);
                let v: u32 = [u32::MAX, 0, 0x7fff_ffff, 1 << 24, n as u32 + 1][rng.below(5)];
                out[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            5 if n > 1 => {
                // Splice another seed's tail in.
                let other = &seeds[rng.below(seeds.len())];
                let at = rng.below(n);
                let from = rng.below(other.len().max(1));
                out.truncate(at);
                out.extend_from_slice(other.get(from..).unwrap_or_default());
                out.truncate(MAX_LEN);
            }
            6 if n > 0 => {
                let i = rng.below(n);
                out[i] = [0, 0xff, 0x7f, 0x80, 1][rng.below(5)];
            }
            _ => {}
        }
    }
}

/// Runs `decode` on [`INPUTS`] inputs made from `seeds`; fails the test (naming `name` and the
/// input) on a panic or an allocation over [`ALLOCATION_CAP`].
pub(crate) fn run(name: &str, seeds: &[Vec<u8>], mut decode: impl FnMut(&[u8])) {
    let mut rng = Rng::new(name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }));
    let mut buf = Vec::with_capacity(MAX_LEN + 64);
    for i in 0..INPUTS {
        input(&mut rng, seeds, &mut buf);
        LARGEST.with(|l| l.set(0));
        TRACKING.with(|t| t.set(true));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(&buf)));
        TRACKING.with(|t| t.set(false));
        let largest = LARGEST.with(|l| l.get());
        assert!(r.is_ok(), "{name}: input {i} ({buf:02x?}) panicked");
        assert!(
            largest <= ALLOCATION_CAP,
            "{name}: input {i} of {} bytes made an allocation of {largest} bytes ({buf:02x?})",
            buf.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_transport::PeerInfo;
    use oxccl_transport::auth::{self, HELLO_HEADER, Secret};
    use oxccl_transport_tcp::wire::{
        self, ClientHello, FrameHeader, HEADER_LEN, Lane, ServerHello,
    };

    #[test]
    fn the_harness_catches_a_trusted_length() {
        // A decoder that believes a length field: caught as an oversized allocation.
        let seeds = vec![vec![4, 0, 0, 0, 1, 2, 3, 4]];
        let caught = std::panic::catch_unwind(|| {
            run("trusting", &seeds, |b| {
                if b.len() >= 4 {
                    let n = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
                    let v: Vec<u8> = Vec::with_capacity(n.min(1 << 30));
                    std::hint::black_box(v);
                }
            })
        });
        assert!(caught.is_err());
    }

    #[test]
    fn peer_info_decoding() {
        let info = PeerInfo {
            rank: 3,
            host: "node-a".into(),
            endpoints: vec![
                ("tcp".into(), vec![4, 10, 0, 0, 1, 0x1f, 0x90]),
                ("shm".into(), vec![]),
            ],
        };
        run("PeerInfo::decode", &[info.encode()], |b| {
            std::hint::black_box(PeerInfo::decode(b));
        });
    }

    #[test]
    fn tcp_hello_frame_and_endpoint_decoding() {
        let endpoint = wire::encode_endpoint(&"[fe80::1]:4000".parse().unwrap());
        let seeds = vec![
            endpoint.clone(),
            wire::encode_endpoint(&"10.0.0.1:9".parse().unwrap()),
        ];
        run("tcp endpoint", &seeds, |b| {
            std::hint::black_box(wire::decode_endpoint(b));
        });
        let hello_seeds: Vec<Vec<u8>> = (0..4)
            .flat_map(|r| {
                [
                    ClientHello {
                        from: r,
                        to: r + 1,
                        nranks: 8,
                        lane: Lane::Up,
                        session: r as u64,
                    }
                    .encode(),
                    ServerHello { rank: r, nranks: 8 }.encode(),
                ]
            })
            .collect();
        run("tcp hellos", &hello_seeds, |b| {
            std::hint::black_box((ClientHello::decode(b), ServerHello::decode(b)));
        });
        run("tcp frame header", &[vec![0; HEADER_LEN]], |b| {
            if let Ok(h) = <[u8; HEADER_LEN]>::try_from(b) {
                std::hint::black_box(FrameHeader::decode(h));
            }
        });
    }

    /// The TCP link's receive side on the bytes a peer sent: frames of every kind and length,
    /// cut at random places, against receives posted in memory and lent. A frame whose
    /// length exceeds the limit, an unknown kind or a length that disagrees with the posted
    /// receive must be an error, never a panic or an allocation beyond the limits.
    #[test]
    fn tcp_inbox_parsing() {
        use oxccl_transport_tcp::fuzzing::InboxProbe;
        use oxccl_transport_tcp::wire::{KIND_CONTROL, KIND_DATA};
        const MAX_MESSAGE: usize = 512;
        let frame = |kind: u32, len: usize| {
            let mut f = FrameHeader {
                len: len as u32,
                kind,
            }
            .encode()
            .to_vec();
            f.extend((0..len).map(|i| i as u8));
            f
        };
        let seeds = vec![
            [
                frame(KIND_DATA, 16),
                frame(KIND_DATA, 512),
                frame(KIND_CONTROL, 5),
            ]
            .concat(),
            [
                frame(KIND_CONTROL, 0),
                frame(KIND_DATA, 100),
                frame(KIND_DATA, 16),
            ]
            .concat(),
            frame(KIND_DATA, 513),
            frame(7, 0),
        ];
        // The seeds parse cleanly against matching receives: the probe is not a no-op.
        let mut probe = InboxProbe::new(MAX_MESSAGE, 4096).unwrap();
        let posts = [(16, false), (512, true), (100, false)];
        assert_eq!(probe.feed(&seeds[0], &posts[..2], 64), Ok(3));
        assert!(probe.feed(&seeds[2], &posts, 64).is_err(), "over the limit");
        assert!(probe.feed(&seeds[3], &posts, 64).is_err(), "unknown kind");
        let mut round = 0u64;
        run("tcp inbox", &seeds, |b| {
            round += 1;
            // Receive shapes and read sizes vary with the round, deterministically.
            let posts = match round % 4 {
                0 => &[(16, false), (512, true), (100, false)][..],
                1 => &[(100, true), (16, true)][..],
                2 => &[(512, false), (0, false)][..],
                _ => &[][..],
            };
            let chunk = [1, 7, 64, 4096][(round / 4 % 4) as usize];
            let _ = std::hint::black_box(probe.feed(b, posts, chunk));
        });
    }

    /// The shm transport's two decoders of what a peer sent over its socket: the rank in its
    /// authenticated hello, and the segment hand-over (the descriptors are counted apart).
    #[test]
    fn shm_hello_and_hand_over_decoding() {
        use oxccl_transport_shm::{decode_hand_over, decode_hello};
        let mut hand_over = 0x4F58_4644u32.to_le_bytes().to_vec();
        hand_over.extend(0x7fff_1234_5678u64.to_le_bytes());
        hand_over.extend(42u64.to_le_bytes());
        assert_eq!(
            decode_hand_over(&hand_over, 3),
            Some((0x7fff_1234_5678, 42))
        );
        assert_eq!(decode_hand_over(&hand_over, 2), None);
        assert_eq!(decode_hello(&5u32.to_le_bytes()), Some(5));
        let seeds = vec![hand_over, 5u32.to_le_bytes().to_vec()];
        run("shm hello and hand-over", &seeds, |b| {
            std::hint::black_box((decode_hello(b), decode_hand_over(b, 3)));
        });
    }

    /// Bytes from a peer, and a sink for what we answer.
    struct Wire<'a> {
        input: &'a [u8],
    }

    impl std::io::Read for Wire<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.input.len());
            buf[..n].copy_from_slice(&self.input[..n]);
            self.input = &self.input[n..];
            Ok(n)
        }
    }

    impl std::io::Write for Wire<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn handshake_decoding() {
        let secret = Secret::from_bytes([9; 32]);
        // A client's opening, as a seed.
        let mut opening = Vec::new();
        {
            struct Capture<'a>(&'a mut Vec<u8>);
            impl std::io::Read for Capture<'_> {
                fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                    Ok(0)
                }
            }
            impl std::io::Write for Capture<'_> {
                fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                    self.0.extend_from_slice(b);
                    Ok(b.len())
                }
                fn flush(&mut self) -> std::io::Result<()> {
                    Ok(())
                }
            }
            let _ = auth::client_handshake(&mut Capture(&mut opening), &secret, b"ctx", b"hi");
        }
        assert!(opening.len() >= HELLO_HEADER);
        run("hello header", &[opening[..HELLO_HEADER].to_vec()], |b| {
            if let Ok(h) = <[u8; HELLO_HEADER]>::try_from(b) {
                let _ = std::hint::black_box(auth::parse_hello_header(&h));
            }
        });
        run("server handshake", &[opening.clone()], |b| {
            let _ = auth::server_handshake(&mut Wire { input: b }, &secret, b"ctx", |_| {
                Ok(b"hello".to_vec())
            });
        });
        run("client handshake", &[opening], |b| {
            let _ = auth::client_handshake(&mut Wire { input: b }, &secret, b"ctx", b"hi");
        });
    }
}
