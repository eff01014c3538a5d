//! Many thousands of random-sized messages both ways at once, into memory and lent, with control
//! messages mixed in; every byte is checked.

mod util;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use oxccl_transport::{Completion, Link, RecvBuf, RecvInto, SendBuf, Token};
use oxccl_transport_tcp::TcpLink;
use util::*;

const MESSAGES: u64 = 10_000;
const WINDOW: usize = 24;

/// Size of message `i` of stream `seed`: mostly small, some medium, a few up to `max`.
fn size(seed: u64, i: u64, max: usize) -> usize {
    let mut r = Rng(seed.wrapping_mul(31) ^ i);
    let bound = match r.below(100) {
        0..60 => 64,
        60..90 => 4096,
        90..99 => 64 * 1024,
        _ => max,
    };
    r.below(bound.min(max) as u64 + 1) as usize
}

/// Sends stream `tx_seed` and receives stream `rx_seed` over `link`, `MESSAGES` each.
fn run_side(mut link: TcpLink, tx_seed: u64, rx_seed: u64) -> TcpLink {
    let max = link.max_message();
    let mut rng = Rng(tx_seed ^ 0xabcdef);
    let (mut next_send, mut next_recv) = (0u64, 0u64);
    let mut sends: VecDeque<(Token, Vec<u8>)> = VecDeque::new();
    // Posted receives: index, and the memory for memory receives.
    let mut recvs: VecDeque<(u64, Option<Vec<u8>>)> = VecDeque::new();
    let (mut sent, mut received, mut controls) = (0u64, 0u64, 0u64);
    let mut out = Vec::new();
    // The lent message being "reduced": kept for a few polls while later bytes arrive, then
    // checked again (it must not have moved or changed) and released.
    let mut held: Option<(Token, *const u8, usize, u32)> = None;
    let t = Instant::now();
    while sent < MESSAGES || received < MESSAGES {
        if let Some((token, ptr, len, polls)) = &mut held {
            if *polls == 0 {
                // SAFETY: lent until released just below.
                let got = unsafe { std::slice::from_raw_parts(*ptr, *len) };
                assert!(
                    got == &contents(rx_seed, *token, *len)[..],
                    "lent {token} changed"
                );
                link.release(*token);
                held = None;
            } else {
                *polls -= 1;
            }
        }
        while sends.len() < WINDOW && next_send < MESSAGES {
            let m = contents(tx_seed, next_send, size(tx_seed, next_send, max));
            // SAFETY: the Vec's heap memory stays put in `sends` until its send completes.
            unsafe { link.post_send(next_send, SendBuf::from_slice(&m)).unwrap() };
            sends.push_back((next_send, m));
            if next_send % 997 == 0 {
                link.post_control(&next_send.to_le_bytes()).unwrap();
            }
            next_send += 1;
        }
        while recvs.len() < WINDOW && next_recv < MESSAGES {
            let len = size(rx_seed, next_recv, max);
            if rng.below(2) == 0 {
                // SAFETY: lent receives need no memory.
                unsafe { link.post_recv(next_recv, RecvInto::Lend { len }).unwrap() };
                recvs.push_back((next_recv, None));
            } else {
                let mut buf = vec![0u8; len];
                // SAFETY: the Vec's heap memory stays put in `recvs` until its receive completes.
                let into = RecvInto::Memory(unsafe { RecvBuf::new(buf.as_mut_ptr(), len) });
                // SAFETY: as above.
                unsafe { link.post_recv(next_recv, into).unwrap() };
                recvs.push_back((next_recv, Some(buf)));
            }
            next_recv += 1;
        }
        link.poll(&mut out).unwrap();
        for c in out.drain(..) {
            match c {
                Completion::Sent(tok) => {
                    let (want, _) = sends.pop_front().unwrap();
                    assert_eq!(tok, want, "sends complete in order");
                    sent += 1;
                }
                Completion::Received(tok) => {
                    let (i, buf) = recvs.pop_front().unwrap();
                    assert_eq!(tok, i, "receives complete in order");
                    let buf = buf.expect("a memory receive");
                    assert!(
                        buf == contents(rx_seed, i, buf.len()),
                        "message {i} differs"
                    );
                    received += 1;
                }
                Completion::Lent { token, ptr, len } => {
                    let (i, buf) = recvs.pop_front().unwrap();
                    assert_eq!(token, i, "receives complete in order");
                    assert!(buf.is_none(), "a lent receive");
                    assert!(held.is_none(), "two messages lent at once");
                    // SAFETY: lent until released, a few polls later.
                    let got = unsafe { std::slice::from_raw_parts(ptr, len) };
                    assert!(got == &contents(rx_seed, i, len)[..], "message {i} differs");
                    held = Some((token, ptr, len, (i % 5) as u32));
                    received += 1;
                }
                Completion::Control(v) => {
                    let n = u64::from_le_bytes(v.try_into().unwrap());
                    assert_eq!(n, controls * 997, "controls arrive in order");
                    controls += 1;
                }
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "stalled at {sent} sent, {received} received"
        );
    }
    if let Some((token, ..)) = held {
        link.release(token);
    }
    // Controls may trail the last data message.
    while controls < MESSAGES.div_ceil(997) {
        link.poll(&mut out).unwrap();
        controls += out
            .drain(..)
            .filter(|c| matches!(c, Completion::Control(_)))
            .count() as u64;
        assert!(t.elapsed() < Duration::from_secs(60));
    }
    link
}

fn both_ways(max: usize) -> (TcpLink, TcpLink) {
    let (a, b) = pair(max);
    let ta = std::thread::spawn(move || run_side(a, 1, 2));
    let tb = std::thread::spawn(move || run_side(b, 2, 1));
    (ta.join().unwrap(), tb.join().unwrap())
}

#[test]
fn thousands_of_random_messages_both_ways_at_once() {
    let (a, b) = both_ways(256 * 1024);
    // Both kinds of receive were exercised on both sides.
    for s in [a.stats(), b.stats()] {
        assert!(s.bytes_lent > 0 && s.bytes_copied > 0, "{s:?}");
    }
}

#[test]
fn thousands_of_small_messages_through_a_small_ring() {
    // A 4 KiB limit makes the ring small: it wraps every few dozen messages, with lent
    // messages pinned across the wrap.
    let (a, b) = both_ways(4096);
    assert!(a.ring_capacity() < 128 * 1024);
    assert!(b.stats().bytes_lent > 0);
}
