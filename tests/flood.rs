//! 64 rank processes starting at once on this machine's cores, over TCP (a full mesh of
//! 64 × 63 links), while strangers flood the job's store with connections that say nothing or
//! send garbage: every rank must get in, connect and run its all-reduce. Its own test binary,
//! so that no other test shares the cores with it.

mod util;

use std::collections::VecDeque;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use util::procs;
#[test]
fn sixty_four_ranks_start_at_once_while_strangers_flood_the_store() {
    // 64 processes on this machine's cores, over TCP (a full mesh of 64 × 63 links), each
    // creating its communicator and running one all-reduce, while 4 threads keep opening
    // connections to the store that say nothing or send garbage. The flood is under way before
    // the first rank starts: the ranks start only once the strangers have opened more
    // connections than the 128 the store lets wait in their handshake at once, so the store
    // has been full and dropping strangers when the ranks arrive. (Counting the flood only
    // after the ranks finished made the test depend on how fast 64 ranks start: CI once saw
    // them all finish while the flooders, blocked on a full listen backlog, had opened 200.)
    let n = 64;
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let mut flooders = Vec::new();
    let (_store, mut ranks) = procs::launch_after(
        n,
        "fault_worker",
        &["16", "1"],
        |_| vec![("OXCCL_TRANSPORTS", "tcp".to_string())],
        |addr| {
            for t in 0..4 {
                let (stop, opened) = (stop.clone(), opened.clone());
                flooders.push(std::thread::spawn(move || flood(addr, t, &stop, &opened)));
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while opened.load(Ordering::Relaxed) <= 256 {
                assert!(
                    Instant::now() < deadline,
                    "the store stopped taking connections: strangers opened only {} in 30 s",
                    opened.load(Ordering::Relaxed)
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        },
    );
    let before = opened.load(Ordering::Relaxed);
    let mut failed = Vec::new();
    for (r, rank) in ranks.iter_mut().enumerate() {
        let (status, lines) = rank.finish();
        if !status.success() || !lines.iter().any(|l| l == "iter 0") {
            failed.push(format!("rank {r}: {status:?} {lines:?}"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().expect("flooder");
    }
    assert!(
        failed.is_empty(),
        "{} ranks failed: {failed:#?}",
        failed.len()
    );
    eprintln!(
        "64 ranks started after strangers had opened {before} connections to the store, \
         and {} in all",
        opened.load(Ordering::Relaxed)
    );
}

/// Opens connections to `addr` until `stop`, holding the last 200; odd threads send garbage.
/// A connect that does not complete in 200 ms (the listen backlog is full) is given up, so the
/// thread notices `stop`.
fn flood(addr: SocketAddr, t: usize, stop: &AtomicBool, opened: &AtomicU64) {
    let mut held = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            if t % 2 == 1 {
                let _ = s.write_all(b"GARBAGE GARBAGE GARBAGE");
            }
            held.push_back(s);
            opened.fetch_add(1, Ordering::Relaxed);
        }
        if held.len() > 200 {
            held.pop_front();
        }
    }
}
