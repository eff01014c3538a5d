//! The staged way of the collectives other than all-reduce, one area turn per piece and
//! user-space copies only (the way for small messages, and for every size where ranks cannot
//! reach each other's memory):
//!
//! - all-gather: each rank publishes its piece; everybody copies everybody's;
//! - broadcast: the root publishes its piece; the others copy it;
//! - reduce: each rank publishes its piece; the root folds them all, in rank order;
//! - reduce-scatter: each rank copies into its buffer the piece of every peer's block; each
//!   folds its own block's piece from everybody's copies;
//! - gather: each rank publishes its piece; the root copies everybody's;
//! - scatter: the root publishes the piece of every peer's block; each copies its own;
//! - all-to-all: each rank publishes the piece of every block it sends a peer; each copies
//!   the piece of its own block from everybody's.

use super::two_shot::{FOLD_BYTES, STAGED_STREAM_MIN};
use super::{AreaPath, Blocks, Data, Waiter, fold_in};
use crate::algo::{Collective, Plan};
use crate::error::{Error, Result};
use crate::reduce::cpu;
use crate::reduce::shared::Shared;
use crate::types::{Rank, ReduceOp};

impl AreaPath {
    /// Runs `plan` staged, piece by piece, taking each piece's turn from `next`.
    pub(super) fn staged(
        &self,
        w: &mut Waiter<'_>,
        next: &mut impl FnMut() -> u64,
        plan: &Plan,
        b: &Blocks,
    ) -> Result<()> {
        let (size, piece) = (plan.dtype.size(), self.piece(plan));
        for k in 0..self.pieces(plan) {
            let at = (k * piece).min(plan.count);
            let (at, len) = (at * size, piece.min(plan.count - at) * size);
            match plan.collective {
                Collective::AllGather | Collective::Gather => {
                    self.gather_piece(w, next(), b, at, len)?
                }
                Collective::Scatter => self.scatter_out_piece(w, next(), plan, b, at, len)?,
                Collective::AllToAll => self.all_to_all_piece(w, next(), b, at, len)?,
                Collective::Broadcast => self.broadcast_piece(w, next(), plan, b, at, len)?,
                Collective::Reduce => self.reduce_piece(w, next(), plan, b, at, len)?,
                Collective::ReduceScatter => self.scatter_piece(w, next(), plan, b, at, len)?,
                c => {
                    return Err(Error::InvalidArgument(format!(
                        "rank {}: {}: {c} does not run through the shared area",
                        self.rank, w.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// One piece of an all-gather, or of a gather (only the root, which has an output,
    /// copies): `len` bytes at `at` of every rank's block.
    fn gather_piece(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        b: &Blocks,
        at: usize,
        len: usize,
    ) -> Result<()> {
        let ours = if len > 0 {
            // SAFETY: our block holds `at + len` bytes (`Blocks::of`).
            Data::Copy(unsafe { b.src.add(at) }, len)
        } else {
            Data::Copy([].as_ptr(), 0)
        };
        // Ranks with an output read everybody's (a gather's others read nobody's).
        let reads = |_| !b.dst.is_null();
        let total = b.block * self.area.len();
        // Out of place our own block goes from our input once it is published.
        let own = || {
            if len > 0 && !b.dst.is_null() && !b.in_place {
                // SAFETY: our input holds `at + len` bytes, our output every block, and they
                // do not overlap out of place.
                unsafe {
                    copy_out(
                        b.src.add(at),
                        b.dst.add(self.rank * b.block + at),
                        len,
                        total,
                    )
                };
            }
        };
        self.exchange_then(w, turn, ours, len, reads, own, |r, data| {
            if len == 0 || b.dst.is_null() || r == self.rank {
                return Ok(());
            }
            // SAFETY: our output holds every block; `data` is area memory holding `len`
            // bytes, unchanged until this rank publishes `turn + 1`.
            unsafe { copy_out(data, b.dst.add(r * b.block + at), len, total) };
            Ok(())
        })
    }

    /// One piece of a scatter: the root publishes `len` bytes at `at` of every peer's block
    /// (and copies its own out of place); every other rank copies its own.
    fn scatter_out_piece(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        b: &Blocks,
        at: usize,
        len: usize,
    ) -> Result<()> {
        let (me, root) = (self.rank, plan.root);
        let mut ours = Data::Copy([].as_ptr(), 0);
        if me == root && len > 0 {
            ours = Data::Claimed(self.stage_blocks(w, turn, b, at, len)?);
        }
        // Out of place the root copies its own block once the others' are published.
        let own = || {
            if me == root && len > 0 && !b.in_place {
                // SAFETY: our input's block and our output hold `at + len` bytes and do not
                // overlap out of place.
                unsafe { copy_out(b.src.add(me * b.block + at), b.dst.add(at), len, b.block) };
            }
        };
        // The root's publication says its copies are there; the others read only the root's.
        let mut theirs = std::ptr::null();
        self.exchange_then(
            w,
            turn,
            ours,
            len,
            |r| r == root,
            own,
            |r, data| {
                if r == root {
                    theirs = data;
                }
                Ok(())
            },
        )?;
        if me != root && len > 0 {
            // SAFETY: our output holds `at + len` bytes; the root's area buffer holds our
            // block's piece, left alone until this rank publishes `turn + 1`.
            unsafe { copy_out(theirs.add(me * len), b.dst.add(at), len, b.block) };
        }
        Ok(())
    }

    /// One piece of an all-to-all: every rank publishes `len` bytes at `at` of each block it
    /// sends a peer, then copies the piece of its own block from everybody's. In place, the
    /// pieces it overwrites were published (copied into the area) before.
    fn all_to_all_piece(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        b: &Blocks,
        at: usize,
        len: usize,
    ) -> Result<()> {
        let (n, me) = (self.area.len(), self.rank);
        let total = b.block * n;
        let mut ours = Data::Copy([].as_ptr(), 0);
        if len > 0 {
            ours = Data::Claimed(self.stage_blocks(w, turn, b, at, len)?);
        }
        // Our own block goes straight from input to output once the others' are published.
        let own = || {
            if len > 0 && !b.in_place {
                // SAFETY: our input's and output's block `me` hold `at + len` bytes and do
                // not overlap out of place.
                unsafe {
                    copy_out(
                        b.src.add(me * b.block + at),
                        b.dst.add(me * b.block + at),
                        len,
                        total,
                    )
                };
            }
        };
        self.exchange_then(
            w,
            turn,
            ours,
            len,
            |_| true,
            own,
            |r, data| {
                if len > 0 && r != me {
                    // SAFETY: our output holds every block; in place this piece of block `r` was
                    // published above and nothing reads it any more. `data` is `r`'s area
                    // buffer, holding our block's piece until this rank publishes `turn + 1`.
                    unsafe {
                        copy_out(data.add(me * len), b.dst.add(r * b.block + at), len, total)
                    };
                }
                Ok(())
            },
        )
    }

    /// One piece of a broadcast: `len` bytes at `at`.
    fn broadcast_piece(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        b: &Blocks,
        at: usize,
        len: usize,
    ) -> Result<()> {
        let root = self.rank == plan.root;
        let ours = if root && len > 0 {
            // SAFETY: the root's input holds `at + len` bytes.
            Data::Copy(unsafe { b.src.add(at) }, len)
        } else {
            Data::Copy([].as_ptr(), 0)
        };
        // Out of place the root copies to its own output once its piece is published.
        let own = || {
            if root && len > 0 && !b.in_place {
                // SAFETY: the root's input and output hold `at + len` bytes and do not
                // overlap out of place.
                unsafe { copy_out(b.src.add(at), b.dst.add(at), len, b.block) };
            }
        };
        // The others read the root's; the root reads nobody's (and may run ahead).
        self.exchange_then(
            w,
            turn,
            ours,
            len,
            |r| r == plan.root,
            own,
            |r, data| {
                if r == plan.root && !root && len > 0 {
                    // SAFETY: our output holds `at + len` bytes; `data` is the root's area
                    // buffer, holding them until this rank publishes `turn + 1`.
                    unsafe { copy_out(data, b.dst.add(at), len, b.block) };
                }
                Ok(())
            },
        )
    }

    /// One piece of a reduce: every rank but the root publishes `len` bytes at `at` of its
    /// input; the root folds them in rank order, reading its own contribution where it lies.
    ///
    /// The root's own bytes need no trip through the area (nobody else reads them): out of
    /// place it combines the first two ranks' straight into its output, in place its output
    /// already holds its own, which is rank 0's or, with 2 ranks, one of two operands of a
    /// commutative operator (every operator is: `cpu`'s min/max are IEEE's). Only an in-place
    /// root other than rank 0 of 3 or more ranks, which must fold ranks before it into the
    /// buffer holding its own bytes, publishes them and folds its area copy. For 2 ranks that
    /// moves the root from 7 streams of the piece (copy in, copy out, fold) to 3 (fold).
    fn reduce_piece(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        b: &Blocks,
        at: usize,
        len: usize,
    ) -> Result<()> {
        let (n, me) = (self.area.len(), self.rank);
        let root = me == plan.root;
        let staged_own = root && b.in_place && me != 0 && n > 2;
        let ours = if len == 0 {
            Data::Copy([].as_ptr(), 0)
        } else if root && !staged_own {
            // The lag's wait of a claim, for our slot; nothing to copy.
            self.claim(w, turn, 0)?;
            Data::Claimed(0)
        } else {
            // SAFETY: our input holds `at + len` bytes.
            Data::Copy(unsafe { b.src.add(at) }, len)
        };
        // The root reads everybody's; the others read nobody's (and may run ahead).
        self.exchange(
            w,
            turn,
            ours,
            len,
            |_| root,
            |r, data| {
                if !root || len == 0 {
                    return Ok(());
                }
                self.fold_at_root(plan, b, (at, len), staged_own, r, data)
            },
        )?;
        if root && plan.op == ReduceOp::Avg && len > 0 {
            // SAFETY: as above.
            let out = unsafe { std::slice::from_raw_parts_mut(b.dst.add(at), len) };
            cpu::divide_bytes(out, plan.dtype, n)?;
        }
        Ok(())
    }

    /// At a reduce's root: folds rank `r`'s piece (`len` bytes at `at` of its block), published
    /// at `data`, into the output, in rank order ([`AreaPath::reduce_piece`]; `staged_own`: this
    /// root published its own bytes too, and folds that copy).
    #[inline]
    pub(super) fn fold_at_root(
        &self,
        plan: &Plan,
        b: &Blocks,
        (at, len): (usize, usize),
        staged_own: bool,
        r: Rank,
        data: *const u8,
    ) -> Result<()> {
        let (n, me) = (self.area.len(), self.rank);
        let combiner = plan.op.combiner();
        // SAFETY: the root's output holds `at + len` bytes; in place it is the input, which
        // nothing else reads.
        let out = unsafe { std::slice::from_raw_parts_mut(b.dst.add(at), len) };
        // SAFETY: `data` is area memory (mapped while the area lives), disjoint from `out`,
        // left alone by its owner until this rank publishes the next turn; read for our own
        // rank only where we published our bytes (`staged_own`).
        let theirs = || unsafe { Shared::new(data, len) };
        if staged_own {
            return fold_in(r, out, theirs(), plan);
        }
        if b.in_place {
            // `out` holds our own: rank 0's, or rank 1's of 2.
            return if r == me {
                Ok(())
            } else {
                cpu::reduce_shared(out, theirs(), plan.dtype, combiner)
            };
        }
        // SAFETY: out of place, our input holds `at + len` bytes, disjoint from `out`.
        let own = || unsafe { std::slice::from_raw_parts(b.src.add(at), len) };
        // Ranks 0 and 1 combined in one pass where the root is one of them.
        match (r, me) {
            (0, 0) if n == 1 => out.copy_from_slice(own()),
            (0, 0) | (1, 1) => {}
            (0, 1) | (1, 0) => cpu::reduce_into_shared(out, own(), theirs(), plan.dtype, combiner)?,
            (0, _) => theirs().copy_to(out),
            (r, me) if r == me => cpu::reduce_bytes(out, own(), plan.dtype, combiner)?,
            _ => cpu::reduce_shared(out, theirs(), plan.dtype, combiner)?,
        }
        Ok(())
    }

    /// One piece of a reduce-scatter: `len` bytes at `at` of every block.
    fn scatter_piece(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        b: &Blocks,
        at: usize,
        len: usize,
    ) -> Result<()> {
        let (n, me) = (self.area.len(), self.rank);
        let mut ours = Data::Copy([].as_ptr(), 0);
        if len > 0 {
            ours = Data::Claimed(self.stage_blocks(w, turn, b, at, len)?);
        }
        // The publication says the copies are there.
        let all = self.exchange_all(w, turn, ours, len)?;
        if len == 0 {
            return Ok(());
        }
        let size = plan.dtype.size();
        let fold = (FOLD_BYTES / size * size).max(size);
        let mut f = 0;
        while f < len {
            let l = fold.min(len - f);
            // SAFETY: our output holds our block; out of place our input's block is other
            // memory, in place the very same bytes (then only `out` is formed).
            let out = unsafe { std::slice::from_raw_parts_mut(b.dst.add(at + f), l) };
            let src = b.src.wrapping_add(me * b.block + at + f);
            let mut peers = (0..n)
                .filter(|&q| q != me)
                // SAFETY: peers' buffers (area memory, mapped while the area lives) hold their
                // copy of our block's piece, left alone until they publish `turn + 1`.
                .map(|q| unsafe { Shared::new(all[q].add(me * len + f), l) });
            match (b.in_place, peers.next()) {
                (true, first) => {
                    for theirs in first.into_iter().chain(peers) {
                        cpu::reduce_shared(out, theirs, plan.dtype, plan.op.combiner())?;
                    }
                }
                (false, first) => {
                    // SAFETY: out of place, our input's block is readable and disjoint.
                    let own = unsafe { std::slice::from_raw_parts(src, l) };
                    match first {
                        Some(theirs) => {
                            cpu::reduce_into_shared(
                                out,
                                own,
                                theirs,
                                plan.dtype,
                                plan.op.combiner(),
                            )?;
                            for theirs in peers {
                                cpu::reduce_shared(out, theirs, plan.dtype, plan.op.combiner())?;
                            }
                        }
                        None => out.copy_from_slice(own),
                    }
                }
            }
            if plan.op == ReduceOp::Avg {
                cpu::divide_bytes(out, plan.dtype, n)?;
            }
            f += l;
        }
        Ok(())
    }

    /// Copies `len` bytes at `at` of every peer's block of our input into our area buffer for
    /// `turn`, block `q`'s at `q · len`: what a rank publishes when every peer gets a piece of
    /// its own. Returns the bytes claimed (`n · len`).
    pub(super) fn stage_blocks(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        b: &Blocks,
        at: usize,
        len: usize,
    ) -> Result<usize> {
        let (n, me) = (self.area.len(), self.rank);
        let bytes = n * len;
        let mine = self.claim(w, turn, bytes)?;
        for q in (0..n).filter(|&q| q != me) {
            // SAFETY: our input holds every block (`Blocks::of`); our buffer holds AREA_BYTES ≥
            // n · len (pieces are cut so) and is ours to write (see `exchange`).
            // (`shared::copy`, not `memcpy`: blocks not a page long put the two 1-31 bytes
            // apart modulo a page for some `q`, where `memcpy` ran 15x slower.)
            unsafe {
                oxccl_transport::shared::copy(mine.add(q * len), b.src.add(q * b.block + at), len)
            };
        }
        Ok(bytes)
    }
}

/// Copies `len` bytes (from area memory, or the root's input) to the caller's output, with
/// non-temporal stores when the whole output (`total` bytes) is too large to stay in cache.
/// The source is read as shared memory: area memory may be written by its owner.
///
/// # Safety
///
/// `from` readable and `to` writable for `len` bytes, not overlapping, nobody else in this
/// process writing `to` meanwhile.
pub(super) unsafe fn copy_out(from: *const u8, to: *mut u8, len: usize, total: usize) {
    // SAFETY: forwarded from the caller.
    let (to, from) = unsafe {
        (
            std::slice::from_raw_parts_mut(to, len),
            Shared::new(from, len),
        )
    };
    if total >= STAGED_STREAM_MIN {
        from.copy_streaming_to(to);
    } else {
        from.copy_to(to);
    }
}
