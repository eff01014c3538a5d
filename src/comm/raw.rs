//! Operations on memory the caller vouches for: the unsafe entry points a foreign-language
//! binding (the C ABI in `ffi/`) stands on. They take a [`Plan`] and raw (pointer, length)
//! regions, check that the regions are what the plan needs, and either run the operation
//! ([`Communicator::run_raw`], the same path as the safe methods) or start it on the
//! communicator's progress thread and return a [`Pending`] handle, so that one thread can have
//! operations on several communicators in flight at once (nccl.h's groups, non-blocking
//! communicators).
//!
//! A [`Pending`] is the promise that the memory is no longer touched: dropping it waits for the
//! operation, so a binding that keeps its handles until it reports completion never returns to
//! its caller while a peer may still read or write the caller's buffers.

use std::sync::Arc;

use crate::algo::{Collective, Plan};
use crate::error::{Error, Result};
use crate::exec::op::OpResult;
use crate::types::Rank;

use super::{Communicator, Inner};

/// An operation started by [`Communicator::start_raw`] or
/// [`Communicator::start_point_to_point_raw`]. Dropping it waits for the operation.
#[must_use = "dropping a Pending waits for its operation; its result is only known through wait()"]
pub struct Pending {
    inner: Arc<Inner>,
    result: Option<Arc<OpResult>>,
}

impl Pending {
    /// Waits for the operation (within the communicator's deadline) and returns its result.
    pub fn wait(mut self) -> Result<()> {
        match self.result.take() {
            Some(r) => {
                self.inner.wait(&r);
                r.take().unwrap_or(Ok(()))
            }
            None => Ok(()),
        }
    }

    /// Whether the operation has finished (successfully or not), without blocking.
    pub fn is_completed(&self) -> bool {
        match &self.result {
            Some(r) => {
                if !r.is_done() {
                    self.inner.poke();
                }
                r.is_done()
            }
            None => true,
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(r) = self.result.take() {
            // The operation may still use the caller's memory: let it finish first.
            self.inner.wait(&r);
        }
    }
}

/// One send or receive of a point-to-point batch ([`Communicator::start_point_to_point_raw`]).
#[derive(Clone, Copy, Debug)]
pub struct RawMessage {
    /// The other rank.
    pub peer: Rank,
    /// True for a send (`ptr` is read), false for a receive (`ptr` is written).
    pub send: bool,
    /// The memory.
    pub ptr: *mut u8,
    /// Its length in bytes.
    pub len: usize,
    /// A tag both sides give (torch's; 0 for nccl.h's calls, which have none). Messages still
    /// pair in order: a receive whose tag differs from the message it meets fails with a
    /// mismatch naming both, rather than take bytes meant for another.
    pub tag: u32,
}

impl Communicator {
    fn raw_invalid(&self, c: Collective, why: String) -> Error {
        Error::InvalidArgument(format!("rank {}: {c}: {why}", self.rank()))
    }

    /// Checks that `plan` is valid on this communicator and that `input` and `output` are the
    /// regions it needs ([`Collective`]'s table; in place, both are the larger buffer). A
    /// region that only matters at the root is not checked elsewhere.
    pub fn check_raw(
        &self,
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<()> {
        let c = plan.collective;
        let n = self.size();
        let me = self.rank();
        plan.validate(n)
            .map_err(|e| Error::InvalidArgument(format!("rank {me}: {e}")))?;
        let size = plan.dtype.size();
        // validate() checked that n·count elements fit in the address space.
        let want_in = plan.input_count(me, n) * size;
        let want_out = plan.output_count(me, n) * size;
        if plan.in_place {
            let len = want_in.max(want_out);
            if input.0 != output.0.cast_const() || input.1 != output.1 || output.1 != len {
                return Err(self.raw_invalid(
                    c,
                    format!(
                        "in place, input and output must be the same {len} bytes \
                         (got {} bytes at {:p} and {} bytes at {:p})",
                        input.1, input.0, output.1, output.0
                    ),
                ));
            }
            return Ok(());
        }
        // A region this rank does not use (a root-only buffer elsewhere) is not checked.
        if want_in > 0 && input.1 != want_in {
            return Err(self.raw_invalid(
                c,
                format!("the input has {} bytes, expected {want_in}", input.1),
            ));
        }
        if want_out > 0 && output.1 != want_out {
            return Err(self.raw_invalid(
                c,
                format!("the output has {} bytes, expected {want_out}", output.1),
            ));
        }
        Ok(())
    }

    /// Runs `plan` on `input` and `output` and returns when this rank's part is done: the path
    /// of the safe methods, for callers that hold raw memory.
    ///
    /// # Safety
    ///
    /// `input` is readable and `output` readable and writable for their lengths (the parts
    /// the plan uses on this rank), and nothing else writes to the first or touches the second
    /// until this returns; they do not overlap unless `plan.in_place` (then they are the same).
    pub unsafe fn run_raw(
        &self,
        plan: Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<()> {
        self.check_raw(&plan, input, output)?;
        let (input, output) = self.used(&plan, input, output);
        self.run(plan, input, output)
    }

    /// Starts `plan` on `input` and `output` and returns at once; the communicator's progress
    /// thread (or whoever waits) runs it.
    ///
    /// # Safety
    ///
    /// As [`Communicator::run_raw`], until the returned [`Pending`] is completed or dropped.
    /// Leaking it (`mem::forget`) leaves the operation running on the memory.
    pub unsafe fn start_raw(
        &self,
        plan: Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<Pending> {
        self.check_raw(&plan, input, output)?;
        let (input, output) = self.used(&plan, input, output);
        let result = self.start(plan, input, output)?;
        Ok(Pending {
            inner: self.inner.clone(),
            result: Some(result),
        })
    }

    /// The regions the engine gets: one that this rank does not use is empty, so that it is
    /// never touched whatever the caller passed.
    fn used(
        &self,
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> ((*const u8, usize), (*mut u8, usize)) {
        if plan.in_place {
            return (input, output);
        }
        let (me, n) = (self.rank(), self.size());
        let input = if plan.input_count(me, n) == 0 {
            (std::ptr::null(), 0)
        } else {
            input
        };
        let output = if plan.output_count(me, n) == 0 {
            (std::ptr::null_mut(), 0)
        } else {
            output
        };
        (input, output)
    }

    /// Starts the sends and receives of `messages` as one group (every rank's group with a
    /// given peer must pair up in order, as [`Group`](super::Group) documents) and returns at
    /// once. Messages to this rank itself are copied before this returns.
    ///
    /// # Safety
    ///
    /// Each message's memory is readable (a send) or readable and writable (a receive) for
    /// its length, receives overlap nothing else in the batch, and nothing else touches a
    /// receive's memory or writes a send's until the returned [`Pending`] is completed or
    /// dropped.
    pub unsafe fn start_point_to_point_raw(&self, messages: &[RawMessage]) -> Result<Pending> {
        let ops: Vec<(Rank, bool, *mut u8, usize, u32)> = messages
            .iter()
            .map(|m| (m.peer, m.send, m.ptr, m.len, m.tag))
            .collect();
        for &(peer, send, _, _, _) in &ops {
            self.check_peer(peer, if send { "send" } else { "recv" })?;
        }
        // SAFETY: the caller's contract covers every message's memory until the Pending ends.
        let result = unsafe { self.submit_point_to_point(&ops) }?;
        if result.is_some() {
            self.inner.kick();
        }
        Ok(Pending {
            inner: self.inner.clone(),
            result,
        })
    }
}
