//! Memory another process may write while this one reads it (shared-memory slots, area
//! buffers, lent messages), as [`Shared`]: never formed into a slice. It is copied out with
//! [`oxccl_transport::shared`]'s loads ([`Shared::copy_to`]), or folded by the reduction
//! kernels' volatile loads ([`super::cpu::reduce_shared`]); either way the compiler must read
//! each byte exactly once, so a peer that breaks the protocol and writes meanwhile can make
//! this rank copy or compute odd values, nothing else.

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

    /// Where the range starts and how long it is, for the kernels' volatile loads.
    pub(crate) fn raw(&self) -> (*const u8, usize) {
        (self.ptr, self.len)
    }

    /// Bytes in the range.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies the range into `out`, as long as the range.
    #[inline]
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
            }
        }
    }
}
