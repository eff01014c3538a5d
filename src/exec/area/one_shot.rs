//! The one-shot all-reduce (small messages): each rank publishes its whole contribution in its
//! area buffer and folds everybody's, in rank order.
//!
//! Ranks 0 and 1 hold one of the first two contributions themselves: they combine it with the
//! other in one pass, reading their own from their input (out of place) or from their output,
//! which holds it (in place), instead of copying rank 0's into the output and folding rank 1's
//! into that: on 2 ranks one pass over the message where there were two (paired runs of the
//! builds before and after, forced one-shot, 2 ranks, 2026-11-28: 0.80–0.91 of the time from 1
//! to 64 KiB in both placements, 0.94–0.99 at 16–256 B). Rank 1 computes `own ⊕ rank 0's`,
//! which every operator gives bit for bit as `rank 0's ⊕ own` but for which NaN payload comes
//! out (the arithmetic contract in [`crate::types`] leaves that open); every other rank folds
//! in rank order as before.

use super::{AreaPath, Data, Waiter, fold_in};
use crate::algo::Plan;
use crate::error::Result;
use crate::reduce::cpu;
use crate::reduce::shared::Shared;
use crate::types::{Rank, ReduceOp};

impl AreaPath {
    pub(super) fn small_all_reduce(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
        in_place: bool,
    ) -> Result<()> {
        let bytes = plan.count * plan.dtype.size();
        let n = self.area.len();
        self.exchange(
            w,
            turn,
            Data::Copy(input.0, bytes),
            bytes,
            |_| true,
            |r, published| self.fold_one_shot(plan, (input.0, output.0), in_place, r, published),
        )?;
        if plan.op == ReduceOp::Avg && n > 1 {
            // SAFETY: `output` holds `bytes` writable bytes, which only this rank touches.
            let out = unsafe { std::slice::from_raw_parts_mut(output.0, bytes) };
            cpu::divide_bytes(out, plan.dtype, n)?;
        }
        Ok(())
    }

    /// Folds rank `r`'s contribution, published at `published`, into `output`, in rank order
    /// (ranks 0 and 1 meet the other of the first two contributions in one pass; see the
    /// module's text). `input` and `output` hold the call's bytes.
    #[inline]
    pub(super) fn fold_one_shot(
        &self,
        plan: &Plan,
        (input, output): (*const u8, *mut u8),
        in_place: bool,
        r: Rank,
        published: *const u8,
    ) -> Result<()> {
        let bytes = plan.count * plan.dtype.size();
        let me = self.rank;
        // This rank holds one of the first two contributions: it meets the other one there.
        let pair = self.area.len() >= 2 && me < 2;
        if pair && r == me {
            // Combined with the other of the first two (always before or after this).
            return Ok(());
        }
        // SAFETY: `output` holds `bytes` writable bytes; the published buffer holds `bytes`
        // readable bytes (area memory, mapped while the area lives, never the caller's), which
        // its owner leaves alone until this rank publishes the next turn.
        let (out, data) = unsafe {
            (
                std::slice::from_raw_parts_mut(output, bytes),
                Shared::new(published, bytes),
            )
        };
        if pair && r < 2 {
            let combine = plan.op.combiner();
            if in_place {
                // Our output holds our contribution already.
                return cpu::reduce_shared(out, data, plan.dtype, combine);
            }
            // SAFETY: out of place the input holds `bytes` readable bytes and does not overlap
            // the output (the raw API's contract).
            let own = unsafe { std::slice::from_raw_parts(input, bytes) };
            return cpu::reduce_into_shared(out, own, data, plan.dtype, combine);
        }
        fold_in(r, out, data, plan)
    }
}
