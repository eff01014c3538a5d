//! Point-to-point messages, alone or in groups (NCCL's `ncclGroupStart`/`ncclGroupEnd`): every
//! send and receive of a group is posted at once, so paired exchanges (`send` to a peer that
//! also sends to you) cannot deadlock. Messages between two ranks match in the order posted,
//! whatever the groups: the k-th send to a peer pairs with the peer's k-th receive from this
//! rank, and a receive whose length differs fails with a mismatch naming both. Started sends
//! and receives ([`Communicator::send_async`], [`Communicator::recv_async`]) run together with
//! the point-to-point operations queued around them.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::exec::op::{Message, OpName, OpResult, Operation, Work};
use crate::types::{Element, Rank};

use super::Communicator;

/// A group of sends and receives that run together; built by [`Communicator::group`], run by
/// [`Group::run`]. The buffers stay borrowed until then.
pub struct Group<'a> {
    comm: &'a Communicator,
    /// (peer, send?, memory, length) in the order added.
    ops: Vec<(Rank, bool, *mut u8, usize, u32)>,
    _borrows: PhantomData<&'a mut [u8]>,
}

impl Communicator {
    /// An empty group of point-to-point operations.
    pub fn group(&self) -> Group<'_> {
        Group {
            comm: self,
            ops: Vec::new(),
            _borrows: PhantomData,
        }
    }

    /// Sends `buf` to `peer`, which must post a matching [`Communicator::recv`] of the same
    /// length. Returns once the data has left `buf`.
    pub fn send<T: Element>(&self, buf: &[T], peer: Rank) -> Result<()> {
        let mut g = self.group();
        g.send(buf, peer)?;
        g.run()
    }

    /// Receives into `buf` what `peer` sends with a matching [`Communicator::send`].
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: Rank) -> Result<()> {
        let mut g = self.group();
        g.recv(buf, peer)?;
        g.run()
    }
}

impl Communicator {
    /// Fails unless `peer` is a rank of this communicator (`what`: the call, for the error).
    pub(crate) fn check_peer(&self, peer: Rank, what: &str) -> Result<()> {
        if peer >= self.size() {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {what}: peer {peer} is not a rank of this communicator of {}",
                self.rank(),
                self.size()
            )));
        }
        Ok(())
    }
}

impl<'a> Group<'a> {
    fn check_peer(&self, peer: Rank, what: &str) -> Result<()> {
        self.comm.check_peer(peer, what)
    }

    /// Adds a send of `buf` to `peer`.
    pub fn send<T: Element>(&mut self, buf: &'a [T], peer: Rank) -> Result<&mut Self> {
        self.check_peer(peer, "send")?;
        let b: &[u8] = bytemuck::cast_slice(buf);
        self.ops
            .push((peer, true, b.as_ptr() as *mut u8, b.len(), 0));
        Ok(self)
    }

    /// Adds a receive from `peer` into `buf`.
    pub fn recv<T: Element>(&mut self, buf: &'a mut [T], peer: Rank) -> Result<&mut Self> {
        self.check_peer(peer, "recv")?;
        let b: &mut [u8] = bytemuck::cast_slice_mut(buf);
        self.ops.push((peer, false, b.as_mut_ptr(), b.len(), 0));
        Ok(self)
    }

    /// Runs every operation of the group and waits for all of them.
    pub fn run(self) -> Result<()> {
        // SAFETY: every buffer is borrowed by this group for 'a (sends shared, receives
        // exclusive), and this waits for the operation before the borrows end.
        let result = unsafe { self.comm.submit_point_to_point(&self.ops) }?;
        match result {
            Some(r) => {
                self.comm.inner.wait(&r);
                r.take().unwrap_or(Ok(()))
            }
            None => Ok(()),
        }
    }
}

impl Communicator {
    /// Copies the messages to this rank itself and queues the others as one point-to-point
    /// operation; `None` when nothing goes to another rank. `ops` holds (peer, send?, memory,
    /// length, tag); the peers are in range.
    ///
    /// # Safety
    ///
    /// Each message's memory is valid for its length (read for a send, written for a receive),
    /// receives overlap nothing else, and stays so until the returned operation is done.
    pub(crate) unsafe fn submit_point_to_point(
        &self,
        ops: &[(Rank, bool, *mut u8, usize, u32)],
    ) -> Result<Option<Arc<OpResult>>> {
        let comm = self;
        let me = comm.rank();
        // Messages to oneself: the k-th send pairs with the k-th receive; copy directly.
        let sends: Vec<_> = ops.iter().filter(|o| o.0 == me && o.1).collect();
        let recvs: Vec<_> = ops.iter().filter(|o| o.0 == me && !o.1).collect();
        if sends.len() != recvs.len() {
            return Err(Error::InvalidArgument(format!(
                "rank {me}: group: {} sends to self but {} receives from self",
                sends.len(),
                recvs.len()
            )));
        }
        for (s, r) in sends.iter().zip(&recvs) {
            if s.4 != r.4 {
                return Err(Error::InvalidArgument(format!(
                    "rank {me}: group: a send to self with tag {} meets a receive with tag {}",
                    s.4, r.4
                )));
            }
            if s.3 != r.3 {
                return Err(Error::InvalidArgument(format!(
                    "rank {me}: group: a send to self of {} bytes meets a receive of {} bytes",
                    s.3, r.3
                )));
            }
            // SAFETY: the caller's contract: both are valid for their length, and a receive
            // overlaps nothing else (`copy` rather than `copy_nonoverlapping` all the same).
            unsafe { std::ptr::copy(s.2, r.2, s.3) };
        }
        let slice = comm.inner.means.slice_bytes.max(1);
        let mut messages = Vec::new();
        let mut peers: Vec<Rank> = Vec::new();
        let mut st = comm.inner.lock();
        for &(peer, send, ptr, len, tag) in ops.iter().filter(|o| o.0 != me && o.3 > 0) {
            if !peers.contains(&peer) {
                peers.push(peer);
            }
            // Numbered per peer and direction under the lock that orders submissions, so the
            // k-th send to a peer carries number k whatever groups it went in.
            let count = if send {
                &mut st.sent[peer]
            } else {
                &mut st.received[peer]
            };
            let seq = *count;
            *count += 1;
            messages.push(Message {
                peer,
                send,
                ptr,
                len,
                seq,
                tag,
            });
        }
        if messages.is_empty() {
            return Ok(None);
        }
        let result = Arc::new(OpResult::default());
        for &p in &peers {
            st.groups[p] += 1;
        }
        let mark = comm
            .inner
            .trace
            .point_to_point(st.groups[peers[0]] - 1, &peers);
        st.engine.submit(Operation {
            name: OpName::PointToPoint(peers),
            work: Work::PointToPoint { messages, slice },
            input: (std::ptr::null(), 0),
            output: (std::ptr::null_mut(), 0),
            result: result.clone(),
            mark,
        });
        Ok(Some(result))
    }
}
