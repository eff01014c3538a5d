//! Liveness: heartbeats between ranks, so that a peer that stops answering — its host gone,
//! its process stopped (SIGSTOP) or wedged in the kernel — fails the others within
//! [`Config::heartbeat`] instead of at the deadline, whether they are in a call or idle.
//!
//! Why datagrams from a thread of our own rather than TCP keepalive: keepalive does not cover a
//! connection with unacknowledged data (retransmissions go on for minutes), a stopped process's
//! kernel still acknowledges, and TCP_USER_TIMEOUT would also kill a connection whose data sits
//! behind a zero window while the peer is merely late to a collective. A heartbeat thread runs
//! while its rank computes, and goes quiet exactly when the process or its host does.
//!
//! Each rank sends a 44-byte authenticated datagram (HMAC-SHA256 over the job secret, with the
//! communicator's tag and a counter that only grows, so neither strangers nor replays keep a
//! dead rank alive) to its neighbours five times per period, and watches the same neighbours:
//! every other rank in communicators of up to [`ALL_UP_TO`] ranks, else the two on each side in
//! rank order — O(n) datagrams in all. The first silence of 80% of the period declares that
//! peer failed ([`Flags::lose`]); the engine fails the running call (or the next) with
//! `PeerFailed` naming it and tells every other rank, so all survivors name it.
//!
//! A rank whose own watch thread was not scheduled for half a period (its process was stopped
//! or starved) forgets what it saw rather than blame peers for its own silence. A rank that
//! destroys its communicator says goodbye; its neighbours stop watching it (its connections
//! closing is what fails a later call that needs it, as before).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::exec::flags::Flags;
use crate::types::Rank;

/// Communicators up to this size watch every peer; larger ones watch two neighbours a side.
pub(crate) const ALL_UP_TO: usize = 16;

const MAGIC: &[u8; 4] = b"OXHB";
const VERSION: u8 = 1;
const BEAT: u8 = 1;
const BYE: u8 = 2;
const HEADER: usize = 28;
const MAC: usize = 16;
/// Length of a heartbeat datagram.
pub(crate) const LEN: usize = HEADER + MAC;

/// The ranks `me` sends heartbeats to and watches.
pub(crate) fn neighbours(me: Rank, n: usize) -> Vec<Rank> {
    if n <= ALL_UP_TO {
        return (0..n).filter(|&r| r != me).collect();
    }
    let mut v: Vec<Rank> = [n - 2, n - 1, 1, 2]
        .iter()
        .map(|d| (me + d) % n)
        .filter(|&r| r != me)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// What authenticates a datagram: the job secret and the communicator's tag.
#[derive(Clone)]
pub(crate) struct Seal {
    key: [u8; 32],
    tag: [u8; 8],
}

impl Seal {
    pub(crate) fn new(secret: &[u8; 32], tag: [u8; 8]) -> Seal {
        Seal { key: *secret, tag }
    }

    fn mac(&self, header: &[u8]) -> [u8; MAC] {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .expect("HMAC accepts keys of any length");
        m.update(b"oxccl heartbeat v1");
        m.update(header);
        let full: [u8; 32] = m.finalize().into_bytes().into();
        let mut out = [0u8; MAC];
        out.copy_from_slice(&full[..MAC]);
        out
    }

    /// A datagram of `kind` from `from` with `counter`.
    pub(crate) fn encode(&self, kind: u8, from: Rank, counter: u64) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = kind;
        b[8..16].copy_from_slice(&self.tag);
        b[16..20].copy_from_slice(&(from as u32).to_le_bytes());
        b[20..28].copy_from_slice(&counter.to_le_bytes());
        let mac = self.mac(&b[..HEADER]);
        b[HEADER..].copy_from_slice(&mac);
        b
    }

    /// (kind, sender, counter) of a datagram this communicator's ranks sealed; `None` for
    /// anything else.
    pub(crate) fn decode(&self, b: &[u8]) -> Option<(u8, Rank, u64)> {
        if b.len() != LEN || &b[..4] != MAGIC || b[4] != VERSION || b[8..16] != self.tag {
            return None;
        }
        let mac = self.mac(&b[..HEADER]);
        if !bool::from(mac.ct_eq(&b[HEADER..])) {
            return None;
        }
        let from = u32::from_le_bytes(b[16..20].try_into().ok()?) as Rank;
        let counter = u64::from_le_bytes(b[20..28].try_into().ok()?);
        Some((b[5], from, counter))
    }
}

/// A bound heartbeat socket, before the peers' addresses are known.
pub(crate) fn bind(ip: IpAddr) -> std::io::Result<UdpSocket> {
    UdpSocket::bind(SocketAddr::new(ip, 0))
}

/// What a rank publishes (as its `hb` endpoint): its socket's address and its period, so that
/// each rank beats as often as its strictest neighbour needs.
pub(crate) fn endpoint(addr: SocketAddr, period: Duration) -> Vec<u8> {
    let mut e = oxccl_transport_tcp::encode_endpoint(&addr);
    e.extend((period.as_millis() as u64).to_le_bytes());
    e
}

/// The address and period in a published `hb` endpoint.
pub(crate) fn parse_endpoint(e: &[u8]) -> Option<(SocketAddr, Duration)> {
    let (addr, ms) = e.split_at_checked(e.len().checked_sub(8)?)?;
    let ms = u64::from_le_bytes(ms.try_into().ok()?);
    Some((
        oxccl_transport_tcp::decode_endpoint(addr)?,
        Duration::from_millis(ms),
    ))
}

/// The tag of the communicator with store namespace `namespace` (not secret: the MAC is).
pub(crate) fn tag(namespace: &str) -> [u8; 8] {
    use sha2::Digest;
    let d = Sha256::new()
        .chain_update(b"oxccl heartbeat tag\0")
        .chain_update(namespace.as_bytes())
        .finalize();
    let mut t = [0u8; 8];
    t.copy_from_slice(&d[..8]);
    t
}

/// The running watch; dropping it says goodbye and stops the thread (woken at once, and
/// joined: a dropped communicator leaves no heartbeat thread or socket behind).
pub(crate) struct Liveness {
    stop: Arc<AtomicBool>,
    socket: Arc<UdpSocket>,
    seal: Seal,
    me: Rank,
    targets: Vec<SocketAddr>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Liveness {
    /// Starts watching `peers` (rank, address) over `socket` with silence bound `period`,
    /// beating five times per `beat` (at most `period`: the strictest of the neighbours').
    pub(crate) fn start(
        me: Rank,
        socket: UdpSocket,
        peers: Vec<(Rank, SocketAddr)>,
        (period, beat): (Duration, Duration),
        seal: Seal,
        flags: Arc<Flags>,
    ) -> std::io::Result<Liveness> {
        let socket = Arc::new(socket);
        socket.set_read_timeout(Some(period / 10))?;
        let beat = beat.max(crate::config::Config::MIN_HEARTBEAT);
        let stop = Arc::new(AtomicBool::new(false));
        let targets: Vec<SocketAddr> = peers.iter().map(|p| p.1).collect();
        // The first beat leaves before the communicator reaches its user, from this thread:
        // neighbours watch a peer only once they have heard it (`Heard::ever`), so a rank
        // stopped right after its first call, before the watch thread was ever scheduled (2
        // cores, 3 busy ranks), would otherwise be noticed only at the deadline.
        let first = seal.encode(BEAT, me, FIRST_BEAT);
        for t in &targets {
            let _ = socket.send_to(&first, t);
        }
        let watch = Watch {
            me,
            socket: socket.clone(),
            peers,
            period,
            beat: beat.min(period),
            seal: seal.clone(),
            flags,
            stop: stop.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-heartbeat-{me}"))
            .spawn(move || watch.run())?;
        Ok(Liveness {
            thread: Some(thread),
            stop,
            socket,
            seal,
            me,
            targets,
        })
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let bye = self.seal.encode(BYE, self.me, u64::MAX);
        for t in &self.targets {
            let _ = self.socket.send_to(&bye, t);
        }
        // A datagram to its own socket ends the thread's wait (it reads the stop flag after
        // every receive); without one it ends at its read timeout, a tenth of the period.
        if let Ok(me) = self.socket.local_addr() {
            let _ = self.socket.send_to(&[0], me);
        }
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

struct Watch {
    me: Rank,
    socket: Arc<UdpSocket>,
    peers: Vec<(Rank, SocketAddr)>,
    period: Duration,
    beat: Duration,
    seal: Seal,
    flags: Arc<Flags>,
    stop: Arc<AtomicBool>,
}

/// The counter of the beat [`Liveness::start`] sends itself; the watch goes on from it.
const FIRST_BEAT: u64 = 1;

/// How long after the start a peer that was never heard from is reported (once): datagrams
/// may be filtered where TCP is not, and then liveness cannot watch that peer.
const NEVER_HEARD: Duration = Duration::from_secs(10);

/// What the watch knows of one neighbour.
#[derive(Clone, Copy)]
struct Heard {
    /// When it was last heard (or the watch resumed after a stall).
    at: Instant,
    /// Its highest counter so far (replays and reorderings are ignored).
    counter: u64,
    /// Whether it was ever heard: a peer is declared failed only after it was.
    ever: bool,
    /// Still watched (no goodbye).
    watched: bool,
    /// Declared failed (each peer is declared once).
    declared: bool,
}

impl Watch {
    fn run(self) {
        let beat_every = (self.beat / 5).max(Duration::from_millis(1));
        let silence = self.period.mul_f64(0.8);
        let stalled = self.period / 2;
        let start = Instant::now();
        let _ = self.socket.set_read_timeout(Some(
            (self.period / 10)
                .min(beat_every)
                .max(Duration::from_millis(1)),
        ));
        let mut heard = vec![
            Heard {
                at: start,
                counter: 0,
                ever: false,
                watched: true,
                declared: false,
            };
            self.peers.len()
        ];
        let mut counter = FIRST_BEAT;
        let mut next_beat = start + beat_every;
        let mut last_turn = start;
        let mut warned = false;
        let mut buf = [0u8; 64];
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now.duration_since(last_turn) > stalled {
                // This thread was not scheduled for a while (its process stopped, or starved):
                // what it did not hear says nothing about the peers.
                for h in heard.iter_mut() {
                    h.at = now;
                }
            }
            last_turn = now;
            if now >= next_beat {
                counter += 1;
                let beat = self.seal.encode(BEAT, self.me, counter);
                for (_, addr) in &self.peers {
                    let _ = self.socket.send_to(&beat, addr);
                }
                next_beat = now + beat_every;
            }
            let got = self.socket.recv_from(&mut buf);
            let now = Instant::now();
            if now.duration_since(last_turn) > stalled {
                // Stopped inside the receive: the same.
                for h in heard.iter_mut() {
                    h.at = now;
                }
                last_turn = now;
            }
            if let Ok((n, _)) = got
                && let Some((kind, from, c)) = self.seal.decode(&buf[..n])
                && let Some(i) = self.peers.iter().position(|p| p.0 == from)
                && c > heard[i].counter
            {
                let h = &mut heard[i];
                h.counter = c;
                h.at = now;
                h.ever = true;
                if kind == BYE {
                    h.watched = false;
                }
            }
            if !warned && now.duration_since(start) >= NEVER_HEARD {
                warned = true;
                let never: Vec<Rank> = (0..heard.len())
                    .filter(|&i| !heard[i].ever && heard[i].watched)
                    .map(|i| self.peers[i].0)
                    .collect();
                if !never.is_empty() {
                    tracing::warn!(
                        rank = self.me,
                        ?never,
                        "no heartbeat ever arrived from these ranks (UDP filtered?): their \
                         liveness is not watched; a stopped one is noticed only at the deadline"
                    );
                }
            }
            // This rank keeps beating whatever it declared (its neighbours must not take it
            // for dead), and declares each silent peer once: the first breaks the
            // communicator's calls, the others are known to `Communicator::failed_peers`.
            let late = (0..heard.len()).find(|&i| {
                let h = &heard[i];
                h.watched && h.ever && !h.declared && now - h.at >= silence
            });
            if let Some(i) = late {
                let quiet = now - heard[i].at;
                self.flags.lose(
                    self.peers[i].0,
                    format!(
                        "no heartbeat from it for {quiet:.1?} (OXCCL_HEARTBEAT {:?}): its \
                         process is stopped or hung, or its host unreachable",
                        self.period
                    ),
                );
                heard[i].declared = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzzed_heartbeats_and_endpoints_never_panic() {
        let seal = Seal::new(&[3; 32], *b"fuzzfuzz");
        let seeds = vec![
            seal.encode(BEAT, 1, 2).to_vec(),
            seal.encode(BYE, 7, u64::MAX).to_vec(),
        ];
        crate::fuzz::run("heartbeat Seal::decode", &seeds, |b| {
            std::hint::black_box(seal.decode(b));
        });
        let seeds = vec![endpoint(
            "10.0.0.1:5".parse().unwrap(),
            Duration::from_secs(2),
        )];
        crate::fuzz::run("heartbeat endpoint", &seeds, |b| {
            std::hint::black_box(parse_endpoint(b));
        });
    }

    #[test]
    fn endpoints_round_trip() {
        let a: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let e = endpoint(a, Duration::from_millis(1500));
        assert_eq!(parse_endpoint(&e), Some((a, Duration::from_millis(1500))));
        assert_eq!(parse_endpoint(&e[..5]), None);
        assert_eq!(parse_endpoint(&[]), None);
    }

    #[test]
    fn neighbours_are_symmetric() {
        for n in [1, 2, 3, 16, 17, 18, 100] {
            for me in 0..n {
                let mine = neighbours(me, n);
                assert!(!mine.contains(&me));
                for &p in &mine {
                    assert!(neighbours(p, n).contains(&me), "n {n}: {me} ↔ {p}");
                }
                assert_eq!(mine.len(), if n <= ALL_UP_TO { n - 1 } else { 4 });
            }
        }
    }

    #[test]
    fn only_sealed_datagrams_of_this_communicator_count() {
        let seal = Seal::new(&[7; 32], *b"commtag1");
        let b = seal.encode(BEAT, 5, 42);
        assert_eq!(seal.decode(&b), Some((BEAT, 5, 42)));
        let other_comm = Seal::new(&[7; 32], *b"commtag2");
        assert_eq!(other_comm.decode(&b), None);
        let other_job = Seal::new(&[8; 32], *b"commtag1");
        assert_eq!(other_job.decode(&b), None);
        for i in 0..LEN {
            let mut bad = b;
            bad[i] ^= 1;
            assert_eq!(seal.decode(&bad), None, "byte {i}");
        }
        assert_eq!(seal.decode(&b[..LEN - 1]), None);
        assert_eq!(seal.decode(&[]), None);
    }

    #[test]
    fn a_peer_silent_from_its_start_is_declared_failed() {
        // Rank 1's watch is stopped as soon as it starts (as a process SIGSTOPped right after
        // init): the beat `start` sent is all rank 0 ever hears, and it must be enough.
        let a = bind("127.0.0.1".parse().unwrap()).unwrap();
        let b = bind("127.0.0.1".parse().unwrap()).unwrap();
        let (pa, pb) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let seal = Seal::new(&[2; 32], *b"testtest");
        let period = Duration::from_millis(300);
        let (fa, fb) = (Arc::new(Flags::new()), Arc::new(Flags::new()));
        let lb = Liveness::start(1, b, vec![(0, pa)], (period, period), seal.clone(), fb).unwrap();
        lb.stop.store(true, Ordering::Release);
        std::mem::forget(lb);
        let la = Liveness::start(0, a, vec![(1, pb)], (period, period), seal, fa.clone()).unwrap();
        let gone = Instant::now();
        while fa.lost().is_none() && gone.elapsed() < period * 10 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (peer, why) = fa.lost().expect("rank 1 declared failed");
        assert_eq!(peer, 1);
        assert!(why.contains("no heartbeat"), "{why}");
        drop(la);
    }

    #[test]
    fn a_silent_peer_is_declared_failed_within_the_period() {
        let a = bind("127.0.0.1".parse().unwrap()).unwrap();
        let b = bind("127.0.0.1".parse().unwrap()).unwrap();
        let c = bind("127.0.0.1".parse().unwrap()).unwrap();
        let addrs = [
            a.local_addr().unwrap(),
            b.local_addr().unwrap(),
            c.local_addr().unwrap(),
        ];
        let seal = Seal::new(&[1; 32], *b"testtest");
        let period = Duration::from_millis(300);
        let flags: Vec<Arc<Flags>> = (0..3).map(|_| Arc::new(Flags::new())).collect();
        let peers = |me: Rank| -> Vec<(Rank, SocketAddr)> {
            (0..3).filter(|&r| r != me).map(|r| (r, addrs[r])).collect()
        };
        let la = Liveness::start(
            0,
            a,
            peers(0),
            (period, period),
            seal.clone(),
            flags[0].clone(),
        )
        .unwrap();
        let lb = Liveness::start(
            1,
            b,
            peers(1),
            (period, period),
            seal.clone(),
            flags[1].clone(),
        )
        .unwrap();
        let lc = Liveness::start(2, c, peers(2), (period, period), seal, flags[2].clone()).unwrap();
        // Everyone beats: nobody is lost over several periods.
        std::thread::sleep(period * 4);
        assert!(flags.iter().all(|f| f.lost().is_none()));
        // Rank 2 goes silent without a goodbye (as a stopped process does).
        lc.stop.store(true, Ordering::Release);
        std::mem::forget(lc);
        let gone = Instant::now();
        while (flags[0].lost().is_none() || flags[1].lost().is_none())
            && gone.elapsed() < period * 3
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let took = gone.elapsed();
        for f in &flags[..2] {
            let (peer, why) = f.lost().expect("rank 2 declared failed");
            assert_eq!(peer, 2);
            assert!(why.contains("no heartbeat"), "{why}");
        }
        // Within the period (0.8 of it plus a receive timeout, measured here); twice it, so
        // that a loaded machine does not fail the test — tests/liveness.rs measures the bound.
        assert!(took <= period * 2, "took {took:?}");
        drop((la, lb));
    }

    #[test]
    fn every_silent_peer_is_declared_and_the_first_stays_the_cause() {
        let sockets: Vec<UdpSocket> = (0..4)
            .map(|_| bind("127.0.0.1".parse().unwrap()).unwrap())
            .collect();
        let addrs: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
        let seal = Seal::new(&[3; 32], *b"testtest");
        let period = Duration::from_millis(300);
        let flags: Vec<Arc<Flags>> = (0..4).map(|_| Arc::new(Flags::new())).collect();
        let mut watches: Vec<Option<Liveness>> = sockets
            .into_iter()
            .enumerate()
            .map(|(me, s)| {
                let peers = (0..4).filter(|&r| r != me).map(|r| (r, addrs[r])).collect();
                Some(
                    Liveness::start(
                        me,
                        s,
                        peers,
                        (period, period),
                        seal.clone(),
                        flags[me].clone(),
                    )
                    .unwrap(),
                )
            })
            .collect();
        std::thread::sleep(period * 2);
        assert!(flags.iter().all(|f| f.lost_all().is_empty()));
        let silence = |w: Liveness| {
            w.stop.store(true, Ordering::Release);
            std::mem::forget(w);
        };
        let wait_for = |n: usize| {
            let t = Instant::now();
            while flags[..2].iter().any(|f| f.lost_all().len() < n) && t.elapsed() < period * 10 {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        // Rank 3 goes silent, then rank 2 once rank 3 was declared.
        silence(watches[3].take().unwrap());
        wait_for(1);
        assert_eq!(flags[0].lost_all(), vec![3]);
        silence(watches[2].take().unwrap());
        wait_for(2);
        for f in &flags[..2] {
            assert_eq!(f.lost_all(), vec![3, 2]);
            let (first, why) = f.lost().expect("declared");
            assert_eq!(first, 3, "the first declared stays the cause");
            assert!(why.contains("no heartbeat"), "{why}");
        }
        drop(watches);
    }

    #[test]
    fn a_goodbye_is_not_a_failure() {
        let a = bind("127.0.0.1".parse().unwrap()).unwrap();
        let b = bind("127.0.0.1".parse().unwrap()).unwrap();
        let (pa, pb) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let seal = Seal::new(&[1; 32], *b"testtest");
        let period = Duration::from_millis(200);
        let (fa, fb) = (Arc::new(Flags::new()), Arc::new(Flags::new()));
        let la = Liveness::start(
            0,
            a,
            vec![(1, pb)],
            (period, period),
            seal.clone(),
            fa.clone(),
        )
        .unwrap();
        let lb = Liveness::start(1, b, vec![(0, pa)], (period, period), seal, fb).unwrap();
        std::thread::sleep(period);
        drop(lb);
        std::thread::sleep(period * 3);
        assert!(fa.lost().is_none(), "{:?}", fa.lost());
        drop(la);
    }
}
