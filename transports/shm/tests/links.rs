//! Shared-memory links between threads acting as ranks (the same code paths as between
//! processes; `process_vm_readv` on one's own process works too).

use std::time::{Duration, Instant};

use oxccl_transport::auth::Secret;
use oxccl_transport::{
    Completion, Link, PeerInfo, RecvBuf, RecvInto, SendBuf, Transport, TransportError,
};
use oxccl_transport_shm::{ShmConfig, ShmTransport};

const SECOND: Duration = Duration::from_secs(1);

/// Two connected links (rank 0's to rank 1, rank 1's to rank 0).
fn pair(max_message: usize, slots: usize) -> (Box<dyn Link>, Box<dyn Link>) {
    let secret = Secret::random().unwrap();
    // Both ends share one context (it names the socket and enters authentication).
    let context = format!(
        "test-{}-{}",
        std::process::id(),
        Secret::random().unwrap().to_hex()
    )
    .into_bytes();
    let mk = |rank| {
        ShmTransport::new(ShmConfig {
            rank,
            nranks: 2,
            secret: secret.clone(),
            context: context.clone(),
            max_message,
            slots,
        })
        .unwrap()
    };
    let (mut t0, mut t1) = (mk(0), mk(1));
    let info = |rank, e: Vec<u8>| PeerInfo {
        rank,
        host: "h".into(),
        endpoints: vec![("shm".into(), e)],
    };
    let i0 = info(0, t0.listen().unwrap());
    let i1 = info(1, t1.listen().unwrap());
    assert!(t0.can_connect(&i0, &i1));
    let deadline = Instant::now() + 5 * SECOND;
    let h = std::thread::spawn(move || t1.connect(&[&i0], deadline).unwrap().pop().unwrap());
    let a = t0.connect(&[&i1], deadline).unwrap().pop().unwrap();
    (a, h.join().unwrap())
}

/// Polls both links until `done(completions of b)` or a second passes.
fn drive(
    a: &mut dyn Link,
    b: &mut dyn Link,
    done: impl Fn(&[Completion]) -> bool,
) -> Vec<Completion> {
    let t = Instant::now();
    let (mut oa, mut ob) = (Vec::new(), Vec::new());
    while !done(&ob) {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
        assert!(t.elapsed() < SECOND, "stuck: a {oa:?} b {ob:?}");
    }
    ob.extend(oa);
    ob
}

#[test]
fn inline_and_by_address_messages_arrive_in_order_into_memory_and_lent() {
    let max = 256 * 1024;
    let (mut a, mut b) = pair(max, 4);
    for len in [0usize, 1, 8, 4095, 32 * 1024 - 1, 32 * 1024, 100_000, max] {
        let msg: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let mut got = vec![0u8; len];
        // Receive posted first: large messages go by address.
        // SAFETY: `msg` and `got` outlive the operations, which complete below.
        unsafe {
            b.post_recv(1, RecvInto::Memory(RecvBuf::new(got.as_mut_ptr(), len)))
                .unwrap();
            a.post_send(2, SendBuf::from_slice(&msg)).unwrap();
        }
        let out = drive(&mut *a, &mut *b, |c| {
            c.iter().any(|c| matches!(c, Completion::Received(1)))
        });
        assert_eq!(got, msg, "len {len}");
        // Sender completes too (for by-address: once the reader is done).
        let t = Instant::now();
        let mut oa: Vec<Completion> = out
            .into_iter()
            .filter(|c| matches!(c, Completion::Sent(_)))
            .collect();
        while !oa.iter().any(|c| matches!(c, Completion::Sent(2))) {
            a.poll(&mut oa).unwrap();
            assert!(t.elapsed() < SECOND);
        }
        // Lent, receive posted after the send (inline).
        // SAFETY: as above.
        unsafe {
            a.post_send(3, SendBuf::from_slice(&msg)).unwrap();
            a.poll(&mut Vec::new()).unwrap();
            b.post_recv(4, RecvInto::Lend { len }).unwrap();
        }
        let out = drive(&mut *a, &mut *b, |c| {
            c.iter()
                .any(|c| matches!(c, Completion::Lent { token: 4, .. }))
        });
        let Some(Completion::Lent { ptr, .. }) =
            out.iter().find(|c| matches!(c, Completion::Lent { .. }))
        else {
            unreachable!()
        };
        assert_eq!(
            // SAFETY: lent memory is valid until release.
            unsafe { std::slice::from_raw_parts(*ptr, len) },
            &msg[..],
            "lent len {len}"
        );
        b.release(4);
    }
}

#[test]
fn a_full_ring_waits_for_the_reader_and_sizes_must_match() {
    let (mut a, mut b) = pair(1024, 2);
    let msg = [5u8; 100];
    let mut out = Vec::new();
    // SAFETY: `msg` outlives the sends.
    unsafe {
        for t in 0..5 {
            a.post_send(t, SendBuf::from_slice(&msg)).unwrap();
        }
    }
    a.poll(&mut out).unwrap();
    assert_eq!(
        out.len(),
        2,
        "two slots: two sends complete, three wait: {out:?}"
    );
    // SAFETY: lent receives need no memory.
    unsafe { b.post_recv(9, RecvInto::Lend { len: 99 }).unwrap() };
    assert!(matches!(
        b.poll(&mut Vec::new()),
        Err(TransportError::Protocol { peer: 0, .. })
    ));
}

#[test]
fn control_messages_pass_and_a_dropped_peer_fails_posted_receives() {
    let (mut a, mut b) = pair(1024, 4);
    a.post_control(b"hello").unwrap();
    let msg = [1u8; 16];
    // SAFETY: `msg` outlives the send.
    unsafe { a.post_send(1, SendBuf::from_slice(&msg)).unwrap() };
    let out = drive(&mut *a, &mut *b, |c| {
        c.iter()
            .any(|c| matches!(c, Completion::Control(m) if m == b"hello"))
    });
    assert!(!out.is_empty());
    drop(a);
    // The message sent before the peer left is still delivered...
    // SAFETY: lent receives need no memory.
    unsafe { b.post_recv(2, RecvInto::Lend { len: 16 }).unwrap() };
    let mut got = Vec::new();
    let t = Instant::now();
    while !got
        .iter()
        .any(|c| matches!(c, Completion::Lent { token: 2, .. }))
    {
        b.poll(&mut got).unwrap();
        assert!(t.elapsed() < SECOND);
    }
    b.release(2);
    // ...and a receive nothing can satisfy fails promptly.
    // SAFETY: as above.
    unsafe { b.post_recv(3, RecvInto::Lend { len: 16 }).unwrap() };
    let t = Instant::now();
    loop {
        match b.poll(&mut got) {
            Err(TransportError::PeerClosed { peer: 0 }) => break,
            Err(e) => panic!("{e:?}"),
            Ok(()) => assert!(t.elapsed() < SECOND, "peer's end not noticed"),
        }
    }
}

#[test]
fn cancel_forgets_operations_and_drops_later_data() {
    let (mut a, mut b) = pair(1024, 4);
    let msg = [3u8; 64];
    let mut sink = vec![0u8; 64];
    // SAFETY: the buffers outlive the operations until cancel.
    unsafe {
        b.post_recv(1, RecvInto::Memory(RecvBuf::new(sink.as_mut_ptr(), 64)))
            .unwrap();
    }
    b.cancel();
    drop(sink);
    // SAFETY: `msg` outlives the sends.
    unsafe {
        for t in 0..8 {
            a.post_send(t, SendBuf::from_slice(&msg)).unwrap();
        }
    }
    b.post_control(b"notice").unwrap();
    let out = drive(&mut *b, &mut *a, |c| {
        c.iter()
            .filter(|c| matches!(c, Completion::Sent(_)))
            .count()
            == 8
            && c.iter().any(|c| matches!(c, Completion::Control(_)))
    });
    assert!(
        out.iter()
            .all(|c| !matches!(c, Completion::Received(_) | Completion::Lent { .. }))
    );
}

/// splitmix64.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn millions_of_random_sized_messages_both_ways_keep_their_checksums() {
    const MESSAGES: u64 = 1_000_000;
    const MAX: usize = 64 * 1024;
    let (mut a, mut b) = pair(MAX, 4);
    let t = Instant::now();
    let run = move |link: &mut Box<dyn Link>, seed: u64, other: u64| {
        // Sizes: mostly small, some large (by address when the reader waits).
        let size = |s: u64, i: u64| {
            let r = mix(s ^ i);
            if r.is_multiple_of(64) {
                (r >> 8) as usize % MAX
            } else {
                (r >> 8) as usize % 200
            }
        };
        let fill = |s: u64, i: u64, buf: &mut [u8]| {
            let mut x = mix(s.wrapping_mul(31) ^ i);
            for b in buf.iter_mut() {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *b = (x >> 56) as u8;
            }
        };
        let (mut sent, mut done_sends, mut recvd) = (0u64, 0u64, 0u64);
        // Send buffers by token until their (possibly out-of-order) Sent completion.
        let mut bufs: std::collections::HashMap<u64, Vec<u8>> = Default::default();
        let mut out = Vec::new();
        let mut posted = 0u64;
        let mut checked = 0u64;
        while done_sends < MESSAGES || recvd < MESSAGES {
            // Keep a few sends in flight (their buffers alive until Sent).
            while sent < MESSAGES && sent - done_sends < 8 {
                let mut m = vec![0u8; size(seed, sent)];
                fill(seed, sent, &mut m);
                // SAFETY: the buffer stays in `bufs` (its heap memory does not move) until its
                // Sent completion.
                unsafe { link.post_send(sent, SendBuf::from_slice(&m)).unwrap() };
                bufs.insert(sent, m);
                sent += 1;
            }
            while posted < MESSAGES && posted - recvd < 4 {
                // SAFETY: lent receives need no memory.
                unsafe {
                    link.post_recv(
                        1 << 40 | posted,
                        RecvInto::Lend {
                            len: size(other, posted),
                        },
                    )
                    .unwrap()
                };
                posted += 1;
            }
            out.clear();
            link.poll(&mut out).unwrap();
            for c in &out {
                match *c {
                    Completion::Sent(t) => {
                        assert!(bufs.remove(&t).is_some(), "send {t} completed twice");
                        done_sends += 1;
                    }
                    Completion::Lent { token, ptr, len } => {
                        let i = token & ((1 << 40) - 1);
                        assert_eq!(i, recvd);
                        let mut want = vec![0u8; len];
                        fill(other, i, &mut want);
                        assert!(
                            // SAFETY: lent memory is valid until release.
                            unsafe { std::slice::from_raw_parts(ptr, len) } == &want[..],
                            "message {i} corrupt"
                        );
                        link.release(token);
                        recvd += 1;
                        checked += len as u64;
                    }
                    ref other => panic!("{other:?}"),
                }
            }
        }
        checked
    };
    let hb = std::thread::spawn(move || run(&mut b, 2, 1));
    let ca = run(&mut a, 1, 2);
    let cb = hb.join().unwrap();
    println!(
        "2 × {MESSAGES} messages, {} MB checked, in {:.2?}",
        (ca + cb) / 1_000_000,
        t.elapsed()
    );
}

#[test]
fn a_cancelled_by_address_send_is_never_read_after_cancel_returns() {
    let max = 256 * 1024;
    let len = 100_000;
    let (mut a, mut b) = pair(max, 4);
    let mut msg: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
    let mut got = vec![0u8; len];
    // SAFETY: `msg` and `got` outlive the operations: the send is cancelled before `msg` is
    // touched again, and `got` is only read after the receive failed.
    unsafe {
        b.post_recv(1, RecvInto::Memory(RecvBuf::new(got.as_mut_ptr(), len)))
            .unwrap();
    }
    // Let the receiver's posted receive become visible, then publish the send by address.
    let mut out = Vec::new();
    b.poll(&mut out).unwrap();
    // SAFETY: as above.
    unsafe { a.post_send(2, SendBuf::from_slice(&msg)).unwrap() };
    a.poll(&mut out).unwrap();
    assert!(
        !out.iter().any(|c| matches!(c, Completion::Sent(2))),
        "the send went by address, so it is not complete before the peer reads"
    );
    a.cancel();
    // The caller has its memory back: reuse it.
    msg.fill(0xEE);
    let t = Instant::now();
    let e = loop {
        out.clear();
        if let Err(e) = b.poll(&mut out) {
            break e;
        }
        assert!(
            !out.iter().any(|c| matches!(c, Completion::Received(1))),
            "the receiver read a withdrawn message"
        );
        assert!(
            t.elapsed() < SECOND,
            "the receiver never noticed the withdrawal"
        );
    };
    assert!(e.to_string().contains("withdrew"), "{e}");
    assert!(
        got.iter().all(|&x| x == 0),
        "nothing may be read from the sender"
    );
    drop(msg);
}

#[test]
fn socket_names_cannot_be_guessed_ahead() {
    // Two transports of the same communicator, rank and secret listen on different names (a
    // random part), so a name cannot be taken by someone else before it is published.
    let secret = Secret::random().unwrap();
    let mk = || {
        ShmTransport::new(ShmConfig {
            rank: 0,
            nranks: 2,
            secret: secret.clone(),
            context: b"same".to_vec(),
            max_message: 4096,
            slots: 4,
        })
        .unwrap()
    };
    let (mut a, mut b) = (mk(), mk());
    let (na, nb) = (a.listen().unwrap(), b.listen().unwrap());
    assert_ne!(na, nb);
    assert_eq!(na.len(), nb.len());
}
