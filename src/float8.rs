//! The two 8-bit floating-point formats of nccl.h, as element types: [`F8E4M3`]
//! (`ncclFloat8e4m3`) and [`F8E5M2`] (`ncclFloat8e5m2`), with their conversions to and from
//! `f32`. Plain data and arithmetic on single values; no I/O.
//!
//! # Conversions
//!
//! Widening (`to_f32`) is exact. Narrowing (`from_f32`, `from_f64`) rounds to nearest, ties to
//! even, and **saturates**: a finite value beyond the largest finite one, and an infinity, become
//! the largest finite value of the same sign; a NaN becomes the positive NaN `0x7f`. This is
//! CUDA's `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ·)`, the conversion NCCL's reductions use
//! (its `__nv_fp8_e4m3`/`__nv_fp8_e5m2` constructors pass `__NV_SATFINITE`), so a reduction
//! never turns finite data into a NaN (E4M3 has no infinity to overflow to) or an infinity.
//! Results below half the smallest subnormal become zero with the sign kept.

use std::fmt;

/// OCP FP8 E4M3 (`E4M3FN`, nccl.h's `ncclFloat8e4m3`, CUDA's `__nv_fp8_e4m3`): 1 sign bit,
/// 4 exponent bits (bias 7), 3 mantissa bits.
///
/// No infinities: `S.1111.111` is NaN and every other pattern is a number, up to ±448
/// (`S.1111.110`); the smallest subnormal is 2^-9. Conversions from wider types round to
/// nearest even and saturate (see the [module](self)): 1000.0 and +inf become 448, a NaN
/// becomes `0x7f`. Reductions compute in `f32` and narrow after every operation in the same
/// way, as NCCL does.
#[derive(Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F8E4M3(u8);

/// OCP FP8 E5M2 (nccl.h's `ncclFloat8e5m2`, CUDA's `__nv_fp8_e5m2`): 1 sign bit, 5 exponent
/// bits (bias 15), 2 mantissa bits — binary16 cut to its top byte.
///
/// IEEE-like: `S.11111.00` is ±infinity and `S.11111.xx` (xx ≠ 0) NaN; the largest finite
/// value is ±57344 (`S.11110.11`), the smallest subnormal 2^-16. Conversions from wider types
/// round to nearest even and saturate (see the [module](self)): 1e6 and +inf become 57344, a
/// NaN becomes `0x7f`. An infinity can be stored and read back, but any reduction step
/// narrows its result with saturation, so `inf + 1` and `max(inf, 1)` give 57344, as in NCCL.
#[derive(Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F8E5M2(u8);

/// What tells the two formats apart: the number of mantissa bits and the exponent bias.
/// Everything else is computed from these.
struct Layout {
    mantissa_bits: u32,
    bias: u32,
    /// `f32` bits of the largest finite value.
    max_bits: u32,
    /// The format's bits of the largest finite value.
    max_code: u8,
}

const E4M3: Layout = Layout {
    mantissa_bits: 3,
    bias: 7,
    max_bits: 0x43e0_0000, // 448 = 1.75 · 2^8
    max_code: 0x7e,        // 0.1111.110
};

const E5M2: Layout = Layout {
    mantissa_bits: 2,
    bias: 15,
    max_bits: 0x4760_0000, // 57344 = 1.75 · 2^15
    max_code: 0x7b,        // 0.11110.11
};

/// The canonical NaN both formats produce (`0.1111.111` and `0.11111.11`).
const NAN_BITS: u8 = 0x7f;

/// `x` narrowed to the format: round to nearest even, saturating, NaN to [`NAN_BITS`].
///
/// Branch-free (every path is computed and one selected), so loops over it vectorise:
/// - normal results: the `f32` bits are rebiased and the dropped bits rounded by adding
///   `half - 1` plus the lowest kept bit (a carry correctly bumps the exponent);
/// - subnormal results: adding `2^(emin - mantissa_bits + 23)` in `f32` leaves the value's
///   count of smallest subnormals in the low bits, rounded to nearest even by the FPU;
/// - saturation: the magnitude is first clamped to the largest finite value (infinity
///   included), which rounding then keeps.
#[inline(always)]
fn narrow(x: f32, l: &Layout) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs = bits & 0x7fff_ffff;
    let nan = abs > 0x7f80_0000;
    // Saturate (__NV_SATFINITE): beyond the largest finite value, infinity included, is the
    // largest finite value.
    let abs = abs.min(l.max_bits);
    let drop = 23 - l.mantissa_bits;
    // 2^(1 - bias): the smallest normal number of the format.
    let min_normal = (128 - l.bias) << 23;
    // 2^(1 - bias - mantissa_bits + 23): one unit of its last place is the smallest subnormal.
    let magic = (128 - l.bias + drop) << 23;
    let sub = (f32::from_bits(abs) + f32::from_bits(magic))
        .to_bits()
        .wrapping_sub(magic);
    let rebias = abs.wrapping_sub((127 - l.bias) << 23);
    let normal = rebias.wrapping_add((1 << (drop - 1)) - 1 + ((abs >> drop) & 1)) >> drop;
    let magnitude = if abs < min_normal { sub } else { normal };
    if nan {
        NAN_BITS
    } else {
        (magnitude | sign) as u8
    }
}

/// `f64` to the format, rounded once: round-to-odd to `f32` keeps enough bits (24 ≥ 4 + 2) that
/// the second rounding cannot differ from rounding `x` directly.
#[inline]
fn narrow_f64(x: f64, l: &Layout) -> u8 {
    narrow(crate::reduce::cpu::f64_to_f32_odd(x), l)
}

/// The exact `f32` value of E4M3 bits `b`, computed branch-free (a loop over it vectorises).
#[inline(always)]
fn widen_e4m3(b: u8) -> f32 {
    let sign = u32::from(b & 0x80) << 24;
    let em = u32::from(b & 0x7f);
    // Normal: exponent and mantissa move up as one field; the exponent is rebiased 7 → 127.
    let normal = (em << 20) + (120 << 23);
    // Subnormal (exponent field 0): mantissa · 2^-9, exact.
    let sub = (em as f32 * (1.0 / 512.0)).to_bits();
    let magnitude = if em < 0x08 { sub } else { normal };
    let magnitude = if em == 0x7f { 0x7fc0_0000 } else { magnitude };
    f32::from_bits(magnitude | sign)
}

/// The exact `f32` value of E5M2 bits `b`, computed branch-free (a loop over it vectorises).
#[inline(always)]
fn widen_e5m2(b: u8) -> f32 {
    let sign = u32::from(b & 0x80) << 24;
    let em = u32::from(b & 0x7f);
    // Normal: exponent and mantissa move up as one field; the exponent is rebiased 15 → 127.
    let normal = (em << 21) + (112 << 23);
    // Subnormal (exponent field 0): mantissa · 2^-16, exact.
    let sub = (em as f32 * (1.0 / 65536.0)).to_bits();
    let magnitude = if em < 0x04 { sub } else { normal };
    let magnitude = if em == 0x7c { 0x7f80_0000 } else { magnitude };
    let magnitude = if em > 0x7c { 0x7fc0_0000 } else { magnitude };
    f32::from_bits(magnitude | sign)
}

macro_rules! float8 {
    ($t:ident, $layout:ident, $widen:ident, $name:literal) => {
        impl $t {
            /// Positive zero.
            pub const ZERO: $t = $t(0x00);
            /// One.
            pub const ONE: $t = $t(($layout.bias << $layout.mantissa_bits) as u8);
            /// The largest finite value.
            pub const MAX: $t = $t($layout.max_code);
            /// The most negative finite value.
            pub const MIN: $t = $t(Self::MAX.0 | 0x80);
            /// The NaN that conversions produce (`0x7f`).
            pub const NAN: $t = $t(NAN_BITS);

            /// The value whose bit pattern is `bits`.
            #[inline]
            pub const fn from_bits(bits: u8) -> $t {
                $t(bits)
            }

            /// The bit pattern.
            #[inline]
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// The exact `f32` value.
            #[inline(always)]
            pub fn to_f32(self) -> f32 {
                $widen(self.0)
            }

            /// The exact `f64` value.
            #[inline]
            pub fn to_f64(self) -> f64 {
                f64::from(self.to_f32())
            }

            /// `x` rounded to nearest even, saturating at the largest finite value (infinities
            /// included); a NaN becomes [`Self::NAN`].
            #[inline(always)]
            pub fn from_f32(x: f32) -> $t {
                $t(narrow(x, &$layout))
            }

            /// `x` rounded once to nearest even, saturating as [`Self::from_f32`] does.
            #[inline]
            pub fn from_f64(x: f64) -> $t {
                $t(narrow_f64(x, &$layout))
            }

            /// Whether this is a NaN.
            #[inline]
            pub fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }
        }

        impl From<$t> for f32 {
            #[inline]
            fn from(x: $t) -> f32 {
                x.to_f32()
            }
        }

        impl From<$t> for f64 {
            #[inline]
            fn from(x: $t) -> f64 {
                x.to_f64()
            }
        }

        impl std::ops::Neg for $t {
            type Output = $t;

            /// Flips the sign bit (exact; a NaN stays a NaN).
            #[inline]
            fn neg(self) -> $t {
                $t(self.0 ^ 0x80)
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?} = {:#04x})", $name, self.to_f32(), self.0)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }
    };
}

float8!(F8E4M3, E4M3, widen_e4m3, "F8E4M3");
float8!(F8E5M2, E5M2, widen_e5m2, "F8E5M2");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_the_formats_landmarks() {
        assert_eq!(F8E4M3::ONE.to_bits(), 0x38);
        assert_eq!(F8E5M2::ONE.to_bits(), 0x3c);
        assert_eq!(F8E4M3::MAX.to_bits(), 0x7e);
        assert_eq!(F8E5M2::MAX.to_bits(), 0x7b);
        assert_eq!(F8E4M3::MAX.to_f32(), 448.0);
        assert_eq!(F8E5M2::MIN.to_f32(), -57344.0);
        assert!(F8E4M3::NAN.is_nan() && F8E5M2::NAN.is_nan());
        assert_eq!(F8E4M3::ONE.to_f32(), 1.0);
        assert_eq!(F8E5M2::ONE.to_f32(), 1.0);
        assert_eq!((-F8E4M3::ONE).to_f32(), -1.0);
    }

    #[test]
    fn saturation_and_signed_zero() {
        assert_eq!(F8E4M3::from_f32(f32::INFINITY), F8E4M3::MAX);
        assert_eq!(F8E4M3::from_f32(-1e30), F8E4M3::MIN);
        assert_eq!(F8E5M2::from_f32(f32::NEG_INFINITY), F8E5M2::MIN);
        assert_eq!(F8E5M2::from_f32(f32::NAN).to_bits(), 0x7f);
        assert_eq!(F8E4M3::from_f32(-f32::NAN).to_bits(), 0x7f);
        assert_eq!(F8E4M3::from_f32(-1e-30).to_bits(), 0x80);
        assert_eq!(F8E5M2::from_f64(-0.0).to_bits(), 0x80);
        assert_eq!(F8E5M2::from_bits(0x7c).to_f32(), f32::INFINITY);
    }
}
