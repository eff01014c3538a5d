//! Messages over a link: order and exact contents into memory and lent, edge sizes, large
//! zero-copy receives, buffering with nothing posted, lending while the next message arrives,
//! control messages, protocol errors, and prompt failure when the peer goes away.

mod util;

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use oxccl_transport::auth::Secret;
use oxccl_transport::{
    Completion, Link, PeerInfo, RecvBuf, RecvInto, SendBuf, Token, TransportError,
};
use oxccl_transport_tcp::TcpLink;
use oxccl_transport_tcp::wire::{ClientHello, KIND_CONTROL, KIND_DATA, Lane};
use util::*;

const SECOND: Duration = Duration::from_secs(1);

/// Sends `sizes` from `a` to `b`, receiving message i into memory if `lend(i)` is false and
/// lent otherwise, with receives posted before or after the sends; checks every byte and the
/// completion order.
fn transfer(
    a: &mut TcpLink,
    b: &mut TcpLink,
    sizes: &[usize],
    lend: impl Fn(usize) -> bool,
    recv_first: bool,
) {
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| contents(7, i as u64, n))
        .collect();
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let post_recvs = |b: &mut TcpLink, bufs: &mut [Vec<u8>]| {
        for (i, buf) in bufs.iter_mut().enumerate() {
            let into = if lend(i) {
                RecvInto::Lend { len: buf.len() }
            } else {
                // SAFETY: `bufs` outlives the receives, which complete in this function.
                RecvInto::Memory(unsafe { RecvBuf::new(buf.as_mut_ptr(), buf.len()) })
            };
            // SAFETY: as above.
            unsafe { b.post_recv(100 + i as Token, into).unwrap() };
        }
    };
    if recv_first {
        post_recvs(b, &mut bufs);
    }
    for (i, m) in msgs.iter().enumerate() {
        // SAFETY: `msgs` outlives the sends, which complete in this function.
        unsafe { a.post_send(i as Token, SendBuf::from_slice(m)).unwrap() };
    }
    if !recv_first {
        post_recvs(b, &mut bufs);
    }
    let (mut oa, mut ob) = (Vec::new(), Vec::new());
    let mut received = Vec::new();
    let t = Instant::now();
    while oa.len() < sizes.len() || received.len() < sizes.len() {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
        for c in ob.drain(..) {
            match c {
                Completion::Received(t) => received.push(t),
                Completion::Lent { token, ptr, len } => {
                    let i = (token - 100) as usize;
                    assert!(lend(i));
                    // SAFETY: lent memory is valid until release, just below.
                    let got = unsafe { std::slice::from_raw_parts(ptr, len) };
                    assert!(
                        got == &msgs[i][..],
                        "lent message {i} of {len} bytes differs"
                    );
                    b.release(token);
                    received.push(token);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(
            t.elapsed() < 10 * SECOND,
            "stalled: {} of {} received",
            received.len(),
            sizes.len()
        );
    }
    assert_eq!(sent(&oa), (0..sizes.len() as Token).collect::<Vec<_>>());
    assert_eq!(
        received,
        (100..100 + sizes.len() as Token).collect::<Vec<_>>()
    );
    for (i, (got, want)) in bufs.iter().zip(&msgs).enumerate() {
        if !lend(i) {
            assert!(got == want, "message {i} of {} bytes differs", want.len());
        }
    }
}

#[test]
fn messages_arrive_in_order_with_exact_contents_into_memory_and_lent() {
    let max = 64 * 1024;
    let (mut a, mut b) = pair(max);
    let sizes = [0, 1, 8, 13, 4095, 0, 77, max, 1, max - 1, 3];
    for recv_first in [true, false] {
        transfer(&mut a, &mut b, &sizes, |_| false, recv_first);
        transfer(&mut b, &mut a, &sizes, |_| true, recv_first);
        transfer(&mut a, &mut b, &sizes, |i| i % 2 == 1, recv_first);
    }
    // Many small messages go out in few calls.
    let before = a.stats().write_calls;
    transfer(&mut a, &mut b, &[8; 200], |i| i % 3 == 0, false);
    assert!(a.stats().write_calls - before < 50, "{:?}", a.stats());
}

#[test]
fn large_messages_are_read_straight_into_memory() {
    let max = 16 << 20;
    let (mut a, mut b) = pair(max);
    let sizes = [max, 5 << 20 | 3, max, 1 << 20];
    transfer(&mut a, &mut b, &sizes, |_| false, true);
    let s = b.stats();
    let total: u64 = sizes.iter().map(|&n| n as u64).sum();
    assert_eq!(s.bytes_direct + s.bytes_copied, total);
    assert!(s.bytes_direct > total / 2, "mostly zero-copy: {s:?}");
    // And lent, and in memory with receives posted late, mixed.
    transfer(&mut a, &mut b, &sizes, |i| i % 2 == 0, false);
}

#[test]
fn a_full_message_is_buffered_with_no_receive_posted() {
    // Larger than the kernel's socket buffers can hold, so the link's own buffering counts.
    let max = 48 << 20;
    let (mut a, mut b) = pair(max);
    let msgs = [contents(1, 0, max), contents(1, 1, max)];
    // SAFETY: `msgs` outlives the sends, which complete below.
    unsafe { a.post_send(0, SendBuf::from_slice(&msgs[0])).unwrap() };
    // The send completes while the receiver only polls.
    let (mut oa, mut ob) = (Vec::new(), Vec::new());
    let t = Instant::now();
    while oa.is_empty() {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
        assert!(
            t.elapsed() < 10 * SECOND,
            "the send did not complete unreceived"
        );
    }
    assert!(ob.is_empty());
    // Once the whole message is buffered, the receiver asks not to be woken for more bytes
    // until a receive is posted (it would not read them).
    let reads = |l: &TcpLink| {
        let mut r = Vec::new();
        assert!(l.readiness(&mut r));
        r.iter().any(|r| r.read)
    };
    while reads(&b) {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
        assert!(
            t.elapsed() < 10 * SECOND,
            "the receiver still wants to read"
        );
    }
    let mut buf = vec![0u8; max];
    // SAFETY: `buf` and `msgs` outlive the operations, which complete below.
    unsafe {
        a.post_send(1, SendBuf::from_slice(&msgs[1])).unwrap();
        b.post_recv(1, RecvInto::Memory(RecvBuf::new(buf.as_mut_ptr(), max)))
            .unwrap();
        b.post_recv(2, RecvInto::Lend { len: max }).unwrap();
    }
    assert!(reads(&b));
    while oa.len() < 2 || ob.len() < 2 {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
        assert!(t.elapsed() < 10 * SECOND, "stalled: {oa:?} {ob:?}");
    }
    assert!(buf == msgs[0]);
    let Completion::Lent { token: 2, ptr, len } = ob[1] else {
        panic!("{ob:?}")
    };
    // SAFETY: lent until released below.
    assert!(unsafe { std::slice::from_raw_parts(ptr, len) } == &msgs[1][..]);
    b.release(2);
}

#[test]
fn a_lent_message_stays_put_while_later_messages_arrive() {
    let max = 256 * 1024;
    let (mut a, mut b) = pair(max);
    let msgs: Vec<Vec<u8>> = (0..4).map(|i| contents(3, i, max)).collect();
    let mut mem = vec![0u8; max];
    // SAFETY: `msgs` and `mem` outlive the operations, which complete in this test.
    unsafe {
        for (i, m) in msgs.iter().enumerate() {
            a.post_send(i as Token, SendBuf::from_slice(m)).unwrap();
        }
        b.post_recv(10, RecvInto::Lend { len: max }).unwrap();
        b.post_recv(11, RecvInto::Memory(RecvBuf::new(mem.as_mut_ptr(), max)))
            .unwrap();
        b.post_recv(12, RecvInto::Lend { len: max }).unwrap();
    }
    let (mut oa, mut ob) = (Vec::new(), Vec::new());
    let t = Instant::now();
    // Message 0 is lent and kept; message 1 still arrives into memory and message 2 into the
    // ring, so three of four sends complete; message 2 is not lent while 0 is.
    while oa.len() < 3 || ob.len() < 2 {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
        assert!(t.elapsed() < 5 * SECOND, "stalled: {oa:?} {ob:?}");
    }
    for _ in 0..100 {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
    }
    assert_eq!(ob.len(), 2, "{ob:?}");
    let Completion::Lent {
        token: 10,
        ptr,
        len,
    } = ob[0]
    else {
        panic!("{ob:?}")
    };
    // SAFETY: lent until released below.
    let lent = unsafe { std::slice::from_raw_parts(ptr, len) };
    assert!(lent == &msgs[0][..], "the lent message was overwritten");
    assert!(matches!(ob[1], Completion::Received(11)));
    assert!(mem == msgs[1]);
    b.release(10);
    poll_until(&mut b, &mut ob, 5 * SECOND, |o| o.len() == 3).unwrap();
    let Completion::Lent {
        token: 12,
        ptr,
        len,
    } = ob[2]
    else {
        panic!("{ob:?}")
    };
    // SAFETY: lent until released below.
    assert!(unsafe { std::slice::from_raw_parts(ptr, len) } == &msgs[2][..]);
    b.release(12);
    // SAFETY: `mem` outlives the receive, which completes below.
    unsafe {
        b.post_recv(13, RecvInto::Memory(RecvBuf::new(mem.as_mut_ptr(), max)))
            .unwrap();
    }
    while oa.len() < 4 || ob.len() < 4 {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
        assert!(t.elapsed() < 5 * SECOND, "stalled: {oa:?} {ob:?}");
    }
    assert!(mem == msgs[3]);
}

#[test]
fn control_messages_overtake_waiting_data() {
    let (mut a, mut b) = pair(4096);
    let data = [5u8; 100];
    // SAFETY: `data` outlives the send, which completes below.
    unsafe { a.post_send(1, SendBuf::from_slice(&data)).unwrap() };
    let (mut oa, mut ob) = (Vec::new(), Vec::new());
    poll_until(&mut a, &mut oa, 5 * SECOND, |o| o.len() == 1).unwrap();
    a.post_control(b"first").unwrap();
    a.post_control(&[7u8; 4096]).unwrap();
    a.post_control(b"").unwrap();
    assert!(a.post_control(&[0u8; 4097]).is_err());
    let t = Instant::now();
    while ob.len() < 3 {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
        assert!(t.elapsed() < 5 * SECOND, "{ob:?}");
    }
    // Delivered with no receive posted, ahead of the data frame sent first, in order.
    let ctl: Vec<&[u8]> = ob
        .iter()
        .map(|c| match c {
            Completion::Control(v) => &v[..],
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ctl, [&b"first"[..], &[7u8; 4096][..], &b""[..]]);
    // Then the data still arrives.
    // SAFETY: no memory is involved in a lent receive.
    unsafe { b.post_recv(2, RecvInto::Lend { len: 100 }).unwrap() };
    poll_until(&mut b, &mut ob, 5 * SECOND, |o| o.len() == 4).unwrap();
    assert!(matches!(
        ob[3],
        Completion::Lent {
            token: 2,
            len: 100,
            ..
        }
    ));
    b.release(2);
}

#[test]
fn a_control_message_goes_in_at_the_next_frame_boundary() {
    // A large send is partly written when the control message is posted; it must not be
    // spliced into the middle of the frame.
    let max = 8 << 20;
    let (mut a, mut b) = pair(max);
    let big = contents(9, 0, max);
    // SAFETY: `big` outlives the send, which completes below.
    unsafe { a.post_send(1, SendBuf::from_slice(&big)).unwrap() };
    let (mut oa, mut ob) = (Vec::new(), Vec::new());
    a.poll(&mut oa).unwrap();
    a.post_control(b"notice").unwrap();
    // SAFETY: lent receives need no memory.
    unsafe { b.post_recv(2, RecvInto::Lend { len: max }).unwrap() };
    let t = Instant::now();
    while oa.is_empty() || ob.len() < 2 {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
        assert!(t.elapsed() < 5 * SECOND);
    }
    assert!(
        ob.iter()
            .any(|c| matches!(c, Completion::Control(v) if v == b"notice"))
    );
    let lent = ob.iter().find_map(|c| match c {
        Completion::Lent { ptr, len, .. } => Some((*ptr, *len)),
        _ => None,
    });
    let (ptr, len) = lent.unwrap();
    // SAFETY: lent until released below.
    assert!(unsafe { std::slice::from_raw_parts(ptr, len) } == &big[..]);
    b.release(2);
}

#[test]
fn a_size_mismatch_is_a_protocol_error() {
    let (mut a, mut b) = pair(1024);
    let x = [1u8; 10];
    // SAFETY: `x` outlives the send.
    unsafe {
        a.post_send(1, SendBuf::from_slice(&x)).unwrap();
        b.post_recv(2, RecvInto::Lend { len: 9 }).unwrap();
    }
    let mut oa = Vec::new();
    poll_until(&mut a, &mut oa, 5 * SECOND, |o| o.len() == 1).unwrap();
    let (e, _) = poll_until_error(&mut b, 5 * SECOND);
    assert!(
        matches!(e, TransportError::Protocol { peer: 0, .. }),
        "{e:?}"
    );
    // Sticky.
    assert!(b.poll(&mut Vec::new()).is_err());
    // Oversized posts are refused up front.
    // SAFETY: the send is refused, so the memory is never read.
    let big = unsafe { SendBuf::new(x.as_ptr(), 1025) };
    // SAFETY: as above.
    assert!(unsafe { a.post_send(3, big) }.is_err());
}

/// Rank 0's link to a hand-driven rank 1: the link, the connection rank 1 writes frames on
/// (the link's receiving side) and the one the link sends on.
fn link_to_raw_peer(max: usize) -> (TcpLink, TcpStream, TcpStream) {
    let secret = Secret::random().unwrap();
    let (mut ts, infos) = listen_all(2, V4, max, &secret);
    let addr0 = addr_of(&infos[0]);
    let info1: PeerInfo = infos[1].clone();
    let mut t0 = ts.remove(0);
    let rank0 = thread::spawn(move || t0.connect_links(&[&info1], Instant::now() + 5 * SECOND));
    let hello = |lane| ClientHello {
        from: 1,
        to: 0,
        nranks: 2,
        lane,
        session: 7,
    };
    let up = raw_rank(addr0, &secret, CONTEXT, hello(Lane::Up)).unwrap();
    let down = raw_rank(addr0, &secret, CONTEXT, hello(Lane::Down)).unwrap();
    let link = rank0.join().unwrap().unwrap().pop().unwrap();
    (link, up, down)
}

#[test]
fn malformed_frames_are_protocol_errors() {
    type Case = (&'static str, fn(&mut TcpStream), Option<usize>);
    let cases: [Case; 5] = [
        ("unknown kind", |s| write_frame(s, 2, b"abc"), None),
        (
            "oversized data",
            |s| write_frame(s, KIND_DATA, &[0; 1025]),
            None,
        ),
        (
            "oversized control",
            |s| write_frame(s, KIND_CONTROL, &[0; 4097]),
            None,
        ),
        (
            "length mismatch",
            |s| write_frame(s, KIND_DATA, &[0; 12]),
            Some(13),
        ),
        (
            "huge length",
            |s| s.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).unwrap(),
            None,
        ),
    ];
    for (name, send, recv) in cases {
        let (mut link, mut raw, _down) = link_to_raw_peer(1024);
        if let Some(len) = recv {
            // SAFETY: lent receives need no memory.
            unsafe { link.post_recv(1, RecvInto::Lend { len }).unwrap() };
        }
        send(&mut raw);
        let (e, _) = poll_until_error(&mut link, 5 * SECOND);
        assert!(
            matches!(e, TransportError::Protocol { peer: 1, .. }),
            "{name}: {e:?}"
        );
        drop(raw);
    }
}

#[test]
fn a_large_receive_posted_early_survives_other_frames_first() {
    // A large memory receive invites reading the next payload straight into it; a control
    // frame arriving first must still be delivered, and the data after it received intact.
    let len = 200 * 1024;
    let (mut link, mut raw, _down) = link_to_raw_peer(1 << 20);
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` outlives the receive, which completes below.
    unsafe {
        link.post_recv(1, RecvInto::Memory(RecvBuf::new(buf.as_mut_ptr(), len)))
            .unwrap();
    }
    link.poll(&mut Vec::new()).unwrap();
    let data = contents(5, 0, len);
    let ctl = contents(6, 0, 3000);
    let mut bytes = Vec::new();
    for (kind, payload) in [(KIND_CONTROL, &ctl), (KIND_DATA, &data)] {
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&kind.to_le_bytes());
        bytes.extend_from_slice(payload);
    }
    raw.write_all(&bytes).unwrap();
    let mut out = Vec::new();
    poll_until(&mut link, &mut out, 5 * SECOND, |o| o.len() == 2).unwrap();
    assert!(matches!(&out[0], Completion::Control(v) if *v == ctl));
    assert!(matches!(out[1], Completion::Received(1)));
    assert!(buf == data);
    // And one of the wrong size is refused, not truncated.
    // SAFETY: `buf` outlives the receive (the link fails first).
    unsafe {
        link.post_recv(2, RecvInto::Memory(RecvBuf::new(buf.as_mut_ptr(), len)))
            .unwrap();
    }
    link.poll(&mut out).unwrap();
    write_frame(&mut raw, KIND_DATA, &data[..len - 1]);
    let (e, _) = poll_until_error(&mut link, 5 * SECOND);
    assert!(
        matches!(e, TransportError::Protocol { peer: 1, .. }),
        "{e:?}"
    );
}

#[test]
fn frames_from_a_raw_peer_arrive() {
    // The wire format as documented: header then payload, data and control interleaved.
    let (mut link, mut raw, _down) = link_to_raw_peer(1024);
    write_frame(&mut raw, KIND_DATA, b"hello");
    write_frame(&mut raw, KIND_CONTROL, b"ctl");
    // SAFETY: lent receives need no memory.
    unsafe { link.post_recv(1, RecvInto::Lend { len: 5 }).unwrap() };
    let mut out = Vec::new();
    poll_until(&mut link, &mut out, 5 * SECOND, |o| o.len() == 2).unwrap();
    // Control may overtake the data ahead of it.
    assert!(out.iter().any(|c| matches!(
        c,
        Completion::Lent {
            token: 1,
            len: 5,
            ..
        }
    )));
    assert!(
        out.iter()
            .any(|c| matches!(c, Completion::Control(v) if v == b"ctl"))
    );
}

#[test]
fn a_dropped_peer_fails_posted_receives_promptly() {
    for how in ["drop", "close"] {
        let (mut a, mut b) = pair(1024);
        // SAFETY: lent receives need no memory.
        unsafe { a.post_recv(1, RecvInto::Lend { len: 8 }).unwrap() };
        a.poll(&mut Vec::new()).unwrap();
        if how == "drop" {
            drop(b);
        } else {
            b.close();
        }
        let (e, took) = poll_until_error(&mut a, SECOND);
        assert!(
            matches!(e, TransportError::PeerClosed { peer: 1 }),
            "{how}: {e:?}"
        );
        assert!(took < Duration::from_millis(200), "{how}: {took:?}");
    }
}

#[test]
fn a_peer_that_finished_and_left_is_no_error_until_something_needs_it() {
    let (mut a, mut b) = pair(1024);
    let msg = [9u8; 8];
    // SAFETY: `msg` outlives the send, which completes before `b` is dropped.
    unsafe { b.post_send(1, SendBuf::from_slice(&msg)).unwrap() };
    b.post_control(b"bye").unwrap();
    poll_until(&mut b, &mut Vec::new(), SECOND, |out| {
        out.iter().any(|c| matches!(c, Completion::Sent(1)))
    })
    .unwrap();
    drop(b);
    // Nothing posted: the close is seen, but it is not an error.
    let t = Instant::now();
    let mut out = Vec::new();
    while t.elapsed() < Duration::from_millis(100) {
        a.poll(&mut out)
            .expect("a closed peer with nothing posted is no error");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        out.iter()
            .any(|c| matches!(c, Completion::Control(m) if m == b"bye")),
        "{out:?}"
    );
    // What arrived before the close is still delivered...
    // SAFETY: lent receives need no memory.
    unsafe { a.post_recv(2, RecvInto::Lend { len: 8 }).unwrap() };
    out.clear();
    a.poll(&mut out)
        .expect("the buffered message satisfies the receive");
    assert!(
        out.iter().any(|c| matches!(
            c,
            Completion::Lent {
                token: 2,
                len: 8,
                ..
            }
        )),
        "{out:?}"
    );
    a.release(2);
    // ...and a receive nothing can satisfy fails at once.
    // SAFETY: lent receives need no memory.
    unsafe { a.post_recv(3, RecvInto::Lend { len: 8 }).unwrap() };
    let (e, took) = poll_until_error(&mut a, SECOND);
    assert!(matches!(e, TransportError::PeerClosed { peer: 1 }), "{e:?}");
    assert!(took < Duration::from_millis(50), "{took:?}");
}

#[test]
fn cancel_forgets_posted_operations_but_keeps_the_stream_usable_for_control() {
    const MSG: usize = 1 << 20;
    const SENDS: u64 = 32;
    let (mut a, mut b) = pair(MSG);
    // Far more than the socket takes at once, so sends are still queued (one partly written)
    // when `a` cancels, and a receive of its own.
    let big = vec![7u8; MSG];
    let mut sink = vec![0u8; MSG];
    // SAFETY: `big` and `sink` outlive the operations; after cancel the link must no longer
    // refer to them, which this test checks by dropping them first.
    unsafe {
        for t in 0..SENDS {
            a.post_send(t, SendBuf::from_slice(&big)).unwrap();
        }
        a.post_recv(
            100,
            RecvInto::Memory(RecvBuf::new(sink.as_mut_ptr(), sink.len())),
        )
        .unwrap();
    }
    let mut before = Vec::new();
    a.poll(&mut before).unwrap();
    let sent_before = sent(&before).len() as u64;
    assert!(
        sent_before < SENDS,
        "everything left at once; the test needs queued sends"
    );
    a.cancel();
    drop(big);
    drop(sink);
    a.post_control(b"notice").unwrap();
    // `b`, expecting every message, receives those that left before the cancel (a partly
    // written one finished from the copy) intact, then the notice.
    for t in 0..SENDS {
        // SAFETY: lent receives need no memory.
        unsafe { b.post_recv(t, RecvInto::Lend { len: MSG }).unwrap() };
    }
    let t = Instant::now();
    let (mut after, mut got) = (Vec::new(), Vec::new());
    let mut lent = 0;
    while !got
        .iter()
        .any(|c| matches!(c, Completion::Control(m) if m == b"notice"))
    {
        a.poll(&mut after).unwrap();
        let seen = got.len();
        b.poll(&mut got).unwrap();
        for c in &got[seen..] {
            if let Completion::Lent { token, ptr, len } = c {
                // SAFETY: lent memory is valid until released.
                let bytes = unsafe { std::slice::from_raw_parts(*ptr, *len) };
                assert!(bytes.iter().all(|&x| x == 7), "message {token} is corrupt");
                b.release(*token);
                lent += 1;
            }
        }
        assert!(
            t.elapsed() < 5 * SECOND,
            "the notice never arrived ({lent} messages)"
        );
    }
    assert!(
        sent(&after).is_empty(),
        "cancelled sends completed: {after:?}"
    );
    assert!(
        lent >= sent_before && lent <= sent_before + 1,
        "{lent} messages for {sent_before} sent"
    );
}

#[test]
fn a_peer_that_dies_mid_message_is_seen() {
    let (mut link, mut raw, _down) = link_to_raw_peer(1024);
    raw.write_all(&[100, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]).unwrap();
    let mut buf = [0u8; 100];
    // SAFETY: `buf` outlives the receive (the link fails first).
    unsafe {
        link.post_recv(1, RecvInto::Memory(RecvBuf::new(buf.as_mut_ptr(), 100)))
            .unwrap();
    }
    link.poll(&mut Vec::new()).unwrap();
    drop(raw);
    let (e, _) = poll_until_error(&mut link, SECOND);
    assert!(matches!(e, TransportError::PeerClosed { peer: 1 }), "{e:?}");
    // The readiness still names the socket, but not for reading: a socket at end of stream
    // stays readable, and would wake a waiting executor again and again.
    let mut ready = Vec::new();
    assert!(link.readiness(&mut ready) && !ready.is_empty());
    assert!(ready.iter().all(|r| !r.read), "{ready:?}");
}

#[test]
fn a_send_the_closed_peer_will_never_take_fails() {
    // The peer closes the connection it sends on (end of stream) but keeps the one it receives
    // on open without reading: a send larger than the socket buffers must fail, not wait.
    let len = 32 << 20;
    let (mut link, raw, _down) = link_to_raw_peer(len);
    let big = vec![7u8; len];
    // SAFETY: `big` outlives the send, which fails below (the link is then dropped first).
    unsafe { link.post_send(1, SendBuf::from_slice(&big)).unwrap() };
    link.poll(&mut Vec::new()).unwrap();
    raw.shutdown(std::net::Shutdown::Write).unwrap();
    let (e, took) = poll_until_error(&mut link, 5 * SECOND);
    assert!(matches!(e, TransportError::PeerClosed { peer: 1 }), "{e:?}");
    assert!(took < SECOND, "noticed after {took:?}");
    drop(link);
}
