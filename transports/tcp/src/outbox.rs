//! The sending half of a [`crate::TcpLink`]: queued data sends, written straight from the
//! callers' memory, and control messages slipped in at the next frame boundary.
//!
//! One `sendmsg` carries the rest of a partly written frame and as many whole frames as fit
//! [`MAX_IOV`] buffers. This module never copies a data payload, never blocks, and never
//! splits a frame with another.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::TcpStream;

use oxccl_transport::{Completion, SendBuf, Token};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{SendAncillaryBuffer, SendFlags};

use crate::wire::{FrameHeader, HEADER_LEN, KIND_CONTROL, KIND_DATA};

/// Most buffers handed to one `sendmsg` (Linux allows 1024; 64 covers 32 small messages).
const MAX_IOV: usize = 64;

/// A queued data send.
#[derive(Debug)]
struct OutFrame {
    token: Token,
    buf: SendBuf,
    header: [u8; HEADER_LEN],
}

impl OutFrame {
    fn size(&self) -> usize {
        HEADER_LEN + self.buf.len()
    }
}

/// Which frame the socket has taken part of (bytes of it, header included, already written).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Partial {
    None,
    /// The front of `sends`.
    Data(usize),
    /// The front of `controls`.
    Control(usize),
}

/// Everything waiting to be written to one socket.
#[derive(Debug)]
pub(crate) struct Outbox {
    sends: VecDeque<OutFrame>,
    /// Framed control messages (header included).
    controls: VecDeque<Vec<u8>>,
    partial: Partial,
    blocked: bool,
    /// `sendmsg` calls so far.
    pub write_calls: u64,
}

impl Outbox {
    pub fn new() -> Outbox {
        Outbox {
            sends: VecDeque::new(),
            controls: VecDeque::new(),
            partial: Partial::None,
            blocked: false,
            write_calls: 0,
        }
    }

    /// Queues a data send (its length already checked against the limit).
    pub fn push_data(&mut self, token: Token, buf: SendBuf) {
        let header = FrameHeader {
            len: buf.len() as u32,
            kind: KIND_DATA,
        }
        .encode();
        self.sends.push_back(OutFrame { token, buf, header });
    }

    /// Queues a copy of a control message (its length already checked).
    pub fn push_control(&mut self, bytes: &[u8]) {
        let header = FrameHeader {
            len: bytes.len() as u32,
            kind: KIND_CONTROL,
        }
        .encode();
        self.controls.push_back([&header[..], bytes].concat());
    }

    /// Forgets every queued data send: none completes and no caller memory is read again. A
    /// frame already partly written is finished from a copy, so the stream stays well-formed
    /// for the control messages that follow.
    pub fn cancel(&mut self) {
        if let Partial::Data(off) = self.partial
            && let Some(f) = self.sends.front()
        {
            // SAFETY: cancel runs while the send is still posted, so its memory is still valid
            // under post_send's contract; after this copy it is never read again.
            let payload = unsafe { std::slice::from_raw_parts(f.buf.ptr(), f.buf.len()) };
            let mut rest = Vec::with_capacity(f.size() - off);
            if off < HEADER_LEN {
                rest.extend_from_slice(&f.header[off..]);
                rest.extend_from_slice(payload);
            } else {
                rest.extend_from_slice(&payload[off - HEADER_LEN..]);
            }
            self.controls.push_front(rest);
            self.partial = Partial::Control(0);
        }
        self.sends.clear();
    }

    /// Whether a control message (or the rest of a cancelled frame before it) waits to be
    /// written.
    pub fn controls_pending(&self) -> bool {
        !self.controls.is_empty()
    }

    /// Whether anything waits to be written.
    pub fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.controls.is_empty()
    }

    /// Whether the socket refused more and the outbox waits for it to drain.
    pub fn blocked(&self) -> bool {
        self.blocked
    }

    /// Writes as much as the socket takes, completing sends whose last byte went out.
    pub fn flush(&mut self, sock: &TcpStream, out: &mut Vec<Completion>) -> Result<(), Errno> {
        if self.blocked && !writable(sock) {
            return Ok(());
        }
        while !self.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            self.write_calls += 1;
            let (count, total) = self.gather(&mut iov);
            let sent = rustix::net::sendmsg(
                sock,
                &iov[..count],
                &mut SendAncillaryBuffer::default(),
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            );
            match sent {
                Ok(n) => {
                    self.consume(n, out);
                    if n < total {
                        // The send buffer is full: waiting for writability beats a sure EAGAIN.
                        self.blocked = true;
                        return Ok(());
                    }
                }
                Err(Errno::AGAIN) => {
                    self.blocked = true;
                    return Ok(());
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(e),
            }
        }
        self.blocked = false;
        Ok(())
    }

    /// Fills `iov` in wire order: the rest of a partly written frame, control frames (they go
    /// at the next frame boundary), then data frames. Returns the buffers used and their bytes.
    fn gather<'s>(&'s self, iov: &mut [IoSlice<'s>; MAX_IOV]) -> (usize, usize) {
        let mut g = Gather {
            iov,
            count: 0,
            total: 0,
        };
        let mut data = self.sends.iter();
        let mut controls = self.controls.iter();
        match self.partial {
            Partial::Data(off) => {
                if let Some(f) = data.next() {
                    g.data_frame(f, off);
                }
            }
            Partial::Control(off) => {
                if let Some(c) = controls.next() {
                    g.push(&c[off..]);
                }
            }
            Partial::None => {}
        }
        for c in controls {
            if !g.push(c) {
                break;
            }
        }
        for f in data {
            if !g.data_frame(f, 0) {
                break;
            }
        }
        (g.count, g.total)
    }

    /// Accounts for `n` bytes written, in [`Outbox::gather`]'s order, completing sends.
    fn consume(&mut self, mut n: usize, out: &mut Vec<Completion>) {
        match self.partial {
            Partial::Data(off) => {
                let Some(f) = self.sends.front() else { return };
                let rest = f.size() - off;
                if n < rest {
                    self.partial = Partial::Data(off + n);
                    return;
                }
                n -= rest;
                out.push(Completion::Sent(f.token));
                self.sends.pop_front();
            }
            Partial::Control(off) => {
                let Some(c) = self.controls.front() else {
                    return;
                };
                let rest = c.len() - off;
                if n < rest {
                    self.partial = Partial::Control(off + n);
                    return;
                }
                n -= rest;
                self.controls.pop_front();
            }
            Partial::None => {}
        }
        self.partial = Partial::None;
        while n > 0 {
            let Some(c) = self.controls.front() else {
                break;
            };
            if n < c.len() {
                self.partial = Partial::Control(n);
                return;
            }
            n -= c.len();
            self.controls.pop_front();
        }
        while n > 0 {
            let Some(f) = self.sends.front() else { break };
            if n < f.size() {
                self.partial = Partial::Data(n);
                return;
            }
            n -= f.size();
            out.push(Completion::Sent(f.token));
            self.sends.pop_front();
        }
    }
}

/// Whether the socket would take a sizeable write, by the kernel's own measure for waking
/// blocked writers (free space at least half of what is queued). Retrying `sendmsg` as soon as
/// any space frees instead dribbles small segments, which measured slower on loopback. Errors
/// count as writable: `sendmsg` then reports them.
fn writable(sock: &TcpStream) -> bool {
    let mut fds = [PollFd::new(sock, PollFlags::OUT)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    !matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0))
}

/// Builds a `sendmsg` buffer list.
struct Gather<'a, 's> {
    iov: &'a mut [IoSlice<'s>; MAX_IOV],
    count: usize,
    total: usize,
}

impl<'s> Gather<'_, 's> {
    /// Appends `bytes`; `false` if the list is full.
    fn push(&mut self, bytes: &'s [u8]) -> bool {
        if bytes.is_empty() {
            return true;
        }
        if self.count == MAX_IOV {
            return false;
        }
        self.iov[self.count] = IoSlice::new(bytes);
        self.count += 1;
        self.total += bytes.len();
        true
    }

    /// Appends a data frame from byte `off` (header included); `false` if it did not all fit.
    fn data_frame(&mut self, f: &'s OutFrame, off: usize) -> bool {
        // SAFETY: post_send's caller keeps the memory readable and unchanged until the send
        // completes, which is after these bytes have been written.
        let payload = unsafe { std::slice::from_raw_parts(f.buf.ptr(), f.buf.len()) };
        if off < HEADER_LEN {
            self.push(&f.header[off..]) && self.push(payload)
        } else {
            self.push(&payload[off - HEADER_LEN..])
        }
    }
}
