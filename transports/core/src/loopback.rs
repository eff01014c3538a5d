//! An in-process transport for ranks that are threads of one process: messages are copied into
//! queues shared through a [`Hub`]. Used by `Communicator::init_local` and by tests.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::{
    Completion, Link, PeerInfo, Rank, Readiness, RecvInto, Result, SendBuf, Token, Transport,
    TransportError,
};

/// Messages a direction of a loopback link holds before a sender must wait: above the
/// one-message minimum every transport guarantees, low enough to exercise back-pressure.
const DEPTH: usize = 2;

/// The meeting point of the ranks of one process: one per group of communicators created
/// together.
#[derive(Debug, Default)]
pub struct Hub {
    id: u64,
    /// Pipes keyed by (communicator namespace, from, to).
    pipes: Mutex<HashMap<(String, Rank, Rank), Arc<Pipe>>>,
}

impl Hub {
    /// A hub with a process-unique id.
    pub fn new() -> Arc<Hub> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Arc::new(Hub {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            pipes: Mutex::default(),
        })
    }

    /// The one-way pipe from `from` to `to` in communicator `namespace`, created on first use.
    fn pipe(&self, namespace: &str, from: Rank, to: Rank) -> Arc<Pipe> {
        let mut pipes = lock(&self.pipes);
        pipes
            .entry((namespace.to_owned(), from, to))
            .or_default()
            .clone()
    }

    fn endpoint(&self) -> Vec<u8> {
        let mut e = std::process::id().to_le_bytes().to_vec();
        e.extend(self.id.to_le_bytes());
        e
    }
}

/// One direction of a link.
#[derive(Debug, Default)]
struct Pipe {
    data: Mutex<VecDeque<Vec<u8>>>,
    control: Mutex<VecDeque<Vec<u8>>>,
    closed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a queue half-updated (push/pop are atomic
    // with respect to it), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The loopback transport of one rank.
#[derive(Debug)]
pub struct LoopbackTransport {
    hub: Arc<Hub>,
    namespace: String,
    rank: Rank,
    max_message: usize,
}

impl LoopbackTransport {
    /// Rank `rank`'s transport for communicator `namespace` on `hub`, carrying messages of up
    /// to `max_message` bytes. Communicators sharing a hub must use distinct namespaces.
    pub fn new(
        hub: Arc<Hub>,
        namespace: &str,
        rank: Rank,
        max_message: usize,
    ) -> LoopbackTransport {
        LoopbackTransport {
            hub,
            namespace: namespace.to_owned(),
            rank,
            max_message,
        }
    }
}

impl Transport for LoopbackTransport {
    fn name(&self) -> &'static str {
        "loopback"
    }

    fn listen(&mut self) -> Result<Vec<u8>> {
        Ok(self.hub.endpoint())
    }

    fn can_connect(&self, me: &PeerInfo, peer: &PeerInfo) -> bool {
        let mine = me.endpoint(self.name());
        mine.is_some() && mine == peer.endpoint(self.name())
    }

    fn connect(&mut self, peers: &[&PeerInfo], _deadline: Instant) -> Result<Vec<Box<dyn Link>>> {
        peers
            .iter()
            .map(|p| {
                if p.endpoint(self.name()) != Some(&self.hub.endpoint()[..]) {
                    return Err(TransportError::Unavailable(format!(
                        "rank {} is not in this process's loopback hub",
                        p.rank
                    )));
                }
                let link = LoopbackLink {
                    peer: p.rank,
                    out: self.hub.pipe(&self.namespace, self.rank, p.rank),
                    inp: self.hub.pipe(&self.namespace, p.rank, self.rank),
                    max_message: self.max_message,
                    sends: VecDeque::new(),
                    recvs: VecDeque::new(),
                    lent: None,
                    discard: false,
                };
                Ok(Box::new(link) as Box<dyn Link>)
            })
            .collect()
    }
}

/// One rank's end of a loopback link.
#[derive(Debug)]
struct LoopbackLink {
    peer: Rank,
    out: Arc<Pipe>,
    inp: Arc<Pipe>,
    max_message: usize,
    sends: VecDeque<(Token, SendBuf)>,
    recvs: VecDeque<(Token, RecvInto)>,
    /// The message currently lent out, kept alive until released.
    lent: Option<(Token, Vec<u8>)>,
    /// After `cancel`: data messages that arrive are dropped (control still gets through).
    discard: bool,
}

impl Link for LoopbackLink {
    fn peer(&self) -> Rank {
        self.peer
    }

    fn max_message(&self) -> usize {
        self.max_message
    }

    unsafe fn post_send(&mut self, token: Token, buf: SendBuf) -> Result<()> {
        if buf.len() > self.max_message {
            return Err(TransportError::Protocol {
                peer: self.peer,
                what: format!("send of {} bytes exceeds {}", buf.len(), self.max_message),
            });
        }
        self.sends.push_back((token, buf));
        Ok(())
    }

    unsafe fn post_recv(&mut self, token: Token, into: RecvInto) -> Result<()> {
        self.recvs.push_back((token, into));
        Ok(())
    }

    fn peek(&mut self, buf: &mut [u8]) -> usize {
        if self.discard {
            return 0;
        }
        let q = lock(&self.inp.data);
        let Some(m) = q.front() else {
            return 0;
        };
        let n = m.len().min(buf.len());
        buf[..n].copy_from_slice(&m[..n]);
        n
    }

    fn post_control(&mut self, bytes: &[u8]) -> Result<()> {
        if self.out.closed.load(Ordering::Acquire) {
            return Err(TransportError::PeerClosed { peer: self.peer });
        }
        lock(&self.out.control).push_back(bytes.to_vec());
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        out.extend(lock(&self.inp.control).drain(..).map(Completion::Control));
        if self.discard {
            lock(&self.inp.data).clear();
            return Ok(());
        }
        while let Some(&(token, buf)) = self.sends.front() {
            if self.out.closed.load(Ordering::Acquire) {
                return Err(TransportError::PeerClosed { peer: self.peer });
            }
            let mut q = lock(&self.out.data);
            if q.len() >= DEPTH {
                break;
            }
            // SAFETY: post_send's caller guaranteed the memory stays valid and unchanged until
            // this send completes, which happens just below.
            let bytes = unsafe { std::slice::from_raw_parts(buf.ptr(), buf.len()) };
            q.push_back(bytes.to_vec());
            drop(q);
            self.sends.pop_front();
            out.push(Completion::Sent(token));
        }
        while self.lent.is_none() {
            let Some(&(token, into)) = self.recvs.front() else {
                break;
            };
            let Some(msg) = lock(&self.inp.data).pop_front() else {
                if self.inp.closed.load(Ordering::Acquire) {
                    return Err(TransportError::PeerClosed { peer: self.peer });
                }
                break;
            };
            if msg.len() != into.len() {
                return Err(TransportError::Protocol {
                    peer: self.peer,
                    what: format!(
                        "message of {} bytes where {} were expected",
                        msg.len(),
                        into.len()
                    ),
                });
            }
            self.recvs.pop_front();
            match into {
                RecvInto::Memory(buf) => {
                    // SAFETY: post_recv's caller guaranteed exclusive access to this memory until
                    // the receive completes, which happens just below; lengths are equal.
                    unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.ptr(), msg.len()) };
                    out.push(Completion::Received(token));
                }
                RecvInto::Lend { len } => {
                    out.push(Completion::Lent {
                        token,
                        ptr: msg.as_ptr(),
                        len,
                    });
                    self.lent = Some((token, msg));
                }
            }
        }
        if self.inp.closed.load(Ordering::Acquire)
            && (!self.recvs.is_empty() || !self.sends.is_empty())
            && lock(&self.inp.data).is_empty()
        {
            return Err(TransportError::PeerClosed { peer: self.peer });
        }
        Ok(())
    }

    fn release(&mut self, token: Token) {
        if self.lent.as_ref().is_some_and(|(t, _)| *t == token) {
            self.lent = None;
        }
    }

    fn readiness(&self, _out: &mut Vec<Readiness>) -> bool {
        false
    }

    fn cancel(&mut self) {
        // Sends copy their bytes when they complete, so forgetting the queues forgets every
        // reference to caller memory; a lent message stays owned by the link until released.
        self.sends.clear();
        self.recvs.clear();
        self.discard = true;
    }

    fn close(&mut self) {
        self.out.closed.store(true, Ordering::Release);
        self.inp.closed.store(true, Ordering::Release);
    }
}

impl Drop for LoopbackLink {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Box<dyn Link>, Box<dyn Link>) {
        let hub = Hub::new();
        let mut t0 = LoopbackTransport::new(hub.clone(), "c", 0, 1024);
        let mut t1 = LoopbackTransport::new(hub, "c", 1, 1024);
        let i0 = PeerInfo {
            rank: 0,
            host: "h".into(),
            endpoints: vec![("loopback".into(), t0.listen().unwrap())],
        };
        let i1 = PeerInfo {
            rank: 1,
            host: "h".into(),
            endpoints: vec![("loopback".into(), t1.listen().unwrap())],
        };
        assert!(t0.can_connect(&i0, &i1));
        let deadline = Instant::now();
        let a = t0.connect(&[&i1], deadline).unwrap().pop().unwrap();
        let b = t1.connect(&[&i0], deadline).unwrap().pop().unwrap();
        (a, b)
    }

    #[test]
    fn messages_arrive_in_order_into_memory_or_lent() {
        let (mut a, mut b) = pair();
        let x = [1u8, 2, 3];
        let y = [4u8, 5];
        let mut got = [0u8; 3];
        let mut done = Vec::new();
        // SAFETY: x, y and got outlive the link operations, which complete in this test.
        unsafe {
            a.post_send(1, SendBuf::from_slice(&x)).unwrap();
            a.post_send(2, SendBuf::from_slice(&y)).unwrap();
            b.post_recv(
                7,
                RecvInto::Memory(crate::RecvBuf::new(got.as_mut_ptr(), 3)),
            )
            .unwrap();
            b.post_recv(8, RecvInto::Lend { len: 2 }).unwrap();
        }
        a.poll(&mut done).unwrap();
        b.poll(&mut done).unwrap();
        assert!(matches!(done[0], Completion::Sent(1)));
        assert!(matches!(done[1], Completion::Sent(2)));
        assert!(matches!(done[2], Completion::Received(7)));
        assert_eq!(got, x);
        let Completion::Lent {
            token: 8,
            ptr,
            len: 2,
        } = done[3]
        else {
            panic!("{done:?}")
        };
        // SAFETY: lent memory stays valid until release.
        assert_eq!(unsafe { std::slice::from_raw_parts(ptr, 2) }, &y);
        b.release(8);
    }

    #[test]
    fn wrong_size_and_closed_peer_are_errors() {
        let (mut a, mut b) = pair();
        let x = [1u8; 4];
        let mut done = Vec::new();
        // SAFETY: x outlives the send.
        unsafe {
            a.post_send(1, SendBuf::from_slice(&x)).unwrap();
            b.post_recv(2, RecvInto::Lend { len: 3 }).unwrap();
        }
        a.poll(&mut done).unwrap();
        assert!(matches!(
            b.poll(&mut done),
            Err(TransportError::Protocol { peer: 0, .. })
        ));
        let (a, mut b) = pair();
        drop(a);
        // SAFETY: no memory is lent.
        unsafe { b.post_recv(2, RecvInto::Lend { len: 3 }).unwrap() };
        assert!(matches!(
            b.poll(&mut done),
            Err(TransportError::PeerClosed { peer: 0 })
        ));
    }
}
