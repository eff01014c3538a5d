//! The collectives, on typed slices and on raw bytes with a [`DataType`]. Each method checks its
//! arguments (errors name this rank and the call), builds a [`Plan`] and runs it; lengths are in
//! elements as in nccl.h (see [`Collective`] for what each buffer holds).
//!
//! Arguments that only matter on one rank (the root's buffers of a rooted collective) are
//! ignored elsewhere, as in NCCL: pass an empty slice there.

use crate::algo::{Collective, Plan};
use crate::error::{Error, Result};
use crate::types::{DataType, Element, Rank, ReduceOp};

use super::Communicator;

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// Raw (pointer, length) of an input.
fn input(s: &[u8]) -> (*const u8, usize) {
    (s.as_ptr(), s.len())
}

/// Raw (pointer, length) of an output.
fn output(s: &mut [u8]) -> (*mut u8, usize) {
    (s.as_mut_ptr(), s.len())
}

const NONE_IN: (*const u8, usize) = (std::ptr::null(), 0);
const NONE_OUT: (*mut u8, usize) = (std::ptr::null_mut(), 0);

impl Communicator {
    pub(super) fn invalid(&self, c: Collective, why: String) -> Error {
        Error::InvalidArgument(format!("rank {}: {c}: {why}", self.rank()))
    }

    /// Elements in `len` bytes of `dtype`, or an error naming the buffer.
    #[inline]
    pub(super) fn elements(
        &self,
        c: Collective,
        what: &str,
        len: usize,
        dtype: DataType,
    ) -> Result<usize> {
        if !len.is_multiple_of(dtype.size()) {
            return Err(self.invalid(
                c,
                format!("{what} has {len} bytes, not a whole number of {dtype} elements"),
            ));
        }
        Ok(len / dtype.size())
    }

    #[inline]
    pub(super) fn expect(
        &self,
        c: Collective,
        what: &str,
        len: usize,
        want: usize,
        dtype: DataType,
    ) -> Result<()> {
        if len != want {
            return Err(self.invalid(
                c,
                format!(
                    "{what} has {} elements of {dtype}, expected {}",
                    len / dtype.size(),
                    want / dtype.size()
                ),
            ));
        }
        Ok(())
    }

    #[inline]
    pub(super) fn check_op(&self, c: Collective, op: ReduceOp, dtype: DataType) -> Result<()> {
        if !op.supports(dtype) {
            return Err(self.invalid(c, format!("operator {op} is not defined on {dtype}")));
        }
        Ok(())
    }

    #[inline]
    pub(super) fn check_root(&self, c: Collective, root: Rank) -> Result<()> {
        if root >= self.size() {
            return Err(self.invalid(
                c,
                format!(
                    "root {root} is not a rank of this communicator of {}",
                    self.size()
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn check_divisible(&self, c: Collective, what: &str, elems: usize) -> Result<usize> {
        if !elems.is_multiple_of(self.size()) {
            return Err(self.invalid(
                c,
                format!(
                    "{what} has {elems} elements, not a multiple of {} ranks",
                    self.size()
                ),
            ));
        }
        Ok(elems / self.size())
    }

    // ---------------------------------------------------------------------------------------
    // all-reduce

    /// Every rank's `recv` becomes the element-wise `op` of every rank's `send`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_bytes(bytes(send), bytes_mut(recv), T::DTYPE, op)
    }

    /// [`Communicator::all_reduce`] with `buf` as both input and output.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_in_place_bytes(bytes_mut(buf), T::DTYPE, op)
    }

    /// [`Communicator::all_reduce`] on raw bytes holding elements of `dtype`.
    pub fn all_reduce_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let c = Collective::AllReduce;
        self.check_op(c, op, dtype)?;
        let count = self.elements(c, "send", send.len(), dtype)?;
        self.expect(c, "recv", recv.len(), send.len(), dtype)?;
        self.run(Plan::new(c, count, dtype).op(op), input(send), output(recv))
    }

    /// [`Communicator::all_reduce_in_place`] on raw bytes.
    pub fn all_reduce_in_place_bytes(
        &self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let c = Collective::AllReduce;
        self.check_op(c, op, dtype)?;
        let count = self.elements(c, "buf", buf.len(), dtype)?;
        let b = output(buf);
        self.run(
            Plan::new(c, count, dtype).op(op).in_place(true),
            (b.0, b.1),
            b,
        )
    }

    // ---------------------------------------------------------------------------------------
    // reduce

    /// The root's `recv` becomes the element-wise `op` of every rank's `send` (`recv` is
    /// ignored on other ranks).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        self.reduce_bytes(bytes(send), bytes_mut(recv), T::DTYPE, op, root)
    }

    /// [`Communicator::reduce`] with `buf` as input everywhere and output at the root.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        self.reduce_in_place_bytes(bytes_mut(buf), T::DTYPE, op, root)
    }

    /// [`Communicator::reduce`] on raw bytes.
    pub fn reduce_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        let c = Collective::Reduce;
        self.check_op(c, op, dtype)?;
        self.check_root(c, root)?;
        let count = self.elements(c, "send", send.len(), dtype)?;
        let out = if self.rank() == root {
            self.expect(c, "recv at the root", recv.len(), send.len(), dtype)?;
            output(recv)
        } else {
            NONE_OUT
        };
        self.run(
            Plan::new(c, count, dtype).op(op).root(root),
            input(send),
            out,
        )
    }

    /// [`Communicator::reduce_in_place`] on raw bytes.
    pub fn reduce_in_place_bytes(
        &self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        let c = Collective::Reduce;
        self.check_op(c, op, dtype)?;
        self.check_root(c, root)?;
        let count = self.elements(c, "buf", buf.len(), dtype)?;
        let b = output(buf);
        self.run(
            Plan::new(c, count, dtype).op(op).root(root).in_place(true),
            (b.0, b.1),
            b,
        )
    }

    // ---------------------------------------------------------------------------------------
    // broadcast

    /// Every rank's `recv` becomes the root's `send` (`send` is ignored on other ranks).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: Rank) -> Result<()> {
        self.broadcast_bytes(bytes(send), bytes_mut(recv), T::DTYPE, root)
    }

    /// Every rank's `buf` becomes the root's `buf` (NCCL's `ncclBcast`, torch's `broadcast`).
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: Rank) -> Result<()> {
        self.broadcast_in_place_bytes(bytes_mut(buf), T::DTYPE, root)
    }

    /// [`Communicator::broadcast`] on raw bytes.
    pub fn broadcast_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        root: Rank,
    ) -> Result<()> {
        let c = Collective::Broadcast;
        self.check_root(c, root)?;
        let count = self.elements(c, "recv", recv.len(), dtype)?;
        let inp = if self.rank() == root {
            self.expect(c, "send at the root", send.len(), recv.len(), dtype)?;
            input(send)
        } else {
            NONE_IN
        };
        self.run(Plan::new(c, count, dtype).root(root), inp, output(recv))
    }

    /// [`Communicator::broadcast_in_place`] on raw bytes.
    pub fn broadcast_in_place_bytes(
        &self,
        buf: &mut [u8],
        dtype: DataType,
        root: Rank,
    ) -> Result<()> {
        let c = Collective::Broadcast;
        self.check_root(c, root)?;
        let count = self.elements(c, "buf", buf.len(), dtype)?;
        let b = output(buf);
        self.run(
            Plan::new(c, count, dtype).root(root).in_place(true),
            (b.0, b.1),
            b,
        )
    }

    // ---------------------------------------------------------------------------------------
    // all-gather and reduce-scatter

    /// Every rank's `recv` (n × `send.len()` elements) becomes all ranks' `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.all_gather_bytes(bytes(send), bytes_mut(recv), T::DTYPE)
    }

    /// [`Communicator::all_gather`] where this rank's input is already block `rank` of `buf`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.all_gather_in_place_bytes(bytes_mut(buf), T::DTYPE)
    }

    /// [`Communicator::all_gather`] on raw bytes.
    pub fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8], dtype: DataType) -> Result<()> {
        let c = Collective::AllGather;
        let count = self.elements(c, "send", send.len(), dtype)?;
        self.expect(c, "recv", recv.len(), send.len() * self.size(), dtype)?;
        self.run(Plan::new(c, count, dtype), input(send), output(recv))
    }

    /// [`Communicator::all_gather_in_place`] on raw bytes.
    pub fn all_gather_in_place_bytes(&self, buf: &mut [u8], dtype: DataType) -> Result<()> {
        let c = Collective::AllGather;
        let total = self.elements(c, "buf", buf.len(), dtype)?;
        let count = self.check_divisible(c, "buf", total)?;
        let b = output(buf);
        self.run(Plan::new(c, count, dtype).in_place(true), (b.0, b.1), b)
    }

    /// Rank r's `recv` becomes block r of the element-wise `op` of every rank's `send`
    /// (n × `recv.len()` elements).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_scatter_bytes(bytes(send), bytes_mut(recv), T::DTYPE, op)
    }

    /// [`Communicator::reduce_scatter`] whose result lands in block `rank` of `buf`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.reduce_scatter_in_place_bytes(bytes_mut(buf), T::DTYPE, op)
    }

    /// [`Communicator::reduce_scatter`] on raw bytes.
    pub fn reduce_scatter_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let c = Collective::ReduceScatter;
        self.check_op(c, op, dtype)?;
        let count = self.elements(c, "recv", recv.len(), dtype)?;
        self.expect(c, "send", send.len(), recv.len() * self.size(), dtype)?;
        self.run(Plan::new(c, count, dtype).op(op), input(send), output(recv))
    }

    /// [`Communicator::reduce_scatter_in_place`] on raw bytes.
    pub fn reduce_scatter_in_place_bytes(
        &self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let c = Collective::ReduceScatter;
        self.check_op(c, op, dtype)?;
        let total = self.elements(c, "buf", buf.len(), dtype)?;
        let count = self.check_divisible(c, "buf", total)?;
        let b = output(buf);
        self.run(
            Plan::new(c, count, dtype).op(op).in_place(true),
            (b.0, b.1),
            b,
        )
    }

    // ---------------------------------------------------------------------------------------
    // gather, scatter, all-to-all, barrier

    /// The root's `recv` (n × `send.len()` elements) becomes every rank's `send`, in rank order
    /// (`recv` is ignored on other ranks).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: Rank) -> Result<()> {
        self.gather_bytes(bytes(send), bytes_mut(recv), T::DTYPE, root)
    }

    /// [`Communicator::gather`] on raw bytes.
    pub fn gather_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        root: Rank,
    ) -> Result<()> {
        let c = Collective::Gather;
        self.check_root(c, root)?;
        let count = self.elements(c, "send", send.len(), dtype)?;
        let out = if self.rank() == root {
            self.expect(
                c,
                "recv at the root",
                recv.len(),
                send.len() * self.size(),
                dtype,
            )?;
            output(recv)
        } else {
            NONE_OUT
        };
        self.run(Plan::new(c, count, dtype).root(root), input(send), out)
    }

    /// Rank r's `recv` becomes block r of the root's `send` (n × `recv.len()` elements; `send`
    /// is ignored on other ranks).
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: Rank) -> Result<()> {
        self.scatter_bytes(bytes(send), bytes_mut(recv), T::DTYPE, root)
    }

    /// [`Communicator::scatter`] on raw bytes.
    pub fn scatter_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        root: Rank,
    ) -> Result<()> {
        let c = Collective::Scatter;
        self.check_root(c, root)?;
        let count = self.elements(c, "recv", recv.len(), dtype)?;
        let inp = if self.rank() == root {
            self.expect(
                c,
                "send at the root",
                send.len(),
                recv.len() * self.size(),
                dtype,
            )?;
            input(send)
        } else {
            NONE_IN
        };
        self.run(Plan::new(c, count, dtype).root(root), inp, output(recv))
    }

    /// Block j of rank r's `send` becomes block r of rank j's `recv` (both n × count elements).
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.all_to_all_bytes(bytes(send), bytes_mut(recv), T::DTYPE)
    }

    /// [`Communicator::all_to_all`] with `buf` as both input and output.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.all_to_all_in_place_bytes(bytes_mut(buf), T::DTYPE)
    }

    /// [`Communicator::all_to_all`] on raw bytes.
    pub fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8], dtype: DataType) -> Result<()> {
        let c = Collective::AllToAll;
        let total = self.elements(c, "send", send.len(), dtype)?;
        let count = self.check_divisible(c, "send", total)?;
        self.expect(c, "recv", recv.len(), send.len(), dtype)?;
        self.run(Plan::new(c, count, dtype), input(send), output(recv))
    }

    /// [`Communicator::all_to_all_in_place`] on raw bytes.
    pub fn all_to_all_in_place_bytes(&self, buf: &mut [u8], dtype: DataType) -> Result<()> {
        let c = Collective::AllToAll;
        let total = self.elements(c, "buf", buf.len(), dtype)?;
        let count = self.check_divisible(c, "buf", total)?;
        let b = output(buf);
        self.run(Plan::new(c, count, dtype).in_place(true), (b.0, b.1), b)
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.run(
            Plan::new(Collective::Barrier, 0, DataType::U8),
            NONE_IN,
            NONE_OUT,
        )
    }
}
