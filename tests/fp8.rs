//! The 8-bit floats (`F8E4M3`, `F8E5M2`) against references built from their definitions:
//!
//! - every bit pattern decodes to the value the OCP FP8 definition gives (sign, biased exponent,
//!   mantissa, subnormals, E4M3's single NaN, E5M2's infinities and NaNs);
//! - narrowing from `f32` and `f64` equals a brute-force search for the nearest representable
//!   value with ties to even, saturating as NCCL does (`__NV_SATFINITE`), on every `f32` with
//!   any upper 16 bits and the lower bits that sit on and around rounding boundaries, on every
//!   midpoint, and on `f64` values that a careless `f64 → f32 → fp8` would round twice;
//! - one reduction step of every pair of values, for every operator, equals the exact result
//!   rounded once by that reference, and (for sum and product) what NCCL's sm_90 kernels
//!   compute through `half` (`__nv_fp8_e4m3(__hadd(__half(x), __half(y)))`);
//! - all-reduce through the public API (`Communicator::init_local`, a thread per rank): on two
//!   ranks over every pair of bit patterns (one step, so no order question), on more ranks with
//!   data whose partial results are exact, and the saturation and NaN rules end to end.

use oxccl::reduce::cpu;
use oxccl::{Communicator, Config, DataType, Element, F8E4M3, F8E5M2, ReduceOp};

mod util;
use util::float_op as exact;

// ---------------------------------------------------------------------------------------------
// The reference: the formats from their definitions.

/// An 8-bit float format by its definition.
#[derive(Clone, Copy, Debug)]
struct Format {
    name: &'static str,
    exponent_bits: u32,
    mantissa_bits: u32,
    bias: i32,
    /// IEEE-like top exponent (infinities and NaNs, E5M2), or only `S.1111.111` is NaN (E4M3).
    ieee: bool,
}

const E4M3: Format = Format {
    name: "e4m3",
    exponent_bits: 4,
    mantissa_bits: 3,
    bias: 7,
    ieee: false,
};

const E5M2: Format = Format {
    name: "e5m2",
    exponent_bits: 5,
    mantissa_bits: 2,
    bias: 15,
    ieee: true,
};

/// What bits `b` mean in `f`: (-1)^s · 2^(e - bias) · 1.m, or (-1)^s · 2^(1 - bias) · 0.m for
/// e = 0; the top exponent is special.
fn definition(f: Format, b: u8) -> f64 {
    let s = b >> 7;
    let e = i32::from((b >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1));
    let m = f64::from(b & ((1 << f.mantissa_bits) - 1));
    let top = (1 << f.exponent_bits) - 1;
    let frac = m / 2f64.powi(f.mantissa_bits as i32);
    let magnitude = if e == top && f.ieee {
        if m == 0.0 { f64::INFINITY } else { f64::NAN }
    } else if e == top && m == 2f64.powi(f.mantissa_bits as i32) - 1.0 {
        f64::NAN
    } else if e == 0 {
        2f64.powi(1 - f.bias) * frac
    } else {
        2f64.powi(e - f.bias) * (1.0 + frac)
    };
    if s == 1 { -magnitude } else { magnitude }
}

/// The non-negative finite values of `f` with their codes, ascending (codes are ascending too).
fn finite_positives(f: Format) -> Vec<(f64, u8)> {
    let v: Vec<(f64, u8)> = (0u8..0x80)
        .map(|b| (definition(f, b), b))
        .filter(|(x, _)| x.is_finite())
        .collect();
    assert!(v.windows(2).all(|w| w[0].0 < w[1].0));
    v
}

/// `x` narrowed to `f` by brute force: the nearest of all finite values, ties to the even
/// code, saturating beyond the largest finite value (infinity included); NaN gives `0x7f`.
/// Comparisons only (against exact midpoints), no arithmetic that could round.
fn nearest(table: &[(f64, u8)], x: f64) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let &(max, max_code) = table.last().unwrap();
    if a >= max {
        return max_code | sign;
    }
    // The neighbours below and above (both exist: 0 ≤ a < max).
    let &(lo, lo_code) = table.iter().rev().find(|(v, _)| *v <= a).unwrap();
    let &(hi, hi_code) = table.iter().find(|(v, _)| *v >= a).unwrap();
    let code = if lo == a {
        lo_code
    } else {
        // Exact: both have at most 5 significant bits, well inside f64.
        let mid = (lo + hi) / 2.0;
        if a < mid {
            lo_code
        } else if a > mid {
            hi_code
        } else if lo_code.is_multiple_of(2) {
            lo_code
        } else {
            hi_code
        }
    };
    code | sign
}

/// Both NaN, or the same bits.
fn same_f64(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// The format under test, as a Rust type.
trait Fp8: Element + Copy {
    const FORMAT: Format;
    fn from_bits(b: u8) -> Self;
    fn to_bits(self) -> u8;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
    fn from_f64(x: f64) -> Self;
}

macro_rules! fp8 {
    ($t:ty, $f:expr) => {
        impl Fp8 for $t {
            const FORMAT: Format = $f;
            fn from_bits(b: u8) -> Self {
                <$t>::from_bits(b)
            }
            fn to_bits(self) -> u8 {
                <$t>::to_bits(self)
            }
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
            fn from_f32(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            fn from_f64(x: f64) -> Self {
                <$t>::from_f64(x)
            }
        }
    };
}

fp8!(F8E4M3, E4M3);
fp8!(F8E5M2, E5M2);

// ---------------------------------------------------------------------------------------------
// Conversions.

fn check_decoding<T: Fp8>() {
    let f = T::FORMAT;
    let (mut nans, mut infs) = (0, 0);
    for b in 0..=255u8 {
        let want = definition(f, b);
        let got = T::from_bits(b).to_f32();
        assert!(
            same_f64(f64::from(got), want),
            "{} {b:#04x}: decodes to {got:e}, the definition says {want:e}",
            f.name
        );
        nans += usize::from(want.is_nan());
        infs += usize::from(want.is_infinite());
    }
    let max = finite_positives(f).last().unwrap().0;
    let smallest = finite_positives(f)[1].0;
    match f.ieee {
        false => {
            assert_eq!((nans, infs, max, smallest), (2, 0, 448.0, 2f64.powi(-9)));
        }
        true => {
            assert_eq!((nans, infs, max, smallest), (6, 2, 57344.0, 2f64.powi(-16)));
        }
    }
}

#[test]
fn every_bit_pattern_decodes_to_its_definition() {
    check_decoding::<F8E4M3>();
    check_decoding::<F8E5M2>();
}

/// `f32` values on and around every rounding boundary of any 8-bit format: every upper 16 bits
/// (sign, exponent, top 7 mantissa bits: all boundaries of a format with at most 5 significant
/// bits lie on such values) with lower bits 0 and ±1 ulp from it, and a random one.
fn f32_probes() -> impl Iterator<Item = f32> {
    let mut state = 0x1234_5678_9abc_def0u64;
    (0..=u16::MAX).flat_map(move |hi| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let base = u32::from(hi) << 16;
        let random = (state >> 48) as u32;
        [
            base,
            base | 1,
            base | 0x7fff,
            base | 0x8000,
            base | 0x8001,
            base | 0xffff,
            base | random,
        ]
        .map(f32::from_bits)
    })
}

fn check_narrowing_f32<T: Fp8>() {
    let f = T::FORMAT;
    let table = finite_positives(f);
    let mut checked = 0;
    for x in f32_probes() {
        let want = nearest(&table, f64::from(x));
        let got = T::from_f32(x).to_bits();
        assert_eq!(
            got,
            want,
            "{} from_f32({x:e} = {:#010x}): got {got:#04x} = {:e}, want {want:#04x} = {:e}",
            f.name,
            x.to_bits(),
            definition(f, got),
            definition(f, want)
        );
        checked += 1;
    }
    assert_eq!(checked, 7 << 16);
}

#[test]
fn narrowing_f32_is_the_nearest_value_ties_to_even_saturating() {
    check_narrowing_f32::<F8E4M3>();
    check_narrowing_f32::<F8E5M2>();
}

fn check_midpoints_and_double_rounding<T: Fp8>() {
    let f = T::FORMAT;
    let table = finite_positives(f);
    let mut probes = vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MIN_POSITIVE,
        f64::from_bits(1),
        f64::MAX,
    ];
    for w in table.windows(2) {
        let (lo, hi) = (w[0].0, w[1].0);
        let mid = (lo + hi) / 2.0;
        for x in [lo, hi, mid] {
            // The value, its f64 neighbours (which f32 would round onto `x`), and its f32
            // neighbours.
            let x32 = x as f32;
            probes.extend([
                x,
                x.next_up(),
                x.next_down(),
                f64::from(x32.next_up()),
                f64::from(x32.next_down()),
            ]);
        }
    }
    // Beyond the largest value: the would-be next binade's midpoint and value, and far out.
    let max = table.last().unwrap().0;
    probes.extend([max * 1.0625, max * 1.125, max * 1.25, max * 2.0, 1e300]);
    for x in probes.clone() {
        probes.push(-x);
    }
    for x in probes {
        let want = nearest(&table, x);
        let got = T::from_f64(x).to_bits();
        assert_eq!(got, want, "{} from_f64({x:e})", f.name);
        let x32 = x as f32;
        let want32 = nearest(&table, f64::from(x32));
        assert_eq!(
            T::from_f32(x32).to_bits(),
            want32,
            "{} from_f32({x32:e})",
            f.name
        );
    }
}

#[test]
fn narrowing_midpoints_and_f64_rounds_once() {
    check_midpoints_and_double_rounding::<F8E4M3>();
    check_midpoints_and_double_rounding::<F8E5M2>();
}

#[test]
fn saturation_nan_and_signed_zero_spelled_out() {
    // E4M3: no infinity to overflow to; everything past 448 is 448 (464 is the tie between
    // 448 and the NaN pattern's place: to even, 448), NaN is 0x7f whatever its sign.
    for (x, bits) in [
        (448.0f32, 0x7e),
        (464.0, 0x7e),
        (465.0, 0x7e),
        (1e9, 0x7e),
        (f32::INFINITY, 0x7e),
        (f32::NEG_INFINITY, 0xfe),
        (-f32::NAN, 0x7f),
        (-0.0, 0x80),
        (-1e-6, 0x80),
        (2f32.powi(-10), 0x00), // tie between 0 and 2^-9: even is 0
        (2f32.powi(-10) * 1.0000001, 0x01), // just above: 2^-9
        (3.0 * 2f32.powi(-10), 0x02), // tie between 1 and 2 units: even is 2
        (0.0146484375, 0x08),   // 7.5 units of 2^-9: to 8 = 2^-6, the smallest normal
    ] {
        assert_eq!(F8E4M3::from_f32(x).to_bits(), bits, "e4m3 {x:e}");
    }
    // E5M2: IEEE-like, but narrowing saturates too: past 57344 (61440 is the tie with the
    // infinity's place: to even, that would be infinity, but saturation keeps 57344).
    for (x, bits) in [
        (57344.0f32, 0x7b),
        (61440.0, 0x7b),
        (65536.0, 0x7b),
        (f32::INFINITY, 0x7b),
        (f32::NEG_INFINITY, 0xfb),
        (f32::NAN, 0x7f),
        (-0.0, 0x80),
        (2f32.powi(-17), 0x00),
        (-(2f32.powi(-17)) * 1.5, 0x81),
        (1.125, 0x3c), // tie between 1 and 1.25: even is 1
        (1.375, 0x3e), // tie between 1.25 and 1.5: even is 1.5
    ] {
        assert_eq!(F8E5M2::from_f32(x).to_bits(), bits, "e5m2 {x:e}");
    }
    assert_eq!(F8E5M2::from_bits(0x7c).to_f32(), f32::INFINITY);
    assert_eq!(F8E5M2::from_bits(0xfc).to_f32(), f32::NEG_INFINITY);
}

// ---------------------------------------------------------------------------------------------
// One reduction step, every pair.

const FLOAT_OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
];

/// Every ordered pair of bit patterns: `a[i], b[i]` for `i = 256 · x + y`.
fn all_pairs<T: Fp8>() -> (Vec<T>, Vec<T>) {
    let a = (0..1 << 16)
        .map(|i: u32| T::from_bits((i >> 8) as u8))
        .collect();
    let b = (0..1 << 16).map(|i: u32| T::from_bits(i as u8)).collect();
    (a, b)
}

fn check_every_pair<T: Fp8>() {
    let f = T::FORMAT;
    let table = finite_positives(f);
    let (a, b) = all_pairs::<T>();
    for op in FLOAT_OPS {
        let mut got = a.clone();
        cpu::reduce(&mut got, &b, op).unwrap();
        let mut into = vec![T::from_bits(0xaa); a.len()];
        cpu::reduce_into(&mut into, &a, &b, op).unwrap();
        for i in 0..a.len() {
            let (x, y) = (f64::from(a[i].to_f32()), f64::from(b[i].to_f32()));
            let r = exact(op, x, y);
            let want = nearest(&table, r);
            let g = got[i].to_bits();
            let ok = |g: u8| g == want || (want == 0x7f && definition(f, g).is_nan());
            assert!(
                ok(g) && ok(into[i].to_bits()),
                "{} {op}: {x:e} ⊕ {y:e} = {r:e}: got {g:#04x} / {:#04x}, want {want:#04x}",
                f.name,
                into[i].to_bits()
            );
            // NCCL on sm_90 computes sum and product in half (`__hadd`, `__hmul`: correctly
            // rounded to binary16) and narrows that with __NV_SATFINITE: the same result,
            // because binary16's 11 bits are more than twice the formats' 4 (no double-rounding
            // error) and its range covers theirs (overflow saturates either way).
            if matches!(op, ReduceOp::Sum | ReduceOp::Prod) && !r.is_nan() {
                let through_half = half::f16::from_f64(r).to_f64();
                assert_eq!(
                    nearest(&table, through_half),
                    want,
                    "{} {op}: {x:e} ⊕ {y:e}: NCCL's half path differs",
                    f.name
                );
            }
        }
    }
}

#[test]
fn one_step_of_every_pair_is_the_exact_result_rounded_once() {
    check_every_pair::<F8E4M3>();
    check_every_pair::<F8E5M2>();
}

#[test]
fn division_is_correctly_rounded_and_saturates() {
    for by in [1usize, 2, 3, 7, 10, 100, 1000, 1 << 20, (1 << 40) - 1] {
        for f in [E4M3, E5M2] {
            let table = finite_positives(f);
            let all: Vec<u8> = (0..=255).collect();
            let mut got = all.clone();
            let dtype = if f.ieee {
                DataType::F8E5M2
            } else {
                DataType::F8E4M3
            };
            cpu::divide_bytes(&mut got, dtype, by).unwrap();
            for (&b, &g) in all.iter().zip(&got) {
                let x = definition(f, b);
                let want = if by == 1 {
                    b // untouched, infinities included
                } else if x.is_nan() {
                    0x7f
                } else {
                    nearest_quotient(&table, x, by as u64)
                };
                assert!(
                    g == want || (want == 0x7f && definition(f, g).is_nan()),
                    "{} {x:e} / {by}: got {g:#04x}, want {want:#04x}",
                    f.name
                );
            }
        }
    }
}

/// `x / by` narrowed to the format, decided exactly: the neighbours and midpoint of the
/// quotient are compared as `x` against `by · value` (exact in f64: at most 5 + 41 bits).
fn nearest_quotient(table: &[(f64, u8)], x: f64, by: u64) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let n = by as f64;
    let &(max, max_code) = table.last().unwrap();
    if a >= max * n {
        return max_code | sign; // infinities included
    }
    let &(lo, lo_code) = table.iter().rev().find(|(v, _)| v * n <= a).unwrap();
    let &(hi, hi_code) = table.iter().find(|(v, _)| v * n >= a).unwrap();
    let code = if lo * n == a {
        lo_code
    } else {
        let mid = (lo + hi) / 2.0 * n;
        if a < mid {
            lo_code
        } else if a > mid {
            hi_code
        } else if lo_code.is_multiple_of(2) {
            lo_code
        } else {
            hi_code
        }
    };
    code | sign
}

// ---------------------------------------------------------------------------------------------
// Through the public API.

/// Runs `f(rank, comm)` on a thread per rank of `n` local communicators; results in rank order.
fn on_ranks<R: Send>(n: usize, f: impl Fn(usize, &Communicator) -> R + Sync) -> Vec<R> {
    let comms = Communicator::init_local(n, Config::default()).expect("init_local");
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || f(r, c))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// Two ranks, every pair of bit patterns (rank 0 holds `a`, rank 1 `b`): each element takes
/// exactly one reduction step, so every route must give `round(a ⊕ b)` — and for avg
/// `round(round(a + b) / 2)`, the sum then one division — whatever the order of the operands.
fn check_two_ranks_every_pair<T: Fp8>() {
    let f = T::FORMAT;
    let table = finite_positives(f);
    let (a, b) = all_pairs::<T>();
    for op in FLOAT_OPS {
        let outs = on_ranks(2, |r, c| {
            let send = if r == 0 { a.clone() } else { b.clone() };
            let mut recv = vec![T::from_bits(0xa5); send.len()];
            c.all_reduce(&send, &mut recv, op).unwrap();
            let mut in_place = send;
            c.all_reduce_in_place(&mut in_place, op).unwrap();
            (recv, in_place)
        });
        for i in 0..a.len() {
            let (x, y) = (f64::from(a[i].to_f32()), f64::from(b[i].to_f32()));
            let step = nearest(&table, exact(op, x, y));
            let want = if op == ReduceOp::Avg && step != 0x7f {
                // Halving is exact in f64; the reference rounds it.
                nearest(&table, definition(f, step) / 2.0)
            } else {
                step
            };
            for (rank, (recv, in_place)) in outs.iter().enumerate() {
                for (what, g) in [("out of place", recv[i]), ("in place", in_place[i])] {
                    let g = g.to_bits();
                    assert!(
                        g == want || (want == 0x7f && definition(f, g).is_nan()),
                        "{} {op} {what} rank {rank}: {x:e} ⊕ {y:e}: got {g:#04x} ({:e}), \
                         want {want:#04x} ({:e})",
                        f.name,
                        definition(f, g),
                        definition(f, want)
                    );
                }
            }
        }
    }
}

#[test]
fn all_reduce_on_two_ranks_rounds_every_pair_like_the_reference() {
    check_two_ranks_every_pair::<F8E4M3>();
    check_two_ranks_every_pair::<F8E5M2>();
}

/// Several ranks, values whose every partial result is exact (so the reduction order cannot
/// matter), reduced in f32 step by step by the test: sums of halves up to 7.5 for E4M3 and of
/// -1/0/1 up to 5 for E5M2 (only five ranks contribute to each element), products of ±1 and
/// ±2, and min/max of anything finite. Avg is that sum divided once, rounded by the reference.
fn check_many_ranks<T: Fp8>(n: usize) {
    let f = T::FORMAT;
    let table = finite_positives(f);
    let len = 1000;
    let value = |op: ReduceOp, r: usize, i: usize| -> f64 {
        let h = (r * 7919 + i * 104_729 + 17) % 1009;
        match op {
            ReduceOp::Sum | ReduceOp::Avg if !(r + i).is_multiple_of(2) || r >= 10 => 0.0,
            ReduceOp::Sum | ReduceOp::Avg if f.ieee => (h % 3) as f64 - 1.0,
            ReduceOp::Sum | ReduceOp::Avg => (h % 7) as f64 * 0.5 - 1.5,
            ReduceOp::Prod => {
                let sign = if h.is_multiple_of(2) { 1.0 } else { -1.0 };
                if r < 6 && h.is_multiple_of(3) {
                    2.0 * sign
                } else {
                    sign
                }
            }
            _ => definition(f, (h % 256) as u8),
        }
    };
    for op in FLOAT_OPS {
        let outs = on_ranks(n, |r, c| {
            let mut buf: Vec<T> = (0..len).map(|i| T::from_f64(value(op, r, i))).collect();
            c.all_reduce_in_place(&mut buf, op).unwrap();
            buf
        });
        for i in 0..len {
            // The inputs as stored (E4M3 has no infinity: those saturate on the way in).
            let xs: Vec<f64> = (0..n)
                .map(|r| definition(f, T::from_f64(value(op, r, i)).to_bits()))
                .collect();
            // Step by step in f32, rounding after each step (exact here, so any order).
            let mut acc = xs[0];
            for &x in &xs[1..] {
                acc = definition(f, nearest(&table, exact(op, acc, x)));
            }
            let want = if op == ReduceOp::Avg {
                nearest_quotient(&table, acc, n as u64)
            } else {
                nearest(&table, acc)
            };
            for (rank, out) in outs.iter().enumerate() {
                let g = out[i].to_bits();
                assert!(
                    g == want || (want == 0x7f && definition(f, g).is_nan()),
                    "{} {op} n={n} rank {rank} element {i}: inputs {xs:?}: got {g:#04x}, want \
                     {want:#04x}",
                    f.name
                );
            }
        }
    }
}

#[test]
fn all_reduce_on_three_to_nine_ranks_matches_the_step_by_step_reference() {
    for n in [3, 4, 9] {
        check_many_ranks::<F8E4M3>(n);
        check_many_ranks::<F8E5M2>(n);
    }
}

#[test]
fn saturation_and_nan_survive_a_collective() {
    // E4M3: 448 · 3 saturates at 448 in any order; a NaN anywhere makes the sum NaN.
    let outs = on_ranks(3, |r, c| {
        let mut x = [F8E4M3::MAX, F8E4M3::MIN, F8E4M3::from_f32(1.0)];
        if r == 2 {
            x[2] = F8E4M3::NAN;
        }
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        x
    });
    for x in outs {
        assert_eq!(x[0], F8E4M3::MAX);
        assert_eq!(x[1], F8E4M3::MIN);
        assert!(x[2].is_nan());
    }
    // E5M2: an infinity taking part in a step comes out as the largest finite value (NCCL's
    // __NV_SATFINITE narrowing), for max as for sum; -inf + +inf is NaN.
    let outs = on_ranks(3, |r, c| {
        let inf = F8E5M2::from_bits(0x7c);
        let one = F8E5M2::from_f32(1.0);
        let mut max = [if r == 1 { inf } else { one }];
        c.all_reduce_in_place(&mut max, ReduceOp::Max).unwrap();
        let mut sum = [if r == 0 { inf } else { one }, [inf, -inf, one][r]];
        c.all_reduce_in_place(&mut sum, ReduceOp::Sum).unwrap();
        (max[0], sum)
    });
    for (max, sum) in outs {
        assert_eq!(max, F8E5M2::MAX);
        assert_eq!(sum[0], F8E5M2::MAX);
        assert!(sum[1].is_nan());
    }
}

#[test]
fn typed_collectives_move_fp8_bits_untouched() {
    // Broadcast and all-gather only move bytes: every pattern, NaNs and infinities included,
    // arrives as sent.
    let all: Vec<F8E5M2> = (0..=255).map(F8E5M2::from_bits).collect();
    let outs = on_ranks(3, |r, c| {
        let mut b = if r == 1 {
            all.clone()
        } else {
            vec![F8E5M2::ZERO; 256]
        };
        c.broadcast_in_place(&mut b, 1).unwrap();
        let mine: Vec<F8E4M3> = (0..=255u8)
            .map(|i| F8E4M3::from_bits(i.wrapping_add(r as u8)))
            .collect();
        let mut gathered = vec![F8E4M3::ZERO; 3 * 256];
        c.all_gather(&mine, &mut gathered).unwrap();
        (b, gathered)
    });
    for (b, gathered) in outs {
        assert!(b.iter().zip(&all).all(|(x, y)| x.to_bits() == y.to_bits()));
        for (j, g) in gathered.iter().enumerate() {
            assert_eq!(g.to_bits(), ((j % 256) as u8).wrapping_add((j / 256) as u8));
        }
    }
}
