//! The receiving half of a [`crate::TcpLink`]: bytes from the socket land in a double-mapped
//! [`Ring`], where frames are parsed in place, matched in order with posted receives, copied
//! out or lent where they lie; a large message not yet buffered is read straight into the
//! receiver's memory instead.
//!
//! Ring positions are `u64` stream offsets: `wr` is where the next byte read lands, `scan` the
//! next frame header to parse; everything from the oldest byte still needed (a lent message's
//! header, else the first unconsumed frame) up to `wr` is live, the rest free. This module
//! never allocates from a length it read before checking it, never writes live ring bytes, and
//! never blocks.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::net::TcpStream;

use oxccl_transport::{Completion, RecvBuf, RecvInto, Token};
use rustix::io::Errno;
use rustix::net::RecvFlags;

use crate::link::{Broken, LinkStats};
use crate::ring::Ring;
use crate::wire::{FrameHeader, HEADER_LEN, KIND_CONTROL, KIND_DATA, MAX_CONTROL};

/// Ring room beyond two full messages, and what may wait in it with no receive posted when
/// messages are small: batches of small frames and control frames.
const RING_SPARE: usize = 64 * 1024;
/// Memory receives at least this long are read straight into place when the ring holds none of
/// their frame: one `readv` puts the header in the ring and the payload in the receiver's memory.
/// Below it, copying out of the ring is cheaper than giving up batching.
const ZERO_COPY_MIN: usize = 16 * 1024;
/// Ring bytes offered behind a payload read straight into place: room for small frames after
/// it, while little of a large next message is read ahead (and would have to be copied).
const READ_AHEAD: usize = 16 * 1024;
/// Reads per poll while the socket keeps filling everything offered, so a fast sender cannot
/// keep `poll` from returning (and from flushing this side's sends).
const MAX_READS_PER_POLL: usize = 8;

/// A parsed data frame waiting for its receive.
#[derive(Clone, Copy, Debug)]
struct InFrame {
    /// Ring position of its header.
    pos: u64,
    len: usize,
}

/// A memory receive whose remaining bytes the kernel reads straight into place.
#[derive(Clone, Copy, Debug)]
struct Direct {
    token: Token,
    buf: RecvBuf,
    filled: usize,
}

/// The message lent out: its frame stays pinned in the ring until released.
#[derive(Clone, Copy, Debug)]
struct Lent {
    token: Token,
    /// Ring position of its header.
    start: u64,
}

/// Posted receives and the bytes received for them.
#[derive(Debug)]
pub(crate) struct Inbox {
    ring: Ring,
    max_message: usize,
    wr: u64,
    scan: u64,
    frames: VecDeque<InFrame>,
    recvs: VecDeque<(Token, RecvInto)>,
    direct: Option<Direct>,
    lent: Option<Lent>,
    /// The peer closed its end: nothing more will arrive.
    eof: bool,
    /// After `cancel`: data frames are dropped as they are parsed; control frames still come.
    discard: bool,
    /// Read calls and where payload bytes went (the write counter stays zero).
    pub stats: LinkStats,
}

impl Inbox {
    /// An inbox for messages of up to `max_message` bytes, with a ring holding two of them.
    pub fn new(max_message: usize) -> io::Result<Inbox> {
        let ring_bytes = max_message
            .checked_add(HEADER_LEN)
            .and_then(|f| f.checked_mul(2))
            .and_then(|b| b.checked_add(RING_SPARE))
            .ok_or_else(|| io::Error::other("message limit too large for a receive ring"))?;
        Ok(Inbox {
            ring: Ring::new(ring_bytes)?,
            max_message,
            wr: 0,
            scan: 0,
            frames: VecDeque::new(),
            recvs: VecDeque::new(),
            direct: None,
            lent: None,
            eof: false,
            discard: false,
            stats: LinkStats::default(),
        })
    }

    /// Whether end of stream was read.
    pub fn eof(&self) -> bool {
        self.eof
    }

    /// Bytes in the ring.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Queues a receive (its length already checked against the limit).
    pub fn post(&mut self, token: Token, into: RecvInto) {
        self.recvs.push_back((token, into));
    }

    /// Unpins the lent message if `token` names it.
    pub fn release(&mut self, token: Token) {
        if self.lent.is_some_and(|l| l.token == token) {
            self.lent = None;
        }
    }

    /// Forgets every posted receive and the lent message: their memory is never touched again.
    /// The unread rest of a frame being read into a cancelled receive is skipped when it
    /// arrives, and from now on data frames are dropped as they are parsed, so control frames
    /// behind them still get through.
    pub fn cancel(&mut self) {
        self.recvs.clear();
        self.lent = None;
        // `scan` is already past every parsed frame, complete or not.
        self.frames.clear();
        if let Some(d) = self.direct.take() {
            self.scan = self.wr + (d.buf.len() - d.filled) as u64;
        }
        self.discard = true;
    }

    /// Completes what buffered bytes allow, then reads what the socket has, completing as it
    /// goes. Once every receive posted before this call is done it stops reading: the caller
    /// is likely to post more at once, and what stays in the socket can then go straight into
    /// them. End of stream is [`Broken::Closed`] only once a posted receive can no longer be
    /// satisfied: what arrived before it is delivered first, and with nothing posted a closed
    /// peer is no error.
    pub fn progress(&mut self, sock: &TcpStream, out: &mut Vec<Completion>) -> Result<(), Broken> {
        let had_recvs = !self.recvs.is_empty();
        self.complete_recvs(out)?;
        for _ in 0..MAX_READS_PER_POLL {
            if self.eof || (had_recvs && self.recvs.is_empty() && self.direct.is_none()) {
                break;
            }
            // Reading an empty socket costs what asking poll(2) would, and data that has
            // arrived comes with it, one system call sooner: an 8-byte exchange between two
            // processes over loopback took 4.4-5.3 us spinning on recv and 6.1-6.5 us polling
            // first; 2 ranks, 8-byte all-reduce: 6.2-6.3 us against 7.0-8.6 (2026-11-27,
            // kernel 6.18). On the 2026-11-22 host, polling first was the faster (12.5
            // against 20 us).
            let (n, offered) = match self.read(sock, out) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(Broken::Closed) => {
                    self.eof = true;
                    break;
                }
                Err(e) => return Err(e),
            };
            self.parse(out)?;
            self.complete_recvs(out)?;
            if n < offered {
                break;
            }
        }
        if self.eof && self.starved() {
            return Err(Broken::Closed);
        }
        Ok(())
    }

    /// Whether the next [`Inbox::progress`] would read the socket if it had bytes: not after end
    /// of stream (a closed socket stays readable), nor while the ring holds all it may with no
    /// receive posted (only posting one changes that).
    pub fn wants_read(&self) -> bool {
        !self.eof
            && (self.direct.is_some() || !self.recvs.is_empty() || self.ring_room(self.free()) > 0)
    }

    /// Whether a posted receive waits for bytes that are not in the ring.
    fn starved(&self) -> bool {
        if self.direct.is_some() {
            return true;
        }
        let complete = self
            .frames
            .iter()
            .take_while(|f| f.pos + (HEADER_LEN + f.len) as u64 <= self.wr)
            .count();
        self.recvs.len() > complete
    }

    // ---- ring space ----

    /// The oldest ring position still needed.
    fn oldest(&self) -> u64 {
        match (self.lent, self.frames.front()) {
            (Some(l), _) => l.start,
            (None, Some(f)) => f.pos,
            (None, None) => self.scan.min(self.wr),
        }
    }

    fn free(&self) -> usize {
        self.ring.capacity() - (self.wr - self.oldest()) as usize
    }

    /// How much a plain read into the ring may take. With receives posted, all the free
    /// space: small frames batch, and lent frames must be in the ring anyway. With none
    /// posted, only enough that one full message (or 64 KiB of small ones) waits in the ring:
    /// that is the buffering guarantee, and anything read beyond it would have to be copied
    /// later, where left in the socket it can go straight into a receive posted meanwhile.
    fn ring_room(&self, free: usize) -> usize {
        if !self.recvs.is_empty() {
            return free;
        }
        let unclaimed = (self.wr
            - self
                .frames
                .front()
                .map_or(self.scan.min(self.wr), |f| f.pos)) as usize;
        let keep = (self.max_message + HEADER_LEN).max(RING_SPARE);
        free.min(keep.saturating_sub(unclaimed))
    }

    // ---- reading ----

    /// One read: into a direct receive's memory, into a large memory receive by guess, or into
    /// the ring. Returns the bytes read and the bytes offered, or `None` if there was nothing
    /// to read (or no room to read it).
    fn read(
        &mut self,
        sock: &TcpStream,
        out: &mut Vec<Completion>,
    ) -> Result<Option<(usize, usize)>, Broken> {
        let free = self.free();
        self.stats.read_calls += 1;
        if let Some(d) = self.direct {
            return self.read_direct(sock, d, free, out);
        }
        if let Some(buf) = self.zero_copy_candidate(free) {
            return self.read_zero_copy(sock, buf, free, out);
        }
        let room = self.ring_room(free);
        if room == 0 {
            // Nothing more to buffer: only check whether the peer is gone.
            let mut probe = [0u8; 1];
            let peeked = rustix::net::recv(sock, &mut probe, RecvFlags::PEEK | RecvFlags::DONTWAIT);
            return match peeked {
                Ok((0, _)) => Err(Broken::Closed),
                Ok(_) | Err(Errno::AGAIN) | Err(Errno::INTR) => Ok(None),
                Err(e) => Err(Broken::io("receive from", e)),
            };
        }
        // SAFETY: `room <= free` bytes from `wr` are free ring space: no lent message, parsed
        // frame or unparsed byte lies there, so nothing else refers to it.
        let ring = unsafe { std::slice::from_raw_parts_mut(self.ring.at(self.wr), room) };
        let Some(n) = outcome(rustix::io::read(sock, ring))? else {
            return Ok(None);
        };
        self.wr += n as u64;
        Ok(Some((n, room)))
    }

    /// Reads the rest of a direct receive into its memory, and what follows into the ring.
    fn read_direct(
        &mut self,
        sock: &TcpStream,
        d: Direct,
        free: usize,
        out: &mut Vec<Completion>,
    ) -> Result<Option<(usize, usize)>, Broken> {
        let want = d.buf.len() - d.filled;
        let ahead = free.min(READ_AHEAD);
        // SAFETY: the receive's memory belongs to this link until it completes (post_recv's
        // contract) and `filled < len`; `ahead <= free` bytes from `wr` are free ring space.
        let (user, ring) = unsafe {
            (
                std::slice::from_raw_parts_mut(d.buf.ptr().add(d.filled), want),
                std::slice::from_raw_parts_mut(self.ring.at(self.wr), ahead),
            )
        };
        let mut iov = [IoSliceMut::new(user), IoSliceMut::new(ring)];
        let used = if ahead == 0 { 1 } else { 2 };
        let Some(n) = outcome(rustix::io::readv(sock, &mut iov[..used]))? else {
            return Ok(None);
        };
        let took = n.min(want);
        self.stats.bytes_direct += took as u64;
        if took == want {
            out.push(Completion::Received(d.token));
            self.direct = None;
        } else if let Some(d) = &mut self.direct {
            d.filled += took;
        }
        self.wr += (n - took) as u64;
        Ok(Some((n, want + ahead)))
    }

    /// The memory of the front receive if the next read should go straight into it: no direct
    /// receive under way, no unparsed byte buffered (the next byte read starts a frame), a
    /// large memory receive first in line, and room in the ring for its header and a gap.
    fn zero_copy_candidate(&self, free: usize) -> Option<RecvBuf> {
        if self.direct.is_some() || !self.frames.is_empty() || self.scan != self.wr {
            return None;
        }
        match self.recvs.front() {
            Some((_, RecvInto::Memory(buf)))
                if buf.len() >= ZERO_COPY_MIN && free >= HEADER_LEN + buf.len() =>
            {
                Some(*buf)
            }
            _ => None,
        }
    }

    /// Reads the next frame on the guess that it is the front receive's message: header into
    /// the ring, payload straight into `buf`, leaving a gap in the ring that is filled from
    /// `buf` if the guess was wrong.
    fn read_zero_copy(
        &mut self,
        sock: &TcpStream,
        buf: RecvBuf,
        free: usize,
        out: &mut Vec<Completion>,
    ) -> Result<Option<(usize, usize)>, Broken> {
        let len = buf.len();
        let gap_end = self.wr + (HEADER_LEN + len) as u64;
        let ahead = (free - HEADER_LEN - len).min(READ_AHEAD);
        // SAFETY: `zero_copy_candidate` checked that header, gap and read-ahead fit the free
        // ring space, which nothing else refers to; the receive's memory belongs to this link
        // until it completes (post_recv's contract).
        let (header, user, ring) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.ring.at(self.wr), HEADER_LEN),
                std::slice::from_raw_parts_mut(buf.ptr(), len),
                std::slice::from_raw_parts_mut(self.ring.at(gap_end), ahead),
            )
        };
        let mut iov = [
            IoSliceMut::new(header),
            IoSliceMut::new(user),
            IoSliceMut::new(ring),
        ];
        let used = if ahead == 0 { 2 } else { 3 };
        let Some(n) = outcome(rustix::io::readv(sock, &mut iov[..used]))? else {
            return Ok(None);
        };
        let offered = HEADER_LEN + len + ahead;
        if n < HEADER_LEN {
            self.wr += n as u64;
            return Ok(Some((n, offered)));
        }
        let got = (n - HEADER_LEN).min(len);
        let mut h = [0u8; HEADER_LEN];
        // SAFETY: the kernel just wrote these header bytes at `wr`; `h` is distinct memory.
        unsafe { std::ptr::copy_nonoverlapping(self.ring.at(self.wr), h.as_mut_ptr(), HEADER_LEN) };
        let h = FrameHeader::decode(h);
        if h.kind == KIND_DATA && h.len as usize == len {
            if let Some((token, _)) = self.recvs.pop_front() {
                self.stats.bytes_direct += got as u64;
                if got == len {
                    out.push(Completion::Received(token));
                } else {
                    self.direct = Some(Direct {
                        token,
                        buf,
                        filled: got,
                    });
                }
            }
            // The gap is skipped: the next frame starts after it.
            self.scan = gap_end;
            self.wr = gap_end + (n - HEADER_LEN - got) as u64;
        } else {
            // SAFETY: the gap after the header is free ring space (checked before the read),
            // `got <= len` bytes of `buf` were just written by the kernel, and `buf` belongs to
            // this link until its receive completes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    buf.ptr(),
                    self.ring.at(self.wr + HEADER_LEN as u64),
                    got,
                )
            };
            self.wr += n as u64;
        }
        Ok(Some((n, offered)))
    }

    // ---- without a socket (fuzzing) ----

    /// Back to a fresh inbox's state (same ring, same limit).
    pub(crate) fn reset(&mut self) {
        self.wr = 0;
        self.scan = 0;
        self.frames.clear();
        self.recvs.clear();
        self.direct = None;
        self.lent = None;
        self.eof = false;
        self.discard = false;
    }

    /// As if a read had returned `bytes` (as many as a read into the ring would take now):
    /// parses and completes what they allow. Returns the bytes taken; `None` once a receive
    /// waits to be read into directly (only a socket can go on from there).
    pub(crate) fn deliver(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<Completion>,
    ) -> Result<Option<usize>, Broken> {
        if self.direct.is_some() {
            return Ok(None);
        }
        let n = self.ring_room(self.free()).min(bytes.len());
        // SAFETY: `n` bytes from `wr` are free ring space (as in `read`), and `bytes` is other
        // memory.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ring.at(self.wr), n) };
        self.wr += n as u64;
        self.parse(out)?;
        self.complete_recvs(out)?;
        Ok(Some(n))
    }

    // ---- frames ----

    /// Parses complete headers from `scan`: data frames queue for their receives, control frames
    /// are delivered at once.
    fn parse(&mut self, out: &mut Vec<Completion>) -> Result<(), Broken> {
        while self.scan + HEADER_LEN as u64 <= self.wr {
            let mut h = [0u8; HEADER_LEN];
            self.copy_from_ring(self.scan, &mut h);
            let h = FrameHeader::decode(h);
            let len = h.len as usize;
            match h.kind {
                KIND_DATA => {
                    if len > self.max_message {
                        return Err(Broken::Protocol(format!(
                            "data frame of {len} bytes exceeds the limit of {}",
                            self.max_message
                        )));
                    }
                    if !self.discard {
                        self.frames.push_back(InFrame {
                            pos: self.scan,
                            len,
                        });
                    }
                    self.scan += (HEADER_LEN + len) as u64;
                }
                KIND_CONTROL => {
                    if len > MAX_CONTROL {
                        return Err(Broken::Protocol(format!(
                            "control frame of {len} bytes exceeds the limit of {MAX_CONTROL}"
                        )));
                    }
                    let end = self.scan + (HEADER_LEN + len) as u64;
                    if end > self.wr {
                        break;
                    }
                    let mut msg = vec![0u8; len];
                    self.copy_from_ring(self.scan + HEADER_LEN as u64, &mut msg);
                    out.push(Completion::Control(msg));
                    self.scan = end;
                }
                kind => return Err(Broken::Protocol(format!("frame of unknown kind {kind}"))),
            }
        }
        Ok(())
    }

    /// Matches parsed frames with posted receives, in order.
    fn complete_recvs(&mut self, out: &mut Vec<Completion>) -> Result<(), Broken> {
        while self.direct.is_none() {
            let (Some(&(token, into)), Some(&frame)) = (self.recvs.front(), self.frames.front())
            else {
                break;
            };
            if frame.len != into.len() {
                return Err(Broken::Protocol(format!(
                    "data message of {} bytes where the posted receive expects {}",
                    frame.len,
                    into.len()
                )));
            }
            let payload = frame.pos + HEADER_LEN as u64;
            let end = payload + frame.len as u64;
            match into {
                RecvInto::Memory(buf) => {
                    let have = (self.wr.min(end) - payload) as usize;
                    // SAFETY: the receive's memory belongs to this link until it completes
                    // (post_recv's contract), and `have <= len`.
                    let dst = unsafe { std::slice::from_raw_parts_mut(buf.ptr(), have) };
                    self.copy_from_ring(payload, dst);
                    self.stats.bytes_copied += have as u64;
                    self.recvs.pop_front();
                    self.frames.pop_front();
                    if have == frame.len {
                        out.push(Completion::Received(token));
                    } else {
                        // The rest of this frame goes straight into `buf`; the ring carries on
                        // with the next frame's header.
                        self.direct = Some(Direct {
                            token,
                            buf,
                            filled: have,
                        });
                        self.scan = self.wr;
                    }
                }
                RecvInto::Lend { len } => {
                    if self.lent.is_some() || end > self.wr {
                        break;
                    }
                    self.lent = Some(Lent {
                        token,
                        start: frame.pos,
                    });
                    self.stats.bytes_lent += len as u64;
                    out.push(Completion::Lent {
                        token,
                        ptr: self.ring.at(payload),
                        len,
                    });
                    self.recvs.pop_front();
                    self.frames.pop_front();
                }
            }
        }
        Ok(())
    }

    /// The first bytes of the oldest parsed data frame no receive has taken, as far as they are
    /// in the ring (see `Link::peek`).
    pub fn peek(&self, buf: &mut [u8]) -> usize {
        if self.direct.is_some() || self.discard {
            return 0;
        }
        let Some(f) = self.frames.front() else {
            return 0;
        };
        let payload = f.pos + HEADER_LEN as u64;
        let have = (self.wr.saturating_sub(payload) as usize)
            .min(f.len)
            .min(buf.len());
        self.copy_from_ring(payload, &mut buf[..have]);
        have
    }

    /// Copies `dst.len()` received ring bytes from `pos`.
    fn copy_from_ring(&self, pos: u64, dst: &mut [u8]) {
        debug_assert!(pos + dst.len() as u64 <= self.wr);
        let n = dst.len().min(self.ring.capacity());
        // SAFETY: the ring is mapped twice, so `n <= capacity` bytes from `at(pos)` are mapped;
        // they hold received bytes that no `&mut` refers to (reads only write free space), and
        // `dst` is distinct memory.
        unsafe { std::ptr::copy_nonoverlapping(self.ring.at(pos), dst.as_mut_ptr(), n) };
    }
}

/// A read's result: bytes read, `None` if there was nothing (or a signal came first), or why
/// the link is broken (end of stream: the peer closed).
fn outcome(res: rustix::io::Result<usize>) -> Result<Option<usize>, Broken> {
    match res {
        Ok(0) => Err(Broken::Closed),
        Ok(n) => Ok(Some(n)),
        Err(Errno::AGAIN) | Err(Errno::INTR) => Ok(None),
        Err(e) => Err(Broken::io("receive from", e)),
    }
}
