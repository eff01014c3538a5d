//! Both ranks stream large messages at each other, and each receives a message only once its
//! own send of the same slot has completed: the pattern of an in-place all-reduce, where a
//! rank may not write memory that a send still reads. While one side waits for its send, it
//! reads nothing, so tens of MiB pile up in its socket and its receive window closes.
//!
//! On one connection per pair, Linux 6.17 and later drop a segment that reaches beyond a closed
//! window whole, acknowledgement included ("tcp: do not accept packets beyond window"); once a
//! receiver under memory pressure had dropped one of the peer's segments, every later segment
//! of the peer, pure acknowledgements too, lay beyond its window, the peer's acknowledgements
//! of its own data never arrived, its send never completed, and both sides waited until the
//! deadline (a 2-rank 256 MiB in-place all-reduce over TCP hung in about one run in seven on
//! the 2026-12-05 VM, kernel 6.18). Now each direction has its own connection, whose receiver
//! only ever sends bare acknowledgements.
//!
//! This test fails if a round makes no progress for [`STALL`]. With 1 MiB socket buffers and
//! 50 µs of work per received slice, the one-connection link hung here in 2 of 2 runs of 20 s
//! (after 9 s, round 58), and not with auto-tuned buffers or other amounts of work (0 of 6), so
//! it catches that failure often, not always; the two-connection link passed every run (60 s).

mod util;

use std::time::{Duration, Instant};

use oxccl_transport::{Completion, Link, RecvBuf, RecvInto, SendBuf};
use oxccl_transport_tcp::TcpLink;
use util::*;

const SLICE: usize = 256 * 1024;
const SLICES: usize = 256;
/// How long the test runs rounds.
const RUN: Duration = Duration::from_secs(12);
/// Socket buffers fixed at this size (auto-tuning off), where the hang came soonest.
const SOCKBUF: usize = 1 << 20;
/// Time spent on each received slice, as a reduction of it would (about 5 GB/s).
const WORK: Duration = Duration::from_micros(50);
/// No completion for this long is a hang.
const STALL: Duration = Duration::from_secs(5);

fn fill(seed: u64, round: u64, buf: &mut [u8]) {
    let mut r = Rng(seed ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    for c in buf.chunks_mut(8) {
        let v = r.next().to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

/// One side: rounds of `SLICES` sends of its buffer and as many receives into a second buffer,
/// receive `i` posted only once send `i` has completed. Returns the rounds run.
fn side(mut link: TcpLink, me: u64, peer: u64, rounds_until: Instant) -> (TcpLink, u64) {
    let mut send = vec![0u8; SLICE * SLICES];
    let mut recv = vec![0u8; SLICE * SLICES];
    let mut want = vec![0u8; SLICE * SLICES];
    let mut out: Vec<Completion> = Vec::new();
    let mut round = 0u64;
    while Instant::now() < rounds_until {
        fill(me, round, &mut send);
        fill(peer, round, &mut want);
        recv.fill(0);
        for i in 0..SLICES {
            let s = &send[i * SLICE..(i + 1) * SLICE];
            // SAFETY: `send` is not touched until every send of the round has completed.
            unsafe { link.post_send(i as u64, SendBuf::from_slice(s)).unwrap() };
        }
        let (mut sent, mut posted, mut received) = (0usize, 0usize, 0usize);
        let mut last = Instant::now();
        while sent < SLICES || received < SLICES {
            out.clear();
            link.poll(&mut out).unwrap_or_else(|e| {
                panic!("side {me}, round {round}: {e} ({sent} sent, {received} received)")
            });
            for c in &out {
                match c {
                    Completion::Sent(_) => sent += 1,
                    Completion::Received(_) => {
                        received += 1;
                        // The reduction of the slice just received.
                        let t = Instant::now();
                        while t.elapsed() < WORK {
                            std::hint::spin_loop();
                        }
                    }
                    other => panic!("side {me}: unexpected {other:?}"),
                }
            }
            if !out.is_empty() {
                last = Instant::now();
            }
            while posted < sent {
                let r = &mut recv[posted * SLICE..(posted + 1) * SLICE];
                // SAFETY: `recv` stays put and untouched until the round's receives complete.
                let into = RecvInto::Memory(unsafe { RecvBuf::new(r.as_mut_ptr(), SLICE) });
                // SAFETY: as above.
                unsafe { link.post_recv((SLICES + posted) as u64, into).unwrap() };
                posted += 1;
            }
            assert!(
                last.elapsed() < STALL,
                "side {me}, round {round}: no progress for {STALL:?} with {sent} of {SLICES} \
                 sends and {received} receives complete ({posted} posted): the link hangs"
            );
        }
        assert!(
            recv == want,
            "side {me}, round {round}: wrong bytes received"
        );
        round += 1;
    }
    (link, round)
}

#[test]
fn each_side_waits_for_its_sends_before_receiving() {
    init_logging();
    let (a, b) = pair_with(SLICE, Some(SOCKBUF));
    let until = Instant::now() + RUN;
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(move || side(a, 1, 2, until));
        let hb = s.spawn(move || side(b, 2, 1, until));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert!(ra.1 >= 1 && rb.1 >= 1, "no round finished");
}
