//! [`RdmaLink`]: one reliable-connected queue pair to a peer, plus the authenticated TCP
//! connection the two sides met over, which stays as the control channel and as the fastest
//! sign that the peer's process is gone.
//!
//! The data path: each side owns a receive ring (registered for the peer's RDMA WRITEs) and a
//! send staging area of the same size, cut into slots ([`Geometry`]). A send is copied into
//! the staging area at the place it will take in the peer's ring and written there with one
//! RDMA WRITE WITH IMM whose immediate is the length. Both sides place messages by the same
//! rule ([`place`]: a whole number of slots, at least one, contiguous, wrapping to the start
//! when the end has no room), so the receiver knows where a message starts from its length
//! alone, and the ring never holds more messages than it has slots — which bounds the receive
//! queue and the receiver's bookkeeping whatever the sizes. A receive posted as
//! [`RecvInto::Lend`] is lent straight out of the ring (no copy; slot-aligned); one into memory
//! is copied out once. The receiver frees the ring in order and returns space as its new tail,
//! in a zero-length WRITE WITH IMM with the top bit set, at most one in flight. Every work
//! request is signalled, and a send completes only when its write's completion says the peer's
//! device has the bytes, so a rank that saw all its sends complete may exit without losing data.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use oxccl_transport::{
    Completion, Link, Rank, Readiness, RecvInto, Result, SendBuf, Token, TransportError,
};
use oxccl_transport_tcp::TcpLink;

use crate::sys::{self, IbvRecvWr, IbvSendWr, IbvSge, IbvWc};
use crate::verbs::{Depths, Queue, Region, Remote, UserRegion};

/// A ring's layout for messages of up to `max_message` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// The placement unit in bytes: a power of two of at least 64, about 1/128 of the largest
    /// message (a power of two, so that it divides the page-rounded ring).
    pub slot: u64,
    /// The ring's length: three largest messages, a whole number of pages — so that while one
    /// is lent, wherever it lies, another always fits behind it (wrapping can waste up to a
    /// message's worth at the end).
    pub cap: u64,
}

impl Geometry {
    pub(crate) fn new(max_message: usize) -> Geometry {
        let slot = (max_message as u64)
            .div_ceil(128)
            .next_power_of_two()
            .max(64);
        // Both powers of two: the larger is a multiple of the other.
        let page = rustix::param::page_size() as u64;
        let size = (max_message as u64).next_multiple_of(slot).max(slot);
        let cap = (3 * size).next_multiple_of(page.max(slot));
        Geometry { slot, cap }
    }

    /// The most messages the ring can hold.
    pub(crate) fn messages(&self) -> u64 {
        self.cap / self.slot
    }

    /// Queue depths: the receive queue takes one entry per incoming write, and between two
    /// polls the peer can land at most a ringful of messages and one credit for each of this
    /// side's messages (a ringful of the peer's); the send queue holds that many writes and
    /// the credit.
    pub(crate) fn depths(&self) -> Depths {
        let m = self.messages() as u32;
        Depths {
            send: m + 8,
            recv: 2 * m + 8,
        }
    }
}

/// The immediate's top bit marks a credit; the rest is the receiver's tail in slots, modulo
/// 2^31.
pub(crate) const CREDIT: u32 = 1 << 31;
const TAIL_MASK: u32 = CREDIT - 1;
/// How long after the side connection closed a posted operation may still complete from
/// completions already on their way before the link reports the peer gone.
const CLOSE_GRACE: Duration = Duration::from_millis(100);
/// How long `cancel` and `deregister` wait for writes from a caller's memory to complete
/// before moving the queue pair to the error state (which flushes them), and then again for
/// the flush.
const QUIESCE: Duration = Duration::from_secs(2);
/// A busy link reads its side connection once every this many polls.
const SIDE_EVERY: u32 = 16;
const WR_DATA: u64 = 1;
const WR_CREDIT: u64 = 2;
/// The bring-up probe: a zero-length credit that moves nothing (a tail of 0 at the start),
/// which the peer's link takes as a no-op.
pub(crate) const WR_PROBE: u64 = 3;

/// Where a message of `len` bytes starts and ends when the ring's writer is at `head` (a
/// multiple of `slot`): it takes whole slots, at least one, right there, or from the start of
/// the next lap if it would not fit before the end.
pub(crate) fn place(head: u64, len: usize, slot: u64, cap: u64) -> (u64, u64) {
    let size = (len as u64).next_multiple_of(slot).max(slot);
    let off = head % cap;
    let start = if size > cap - off {
        head + (cap - off)
    } else {
        head
    };
    (start, start + size)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Lent,
    Done,
}

#[derive(Debug)]
struct Arrived {
    start: u64,
    end: u64,
    len: usize,
    state: State,
}

/// A posted write, in posting order (one queue pair completes its sends in order).
#[derive(Debug)]
enum Posted {
    /// A data write and the token of its send (`None` once cancelled); `direct` when the
    /// device reads it from the caller's registered memory rather than the staging area.
    Data {
        token: Option<Token>,
        direct: bool,
    },
    Credit,
}

/// Why a link stopped working.
#[derive(Clone, Debug)]
enum Broken {
    Closed,
    Protocol(String),
    Io(String),
}

/// One end of an RDMA connection to a peer, with the guarantees of `oxccl-transport`'s crate
/// docs.
pub struct RdmaLink {
    peer: Rank,
    max_message: usize,
    side: TcpLink,
    // Dropped in this order: the queue pair goes before the memory it used.
    queue: Queue,
    ring: Region,
    staging: Region,
    remote: Remote,
    /// This side's ring layout; the peer's is in `remote`.
    geometry: Geometry,
    depths: Depths,
    // Sending.
    pending: VecDeque<(Token, SendBuf)>,
    head: u64,
    /// How far the peer has freed its ring.
    peer_tail: u64,
    posted: VecDeque<Posted>,
    // Receiving.
    recvs: VecDeque<(Token, RecvInto)>,
    rhead: u64,
    tail: u64,
    tail_sent: u64,
    arrived: VecDeque<Arrived>,
    /// Sequence number of `arrived[0]`.
    base: u64,
    /// Sequence number of the next message to match with a posted receive.
    next: u64,
    credit_inflight: bool,
    lent: Option<(Token, u64)>,
    rq_posted: u32,
    discard: bool,
    stash: Vec<IbvWc>,
    controls: Vec<Vec<u8>>,
    /// Callers' memory registered for sends without a copy, by registration id.
    user: Vec<(u64, UserRegion)>,
    /// Registrations deregistered while writes from them could not be flushed ([`quiesce`]
    /// gave up): kept (pinned) for as long as the link lives, which the queue pair does not
    /// outlive.
    ///
    /// [`quiesce`]: RdmaLink::quiesce
    pinned: Vec<UserRegion>,
    /// A send's write failed (its completion carried an error): the send never completes, so
    /// something still needs the peer.
    lost_send: bool,
    /// Sends written straight from a caller's registered memory so far.
    direct_sends: u64,
    closed_since: Option<Instant>,
    /// A completion event was requested (`arm`) and has not been taken from the channel yet:
    /// only then can the channel hold one, so only then does `poll` read it.
    notify_pending: bool,
    /// Polls left before the side connection is read again (0: at the next poll).
    side_in: u32,
    /// The queue pair failed (a completion with an error): nothing more arrives or leaves;
    /// what already arrived is still delivered.
    qp_dead: Option<String>,
    broken: Option<Broken>,
}

impl RdmaLink {
    /// How many sends went straight from a caller's registered memory ([`Link::register`])
    /// rather than through the staging area.
    pub fn direct_sends(&self) -> u64 {
        self.direct_sends
    }

    /// Moves this side's queue pair to the error state and nothing else, as a fabric failure
    /// does (the side connection stays): for tests.
    #[doc(hidden)]
    pub fn fail_queue_pair(&mut self) {
        self.queue.fail();
    }
}

impl std::fmt::Debug for RdmaLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaLink")
            .field("peer", &self.peer)
            .field("device", &self.queue.dev)
            .field("qpn", &self.queue.qpn)
            .field("pending", &self.pending.len())
            .field("head", &self.head)
            .field("peer_tail", &self.peer_tail)
            .field("tail", &self.tail)
            .field("posted", &self.posted.len())
            .field("recvs", &self.recvs.len())
            .field("arrived", &self.arrived.len())
            .field("rq_posted", &self.rq_posted)
            .field("side_closed", &self.side.peer_closed())
            .field("control_pending", &self.side.control_pending())
            .field("side", &self.side.stats())
            .field("qp_dead", &self.qp_dead)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl RdmaLink {
    /// A link over a connected queue pair (receives already posted: `rq_posted`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        peer: Rank,
        max_message: usize,
        side: TcpLink,
        queue: Queue,
        ring: Region,
        staging: Region,
        remote: Remote,
        rq_posted: u32,
        controls: Vec<Vec<u8>>,
        stash: Vec<IbvWc>,
        geometry: Geometry,
    ) -> RdmaLink {
        RdmaLink {
            peer,
            max_message,
            side,
            queue,
            ring,
            staging,
            remote,
            geometry,
            depths: geometry.depths(),
            pending: VecDeque::new(),
            head: 0,
            peer_tail: 0,
            posted: VecDeque::new(),
            recvs: VecDeque::new(),
            rhead: 0,
            tail: 0,
            tail_sent: 0,
            arrived: VecDeque::new(),
            base: 0,
            next: 0,
            credit_inflight: false,
            lent: None,
            rq_posted,
            discard: false,
            stash,
            controls,
            user: Vec::new(),
            pinned: Vec::new(),
            lost_send: false,
            direct_sends: 0,
            closed_since: None,
            notify_pending: false,
            side_in: 0,
            qp_dead: None,
            broken: None,
        }
    }

    /// Posts receive work requests (no memory: WRITE WITH IMM only needs the entry) until
    /// `rq_posted` is `depth`.
    pub(crate) fn fill_receives(
        queue: &Queue,
        rq_posted: &mut u32,
        depth: u32,
    ) -> Result<(), String> {
        let want = depth.saturating_sub(*rq_posted);
        if want == 0 {
            return Ok(());
        }
        let mut wrs: Vec<IbvRecvWr> = (0..want)
            .map(|_| IbvRecvWr {
                wr_id: 0,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            })
            .collect();
        for i in 1..wrs.len() {
            let next: *mut IbvRecvWr = &mut wrs[i];
            wrs[i - 1].next = next;
        }
        // SAFETY: the chain lives in `wrs` for the call; the QP is live.
        let rc = unsafe { queue.dev.v.post_recv(queue.qp, wrs.as_mut_ptr()) };
        if rc != 0 {
            return Err(format!(
                "post {want} receives: {}",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        *rq_posted = depth;
        Ok(())
    }

    /// Posts the bring-up probe: a zero-length write with the immediate of a credit for no
    /// message, signalled with [`WR_PROBE`].
    pub(crate) fn post_probe(queue: &Queue, remote: &Remote) -> Result<(), String> {
        let mut wr = IbvSendWr {
            wr_id: WR_PROBE,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: sys::IBV_WR_RDMA_WRITE_WITH_IMM,
            send_flags: sys::IBV_SEND_SIGNALED,
            imm_data: CREDIT.to_be(),
            remote_addr: remote.ring_addr,
            rkey: remote.ring_rkey,
            _rest: [0; 76],
        };
        // SAFETY: the work request lives for the call and names no memory; the QP is live.
        let rc = unsafe { queue.dev.v.post_send(queue.qp, &mut wr) };
        if rc != 0 {
            return Err(format!(
                "post the probe write: {}",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(())
    }

    fn error(&self, b: &Broken) -> TransportError {
        match b {
            Broken::Closed => TransportError::PeerClosed { peer: self.peer },
            Broken::Protocol(what) => TransportError::Protocol {
                peer: self.peer,
                what: what.clone(),
            },
            Broken::Io(what) => TransportError::io(
                format!("rdma: link to rank {} ({:?})", self.peer, self.queue.dev),
                std::io::Error::other(what.clone()),
            ),
        }
    }

    fn too_long(&self, what: &str, len: usize, limit: usize) -> TransportError {
        TransportError::Protocol {
            peer: self.peer,
            what: format!("{what} of {len} bytes exceeds the limit of {limit}"),
        }
    }

    fn recv_cap(&self) -> u64 {
        self.geometry.cap
    }

    /// Takes what the completion queue holds into `stash`; the number taken.
    fn take_completions(&mut self) -> usize {
        let mut got = 0;
        loop {
            let mut wc = [IbvWc::default(); 32];
            // SAFETY: the CQ is live and `wc` has room for 32 entries.
            let n = unsafe { self.queue.dev.v.poll_cq(self.queue.cq, 32, wc.as_mut_ptr()) };
            if n < 0 {
                self.broken
                    .get_or_insert(Broken::Io("poll the completion queue".into()));
                return got;
            }
            let n = n as usize;
            self.stash.extend_from_slice(&wc[..n]);
            got += n;
            if n < 32 {
                return got;
            }
        }
    }

    fn handle(&mut self, wc: IbvWc, out: &mut Vec<Completion>) -> Result<(), Broken> {
        if wc.status != sys::IBV_WC_SUCCESS {
            // The first error says why; the rest are the queue's work flushed after it. Posted
            // work whose completion never comes keeps `waiting_on_peer` true, so the link
            // fails only if something still needs the peer.
            if self.qp_dead.is_none() {
                self.qp_dead = Some(format!(
                    "{} (status {}, vendor error {:#x})",
                    sys::wc_status_name(wc.status),
                    wc.status,
                    wc.vendor_err
                ));
            }
            // A write's completion (its id says so; an error's opcode is undefined), in
            // posting order like every completion of the send queue: its entry goes, so that
            // `posted` holds only writes whose completion is still to come (`quiesce` counts
            // on that).
            if wc.wr_id == WR_DATA || wc.wr_id == WR_CREDIT {
                match self.posted.pop_front() {
                    Some(Posted::Data { token: Some(_), .. }) => self.lost_send = true,
                    Some(Posted::Credit) => self.credit_inflight = false,
                    _ => {}
                }
            } else {
                self.rq_posted = self.rq_posted.saturating_sub(1);
            }
            return Ok(());
        }
        match wc.opcode {
            sys::IBV_WC_RECV_RDMA_WITH_IMM => {
                self.rq_posted = self.rq_posted.saturating_sub(1);
                if wc.wc_flags & sys::IBV_WC_WITH_IMM == 0 {
                    return Err(Broken::Protocol(
                        "a write arrived without its immediate".into(),
                    ));
                }
                let imm = u32::from_be(wc.imm_data);
                if imm & CREDIT != 0 {
                    self.credit(imm & TAIL_MASK)
                } else {
                    self.arrive(imm as usize, wc.byte_len as usize)
                }
            }
            sys::IBV_WC_RDMA_WRITE => match (self.posted.pop_front(), wc.wr_id) {
                (Some(Posted::Data { token, .. }), WR_DATA) => {
                    if let Some(t) = token {
                        out.push(Completion::Sent(t));
                    }
                    Ok(())
                }
                (Some(Posted::Credit), WR_CREDIT) => {
                    self.credit_inflight = false;
                    Ok(())
                }
                (p, id) => Err(Broken::Io(format!(
                    "write completion {id} out of order (expected {p:?})"
                ))),
            },
            op => Err(Broken::Io(format!(
                "unexpected work completion opcode {op}"
            ))),
        }
    }

    /// The peer freed its ring up to `tail` slots (modulo 2^31).
    fn credit(&mut self, tail: u32) -> Result<(), Broken> {
        let slot = self.remote.slot as u64;
        let moved = u64::from(tail.wrapping_sub((self.peer_tail / slot) as u32) & TAIL_MASK);
        let new = self.peer_tail + moved * slot;
        if new > self.head {
            return Err(Broken::Protocol(format!(
                "returned ring space up to {new}, past the {} bytes written",
                self.head
            )));
        }
        self.peer_tail = new;
        Ok(())
    }

    fn arrive(&mut self, len: usize, byte_len: usize) -> Result<(), Broken> {
        if len > self.max_message || byte_len != len {
            return Err(Broken::Protocol(format!(
                "a message of {len} bytes ({byte_len} written) exceeds the limit of {} or disagrees with its write",
                self.max_message
            )));
        }
        let (start, end) = place(self.rhead, len, self.geometry.slot, self.geometry.cap);
        if end - self.tail > self.geometry.cap {
            return Err(Broken::Protocol(format!(
                "wrote past the ring space it was given ({} messages held)",
                self.arrived.len()
            )));
        }
        self.rhead = end;
        let state = if self.discard {
            State::Done
        } else {
            State::Waiting
        };
        self.arrived.push_back(Arrived {
            start,
            end,
            len,
            state,
        });
        Ok(())
    }

    /// Matches arrived messages with posted receives, in order.
    fn match_receives(&mut self, out: &mut Vec<Completion>) -> Result<(), Broken> {
        while let Some(&(token, into)) = self.recvs.front() {
            let i = (self.next - self.base) as usize;
            let Some(m) = self.arrived.get(i) else {
                break;
            };
            if m.len != into.len() {
                return Err(Broken::Protocol(format!(
                    "sent a message of {} bytes where a receive of {} was posted",
                    m.len,
                    into.len()
                )));
            }
            let cap = self.recv_cap();
            // SAFETY: `start % cap + len <= cap` by the placement rule; the ring is ours.
            let src = unsafe { self.ring.ptr().add((m.start % cap) as usize) };
            match into {
                RecvInto::Memory(buf) => {
                    // SAFETY: the caller vouched for `buf` (post_recv); the ring memory is
                    // written by the peer's device, so it is read as shared memory.
                    unsafe { oxccl_transport::shared::copy(buf.ptr(), src, m.len) };
                    self.arrived[i].state = State::Done;
                    out.push(Completion::Received(token));
                }
                RecvInto::Lend { len } => {
                    if self.lent.is_some() {
                        break;
                    }
                    self.arrived[i].state = State::Lent;
                    self.lent = Some((token, self.next));
                    out.push(Completion::Lent {
                        token,
                        ptr: src,
                        len,
                    });
                }
            }
            self.recvs.pop_front();
            self.next += 1;
        }
        Ok(())
    }

    /// Frees the ring up to the first message still in use, and returns the space to the
    /// peer when no credit is on its way.
    fn return_space(&mut self) -> Result<(), Broken> {
        while self.arrived.front().is_some_and(|m| m.state == State::Done) {
            let m = self.arrived.pop_front().unwrap();
            self.tail = m.end;
            self.base += 1;
        }
        self.next = self.next.max(self.base);
        if self.credit_inflight || self.tail == self.tail_sent || self.qp_dead.is_some() {
            return Ok(());
        }
        let tail = (self.tail / self.geometry.slot) as u32 & TAIL_MASK;
        self.post_write(WR_CREDIT, (0, 0), 0, 0, CREDIT | tail)?;
        self.tail_sent = self.tail;
        self.credit_inflight = true;
        self.posted.push_back(Posted::Credit);
        Ok(())
    }

    /// Writes `len` bytes from `source` (address, local key) to offset `off` of the peer's
    /// ring, with the immediate `imm`.
    fn post_write(
        &mut self,
        wr_id: u64,
        (addr, lkey): (u64, u32),
        off: u64,
        len: usize,
        imm: u32,
    ) -> Result<(), Broken> {
        let mut sge = IbvSge {
            addr,
            length: len as u32,
            lkey,
        };
        let mut wr = IbvSendWr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: (len > 0) as i32,
            opcode: sys::IBV_WR_RDMA_WRITE_WITH_IMM,
            send_flags: sys::IBV_SEND_SIGNALED,
            imm_data: imm.to_be(),
            remote_addr: self.remote.ring_addr + off,
            rkey: self.remote.ring_rkey,
            _rest: [0; 76],
        };
        // SAFETY: the work request and its gather entry live for the call; the source is
        // registered: the staging area stays mapped while the QP lives, a caller's registered
        // memory until the write completes (`post_send`'s contract; `cancel` and `deregister`
        // wait for it).
        let rc = unsafe { self.queue.dev.v.post_send(self.queue.qp, &mut wr) };
        if rc != 0 {
            return Err(Broken::Io(format!(
                "post a write of {len} bytes: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// Copies queued sends into the staging area and writes them while the peer's ring and
    /// the send queue have room.
    fn start_sends(&mut self) -> Result<(), Broken> {
        let (slot, cap) = (self.remote.slot as u64, self.remote.ring_len);
        if self.qp_dead.is_some() {
            return Ok(());
        }
        while let Some(&(token, buf)) = self.pending.front() {
            // One entry stays for the credit.
            if self.posted.len() + 2 > self.depths.send as usize {
                break;
            }
            let len = buf.len();
            let (start, end) = place(self.head, len, slot, cap);
            if end - self.peer_tail > cap {
                break;
            }
            let off = start % cap;
            // From the caller's memory where it is registered (the write then reads it until
            // it completes, and so does the send), else through the staging area.
            let direct = self
                .user
                .iter()
                .find(|(_, r)| len > 0 && r.holds(buf.ptr(), len))
                .map(|(_, r)| r.reg.lkey);
            let source = match direct {
                Some(lkey) => (buf.ptr() as u64, lkey),
                None => {
                    // SAFETY: the caller vouched for `buf` until the send completes; `off +
                    // len <= cap <= staging.len()` (checked at connection); the staging area
                    // is private.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            buf.ptr(),
                            self.staging.ptr().add(off as usize),
                            len,
                        )
                    };
                    (self.staging.ptr() as u64 + off, self.staging.reg.lkey)
                }
            };
            self.post_write(WR_DATA, source, off, len, len as u32)?;
            self.direct_sends += u64::from(direct.is_some());
            self.head = end;
            self.posted.push_back(Posted::Data {
                token: Some(token),
                direct: direct.is_some(),
            });
            self.pending.pop_front();
        }
        Ok(())
    }

    /// Waits until every posted write up to the last one `pick` selects has completed (its
    /// completion taken into the stash, handled by the next poll), at most [`QUIESCE`]; then
    /// the queue pair goes to the error state, which flushes what is left, and the link is
    /// broken. Should even the flush not come, the link is broken and the writes' memory must
    /// stay registered (pinned) for as long as the link lives: false then.
    fn quiesce(&mut self, pick: impl Fn(&Posted) -> bool) -> bool {
        let Some(last) = self.posted.iter().rposition(pick) else {
            return true;
        };
        let mut deadline = Instant::now() + QUIESCE;
        let mut failed = false;
        loop {
            self.take_completions();
            let done = self
                .stash
                .iter()
                .filter(|wc| wc.wr_id == WR_DATA || wc.wr_id == WR_CREDIT)
                .count();
            if done > last {
                return true;
            }
            if Instant::now() >= deadline {
                if failed {
                    self.broken.get_or_insert(Broken::Io(
                        "writes from registered memory were not flushed".into(),
                    ));
                    return false;
                }
                tracing::debug!(
                    peer = self.peer,
                    "rdma: writes did not finish; failing the QP"
                );
                self.queue.fail();
                self.broken.get_or_insert(Broken::Io(
                    "writes from registered memory did not finish".into(),
                ));
                failed = true;
                deadline = Instant::now() + QUIESCE;
            }
            std::thread::yield_now();
        }
    }

    /// Whether something posted can no longer complete if the peer is gone.
    fn waiting_on_peer(&self) -> bool {
        let unmatched = (self.next - self.base) as usize >= self.arrived.len();
        self.lost_send
            || !self.pending.is_empty()
            || self
                .posted
                .iter()
                .any(|p| matches!(p, Posted::Data { token: Some(_), .. }))
            || (!self.recvs.is_empty() && unmatched)
    }

    /// Takes what the side connection has: control messages go to `out`.
    fn poll_side(&mut self, out: &mut Vec<Completion>) -> Result<(), Broken> {
        for c in self.controls.drain(..) {
            out.push(Completion::Control(c));
        }
        let mut side = Vec::new();
        let r = self.side.poll(&mut side);
        for c in side {
            if let Completion::Control(b) = c {
                out.push(Completion::Control(b));
            }
        }
        match r {
            Err(TransportError::PeerClosed { .. }) => Err(Broken::Closed),
            Err(e) => Err(Broken::Io(format!("side connection: {e}"))),
            Ok(()) => Ok(()),
        }
    }

    fn poll_inner(&mut self, out: &mut Vec<Completion>) -> Result<(), Broken> {
        // The side connection first: a failure notice there names the cause better than the
        // queue pair's own error would. It carries only failure notices and the close, so a
        // busy link reads it every SIDE_EVERY polls (each read is a system call), and at the
        // first poll after every `arm`, when its socket may be what woke the engine.
        if self.side_in == 0 {
            self.side_in = SIDE_EVERY;
            self.poll_side(out)?;
        } else {
            self.side_in -= 1;
            for c in self.controls.drain(..) {
                out.push(Completion::Control(c));
            }
        }
        if self.notify_pending && self.queue.drain_events() > 0 {
            self.notify_pending = false;
        }
        self.take_completions();
        // Every completion taken is handled, even after one that breaks the link: the writes'
        // must leave `posted`, or a later `quiesce` would wait for them.
        let mut first = Ok(());
        for wc in std::mem::take(&mut self.stash) {
            if let Err(b) = self.handle(wc, out)
                && first.is_ok()
            {
                first = Err(b);
            }
        }
        first?;
        if let Some(b) = self.broken.take() {
            return Err(b);
        }
        if self.qp_dead.is_none() {
            Self::fill_receives(&self.queue, &mut self.rq_posted, self.depths.recv)
                .map_err(Broken::Io)?;
        }
        self.match_receives(out)?;
        self.return_space()?;
        self.start_sends()?;
        if !self.waiting_on_peer() {
            return Ok(());
        }
        if let Some(why) = &self.qp_dead {
            // Nothing more can arrive or leave over this queue pair.
            return Err(if self.side.peer_closed() {
                Broken::Closed
            } else {
                Broken::Io(format!(
                    "rank {} is unreachable over rdma: {why}",
                    self.peer
                ))
            });
        }
        if self.side.peer_closed() {
            let since = *self.closed_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= CLOSE_GRACE {
                return Err(Broken::Closed);
            }
        }
        Ok(())
    }

    /// Whether `poll` could complete something with no new completion or side data: taken
    /// completions or controls not yet handed out, a posted receive an arrived message
    /// matches, a credit or a queued send that can go.
    fn ready_without_event(&mut self) -> bool {
        if !self.stash.is_empty() || !self.controls.is_empty() {
            return true;
        }
        let unmatched = ((self.next - self.base) as usize) < self.arrived.len();
        let next_lends = matches!(self.recvs.front(), Some((_, RecvInto::Lend { .. })));
        if !self.recvs.is_empty() && unmatched && !(next_lends && self.lent.is_some()) {
            return true;
        }
        let (posted, tail) = (self.posted.len(), self.tail);
        let r = self.return_space().and_then(|()| self.start_sends());
        if let Err(b) = r {
            self.broken = Some(b);
            return true;
        }
        self.posted.len() != posted || self.tail != tail
    }
}

impl Link for RdmaLink {
    fn peer(&self) -> Rank {
        self.peer
    }

    fn max_message(&self) -> usize {
        self.max_message
    }

    unsafe fn post_send(&mut self, token: Token, buf: SendBuf) -> Result<()> {
        if buf.len() > self.max_message {
            return Err(self.too_long("send", buf.len(), self.max_message));
        }
        if let Some(b) = &self.broken {
            return Err(self.error(b));
        }
        self.pending.push_back((token, buf));
        if let Err(b) = self.start_sends() {
            let e = self.error(&b);
            self.broken = Some(b);
            return Err(e);
        }
        Ok(())
    }

    unsafe fn post_recv(&mut self, token: Token, into: RecvInto) -> Result<()> {
        if into.len() > self.max_message {
            return Err(self.too_long("receive", into.len(), self.max_message));
        }
        self.recvs.push_back((token, into));
        Ok(())
    }

    fn post_control(&mut self, bytes: &[u8]) -> Result<()> {
        match &self.broken {
            // What the peer sent broke the protocol: the side connection still takes a notice
            // of why this side's call failed (the peer otherwise waits until its deadline).
            None | Some(Broken::Protocol(_)) => {}
            Some(b) => return Err(self.error(b)),
        }
        self.side.post_control(bytes)
    }

    fn control_pending(&self) -> bool {
        self.side.control_pending()
    }

    unsafe fn register(&mut self, id: u64, ptr: *const u8, len: usize) -> Result<()> {
        if len == 0 || self.user.iter().any(|(i, _)| *i == id) {
            return Ok(());
        }
        // SAFETY: the caller keeps the memory mapped until `deregister(id)` returns or the
        // link is dropped; the region is dropped by either, after its writes completed.
        let r = unsafe { UserRegion::new(&self.queue.dev, ptr, len) }.map_err(|e| {
            TransportError::io(
                format!("rdma link to rank {}", self.peer),
                std::io::Error::other(e),
            )
        })?;
        self.user.push((id, r));
        Ok(())
    }

    fn deregister(&mut self, id: u64) {
        let Some(i) = self.user.iter().position(|(r, _)| *r == id) else {
            return;
        };
        let done = self.quiesce(|p| matches!(p, Posted::Data { direct: true, .. }));
        let (_, region) = self.user.swap_remove(i);
        if !done {
            self.pinned.push(region);
        }
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        if self.broken.is_none()
            && let Err(b) = self.poll_inner(out)
        {
            tracing::debug!(peer = self.peer, "rdma: link broken: {b:?}");
            self.broken = Some(b);
        }
        if matches!(self.broken, Some(Broken::Protocol(_))) && self.side.control_pending() {
            // Notices posted since (see post_control) go out over the side connection.
            let mut ignored = Vec::new();
            let _ = self.side.poll(&mut ignored);
        }
        match &self.broken {
            Some(b) => Err(self.error(b)),
            None => Ok(()),
        }
    }

    fn release(&mut self, token: Token) {
        if let Some((t, seq)) = self.lent
            && t == token
        {
            self.lent = None;
            if let Some(m) = seq
                .checked_sub(self.base)
                .and_then(|i| self.arrived.get_mut(i as usize))
            {
                m.state = State::Done;
            }
        }
    }

    fn readiness(&self, out: &mut Vec<Readiness>) -> bool {
        out.push(Readiness {
            fd: self.queue.fd,
            read: true,
            write: false,
        });
        self.side.readiness(out)
    }

    fn arm(&mut self) -> bool {
        if self.broken.is_some() || self.ready_without_event() {
            return false;
        }
        // SAFETY: the CQ is live.
        let rc = unsafe { self.queue.dev.v.req_notify_cq(self.queue.cq, false) };
        self.notify_pending |= rc == 0;
        self.side_in = 0;
        // Completions that came before the request raise no event: look once more.
        if rc != 0 || self.take_completions() > 0 {
            return false;
        }
        self.side.arm()
    }

    fn disarm(&mut self) {
        self.side.disarm();
    }

    fn peer_gone(&mut self) -> bool {
        let mut side = Vec::new();
        let _ = self.side.poll(&mut side);
        for c in side {
            if let Completion::Control(b) = c {
                self.controls.push(b);
            }
        }
        self.side.peer_closed()
    }

    fn peek(&mut self, buf: &mut [u8]) -> usize {
        if self.discard {
            return 0;
        }
        let Some(m) = self.arrived.get((self.next - self.base) as usize) else {
            return 0;
        };
        let n = m.len.min(buf.len());
        let cap = self.recv_cap();
        // SAFETY: as in `match_receives`: `start % cap + len <= cap`, the ring is ours and is
        // read as shared memory (the peer's device wrote it); `buf` holds `n` bytes.
        unsafe {
            let src = self.ring.ptr().add((m.start % cap) as usize);
            oxccl_transport::shared::copy(buf.as_mut_ptr(), src, n);
        }
        n
    }

    fn has_incoming(&mut self) -> bool {
        // Completions are only looked at here; `poll` handles them.
        self.take_completions();
        let in_stash = self.stash.iter().any(|wc| {
            wc.status == sys::IBV_WC_SUCCESS
                && wc.opcode == sys::IBV_WC_RECV_RDMA_WITH_IMM
                && u32::from_be(wc.imm_data) & CREDIT == 0
        });
        !self.discard && (in_stash || ((self.next - self.base) as usize) < self.arrived.len())
    }

    fn cancel(&mut self) {
        self.pending.clear();
        for p in self.posted.iter_mut() {
            if let Posted::Data { token, .. } = p {
                *token = None;
            }
        }
        self.lost_send = false;
        // Writes from the caller's memory read it until they complete.
        self.quiesce(|p| matches!(p, Posted::Data { direct: true, .. }));
        self.recvs.clear();
        self.lent = None;
        for m in self.arrived.iter_mut() {
            m.state = State::Done;
        }
        self.next = self.base + self.arrived.len() as u64;
        self.discard = true;
        // Cancelled sends may still be in flight from the staging area (never the caller's
        // memory); returning space keeps the peer's sends moving.
        if self.broken.is_none()
            && let Err(b) = self.return_space()
        {
            self.broken = Some(b);
        }
    }

    fn close(&mut self) {
        self.queue.fail();
        self.side.close();
        // The error state flushes what was posted; writes from a caller's memory are awaited.
        self.quiesce(|p| matches!(p, Posted::Data { direct: true, .. }));
    }
}

#[cfg(test)]
mod tests {
    use super::{Geometry, place};

    #[test]
    fn placement_takes_whole_slots_and_wraps_only_when_the_end_has_no_room() {
        assert_eq!(place(0, 10, 64, 1024), (0, 64));
        assert_eq!(place(0, 0, 64, 1024), (0, 64));
        assert_eq!(place(64, 65, 64, 1024), (64, 192));
        assert_eq!(place(960, 64, 64, 1024), (960, 1024));
        assert_eq!(place(960, 65, 64, 1024), (1024, 1152));
        assert_eq!(place(1024 + 512, 512, 64, 1024), (1536, 2048));
        assert_eq!(place(1024 + 576, 512, 64, 1024), (2048, 2560));
    }

    #[test]
    fn a_lent_message_anywhere_leaves_room_for_the_next_one() {
        for max in [
            1,
            64,
            100,
            4096,
            65536,
            256 << 10,
            (256 << 10) + 1,
            4 << 20,
            64 << 20,
        ] {
            let g = Geometry::new(max);
            assert_eq!(g.slot % 64, 0);
            assert_eq!(g.cap % rustix::param::page_size() as u64, 0);
            assert!(g.messages() <= 400 || g.slot == 64, "{max}: {g:?}");
            assert!(g.depths().recv >= 2 * g.messages() as u32);
            // A largest message lent at each slot of the ring (the tail there), the writer
            // right behind it: the next largest message still fits.
            let step = (g.cap / g.slot / 512).max(1) * g.slot;
            for lap in [0, 7] {
                let mut at = lap * g.cap;
                while at < (lap + 1) * g.cap {
                    let (start, end) = place(at, max, g.slot, g.cap);
                    let (_, next) = place(end, max, g.slot, g.cap);
                    assert!(next - start <= g.cap, "{max}: lent at {start}: {g:?}");
                    at += step;
                }
            }
        }
    }
}
