//! Copies whose destination is not read again soon: non-temporal stores, which skip the read
//! for ownership a normal store costs (a cache line is written whole without being fetched) and
//! leave the caches to the data still in use. For large results written once, that is a third
//! of the memory traffic of the copy.

/// Copies `src` into `dst` (same length) with non-temporal stores where the CPU has them.
///
/// The stores are fenced before returning, so later stores (such as a progress flag) are not
/// seen before them.
///
/// # Panics
///
/// If the lengths differ.
pub fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming: lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        x86::copy(dst, src);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    /// Below this a streaming copy saves nothing worth the fence.
    const SMALL: usize = 256;

    pub(super) fn copy(dst: &mut [u8], src: &[u8]) {
        let len = dst.len();
        if len < SMALL {
            dst.copy_from_slice(src);
            return;
        }
        // Head: normal stores up to the first 16-byte aligned destination byte.
        let head = dst.as_ptr().align_offset(16).min(len);
        dst[..head].copy_from_slice(&src[..head]);
        let body = (len - head) / 64 * 64;
        // SAFETY: SSE2 is part of x86_64. `dst[head..head + body]` is 16-byte aligned and in
        // bounds, as is `src[head..head + body]` (unaligned loads); the ranges belong to
        // distinct slices, so they do not overlap.
        unsafe {
            let mut d = dst.as_mut_ptr().add(head).cast::<__m128i>();
            let mut s = src.as_ptr().add(head).cast::<__m128i>();
            let end = d.add(body / 16);
            while d < end {
                let a = _mm_loadu_si128(s);
                let b = _mm_loadu_si128(s.add(1));
                let c = _mm_loadu_si128(s.add(2));
                let e = _mm_loadu_si128(s.add(3));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
                d = d.add(4);
                s = s.add(4);
            }
            _mm_sfence();
        }
        let tail = head + body;
        dst[tail..].copy_from_slice(&src[tail..]);
    }
}

#[cfg(test)]
mod tests {
    use super::copy_streaming;

    #[test]
    fn copies_every_length_and_alignment() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; 5100];
        for off in 0..17 {
            for len in [0, 1, 15, 16, 63, 255, 256, 257, 1000, 4096, 4999 - off] {
                dst.fill(0xAA);
                copy_streaming(&mut dst[off..off + len], &src[off / 2..off / 2 + len]);
                assert_eq!(
                    &dst[off..off + len],
                    &src[off / 2..off / 2 + len],
                    "off {off} len {len}"
                );
                assert!(
                    dst[..off].iter().all(|&b| b == 0xAA),
                    "wrote before: off {off} len {len}"
                );
                assert!(
                    dst[off + len..].iter().all(|&b| b == 0xAA),
                    "wrote after: off {off} len {len}"
                );
            }
        }
    }
}
