//! The two-shot all-reduce (everything the other ways do not take), one area turn per piece:
//! reduce-scatter then all-gather through the ranks' area buffers, user-space copies only.

use super::{AreaPath, Data, Waiter, slicer};
use crate::algo::Plan;
use crate::error::Result;
use crate::reduce::cpu;
use crate::reduce::shared::Shared;
use crate::types::ReduceOp;

thread_local! {
    /// The block a two-shot fold happens in: [`FOLD_BYTES`], made once per thread.
    static FOLD_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Bytes reduced before the result is copied out (it is still in L1 then).
pub(super) const FOLD_BYTES: usize = 32 * 1024;
/// Two-shot all-reduces at least this large, counting the whole message, write their output
/// (out of place) with non-temporal stores, as direct ones do from their own threshold: below
/// it, inputs and outputs fit in cache together and normal stores win.
pub(super) const STAGED_STREAM_MIN: usize = 8 << 20;

impl AreaPath {
    /// One piece of a two-shot all-reduce, `bytes` long at `input`/`output` (the same memory
    /// when `in_place`): each rank copies into its buffer the slices its peers reduce, reduces
    /// its own slice reading the peers' copies into its buffer and its output, and copies
    /// every other slice's result from its owner's buffer. Shared memory only, no system call.
    pub(super) fn two_shot_piece(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        (bytes, in_place): (usize, bool),
        input: *const u8,
        output: *mut u8,
    ) -> Result<()> {
        let (n, me) = (self.area.len(), self.rank);
        let size = plan.dtype.size();
        let slice = slicer(bytes / size, n, size);
        let mine = self.claim(w, turn, bytes)?;
        for q in (0..n).filter(|&q| q != me) {
            let (lo, hi) = slice(q);
            // SAFETY: `input` holds `bytes` bytes and the buffer AREA_BYTES ≥ `bytes` (pieces
            // are never larger); this rank owns its buffer (see `exchange`).
            // (`shared::copy`: no slow distance, wherever the input lies within its page.)
            unsafe { oxccl_transport::shared::copy(mine.add(lo), input.add(lo), hi - lo) };
        }
        // The publication says the copies are there.
        let all = self.exchange_all(w, turn, Data::Claimed(bytes), bytes)?;
        let stream = !in_place && plan.count * size >= STAGED_STREAM_MIN;
        let copy_out = |at: usize, from: *const u8, len: usize| {
            // SAFETY: `output` holds `bytes` bytes and this range is ours to write (`input`, if
            // the same memory, is done being read there); `from` is area memory, disjoint,
            // mapped while the area lives.
            let (out, from) = unsafe {
                (
                    std::slice::from_raw_parts_mut(output.add(at), len),
                    Shared::new(from, len),
                )
            };
            if stream {
                from.copy_streaming_to(out);
            } else {
                from.copy_to(out);
            }
        };
        // Our slice, a few KiB at a time: fold, then copy to our output. Peers map our buffer
        // writable (for the area's shared words), so this rank never reads it as a slice: with
        // one peer and no division the fold only writes it (and the copies read it with
        // `Shared`'s loads); otherwise the fold happens in a private block, copied to our
        // buffer after (that copy cost 5-15% from 128 KiB to 8 MiB on 2 ranks, so only where
        // needed).
        let (lo, hi) = slice(me);
        let fold = FOLD_BYTES / size * size;
        let in_place_fold = n == 2 && plan.op != ReduceOp::Avg;
        FOLD_SCRATCH.with_borrow_mut(|scratch| -> Result<()> {
            if !in_place_fold && scratch.len() < fold {
                scratch.resize(fold, 0);
            }
            let mut at = lo;
            while at < hi {
                let len = fold.min(hi - at);
                let res = if in_place_fold {
                    // SAFETY: our own buffer's slice (AREA_BYTES ≥ `bytes`), which peers read
                    // only after our progress below; only written through this slice.
                    unsafe { std::slice::from_raw_parts_mut(mine.add(at), len) }
                } else {
                    &mut scratch[..len]
                };
                // SAFETY: `input` holds `bytes` bytes.
                let a = unsafe { std::slice::from_raw_parts(input.add(at), len) };
                let peers = all.iter().enumerate().filter(|&(q, _)| q != me);
                for (k, (_, &data)) in peers.enumerate() {
                    // SAFETY: peers' buffers (area memory, mapped while the area lives) hold
                    // their copies of this slice, left alone until they publish `turn + 1`.
                    let theirs = unsafe { Shared::new(data.add(at), len) };
                    if k == 0 {
                        cpu::reduce_into_shared(res, a, theirs, plan.dtype, plan.op.combiner())?;
                    } else {
                        cpu::reduce_shared(res, theirs, plan.dtype, plan.op.combiner())?;
                    }
                }
                if plan.op == ReduceOp::Avg {
                    cpu::divide_bytes(res, plan.dtype, n)?;
                }
                if !in_place_fold {
                    // SAFETY: our own buffer's slice, as above; `res` is this thread's memory.
                    unsafe { oxccl_transport::shared::copy(mine.add(at), res.as_ptr(), len) };
                }
                copy_out(at, res.as_ptr(), len);
                at += len;
            }
            Ok(())
        })?;
        self.area.set_progress(turn, 1);
        for q in (1..n).map(|k| (me + k) % n) {
            let (lo, hi) = slice(q);
            w.until(|| {
                if self.area.progress(q, turn) >= 1 {
                    Ok(())
                } else {
                    Err(q)
                }
            })?;
            // Rank q's result for its slice, complete (its progress said so) and unchanged
            // until it publishes `turn + 1`.
            copy_out(lo, all[q].wrapping_add(lo), hi - lo);
        }
        Ok(())
    }
}
