//! A peer in a pid namespace this rank cannot see (two containers of one pod: one network
//! namespace, so the abstract socket is shared, but separate pids): the kernel reports its pid
//! as 0. The link still works through the rings; direct access to that peer is off, on the side
//! that cannot see it. Needs `unshare --pid` (root, usually): skipped, saying so, without it.

use std::process::Command;
use std::time::{Duration, Instant};

use oxccl_transport::auth::Secret;
use oxccl_transport::{Completion, Link, PeerInfo, RecvBuf, RecvInto, SendBuf, Transport};
use oxccl_transport_shm::{ShmConfig, ShmTransport};

const TEST: &str = "a_peer_in_a_hidden_pid_namespace_links_without_direct_access";
/// Set in the child (rank 1, in its own pid namespace): "secret context endpoint".
const CHILD: &str = "OXCCL_SHM_PIDNS_CHILD";
const MAX: usize = 256 * 1024;
const LEN: usize = 200_000;

fn transport(rank: usize, secret: &Secret, context: &str) -> ShmTransport {
    ShmTransport::new(ShmConfig {
        rank,
        nranks: 2,
        secret: secret.clone(),
        context: context.as_bytes().to_vec(),
        max_message: MAX,
        slots: 4,
    })
    .unwrap()
}

fn message(rank: usize) -> Vec<u8> {
    (0..LEN).map(|i| (i * 31 + rank) as u8).collect()
}

/// Sends this rank's message and receives the peer's (receive posted first, so a sender that
/// may go by address does).
fn swap(link: &mut dyn Link, rank: usize, peer: usize) {
    let msg = message(rank);
    let mut got = vec![0u8; LEN];
    // SAFETY: both buffers outlive the operations, which complete below.
    unsafe {
        link.post_recv(1, RecvInto::Memory(RecvBuf::new(got.as_mut_ptr(), LEN)))
            .unwrap();
        link.post_send(2, SendBuf::from_slice(&msg)).unwrap();
    }
    let (mut out, t) = (Vec::new(), Instant::now());
    while !(out.iter().any(|c| matches!(c, Completion::Received(1)))
        && out.iter().any(|c| matches!(c, Completion::Sent(2))))
    {
        link.poll(&mut out).unwrap();
        assert!(t.elapsed() < Duration::from_secs(10), "stuck: {out:?}");
    }
    assert!(
        got == message(peer),
        "rank {rank}: the message from {peer} is wrong"
    );
}

#[test]
fn a_peer_in_a_hidden_pid_namespace_links_without_direct_access() {
    if let Ok(args) = std::env::var(CHILD) {
        return child(&args);
    }
    match Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .output()
    {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr);
            println!("skipped: unshare --pid fails here: {}", why.trim());
            return;
        }
        Err(e) => {
            println!("skipped: no unshare: {e}");
            return;
        }
    }
    let secret = Secret::random().unwrap();
    let context = format!(
        "pidns-{}-{}",
        std::process::id(),
        &Secret::random().unwrap().to_hex()[..8]
    );
    let mut t0 = transport(0, &secret, &context);
    let endpoint = String::from_utf8(t0.listen().unwrap()).unwrap();
    // Rank 1 runs this test again inside a new pid namespace (nested in ours: it sees no pid of
    // ours, we see its).
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{} {context} {endpoint}", secret.to_hex()))
        .spawn()
        .unwrap();
    let i1 = PeerInfo {
        rank: 1,
        host: "h".into(),
        endpoints: vec![("shm".into(), Vec::new())],
    };
    let connected = t0.connect(&[&i1], Instant::now() + Duration::from_secs(20));
    let mut links = match connected {
        Ok(l) => l,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("rank 0: connect: {e}");
        }
    };
    let mut link = links.pop().unwrap();
    // We see rank 1's pid: it is held by a pidfd (and, with ptrace allowed, read directly).
    // Looked at before the swap, which rank 1 waits for: once it has swapped it may exit, and
    // a pidfd rightly says so (CI saw this assertion fail when it looked after).
    let area = t0.areas().group(0).expect("both ranks over shm");
    assert!(area.peer_alive(1));
    println!("rank 0: direct access to rank 1: {}", area.direct());
    swap(&mut *link, 0, 1);
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "rank 1 (in its own pid namespace) failed: {status}"
    );
    drop(link);
}

/// Rank 1, pid 1 of its own pid namespace: rank 0's pid reads 0 here.
fn child(args: &str) {
    let mut it = args.split(' ');
    let (secret, context, endpoint) = (
        Secret::from_hex(it.next().unwrap()).unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
    );
    assert_eq!(std::process::id(), 1, "not in a new pid namespace");
    let mut t1 = transport(1, &secret, context);
    let i0 = PeerInfo {
        rank: 0,
        host: "h".into(),
        endpoints: vec![("shm".into(), endpoint.as_bytes().to_vec())],
    };
    let mut links = t1
        .connect(&[&i0], Instant::now() + Duration::from_secs(20))
        .unwrap();
    let mut link = links.pop().unwrap();
    swap(&mut *link, 1, 0);
    let area = t1.areas().group(1).expect("both ranks over shm");
    assert!(!area.direct(), "direct access to a peer whose pid reads 0");
    assert!(area.peer_alive(0), "unknown liveness counts as alive");
    let mut dst = [0u8; 8];
    // SAFETY: `dst` is ours; nothing is transferred (refused).
    let e = unsafe { area.read_from(0, 0x1000, dst.as_mut_ptr(), 8) }.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
    println!("rank 1: no direct access to rank 0, as expected: {e}");
}
