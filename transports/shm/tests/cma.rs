//! Direct access to a peer's memory through its pidfd: transfers reach a live process, and a
//! process that exited is never reached — an error instead, before any system call names its
//! pid.

use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_transport_shm::area::{Area, AreaSegment};
use oxccl_transport_shm::cma::{self, Process};

/// An area of two ranks as rank 0 sees it, rank 1 held by `p` with direct access.
fn area_with(p: Option<Process>, readable: bool) -> Area {
    let segs = (0..2)
        .map(|_| Arc::new(AreaSegment::create().unwrap()))
        .collect();
    Area::new(0, segs, vec![None, p.map(Arc::new)], vec![true, readable])
}

fn sleeper() -> Child {
    Command::new("sleep").arg("60").spawn().unwrap()
}

#[test]
fn reads_and_writes_reach_a_live_peer() {
    // This process stands for the peer: process_vm_readv on one's own pid works.
    let area = area_with(
        Some(Process::open(std::process::id() as i32).unwrap()),
        true,
    );
    assert!(area.direct());
    assert!(area.peer_alive(1));
    let src: Vec<u8> = (0..100_000).map(|i| (i * 13) as u8).collect();
    let mut got = vec![0u8; src.len()];
    // SAFETY: `got` is ours, not otherwise touched during the call.
    unsafe { area.read_from(1, src.as_ptr() as usize, got.as_mut_ptr(), src.len()) }.unwrap();
    assert_eq!(got, src);
    let mut target = vec![0u8; src.len()];
    // SAFETY: `src` is only read; `target` is the "peer's" memory, untouched meanwhile.
    unsafe { area.write_to(1, target.as_mut_ptr() as usize, src.as_ptr(), src.len()) }.unwrap();
    assert_eq!(target, src);
    // Never this rank itself.
    // SAFETY: as above (and nothing is transferred).
    let e = unsafe { area.read_from(0, src.as_ptr() as usize, got.as_mut_ptr(), 1) }.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
}

#[test]
fn a_peer_without_proven_access_or_pidfd_is_never_reached() {
    let me = std::process::id() as i32;
    // Held (for liveness) but not proven to be the peer: no direct access.
    let area = area_with(Some(Process::open(me).unwrap()), false);
    assert!(!area.direct());
    assert!(area.peer_alive(1));
    // No pidfd at all (pid not visible, or no pidfd_open): no direct access, liveness unknown.
    let none = area_with(None, true);
    assert!(!none.direct());
    assert!(none.peer_alive(1));
    let src = [9u8; 8];
    let mut dst = [0u8; 8];
    for a in [&area, &none] {
        // SAFETY: `dst` is ours; nothing is transferred.
        let e = unsafe { a.read_from(1, src.as_ptr() as usize, dst.as_mut_ptr(), 8) }.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
        // SAFETY: as above.
        let e = unsafe { a.write_to(1, dst.as_mut_ptr() as usize, src.as_ptr(), 8) }.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
    }
    assert_eq!(dst, [0; 8]);
    assert!(Process::open(0).is_err(), "pid 0 is never held");
}

#[test]
fn an_exited_peer_gives_an_error_not_a_transfer() {
    let mut child = sleeper();
    let area = area_with(Some(Process::open(child.id() as i32).unwrap()), true);
    assert!(area.peer_alive(1));
    child.kill().unwrap();
    // Killed but not reaped: a zombie already counts as exited.
    let t = Instant::now();
    while area.peer_alive(1) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the kill never showed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let src = [1u8; 64];
    let mut dst = [0u8; 64];
    let check = |area: &Area, dst: &mut [u8; 64]| {
        // SAFETY: `dst` is ours; the remote address is never reached (the peer exited).
        let e = unsafe { area.read_from(1, 0x1000, dst.as_mut_ptr(), 64) }.unwrap_err();
        assert!(cma::is_exit(&e), "{e}");
        assert!(e.to_string().contains("exited"), "{e}");
        // SAFETY: `src` is only read.
        let e = unsafe { area.write_to(1, 0x1000, src.as_ptr(), 64) }.unwrap_err();
        assert!(cma::is_exit(&e), "{e}");
    };
    check(&area, &mut dst);
    // Reaped: its pid may now go to anyone; the pidfd still names the dead process.
    child.wait().unwrap();
    assert!(!area.peer_alive(1));
    check(&area, &mut dst);
    assert_eq!(dst, [0; 64]);
}
