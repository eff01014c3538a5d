//! [`ShmLink`]: two slot rings between this rank and one local peer — outgoing in the peer's
//! segment, incoming in ours — plus the socket the two met on, kept for control messages and to
//! notice the peer's end.
//!
//! A message travels one of two ways:
//! - **inline**: the sender copies it into a slot; the receiver copies it out, or reduces
//!   straight out of the slot (a lent receive). The sender's send completes at once, so a link
//!   always buffers at least one message, as the transport contract requires.
//! - **by address**, for messages of at least [`REMOTE_MIN`] bytes when the receiver has already
//!   posted the receive (it publishes a count of posted receives): the slot carries the
//!   sender's address and the receiver reads the bytes straight from the sender's memory
//!   (`process_vm_readv`): one copy instead of two. The send completes when the receiver frees
//!   the slot.
//!
//! No system call happens on the way unless a side sleeps (see [`crate::doorbell`]).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use oxccl_transport::{
    Completion, Link, Rank, Readiness, RecvInto, Result, SendBuf, Token, TransportError,
};

use crate::cma::{self, Process};
use crate::doorbell;
use crate::primitive::{AtomicU32, AtomicU64, Ordering};
use crate::ring::{Consumer, Producer, RingHeader};
use crate::segment::Segment;

/// Messages at least this long go by address when the receiver is already waiting for them.
/// Below it, one copy into a cache-resident slot is cheaper than a system call.
pub const REMOTE_MIN: usize = 32 * 1024;

/// Largest control message.
pub const MAX_CONTROL: usize = 4096;

const MAGIC: u64 = u64::from_le_bytes(*b"OXSHMRG1");
const KIND_INLINE: u64 = 1;
const KIND_REMOTE: u64 = 2;
const SLOT_HEADER: usize = 64;

/// The shared head of a ring segment. All-zero bytes are a valid empty ring. Every field is an
/// atomic, so a reference to the header never covers plain memory the peer may write.
#[repr(C)]
struct SegmentHeader {
    magic: AtomicU64,
    slots: AtomicU32,
    slot_bytes: AtomicU32,
    /// The consumer announces it sleeps.
    consumer_sleeping: CachePadded<AtomicU32>,
    /// The producer announces it sleeps (waiting for room or for the consumer to finish).
    producer_sleeping: CachePadded<AtomicU32>,
    ring: RingHeader,
}

/// A slot's description of its message.
#[repr(C)]
#[derive(Clone, Copy)]
struct SlotHeader {
    len: u64,
    kind: u64,
    /// For by-address messages: where the bytes are in the sender.
    addr: u64,
}

fn slots_offset() -> usize {
    size_of::<SegmentHeader>().next_multiple_of(128)
}

fn slot_stride(slot_bytes: usize) -> usize {
    SLOT_HEADER + slot_bytes.next_multiple_of(64)
}

/// A ring segment, mapped.
#[derive(Debug)]
pub struct RingMem {
    seg: Segment,
    slots: u64,
    slot_bytes: usize,
}

impl RingMem {
    /// A new ring of `slots` slots of `slot_bytes` each.
    pub fn create(slots: usize, slot_bytes: usize) -> io::Result<RingMem> {
        let len = slots_offset() + slots * slot_stride(slot_bytes);
        let seg = Segment::create("oxccl-shm-ring", len)?;
        // SAFETY: a fresh zeroed mapping large enough for the header (all-zero atomics are
        // valid); nobody else has it yet.
        let h = unsafe { &*seg.as_ptr().cast::<SegmentHeader>() };
        h.magic.store(MAGIC, Ordering::Relaxed);
        h.slots.store(slots as u32, Ordering::Relaxed);
        h.slot_bytes.store(slot_bytes as u32, Ordering::Relaxed);
        Ok(RingMem {
            seg,
            slots: slots as u64,
            slot_bytes,
        })
    }

    /// A ring a peer created, checked before use: a wrong magic or sizes beyond the mapping
    /// are refused, never trusted.
    pub fn open(fd: OwnedFd) -> io::Result<RingMem> {
        let seg = Segment::map(fd)?;
        if seg.len() < slots_offset() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "ring segment too small",
            ));
        }
        // SAFETY: the mapping holds at least a header (checked), whose fields are atomics (any
        // bytes are valid); the creator may still write it, so each field is loaded once and
        // only the copies are checked and used.
        let h = unsafe { &*seg.as_ptr().cast::<SegmentHeader>() };
        let (magic, slots, slot_bytes) = (
            h.magic.load(Ordering::Relaxed),
            h.slots.load(Ordering::Relaxed) as usize,
            h.slot_bytes.load(Ordering::Relaxed) as usize,
        );
        let need = slots
            .checked_mul(slot_stride(slot_bytes))
            .and_then(|b| b.checked_add(slots_offset()));
        if magic != MAGIC || slots == 0 || need.is_none_or(|n| n > seg.len()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an oxccl ring segment",
            ));
        }
        Ok(RingMem {
            seg,
            slots: slots as u64,
            slot_bytes,
        })
    }

    fn header(&self) -> &SegmentHeader {
        // SAFETY: the mapping holds a header (checked at creation/opening) and lives as long as
        // `self`; its shared fields are atomics.
        unsafe { &*self.seg.as_ptr().cast::<SegmentHeader>() }
    }

    fn ring(&self) -> &RingHeader {
        &self.header().ring
    }

    fn slot(&self, i: u64) -> *mut u8 {
        debug_assert!(i < self.slots);
        // SAFETY: i < slots and the mapping covers every slot (checked).
        unsafe {
            self.seg
                .as_ptr()
                .add(slots_offset() + i as usize * slot_stride(self.slot_bytes))
        }
    }

    fn slot_header(&self, i: u64) -> *mut SlotHeader {
        self.slot(i).cast()
    }

    fn payload(&self, i: u64) -> *mut u8 {
        // SAFETY: the payload follows the header inside the slot.
        unsafe { self.slot(i).add(SLOT_HEADER) }
    }

    /// The descriptor to hand to the peer.
    pub fn fd(&self) -> impl AsFd + '_ {
        self.seg.fd()
    }

    /// Payload bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }
}

/// One end of a shared-memory link.
#[derive(Debug)]
pub struct ShmLink {
    peer: Rank,
    max_message: usize,
    inbound: RingMem,
    outbound: RingMem,
    producer: Producer,
    consumer: Consumer,
    /// The peer's process, held by a pidfd and proven to be the peer, when this side may read
    /// its memory (it sends by address only then).
    peer_process: Option<Arc<Process>>,
    peer_bell: OwnedFd,
    bell: Arc<OwnedFd>,
    sock: UnixStream,
    /// Whether the peer can read this process's memory (by-address sends allowed).
    peer_reads_us: bool,
    /// Posted sends not yet in a slot.
    sends: VecDeque<(Token, SendBuf)>,
    /// By-address sends waiting for the peer to finish reading: (token, ring sequence).
    reading: VecDeque<(Token, u64)>,
    recvs: VecDeque<(Token, RecvInto)>,
    lent: Option<Token>,
    /// After `cancel`: incoming data is dropped.
    discard: bool,
    /// The peer's end of the socket is closed.
    closed: bool,
    broken: Option<String>,
    control_out: Vec<u8>,
    control_in: Vec<u8>,
    polls: u32,
    check_socket: bool,
}

impl ShmLink {
    /// Wraps the rings and socket of a connection to `peer`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        peer: Rank,
        max_message: usize,
        inbound: RingMem,
        outbound: RingMem,
        peer_process: Option<Arc<Process>>,
        peer_bell: OwnedFd,
        bell: Arc<OwnedFd>,
        sock: UnixStream,
        peer_reads_us: bool,
    ) -> Result<ShmLink> {
        sock.set_nonblocking(true)
            .map_err(|e| TransportError::io("shm: non-blocking socket", e))?;
        let (ps, cs) = (outbound.slots, inbound.slots);
        Ok(ShmLink {
            peer,
            max_message,
            inbound,
            outbound,
            producer: Producer::new(ps),
            consumer: Consumer::new(cs),
            peer_process,
            peer_bell,
            bell,
            sock,
            peer_reads_us,
            sends: VecDeque::new(),
            reading: VecDeque::new(),
            recvs: VecDeque::new(),
            lent: None,
            discard: false,
            closed: false,
            broken: None,
            control_out: Vec::new(),
            control_in: Vec::new(),
            polls: 0,
            check_socket: true,
        })
    }

    fn ring_peer(&self) {
        let _ = rustix::io::write(&self.peer_bell, &1u64.to_ne_bytes());
    }

    fn protocol(&mut self, what: String) -> TransportError {
        self.broken = Some(what.clone());
        TransportError::Protocol {
            peer: self.peer,
            what,
        }
    }

    /// Puts queued sends into free slots.
    fn publish(&mut self, out: &mut Vec<Completion>) {
        let mut published = false;
        while let Some(&(token, buf)) = self.sends.front() {
            let ring = self.outbound.ring();
            let Some(i) = self.producer.reserve(ring) else {
                break;
            };
            let seq = self.producer.published();
            let remote = self.peer_reads_us
                && buf.len() >= REMOTE_MIN
                && self.producer.receiver_waiting_for(ring, seq);
            let h = self.outbound.slot_header(i);
            // SAFETY: the ring protocol gives the producer slot i until it is published; the
            // payload fits (len <= max_message <= slot_bytes, checked at setup and post).
            unsafe {
                (*h).len = buf.len() as u64;
                (*h).kind = if remote { KIND_REMOTE } else { KIND_INLINE };
                (*h).addr = buf.ptr() as u64;
                if !remote {
                    std::ptr::copy_nonoverlapping(buf.ptr(), self.outbound.payload(i), buf.len());
                }
            }
            self.producer.publish(self.outbound.ring());
            published = true;
            self.sends.pop_front();
            if remote {
                self.reading.push_back((token, seq));
            } else {
                out.push(Completion::Sent(token));
            }
        }
        if published && doorbell::should_ring(&self.outbound.header().consumer_sleeping) {
            self.ring_peer();
        }
        if !self.reading.is_empty() {
            let done = self.producer.consumed(self.outbound.ring());
            while self.reading.front().is_some_and(|&(_, seq)| seq < done) {
                let (token, _) = self.reading.pop_front().expect("checked");
                out.push(Completion::Sent(token));
            }
        }
    }

    /// Whether the peer process is gone (its pidfd, or the end of its socket, says so).
    fn peer_exited(&mut self) -> bool {
        self.peer_process.as_ref().is_some_and(|p| p.exited()) || self.peer_gone()
    }

    /// Frees the oldest incoming slot and wakes the peer if it waits for room.
    fn free_slot(&mut self) {
        self.consumer.release(self.inbound.ring());
        if doorbell::should_ring(&self.inbound.header().producer_sleeping) {
            self.ring_peer();
        }
    }

    /// Completes posted receives with published messages.
    fn receive(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        if self.discard {
            while self.consumer.peek(self.inbound.ring()).is_some() {
                self.free_slot();
            }
            return Ok(());
        }
        while self.lent.is_none() {
            let Some(&(token, into)) = self.recvs.front() else {
                break;
            };
            let Some(i) = self.consumer.peek(self.inbound.ring()) else {
                break;
            };
            // SAFETY: the ring protocol gives the consumer slot i (published, not released);
            // the sender can still write it, so the header is copied once and only the copy
            // is checked and used.
            let SlotHeader { len, kind, addr } =
                unsafe { oxccl_transport::shared::read(self.inbound.slot_header(i)) };
            let (len, addr) = (len as usize, addr as usize);
            if len != into.len() || len > self.inbound.slot_bytes {
                return Err(self.protocol(format!(
                    "message of {len} bytes where the posted receive expects {}",
                    into.len()
                )));
            }
            let payload = self.inbound.payload(i);
            match (kind, into) {
                (KIND_INLINE, RecvInto::Memory(buf)) => {
                    // SAFETY: the slot holds `len` published bytes (copied as memory the sender
                    // may write); the receive's memory is the caller's until it completes
                    // (post_recv's contract).
                    unsafe { oxccl_transport::shared::copy(buf.ptr(), payload, len) };
                    self.free_slot();
                    out.push(Completion::Received(token));
                }
                (KIND_INLINE, RecvInto::Lend { .. }) => {
                    out.push(Completion::Lent {
                        token,
                        ptr: payload,
                        len,
                    });
                    self.lent = Some(token);
                }
                (KIND_REMOTE, into) => {
                    let dst = match into {
                        RecvInto::Memory(buf) => buf.ptr(),
                        RecvInto::Lend { .. } => payload,
                    };
                    let Some(process) = &self.peer_process else {
                        return Err(self.protocol(
                            "message by address, but its memory is not readable from here".into(),
                        ));
                    };
                    if !self.consumer.begin_read(self.inbound.ring()) {
                        // The sender withdrew it (it failed and gave its memory back).
                        self.free_slot();
                        return Err(self.protocol(format!(
                            "rank {} withdrew a message it had handed over by address",
                            self.peer
                        )));
                    }
                    // SAFETY: `dst` is the receive's memory or this slot's payload (room for
                    // `len`, checked); the sender keeps its range valid until we free the slot
                    // or it withdraws the message, which it does not while we read (above).
                    let read = unsafe { process.read(addr, dst, len) };
                    self.consumer.end_read(self.inbound.ring());
                    if let Err(e) = read {
                        if cma::is_exit(&e) {
                            self.closed = true;
                            return Err(TransportError::PeerClosed { peer: self.peer });
                        }
                        return Err(self.protocol(format!(
                            "reading {len} bytes from rank {}: {e}",
                            self.peer
                        )));
                    }
                    if matches!(into, RecvInto::Memory(_)) {
                        self.free_slot();
                        out.push(Completion::Received(token));
                    } else {
                        out.push(Completion::Lent {
                            token,
                            ptr: payload,
                            len,
                        });
                        self.lent = Some(token);
                    }
                }
                (kind, _) => return Err(self.protocol(format!("slot of unknown kind {kind}"))),
            }
            self.recvs.pop_front();
        }
        Ok(())
    }

    /// Writes pending control bytes and reads control messages or the socket's end.
    fn socket(&mut self, out: &mut Vec<Completion>) {
        if !self.control_out.is_empty() {
            match self.sock.write(&self.control_out) {
                Ok(n) => {
                    self.control_out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => self.closed = true,
            }
        }
        if self.closed {
            return;
        }
        let mut buf = [0u8; 4096];
        loop {
            match self.sock.read(&mut buf) {
                Ok(0) => {
                    self.closed = true;
                    break;
                }
                Ok(n) => self.control_in.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.closed = true;
                    break;
                }
            }
        }
        while self.control_in.len() >= 4 {
            let len =
                u32::from_le_bytes(self.control_in[..4].try_into().expect("4 bytes")) as usize;
            if len > MAX_CONTROL {
                self.broken = Some(format!("control message of {len} bytes"));
                self.control_in.clear();
                break;
            }
            if self.control_in.len() < 4 + len {
                break;
            }
            out.push(Completion::Control(self.control_in[4..4 + len].to_vec()));
            self.control_in.drain(..4 + len);
        }
    }

    /// Whether a posted operation can no longer complete now that the peer is gone.
    fn starved(&mut self) -> bool {
        !self.sends.is_empty()
            || !self.reading.is_empty()
            || (!self.recvs.is_empty() && !self.consumer.has_unread(self.inbound.ring()))
    }
}

impl Link for ShmLink {
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
        if into.len() > self.max_message {
            return Err(TransportError::Protocol {
                peer: self.peer,
                what: format!(
                    "receive of {} bytes exceeds {}",
                    into.len(),
                    self.max_message
                ),
            });
        }
        self.recvs.push_back((token, into));
        self.consumer.post(self.inbound.ring());
        Ok(())
    }

    fn post_control(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_CONTROL {
            return Err(TransportError::Protocol {
                peer: self.peer,
                what: "control message too long".into(),
            });
        }
        if self.closed {
            return Err(TransportError::PeerClosed { peer: self.peer });
        }
        self.control_out.extend((bytes.len() as u32).to_le_bytes());
        self.control_out.extend_from_slice(bytes);
        Ok(())
    }

    fn control_pending(&self) -> bool {
        !self.closed && !self.control_out.is_empty()
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        if let Some(what) = &self.broken {
            let what = what.clone();
            // What the peer sent broke the protocol; the socket still carries notices this
            // side posts since (why its call failed), which the peer waits for otherwise.
            if !self.control_out.is_empty() {
                let mut ignored = Vec::new();
                self.socket(&mut ignored);
            }
            return Err(TransportError::Protocol {
                peer: self.peer,
                what,
            });
        }
        self.publish(out);
        self.receive(out)?;
        // The socket costs a system call: look at it now and then, or when work is posted but
        // nothing came for a while (then the executor is about to block on it anyway).
        self.polls = self.polls.wrapping_add(1);
        if self.check_socket || !self.control_out.is_empty() || self.polls.is_multiple_of(256) {
            self.check_socket = false;
            self.socket(out);
        }
        if self.closed && self.starved() {
            return Err(TransportError::PeerClosed { peer: self.peer });
        }
        Ok(())
    }

    fn release(&mut self, token: Token) {
        if self.lent == Some(token) {
            self.lent = None;
            self.free_slot();
        }
    }

    fn readiness(&self, out: &mut Vec<Readiness>) -> bool {
        out.push(Readiness {
            fd: self.bell.as_raw_fd(),
            read: true,
            write: false,
        });
        out.push(Readiness {
            fd: self.sock.as_raw_fd(),
            read: true,
            write: !self.control_out.is_empty(),
        });
        true
    }

    fn arm(&mut self) -> bool {
        doorbell::arm(&self.inbound.header().consumer_sleeping);
        let waiting_to_send = !self.sends.is_empty() || !self.reading.is_empty();
        if waiting_to_send {
            doorbell::arm(&self.outbound.header().producer_sleeping);
        }
        // Work that arrived before the announcement must not be slept through.
        let can_receive = !self.recvs.is_empty() && self.consumer.has_unread(self.inbound.ring());
        let can_send = waiting_to_send && {
            let ring = self.outbound.ring();
            (!self.sends.is_empty() && self.producer.reserve(ring).is_some())
                || self
                    .reading
                    .front()
                    .is_some_and(|&(_, seq)| seq < self.producer.consumed(ring))
        };
        !(can_receive || can_send)
    }

    fn disarm(&mut self) {
        doorbell::disarm(&self.inbound.header().consumer_sleeping);
        doorbell::disarm(&self.outbound.header().producer_sleeping);
        let mut drain = [0u8; 8];
        let _ = rustix::io::read(&*self.bell, &mut drain);
        // The wake-up may have been the socket: look at it on the next poll.
        self.check_socket = true;
    }

    fn peer_gone(&mut self) -> bool {
        if !self.closed {
            let mut probe = [0u8; 1];
            let peeked = rustix::net::recv(
                &self.sock,
                &mut probe,
                rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
            );
            if matches!(peeked, Ok((0, _)))
                || matches!(peeked, Err(e) if e != rustix::io::Errno::AGAIN)
            {
                self.closed = true;
            }
        }
        self.closed
    }

    fn peek(&mut self, buf: &mut [u8]) -> usize {
        // A lent message holds the oldest slot; what follows is not looked at.
        if self.discard || self.lent.is_some() {
            return 0;
        }
        let Some(i) = self.consumer.peek(self.inbound.ring()) else {
            return 0;
        };
        // SAFETY: as in `receive`: slot i is the consumer's (published, not released); its
        // header is copied once, and the payload read as memory the sender may write.
        let SlotHeader { len, kind, .. } =
            unsafe { oxccl_transport::shared::read(self.inbound.slot_header(i)) };
        if kind != KIND_INLINE {
            return 0;
        }
        let n = (len as usize).min(self.inbound.slot_bytes).min(buf.len());
        // SAFETY: the slot's payload holds `slot_bytes >= n` bytes; `buf` holds `n`.
        unsafe { oxccl_transport::shared::copy(buf.as_mut_ptr(), self.inbound.payload(i), n) };
        n
    }

    fn has_incoming(&mut self) -> bool {
        self.consumer.has_unread(self.inbound.ring())
    }

    fn cancel(&mut self) {
        self.sends.clear();
        // By-address sends already published: withdraw them, and wait out a read the peer has
        // already begun (one system call), so that after this call the peer never reads their
        // memory. A peer that exited reads nothing; one frozen in mid-read holds this call.
        if !self.reading.is_empty() {
            self.reading.clear();
            if self.producer.revoke(self.outbound.ring()) {
                let start = std::time::Instant::now();
                let mut warned = start;
                while self.producer.read_in_progress(self.outbound.ring()) {
                    if self.peer_exited() {
                        break;
                    }
                    if warned.elapsed() >= std::time::Duration::from_secs(10) {
                        warned = std::time::Instant::now();
                        tracing::error!(
                            peer = self.peer,
                            "rank {} is still reading a withdrawn message after {:?}",
                            self.peer,
                            start.elapsed()
                        );
                    }
                    std::thread::yield_now();
                }
            }
        }
        self.recvs.clear();
        if self.lent.take().is_some() {
            self.free_slot();
        }
        self.discard = true;
    }

    fn close(&mut self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}
