//! The one-shot all-reduce (small messages): each rank publishes its whole contribution in its
//! area buffer and folds everybody's, in rank order.

use super::{AreaPath, Waiter};
use crate::algo::Plan;
use crate::error::Result;
use crate::reduce::cpu;
use crate::types::ReduceOp;

impl AreaPath {
    pub(super) fn small_all_reduce(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<()> {
        let bytes = plan.count * plan.dtype.size();
        self.exchange(w, turn, (input.0, bytes), bytes, |r, published| {
            // SAFETY: `output` holds `bytes` writable bytes; the published buffer holds `bytes`
            // readable bytes that stay unchanged until this rank publishes `turn + 1`; they never
            // overlap (area memory is not the caller's).
            let (out, data) = unsafe {
                (
                    std::slice::from_raw_parts_mut(output.0, bytes),
                    std::slice::from_raw_parts(published, bytes),
                )
            };
            if r == 0 {
                out.copy_from_slice(data);
            } else {
                cpu::reduce_bytes(out, data, plan.dtype, plan.op.combiner())?;
            }
            Ok(())
        })?;
        let n = self.area.len();
        if plan.op == ReduceOp::Avg && n > 1 {
            // SAFETY: as above.
            let out = unsafe { std::slice::from_raw_parts_mut(output.0, bytes) };
            cpu::divide_bytes(out, plan.dtype, n)?;
        }
        Ok(())
    }
}
