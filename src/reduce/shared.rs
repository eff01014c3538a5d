//! Memory another process may write while this one reads it (shared-memory slots, area
//! buffers, lent messages), as [`Shared`]: copied out only with [`oxccl_transport::shared`]'s
//! loads, which the compiler must perform exactly once each, so a peer that breaks the protocol
//! and writes meanwhile can make this rank copy odd bytes, nothing else.
//!
//! One exception, on purpose: [`Shared::folded`] hands the bytes to the reduction kernels as a
//! slice, to fold them into a local buffer in place. The kernels read each source byte once
//! and only combine it arithmetically into the destination (no length, index or branch target
//! comes from it), so a racing writer can change the values folded and nothing else. Going
//! through a volatile copy first (a 4 KiB bounce block per step) cost 7-8% of a 2-rank
//! two-shot all-reduce at 2-16 MiB on 2026-11-25 (`allreduce-perf --ranks 2 -b 256K -e 16M
//! -f 8 -R 3`, interleaved with the build before), where the copies themselves cost nothing
//! measurable; a fold whose source loads are themselves volatile (the kernels' walks loading
//! each 64-byte piece through `oxccl_transport::shared`) is the way to close it.

use std::marker::PhantomData;

use oxccl_transport::shared as peer;

/// `len` bytes at `ptr` that another process may write while this one reads them, readable
/// for `'a`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shared<'a> {
    ptr: *const u8,
    len: usize,
    _memory: PhantomData<&'a [u8]>,
}

impl<'a> Shared<'a> {
    /// # Safety
    ///
    /// `ptr` readable for `len` bytes for `'a` (mapped, in bounds). Nothing is assumed about
    /// its contents or about who writes them.
    pub(crate) unsafe fn new(ptr: *const u8, len: usize) -> Shared<'a> {
        Shared {
            ptr,
            len,
            _memory: PhantomData,
        }
    }

    /// Bytes in the range.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies the range into `out`, as long as the range.
    pub(crate) fn copy_to(self, out: &mut [u8]) {
        assert_eq!(out.len(), self.len, "shared copy: lengths differ");
        // SAFETY: `self` is readable for `len` bytes (its contract); `out` is this process's
        // own memory, as long and writable, and a `&mut` cannot alias shared memory a peer
        // maps (callers never form one over it).
        unsafe { peer::copy(out.as_mut_ptr(), self.ptr, self.len) }
    }

    /// [`Shared::copy_to`] with non-temporal stores (for outputs too large to stay in cache).
    pub(crate) fn copy_streaming_to(self, out: &mut [u8]) {
        assert_eq!(out.len(), self.len, "shared copy: lengths differ");
        // SAFETY: as in `copy_to`.
        unsafe { peer::copy_streaming(out.as_mut_ptr(), self.ptr, self.len) }
    }

    /// The bytes as a slice, for the reduction kernels to fold in place: the one exception
    /// described in the module docs. Use it for nothing else.
    pub(crate) fn folded(self) -> &'a [u8] {
        // SAFETY: readable for `len` bytes for `'a` (the contract of `new`); what a racing
        // writer can do to a fold is described in the module docs.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_match_the_source() {
        for len in [0usize, 3, 8, 63, 64, 65, 4096, 40_000] {
            for off in [0usize, 4, 24] {
                let src: Vec<u8> = (0..len + off).map(|i| (i * 13 + 5) as u8).collect();
                let s = &src[off..];
                // SAFETY: `s` is readable for its length while `src` lives.
                let shared = unsafe { Shared::new(s.as_ptr(), s.len()) };
                assert_eq!(shared.len(), len);
                let mut out = vec![0u8; len];
                shared.copy_to(&mut out);
                assert_eq!(out, s);
                let mut out = vec![0u8; len];
                shared.copy_streaming_to(&mut out);
                assert_eq!(out, s);
                assert_eq!(shared.folded(), s);
            }
        }
    }
}
