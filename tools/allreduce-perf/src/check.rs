//! Correctness: inputs whose exact result is known for every type and operator, and the count
//! of output elements that differ from it. Every rank can compute every rank's input from
//! (rank, index), so expected values are derived here with exact integer arithmetic, never with
//! oxccl's kernels. Values stay small enough that every partial result is exact in the element
//! type (bf16 and the 8-bit floats included), so no reduction order can change a bit; only `avg`
//! rounds, once, as oxccl's contract says. This module touches only the memory it is given.

use half::{bf16, f16};
use oxccl::types::{DataType, Element, F8E4M3, F8E5M2, ReduceOp};

use crate::coll::Coll;

/// Byte written over outputs before a checked call, so stale results cannot pass.
const POISON: u8 = 0xA5;

/// How inputs are generated for one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pattern {
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Values 0..=m from ranks below `contributors`, 0 from the others (sum, avg, min, max).
    Small { m: u64, contributors: usize },
    /// 1 or 2, with 2 only on ranks 0..4, so products stay ≤ 16.
    Prod,
    /// Any bit pattern (bitwise operators).
    Bits,
    /// Values 0..modulus identifying (rank, index) (collectives that move data only).
    Ident { modulus: u64 },
}

/// The largest integer up to which every value of `dtype` we generate and every partial sum
/// stays exact (no wrap for integers, no rounding for floats).
fn exact_bound(dtype: DataType) -> u64 {
    match dtype {
        DataType::I8 => 127,
        DataType::U8 => 255,
        DataType::BF16 => 256,
        DataType::F8E4M3 => 16,
        DataType::F8E5M2 => 8,
        DataType::F16 => 2048,
        _ => 1 << 24,
    }
}

impl Pattern {
    /// The pattern for a row of `coll` with operator `op` on `dtype` over `n` ranks.
    pub fn new(coll: Coll, op: Option<ReduceOp>, dtype: DataType, n: usize) -> Pattern {
        let bound = exact_bound(dtype);
        let n = n.max(1);
        let kind = match op.filter(|_| coll.reduces()) {
            None => Kind::Ident {
                modulus: (bound + 1).min(1 << 24),
            },
            Some(ReduceOp::Prod) => Kind::Prod,
            Some(ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor) => Kind::Bits,
            Some(ReduceOp::Min | ReduceOp::Max) => Kind::Small {
                m: 7,
                contributors: n,
            },
            Some(ReduceOp::Sum | ReduceOp::Avg) => {
                let contributors = n.min(bound as usize);
                Kind::Small {
                    m: (bound / contributors as u64).clamp(1, 7),
                    contributors,
                }
            }
        };
        Pattern { kind }
    }

    /// Element `index` of rank `rank`'s input, as an integer (a bit pattern for [`Kind::Bits`]).
    pub fn value(&self, rank: usize, index: usize) -> u64 {
        let h = mix(rank, index);
        match self.kind {
            Kind::Small { m, contributors } => {
                if rank < contributors {
                    h % (m + 1)
                } else {
                    0
                }
            }
            Kind::Prod => {
                if rank < 4 && h & 1 == 1 {
                    2
                } else {
                    1
                }
            }
            Kind::Bits => h,
            Kind::Ident { modulus } => h % modulus,
        }
    }
}

/// A well-mixed 64-bit function of (rank, index) (splitmix64), so that blocks in the wrong
/// place never look right.
fn mix(rank: usize, index: usize) -> u64 {
    let mut z = (rank as u64)
        .wrapping_mul(0xD6E8_FEB8_6659_FD93)
        .wrapping_add(index as u64)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// An element type whose values the check can build exactly.
trait Known: Element {
    /// `v` in this type: exact for the small values generated, the low bits for bit patterns.
    fn small(v: u64) -> Self;
    /// `sum / n` as `avg` defines it: truncated toward zero for integers, correctly rounded for
    /// floats.
    fn ratio(sum: u64, n: u64) -> Self;
}

macro_rules! known_int {
    ($($t:ty),*) => {$(
        impl Known for $t {
            fn small(v: u64) -> Self {
                v as $t
            }
            fn ratio(sum: u64, n: u64) -> Self {
                (sum / n.max(1)) as $t
            }
        }
    )*};
}
known_int!(i8, u8, i32, u32, i64, u64);

impl Known for f32 {
    fn small(v: u64) -> Self {
        v as f32
    }
    fn ratio(sum: u64, n: u64) -> Self {
        // Exactly representable in f32, so the conversion does not round again.
        round_ratio(sum, n, 24) as f32
    }
}

impl Known for f64 {
    fn small(v: u64) -> Self {
        v as f64
    }
    fn ratio(sum: u64, n: u64) -> Self {
        round_ratio(sum, n, 53)
    }
}

impl Known for f16 {
    fn small(v: u64) -> Self {
        f16::from_f64(v as f64)
    }
    fn ratio(sum: u64, n: u64) -> Self {
        f16::from_f64(round_ratio(sum, n, 11))
    }
}

impl Known for bf16 {
    fn small(v: u64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn ratio(sum: u64, n: u64) -> Self {
        bf16::from_f64(round_ratio(sum, n, 8))
    }
}

// The 8-bit floats: a quotient of small integers can be subnormal there (E4M3's smallest normal
// is 2^-6), so it is rounded to the subnormal quantum below that (2^-9, 2^-16).
impl Known for F8E4M3 {
    fn small(v: u64) -> Self {
        F8E4M3::from_f64(v as f64)
    }
    fn ratio(sum: u64, n: u64) -> Self {
        F8E4M3::from_f64(round_ratio_above(sum, n, 4, 9))
    }
}

impl Known for F8E5M2 {
    fn small(v: u64) -> Self {
        F8E5M2::from_f64(v as f64)
    }
    fn ratio(sum: u64, n: u64) -> Self {
        F8E5M2::from_f64(round_ratio_above(sum, n, 3, 16))
    }
}

/// `num / den` rounded to nearest, ties to even, to `bits` significant bits, computed exactly
/// (no double rounding through f64). Inputs are small, so the result is a normal number.
fn round_ratio(num: u64, den: u64, bits: u32) -> f64 {
    round_ratio_above(num, den, bits, i32::MAX)
}

/// [`round_ratio`] in a format whose smallest subnormal is `2^-lowest`: results below its
/// smallest normal are rounded to a multiple of that.
fn round_ratio_above(num: u64, den: u64, bits: u32, lowest: i32) -> f64 {
    if num == 0 || den == 0 {
        return 0.0;
    }
    let (mut n, mut d) = (u128::from(num), u128::from(den));
    let mut scale: i32 = 0; // the value is (n / d) · 2^-scale
    let top = 1u128 << bits;
    while n / d >= top {
        d <<= 1;
        scale -= 1;
    }
    while n / d < top >> 1 && scale < lowest {
        n <<= 1;
        scale += 1;
    }
    let mut mantissa = n / d;
    let rem = n % d;
    if 2 * rem > d || (2 * rem == d && mantissa & 1 == 1) {
        mantissa += 1;
    }
    mantissa as f64 * 2f64.powi(-scale)
}

/// What one output element must hold.
enum Want {
    /// The reduction over ranks of their element `index`.
    Reduced(usize),
    /// Rank `.0`'s input element `.1`.
    Copied(usize, usize),
}

/// One rank's view of a checked call.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// The collective.
    pub coll: Coll,
    /// The operator, for reducing collectives.
    pub op: Option<ReduceOp>,
    /// Element type.
    pub dtype: DataType,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub n: usize,
    /// The count passed to the collective (the per-rank block for split collectives).
    pub count: usize,
    /// The root, for rooted collectives.
    pub root: usize,
}

impl Case {
    /// What output element `j` of this rank must hold.
    fn want(&self, j: usize) -> Want {
        let p = self.count.max(1);
        let (rank, n) = (self.rank, self.n);
        match self.coll {
            Coll::AllReduce | Coll::Reduce => Want::Reduced(j),
            Coll::ReduceScatter => Want::Reduced(rank * p + j),
            Coll::Broadcast => Want::Copied(self.root, j),
            Coll::AllGather | Coll::Gather => Want::Copied(j / p, j % p),
            Coll::Scatter => Want::Copied(self.root, rank * p + j),
            Coll::AllToAll => Want::Copied(j / p, rank * p + j % p),
            Coll::SendRecv => Want::Copied((rank + n - 1) % n, j),
        }
    }
}

/// Runs `$body` with `$t` bound to the Rust type of `$dtype`.
macro_rules! with_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DataType::I8 => {
                type $t = i8;
                $body
            }
            DataType::U8 => {
                type $t = u8;
                $body
            }
            DataType::I32 => {
                type $t = i32;
                $body
            }
            DataType::U32 => {
                type $t = u32;
                $body
            }
            DataType::I64 => {
                type $t = i64;
                $body
            }
            DataType::U64 => {
                type $t = u64;
                $body
            }
            DataType::F16 => {
                type $t = f16;
                $body
            }
            DataType::F32 => {
                type $t = f32;
                $body
            }
            DataType::F64 => {
                type $t = f64;
                $body
            }
            DataType::BF16 => {
                type $t = bf16;
                $body
            }
            DataType::F8E4M3 => {
                type $t = F8E4M3;
                $body
            }
            DataType::F8E5M2 => {
                type $t = F8E5M2;
                $body
            }
        }
    };
}

fn typed_mut<T: Element>(bytes: &mut [u8]) -> Result<&mut [T], String> {
    bytemuck::try_cast_slice_mut(bytes)
        .map_err(|e| format!("a {} buffer is misaligned or ragged: {e}", T::DTYPE))
}

fn typed<T: Element>(bytes: &[u8]) -> Result<&[T], String> {
    bytemuck::try_cast_slice(bytes)
        .map_err(|e| format!("a {} buffer is misaligned or ragged: {e}", T::DTYPE))
}

/// Writes rank `rank`'s input elements 0.. into `region` (elements of `dtype`).
pub fn fill_input(
    pattern: &Pattern,
    dtype: DataType,
    rank: usize,
    region: &mut [u8],
) -> Result<(), String> {
    fn fill<T: Known>(p: &Pattern, rank: usize, region: &mut [u8]) -> Result<(), String> {
        for (i, x) in typed_mut::<T>(region)?.iter_mut().enumerate() {
            *x = T::small(p.value(rank, i));
        }
        Ok(())
    }
    with_type!(dtype, T => fill::<T>(pattern, rank, region))
}

/// Overwrites `region` with a byte no correct result relies on.
pub fn poison(region: &mut [u8]) {
    region.fill(POISON);
}

/// Flips every bit of the middle element of `region` (the planted fault of the tests).
pub fn corrupt(region: &mut [u8], elem_size: usize) {
    let elems = region.len() / elem_size.max(1);
    if elems > 0 {
        let at = elems / 2 * elem_size;
        for b in &mut region[at..at + elem_size] {
            *b ^= 0xFF;
        }
    }
}

/// Counts the elements of this rank's output `region` that differ, bit for bit, from what
/// `case` says they must be.
pub fn count_wrong(pattern: &Pattern, case: &Case, region: &[u8]) -> Result<u64, String> {
    fn count<T: Known>(p: &Pattern, case: &Case, region: &[u8]) -> Result<u64, String> {
        let out = typed::<T>(region)?;
        let mut wrong = 0;
        for (j, got) in out.iter().enumerate() {
            let want = expected::<T>(p, case, j);
            if bytemuck::bytes_of(got) != bytemuck::bytes_of(&want) {
                wrong += 1;
            }
        }
        Ok(wrong)
    }
    with_type!(case.dtype, T => count::<T>(pattern, case, region))
}

fn expected<T: Known>(p: &Pattern, case: &Case, j: usize) -> T {
    match case.want(j) {
        Want::Copied(rank, i) => T::small(p.value(rank, i)),
        Want::Reduced(i) => {
            let op = case.op.unwrap_or(ReduceOp::Sum);
            let mut values = (0..case.n).map(|r| p.value(r, i));
            let first = values.next().unwrap_or(0);
            let folded = values.fold(first, |a, b| match op {
                ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                ReduceOp::Prod => a.wrapping_mul(b),
                ReduceOp::Min => a.min(b),
                ReduceOp::Max => a.max(b),
                ReduceOp::BAnd => a & b,
                ReduceOp::BOr => a | b,
                ReduceOp::BXor => a ^ b,
            });
            if op == ReduceOp::Avg {
                T::ratio(folded, case.n as u64)
            } else {
                T::small(folded)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_round_once_to_nearest_even() {
        assert_eq!(round_ratio(1, 3, 24) as f32, 1.0f32 / 3.0);
        assert_eq!(round_ratio(10, 4, 53), 2.5);
        assert_eq!(round_ratio(0, 3, 8), 0.0);
        // 257/1 is a tie between 256 and 258 in bf16 (8 bits): even mantissa wins.
        assert_eq!(round_ratio(257, 1, 8), 256.0);
        assert_eq!(round_ratio(259, 1, 8), 260.0);
        // Subnormal results keep the quantum of the smallest subnormal: 1/100 in E4M3 is
        // 5.12 · 2^-9, so 5 · 2^-9; 3/512 is 3 · 2^-9 exactly; 1/1024 ties to 0 (even).
        assert_eq!(round_ratio_above(1, 100, 4, 9), 5.0 / 512.0);
        assert_eq!(round_ratio_above(3, 512, 4, 9), 3.0 / 512.0);
        assert_eq!(round_ratio_above(1, 1024, 4, 9), 0.0);
        assert_eq!(round_ratio_above(3, 1024, 4, 9), 2.0 / 512.0);
        assert_eq!(round_ratio_above(7, 3, 3, 16), 2.5);
        for (s, n) in [(1u64, 3u64), (20, 3), (7, 6), (2047, 7)] {
            let want = s as f64 / n as f64;
            assert_eq!(round_ratio(s, n, 53), want);
            assert_eq!(round_ratio(s, n, 24) as f32, (s as f32) / (n as f32));
        }
    }

    #[test]
    fn every_partial_sum_stays_exact() {
        for dtype in DataType::ALL {
            for n in [1, 2, 3, 8, 100, 1000] {
                let p = Pattern::new(Coll::AllReduce, Some(ReduceOp::Sum), dtype, n);
                let max_sum: u64 = (0..n)
                    .map(|r| (0..64).map(|i| p.value(r, i)).max().unwrap())
                    .sum();
                assert!(max_sum <= exact_bound(dtype), "{dtype} n={n}: {max_sum}");
                let p = Pattern::new(Coll::AllReduce, Some(ReduceOp::Prod), dtype, n);
                let prod: u64 = (0..n)
                    .map(|r| (0..64).map(|i| p.value(r, i)).max().unwrap())
                    .product();
                assert!(prod <= 16);
            }
        }
    }

    #[test]
    fn a_correct_all_reduce_passes_and_a_flipped_element_fails() {
        let n = 3;
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL.into_iter().filter(|o| o.supports(dtype)) {
                let p = Pattern::new(Coll::AllReduce, Some(op), dtype, n);
                let count = 37;
                let case = Case {
                    coll: Coll::AllReduce,
                    op: Some(op),
                    dtype,
                    rank: 1,
                    n,
                    count,
                    root: 0,
                };
                // Reference: reduce the ranks' inputs in f64 / u64 and encode.
                let mut out = vec![0u8; count * dtype.size()];
                with_type!(dtype, T => {
                    let o = typed_mut::<T>(&mut out).unwrap();
                    for (j, x) in o.iter_mut().enumerate() {
                        *x = expected::<T>(&p, &case, j);
                    }
                });
                assert_eq!(count_wrong(&p, &case, &out).unwrap(), 0, "{dtype} {op}");
                corrupt(&mut out, dtype.size());
                assert_eq!(count_wrong(&p, &case, &out).unwrap(), 1, "{dtype} {op}");
                poison(&mut out);
                assert!(count_wrong(&p, &case, &out).unwrap() > count as u64 / 2);
            }
        }
    }

    #[test]
    fn float_sums_and_averages_are_the_exact_values() {
        let n = 3;
        let p = Pattern::new(Coll::AllReduce, Some(ReduceOp::Avg), DataType::BF16, n);
        let case = Case {
            coll: Coll::AllReduce,
            op: Some(ReduceOp::Avg),
            dtype: DataType::BF16,
            rank: 0,
            n,
            count: 100,
            root: 0,
        };
        for j in 0..100 {
            let sum: u64 = (0..n).map(|r| p.value(r, j)).sum();
            let got: bf16 = expected(&p, &case, j);
            let exact = sum as f64 / n as f64;
            assert!((got.to_f64() - exact).abs() <= exact * 2f64.powi(-8));
        }
    }

    #[test]
    fn blocks_land_where_each_collective_puts_them() {
        let p = Pattern::new(Coll::AllToAll, None, DataType::I32, 3);
        let case = Case {
            coll: Coll::AllToAll,
            op: None,
            dtype: DataType::I32,
            rank: 2,
            n: 3,
            count: 4,
            root: 0,
        };
        // Element 5 of rank 2's output is element 2·4 + 1 of rank 1's input.
        assert_eq!(expected::<i32>(&p, &case, 5), p.value(1, 9) as i32);
        let mut src = vec![0u8; 12 * 4];
        fill_input(&p, DataType::I32, 1, &mut src).unwrap();
        assert_eq!(typed::<i32>(&src).unwrap()[9], p.value(1, 9) as i32);
        let case = Case {
            coll: Coll::SendRecv,
            rank: 0,
            ..case
        };
        assert_eq!(expected::<i32>(&p, &case, 3), p.value(2, 3) as i32);
    }
}
