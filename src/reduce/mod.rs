//! Element-wise reduction kernels: `dst = dst ⊕ src`, `out = a ⊕ b`, and the final division of
//! `avg`. They never communicate; the executor calls them on slices it owns or borrows.
//!
//! [`cpu`] serves host memory for every data type and operator, following the arithmetic
//! contract in [`crate::types`]. `cuda` (feature `cuda`, on by default) does the same on CUDA device memory.

use crate::algo::sim::Arithmetic;
use crate::types::{DataType, ReduceOp};

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub(crate) mod shared;
pub mod stream;

/// The CPU kernels as the simulator's [`Arithmetic`]: lets [`crate::algo::sim`] run schedules on
/// the same arithmetic the executor uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl Arithmetic for Cpu {
    fn reduce(&self, dst: &mut [u8], src: &[u8], dtype: DataType, op: ReduceOp) {
        if let Err(e) = cpu::reduce_bytes(dst, src, dtype, op) {
            panic!("simulated reduction with inconsistent operands: {e}");
        }
    }

    fn divide(&self, dst: &mut [u8], dtype: DataType, by: usize) {
        if let Err(e) = cpu::divide_bytes(dst, dtype, by) {
            panic!("simulated division with inconsistent operands: {e}");
        }
    }
}
