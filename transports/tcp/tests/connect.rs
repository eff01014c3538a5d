//! Connection setup: ranks connect pairwise over IPv4 and IPv6, strangers are turned away
//! without holding up real peers, missing peers time out by name, the listener closes after.

mod util;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use oxccl_transport::auth::{self, Secret};
use oxccl_transport::{Completion, Link, PeerInfo, RecvBuf, RecvInto, SendBuf, TransportError};
use oxccl_transport_tcp::TcpLink;
use oxccl_transport_tcp::wire::{self, ClientHello, Lane};
use util::*;

/// Every rank sends its rank number to every peer; every link must carry its peer's number.
fn check_all_pairs(links: &mut [Vec<TcpLink>]) {
    let n = links.len();
    let msgs: Vec<[u8; 8]> = (0..n).map(|r| (r as u64).to_le_bytes()).collect();
    let mut got = vec![vec![[0u8; 8]; n]; n];
    for (r, row) in links.iter_mut().enumerate() {
        assert_eq!(row.len(), n - 1);
        for (link, got) in row.iter_mut().zip(got[r].iter_mut()) {
            // SAFETY: `msgs` and `got` outlive the operations, which complete below.
            unsafe {
                link.post_send(1, SendBuf::from_slice(&msgs[r])).unwrap();
                link.post_recv(2, RecvInto::Memory(RecvBuf::new(got.as_mut_ptr(), 8)))
                    .unwrap();
            }
        }
    }
    let mut outs: Vec<Vec<Vec<Completion>>> = links
        .iter()
        .map(|row| row.iter().map(|_| Vec::new()).collect())
        .collect();
    let t = Instant::now();
    while outs.iter().flatten().any(|o| o.len() < 2) {
        for (row, out_row) in links.iter_mut().zip(outs.iter_mut()) {
            for (link, out) in row.iter_mut().zip(out_row.iter_mut()) {
                link.poll(out).unwrap();
            }
        }
        assert!(t.elapsed() < Duration::from_secs(5), "exchange stalled");
    }
    for (r, row) in links.iter().enumerate() {
        for (link, got) in row.iter().zip(&got[r]) {
            assert_ne!(link.peer(), r);
            assert_eq!(u64::from_le_bytes(*got), link.peer() as u64, "rank {r}");
        }
    }
}

#[test]
fn four_ranks_connect_pairwise_over_ipv4() {
    let mut links = connect_all(4, V4, 1024);
    check_all_pairs(&mut links);
}

#[test]
fn three_ranks_connect_pairwise_over_ipv6() {
    if !have_ipv6() {
        println!("skipped: no IPv6 loopback");
        return;
    }
    let mut links = connect_all(3, V6, 1024);
    check_all_pairs(&mut links);
}

/// Sends five bytes from `a` to `b` and checks they arrive.
fn exchange(a: &mut TcpLink, b: &mut TcpLink) {
    let x = [9u8; 5];
    let mut y = [0u8; 5];
    // SAFETY: x and y outlive the operations, which complete below.
    unsafe {
        a.post_send(1, SendBuf::from_slice(&x)).unwrap();
        b.post_recv(2, RecvInto::Memory(RecvBuf::new(y.as_mut_ptr(), 5)))
            .unwrap();
    }
    let (mut oa, mut ob) = (Vec::new(), Vec::new());
    let t = Instant::now();
    while oa.is_empty() || ob.is_empty() {
        a.poll(&mut oa).unwrap();
        b.poll(&mut ob).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    assert_eq!(x, y);
}

/// Asserts that the other side hangs up on `s` within a few seconds.
fn assert_hung_up(s: &mut TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) => panic!("expected a hang-up, got {e}"),
        }
    }
}

#[test]
fn strangers_are_turned_away_while_peers_connect() {
    init_logging();
    let secret = Secret::random().unwrap();
    let (mut ts, infos) = listen_all(3, V4, 1024, &secret);
    let addr0 = addr_of(&infos[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let start = Instant::now();
    let mut t0 = ts.remove(0);
    let peers0: Vec<PeerInfo> = infos[1..].to_vec();
    let rank0 = thread::spawn(move || {
        let peers: Vec<&PeerInfo> = peers0.iter().collect();
        t0.connect_links(&peers, deadline)
    });

    // Connects and says nothing, for the whole test.
    let silent = TcpStream::connect(addr0).unwrap();
    // Not an oxccl peer at all.
    let mut garbage = TcpStream::connect(addr0).unwrap();
    garbage.write_all(&[b'G'; 64]).unwrap();
    assert_hung_up(&mut garbage);
    // The wrong secret, and the right secret with another communicator's context.
    let hello = ClientHello {
        from: 1,
        to: 0,
        nranks: 3,
        lane: Lane::Up,
        session: 1,
    };
    let other = Secret::random().unwrap();
    assert!(raw_rank(addr0, &other, CONTEXT, hello).is_err());
    assert!(raw_rank(addr0, &secret, b"another-comm", hello).is_err());
    // Right secret, but ranks this side does not accept from, or the wrong size or target.
    for bad in [
        ClientHello {
            from: 0,
            to: 0,
            nranks: 3,
            lane: Lane::Up,
            session: 1,
        },
        ClientHello {
            from: 7,
            to: 0,
            nranks: 3,
            lane: Lane::Up,
            session: 1,
        },
        ClientHello {
            from: 1,
            to: 0,
            nranks: 4,
            lane: Lane::Up,
            session: 1,
        },
        ClientHello {
            from: 1,
            to: 2,
            nranks: 3,
            lane: Lane::Up,
            session: 1,
        },
    ] {
        assert!(raw_rank(addr0, &secret, CONTEXT, bad).is_err(), "{bad:?}");
    }

    // The real rank 1 connects; then someone claiming to be rank 1 again is refused.
    let mut t1 = ts.remove(0);
    let info0 = infos[0].clone();
    let rank1 = thread::spawn(move || t1.connect_links(&[&info0], deadline))
        .join()
        .unwrap();
    let mut rank1 = rank1.unwrap();
    let dup = raw_rank(addr0, &secret, CONTEXT, hello);
    assert!(dup.is_err(), "a second rank 1 was accepted");

    let mut t2 = ts.remove(0);
    let peers2 = [infos[0].clone()];
    // Ranks 1 and 2 link only to rank 0 here (rank 1 is done, its listener closed).
    let rank2 = thread::spawn(move || t2.connect_links(&[&peers2[0]], deadline))
        .join()
        .unwrap();
    let mut rank2 = rank2.unwrap();
    let mut links0 = rank0.join().unwrap().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the silent stranger held up connect: {:?}",
        start.elapsed()
    );
    assert_eq!(links0.iter().map(|l| l.peer()).collect::<Vec<_>>(), [1, 2]);

    // The links work.
    exchange(&mut links0[0], &mut rank1[0]);
    exchange(&mut links0[1], &mut rank2[0]);

    // The listener is closed: newcomers are refused.
    let e = TcpStream::connect(addr0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    drop(silent);
}

#[test]
fn a_missing_peer_times_out_by_name() {
    let secret = Secret::random().unwrap();
    let (mut ts, infos) = listen_all(3, V4, 1024, &secret);
    let deadline = Instant::now() + Duration::from_millis(400);
    let mut t1 = ts.remove(1);
    let info0 = infos[0].clone();
    let rank1 = thread::spawn(move || t1.connect_links(&[&info0], deadline));
    let err = ts[0]
        .connect_links(&[&infos[1], &infos[2]], deadline)
        .unwrap_err();
    assert!(rank1.join().unwrap().is_ok());
    let TransportError::Timeout(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("[2]"), "{msg}");
    assert!(Instant::now() < deadline + Duration::from_millis(300));
}

#[test]
fn a_peer_that_never_listens_times_out_after_retries() {
    let secret = Secret::random().unwrap();
    // A port nobody listens on.
    let port = TcpListener::bind((V4, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (mut ts, mut infos) = listen_all(2, V4, 1024, &secret);
    infos[0].endpoints = vec![("tcp".into(), wire::encode_endpoint(&(V4, port).into()))];
    let deadline = Instant::now() + Duration::from_millis(300);
    let err = ts[1].connect_links(&[&infos[0]], deadline).unwrap_err();
    let TransportError::Timeout(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("[0]") && msg.contains("refused"), "{msg}");
}

#[test]
fn a_stranger_mid_handshake_does_not_delay_a_peer() {
    // A stranger sends half a hello and stalls; rank 1 connects right after it.
    let secret = Secret::random().unwrap();
    let (mut ts, infos) = listen_all(2, V4, 64, &secret);
    let addr0 = addr_of(&infos[0]);
    let (client, hello) = auth::Client::start(&secret, b"x", b"y").unwrap();
    drop(client);
    let mut stalled = TcpStream::connect(addr0).unwrap();
    stalled.write_all(&hello[..10]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut t1 = ts.remove(1);
    let info0 = infos[0].clone();
    let t = Instant::now();
    let rank1 = thread::spawn(move || t1.connect_links(&[&info0], deadline));
    let links0 = ts[0].connect_links(&[&infos[1]], deadline).unwrap();
    assert_eq!(links0.len(), 1);
    assert!(rank1.join().unwrap().is_ok());
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

#[test]
fn both_connections_of_a_pair_must_come_from_one_process() {
    init_logging();
    let secret = Secret::random().unwrap();
    let (mut ts, infos) = listen_all(2, V4, 1024, &secret);
    let addr0 = addr_of(&infos[0]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut t0 = ts.remove(0);
    let info1 = infos[1].clone();
    let rank0 = thread::spawn(move || t0.connect_links(&[&info1], deadline));
    let hello = |lane, session| ClientHello {
        from: 1,
        to: 0,
        nranks: 2,
        lane,
        session,
    };
    let _up = raw_rank(addr0, &secret, CONTEXT, hello(Lane::Up, 11)).unwrap();
    // The other lane from another session (a stale process, say) is refused...
    assert!(raw_rank(addr0, &secret, CONTEXT, hello(Lane::Down, 12)).is_err());
    // ... and the same session's is taken.
    let _down = raw_rank(addr0, &secret, CONTEXT, hello(Lane::Down, 11)).unwrap();
    let links = rank0.join().unwrap().unwrap();
    assert_eq!(links.len(), 1);
}
