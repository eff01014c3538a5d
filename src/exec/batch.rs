//! Point-to-point operations in flight: the batch the engine runs while no collective does.
//!
//! Every message travels as its descriptor (its number among the messages between the two
//! ranks in that direction, and its length) followed by its bytes, a slice at a time. The k-th
//! send from one rank to another pairs with the other's k-th receive from it, whatever groups
//! either side made: a receiver checks the descriptor that arrives against its own and fails
//! with both in the error if they differ. Point-to-point operations queued one after another
//! join the running batch, so a rank's send and its next receive are posted together even when
//! they were separate calls (`isend` then `irecv`, as torch.distributed's Gloo users write them,
//! cannot deadlock on the send); each operation is settled as soon as its own messages are
//! done. Per peer and direction the messages are posted in order, a bounded number of posts in
//! flight at a time (so what the engine holds does not grow with the messages' length); a
//! receive's bytes are posted once its descriptor has come and matched, so the bytes of a
//! message that does not match (another length, another tag) never reach the caller's memory.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use oxccl_transport::{Link, RecvBuf, RecvInto, SendBuf, TransportError};

use super::descriptor::{self, Descriptor};
use super::op::{Message, Operation, Work};
use crate::error::Error;
use crate::trace::Recorder;
use crate::types::Rank;

/// The most bytes of one peer's messages in one direction posted and not yet completed (at
/// least [`MIN_IN_FLIGHT`] posts, at most [`MAX_IN_FLIGHT`]): enough to keep a link busy.
const IN_FLIGHT_BYTES: usize = 16 << 20;
const MIN_IN_FLIGHT: usize = 4;
const MAX_IN_FLIGHT: usize = 4096;
/// Receives up to this long take their bytes into memory of the batch's at once, and copy
/// them out once the descriptor (which arrives first) has matched; longer ones post their
/// bytes only then. Waiting for the descriptor before posting cost an 8-byte exchange over
/// shared memory about 0.15 µs (a pass more); the copy costs a few nanoseconds.
const BOUNCED: usize = 4096;

/// What a completion was for: a message's descriptor, or a slice of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Post {
    Descriptor,
    Slice,
}

/// A receive whose descriptor differs from the one that came.
pub(super) struct Mismatch {
    pub peer: Rank,
    pub op: String,
    pub ours: Descriptor,
    pub theirs: String,
}

struct Member {
    op: Operation,
    /// Its messages not yet done.
    left: usize,
    deadline: Instant,
    done: bool,
}

struct Item {
    /// The operation's id (see [`Batch::members`]).
    member: u64,
    lane: usize,
    msg: Message,
    /// A send's descriptor, encoded; or where a receive's peer's arrives. Boxed: its address
    /// stays put while a link reads or writes it.
    wire: Box<[u8; descriptor::LEN]>,
    /// Posts (descriptor and slices) made and not completed.
    pending: usize,
    /// Whether every post was made.
    posted: bool,
    /// Whether its descriptor was checked (a receive's bytes are posted only then, so that
    /// a message that does not match never lands in the caller's memory).
    checked: bool,
    /// A short receive's bytes, taken at once and copied out once checked ([`BOUNCED`]).
    bounce: Option<Vec<u8>>,
}

/// One peer and direction: the messages not yet wholly posted, in order.
struct Lane {
    peer: Rank,
    send: bool,
    items: VecDeque<u64>,
    /// The front item: whether its descriptor is posted, and the bytes posted.
    described: bool,
    off: usize,
    in_flight: usize,
}

/// The running point-to-point operations.
pub(super) struct Batch {
    pub serial: u64,
    /// Operations by id: the front one is `first_member`.
    members: VecDeque<Member>,
    first_member: u64,
    /// Messages by id: the front one is `first_item`; tokens carry an id's low 32 bits.
    items: VecDeque<Item>,
    first_item: u64,
    lanes: Vec<Lane>,
    slice: usize,
    window: usize,
    /// Descriptor memory of finished messages, for the next ones (a batch is kept for the
    /// next operations once it is done: allocations were a fifth of a small send's cost).
    /// Boxes, handed between items and this pool: their contents must not move while a link
    /// holds them.
    #[allow(clippy::vec_box)]
    wires: Vec<Box<[u8; descriptor::LEN]>>,
    /// Memory of finished short receives ([`Item::bounce`]), for the next ones.
    bounces: Vec<Vec<u8>>,
    /// The lanes the last [`Batch::join`] added messages to.
    pub joined: Vec<usize>,
}

// SAFETY: the items' pointers are running operations' messages (see `Operation`'s Send):
// memory its submitter keeps valid until the result is set, dereferenced only by links while
// the engine runs the operation.
unsafe impl Send for Batch {}

impl Batch {
    pub fn new(serial: u64, slice: usize) -> Batch {
        Batch {
            serial,
            members: VecDeque::new(),
            first_member: 0,
            items: VecDeque::new(),
            first_item: 0,
            lanes: Vec::new(),
            slice: 1,
            window: 0,
            wires: Vec::new(),
            bounces: Vec::new(),
            joined: Vec::new(),
        }
        .reuse(serial, slice)
    }

    /// This batch, done, as a new one numbered `serial` (keeping its memory).
    pub fn reuse(mut self, serial: u64, slice: usize) -> Batch {
        debug_assert!(self.is_empty() && self.items.is_empty());
        self.serial = serial;
        self.slice = slice.max(1);
        self.window = (IN_FLIGHT_BYTES / self.slice).clamp(MIN_IN_FLIGHT, MAX_IN_FLIGHT);
        self
    }

    /// Adds point-to-point operation `op`, due by `timeout` from now; [`Batch::joined`] then
    /// lists the lanes it added messages to (to feed). One without messages is settled at once.
    pub fn join(&mut self, op: Operation, timeout: Duration, recorder: &Recorder) {
        let id = self.first_member + self.members.len() as u64;
        let messages: &[Message] = match &op.work {
            Work::PointToPoint { messages, .. } => messages,
            _ => &[],
        };
        let mut touched = std::mem::take(&mut self.joined);
        touched.clear();
        let mut left = 0;
        for m in messages.iter().filter(|m| m.len > 0) {
            let lane = match self
                .lanes
                .iter()
                .position(|l| l.peer == m.peer && l.send == m.send)
            {
                Some(l) => l,
                None => {
                    self.lanes.push(Lane {
                        peer: m.peer,
                        send: m.send,
                        items: VecDeque::new(),
                        described: false,
                        off: 0,
                        in_flight: 0,
                    });
                    self.lanes.len() - 1
                }
            };
            let item = self.first_item + self.items.len() as u64;
            let mut wire = self
                .wires
                .pop()
                .unwrap_or_else(|| Box::new([0u8; descriptor::LEN]));
            *wire = if m.send {
                m.descriptor().encode()
            } else {
                [0u8; descriptor::LEN]
            };
            self.items.push_back(Item {
                member: id,
                lane,
                msg: *m,
                wire,
                pending: 0,
                posted: false,
                checked: m.send,
                bounce: (!m.send && m.len <= BOUNCED).then(|| {
                    let mut b = self.bounces.pop().unwrap_or_default();
                    b.resize(m.len, 0);
                    b
                }),
            });
            self.lanes[lane].items.push_back(item);
            if !touched.contains(&lane) {
                touched.push(lane);
            }
            left += 1;
        }
        if left == 0 {
            op.settle(recorder, Ok(()));
            return;
        }
        self.members.push_back(Member {
            op,
            left,
            deadline: Instant::now() + timeout,
            done: false,
        });
        // Receives first: a receive posted before its message arrives can take it straight
        // into its memory.
        touched.sort_by_key(|&l| self.lanes[l].send);
        self.joined = touched;
    }

    /// The lanes: peer of each.
    pub fn lane_peer(&self, lane: usize) -> Rank {
        self.lanes[lane].peer
    }

    /// Posts on `link` what `lane`'s window has room for.
    pub fn feed(&mut self, lane: usize, link: &mut dyn Link) -> Result<(), TransportError> {
        let serial = self.serial;
        let l = &mut self.lanes[lane];
        while l.in_flight < self.window {
            let Some(&id) = l.items.front() else { break };
            let item = &mut self.items[(id - self.first_item) as usize];
            if !l.described {
                let t = super::driver::p2p_token(serial, Post::Descriptor, id);
                // SAFETY: the descriptor is boxed in the item, which stays in the batch until
                // its posts complete; links are cancelled before a failed batch is dropped.
                unsafe {
                    if l.send {
                        link.post_send(t, SendBuf::new(item.wire.as_ptr(), descriptor::LEN))?;
                    } else {
                        link.post_recv(
                            t,
                            RecvInto::Memory(RecvBuf::new(item.wire.as_mut_ptr(), descriptor::LEN)),
                        )?;
                    }
                }
                l.described = true;
            } else {
                if !item.checked && item.bounce.is_none() {
                    break; // a receive whose descriptor has not come yet
                }
                let n = self.slice.min(item.msg.len - l.off);
                // SAFETY: `off + n <= len`: within the caller's message, which its submitter
                // keeps valid until the operation is settled (after this post completes), or
                // within the bounce memory of its length, which the item keeps until then.
                let p = unsafe {
                    match item.bounce.as_mut() {
                        Some(b) => b.as_mut_ptr().add(l.off),
                        None => item.msg.ptr.add(l.off),
                    }
                };
                let t = super::driver::p2p_token(serial, Post::Slice, id);
                // SAFETY: as above.
                unsafe {
                    if l.send {
                        link.post_send(t, SendBuf::new(p, n))?;
                    } else {
                        link.post_recv(t, RecvInto::Memory(RecvBuf::new(p, n)))?;
                    }
                }
                l.off += n;
                if l.off == item.msg.len {
                    item.posted = true;
                    l.items.pop_front();
                    (l.off, l.described) = (0, false);
                }
            }
            item.pending += 1;
            l.in_flight += 1;
        }
        Ok(())
    }

    /// Handles the completion of a post (`index`: the low 32 bits of its message's id);
    /// settles the operation whose last message it finished. Returns the lane to feed.
    pub fn complete(
        &mut self,
        post: Post,
        index: u32,
        recorder: &Recorder,
    ) -> Result<Option<usize>, Mismatch> {
        let offset = index.wrapping_sub(self.first_item as u32) as usize;
        let Some(item) = self.items.get_mut(offset) else {
            return Ok(None); // not a live message's: cannot happen, ignore
        };
        if item.pending == 0 {
            return Ok(None);
        }
        item.pending -= 1;
        let lane = item.lane;
        self.lanes[lane].in_flight = self.lanes[lane].in_flight.saturating_sub(1);
        let member = (item.member - self.first_member) as usize;
        if post == Post::Descriptor && !item.msg.send {
            let ours = item.msg.descriptor();
            match Descriptor::decode(&item.wire[..]) {
                Some(theirs) if ours.matches(&theirs) => item.checked = true,
                theirs => {
                    return Err(Mismatch {
                        peer: item.msg.peer,
                        op: self.members[member].op.name.to_string(),
                        ours,
                        theirs: theirs.map_or("something that is not an oxccl call".into(), |d| {
                            d.to_string()
                        }),
                    });
                }
            }
        }
        if item.posted && item.pending == 0 {
            if let Some(b) = item.bounce.take() {
                // The descriptor came first and matched (a mismatch returned above).
                debug_assert!(item.checked);
                // SAFETY: the caller's receive memory, valid for its length until the
                // operation is settled (below); the bounce memory is the batch's.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), item.msg.ptr, b.len()) };
                self.bounces.push(b);
            }
            let m = &mut self.members[member];
            m.left -= 1;
            if m.left == 0 {
                m.done = true;
                m.op.settle(recorder, Ok(()));
            }
            self.trim();
        }
        Ok(Some(lane))
    }

    /// Drops the finished messages and operations at the front.
    fn trim(&mut self) {
        while self
            .items
            .front()
            .is_some_and(|i| i.posted && i.pending == 0)
        {
            if let Some(i) = self.items.pop_front() {
                self.wires.push(i.wire);
            }
            self.first_item += 1;
        }
        while self.members.front().is_some_and(|m| m.done) {
            self.members.pop_front();
            self.first_member += 1;
        }
    }

    /// Whether every operation is settled.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The first operation not yet settled.
    pub fn head(&self) -> Option<&Operation> {
        self.members.iter().find(|m| !m.done).map(|m| &m.op)
    }

    /// When the first operation not yet settled is due.
    pub fn deadline(&self) -> Option<Instant> {
        self.members.iter().find(|m| !m.done).map(|m| m.deadline)
    }

    /// The peer this batch waits for: that of the first unfinished message (of the first
    /// operation not yet settled).
    pub fn waited_for(&self) -> Option<Rank> {
        self.items
            .iter()
            .find(|i| !i.posted || i.pending > 0)
            .map(|i| i.msg.peer)
    }

    /// The first operation not yet settled with an unfinished message to or from `peer`
    /// (the one a failure of that peer concerns first); with no peer, the first not yet
    /// settled.
    fn blamed(&self, peer: Option<Rank>) -> Option<usize> {
        match peer {
            Some(p) => {
                let item = self
                    .items
                    .iter()
                    .find(|i| i.msg.peer == p && (!i.posted || i.pending > 0))?;
                Some((item.member - self.first_member) as usize)
            }
            None => self.members.iter().position(|m| !m.done),
        }
    }

    /// The name of the operation a failure of `peer` concerns ([`Batch::blamed`]), else of
    /// the first not yet settled.
    pub fn name_for(&self, peer: Rank) -> Option<String> {
        let m = self.blamed(Some(peer)).or_else(|| self.blamed(None))?;
        Some(self.members[m].op.name.to_string())
    }

    /// Whether a message to or from `peer` is unfinished.
    pub fn uses(&self, peer: Rank) -> bool {
        self.lanes
            .iter()
            .any(|l| l.peer == peer && (l.in_flight > 0 || !l.items.is_empty()))
    }

    /// The descriptor of the first unfinished message, for errors.
    pub fn first_descriptor(&self) -> Option<Descriptor> {
        self.items
            .iter()
            .find(|i| !i.posted || i.pending > 0)
            .map(|i| i.msg.descriptor())
    }

    /// Settles every operation not yet settled: the one `error` concerns (the first with an
    /// unfinished message to or from the peer it names; the first, if it names none) with
    /// `error`, the others as aborted because of `why`. Returns `error` if it concerns none
    /// (it goes to the next queued operation). Links must be cancelled first.
    #[must_use]
    pub fn fail(
        self,
        rank: Rank,
        mut error: Option<Error>,
        why: &str,
        recorder: &Recorder,
    ) -> Option<Error> {
        let peer = match &error {
            Some(
                Error::Mismatch { peer, .. }
                | Error::PeerFailed { peer, .. }
                | Error::Timeout {
                    peer: Some(peer), ..
                },
            ) => Some(*peer),
            _ => None,
        };
        let blamed = self.blamed(peer);
        // Not kept for reuse: links may still hold its descriptors until they are dropped.
        for (i, m) in self
            .members
            .into_iter()
            .enumerate()
            .filter(|(_, m)| !m.done)
        {
            let e = match error.take_if(|_| Some(i) == blamed) {
                Some(e) => e,
                None => Error::Aborted {
                    rank,
                    op: m.op.name.to_string(),
                    why: why.to_string(),
                },
            };
            m.op.settle(recorder, Err(e));
        }
        error
    }
}
