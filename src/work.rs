//! Asynchronous operations: a call that returns at once with a [`Work`] handle owning the
//! buffers, which come back from [`Work::wait`]. Because the handle owns them, safe Rust cannot
//! read or write a buffer while the collective still uses it; dropping an unfinished handle
//! waits for the operation first.

use std::sync::Arc;

use crate::algo::{Collective, Plan};
use crate::comm::{Communicator, Inner};
use crate::error::{Error, Result};
use crate::exec::op::OpResult;
use crate::types::{Element, Rank, ReduceOp};

mod sealed {
    pub trait Sealed {}
}

/// A buffer an asynchronous operation may own: `Vec<T>` or `Box<[T]>`, whose memory does not
/// move when the value does.
pub trait OwnedBuffer<T: Element>: sealed::Sealed + Send + 'static {
    /// The elements.
    fn elements(&mut self) -> &mut [T];
}

impl<T: Element> sealed::Sealed for Vec<T> {}
impl<T: Element> OwnedBuffer<T> for Vec<T> {
    fn elements(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Element> sealed::Sealed for Box<[T]> {}
impl<T: Element> OwnedBuffer<T> for Box<[T]> {
    fn elements(&mut self) -> &mut [T] {
        self
    }
}

/// The handle of an asynchronous operation, owning its buffers `B` until it finishes.
#[must_use = "an operation's result is only known through wait()"]
pub struct Work<B> {
    inner: Arc<Inner>,
    result: Arc<OpResult>,
    buffers: Option<B>,
}

impl<B> Work<B> {
    /// Waits for the operation and returns its buffers, or its error.
    pub fn wait(mut self) -> Result<B> {
        self.inner.wait(&self.result);
        let r = self.result.take().unwrap_or(Ok(()));
        let buffers = self.buffers.take().expect("buffers are only taken here");
        r.map(|()| buffers)
    }

    /// Whether the operation has finished (successfully or not); helps it along if nobody else
    /// is driving.
    pub fn is_completed(&self) -> bool {
        if !self.result.is_done() {
            self.inner.poke();
        }
        self.result.is_done()
    }
}

impl<B> Drop for Work<B> {
    fn drop(&mut self) {
        if self.buffers.is_some() {
            // The operation may still read or write the buffers: let it finish first.
            self.inner.wait(&self.result);
        }
    }
}

fn raw<T: Element>(s: &mut [T]) -> (*mut u8, usize) {
    let b: &mut [u8] = bytemuck::cast_slice_mut(s);
    (b.as_mut_ptr(), b.len())
}

impl Communicator {
    fn work<B>(&self, result: Arc<OpResult>, buffers: B) -> Work<B> {
        Work {
            inner: self.inner.clone(),
            result,
            buffers: Some(buffers),
        }
    }

    fn async_invalid(&self, c: Collective, why: String) -> Error {
        Error::InvalidArgument(format!("rank {}: {c}: {why}", self.rank()))
    }

    /// Starts an in-place all-reduce of `buf`; [`Work::wait`] returns it reduced.
    pub fn all_reduce_async<T: Element, B: OwnedBuffer<T>>(
        &self,
        mut buf: B,
        op: ReduceOp,
    ) -> Result<Work<B>> {
        let c = Collective::AllReduce;
        if !op.supports(T::DTYPE) {
            return Err(
                self.async_invalid(c, format!("operator {op} is not defined on {}", T::DTYPE))
            );
        }
        let (p, len) = raw(buf.elements());
        let plan = Plan::new(c, len / T::DTYPE.size(), T::DTYPE)
            .op(op)
            .in_place(true);
        let result = self.start(plan, (p, len), (p, len))?;
        Ok(self.work(result, buf))
    }

    /// Starts an in-place broadcast of the root's `buf`.
    pub fn broadcast_async<T: Element, B: OwnedBuffer<T>>(
        &self,
        mut buf: B,
        root: Rank,
    ) -> Result<Work<B>> {
        let c = Collective::Broadcast;
        if root >= self.size() {
            return Err(
                self.async_invalid(c, format!("root {root} is not a rank of {}", self.size()))
            );
        }
        let (p, len) = raw(buf.elements());
        let plan = Plan::new(c, len / T::DTYPE.size(), T::DTYPE)
            .root(root)
            .in_place(true);
        let result = self.start(plan, (p, len), (p, len))?;
        Ok(self.work(result, buf))
    }

    /// Starts an all-gather of `send` into `recv` (n × `send` elements).
    pub fn all_gather_async<T: Element, B: OwnedBuffer<T>>(
        &self,
        mut send: B,
        mut recv: B,
    ) -> Result<Work<(B, B)>> {
        let c = Collective::AllGather;
        let (s, sl) = raw(send.elements());
        let (r, rl) = raw(recv.elements());
        if rl != sl * self.size() {
            return Err(self.async_invalid(
                c,
                format!("recv has {rl} bytes, expected {}", sl * self.size()),
            ));
        }
        let result = self.start(
            Plan::new(c, sl / T::DTYPE.size(), T::DTYPE),
            (s, sl),
            (r, rl),
        )?;
        Ok(self.work(result, (send, recv)))
    }

    /// Starts a reduce-scatter of `send` (n × `recv` elements) into `recv`.
    pub fn reduce_scatter_async<T: Element, B: OwnedBuffer<T>>(
        &self,
        mut send: B,
        mut recv: B,
        op: ReduceOp,
    ) -> Result<Work<(B, B)>> {
        let c = Collective::ReduceScatter;
        if !op.supports(T::DTYPE) {
            return Err(
                self.async_invalid(c, format!("operator {op} is not defined on {}", T::DTYPE))
            );
        }
        let (s, sl) = raw(send.elements());
        let (r, rl) = raw(recv.elements());
        if sl != rl * self.size() {
            return Err(self.async_invalid(
                c,
                format!("send has {sl} bytes, expected {}", rl * self.size()),
            ));
        }
        let plan = Plan::new(c, rl / T::DTYPE.size(), T::DTYPE).op(op);
        let result = self.start(plan, (s, sl), (r, rl))?;
        Ok(self.work(result, (send, recv)))
    }

    /// Starts an all-to-all of `send` into `recv` (equal lengths, divisible by n).
    pub fn all_to_all_async<T: Element, B: OwnedBuffer<T>>(
        &self,
        mut send: B,
        mut recv: B,
    ) -> Result<Work<(B, B)>> {
        let c = Collective::AllToAll;
        let (s, sl) = raw(send.elements());
        let (r, rl) = raw(recv.elements());
        let elems = sl / T::DTYPE.size();
        if sl != rl || elems % self.size() != 0 {
            return Err(self.async_invalid(
                c,
                format!(
                    "send and recv must hold equal multiples of {} elements",
                    self.size()
                ),
            ));
        }
        let result = self.start(
            Plan::new(c, elems / self.size(), T::DTYPE),
            (s, sl),
            (r, rl),
        )?;
        Ok(self.work(result, (send, recv)))
    }

    /// Starts sending `buf` to `peer` (MPI's `MPI_Isend`, torch's `isend`); [`Work::wait`]
    /// gives it back once its data has left it. The k-th message this rank sends to a peer
    /// pairs with the k-th the peer receives from it, however either side started them, and
    /// started sends and receives run together: a send started before a receive from the same
    /// peer does not keep the receive waiting, so two ranks may both start their send first.
    pub fn send_async<T: Element, B: OwnedBuffer<T>>(
        &self,
        mut buf: B,
        peer: Rank,
    ) -> Result<Work<B>> {
        let (p, len) = raw(buf.elements());
        let result = self.start_message(peer, true, p, len)?;
        Ok(self.work(result, buf))
    }

    /// Starts receiving into `buf` what `peer` sends ([`Communicator::send_async`]'s
    /// counterpart); [`Work::wait`] gives it back filled.
    pub fn recv_async<T: Element, B: OwnedBuffer<T>>(
        &self,
        mut buf: B,
        peer: Rank,
    ) -> Result<Work<B>> {
        let (p, len) = raw(buf.elements());
        let result = self.start_message(peer, false, p, len)?;
        Ok(self.work(result, buf))
    }

    /// Queues one send or receive of the `len` bytes at `p`, owned by the caller's [`Work`].
    fn start_message(
        &self,
        peer: Rank,
        send: bool,
        p: *mut u8,
        len: usize,
    ) -> Result<Arc<OpResult>> {
        let what = if send { "send" } else { "recv" };
        self.check_peer(peer, what)?;
        if peer == self.rank() {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {what} to or from itself: pair it with its counterpart in one group \
                 (Communicator::group)",
                self.rank()
            )));
        }
        // SAFETY: the Work returned with this result owns the buffer (a send's only read, a
        // receive's written only by this operation) and waits for the operation before it
        // gives the buffer back or drops it.
        let result = unsafe { self.submit_point_to_point(&[(peer, send, p, len, 0)]) }?;
        match result {
            Some(r) => {
                self.inner.kick();
                Ok(r)
            }
            None => Ok(Arc::new(OpResult::succeeded())),
        }
    }

    /// Starts a barrier.
    pub fn barrier_async(&self) -> Result<Work<()>> {
        let plan = Plan::new(Collective::Barrier, 0, crate::types::DataType::U8);
        let result = self.start(plan, (std::ptr::null(), 0), (std::ptr::null_mut(), 0))?;
        Ok(self.work(result, ()))
    }
}
