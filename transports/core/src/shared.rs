//! Reading memory that another process may write at the same moment: shared-memory rings,
//! area buffers, anything mapped from a peer.
//!
//! The protocols say when a peer leaves such memory alone, but a peer that breaks them (a bug,
//! or a hostile process of the same user) must not be able to make this process misbehave
//! beyond reading odd values. So memory a peer may write is never read through a Rust
//! reference or a plain load the compiler may repeat, merge or reason about: only through the
//! copies here, whose loads the compiler must perform exactly once each, and whose result is
//! plain local data. Control words (lengths, kinds, addresses) are copied once, then checked
//! and used from the copy, never read twice.
//!
//! On x86-64 the bulk copies load 64 bytes at a time with `movdqu` in inline assembly (the
//! compiler sees an opaque instruction, not a load it may optimise — the READ_ONCE idea, at
//! memcpy speed: volatile loads of vector types need 16-byte aligned sources, and area data
//! starts 8 bytes off), then store normally or with non-temporal stores. Elsewhere they read
//! with [`core::ptr::read_volatile`], a byte at a time.

/// Copies `len` bytes from `src`, which a peer may be writing, to `dst`.
///
/// # Safety
///
/// `src` readable and `dst` writable for `len` bytes, not overlapping; nothing else in this
/// process writes `dst` meanwhile.
#[inline]
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { copy_with(dst, src, len, false) }
}

/// Like [`copy`], with non-temporal stores for the bulk (for outputs too large to stay in
/// cache): the caller's data goes to memory without evicting the cache.
///
/// # Safety
///
/// As for [`copy`].
#[inline]
pub unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { copy_with(dst, src, len, true) }
}

/// A plain value read once from memory a peer may write (a header, a descriptor).
///
/// # Safety
///
/// `src` readable for `size_of::<T>()` bytes (any alignment); every bit pattern must be a valid
/// `T` (integers and arrays of them).
pub unsafe fn read<T: Copy>(src: *const T) -> T {
    let mut out = std::mem::MaybeUninit::<T>::uninit();
    // SAFETY: `out` is local and `size_of::<T>()` bytes long; the caller vouches for `src`
    // and for every bit pattern being a `T`.
    unsafe {
        copy(out.as_mut_ptr().cast(), src.cast(), size_of::<T>());
        out.assume_init()
    }
}

/// Below this the streaming stores save nothing worth their fence.
const STREAM_MIN: usize = 256;

/// # Safety
///
/// As for [`copy`].
#[inline]
unsafe fn copy_with(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: forwarded from the caller.
        unsafe { x86::copy(dst, src, len, stream && len >= STREAM_MIN) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = stream;
        for i in 0..len {
            // SAFETY: in bounds of both ranges (the caller's contract).
            unsafe { dst.add(i).write(src.add(i).read_volatile()) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::{__m128i, _mm_sfence, _mm_storeu_si128, _mm_stream_si128};

    /// Loads 64 bytes at `p` (any alignment) as the processor's own `movdqu`s.
    ///
    /// # Safety
    ///
    /// `p` readable for 64 bytes.
    #[inline(always)]
    unsafe fn load64(p: *const u8) -> [__m128i; 4] {
        let (a, b, c, d): (__m128i, __m128i, __m128i, __m128i);
        // SAFETY: the caller vouches for 64 readable bytes; the asm reads exactly those and
        // touches nothing else (no stack, flags untouched). Not `pure`: every load happens.
        unsafe {
            asm!(
                "movdqu {a}, xmmword ptr [{p}]",
                "movdqu {b}, xmmword ptr [{p} + 16]",
                "movdqu {c}, xmmword ptr [{p} + 32]",
                "movdqu {d}, xmmword ptr [{p} + 48]",
                p = in(reg) p,
                a = out(xmm_reg) a,
                b = out(xmm_reg) b,
                c = out(xmm_reg) c,
                d = out(xmm_reg) d,
                options(nostack, readonly, preserves_flags),
            );
        }
        [a, b, c, d]
    }

    /// `rep movsb`: what memcpy itself uses for mid sizes on CPUs with fast string moves
    /// (ERMS, FSRM), as one opaque instruction.
    ///
    /// # Safety
    ///
    /// As for [`super::copy`].
    #[inline(always)]
    unsafe fn rep_movsb(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: copies exactly `len` bytes from `src` to `dst`, both the caller's; the
        // direction flag is clear by the ABI.
        unsafe {
            asm!(
                "rep movsb",
                inout("rcx") len => _,
                inout("rdi") dst => _,
                inout("rsi") src => _,
                options(nostack, preserves_flags),
            );
        }
    }

    /// Copies at least this long use `rep movsb`; shorter ones vector loops, as glibc's memcpy
    /// does (its threshold is 2 KiB per 16 bytes of vector: 4 KiB with AVX). A 512-byte
    /// `rep movsb` took a quarter of a 1 KiB all-gather through the area on the 2026-11-26 host
    /// (ERMS and FSRM).
    const REP_MOVSB_MIN: usize = 4096;

    /// Whether this CPU has AVX (checked once; std caches the answer).
    fn has_avx() -> bool {
        std::arch::is_x86_feature_detected!("avx")
    }

    /// Whether `rep movsb` from `src` to `dst` runs at its normal speed: not where the
    /// destination lies 1 to 63 bytes past the source modulo 4 KiB. There, on the 2026-11-27
    /// host (AMD EPYC), it ran 20–45 times slower — 16 KiB took 8 µs instead of 0.18, 128 KiB
    /// 64 µs instead of 3.2 — and glibc's `memcpy`, which uses it, too; the vector loop took
    /// 0.42 and 4.0 µs. That is where a page-aligned area buffer is copied into a buffer that
    /// `malloc` returned for a large allocation (16 bytes past a page boundary).
    #[inline(always)]
    pub(super) fn rep_movsb_fits(dst: *mut u8, src: *const u8) -> bool {
        let distance = (dst as usize).wrapping_sub(src as usize) % 4096;
        distance == 0 || distance >= 64
    }

    /// # Safety
    ///
    /// As for [`super::copy`].
    #[inline]
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
        if len < 64 {
            // A head, a length word, a small call's data: no vector step would run, and the
            // calls to reach the byte loop cost more than the copy (an 8-byte copy took 53
            // instructions through `copy_sse2`).
            // SAFETY: forwarded from the caller.
            return unsafe { bytes(dst, src, len) };
        }
        if !stream && len >= REP_MOVSB_MIN && rep_movsb_fits(dst, src) {
            // SAFETY: forwarded from the caller.
            return unsafe { rep_movsb(dst, src, len) };
        }
        if len >= 128 && has_avx() {
            // SAFETY: AVX is present (checked); the rest is the caller's contract.
            return unsafe { copy_avx(dst, src, len, stream) };
        }
        // SAFETY: forwarded from the caller.
        unsafe { copy_sse2(dst, src, len, stream) }
    }

    /// [`copy`] with 32-byte loads and stores.
    ///
    /// # Safety
    ///
    /// As for [`super::copy`], on a CPU with AVX.
    #[target_feature(enable = "avx")]
    unsafe fn copy_avx(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
        use std::arch::x86_64::{__m256i, _mm256_storeu_si256, _mm256_stream_si256};
        let head = if stream {
            dst.align_offset(32).min(len)
        } else {
            0
        };
        // SAFETY: `head <= len`; both ranges are the caller's.
        unsafe { bytes(dst, src, head) };
        let end = head + (len - head) / 64 * 64;
        let mut at = head;
        // SAFETY: every 64-byte step lies inside both ranges; AVX is enabled for this
        // function; streaming stores go to 32-byte aligned addresses. The asm reads exactly 64
        // bytes the caller vouches for and touches nothing else; not `pure`, so every load
        // happens.
        unsafe {
            while at < end {
                let (a, b): (__m256i, __m256i);
                asm!(
                    "vmovdqu {a}, ymmword ptr [{p}]",
                    "vmovdqu {b}, ymmword ptr [{p} + 32]",
                    p = in(reg) src.add(at),
                    a = out(ymm_reg) a,
                    b = out(ymm_reg) b,
                    options(nostack, readonly, preserves_flags),
                );
                let d = dst.add(at).cast::<__m256i>();
                if stream {
                    _mm256_stream_si256(d, a);
                    _mm256_stream_si256(d.add(1), b);
                } else {
                    _mm256_storeu_si256(d, a);
                    _mm256_storeu_si256(d.add(1), b);
                }
                at += 64;
            }
            if stream {
                _mm_sfence();
            }
            bytes(dst.add(at), src.add(at), len - at);
        }
    }

    /// [`copy`] with 16-byte loads and stores (SSE2, part of x86-64).
    ///
    /// # Safety
    ///
    /// As for [`super::copy`].
    unsafe fn copy_sse2(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
        // Head: single bytes up to a 16-byte aligned destination when streaming (non-temporal
        // stores need one), none otherwise.
        let head = if stream {
            dst.align_offset(16).min(len)
        } else {
            0
        };
        // SAFETY: `head <= len`; both ranges are the caller's.
        unsafe { bytes(dst, src, head) };
        let body = (len - head) / 64 * 64;
        let mut at = head;
        // SAFETY: every 64-byte step lies inside both ranges (`at + 64 <= head + body <= len`);
        // SSE2 is part of x86-64; streaming stores go to 16-byte aligned addresses (the head
        // aligned `dst + head`, and steps are multiples of 16).
        unsafe {
            while at < head + body {
                let v = load64(src.add(at));
                let d = dst.add(at).cast::<__m128i>();
                if stream {
                    _mm_stream_si128(d, v[0]);
                    _mm_stream_si128(d.add(1), v[1]);
                    _mm_stream_si128(d.add(2), v[2]);
                    _mm_stream_si128(d.add(3), v[3]);
                } else {
                    _mm_storeu_si128(d, v[0]);
                    _mm_storeu_si128(d.add(1), v[1]);
                    _mm_storeu_si128(d.add(2), v[2]);
                    _mm_storeu_si128(d.add(3), v[3]);
                }
                at += 64;
            }
            if stream {
                _mm_sfence();
            }
            bytes(dst.add(at), src.add(at), len - at);
        }
    }

    /// Loads 8 bytes at `p` (any alignment) with one `mov`.
    ///
    /// # Safety
    ///
    /// `p` readable for 8 bytes.
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> u64 {
        let v: u64;
        // SAFETY: as for `load64`, for 8 bytes.
        unsafe {
            asm!(
                "mov {v}, qword ptr [{p}]",
                p = in(reg) p,
                v = out(reg) v,
                options(nostack, readonly, preserves_flags),
            );
        }
        v
    }

    /// Copies a short range (a head or a tail): 8 bytes, then 1, at a time.
    ///
    /// # Safety
    ///
    /// As for [`super::copy`].
    #[inline(always)]
    unsafe fn bytes(dst: *mut u8, src: *const u8, len: usize) {
        let mut at = 0;
        // SAFETY: each access lies inside both ranges (the caller's contract).
        unsafe {
            while at + 8 <= len {
                dst.add(at)
                    .cast::<u64>()
                    .write_unaligned(load8(src.add(at)));
                at += 8;
            }
            while at < len {
                dst.add(at).write(src.add(at).read_volatile());
                at += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length, offset and alignment up to a few hundred bytes, both kinds of store,
    /// against `copy_from_slice`.
    #[test]
    fn copies_match_a_plain_copy() {
        let src: Vec<u8> = (0..2048u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in (0..300).chain([1000, 1024, 1537, 2000]) {
            for off in [0, 1, 7, 8, 15, 24, 33] {
                if off + len > src.len() {
                    continue;
                }
                for dst_off in [0, 3, 16] {
                    for stream in [false, true] {
                        let mut dst = vec![0xAAu8; len + dst_off + 8];
                        // SAFETY: both ranges in bounds of their vectors, distinct.
                        unsafe {
                            let (d, s) = (dst.as_mut_ptr().add(dst_off), src.as_ptr().add(off));
                            if stream {
                                copy_streaming(d, s, len);
                            } else {
                                copy(d, s, len);
                            }
                        }
                        assert_eq!(&dst[dst_off..dst_off + len], &src[off..off + len]);
                        assert!(dst[..dst_off].iter().all(|&b| b == 0xAA));
                        assert!(dst[dst_off + len..].iter().all(|&b| b == 0xAA));
                    }
                }
            }
        }
    }

    /// Copies long enough for `rep movsb`, with the destination at every distance from the
    /// source modulo 4 KiB that picks the vector loop instead (1–63) and around it.
    #[test]
    fn long_copies_match_at_every_distance_within_a_page() {
        let len = 3 * 4096 + 40;
        let src: Vec<u8> = (0..len as u32 + 4096).map(|i| (i * 13 + 5) as u8).collect();
        let mut dst = vec![0u8; len + 2 * 4096];
        let (s0, d0) = (src.as_ptr() as usize, dst.as_ptr() as usize);
        for distance in (0..80).chain([4000, 4095]) {
            // The destination offset that puts it `distance` past the source mod 4 KiB.
            let at = (distance + s0 % 4096 + 4096 - d0 % 4096) % 4096;
            dst.fill(0xAA);
            // SAFETY: `at + len` is inside `dst`, `len` inside `src`; distinct vectors.
            unsafe { copy(dst.as_mut_ptr().add(at), src.as_ptr(), len) };
            assert_eq!((d0 + at).wrapping_sub(s0) % 4096, distance);
            assert_eq!(&dst[at..at + len], &src[..len], "distance {distance}");
            assert!(dst[..at].iter().all(|&b| b == 0xAA));
            assert!(dst[at + len..].iter().all(|&b| b == 0xAA));
        }
        #[cfg(target_arch = "x86_64")]
        {
            let fits = |d: usize| x86::rep_movsb_fits((0x10_0000 + d) as *mut u8, 0x10_0000 as _);
            assert!(fits(0) && fits(64) && fits(4032) && fits(4095));
            assert!(!fits(1) && !fits(16) && !fits(63) && !fits(4096 + 16));
        }
    }

    #[test]
    fn values_are_read_whole_at_any_alignment() {
        let words: [u64; 4] = [1, 0x0102_0304_0506_0708, u64::MAX, 42];
        let bytes: Vec<u8> = std::iter::once(9u8)
            .chain(words.iter().flat_map(|w| w.to_ne_bytes()))
            .collect();
        // SAFETY: 1 + 32 bytes, read at offset 1 (unaligned); any bits are a valid [u64; 4].
        let back: [u64; 4] = unsafe { read(bytes.as_ptr().add(1).cast()) };
        assert_eq!(back, words);
    }
}
