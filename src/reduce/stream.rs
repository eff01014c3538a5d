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
    // SAFETY: both slices are valid for their (equal) length and cannot overlap (one is
    // borrowed mutably); the copy with non-temporal stores and its fence is the transport
    // crate's (the same one that copies out of shared memory).
    unsafe { oxccl_transport::shared::copy_streaming(dst.as_mut_ptr(), src.as_ptr(), dst.len()) }
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
