//! [`RdmaLink`]: one reliable-connected queue pair to a peer, plus the authenticated TCP
//! connection the two sides met over, which stays as the control channel and as the fastest
//! sign that the peer's process is gone.
//!
//! The data path: each side owns a receive ring of `2 × max_message` bytes (registered for
//! the peer's RDMA WRITEs) and a send staging area of the same size. A send is copied into the
//! staging area at the place it will take in the peer's ring and written there with one RDMA
//! WRITE WITH IMM whose immediate is the length; both sides place messages by the same rule
//! (contiguous; wrapping to the start when the end has no room), so the receiver knows where
//! a message starts from its length alone. A receive posted as [`RecvInto::Lend`] is lent
//! straight out of the ring (no copy); one into memory is copied out once. The receiver
//! returns space by message count, in a zero-length WRITE WITH IMM with the top bit set, at
//! most one in flight at a time. Every work request is signalled, and a send completes only
//! when its write's completion says the peer's device has the bytes, so a rank that saw all
//! its sends complete may exit without losing data.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use oxccl_transport::{
    Completion, Link, Rank, Readiness, RecvInto, Result, SendBuf, Token, TransportError,
};
use oxccl_transport_tcp::TcpLink;

use crate::sys::{self, IbvRecvWr, IbvSendWr, IbvSge, IbvWc};
use crate::verbs::{Depths, Queue, Region, Remote};

/// Data messages one side may have in the peer's ring before it returns space.
pub(crate) const MAX_INFLIGHT: usize = 64;
/// Send queue depth: data writes whose completions have not been polled, plus credits.
pub(crate) const SEND_DEPTH: u32 = 2 * MAX_INFLIGHT as u32;
/// Receive queue depth: every WRITE WITH IMM takes one receive; between two polls the peer
/// can land at most `MAX_INFLIGHT` data messages and as many credits.
pub(crate) const RECV_DEPTH: u32 = 2 * MAX_INFLIGHT as u32 + 8;
pub(crate) const DEPTHS: Depths = Depths {
    send: SEND_DEPTH,
    recv: RECV_DEPTH,
};
/// The immediate's top bit marks a credit; the rest counts messages, modulo 2^31.
const CREDIT: u32 = 1 << 31;
const COUNT_MASK: u32 = CREDIT - 1;
/// How long after the side connection closed a posted operation may still complete from
/// completions already on their way before the link reports the peer gone.
const CLOSE_GRACE: Duration = Duration::from_millis(100);
const WR_DATA: u64 = 1;
const WR_CREDIT: u64 = 2;

/// Where a message of `len` bytes starts when the ring's writer is at `head`: right there,
/// or at the start of the next lap if it would not fit before the end.
pub(crate) fn place(head: u64, len: usize, cap: u64) -> u64 {
    let off = head % cap;
    if len as u64 > cap - off {
        head + (cap - off)
    } else {
        head
    }
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
    len: usize,
    state: State,
}

/// A posted write, in posting order (one queue pair completes its sends in order).
#[derive(Debug)]
enum Posted {
    /// A data write and the token of its send (`None` once cancelled).
    Data(Option<Token>),
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
    // Sending.
    pending: VecDeque<(Token, SendBuf)>,
    head: u64,
    /// Ends (in the peer's ring) of messages the peer has not returned yet.
    inflight: VecDeque<u64>,
    credited: u32,
    peer_tail: u64,
    posted: VecDeque<Posted>,
    // Receiving.
    recvs: VecDeque<(Token, RecvInto)>,
    rhead: u64,
    tail: u64,
    arrived: VecDeque<Arrived>,
    /// Sequence number of `arrived[0]`.
    base: u64,
    /// Sequence number of the next message to match with a posted receive.
    next: u64,
    consumed: u32,
    credit_sent: u32,
    credit_inflight: bool,
    lent: Option<(Token, u64)>,
    rq_posted: u32,
    discard: bool,
    stash: Vec<IbvWc>,
    controls: Vec<Vec<u8>>,
    closed_since: Option<Instant>,
    broken: Option<Broken>,
}

impl std::fmt::Debug for RdmaLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaLink")
            .field("peer", &self.peer)
            .field("device", &self.queue.dev)
            .field("qpn", &self.queue.qpn)
            .field("pending", &self.pending.len())
            .field("inflight", &self.inflight.len())
            .field("posted", &self.posted.len())
            .field("recvs", &self.recvs.len())
            .field("arrived", &self.arrived.len())
            .field("rq_posted", &self.rq_posted)
            .field("side_closed", &self.side.peer_closed())
            .field("control_pending", &self.side.control_pending())
            .field("side", &self.side.stats())
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
    ) -> RdmaLink {
        RdmaLink {
            peer,
            max_message,
            side,
            queue,
            ring,
            staging,
            remote,
            pending: VecDeque::new(),
            head: 0,
            inflight: VecDeque::new(),
            credited: 0,
            peer_tail: 0,
            posted: VecDeque::new(),
            recvs: VecDeque::new(),
            rhead: 0,
            tail: 0,
            arrived: VecDeque::new(),
            base: 0,
            next: 0,
            consumed: 0,
            credit_sent: 0,
            credit_inflight: false,
            lent: None,
            rq_posted,
            discard: false,
            stash: Vec::new(),
            controls,
            closed_since: None,
            broken: None,
        }
    }

    /// Posts receive work requests (no memory: WRITE WITH IMM only needs the entry) until
    /// `rq_posted` is `RECV_DEPTH`.
    pub(crate) fn fill_receives(queue: &Queue, rq_posted: &mut u32) -> Result<(), String> {
        let want = RECV_DEPTH - *rq_posted;
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
        *rq_posted = RECV_DEPTH;
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
        self.ring.len() as u64
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
            if wc.status == sys::IBV_WC_WR_FLUSH_ERR && self.broken.is_some() {
                return Ok(());
            }
            return Err(match wc.status {
                sys::IBV_WC_RETRY_EXC_ERR | sys::IBV_WC_RNR_RETRY_EXC_ERR => Broken::Closed,
                s => Broken::Io(format!(
                    "work completion failed: {} (status {s}, vendor error {:#x})",
                    sys::wc_status_name(s),
                    wc.vendor_err
                )),
            });
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
                    self.credit(imm & COUNT_MASK)
                } else {
                    self.arrive(imm as usize, wc.byte_len as usize)
                }
            }
            sys::IBV_WC_RDMA_WRITE => match (self.posted.pop_front(), wc.wr_id) {
                (Some(Posted::Data(token)), WR_DATA) => {
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

    fn credit(&mut self, count: u32) -> Result<(), Broken> {
        let n = count.wrapping_sub(self.credited) & COUNT_MASK;
        if n as usize > self.inflight.len() {
            return Err(Broken::Protocol(format!(
                "returned space for {n} messages, but {} are outstanding",
                self.inflight.len()
            )));
        }
        for _ in 0..n {
            self.peer_tail = self.inflight.pop_front().unwrap_or(self.peer_tail);
        }
        self.credited = count;
        Ok(())
    }

    fn arrive(&mut self, len: usize, byte_len: usize) -> Result<(), Broken> {
        if len > self.max_message || byte_len != len {
            return Err(Broken::Protocol(format!(
                "a message of {len} bytes ({byte_len} written) exceeds the limit of {} or disagrees with its write",
                self.max_message
            )));
        }
        let cap = self.recv_cap();
        let start = place(self.rhead, len, cap);
        let end = start + len as u64;
        if end - self.tail > cap || self.arrived.len() >= MAX_INFLIGHT {
            return Err(Broken::Protocol(format!(
                "wrote past the space it was given ({} messages held)",
                self.arrived.len()
            )));
        }
        self.rhead = end;
        let state = if self.discard {
            State::Done
        } else {
            State::Waiting
        };
        self.arrived.push_back(Arrived { start, len, state });
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
            self.tail = m.start + m.len as u64;
            self.base += 1;
            self.consumed = self.consumed.wrapping_add(1) & COUNT_MASK;
        }
        self.next = self.next.max(self.base);
        if self.credit_inflight || self.consumed == self.credit_sent {
            return Ok(());
        }
        self.post_write(WR_CREDIT, 0, 0, CREDIT | self.consumed)?;
        self.credit_sent = self.consumed;
        self.credit_inflight = true;
        self.posted.push_back(Posted::Credit);
        Ok(())
    }

    fn post_write(&mut self, wr_id: u64, off: u64, len: usize, imm: u32) -> Result<(), Broken> {
        let mut sge = IbvSge {
            addr: self.staging.ptr() as u64 + off,
            length: len as u32,
            lkey: self.staging.lkey,
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
        // SAFETY: the work request and its gather entry live for the call; the staging area
        // is registered and stays mapped while the QP lives.
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
        let cap = self.remote.ring_len;
        while let Some(&(token, buf)) = self.pending.front() {
            let len = buf.len();
            if self.inflight.len() >= MAX_INFLIGHT || self.posted.len() + 1 >= SEND_DEPTH as usize {
                break;
            }
            let start = place(self.head, len, cap);
            if start + len as u64 - self.peer_tail > cap {
                break;
            }
            let off = start % cap;
            // SAFETY: the caller vouched for `buf` until the send completes; `off + len <=
            // cap <= staging.len()` (checked at connection); the staging area is private.
            unsafe {
                std::ptr::copy_nonoverlapping(buf.ptr(), self.staging.ptr().add(off as usize), len)
            };
            self.post_write(WR_DATA, off, len, len as u32)?;
            self.head = start + len as u64;
            self.inflight.push_back(self.head);
            self.posted.push_back(Posted::Data(Some(token)));
            self.pending.pop_front();
        }
        Ok(())
    }

    /// Whether something posted can no longer complete if the peer is gone.
    fn waiting_on_peer(&self) -> bool {
        let unmatched = (self.next - self.base) as usize >= self.arrived.len();
        !self.pending.is_empty()
            || self
                .posted
                .iter()
                .any(|p| matches!(p, Posted::Data(Some(_))))
            || (!self.recvs.is_empty() && unmatched)
    }

    fn poll_inner(&mut self, out: &mut Vec<Completion>) -> Result<(), Broken> {
        self.queue.drain_events();
        self.take_completions();
        for wc in std::mem::take(&mut self.stash) {
            self.handle(wc, out)?;
        }
        if let Some(b) = self.broken.take() {
            return Err(b);
        }
        Self::fill_receives(&self.queue, &mut self.rq_posted).map_err(Broken::Io)?;
        self.match_receives(out)?;
        self.return_space()?;
        self.start_sends()?;
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
            Err(TransportError::PeerClosed { .. }) => return Err(Broken::Closed),
            Err(e) => return Err(Broken::Io(format!("side connection: {e}"))),
            Ok(()) => {}
        }
        if self.side.peer_closed() && self.waiting_on_peer() {
            let since = *self.closed_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= CLOSE_GRACE {
                return Err(Broken::Closed);
            }
        }
        Ok(())
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
        if let Some(b) = &self.broken {
            return Err(self.error(b));
        }
        self.side.post_control(bytes)
    }

    fn control_pending(&self) -> bool {
        self.side.control_pending()
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        if self.broken.is_none()
            && let Err(b) = self.poll_inner(out)
        {
            tracing::debug!(peer = self.peer, "rdma: link broken: {b:?}");
            self.broken = Some(b);
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
        // SAFETY: the CQ is live.
        let rc = unsafe { self.queue.dev.v.req_notify_cq(self.queue.cq, false) };
        // Completions that came before the request raise no event: look once more.
        if rc != 0 || self.take_completions() > 0 || !self.controls.is_empty() {
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
            if let Posted::Data(t) = p {
                *t = None;
            }
        }
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
    }
}

#[cfg(test)]
mod tests {
    use super::place;

    #[test]
    fn placement_wraps_only_when_the_end_has_no_room() {
        assert_eq!(place(0, 10, 100), 0);
        assert_eq!(place(90, 10, 100), 90);
        assert_eq!(place(91, 10, 100), 100);
        assert_eq!(place(195, 0, 100), 195);
        assert_eq!(place(250, 100, 100), 300);
        assert_eq!(place(300, 100, 100), 300);
    }
}
