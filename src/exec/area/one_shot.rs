//! The one-shot all-reduce (small messages): each rank publishes its whole contribution in its
//! area buffer and folds everybody's, in rank order.

use super::{AreaPath, Data, Waiter, fold_in};
use crate::algo::Plan;
use crate::error::Result;
use crate::reduce::cpu;
use crate::reduce::shared::Shared;
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
        self.exchange(
            w,
            turn,
            Data::Copy(input.0, bytes),
            bytes,
            |_| true,
            |r, published| {
                // SAFETY: `output` holds `bytes` writable bytes; the published buffer holds `bytes`
                // readable bytes (area memory, mapped while the area lives, never the caller's),
                // which its owner leaves alone until this rank publishes `turn + 1`.
                let (out, data) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(output.0, bytes),
                        Shared::new(published, bytes),
                    )
                };
                fold_in(r, out, data, plan)
            },
        )?;
        let n = self.area.len();
        if plan.op == ReduceOp::Avg && n > 1 {
            // SAFETY: as above.
            let out = unsafe { std::slice::from_raw_parts_mut(output.0, bytes) };
            cpu::divide_bytes(out, plan.dtype, n)?;
        }
        Ok(())
    }
}
