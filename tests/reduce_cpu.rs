//! The host reduction kernels against an independent scalar reference, for every data type and
//! every operator defined on it.
//!
//! The reference is written differently from the kernels on purpose:
//!
//! - integers are computed in `i128` and wrapped to the type by truncation (two's complement);
//! - `f32` is computed in `f64` and rounded once (`as f32`); `f16`/`bf16` are computed in `f64`
//!   and rounded once by this file's own round-to-nearest-even ([`round_to`]), not by the `half`
//!   crate. By the double-rounding theorem (`f64` has more than `2p + 2` bits for each of them)
//!   that is bit-exact with the contract's "compute in `f32`, round to the type";
//! - `f8e4m3`/`f8e5m2` likewise are computed in `f64` and rounded once by [`round_to`], then
//!   saturated to the largest finite value (infinity included), as NCCL's `__NV_SATFINITE`
//!   narrowing does ([`round_sat`]);
//! - `f64` is computed natively;
//! - `min`/`max` implement IEEE 754-2019 `minimum`/`maximum` through `f64::total_cmp` (NaN if
//!   either operand is NaN; -0 < +0);
//! - float division is the exact rational quotient, rounded once by [`round_to`].
//!
//! Results are compared bit for bit, except that any NaN matches any NaN.

use half::{bf16, f16};
use oxccl::reduce::cpu::{
    divide, divide_bytes, reduce, reduce_bytes, reduce_into, reduce_into_bytes,
};
use oxccl::types::{DataType, Element, F8E4M3, F8E5M2, ReduceOp};
use proptest::prelude::*;

mod util;
use util::{float_op, ieee_max, ieee_min};

// ---------------------------------------------------------------------------------------------
// Randomness: a small deterministic generator, so failures reproduce.

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

// ---------------------------------------------------------------------------------------------
// Exact rounding of a binary value to a binary floating-point format.

/// A binary floating-point format: `p` significand bits (the implicit one included) and the
/// exponent range of its normal numbers.
struct Format {
    p: u32,
    emin: i32,
    emax: i32,
}

const F16: Format = Format {
    p: 11,
    emin: -14,
    emax: 15,
};
const BF16: Format = Format {
    p: 8,
    emin: -126,
    emax: 127,
};
const E4M3: Format = Format {
    p: 4,
    emin: -6,
    emax: 8,
};
const E5M2: Format = Format {
    p: 3,
    emin: -14,
    emax: 15,
};
const F32: Format = Format {
    p: 24,
    emin: -126,
    emax: 127,
};
const F64: Format = Format {
    p: 53,
    emin: -1022,
    emax: 1023,
};

/// `2^k` for `k` in the normal range of `f64`.
fn pow2(k: i32) -> f64 {
    assert!((-1022..=1023).contains(&k));
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `n · 2^k`, exact when the result is representable in `f64` (`n < 2^54`).
fn scale(n: u128, k: i32) -> f64 {
    let x = n as f64;
    assert_eq!(x as u128, n, "{n} is not exact in f64");
    if k < -1000 {
        // Two exact steps: the first stays normal, the second lands on the representable result.
        x * pow2(k + 200) * pow2(-200)
    } else if k > 1000 {
        x * pow2(k - 200) * pow2(200)
    } else {
        x * pow2(k)
    }
}

/// The positive value `(m + δ) · 2^e`, where `δ` is 0 when `sticky` is false and strictly between
/// 0 and 1 otherwise, rounded to nearest (ties to even) in `fmt`: returned as an `f64` holding
/// that exact value, or `+inf` on overflow.
fn round_to(m: u128, sticky: bool, e: i32, fmt: &Format) -> f64 {
    if m == 0 {
        assert!(!sticky, "need more quotient bits");
        return 0.0;
    }
    let lead = e + 127 - m.leading_zeros() as i32; // exponent of the leading bit
    let q = lead.max(fmt.emin) - (fmt.p as i32 - 1); // exponent of one unit in the last place
    let n = if q <= e {
        assert!(!sticky, "need more quotient bits");
        m << (e - q) // exact: no bits below the unit
    } else {
        let shift = (q - e) as u32;
        if shift > 127 {
            return 0.0; // below half the smallest subnormal
        }
        let kept = m >> shift;
        let rest = m & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        let up = rest > half || (rest == half && (sticky || kept & 1 == 1));
        kept + u128::from(up)
    };
    if n != 0 && q + 127 - n.leading_zeros() as i32 > fmt.emax {
        return f64::INFINITY;
    }
    scale(n, q)
}

/// `x` as sign, integer significand and exponent: `x = ±m · 2^e` exactly (finite, nonzero `x`).
fn decompose(x: f64) -> (bool, u128, i32) {
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let frac = u128::from(bits & ((1 << 52) - 1));
    let (m, e) = if exp == 0 {
        (frac, -1074)
    } else {
        (frac | 1 << 52, exp - 1075)
    };
    (x.is_sign_negative(), m, e)
}

/// `x` rounded once to `fmt` (as an `f64` holding the exact result).
fn round_f64(x: f64, fmt: &Format) -> f64 {
    if x.is_nan() || x.is_infinite() || x == 0.0 {
        return x;
    }
    let (neg, m, e) = decompose(x);
    let r = round_to(m, false, e, fmt);
    if neg { -r } else { r }
}

/// `x` (already rounded to an 8-bit format, or infinite) saturated to that format's largest
/// finite value `max`: E4M3's rounding may land on 480, where its NaN pattern sits, and both
/// formats' conversions turn infinities into `±max`.
fn round_sat(x: f64, fmt: &Format, max: f64) -> f64 {
    let r = round_f64(x, fmt);
    if r.abs() > max { max.copysign(r) } else { r }
}

/// The exact quotient `x / by`, rounded once to `fmt`.
fn div_exact(x: f64, by: u64, fmt: &Format) -> f64 {
    assert!(by > 0);
    if x.is_nan() || x.is_infinite() || x == 0.0 {
        return x; // ±inf / by = ±inf, ±0 / by = ±0
    }
    let (neg, m, e) = decompose(x);
    // Put the significand's leading bit at the top: the quotient then has at least 64 bits,
    // far more than any format keeps, and the remainder says whether anything was dropped.
    let s = m.leading_zeros();
    let top = m << s;
    let (quot, rem) = (top / u128::from(by), top % u128::from(by));
    let r = round_to(quot, rem != 0, e - s as i32, fmt);
    if neg { -r } else { r }
}

// ---------------------------------------------------------------------------------------------
// The element types under test.

const ALL_OPS: &[ReduceOp] = &[
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
    ReduceOp::BAnd,
    ReduceOp::BOr,
    ReduceOp::BXor,
];
const FLOAT_OPS: &[ReduceOp] = &[
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
];

trait Ty: Element + Copy {
    /// The operators defined on the type.
    const OPS: &'static [ReduceOp];
    /// Edge cases: extremes, zeros, NaNs, infinities, subnormals.
    fn specials() -> Vec<Self>;
    /// The type's value with these low bits.
    fn from_bits64(bits: u64) -> Self;
    /// A small, "ordinary" value (so that equal values, exact sums and cancellations occur).
    fn small(i: i64) -> Self;
    /// The negation (wrapping for integers).
    fn neg(self) -> Self;
    /// The reference `a ⊕ b`.
    fn op_ref(op: ReduceOp, a: Self, b: Self) -> Self;
    /// The reference `a / by` (truncating for integers, correctly rounded for floats).
    fn div_ref(a: Self, by: usize) -> Self;
    /// Bit-equal, or both NaN.
    fn same(a: Self, b: Self) -> bool;
    /// Largest divisor for which the contract promises a correctly rounded float quotient
    /// (`usize::MAX` for integers, which are exact for every divisor).
    const MAX_EXACT_DIVISOR: usize;
}

macro_rules! int_ty {
    ($($t:ty),*) => {$(
        impl Ty for $t {
            const OPS: &'static [ReduceOp] = ALL_OPS;
            const MAX_EXACT_DIVISOR: usize = usize::MAX;

            fn specials() -> Vec<Self> {
                let m1 = (0 as $t).wrapping_sub(1);
                vec![<$t>::MIN, <$t>::MAX, 0, 1, m1, 2, <$t>::MIN.wrapping_add(1),
                    <$t>::MAX.wrapping_sub(1), <$t>::MAX / 2, <$t>::MAX / 2 + 1, 0x55 as $t]
            }

            fn from_bits64(bits: u64) -> Self {
                bits as $t
            }

            fn small(i: i64) -> Self {
                i as $t
            }

            fn neg(self) -> Self {
                (0 as $t).wrapping_sub(self)
            }

            fn op_ref(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y) = (a as i128, b as i128);
                let r: i128 = match op {
                    ReduceOp::Sum | ReduceOp::Avg => x + y,
                    // The low 128 bits of the product (all `i128` keeps) contain its low bits
                    // in the type, which is all the wrapped result needs.
                    ReduceOp::Prod => x.wrapping_mul(y),
                    ReduceOp::Max => if x >= y { x } else { y },
                    ReduceOp::Min => if x <= y { x } else { y },
                    // Sign or zero extension commutes with bitwise operators.
                    ReduceOp::BAnd => x & y,
                    ReduceOp::BOr => x | y,
                    ReduceOp::BXor => x ^ y,
                };
                r as $t // keeps the low bits: two's complement wrap
            }

            fn div_ref(a: Self, by: usize) -> Self {
                // `i128` division truncates toward zero; the quotient always fits the type.
                let q = a as i128 / by as i128;
                Self::try_from(q).expect("quotient fits")
            }

            fn same(a: Self, b: Self) -> bool {
                a == b
            }
        }
    )*};
}

int_ty!(i8, u8, i32, u32, i64, u64);

/// Float specials, as `f64` values (exact in every float type they are converted to, or
/// rounded to a neighbour, which is just as interesting).
fn float_specials() -> Vec<f64> {
    vec![
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -2.5,
        3.0,
        1.0 / 3.0,
    ]
}

impl Ty for f32 {
    const OPS: &'static [ReduceOp] = FLOAT_OPS;
    const MAX_EXACT_DIVISOR: usize = 1 << 24;

    fn specials() -> Vec<Self> {
        let mut v: Vec<f32> = float_specials().into_iter().map(|x| x as f32).collect();
        v.extend([
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::from_bits(1), // smallest subnormal
            f32::from_bits(0x8000_0001),
            f32::from_bits(0x007f_ffff), // largest subnormal
            f32::from_bits(0x7f80_0001), // signalling NaN
            f32::from_bits(0xffc1_2345), // negative quiet NaN with payload
            f32::EPSILON,
            1.0 + f32::EPSILON,
            f32::MAX / 2.0,
        ]);
        v
    }

    fn from_bits64(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }

    fn small(i: i64) -> Self {
        i as f32 * 0.25
    }

    fn neg(self) -> Self {
        -self
    }

    fn op_ref(op: ReduceOp, a: Self, b: Self) -> Self {
        float_op(op, a.into(), b.into()) as f32
    }

    fn div_ref(a: Self, by: usize) -> Self {
        div_exact(a.into(), by as u64, &F32) as f32
    }

    fn same(a: Self, b: Self) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }
}

impl Ty for f64 {
    const OPS: &'static [ReduceOp] = FLOAT_OPS;
    const MAX_EXACT_DIVISOR: usize = 1 << 53;

    fn specials() -> Vec<Self> {
        let mut v = float_specials();
        v.extend([
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            f64::from_bits(1),
            f64::from_bits(0x8000_0000_0000_0001),
            f64::from_bits(0x000f_ffff_ffff_ffff),
            f64::from_bits(0x7ff0_0000_0000_0001),
            f64::from_bits(0xfff8_0000_0012_3456),
            f64::EPSILON,
            1.0 + f64::EPSILON,
            f64::MAX / 2.0,
        ]);
        v
    }

    fn from_bits64(bits: u64) -> Self {
        f64::from_bits(bits)
    }

    fn small(i: i64) -> Self {
        i as f64 * 0.25
    }

    fn neg(self) -> Self {
        -self
    }

    fn op_ref(op: ReduceOp, a: Self, b: Self) -> Self {
        float_op(op, a, b)
    }

    fn div_ref(a: Self, by: usize) -> Self {
        div_exact(a, by as u64, &F64)
    }

    fn same(a: Self, b: Self) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }
}

macro_rules! half_ty {
    ($t:ty, $fmt:expr, [$($bits:expr),*]) => {
        impl Ty for $t {
            const OPS: &'static [ReduceOp] = FLOAT_OPS;
            const MAX_EXACT_DIVISOR: usize = 1 << 40;

            fn specials() -> Vec<Self> {
                let mut v: Vec<$t> = float_specials().into_iter().map(Self::from_exact).collect();
                v.extend([$(<$t>::from_bits($bits)),*]);
                v
            }

            fn from_bits64(bits: u64) -> Self {
                <$t>::from_bits(bits as u16)
            }

            fn small(i: i64) -> Self {
                Self::from_exact(i as f64 * 0.25)
            }

            fn neg(self) -> Self {
                -self
            }

            fn op_ref(op: ReduceOp, a: Self, b: Self) -> Self {
                let r = float_op(op, a.to_f64(), b.to_f64());
                Self::from_exact(round_f64(r, &$fmt))
            }

            fn div_ref(a: Self, by: usize) -> Self {
                Self::from_exact(div_exact(a.to_f64(), by as u64, &$fmt))
            }

            fn same(a: Self, b: Self) -> bool {
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
            }
        }

        impl FromExact for $t {
            fn from_exact(x: f64) -> Self {
                // Exact (or NaN): the value is already rounded to the type, so no conversion
                // method can round it differently. 1/3 and friends are rounded here first.
                let x = round_f64(x, &$fmt);
                let r = <$t>::from_f64(x);
                assert!(r.to_f64() == x || x.is_nan(), "{x} is not exact");
                r
            }
        }
    };
}

/// Conversion of a value already representable in the type.
trait FromExact {
    fn from_exact(x: f64) -> Self;
}

half_ty!(
    f16,
    F16,
    [
        0x7bff, 0xfbff, // ±max (65504)
        0x0400, 0x8400, // ±smallest normal
        0x0001, 0x8001, // ±smallest subnormal
        0x03ff, // largest subnormal
        0x7c01, // signalling NaN
        0xfe12, // negative quiet NaN with payload
        0x3c01, // 1 + ulp
        0x7800  // 32768
    ]
);
half_ty!(
    bf16,
    BF16,
    [
        0x7f7f, 0xff7f, // ±max
        0x0080, 0x8080, // ±smallest normal
        0x0001, 0x8001, // ±smallest subnormal
        0x007f, // largest subnormal
        0x7f81, // signalling NaN
        0xffc5, // negative quiet NaN with payload
        0x3f81, // 1 + ulp
        0x7f00  // 2^127
    ]
);

macro_rules! fp8_ty {
    ($t:ty, $fmt:expr, $max:expr, [$($bits:expr),*]) => {
        impl Ty for $t {
            const OPS: &'static [ReduceOp] = FLOAT_OPS;
            const MAX_EXACT_DIVISOR: usize = 1 << 40;

            fn specials() -> Vec<Self> {
                let mut v: Vec<$t> = float_specials().into_iter().map(Self::from_exact).collect();
                v.extend([$(<$t>::from_bits($bits)),*]);
                v
            }

            fn from_bits64(bits: u64) -> Self {
                <$t>::from_bits(bits as u8)
            }

            fn small(i: i64) -> Self {
                Self::from_exact(i as f64 * 0.25)
            }

            fn neg(self) -> Self {
                -self
            }

            fn op_ref(op: ReduceOp, a: Self, b: Self) -> Self {
                Self::from_exact(float_op(op, a.to_f64(), b.to_f64()))
            }

            fn div_ref(a: Self, by: usize) -> Self {
                if by == 1 {
                    return a; // untouched: an E5M2 infinity stays one
                }
                Self::from_exact(div_exact(a.to_f64(), by as u64, &$fmt))
            }

            fn same(a: Self, b: Self) -> bool {
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
            }
        }

        impl FromExact for $t {
            fn from_exact(x: f64) -> Self {
                // Rounded and saturated here; the conversion then only has to be exact.
                let x = if x.is_nan() { x } else { round_sat(x, &$fmt, $max) };
                let r = <$t>::from_f64(x);
                assert!(r.to_f64() == x || x.is_nan(), "{x} is not exact");
                r
            }
        }
    };
}

fp8_ty!(
    F8E4M3,
    E4M3,
    448.0,
    [
        0x7e, 0xfe, // ±max (448)
        0x08, 0x88, // ±smallest normal (2^-6)
        0x01, 0x81, // ±smallest subnormal (2^-9)
        0x07, // largest subnormal
        0xff, // the negative NaN
        0x39, // 1 + ulp
        0x77, // 240, just below a binade
        0x7d  // 416
    ]
);
fp8_ty!(
    F8E5M2,
    E5M2,
    57344.0,
    [
        0x7b, 0xfb, // ±max (57344)
        0x7c, 0xfc, // ±inf
        0x04, 0x84, // ±smallest normal (2^-14)
        0x01, 0x81, // ±smallest subnormal (2^-16)
        0x03, // largest subnormal
        0x7d, 0xfe, // NaNs with other payloads
        0x3d  // 1 + ulp
    ]
);

/// A random value: a special, a small ordinary value, or random bits.
fn random<T: Ty>(rng: &mut Rng, specials: &[T]) -> T {
    match rng.below(10) {
        0..=2 => specials[rng.below(specials.len())],
        3..=5 => T::small(rng.below(41) as i64 - 20),
        _ => T::from_bits64(rng.next()),
    }
}

/// Two random operand vectors of length `n`, where `b[i]` is often `a[i]` or `-a[i]` (equal
/// values, ±0 from cancellation).
fn operands<T: Ty>(rng: &mut Rng, n: usize) -> (Vec<T>, Vec<T>) {
    let specials = T::specials();
    let a: Vec<T> = (0..n).map(|_| random(rng, &specials)).collect();
    let b = a
        .iter()
        .map(|&x| match rng.below(10) {
            0 => x,
            1 => x.neg(),
            _ => random(rng, &specials),
        })
        .collect();
    (a, b)
}

/// Lengths: empty, tiny, odd, around vector widths and the kernels' 1024-element half-float
/// block, and one past a few blocks.
const LENS: &[usize] = &[
    0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1023, 1024, 1025, 3000,
];

/// Checks `got` against the reference element by element; `what` names the case.
#[track_caller]
fn assert_all_same<T: Ty>(got: &[T], want: &[T], what: &dyn Fn(usize) -> String) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(T::same(g, w), "{}: got {g:?}, want {w:?}", what(i));
    }
}

/// Byte copies of `x` starting one byte into an 8-byte-aligned buffer (so misaligned for every
/// element type wider than a byte). Returns the buffer; the copy is `&buf[1..=bytes]`.
fn misaligned<T: Ty>(x: &[T]) -> Vec<u64> {
    let bytes: &[u8] = bytemuck::cast_slice(x);
    let mut buf = vec![0u64; bytes.len() / 8 + 2];
    bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[1..=bytes.len()].copy_from_slice(bytes);
    buf
}

/// The elements whose bytes are `bytes`.
fn from_bytes<T: Ty>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![<T as bytemuck::Zeroable>::zeroed(); bytes.len() / size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
    v
}

fn bytes_of(buf: &[u64], len: usize) -> &[u8] {
    &bytemuck::cast_slice::<u64, u8>(buf)[1..=len]
}

fn bytes_of_mut(buf: &mut [u64], len: usize) -> &mut [u8] {
    &mut bytemuck::cast_slice_mut::<u64, u8>(buf)[1..=len]
}

/// Every entry point for one type, operator and pair of operands, against the reference.
fn check_case<T: Ty>(op: ReduceOp, a: &[T], b: &[T], garbage: &[T]) {
    let dtype = T::DTYPE;
    let n = a.len();
    let want: Vec<T> = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| T::op_ref(op, x, y))
        .collect();
    let what = |entry: &'static str| {
        move |i: usize| format!("{dtype} {op} {entry} n={n} i={i}: {:?} ⊕ {:?}", a[i], b[i])
    };

    // reduce: dst ⊕= src
    let mut dst = a.to_vec();
    reduce(&mut dst, b, op).unwrap();
    assert_all_same(&dst, &want, &what("reduce"));

    // reduce_into: out = a ⊕ b, whatever `out` held
    let mut out = garbage.to_vec();
    reduce_into(&mut out, a, b, op).unwrap();
    assert_all_same(&out, &want, &what("reduce_into"));

    // The byte entry points, aligned: the same bits as the typed ones.
    let mut dst_bytes = a.to_vec();
    reduce_bytes(
        bytemuck::cast_slice_mut(&mut dst_bytes),
        bytemuck::cast_slice(b),
        dtype,
        op,
    )
    .unwrap();
    assert_all_same(&dst_bytes, &dst, &what("reduce_bytes"));

    // Misaligned by one byte: through the kernels' bounce buffer.
    let len = size_of_val(a);
    let mut mdst = misaligned(a);
    let msrc = misaligned(b);
    reduce_bytes(
        bytes_of_mut(&mut mdst, len),
        bytes_of(&msrc, len),
        dtype,
        op,
    )
    .unwrap();
    let got: Vec<T> = from_bytes(bytes_of(&mdst, len));
    assert_all_same(&got, &dst, &what("reduce_bytes misaligned"));

    let mut mout = misaligned(garbage);
    let ma = misaligned(a);
    reduce_into_bytes(
        bytes_of_mut(&mut mout, len),
        bytes_of(&ma, len),
        bytes_of(&msrc, len),
        dtype,
        op,
    )
    .unwrap();
    let got: Vec<T> = from_bytes(bytes_of(&mout, len));
    assert_all_same(&got, &out, &what("reduce_into_bytes misaligned"));
}

fn check_type<T: Ty>(seed: u64) {
    let mut rng = Rng::new(seed);
    for &op in T::OPS {
        for &n in LENS {
            let (a, b) = operands::<T>(&mut rng, n);
            let (garbage, _) = operands::<T>(&mut rng, n);
            check_case(op, &a, &b, &garbage);
        }
    }
}

/// Every pair of specials, in both orders, in one call (and so also through the vector loop).
fn check_special_pairs<T: Ty>() {
    let s = T::specials();
    let a: Vec<T> = s.iter().flat_map(|&x| s.iter().map(move |_| x)).collect();
    let b: Vec<T> = s.iter().flat_map(|_| s.iter().copied()).collect();
    for &op in T::OPS {
        check_case(op, &a, &b, &b);
    }
}

/// Buffers large enough (over 1 MiB) for the kernels' interleaved-stream walk, with a tail.
fn check_large<T: Ty>(seed: u64) {
    let mut rng = Rng::new(seed);
    let n = (1 << 20) / size_of::<T>() * 2 + 37;
    let (a, b) = operands::<T>(&mut rng, n);
    for &op in T::OPS {
        let want: Vec<T> = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| T::op_ref(op, x, y))
            .collect();
        let what = |i: usize| format!("{} {op} large n={n} i={i}", T::DTYPE);
        let mut dst = a.clone();
        reduce(&mut dst, &b, op).unwrap();
        assert_all_same(&dst, &want, &what);
        let mut out = b.clone();
        reduce_into(&mut out, &a, &b, op).unwrap();
        assert_all_same(&out, &want, &what);
    }
}

/// Divisors: 1, small, around 8-bit and 16-bit ranges, and for integers far past every type's
/// range (up to `usize::MAX`); floats stop at `T::MAX_EXACT_DIVISOR`.
fn divisors<T: Ty>() -> Vec<usize> {
    let all = [
        1,
        2,
        3,
        5,
        7,
        10,
        100,
        127,
        128,
        129,
        255,
        256,
        257,
        1000,
        4095,
        32767,
        65535,
        65536,
        1 << 20,
        (1 << 24) - 1,
        1 << 24,
        (1 << 31) - 1,
        1 << 31,
        (1 << 31) + 1,
        1 << 32,
        (1 << 32) + 1,
        1 << 53,
        (1 << 62) + 1,
        (1 << 63) - 1,
        1 << 63,
        (1 << 63) + 1,
        usize::MAX - 1,
        usize::MAX,
    ];
    all.into_iter()
        .filter(|&by| by <= T::MAX_EXACT_DIVISOR)
        .collect()
}

fn check_divide<T: Ty>(seed: u64) {
    let mut rng = Rng::new(seed);
    let specials = T::specials();
    for by in divisors::<T>() {
        for &n in LENS {
            let mut x: Vec<T> = (0..n).map(|_| random(&mut rng, &specials)).collect();
            if n >= specials.len() {
                x[..specials.len()].copy_from_slice(&specials);
            }
            let want: Vec<T> = x.iter().map(|&v| T::div_ref(v, by)).collect();
            let what = |i: usize| format!("{} divide n={n} i={i}: {:?} / {by}", T::DTYPE, x[i]);

            let mut d = x.clone();
            divide(&mut d, by).unwrap();
            if by == 1 {
                // Identity, bit for bit (NaN payloads included).
                assert_eq!(
                    bytemuck::cast_slice::<T, u8>(&d),
                    bytemuck::cast_slice::<T, u8>(&x)
                );
            }
            assert_all_same(&d, &want, &what);

            let len = size_of_val(&x[..]);
            let mut m = misaligned(&x);
            divide_bytes(bytes_of_mut(&mut m, len), T::DTYPE, by).unwrap();
            let got: Vec<T> = from_bytes(bytes_of(&m, len));
            assert_all_same(&got, &d, &what);
        }
    }
}

/// `avg` over three ranks: `Avg` combines as `Sum`, then one division.
fn check_avg<T: Ty>(seed: u64) {
    let mut rng = Rng::new(seed);
    let (r0, r1) = operands::<T>(&mut rng, 257);
    let (r2, _) = operands::<T>(&mut rng, 257);
    let mut acc = r0.clone();
    reduce(&mut acc, &r1, ReduceOp::Avg).unwrap();
    reduce(&mut acc, &r2, ReduceOp::Avg).unwrap();
    divide(&mut acc, 3).unwrap();
    let want: Vec<T> = (0..r0.len())
        .map(|i| {
            let s = T::op_ref(ReduceOp::Sum, T::op_ref(ReduceOp::Sum, r0[i], r1[i]), r2[i]);
            T::div_ref(s, 3)
        })
        .collect();
    assert_all_same(&acc, &want, &|i| format!("{} avg of 3, i={i}", T::DTYPE));
}

macro_rules! per_type {
    ($($name:ident: $t:ty, $seed:expr;)*) => {$(
        mod $name {
            use super::*;

            #[test]
            fn every_op_every_entry_point() {
                check_type::<$t>($seed);
            }

            #[test]
            fn every_pair_of_specials() {
                check_special_pairs::<$t>();
            }

            #[test]
            fn large_buffers() {
                check_large::<$t>($seed + 1);
            }

            #[test]
            fn divide_matches_reference() {
                check_divide::<$t>($seed + 2);
            }

            #[test]
            fn avg_is_sum_then_one_division() {
                check_avg::<$t>($seed + 3);
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(48))]

                #[test]
                fn random_bits(
                    op in 0..<$t as Ty>::OPS.len(),
                    pairs in prop::collection::vec((any::<u64>(), any::<u64>()), 0..150),
                    offset in 0..2usize,
                ) {
                    let op = <$t as Ty>::OPS[op];
                    let a: Vec<$t> = pairs.iter().map(|p| <$t>::from_bits64(p.0)).collect();
                    let b: Vec<$t> = pairs.iter().map(|p| <$t>::from_bits64(p.1)).collect();
                    // Start part-way into the vectors too, so slices begin off a vector boundary.
                    let k = offset.min(a.len());
                    check_case(op, &a[k..], &b[k..], &b[k..]);
                }

                #[test]
                fn random_divisor(
                    bits in prop::collection::vec(any::<u64>(), 0..100),
                    by in 1..=<$t as Ty>::MAX_EXACT_DIVISOR.min(1 << 40),
                ) {
                    let x: Vec<$t> = bits.iter().map(|&b| <$t>::from_bits64(b)).collect();
                    let mut d = x.clone();
                    divide(&mut d, by).unwrap();
                    let want: Vec<$t> = x.iter().map(|&v| <$t as Ty>::div_ref(v, by)).collect();
                    assert_all_same(&d, &want, &|i| format!("{:?} / {by}", x[i]));
                }
            }
        }
    )*};
}

per_type! {
    t_i8: i8, 10;
    t_u8: u8, 20;
    t_i32: i32, 30;
    t_u32: u32, 40;
    t_i64: i64, 50;
    t_u64: u64, 60;
    t_f16: f16, 70;
    t_bf16: bf16, 80;
    t_f32: f32, 90;
    t_f64: f64, 100;
    t_f8e4m3: F8E4M3, 110;
    t_f8e5m2: F8E5M2, 120;
}

// ---------------------------------------------------------------------------------------------
// The reference itself.

/// The rounding routine agrees with Rust's own `f64 → f32` conversion (round to nearest even,
/// subnormals and overflow included), so the half-float references built on it can be trusted.
#[test]
fn reference_rounding_matches_as_f32() {
    let mut rng = Rng::new(7);
    for i in 0..200_000 {
        let x = match i % 4 {
            0 => f64::from_bits(rng.next()),
            // Near f32's range and precision edges: subnormals, overflow, ties.
            1 => (rng.next() as i64 as f64) * pow2(-(rng.below(200) as i32) - 60),
            2 => f64::from(f32::from_bits(rng.next() as u32)) * (1.0 + pow2(-24)),
            _ => f64::from(f32::from_bits(rng.next() as u32)),
        };
        let want = x as f32;
        let got = round_f64(x, &F32) as f32;
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{x:e}: got {got:e}, want {want:e}"
        );
    }
}

#[test]
fn reference_division_matches_native_where_native_is_exact() {
    // IEEE division of two `f64` is correctly rounded, so for divisors exact in `f64` the exact
    // reference must agree with it.
    let mut rng = Rng::new(8);
    for _ in 0..100_000 {
        let x = f64::from_bits(rng.next());
        let by = (rng.next() >> rng.below(64)).max(1) & ((1 << 53) - 1);
        let by = by.max(1);
        let want = x / by as f64;
        let got = div_exact(x, by, &F64);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{x:e} / {by}: got {got:e}, want {want:e}"
        );
    }
}

#[test]
fn reference_min_max_follow_ieee_2019() {
    assert!(ieee_max(f64::NAN, 1.0).is_nan() && ieee_max(1.0, f64::NAN).is_nan());
    assert!(ieee_min(f64::NAN, 1.0).is_nan() && ieee_min(1.0, f64::NAN).is_nan());
    assert_eq!(ieee_max(-0.0, 0.0).to_bits(), 0.0f64.to_bits());
    assert_eq!(ieee_max(0.0, -0.0).to_bits(), 0.0f64.to_bits());
    assert_eq!(ieee_min(-0.0, 0.0).to_bits(), (-0.0f64).to_bits());
    assert_eq!(ieee_min(0.0, -0.0).to_bits(), (-0.0f64).to_bits());
    assert_eq!(ieee_max(-1.0, f64::NEG_INFINITY), -1.0);
    assert_eq!(ieee_min(-1.0, f64::NEG_INFINITY), f64::NEG_INFINITY);
}

// ---------------------------------------------------------------------------------------------
// Contract points spelled out, and errors.

#[test]
fn min_max_spot_checks() {
    let mut d = [f32::NAN, 1.0, -0.0, 0.0, f32::INFINITY, 2.0];
    reduce(
        &mut d,
        &[1.0, f32::NAN, 0.0, -0.0, f32::NAN, -3.0],
        ReduceOp::Max,
    )
    .unwrap();
    assert!(d[0].is_nan() && d[1].is_nan() && d[4].is_nan());
    assert_eq!(d[2].to_bits(), 0.0f32.to_bits());
    assert_eq!(d[3].to_bits(), 0.0f32.to_bits());
    assert_eq!(d[5], 2.0);

    let mut d = [-0.0f32, 0.0];
    reduce(&mut d, &[0.0, -0.0], ReduceOp::Min).unwrap();
    assert_eq!(d[0].to_bits(), (-0.0f32).to_bits());
    assert_eq!(d[1].to_bits(), (-0.0f32).to_bits());
}

#[test]
fn integer_wrap_and_truncation_spot_checks() {
    let mut d = [i32::MAX, i32::MIN, -7];
    reduce(&mut d, &[1, -1, 0], ReduceOp::Sum).unwrap();
    assert_eq!(d, [i32::MIN, i32::MAX, -7]);
    divide(&mut d, 2).unwrap();
    assert_eq!(d, [i32::MIN / 2, i32::MAX / 2, -3]); // toward zero, not floor

    let mut d = [i64::MIN, i64::MIN, i64::MAX, -5];
    divide(&mut d, 1 << 63).unwrap();
    assert_eq!(d, [-1, -1, 0, 0]);
    let mut d = [i64::MIN, i64::MAX, -5];
    divide(&mut d, usize::MAX).unwrap();
    assert_eq!(d, [0, 0, 0]);
    let mut d = [u64::MAX, u64::MAX - 1];
    divide(&mut d, usize::MAX).unwrap();
    assert_eq!(d, [1, 0]);
    let mut d = [i8::MIN, i8::MAX, -1];
    divide(&mut d, 128).unwrap();
    assert_eq!(d, [-1, 0, 0]);

    let mut d = [200u8, 16];
    reduce(&mut d, &[100, 16], ReduceOp::Prod).unwrap();
    assert_eq!(d, [(200u32 * 100 % 256) as u8, 0]);
}

fn expect_err(r: oxccl::Result<()>, what: &str) {
    assert!(r.is_err(), "{what}: expected an error");
}

#[test]
fn errors_are_returned_not_panics() {
    for dtype in DataType::ALL {
        let size = dtype.size();
        let (x, y) = (vec![0u8; 4 * size], vec![0u8; 3 * size]);
        let mut d = x.clone();
        for op in ReduceOp::ALL {
            // Length mismatch, either operand.
            expect_err(reduce_bytes(&mut d, &y, dtype, op), "reduce_bytes lengths");
            expect_err(
                reduce_into_bytes(&mut d, &x, &y, dtype, op),
                "reduce_into_bytes b",
            );
            expect_err(
                reduce_into_bytes(&mut d, &y, &x, dtype, op),
                "reduce_into_bytes a",
            );
            let mut short = y.clone();
            expect_err(
                reduce_into_bytes(&mut short, &x, &x, dtype, op),
                "reduce_into_bytes out",
            );
            // Bitwise operators on floats.
            if !op.supports(dtype) {
                expect_err(reduce_bytes(&mut d, &x, dtype, op), "bitwise on float");
                expect_err(
                    reduce_into_bytes(&mut d, &x, &x, dtype, op),
                    "bitwise on float",
                );
            }
            // Not a whole number of elements.
            if size > 1 {
                let mut odd = vec![0u8; 4 * size + 1];
                let odd_src = odd.clone();
                expect_err(
                    reduce_bytes(&mut odd, &odd_src, dtype, op),
                    "partial element",
                );
                expect_err(
                    reduce_into_bytes(&mut odd, &odd_src, &odd_src, dtype, op),
                    "partial element",
                );
            }
        }
        assert_eq!(d, x, "{dtype}: a failed call must not write");
        // Divide by zero, including on empty buffers; partial elements.
        expect_err(divide_bytes(&mut d, dtype, 0), "divide by 0");
        expect_err(divide_bytes(&mut [], dtype, 0), "divide empty by 0");
        if size > 1 {
            expect_err(
                divide_bytes(&mut [0u8; 3], dtype, 2),
                "divide partial element",
            );
        }
    }
    // The typed entry points.
    let mut f = [1.0f32, 2.0];
    expect_err(reduce(&mut f, &[1.0], ReduceOp::Sum), "reduce lengths");
    expect_err(
        reduce(&mut f, &[1.0, 2.0], ReduceOp::BXor),
        "reduce bxor f32",
    );
    expect_err(
        reduce(&mut [bf16::ONE], &[bf16::ONE], ReduceOp::BAnd),
        "reduce band bf16",
    );
    expect_err(
        reduce(&mut [f16::ONE], &[f16::ONE], ReduceOp::BOr),
        "reduce bor f16",
    );
    expect_err(
        reduce(&mut [1.0f64], &[1.0], ReduceOp::BOr),
        "reduce bor f64",
    );
    expect_err(
        reduce(&mut [F8E4M3::ONE], &[F8E4M3::ONE], ReduceOp::BXor),
        "reduce bxor f8e4m3",
    );
    expect_err(
        reduce(&mut [F8E5M2::ONE], &[F8E5M2::ONE], ReduceOp::BAnd),
        "reduce band f8e5m2",
    );
    expect_err(
        reduce_into(&mut f, &[1.0, 2.0], &[1.0], ReduceOp::Sum),
        "reduce_into lengths",
    );
    expect_err(
        reduce_into(&mut [0.0f32], &[1.0, 2.0], &[1.0, 2.0], ReduceOp::Sum),
        "out length",
    );
    expect_err(
        reduce_into(&mut f, &[1.0, 2.0], &[1.0, 2.0], ReduceOp::BAnd),
        "band f32",
    );
    expect_err(divide(&mut f, 0), "divide f32 by 0");
    expect_err(divide(&mut [1i32], 0), "divide i32 by 0");
    expect_err(divide::<u8>(&mut [], 0), "divide empty by 0");
    assert_eq!(f, [1.0, 2.0]);
}
