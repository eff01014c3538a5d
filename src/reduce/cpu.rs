//! Host-memory reductions for every [`DataType`] × [`ReduceOp`], written as plain element loops
//! that the compiler vectorises. On x86-64 every loop is also compiled for AVX2 and picked at run
//! time when the CPU has it. `f16`/`bf16` are computed in `f32` (their [`divide`] in `f64`):
//! `bf16` with AVX2 sixteen at a time inside 128-bit lanes (even and odd elements widened by a
//! shift and a mask, rounded with integer adds, put back with a blend), or without AVX2 through
//! branchless conversions fused into the loop; `f16` through F16C (or, without it, the `half`
//! crate's slice conversions on cache-sized blocks). The 8-bit floats
//! ([`F8E4M3`], [`F8E5M2`]) are computed in `f32` too, through their branchless conversions
//! (which saturate, as NCCL's do).
//!
//! Buffers larger than the caches are walked as four interleaved streams, which keeps more
//! memory fetches in flight: an in-place `f32` sum of 64 MiB then runs at 85-100% of `memcpy`'s
//! speed (bytes of destination per second) instead of about 70%.
//!
//! Semantics are those of the arithmetic contract in [`crate::types`]. `Avg` combines as `Sum`;
//! its division by the rank count is [`divide`], applied once to the fully reduced value.
//!
//! The source operand may also be memory another process may write (shared memory,
//! `reduce_shared`, `reduce_into_shared`): it is then never formed into a slice but read
//! once per byte by volatile vector loads, a 64-byte piece at a time, and folded from
//! registers — at the slice kernels' speed (same walks, same bodies).
//!
//! Byte-slice entry points accept any alignment: misaligned slices are processed through a small
//! aligned bounce buffer (correct, somewhat slower). Transports hand out aligned memory, so the
//! fast path is the common one.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::float8::{F8E4M3, F8E5M2};
use crate::types::{DataType, Element, ReduceOp};

use super::shared::Shared;

/// `dst[i] = dst[i] ⊕ src[i]` for every element.
///
/// Fails with [`Error::InvalidArgument`] when the lengths differ or `op` is not defined on `T`.
pub fn reduce<T: Element>(dst: &mut [T], src: &[T], op: ReduceOp) -> Result<()> {
    reduce_bytes(
        bytemuck::cast_slice_mut(dst),
        bytemuck::cast_slice(src),
        T::DTYPE,
        op,
    )
}

/// `out[i] = a[i] ⊕ b[i]` for every element: one pass instead of copy-then-reduce.
///
/// Fails with [`Error::InvalidArgument`] when the lengths differ or `op` is not defined on `T`.
pub fn reduce_into<T: Element>(out: &mut [T], a: &[T], b: &[T], op: ReduceOp) -> Result<()> {
    reduce_into_bytes(
        bytemuck::cast_slice_mut(out),
        bytemuck::cast_slice(a),
        bytemuck::cast_slice(b),
        T::DTYPE,
        op,
    )
}

/// `dst[i] = dst[i] / by`: the final step of `avg`.
///
/// Integers truncate toward zero, for every `by` (one beyond the type's range gives 0, or -1 for
/// `MIN / 2^(bits-1)`). Floats get the correctly rounded quotient for every `by` up to 2^24
/// (`f32`), 2^53 (`f64`) or 2^40 (`f16`, `bf16`, `f8e4m3`, `f8e5m2`), so for any real rank
/// count; the 8-bit types saturate as their conversions do (an E5M2 infinity divided becomes
/// ±57344). `by == 1` leaves the bits untouched.
///
/// Fails with [`Error::InvalidArgument`] when `by` is zero.
pub fn divide<T: Element>(dst: &mut [T], by: usize) -> Result<()> {
    divide_bytes(bytemuck::cast_slice_mut(dst), T::DTYPE, by)
}

/// [`reduce`] on raw bytes holding elements of `dtype`.
///
/// Fails when the lengths differ, are not a multiple of the element size, or `op` is not
/// defined on `dtype`.
pub fn reduce_bytes(dst: &mut [u8], src: &[u8], dtype: DataType, op: ReduceOp) -> Result<()> {
    check(dtype, op, dst.len(), &[src.len()])?;
    if aligned(dst, dtype) && aligned(src, dtype) {
        reduce_aligned(dst, src, dtype, op);
    } else {
        bounce(dst, |d, lo, hi| {
            let mut s = Bounce::new();
            let s = s.load(&src[lo..hi]);
            reduce_aligned(d, s, dtype, op)
        });
    }
    Ok(())
}

/// [`reduce_into`] on raw bytes holding elements of `dtype`.
///
/// Fails when the lengths differ, are not a multiple of the element size, or `op` is not
/// defined on `dtype`.
pub fn reduce_into_bytes(
    out: &mut [u8],
    a: &[u8],
    b: &[u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    check(dtype, op, out.len(), &[a.len(), b.len()])?;
    if aligned(out, dtype) && aligned(a, dtype) && aligned(b, dtype) {
        reduce_into_aligned(out, a, b, dtype, op);
    } else {
        bounce(out, |o, lo, hi| {
            o.copy_from_slice(&a[lo..hi]);
            let mut s = Bounce::new();
            let s = s.load(&b[lo..hi]);
            reduce_aligned(o, s, dtype, op)
        });
    }
    Ok(())
}

/// [`divide`] on raw bytes holding elements of `dtype`.
///
/// Fails when `by` is zero or the length is not a multiple of the element size.
pub fn divide_bytes(dst: &mut [u8], dtype: DataType, by: usize) -> Result<()> {
    if by == 0 {
        return Err(Error::InvalidArgument("divide: divisor is zero".into()));
    }
    check(dtype, ReduceOp::Sum, dst.len(), &[])?;
    if by == 1 {
        return Ok(());
    }
    if aligned(dst, dtype) {
        divide_aligned(dst, dtype, by);
    } else {
        bounce(dst, |d, _, _| divide_aligned(d, dtype, by));
    }
    Ok(())
}

fn check(dtype: DataType, op: ReduceOp, len: usize, others: &[usize]) -> Result<()> {
    if !op.supports(dtype) {
        return Err(Error::InvalidArgument(format!(
            "reduce: operator {op} is not defined on {dtype}"
        )));
    }
    if !len.is_multiple_of(dtype.size()) {
        return Err(Error::InvalidArgument(format!(
            "reduce: {len} bytes is not a whole number of {dtype} elements"
        )));
    }
    if let Some(&bad) = others.iter().find(|&&l| l != len) {
        return Err(Error::InvalidArgument(format!(
            "reduce: operand lengths differ ({len} and {bad} bytes)"
        )));
    }
    Ok(())
}

/// [`reduce_bytes`] with the source in memory another process may write (see
/// [`super::shared`]): every source byte is read once, by a volatile load, fused into the
/// fold.
pub(crate) fn reduce_shared(
    dst: &mut [u8],
    src: Shared<'_>,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    if fold_small(dst, None, src, dtype, op) {
        return Ok(());
    }
    let src = Far::<u8>::of(src);
    check(dtype, op, dst.len(), &[src.len()])?;
    if aligned(dst, dtype) {
        reduce_aligned(dst, src, dtype, op);
    } else {
        bounce(dst, |d, lo, hi| {
            reduce_aligned(d, src.range(lo, hi - lo), dtype, op)
        });
    }
    Ok(())
}

/// [`reduce_into_bytes`] with `b` in memory another process may write (see
/// [`reduce_shared`]).
pub(crate) fn reduce_into_shared(
    out: &mut [u8],
    a: &[u8],
    b: Shared<'_>,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    if fold_small(out, Some(a), b, dtype, op) {
        return Ok(());
    }
    let b = Far::<u8>::of(b);
    check(dtype, op, out.len(), &[a.len(), b.len()])?;
    if aligned(out, dtype) && aligned(a, dtype) {
        reduce_into_aligned(out, a, b, dtype, op);
    } else {
        bounce(out, |o, lo, hi| {
            o.copy_from_slice(&a[lo..hi]);
            reduce_aligned(o, b.range(lo, hi - lo), dtype, op)
        });
    }
    Ok(())
}

/// Folds with an operand in shared memory of at most this many bytes go element by element
/// ([`fold_small`]).
const SMALL_BYTES: usize = 64;

/// `out = a ⊕ b` element by element (`a`: `out` itself where `None`), for a fold of at most
/// [`SMALL_BYTES`] whose type the loop below covers (the integers, `f32` and `f64`, with the
/// kernels' own arithmetic: wrapping integers, IEEE min/max): `b` is copied whole onto the stack
/// first. The few elements of a small call's fold then cost a few instructions each, where the
/// kernels' walk (checks, dispatch, a tail read from far memory piece by piece, a vectorised
/// loop's set-up) took 260–330 for 8 bytes (callgrind, the 2-rank one-shot all-reduce).
/// Elements are read and written unaligned, so any buffer will do. `false`, and nothing done,
/// for any other fold, and for lengths that differ or do not hold whole elements (the kernels'
/// path then says what is wrong).
#[inline]
fn fold_small(
    out: &mut [u8],
    a: Option<&[u8]>,
    b: Shared<'_>,
    dtype: DataType,
    op: ReduceOp,
) -> bool {
    let len = out.len();
    if len > SMALL_BYTES
        || b.len() != len
        || a.is_some_and(|a| a.len() != len)
        || !len.is_multiple_of(dtype.size())
    {
        return false;
    }
    macro_rules! fold {
        ($t:ty, $f:expr) => {{
            let f = $f;
            const W: usize = size_of::<$t>();
            let mut near = [0u64; SMALL_BYTES / 8];
            let near = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut near)[..len];
            b.copy_to(near);
            let (o, y) = (out.as_mut_ptr(), near.as_ptr());
            match a {
                // In place, through the one pointer: an operand pointer equal to the output's
                // at run time made the compiler's overlap check send the fold to its scalar
                // loop, and the 64-byte in-place all-reduce ran 2-5% slower than out of place.
                None => {
                    for i in 0..len / W {
                        // SAFETY: element `i` lies inside `out` and `near`, both `len` bytes
                        // long (checked above); unaligned reads and writes, so any alignment
                        // will do.
                        unsafe {
                            let p = o.add(i * W).cast::<$t>();
                            let v = f(
                                p.read_unaligned(),
                                y.add(i * W).cast::<$t>().read_unaligned(),
                            );
                            p.write_unaligned(v);
                        }
                    }
                }
                Some(a) => {
                    let x = a.as_ptr();
                    for i in 0..len / W {
                        // SAFETY: element `i` lies inside `out`, `a` and `near`, all `len`
                        // bytes long (checked above); unaligned reads and writes, so any
                        // buffer alignment will do; `out` is written only after both operands
                        // of the element are read.
                        unsafe {
                            let v = f(
                                x.add(i * W).cast::<$t>().read_unaligned(),
                                y.add(i * W).cast::<$t>().read_unaligned(),
                            );
                            o.add(i * W).cast::<$t>().write_unaligned(v);
                        }
                    }
                }
            }
            true
        }};
    }
    macro_rules! int {
        ($t:ty) => {
            match op {
                ReduceOp::Sum | ReduceOp::Avg => fold!($t, <$t>::wrapping_add),
                ReduceOp::Prod => fold!($t, <$t>::wrapping_mul),
                ReduceOp::Max => fold!($t, <$t>::max),
                ReduceOp::Min => fold!($t, <$t>::min),
                ReduceOp::BAnd => fold!($t, |x: $t, y: $t| x & y),
                ReduceOp::BOr => fold!($t, |x: $t, y: $t| x | y),
                ReduceOp::BXor => fold!($t, |x: $t, y: $t| x ^ y),
            }
        };
    }
    macro_rules! float {
        ($t:ty, $max:ident, $min:ident) => {
            match op {
                ReduceOp::Sum | ReduceOp::Avg => fold!($t, |x: $t, y: $t| x + y),
                ReduceOp::Prod => fold!($t, |x: $t, y: $t| x * y),
                ReduceOp::Max => fold!($t, $max),
                ReduceOp::Min => fold!($t, $min),
                // Not defined on floats: the kernels' path says so.
                ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => false,
            }
        };
    }
    match dtype {
        DataType::I8 => int!(i8),
        DataType::U8 => int!(u8),
        DataType::I32 => int!(i32),
        DataType::U32 => int!(u32),
        DataType::I64 => int!(i64),
        DataType::U64 => int!(u64),
        DataType::F32 => float!(f32, max_f32, min_f32),
        DataType::F64 => float!(f64, max_f64, min_f64),
        DataType::F16 | DataType::BF16 | DataType::F8E4M3 | DataType::F8E5M2 => false,
    }
}

fn aligned(bytes: &[u8], dtype: DataType) -> bool {
    bytes.as_ptr().align_offset(dtype.size()) == 0
}

/// An 8-byte-aligned block used to process misaligned byte slices piecewise.
struct Bounce([u64; BOUNCE_WORDS]);

const BOUNCE_WORDS: usize = 512;
const BOUNCE_BYTES: usize = BOUNCE_WORDS * 8;

impl Bounce {
    fn new() -> Self {
        Bounce([0; BOUNCE_WORDS])
    }

    fn load(&mut self, bytes: &[u8]) -> &[u8] {
        let buf: &mut [u8] = bytemuck::cast_slice_mut(&mut self.0);
        buf[..bytes.len()].copy_from_slice(bytes);
        &buf[..bytes.len()]
    }
}

/// Runs `f` over `dst` in aligned blocks: each block is copied into a bounce buffer, processed
/// there (`f(block, lo, hi)` with the block's byte range in `dst`) and copied back.
fn bounce(dst: &mut [u8], mut f: impl FnMut(&mut [u8], usize, usize)) {
    let mut block = Bounce::new();
    let mut lo = 0;
    while lo < dst.len() {
        let hi = (lo + BOUNCE_BYTES).min(dst.len());
        let buf: &mut [u8] = bytemuck::cast_slice_mut(&mut block.0);
        let buf = &mut buf[..hi - lo];
        buf.copy_from_slice(&dst[lo..hi]);
        f(buf, lo, hi);
        dst[lo..hi].copy_from_slice(buf);
        lo = hi;
    }
}

// ---------------------------------------------------------------------------------------------
// Dispatch from (dtype, op) to a monomorphic loop.
//
// Every loop below is `#[inline(always)]` down from these `*_impl` functions, so each is compiled
// twice: once for the baseline target (SSE2 on x86-64) and once inside the `x86` module's AVX2
// wrappers, picked at run time. The compiler vectorises both; AVX2 doubles the vector width and
// enables F16C half-float conversion, which is what makes `f16` fast.

fn reduce_aligned<B: Bytes>(dst: &mut [u8], src: B, dtype: DataType, op: ReduceOp) {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: `has_avx2` has just confirmed that this CPU supports AVX2 and F16C, the
        // features the function is compiled for.
        return unsafe { x86::reduce_aligned(dst, src, dtype, op) };
    }
    reduce_aligned_impl(dst, src, dtype, op)
}

fn reduce_into_aligned<B: Bytes>(out: &mut [u8], a: &[u8], b: B, dtype: DataType, op: ReduceOp) {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: as in `reduce_aligned`: AVX2 and F16C are present.
        return unsafe { x86::reduce_into_aligned(out, a, b, dtype, op) };
    }
    reduce_into_aligned_impl(out, a, b, dtype, op)
}

fn divide_aligned(dst: &mut [u8], dtype: DataType, by: usize) {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: as in `reduce_aligned`: AVX2 and F16C are present.
        return unsafe { x86::divide_aligned(dst, dtype, by) };
    }
    divide_aligned_impl(dst, dtype, by)
}

#[inline(always)]
fn reduce_aligned_impl<B: Bytes>(dst: &mut [u8], src: B, dtype: DataType, op: ReduceOp) {
    macro_rules! go {
        ($t:ty, $k:ident) => {
            $k::<$t>::reduce(bytemuck::cast_slice_mut(dst), src.typed::<$t>(), op)
        };
    }
    match dtype {
        DataType::I8 => go!(i8, Int),
        DataType::U8 => go!(u8, Int),
        DataType::I32 => go!(i32, Int),
        DataType::U32 => go!(u32, Int),
        DataType::I64 => go!(i64, Int),
        DataType::U64 => go!(u64, Int),
        DataType::F32 => go!(f32, Float),
        DataType::F64 => go!(f64, Float),
        DataType::F16 => go!(f16, Half),
        DataType::BF16 => go!(bf16, Half),
        DataType::F8E4M3 => go!(F8E4M3, Eight),
        DataType::F8E5M2 => go!(F8E5M2, Eight),
    }
}

#[inline(always)]
fn reduce_into_aligned_impl<B: Bytes>(
    out: &mut [u8],
    a: &[u8],
    b: B,
    dtype: DataType,
    op: ReduceOp,
) {
    macro_rules! go {
        ($t:ty, $k:ident) => {
            $k::<$t>::reduce_into(
                bytemuck::cast_slice_mut(out),
                bytemuck::cast_slice(a),
                b.typed::<$t>(),
                op,
            )
        };
    }
    match dtype {
        DataType::I8 => go!(i8, Int),
        DataType::U8 => go!(u8, Int),
        DataType::I32 => go!(i32, Int),
        DataType::U32 => go!(u32, Int),
        DataType::I64 => go!(i64, Int),
        DataType::U64 => go!(u64, Int),
        DataType::F32 => go!(f32, Float),
        DataType::F64 => go!(f64, Float),
        DataType::F16 => go!(f16, Half),
        DataType::BF16 => go!(bf16, Half),
        DataType::F8E4M3 => go!(F8E4M3, Eight),
        DataType::F8E5M2 => go!(F8E5M2, Eight),
    }
}

#[inline(always)]
fn divide_aligned_impl(dst: &mut [u8], dtype: DataType, by: usize) {
    macro_rules! go {
        ($t:ty, $k:ident) => {
            $k::<$t>::divide(bytemuck::cast_slice_mut(dst), by)
        };
    }
    match dtype {
        DataType::I8 => go!(i8, Int),
        DataType::U8 => go!(u8, Int),
        DataType::I32 => go!(i32, Int),
        DataType::U32 => go!(u32, Int),
        DataType::I64 => go!(i64, Int),
        DataType::U64 => go!(u64, Int),
        DataType::F32 => go!(f32, Float),
        DataType::F64 => go!(f64, Float),
        DataType::F16 => go!(f16, Half),
        DataType::BF16 => go!(bf16, Half),
        DataType::F8E4M3 => go!(F8E4M3, Eight),
        DataType::F8E5M2 => go!(F8E5M2, Eight),
    }
}

// ---------------------------------------------------------------------------------------------
// Sources. The operand folded in (`src`, or `b` of `reduce_into`) is either this process's own
// memory, read as a slice, or memory another process may write ([`Far`]), never formed into a
// slice: each 64-byte piece is read once by volatile vector loads into registers and folded
// from there, so the fold costs what the slice's does (no bounce through a buffer), and a
// writer racing with it can change the values folded and nothing else.

/// A fold's source operand: elements of `U`.
trait Source<U: Copy>: Copy {
    /// The elements as a slice, when this process may read them as one.
    fn slice(&self) -> Option<&[U]>;
    /// Number of elements.
    fn len(&self) -> usize;
    /// Elements `at..at + len`.
    fn range(self, at: usize, len: usize) -> Self;
    /// Elements `i·N..(i+1)·N` (one [`PIECE_BYTES`] piece), each read once.
    fn piece<const N: usize>(&self, i: usize) -> [U; N];
    /// The first `out.len()` elements, each read once.
    fn read_into(&self, out: &mut [U]);
    /// Hints that piece `i` (of `N` elements) will be read soon (see [`prefetch`]).
    fn prefetch_piece<const N: usize>(&self, i: usize);
}

impl<U: Copy> Source<U> for &[U] {
    #[inline(always)]
    fn slice(&self) -> Option<&[U]> {
        Some(self)
    }

    #[inline(always)]
    fn len(&self) -> usize {
        <[U]>::len(self)
    }

    #[inline(always)]
    fn range(self, at: usize, len: usize) -> Self {
        &self[at..at + len]
    }

    #[inline(always)]
    fn piece<const N: usize>(&self, i: usize) -> [U; N] {
        self[i * N..(i + 1) * N].try_into().expect("N elements")
    }

    #[inline(always)]
    fn read_into(&self, out: &mut [U]) {
        out.copy_from_slice(&self[..out.len()]);
    }

    #[inline(always)]
    fn prefetch_piece<const N: usize>(&self, i: usize) {
        prefetch(self.as_ptr().wrapping_add(i * N));
    }
}

/// Elements of `U` in memory another process may write (any alignment), readable for `'a`.
#[derive(Debug)]
pub(crate) struct Far<'a, U> {
    ptr: *const u8,
    len: usize,
    _memory: std::marker::PhantomData<&'a [U]>,
}

impl<U> Clone for Far<'_, U> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<U> Copy for Far<'_, U> {}

/// A `T` at any alignment, for volatile loads.
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct Packed<T: Copy>(T);

impl<'a> Far<'a, u8> {
    fn of(s: Shared<'a>) -> Far<'a, u8> {
        let (ptr, len) = s.raw();
        Far {
            ptr,
            len,
            _memory: std::marker::PhantomData,
        }
    }

    /// The same bytes as elements of `T` (whole elements only; callers checked the length).
    #[inline(always)]
    fn cast<T>(self) -> Far<'a, T> {
        Far {
            ptr: self.ptr,
            len: self.len / size_of::<T>(),
            _memory: std::marker::PhantomData,
        }
    }
}

impl<U: bytemuck::Pod> Source<U> for Far<'_, U> {
    #[inline(always)]
    fn slice(&self) -> Option<&[U]> {
        None
    }

    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn range(self, at: usize, len: usize) -> Self {
        assert!(at.checked_add(len).is_some_and(|e| e <= self.len));
        Far {
            // SAFETY: in bounds of the memory `self` covers (asserted).
            ptr: unsafe { self.ptr.add(at * size_of::<U>()) },
            len,
            _memory: std::marker::PhantomData,
        }
    }

    #[inline(always)]
    fn piece<const N: usize>(&self, i: usize) -> [U; N] {
        const { assert!(N * size_of::<U>() == PIECE_BYTES, "a piece is PIECE_BYTES") };
        debug_assert!((i + 1) * N <= self.len);
        // SAFETY: the piece lies inside the memory `self` covers (callers walk whole pieces
        // below `len`), readable for `'a`; `Packed` has alignment 1, so any address is aligned
        // for it; every bit pattern is a valid `U` (`Pod`).
        unsafe {
            let p = self.ptr.add(i * PIECE_BYTES);
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::__m128i;
                let v = [
                    std::ptr::read_volatile(p.cast::<Packed<__m128i>>()),
                    std::ptr::read_volatile(p.add(16).cast::<Packed<__m128i>>()),
                    std::ptr::read_volatile(p.add(32).cast::<Packed<__m128i>>()),
                    std::ptr::read_volatile(p.add(48).cast::<Packed<__m128i>>()),
                ];
                std::mem::transmute_copy::<[Packed<__m128i>; 4], [U; N]>(&v)
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                std::array::from_fn(|k| {
                    std::ptr::read_volatile(p.add(k * size_of::<U>()).cast::<Packed<U>>()).0
                })
            }
        }
    }

    #[inline(always)]
    fn read_into(&self, out: &mut [U]) {
        assert!(out.len() <= self.len);
        for (k, o) in out.iter_mut().enumerate() {
            // SAFETY: element `k < len` lies inside the memory `self` covers; see `piece`.
            *o = unsafe {
                std::ptr::read_volatile(self.ptr.add(k * size_of::<U>()).cast::<Packed<U>>()).0
            };
        }
    }

    #[inline(always)]
    fn prefetch_piece<const N: usize>(&self, i: usize) {
        // A hint, not a read: the program never sees the line's bytes.
        prefetch(self.ptr.wrapping_add(i * PIECE_BYTES));
    }
}

/// Source bytes, seen as elements of each data type.
trait Bytes: Copy {
    type Typed<T: bytemuck::Pod>: Source<T>;
    fn typed<T: bytemuck::Pod>(self) -> Self::Typed<T>;
}

impl<'a> Bytes for &'a [u8] {
    type Typed<T: bytemuck::Pod> = &'a [T];
    #[inline(always)]
    fn typed<T: bytemuck::Pod>(self) -> &'a [T] {
        bytemuck::cast_slice(self)
    }
}

impl<'a> Bytes for Far<'a, u8> {
    type Typed<T: bytemuck::Pod> = Far<'a, T>;
    #[inline(always)]
    fn typed<T: bytemuck::Pod>(self) -> Far<'a, T> {
        self.cast()
    }
}

// ---------------------------------------------------------------------------------------------
// Traversal. Large buffers come from DRAM, where one core's bandwidth is limited by how many
// cache-line fetches it keeps in flight; walking a buffer as several interleaved streams a cache
// line at a time keeps more of them in flight (glibc's `memcpy` of large sizes interleaves four
// pages likewise) and, with a software prefetch ahead of each stream, brings `dst ⊕= src` from
// about 70% to 85-100% of `memcpy`'s speed. Element order never matters: every element is
// computed independently.

/// Buffers of at least this many bytes are walked as [`STREAMS`] interleaved streams.
const STREAM_MIN_BYTES: usize = 1 << 20;
/// Number of interleaved streams per operand.
const STREAMS: usize = 4;
/// Bytes of each stream processed per step: one cache line.
const PIECE_BYTES: usize = 64;

/// Hints that the cache line 1 KiB past `p` will be read soon. The hardware prefetchers already
/// follow the streams; asking for lines this far ahead as well gains a few percent more. Never
/// faults, whatever the address; a no-op off x86-64.
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        const PREFETCH_BYTES: usize = 1024;
        let ahead = p.cast::<i8>().wrapping_add(PREFETCH_BYTES);
        // SAFETY: a prefetch only hints the cache; it never faults or reads memory into the
        // program, so any address is fine (and `wrapping_add` computes it without UB).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Elements of `$t` per piece, as a constant: walks take it as a const parameter `N`, so each
/// piece is an array whose loop the compiler unrolls completely.
macro_rules! piece {
    ($t:ty) => {
        PIECE_BYTES / size_of::<$t>()
    };
}

/// The length of each stream (a whole number of `N`-element pieces), or `None` to walk in one
/// pass.
#[inline(always)]
fn stream_len<const N: usize, T>(len: usize) -> Option<usize> {
    let q = len / STREAMS / N * N;
    (len * size_of::<T>() >= STREAM_MIN_BYTES && q > 0).then_some(q)
}

/// Splits `x` (of length `STREAMS * q`) into its [`STREAMS`] streams.
#[inline(always)]
fn streams_mut<T>(x: &mut [T], q: usize) -> [&mut [T]; STREAMS] {
    let (x0, x) = x.split_at_mut(q);
    let (x1, x) = x.split_at_mut(q);
    let (x2, x3) = x.split_at_mut(q);
    [x0, x1, x2, x3]
}

/// Splits `x` (of length `STREAMS * q`) into its [`STREAMS`] streams.
#[inline(always)]
fn streams<T>(x: &[T], q: usize) -> [&[T]; STREAMS] {
    let (x0, x) = x.split_at(q);
    let (x1, x) = x.split_at(q);
    let (x2, x3) = x.split_at(q);
    [x0, x1, x2, x3]
}

/// Matching `N`-element pieces of `d` and `s`.
#[inline(always)]
fn pieces2<'a, const N: usize, T, U>(
    d: &'a mut [T],
    s: &'a [U],
) -> impl Iterator<Item = (&'a mut [T; N], &'a [U; N])> {
    d.as_chunks_mut::<N>()
        .0
        .iter_mut()
        .zip(s.as_chunks::<N>().0)
}

/// Matching `N`-element pieces of `o`, `a` and `b`.
#[inline(always)]
fn pieces3<'a, const N: usize, T>(
    o: &'a mut [T],
    a: &'a [T],
    b: &'a [T],
) -> impl Iterator<Item = ((&'a mut [T; N], &'a [T; N]), &'a [T; N])> {
    let o = o.as_chunks_mut::<N>().0.iter_mut();
    o.zip(a.as_chunks::<N>().0).zip(b.as_chunks::<N>().0)
}

/// A loop over matching pieces of two slices. [`walk2`] calls it at several sites; a trait method
/// (unlike a closure) can be `#[inline(always)]`, so no call per cache line is left behind.
trait Body2<T, U> {
    fn run(&mut self, d: &mut [T], s: &[U]);
}

/// A loop over matching pieces of three slices, for [`walk3`]; see [`Body2`].
trait Body3<T> {
    fn run(&mut self, o: &mut [T], a: &[T], b: &[T]);
}

/// A closure as a [`Body2`]/[`Body3`] (made by [`each2`]/[`each3`], which fix its signature).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Each<F>(F);

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn each2<T, U, F: FnMut(&mut [T], &[U])>(f: F) -> Each<F> {
    Each(f)
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn each3<T, F: FnMut(&mut [T], &[T], &[T])>(f: F) -> Each<F> {
    Each(f)
}

impl<T, U, F: FnMut(&mut [T], &[U])> Body2<T, U> for Each<F> {
    #[inline(always)]
    fn run(&mut self, d: &mut [T], s: &[U]) {
        (self.0)(d, s)
    }
}

impl<T, F: FnMut(&mut [T], &[T], &[T])> Body3<T> for Each<F> {
    #[inline(always)]
    fn run(&mut self, o: &mut [T], a: &[T], b: &[T]) {
        (self.0)(o, a, b)
    }
}

/// The element loop `x = f(x, y)`, as a [`Body2`]/[`Body3`].
struct Zip<F>(F);

impl<T: Copy, F: Fn(T, T) -> T> Body2<T, T> for Zip<F> {
    #[inline(always)]
    fn run(&mut self, dst: &mut [T], src: &[T]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = (self.0)(*d, s);
        }
    }
}

impl<T: Copy, F: Fn(T, T) -> T> Body3<T> for Zip<F> {
    #[inline(always)]
    fn run(&mut self, out: &mut [T], a: &[T], b: &[T]) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = (self.0)(x, y);
        }
    }
}

/// Runs `body` on matching pieces of `dst` and `src` (equal lengths) until all are covered.
#[inline(always)]
fn walk2<const N: usize, T, U: bytemuck::Pod, S: Source<U>>(
    dst: &mut [T],
    src: S,
    body: impl Body2<T, U>,
) {
    match src.slice() {
        Some(src) => walk2_slices::<N, _, _>(dst, src, body),
        None => walk2_far::<N, _, _, _>(dst, src, body),
    }
}

/// [`walk2`] over a source read piece by piece ([`Source::piece`]), in the same order: four
/// interleaved streams for large buffers, then one.
#[inline(always)]
fn walk2_far<const N: usize, T, U: bytemuck::Pod, S: Source<U>>(
    dst: &mut [T],
    src: S,
    mut body: impl Body2<T, U>,
) {
    let q = stream_len::<N, T>(dst.len()).unwrap_or(0);
    let (streamed, rest) = dst.split_at_mut(q * STREAMS);
    if q > 0 {
        let [d0, d1, d2, d3] = streams_mut(streamed, q);
        let (d0, d1, d2, d3) = (
            d0.as_chunks_mut::<N>().0,
            d1.as_chunks_mut::<N>().0,
            d2.as_chunks_mut::<N>().0,
            d3.as_chunks_mut::<N>().0,
        );
        let s: [S; STREAMS] = std::array::from_fn(|k| src.range(k * q, q));
        for i in 0..q / N {
            for (d, s) in [&d0[i], &d1[i], &d2[i], &d3[i]].into_iter().zip(&s) {
                prefetch(d.as_ptr());
                s.prefetch_piece::<N>(i);
            }
            body.run(&mut d0[i], &s[0].piece::<N>(i));
            body.run(&mut d1[i], &s[1].piece::<N>(i));
            body.run(&mut d2[i], &s[2].piece::<N>(i));
            body.run(&mut d3[i], &s[3].piece::<N>(i));
            // As in `walk2_slices`.
            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        }
    }
    let src = src.range(q * STREAMS, rest.len());
    let (pieces, tail) = rest.as_chunks_mut::<N>();
    for (i, d) in pieces.iter_mut().enumerate() {
        body.run(d, &src.piece::<N>(i));
    }
    if !tail.is_empty() {
        let mut t: [U; N] = bytemuck::Zeroable::zeroed();
        let t = &mut t[..tail.len()];
        src.range(pieces.len() * N, tail.len()).read_into(t);
        body.run(tail, t);
    }
}

/// [`walk2`] over a slice.
#[inline(always)]
fn walk2_slices<const N: usize, T, U>(dst: &mut [T], src: &[U], mut body: impl Body2<T, U>) {
    let Some(q) = stream_len::<N, T>(dst.len()) else {
        return body.run(dst, src);
    };
    let (dst, dst_tail) = dst.split_at_mut(q * STREAMS);
    let (src, src_tail) = src.split_at(q * STREAMS);
    let [d0, d1, d2, d3] = streams_mut(dst, q);
    let [s0, s1, s2, s3] = streams(src, q);
    let steps = pieces2::<N, _, _>(d0, s0)
        .zip(pieces2::<N, _, _>(d1, s1))
        .zip(pieces2::<N, _, _>(d2, s2))
        .zip(pieces2::<N, _, _>(d3, s3));
    for (((p0, p1), p2), p3) in steps {
        for p in [&p0, &p1, &p2, &p3] {
            prefetch(p.0.as_ptr());
            prefetch(p.1.as_ptr());
        }
        body.run(p0.0, p0.1);
        body.run(p1.0, p1.1);
        body.run(p2.0, p2.1);
        body.run(p3.0, p3.1);
        // No instruction: this stops the compiler from vectorising this loop across pieces
        // (gathering one element from each of eight pieces), which its cost model picks for
        // some operators once it has unrolled the pieces' own loops; each piece's loop is
        // vectorised instead.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
    body.run(dst_tail, src_tail);
}

/// Runs `body` on matching pieces of `out`, `a` and `b` (equal lengths) until all are covered.
#[inline(always)]
fn walk3<const N: usize, T: bytemuck::Pod, S: Source<T>>(
    out: &mut [T],
    a: &[T],
    b: S,
    body: impl Body3<T>,
) {
    match b.slice() {
        Some(b) => walk3_slices::<N, _>(out, a, b, body),
        None => walk3_far::<N, _, _>(out, a, b, body),
    }
}

/// [`walk3`] with `b` read piece by piece, as [`walk2_far`].
#[inline(always)]
fn walk3_far<const N: usize, T: bytemuck::Pod, S: Source<T>>(
    out: &mut [T],
    a: &[T],
    b: S,
    mut body: impl Body3<T>,
) {
    let q = stream_len::<N, T>(out.len()).unwrap_or(0);
    let (streamed, rest) = out.split_at_mut(q * STREAMS);
    let (a_streamed, a_rest) = a.split_at(q * STREAMS);
    if q > 0 {
        let [o0, o1, o2, o3] = streams_mut(streamed, q);
        let (o0, o1, o2, o3) = (
            o0.as_chunks_mut::<N>().0,
            o1.as_chunks_mut::<N>().0,
            o2.as_chunks_mut::<N>().0,
            o3.as_chunks_mut::<N>().0,
        );
        let [a0, a1, a2, a3] = streams(a_streamed, q);
        let (a0, a1, a2, a3) = (
            a0.as_chunks::<N>().0,
            a1.as_chunks::<N>().0,
            a2.as_chunks::<N>().0,
            a3.as_chunks::<N>().0,
        );
        let s: [S; STREAMS] = std::array::from_fn(|k| b.range(k * q, q));
        for i in 0..q / N {
            for ((o, a), s) in [&o0[i], &o1[i], &o2[i], &o3[i]]
                .into_iter()
                .zip([&a0[i], &a1[i], &a2[i], &a3[i]])
                .zip(&s)
            {
                prefetch(o.as_ptr());
                prefetch(a.as_ptr());
                s.prefetch_piece::<N>(i);
            }
            body.run(&mut o0[i], &a0[i], &s[0].piece::<N>(i));
            body.run(&mut o1[i], &a1[i], &s[1].piece::<N>(i));
            body.run(&mut o2[i], &a2[i], &s[2].piece::<N>(i));
            body.run(&mut o3[i], &a3[i], &s[3].piece::<N>(i));
            // As in `walk2_slices`.
            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        }
    }
    let b = b.range(q * STREAMS, rest.len());
    let (pieces, tail) = rest.as_chunks_mut::<N>();
    let (a_pieces, a_tail) = a_rest.as_chunks::<N>();
    for (i, (o, a)) in pieces.iter_mut().zip(a_pieces).enumerate() {
        body.run(o, a, &b.piece::<N>(i));
    }
    if !tail.is_empty() {
        let mut t: [T; N] = bytemuck::Zeroable::zeroed();
        let t = &mut t[..tail.len()];
        b.range(pieces.len() * N, tail.len()).read_into(t);
        body.run(tail, a_tail, t);
    }
}

/// [`walk3`] over slices.
#[inline(always)]
fn walk3_slices<const N: usize, T>(out: &mut [T], a: &[T], b: &[T], mut body: impl Body3<T>) {
    let Some(q) = stream_len::<N, T>(out.len()) else {
        return body.run(out, a, b);
    };
    let (out, out_tail) = out.split_at_mut(q * STREAMS);
    let (a, a_tail) = a.split_at(q * STREAMS);
    let (b, b_tail) = b.split_at(q * STREAMS);
    let [o0, o1, o2, o3] = streams_mut(out, q);
    let [a0, a1, a2, a3] = streams(a, q);
    let [b0, b1, b2, b3] = streams(b, q);
    let steps = pieces3::<N, _>(o0, a0, b0)
        .zip(pieces3::<N, _>(o1, a1, b1))
        .zip(pieces3::<N, _>(o2, a2, b2))
        .zip(pieces3::<N, _>(o3, a3, b3));
    for (((p0, p1), p2), p3) in steps {
        for p in [&p0, &p1, &p2, &p3] {
            prefetch(p.0.0.as_ptr());
            prefetch(p.0.1.as_ptr());
            prefetch(p.1.as_ptr());
        }
        body.run(p0.0.0, p0.0.1, p0.1);
        body.run(p1.0.0, p1.0.1, p1.1);
        body.run(p2.0.0, p2.0.1, p2.1);
        body.run(p3.0.0, p3.0.1, p3.1);
        // As in `walk2`: keeps the compiler from vectorising across pieces.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
    body.run(out_tail, a_tail, b_tail);
}

// ---------------------------------------------------------------------------------------------
// The loops. Each op gets its own monomorphic loop so the compiler sees a branch-free body.

#[inline(always)]
fn zip2<const N: usize, T: bytemuck::Pod>(
    dst: &mut [T],
    src: impl Source<T>,
    f: impl Fn(T, T) -> T,
) {
    walk2::<N, _, _, _>(dst, src, Zip(f));
}

#[inline(always)]
fn zip3<const N: usize, T: bytemuck::Pod>(
    out: &mut [T],
    a: &[T],
    b: impl Source<T>,
    f: impl Fn(T, T) -> T,
) {
    walk3::<N, _, _>(out, a, b, Zip(f));
}

#[inline(always)]
fn map<T: Copy>(dst: &mut [T], f: impl Fn(T) -> T) {
    for d in dst.iter_mut() {
        *d = f(*d);
    }
}

/// `d / by` truncated toward zero, for `d` of type `$t` and `by: $div` (an unsigned type whose
/// maximum exceeds every magnitude of `$t`, `by ≥ 1`): the magnitude `|d|` is divided in `$div`
/// and the sign put back. Any `by` works: the caller clamps one beyond `$div`'s range to
/// `$div::MAX`, by which every magnitude of `$t` also divides to 0; and no quotient can overflow
/// (`MIN / -1` cannot arise, as it would if `by` were cast to a signed type).
macro_rules! int_quotient {
    (signed, $d:expr, $t:ty, $div:ty, $by:expr) => {{
        let q = ($d.unsigned_abs() as $div / $by) as $t;
        if $d < 0 { q.wrapping_neg() } else { q }
    }};
    (unsigned, $d:expr, $t:ty, $div:ty, $by:expr) => {
        ($d as $div / $by) as $t
    };
}

/// Integer loops: wrapping arithmetic, plain min/max, bitwise operators.
struct Int<T>(std::marker::PhantomData<T>);

macro_rules! int_kernels {
    ($($t:ty => $div:ty, $sign:ident);*) => {$(
        impl Int<$t> {
            #[inline(always)]
            fn reduce(dst: &mut [$t], src: impl Source<$t>, op: ReduceOp) {
                const N: usize = piece!($t);
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip2::<N, _>(dst, src, <$t>::wrapping_add),
                    ReduceOp::Prod => zip2::<N, _>(dst, src, <$t>::wrapping_mul),
                    ReduceOp::Max => zip2::<N, _>(dst, src, <$t>::max),
                    ReduceOp::Min => zip2::<N, _>(dst, src, <$t>::min),
                    ReduceOp::BAnd => zip2::<N, _>(dst, src, |a, b| a & b),
                    ReduceOp::BOr => zip2::<N, _>(dst, src, |a, b| a | b),
                    ReduceOp::BXor => zip2::<N, _>(dst, src, |a, b| a ^ b),
                }
            }

            #[inline(always)]
            fn reduce_into(out: &mut [$t], a: &[$t], b: impl Source<$t>, op: ReduceOp) {
                const N: usize = piece!($t);
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip3::<N, _>(out, a, b, <$t>::wrapping_add),
                    ReduceOp::Prod => zip3::<N, _>(out, a, b, <$t>::wrapping_mul),
                    ReduceOp::Max => zip3::<N, _>(out, a, b, <$t>::max),
                    ReduceOp::Min => zip3::<N, _>(out, a, b, <$t>::min),
                    ReduceOp::BAnd => zip3::<N, _>(out, a, b, |x, y| x & y),
                    ReduceOp::BOr => zip3::<N, _>(out, a, b, |x, y| x | y),
                    ReduceOp::BXor => zip3::<N, _>(out, a, b, |x, y| x ^ y),
                }
            }

            /// Truncating division, done on the magnitude in the unsigned type `$div` (see
            /// [`int_quotient`]).
            #[inline(always)]
            fn divide(dst: &mut [$t], by: usize) {
                let by = <$div>::try_from(by).unwrap_or(<$div>::MAX);
                map(dst, |d| int_quotient!($sign, d, $t, $div, by));
            }
        }
    )*};
}

// `$div` must exceed every magnitude of `$t`, so that clamping `by` to `$div::MAX` cannot change
// a quotient; `u64` for `u64` is the exception that needs no clamp (`usize` has at most 64 bits).
int_kernels!(
    i8 => u32, signed; u8 => u32, unsigned; i32 => u32, signed; u32 => u64, unsigned;
    i64 => u64, signed; u64 => u64, unsigned
);

/// `f32`/`f64` loops.
struct Float<T>(std::marker::PhantomData<T>);

/// IEEE 754-2019 `maximum`/`minimum` (NaN wins, -0 < +0): commutative and associative.
///
/// Written as three independent selects, not a chain of branches: the compiler turns each into
/// a packed compare and blend, both in loops and in the fully unrolled fixed-size pieces of a
/// walk (where a branchy chain stays scalar).
macro_rules! ieee_minmax {
    ($t:ty, $max:ident, $min:ident) => {
        #[inline(always)]
        fn $max(a: $t, b: $t) -> $t {
            let r = if a > b { a } else { b };
            // Equal values have equal bits except for ±0, where the and clears the sign unless
            // both are -0.
            let r = if a == b {
                <$t>::from_bits(a.to_bits() & b.to_bits())
            } else {
                r
            };
            // Unordered: at least one is NaN, and so is the sum.
            if a.is_nan() | b.is_nan() { a + b } else { r }
        }

        #[inline(always)]
        fn $min(a: $t, b: $t) -> $t {
            let r = if a < b { a } else { b };
            let r = if a == b {
                <$t>::from_bits(a.to_bits() | b.to_bits())
            } else {
                r
            };
            if a.is_nan() | b.is_nan() { a + b } else { r }
        }
    };
}

ieee_minmax!(f32, max_f32, min_f32);
ieee_minmax!(f64, max_f64, min_f64);

macro_rules! float_kernels {
    ($t:ty, $max:ident, $min:ident) => {
        impl Float<$t> {
            #[inline(always)]
            fn reduce(dst: &mut [$t], src: impl Source<$t>, op: ReduceOp) {
                const N: usize = piece!($t);
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip2::<N, _>(dst, src, |a, b| a + b),
                    ReduceOp::Prod => zip2::<N, _>(dst, src, |a, b| a * b),
                    ReduceOp::Max => zip2::<N, _>(dst, src, $max),
                    ReduceOp::Min => zip2::<N, _>(dst, src, $min),
                    ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                        unreachable!("checked: bitwise operators are integer-only")
                    }
                }
            }

            #[inline(always)]
            fn reduce_into(out: &mut [$t], a: &[$t], b: impl Source<$t>, op: ReduceOp) {
                const N: usize = piece!($t);
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip3::<N, _>(out, a, b, |x, y| x + y),
                    ReduceOp::Prod => zip3::<N, _>(out, a, b, |x, y| x * y),
                    ReduceOp::Max => zip3::<N, _>(out, a, b, $max),
                    ReduceOp::Min => zip3::<N, _>(out, a, b, $min),
                    ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                        unreachable!("checked: bitwise operators are integer-only")
                    }
                }
            }

            #[inline(always)]
            fn divide(dst: &mut [$t], by: usize) {
                let by = by as $t;
                map(dst, |d| d / by);
            }
        }
    };
}

float_kernels!(f32, max_f32, min_f32);
float_kernels!(f64, max_f64, min_f64);

/// `f16`/`bf16` loops: every operation is done in `f32` and rounded back.
///
/// `bf16` uses AVX2 sixteen elements at a time where the CPU has it (`x86::op16`: twice the
/// speed of the fused loop, 20 against 10 GiB/s for a 256 KiB sum in cache), and otherwise the
/// branchless [`bf16_to_f32`]/[`f32_to_bf16`] fused into the loop, which vectorises (the `half`
/// crate converts `bf16` one element at a time). `f16` uses F16C
/// where the CPU has it ([`x86`]), and otherwise the `half` crate's slice conversions on
/// [`HALF_BLOCK`]-element blocks.
struct Half<T>(std::marker::PhantomData<T>);

/// Elements per widened block on the `f16` fallback path: two `f32` blocks of this size stay
/// in L1.
const HALF_BLOCK: usize = 1024;

/// `bf16` to `f32`: exact, a shift.
#[inline(always)]
fn bf16_to_f32(h: bf16) -> f32 {
    f32::from_bits(u32::from(h.to_bits()) << 16)
}

/// `f32` to `bf16`, rounding to nearest even; NaN stays NaN (made quiet), ±inf and overflow
/// give ±inf. Branchless, so loops using it vectorise.
#[inline(always)]
fn f32_to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    // Adding 0x7fff plus the lowest kept bit rounds the discarded half to nearest even; a
    // carry out of the significand correctly bumps the exponent (up to infinity).
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x0040;
    bf16::from_bits(if x.is_nan() { nan } else { rounded } as u16)
}

/// `x / by` for a value `x` of a half type, as an `f32` that rounds (to nearest even) to the
/// correctly rounded half-type quotient.
///
/// Dividing in `f32` is not enough: the divisor (a rank count) need not be representable in the
/// half type, and then rounding the `f32` quotient again can land on the wrong side of a
/// half-type midpoint (e.g. `bf16` `-1.0014836e-32 / 16777215`). In `f64` the quotient of an
/// 11-bit value by a divisor below 2^40 is never within 2^-53 of such a midpoint unless it is
/// one, so rounding it once more is harmless; [`f64_to_f32_odd`] then carries it to `f32`
/// without a second rounding error.
#[inline(always)]
fn half_quotient(x: f32, by: f64) -> f32 {
    f64_to_f32_odd(f64::from(x) / by)
}

/// `x` rounded to `f32` by round-to-odd: exact when representable, otherwise whichever of the
/// two neighbours has an odd last bit. Rounding that again to nearest in a format of at most 22
/// significand bits (`f16`, `bf16`) gives the same result as rounding `x` directly. Branchless.
#[inline(always)]
pub(crate) fn f64_to_f32_odd(x: f64) -> f32 {
    let y = x as f32;
    let bits = y.to_bits();
    // NaN compares unequal to itself but needs no adjustment.
    let inexact = f64::from(y) != x && !x.is_nan();
    // One unit toward `x`: down in magnitude if `y` rounded away from zero, up otherwise.
    let toward_x = if f64::from(y).abs() > x.abs() {
        bits.wrapping_sub(1)
    } else {
        bits + 1
    };
    f32::from_bits(if inexact && bits & 1 == 0 {
        toward_x
    } else {
        bits
    })
}

/// Applies `f` in `f32` to the `f16` operands on the fallback path: `out = (a or out) ⊕ b`.
#[inline(always)]
fn f16_blocks(
    out: &mut [f16],
    a: Option<&[f16]>,
    b: impl Source<f16>,
    f: impl Fn(f32, f32) -> f32,
) {
    let mut x = [0f32; HALF_BLOCK];
    let mut y = [0f32; HALF_BLOCK];
    let mut h = [f16::ZERO; HALF_BLOCK];
    let mut lo = 0;
    while lo < out.len() {
        let hi = (lo + HALF_BLOCK).min(out.len());
        let n = hi - lo;
        match a {
            Some(a) => a[lo..hi].convert_to_f32_slice(&mut x[..n]),
            None => out[lo..hi].convert_to_f32_slice(&mut x[..n]),
        }
        let b = match b.slice() {
            Some(b) => &b[lo..hi],
            None => {
                b.range(lo, n).read_into(&mut h[..n]);
                &h[..n]
            }
        };
        b.convert_to_f32_slice(&mut y[..n]);
        for (x, &y) in x[..n].iter_mut().zip(&y[..n]) {
            *x = f(*x, y);
        }
        out[lo..hi].convert_from_f32_slice(&x[..n]);
        lo = hi;
    }
}

/// Calls `$go!(f)` with `f` the `f32` loop body for `$op`, monomorphic per operator.
macro_rules! with_f32_op {
    ($op:expr, $go:ident) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => $go!(|x: f32, y: f32| x + y),
            ReduceOp::Prod => $go!(|x: f32, y: f32| x * y),
            ReduceOp::Max => $go!(max_f32),
            ReduceOp::Min => $go!(min_f32),
            ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                unreachable!("checked: bitwise operators are integer-only")
            }
        }
    };
}

impl Half<bf16> {
    #[inline(always)]
    fn reduce(dst: &mut [bf16], src: impl Source<bf16>, op: ReduceOp) {
        macro_rules! go {
            ($f:expr) => {{
                let f = $f;
                #[cfg(target_arch = "x86_64")]
                if x86::has_avx2() {
                    // SAFETY: `has_avx2` has just confirmed AVX2.
                    return unsafe { x86::bf16_reduce(dst, src, f) };
                }
                zip2::<{ piece!(bf16) }, _>(dst, src, |a, b| {
                    f32_to_bf16(f(bf16_to_f32(a), bf16_to_f32(b)))
                })
            }};
        }
        with_f32_op!(op, go)
    }

    #[inline(always)]
    fn reduce_into(out: &mut [bf16], a: &[bf16], b: impl Source<bf16>, op: ReduceOp) {
        macro_rules! go {
            ($f:expr) => {{
                let f = $f;
                #[cfg(target_arch = "x86_64")]
                if x86::has_avx2() {
                    // SAFETY: `has_avx2` has just confirmed AVX2.
                    return unsafe { x86::bf16_reduce_into(out, a, b, f) };
                }
                zip3::<{ piece!(bf16) }, _>(out, a, b, |x, y| {
                    f32_to_bf16(f(bf16_to_f32(x), bf16_to_f32(y)))
                })
            }};
        }
        with_f32_op!(op, go)
    }

    #[inline(always)]
    fn divide(dst: &mut [bf16], by: usize) {
        let by = by as f64;
        map(dst, |d| f32_to_bf16(half_quotient(bf16_to_f32(d), by)));
    }
}

impl Half<f16> {
    #[inline(always)]
    fn reduce(dst: &mut [f16], src: impl Source<f16>, op: ReduceOp) {
        macro_rules! go {
            ($f:expr) => {{
                #[cfg(target_arch = "x86_64")]
                if x86::has_avx2() {
                    // SAFETY: `has_avx2` has just confirmed AVX2 and F16C.
                    return unsafe { x86::f16_reduce(dst, src, $f) };
                }
                f16_blocks(dst, None, src, $f)
            }};
        }
        with_f32_op!(op, go)
    }

    #[inline(always)]
    fn reduce_into(out: &mut [f16], a: &[f16], b: impl Source<f16>, op: ReduceOp) {
        macro_rules! go {
            ($f:expr) => {{
                #[cfg(target_arch = "x86_64")]
                if x86::has_avx2() {
                    // SAFETY: `has_avx2` has just confirmed AVX2 and F16C.
                    return unsafe { x86::f16_reduce_into(out, a, b, $f) };
                }
                f16_blocks(out, Some(a), b, $f)
            }};
        }
        with_f32_op!(op, go)
    }

    #[inline(always)]
    fn divide(dst: &mut [f16], by: usize) {
        let by = by as f64;
        #[cfg(target_arch = "x86_64")]
        if x86::has_avx2() {
            // SAFETY: `has_avx2` has just confirmed AVX2 and F16C.
            return unsafe { x86::f16_divide(dst, by) };
        }
        let mut x = [0f32; HALF_BLOCK];
        for block in dst.chunks_mut(HALF_BLOCK) {
            let x = &mut x[..block.len()];
            block.convert_to_f32_slice(x);
            for v in x.iter_mut() {
                *v = half_quotient(*v, by);
            }
            block.convert_from_f32_slice(x);
        }
    }
}

/// 8-bit float loops: every operation is done in `f32` and narrowed back with the type's
/// saturating round-to-nearest-even (as NCCL's `__nv_fp8_*` constructors do, with
/// `__NV_SATFINITE`). Both conversions are branch-free, so the loops vectorise.
struct Eight<T>(std::marker::PhantomData<T>);

macro_rules! eight_kernels {
    ($($t:ty),*) => {$(
        impl Eight<$t> {
            #[inline(always)]
            fn reduce(dst: &mut [$t], src: impl Source<$t>, op: ReduceOp) {
                macro_rules! go {
                    ($f:expr) => {{
                        let f = $f;
                        // Widen both, compute in f32, narrow (rounding, saturating) once.
                        zip2::<{ piece!($t) }, _>(dst, src, |a, b| {
                            <$t>::from_f32(f(a.to_f32(), b.to_f32()))
                        })
                    }};
                }
                with_f32_op!(op, go)
            }

            #[inline(always)]
            fn reduce_into(out: &mut [$t], a: &[$t], b: impl Source<$t>, op: ReduceOp) {
                macro_rules! go {
                    ($f:expr) => {{
                        let f = $f;
                        zip3::<{ piece!($t) }, _>(out, a, b, |x, y| {
                            <$t>::from_f32(f(x.to_f32(), y.to_f32()))
                        })
                    }};
                }
                with_f32_op!(op, go)
            }

            /// The quotient in `f64`, carried to `f32` by round-to-odd, narrowed once: correctly
            /// rounded, as for the half types ([`half_quotient`]).
            #[inline(always)]
            fn divide(dst: &mut [$t], by: usize) {
                let by = by as f64;
                map(dst, |d| <$t>::from_f32(half_quotient(d.to_f32(), by)));
            }
        }
    )*};
}

eight_kernels!(F8E4M3, F8E5M2);

/// AVX2 builds of the loops, and F16C conversion for `f16`.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m256i, _MM_FROUND_TO_NEAREST_INT, _mm256_add_epi32, _mm256_and_si256, _mm256_blend_epi16,
        _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_set1_epi32, _mm256_slli_epi32, _mm256_srli_epi32,
    };

    use half::{bf16, f16};

    use super::{Bytes, DataType, PIECE_BYTES, ReduceOp, Source};

    /// Whether the CPU has AVX2 and F16C (every AVX2 CPU has F16C; both are checked anyway).
    /// Detection is cached by the standard library: this is a load and a test.
    #[inline(always)]
    pub(super) fn has_avx2() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn reduce_aligned<B: Bytes>(dst: &mut [u8], src: B, dtype: DataType, op: ReduceOp) {
        super::reduce_aligned_impl(dst, src, dtype, op)
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn reduce_into_aligned<B: Bytes>(
        out: &mut [u8],
        a: &[u8],
        b: B,
        dtype: DataType,
        op: ReduceOp,
    ) {
        super::reduce_into_aligned_impl(out, a, b, dtype, op)
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn divide_aligned(dst: &mut [u8], dtype: DataType, by: usize) {
        super::divide_aligned_impl(dst, dtype, by)
    }

    /// Eight `f16` to `f32` (exact).
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn widen(h: [f16; 8]) -> [f32; 8] {
        bytemuck::cast(_mm256_cvtph_ps(bytemuck::cast(h)))
    }

    /// Eight `f32` to `f16`, rounding to nearest even (NaN stays NaN).
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn narrow(x: [f32; 8]) -> [f16; 8] {
        bytemuck::cast(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(
            bytemuck::cast(x),
        ))
    }

    /// `out = f(x, y)` lane by lane on eight `f16`, computed in `f32`.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn op8(x: [f16; 8], y: [f16; 8], f: &impl Fn(f32, f32) -> f32) -> [f16; 8] {
        let (x, y) = (widen(x), widen(y));
        narrow(std::array::from_fn(|i| f(x[i], y[i])))
    }

    /// Sixteen `bf16` (one 256-bit vector) as two vectors of eight `f32`, exact and without
    /// crossing 128-bit lanes: the even elements (each shifted to the top of its 32-bit word)
    /// and the odd ones (already at the top: the low half masked off).
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn widen_bf16(h: [bf16; 16]) -> ([f32; 8], [f32; 8]) {
        let v: __m256i = bytemuck::cast(h);
        let even = _mm256_slli_epi32::<16>(v);
        let odd = _mm256_and_si256(v, _mm256_set1_epi32(0xffff_0000_u32 as i32));
        (bytemuck::cast(even), bytemuck::cast(odd))
    }

    /// Eight `f32` results of `f32` arithmetic on operands widened from `bf16`, rounded to
    /// `bf16` to nearest even as [`super::f32_to_bf16`] does, each in the top half of its
    /// 32-bit word.
    ///
    /// No NaN case is needed: a NaN such arithmetic produces is quiet (hardware arithmetic
    /// quiets; `max_f32`/`min_f32` make theirs with an add) and is either the default NaN or an
    /// operand's payload, so its low half is zero; adding at most 0x8000 to a zero low half
    /// leaves the top half — quiet, as `f32_to_bf16` makes it — unchanged.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn round_bf16(x: [f32; 8]) -> __m256i {
        let b: __m256i = bytemuck::cast(x);
        let lowest_kept = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
        let bias = _mm256_add_epi32(lowest_kept, _mm256_set1_epi32(0x7fff));
        _mm256_add_epi32(b, bias)
    }

    /// The inverse of [`widen_bf16`], rounding: even results to the low halves of the 32-bit
    /// words, odd ones to the high halves.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn narrow_bf16(even: [f32; 8], odd: [f32; 8]) -> [bf16; 16] {
        let even = _mm256_srli_epi32::<16>(round_bf16(even));
        bytemuck::cast(_mm256_blend_epi16::<0b1010_1010>(even, round_bf16(odd)))
    }

    /// `out = f(x, y)` lane by lane on sixteen `bf16`, computed in `f32`.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn op16(x: [bf16; 16], y: [bf16; 16], f: &impl Fn(f32, f32) -> f32) -> [bf16; 16] {
        let ((xe, xo), (ye, yo)) = (widen_bf16(x), widen_bf16(y));
        narrow_bf16(
            std::array::from_fn(|i| f(xe[i], ye[i])),
            std::array::from_fn(|i| f(xo[i], yo[i])),
        )
    }

    /// `x` (at most `N` elements) padded with zeros to `N`.
    #[inline(always)]
    fn pad<T: bytemuck::Pod, const N: usize>(x: &[T]) -> [T; N] {
        let mut p = [T::zeroed(); N];
        p[..x.len()].copy_from_slice(x);
        p
    }

    /// `out = op(a, b)` on slices of equal length, `N` at a time plus a padded tail.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn zip_lanes<T: bytemuck::Pod, const N: usize>(
        out: &mut [T],
        a: &[T],
        b: &[T],
        op: &impl Fn([T; N], [T; N]) -> [T; N],
    ) {
        let (out_n, out_tail) = out.as_chunks_mut::<N>();
        let (a_n, a_tail) = a.as_chunks::<N>();
        let (b_n, b_tail) = b.as_chunks::<N>();
        for ((o, &x), &y) in out_n.iter_mut().zip(a_n).zip(b_n) {
            *o = op(x, y);
        }
        if !out_tail.is_empty() {
            let r = op(pad(a_tail), pad(b_tail));
            out_tail.copy_from_slice(&r[..out_tail.len()]);
        }
    }

    /// `dst = op(dst, src)` on a 2-byte type, `N` at a time plus a padded tail.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn reduce_lanes<T: bytemuck::Pod, const N: usize>(
        dst: &mut [T],
        src: impl Source<T>,
        op: impl Fn([T; N], [T; N]) -> [T; N],
    ) {
        const { assert!(size_of::<T>() == 2) };
        super::walk2::<{ PIECE_BYTES / 2 }, _, _, _>(
            dst,
            src,
            super::each2(|d: &mut [T], s: &[T]| {
                let (d_n, d_tail) = d.as_chunks_mut::<N>();
                let (s_n, s_tail) = s.as_chunks::<N>();
                for (d, &s) in d_n.iter_mut().zip(s_n) {
                    *d = op(*d, s);
                }
                if !d_tail.is_empty() {
                    let r = op(pad(d_tail), pad(s_tail));
                    d_tail.copy_from_slice(&r[..d_tail.len()]);
                }
            }),
        )
    }

    /// `out = op(a, b)` on a 2-byte type, `N` at a time plus a padded tail.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn reduce_into_lanes<T: bytemuck::Pod, const N: usize>(
        out: &mut [T],
        a: &[T],
        b: impl Source<T>,
        op: impl Fn([T; N], [T; N]) -> [T; N],
    ) {
        const { assert!(size_of::<T>() == 2) };
        super::walk3::<{ PIECE_BYTES / 2 }, _, _>(
            out,
            a,
            b,
            super::each3(|o, a, b| zip_lanes(o, a, b, &op)),
        )
    }

    /// `dst = op(dst)` on a 2-byte type, `N` at a time plus a padded tail.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn map_lanes<T: bytemuck::Pod, const N: usize>(dst: &mut [T], op: impl Fn([T; N]) -> [T; N]) {
        let (d_n, d_tail) = dst.as_chunks_mut::<N>();
        for d in d_n.iter_mut() {
            *d = op(*d);
        }
        if !d_tail.is_empty() {
            let r = op(pad(d_tail));
            d_tail.copy_from_slice(&r[..d_tail.len()]);
        }
    }

    /// `dst = f(dst, src)` on `f16` in `f32`, via F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn f16_reduce(dst: &mut [f16], src: impl Source<f16>, f: impl Fn(f32, f32) -> f32) {
        reduce_lanes(dst, src, |x, y| op8(x, y, &f))
    }

    /// `out = f(a, b)` on `f16` in `f32`, via F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn f16_reduce_into(
        out: &mut [f16],
        a: &[f16],
        b: impl Source<f16>,
        f: impl Fn(f32, f32) -> f32,
    ) {
        reduce_into_lanes(out, a, b, |x, y| op8(x, y, &f))
    }

    /// `dst = dst / by` on `f16` in `f32`, via F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn f16_divide(dst: &mut [f16], by: f64) {
        let div = |x: f32, _: f32| super::half_quotient(x, by);
        map_lanes(dst, |x| op8(x, x, &div))
    }

    /// `dst = f(dst, src)` on `bf16` in `f32`, sixteen at a time.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn bf16_reduce(
        dst: &mut [bf16],
        src: impl Source<bf16>,
        f: impl Fn(f32, f32) -> f32,
    ) {
        reduce_lanes(dst, src, |x, y| op16(x, y, &f))
    }

    /// `out = f(a, b)` on `bf16` in `f32`, sixteen at a time.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn bf16_reduce_into(
        out: &mut [bf16],
        a: &[bf16],
        b: impl Source<bf16>,
        f: impl Fn(f32, f32) -> f32,
    ) {
        reduce_into_lanes(out, a, b, |x, y| op16(x, y, &f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_mismatched_lengths_and_float_bitwise() {
        let mut d = [1f32, 2.0];
        assert!(reduce(&mut d, &[1.0], ReduceOp::Sum).is_err());
        assert!(reduce(&mut d, &[1.0, 2.0], ReduceOp::BXor).is_err());
        let mut b = [0u8; 6];
        assert!(reduce_bytes(&mut b, &[0u8; 6], DataType::F32, ReduceOp::Sum).is_err());
        assert!(divide(&mut d, 0).is_err());
    }

    #[test]
    fn misaligned_bytes_match_aligned() {
        // One byte of offset makes every f32 view misaligned.
        let n = 3000;
        let a: Vec<f32> = (0..n).map(|i| (i % 17) as f32 - 8.0).collect();
        let b: Vec<f32> = (0..n).map(|i| (i % 5) as f32).collect();
        let mut want = a.clone();
        reduce(&mut want, &b, ReduceOp::Sum).unwrap();

        let mut dst = vec![0u8; n * 4 + 1];
        let mut src = vec![0u8; n * 4 + 1];
        dst[1..].copy_from_slice(bytemuck::cast_slice(&a));
        src[1..].copy_from_slice(bytemuck::cast_slice(&b));
        reduce_bytes(&mut dst[1..], &src[1..], DataType::F32, ReduceOp::Sum).unwrap();
        assert_eq!(&dst[1..], bytemuck::cast_slice::<f32, u8>(&want));

        let mut out = vec![0u8; n * 4 + 1];
        let mut abytes = vec![0u8; n * 4 + 1];
        abytes[1..].copy_from_slice(bytemuck::cast_slice(&a));
        reduce_into_bytes(
            &mut out[1..],
            &abytes[1..],
            &src[1..],
            DataType::F32,
            ReduceOp::Sum,
        )
        .unwrap();
        assert_eq!(&out[1..], bytemuck::cast_slice::<f32, u8>(&want));
    }

    /// Folds whose source is shared memory (read by volatile loads, piece by piece) give the
    /// very bits the slice kernels give: every type and operator, lengths around a piece and
    /// beyond the size where walks split into streams, sources at any byte offset,
    /// destinations aligned or not.
    /// Equal element by element, any NaN equal to any NaN (which NaN an operation returns
    /// depends on the order the compiler picked for the operands).
    fn same(dtype: DataType, x: &[u8], y: &[u8]) -> bool {
        let nan = |e: &[u8]| match dtype {
            DataType::F32 => f32::from_le_bytes(e.try_into().unwrap()).is_nan(),
            DataType::F64 => f64::from_le_bytes(e.try_into().unwrap()).is_nan(),
            DataType::F16 => f16::from_le_bytes(e.try_into().unwrap()).is_nan(),
            DataType::BF16 => bf16::from_le_bytes(e.try_into().unwrap()).is_nan(),
            DataType::F8E4M3 => F8E4M3::from_bits(e[0]).is_nan(),
            DataType::F8E5M2 => F8E5M2::from_bits(e[0]).is_nan(),
            _ => false,
        };
        x.len() == y.len()
            && x.chunks(dtype.size())
                .zip(y.chunks(dtype.size()))
                .all(|(p, q)| p == q || (nan(p) && nan(q)))
    }

    #[test]
    fn shared_sources_fold_like_slices() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut byte = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        };
        for dtype in DataType::ALL {
            let size = dtype.size();
            for elems in [
                0usize,
                1,
                2,
                3,
                7,
                64 / size - 1,
                64 / size,
                64 / size + 3,
                1000,
                (1 << 20) / size + 9,
            ] {
                let len = elems * size;
                let a: Vec<u8> = (0..len).map(|_| byte()).collect();
                let b: Vec<u8> = (0..len + 3).map(|_| byte()).collect();
                for op in ReduceOp::ALL {
                    let mut want = a.clone();
                    if reduce_bytes(&mut want, &b[..len], dtype, op).is_err() {
                        continue; // not defined on this type
                    }
                    for off in [0usize, 1, 3] {
                        let src = &b[off..off + len];
                        let mut want = a.clone();
                        reduce_bytes(&mut want, src, dtype, op).unwrap();
                        // SAFETY: `src` is readable for its length while `b` lives.
                        let shared = unsafe { Shared::new(src.as_ptr(), len) };
                        let mut got = a.clone();
                        reduce_shared(&mut got, shared, dtype, op).unwrap();
                        assert!(
                            same(dtype, &got, &want),
                            "{dtype:?} {op:?} {elems} elements, offset {off}"
                        );
                        let mut got = vec![0u8; len];
                        reduce_into_shared(&mut got, &a, shared, dtype, op).unwrap();
                        assert!(
                            same(dtype, &got, &want),
                            "{dtype:?} {op:?} {elems} into, offset {off}"
                        );
                        if len > 0 && len < 4096 {
                            // A misaligned destination (and first operand): unaligned
                            // element accesses up to 64 bytes, the bounce block above.
                            let mut odd = vec![0u8; len + 1];
                            odd[1..].copy_from_slice(&a);
                            reduce_shared(&mut odd[1..], shared, dtype, op).unwrap();
                            assert!(
                                same(dtype, &odd[1..], &want),
                                "{dtype:?} {op:?} misaligned dst"
                            );
                            odd[1..].copy_from_slice(&a);
                            let mut got = vec![0u8; len + 1];
                            reduce_into_shared(&mut got[1..], &odd[1..], shared, dtype, op)
                                .unwrap();
                            assert!(
                                same(dtype, &got[1..], &want),
                                "{dtype:?} {op:?} misaligned into"
                            );
                        }
                    }
                }
            }
        }
        let mut d = [0u8; 8];
        let four = [0u8; 4];
        // SAFETY: `four` is readable for 4 bytes.
        let s = unsafe { Shared::new(four.as_ptr(), 4) };
        assert!(reduce_shared(&mut d, s, DataType::F32, ReduceOp::Sum).is_err());
    }
}
