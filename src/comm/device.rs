//! Collectives on CUDA device memory (feature `cuda`). Where every rank is in this process
//! (threads on one GPU), a call runs on the device between the ranks' buffers and returns once
//! enqueued (`native.rs`). Otherwise it is staged through host memory: the
//! communicator copies what the call reads from the device on the caller's stream (after
//! everything the stream already holds), runs the collective on the host engine like any
//! other, and enqueues the copy of the result back on the same stream, so the stream's later
//! work sees it. This is the first slice of the GPU path (issue 17): correct for every
//! collective, every transport and every placement of ranks, and the shape of the path between
//! hosts without GPUDirect (NCCL stages through host memory there too); reductions of device
//! data inside a host are still to move onto the device (`kernels/reduce.cu`), and the call is
//! not yet asynchronous: it returns once the result is on the device. The host copies are
//! page-locked buffers from a pool ([`Staging`]), reused from call to call.
//!
//! Each method mirrors the host one of the same name without `_device` (same checks, same
//! errors, lengths in bytes of `dtype` elements), takes device buffers as cudarc's
//! [`DeviceBuf`]/[`DeviceBufMut`] — cudarc's own buffers and views, sealed (so safe code cannot
//! pass a host address, or a length past its allocation, where a device buffer belongs) and the [`CudaStream`] the work is ordered on. Arguments that matter only at the
//! root are neither read nor written elsewhere.

use std::sync::Arc;

use crate::algo::{Collective, Plan};
use crate::error::{Error, Result};
use crate::reduce::cuda::{self, CudaStream, DeviceBuf, DeviceBufMut, Staging};
use crate::types::{DataType, Rank, ReduceOp};

use super::Communicator;

/// Enqueues the copy of `host` into device memory on `stream`.
fn upload<D: DeviceBufMut>(
    stream: &Arc<CudaStream>,
    host: &[u8],
    dst: &mut D,
) -> std::result::Result<(), String> {
    if host.is_empty() {
        return Ok(());
    }
    if dst.len() != host.len() {
        return Err(format!(
            "the device buffer has {} bytes where the result has {}",
            dst.len(),
            host.len()
        ));
    }
    stream
        .memcpy_htod(host, dst)
        .map_err(|e| format!("copying {} bytes to the device: {e}", host.len()))
}

impl Communicator {
    fn device_error(&self, c: Collective, why: String) -> Error {
        Error::Unavailable(format!(
            "rank {}: {c} on device memory: CUDA: {why}",
            self.rank()
        ))
    }

    /// A staging buffer of `len` bytes (page-locked where the driver gives it).
    fn staging(&self, c: Collective, stream: &Arc<CudaStream>, len: usize) -> Result<Staging> {
        if len > 0 {
            // Page-locked memory is allocated in the current context.
            stream
                .context()
                .bind_to_thread()
                .map_err(|e| self.device_error(c, format!("binding the stream's context: {e}")))?;
        }
        // SAFETY: the driver is loaded (the stream exists); every copy into or out of the buffer
        // is waited for before it is dropped (`download`, `upload_and_wait`), or it is abandoned.
        Ok(unsafe { Staging::new(len) })
    }

    /// Waits, for at most the communicator's timeout, until `stream` has run all it holds.
    fn wait(&self, c: Collective, stream: &Arc<CudaStream>, what: &str) -> Result<bool> {
        // SAFETY: the caller made the stream's context current on this thread (a copy on it
        // ran), so the driver is loaded; the stream lives as long as `stream`.
        let done = unsafe { cuda::wait_stream(stream.cu_stream(), self.timeout()) }?;
        if done {
            return Ok(true);
        }
        Err(Error::Timeout {
            rank: self.rank(),
            op: format!("{c} on device memory ({what})"),
            peer: None,
            after: self.timeout(),
        })
    }

    /// Copies device memory into a staging buffer, on `stream` after its earlier work; returns
    /// once the bytes are on the host, or fails when the stream has not got there within the
    /// communicator's timeout.
    fn download<S: DeviceBuf>(
        &self,
        c: Collective,
        stream: &Arc<CudaStream>,
        src: &S,
    ) -> Result<Staging> {
        let mut host = self.staging(c, stream, src.len())?;
        if host.is_empty() {
            return Ok(host);
        }
        if let Err(e) = stream.memcpy_dtoh(src, &mut *host) {
            // The copy may have been enqueued before the error: keep the buffer out of reuse.
            let len = host.len();
            host.abandon();
            return Err(self.device_error(c, format!("copying {len} bytes from the device: {e}")));
        }
        match self.wait(c, stream, "the CUDA stream's earlier work") {
            Ok(_) => Ok(host),
            Err(e) => {
                host.abandon();
                Err(e)
            }
        }
    }

    /// Copies `host` into `dst` on `stream` and waits for the copy, so that the staging buffer
    /// may go back to the pool (the stream's later work sees the result either way).
    fn upload_and_wait<D: DeviceBufMut>(
        &self,
        c: Collective,
        stream: &Arc<CudaStream>,
        host: Staging,
        dst: &mut D,
    ) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        if let Err(e) = upload(stream, &host, dst) {
            host.abandon();
            return Err(self.device_error(c, e));
        }
        match self.wait(c, stream, "the copy of the result to the device") {
            Ok(_) => Ok(()),
            Err(e) => {
                host.abandon();
                Err(e)
            }
        }
    }

    /// Out of place: stages `send` (None: this rank's input does not matter), runs `host` on
    /// host copies, and copies its output back into `recv` (None: this rank's output does not
    /// matter, and its device memory is left alone).
    fn staged<S, D>(
        &self,
        c: Collective,
        stream: &Arc<CudaStream>,
        send: Option<&S>,
        recv: Option<&mut D>,
        host: impl FnOnce(&Communicator, &[u8], &mut [u8]) -> Result<()>,
    ) -> Result<()>
    where
        S: DeviceBuf,
        D: DeviceBufMut,
    {
        let input = match send {
            Some(s) => self.download(c, stream, s)?,
            None => self.staging(c, stream, 0)?,
        };
        let mut output = self.staging(c, stream, recv.as_ref().map_or(0, |r| r.len()))?;
        host(self, &input, &mut output)?;
        drop(input);
        match recv {
            Some(r) => self.upload_and_wait(c, stream, output, r),
            None => Ok(()),
        }
    }

    /// In place: stages `buf`, runs `host` on the host copy, and copies it back.
    fn staged_in_place<D: DeviceBuf + DeviceBufMut>(
        &self,
        c: Collective,
        stream: &Arc<CudaStream>,
        buf: &mut D,
        host: impl FnOnce(&Communicator, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let mut b = self.download(c, stream, buf)?;
        host(self, &mut b)?;
        self.upload_and_wait(c, stream, b, buf)
    }

    /// Whether calls of this communicator may take the device path; if so, binds `stream`'s
    /// context to this thread for the deposit.
    fn native_ready(&self, c: Collective, stream: &Arc<CudaStream>) -> Result<bool> {
        if !self.device_native() {
            return Ok(false);
        }
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.device_error(c, format!("binding the stream's context: {e}")))?;
        Ok(true)
    }

    /// Runs `plan` on the device, between the ranks' buffers, when every rank is in this
    /// process (`native.rs`): `Ok(true)` when it did (enqueued on `stream`), `Ok(false)` when the
    /// call must be staged. `send`/`recv` are `None` where the plan does not use them on this rank.
    fn native<S: DeviceBuf, D: DeviceBufMut>(
        &self,
        plan: Plan,
        stream: &Arc<CudaStream>,
        send: Option<&S>,
        recv: Option<&mut D>,
    ) -> Result<bool> {
        if !self.native_ready(plan.collective, stream)? {
            return Ok(false);
        }
        let (s, _send_done) = match send {
            Some(b) => {
                let (p, g) = b.device_ptr(stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let (r, _recv_done) = match recv {
            Some(b) => {
                let (p, g) = b.device_ptr_mut(stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        // SAFETY: the context of `stream` is current; the buffers are live device memory of
        // cudarc's in it, of the sizes the plan was checked against, ordered on `stream` by the
        // guards (held until the call is complete, so their events come after its wait).
        match unsafe { self.device_deposit(plan, s, r, stream.cu_stream()) }? {
            None => Ok(false),
            Some(call) => call.complete(),
        }
    }

    /// [`Communicator::native`] in place: `buf` is both the input and the output.
    fn native_in_place<D: DeviceBufMut>(
        &self,
        plan: Plan,
        stream: &Arc<CudaStream>,
        buf: &mut D,
    ) -> Result<bool> {
        if !self.native_ready(plan.collective, stream)? {
            return Ok(false);
        }
        let (p, _done) = buf.device_ptr_mut(stream);
        // SAFETY: as in `native`.
        match unsafe { self.device_deposit(plan.in_place(true), p, p, stream.cu_stream()) }? {
            None => Ok(false),
            Some(call) => call.complete(),
        }
    }

    /// [`Communicator::all_reduce_bytes`] on device memory, ordered on `stream`.
    pub fn all_reduce_device<S: DeviceBuf, D: DeviceBufMut>(
        &self,
        send: &S,
        recv: &mut D,
        dtype: DataType,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllReduce;
        let count = self.elements(c, "send", send.len(), dtype)?;
        self.expect(c, "recv", recv.len(), send.len(), dtype)?;
        self.check_op(c, op, dtype)?;
        let plan = Plan::new(c, count, dtype).op(op);
        if self.native(plan, stream, Some(send), Some(&mut *recv))? {
            return Ok(());
        }
        self.staged(c, stream, Some(send), Some(recv), |c, i, o| {
            c.all_reduce_bytes(i, o, dtype, op)
        })
    }

    /// [`Communicator::all_reduce_in_place_bytes`] on device memory, ordered on `stream`.
    pub fn all_reduce_device_in_place<D: DeviceBuf + DeviceBufMut>(
        &self,
        buf: &mut D,
        dtype: DataType,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllReduce;
        let count = self.elements(c, "buf", buf.len(), dtype)?;
        self.check_op(c, op, dtype)?;
        if self.native_in_place(Plan::new(c, count, dtype).op(op), stream, buf)? {
            return Ok(());
        }
        self.staged_in_place(c, stream, buf, |c, b| {
            c.all_reduce_in_place_bytes(b, dtype, op)
        })
    }

    /// [`Communicator::broadcast_bytes`] on device memory, ordered on `stream` (`send` is read
    /// only at the root).
    pub fn broadcast_device<S: DeviceBuf, D: DeviceBufMut>(
        &self,
        send: &S,
        recv: &mut D,
        dtype: DataType,
        root: Rank,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::Broadcast;
        self.check_root(c, root)?;
        let count = self.elements(c, "recv", recv.len(), dtype)?;
        if self.rank() == root {
            self.expect(c, "send", send.len(), recv.len(), dtype)?;
        }
        let send = (self.rank() == root).then_some(send);
        let plan = Plan::new(c, count, dtype).root(root);
        if self.native(plan, stream, send, Some(&mut *recv))? {
            return Ok(());
        }
        self.staged(
            Collective::Broadcast,
            stream,
            send,
            Some(recv),
            |c, i, o| c.broadcast_bytes(i, o, dtype, root),
        )
    }

    /// [`Communicator::broadcast_in_place_bytes`] on device memory, ordered on `stream`.
    pub fn broadcast_device_in_place<D: DeviceBuf + DeviceBufMut>(
        &self,
        buf: &mut D,
        dtype: DataType,
        root: Rank,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::Broadcast;
        self.check_root(c, root)?;
        let count = self.elements(c, "buf", buf.len(), dtype)?;
        if self.native_in_place(Plan::new(c, count, dtype).root(root), stream, buf)? {
            return Ok(());
        }
        self.staged_in_place(Collective::Broadcast, stream, buf, |c, b| {
            c.broadcast_in_place_bytes(b, dtype, root)
        })
    }

    /// [`Communicator::reduce_bytes`] on device memory, ordered on `stream` (`recv` is written
    /// only at the root).
    pub fn reduce_device<S: DeviceBuf, D: DeviceBufMut>(
        &self,
        send: &S,
        recv: &mut D,
        dtype: DataType,
        op: ReduceOp,
        root: Rank,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::Reduce;
        self.check_root(c, root)?;
        self.check_op(c, op, dtype)?;
        let count = self.elements(c, "send", send.len(), dtype)?;
        if self.rank() == root {
            self.expect(c, "recv", recv.len(), send.len(), dtype)?;
        }
        let mut recv = (self.rank() == root).then_some(recv);
        let plan = Plan::new(c, count, dtype).op(op).root(root);
        if self.native(plan, stream, Some(send), recv.as_deref_mut())? {
            return Ok(());
        }
        self.staged(Collective::Reduce, stream, Some(send), recv, |c, i, o| {
            c.reduce_bytes(i, o, dtype, op, root)
        })
    }

    /// [`Communicator::reduce_in_place_bytes`] on device memory, ordered on `stream` (`buf` is
    /// written back only at the root).
    pub fn reduce_device_in_place<D: DeviceBuf + DeviceBufMut>(
        &self,
        buf: &mut D,
        dtype: DataType,
        op: ReduceOp,
        root: Rank,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::Reduce;
        self.check_root(c, root)?;
        self.check_op(c, op, dtype)?;
        let count = self.elements(c, "buf", buf.len(), dtype)?;
        if self.native_in_place(Plan::new(c, count, dtype).op(op).root(root), stream, buf)? {
            return Ok(());
        }
        if self.rank() != root {
            // A non-root's buffer is its input only: read, never written back.
            let mut input = self.download(Collective::Reduce, stream, buf)?;
            return self.reduce_in_place_bytes(&mut input, dtype, op, root);
        }
        self.staged_in_place(Collective::Reduce, stream, buf, |c, b| {
            c.reduce_in_place_bytes(b, dtype, op, root)
        })
    }

    /// [`Communicator::all_gather_bytes`] on device memory, ordered on `stream`.
    pub fn all_gather_device<S: DeviceBuf, D: DeviceBufMut>(
        &self,
        send: &S,
        recv: &mut D,
        dtype: DataType,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllGather;
        let count = self.elements(c, "send", send.len(), dtype)?;
        self.expect(c, "recv", recv.len(), send.len() * self.size(), dtype)?;
        if self.native(
            Plan::new(c, count, dtype),
            stream,
            Some(send),
            Some(&mut *recv),
        )? {
            return Ok(());
        }
        self.staged(
            Collective::AllGather,
            stream,
            Some(send),
            Some(recv),
            |c, i, o| c.all_gather_bytes(i, o, dtype),
        )
    }

    /// [`Communicator::all_gather_in_place_bytes`] on device memory, ordered on `stream`.
    pub fn all_gather_device_in_place<D: DeviceBuf + DeviceBufMut>(
        &self,
        buf: &mut D,
        dtype: DataType,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllGather;
        let total = self.elements(c, "buf", buf.len(), dtype)?;
        let count = self.check_divisible(c, "buf", total)?;
        if self.native_in_place(Plan::new(c, count, dtype), stream, buf)? {
            return Ok(());
        }
        self.staged_in_place(Collective::AllGather, stream, buf, |c, b| {
            c.all_gather_in_place_bytes(b, dtype)
        })
    }

    /// [`Communicator::reduce_scatter_bytes`] on device memory, ordered on `stream`.
    pub fn reduce_scatter_device<S: DeviceBuf, D: DeviceBufMut>(
        &self,
        send: &S,
        recv: &mut D,
        dtype: DataType,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::ReduceScatter;
        let count = self.elements(c, "recv", recv.len(), dtype)?;
        self.expect(c, "send", send.len(), recv.len() * self.size(), dtype)?;
        self.check_op(c, op, dtype)?;
        let plan = Plan::new(c, count, dtype).op(op);
        if self.native(plan, stream, Some(send), Some(&mut *recv))? {
            return Ok(());
        }
        self.staged(
            Collective::ReduceScatter,
            stream,
            Some(send),
            Some(recv),
            |c, i, o| c.reduce_scatter_bytes(i, o, dtype, op),
        )
    }

    /// [`Communicator::reduce_scatter_in_place_bytes`] on device memory, ordered on `stream`.
    pub fn reduce_scatter_device_in_place<D: DeviceBuf + DeviceBufMut>(
        &self,
        buf: &mut D,
        dtype: DataType,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::ReduceScatter;
        let total = self.elements(c, "buf", buf.len(), dtype)?;
        let count = self.check_divisible(c, "buf", total)?;
        self.check_op(c, op, dtype)?;
        if self.native_in_place(Plan::new(c, count, dtype).op(op), stream, buf)? {
            return Ok(());
        }
        self.staged_in_place(Collective::ReduceScatter, stream, buf, |c, b| {
            c.reduce_scatter_in_place_bytes(b, dtype, op)
        })
    }

    /// [`Communicator::all_to_all_bytes`] on device memory, ordered on `stream`.
    pub fn all_to_all_device<S: DeviceBuf, D: DeviceBufMut>(
        &self,
        send: &S,
        recv: &mut D,
        dtype: DataType,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllToAll;
        let total = self.elements(c, "send", send.len(), dtype)?;
        let count = self.check_divisible(c, "send", total)?;
        self.expect(c, "recv", recv.len(), send.len(), dtype)?;
        if self.native(
            Plan::new(c, count, dtype),
            stream,
            Some(send),
            Some(&mut *recv),
        )? {
            return Ok(());
        }
        self.staged(
            Collective::AllToAll,
            stream,
            Some(send),
            Some(recv),
            |c, i, o| c.all_to_all_bytes(i, o, dtype),
        )
    }

    /// [`Communicator::all_to_all_in_place_bytes`] on device memory, ordered on `stream`.
    pub fn all_to_all_device_in_place<D: DeviceBuf + DeviceBufMut>(
        &self,
        buf: &mut D,
        dtype: DataType,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllToAll;
        let total = self.elements(c, "buf", buf.len(), dtype)?;
        let count = self.check_divisible(c, "buf", total)?;
        if self.native_in_place(Plan::new(c, count, dtype), stream, buf)? {
            return Ok(());
        }
        self.staged_in_place(Collective::AllToAll, stream, buf, |c, b| {
            c.all_to_all_in_place_bytes(b, dtype)
        })
    }
}
