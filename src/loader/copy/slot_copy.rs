//! How a staging worker copies page-cached bytes into a pinned slot.
//!
//! Two flavours, picked by [`super::geometry`]:
//! - [`cached_copy`]: plain (temporal) stores, so the slot stays in the CPU's
//!   last-level cache and the DMA engine reads it from there. Used when the
//!   slots in use fit in that cache.
//! - [`stream_copy`]: non-temporal stores straight to DRAM. A plain copy into a
//!   slot the cache cannot keep reads every destination line before writing it
//!   (read-for-ownership) and then evicts it dirty, so streaming saves one
//!   memory pass per byte when the ring is larger than the cache.

/// Piece size for [`cached_copy`]: glibc's `memcpy` switches to non-temporal
/// stores above a threshold derived from the cache size per thread (as low as a
/// few hundred KiB on many-core machines), which would push the slot out of
/// the cache; pieces this small stay below it everywhere.
const CACHED_PIECE: usize = 128 << 10;

/// Copy `n` bytes from `src` to `dst` with ordinary stores, in pieces that
/// `memcpy` keeps temporal.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable for
/// `n` bytes, the ranges not overlapping.
pub unsafe fn cached_copy(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        let k = CACHED_PIECE.min(n - i);
        // SAFETY: `i + k <= n`, inside the caller's ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), k) };
        i += k;
    }
}

/// Copy `n` bytes from `src` to `dst` with streaming stores where the target
/// supports them (x86_64: SSE2, always present), else `copy_nonoverlapping`.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable for
/// `n` bytes, the ranges not overlapping.
pub unsafe fn stream_copy(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // Head: ordinary copy up to the first 16-byte aligned destination byte.
        let head = dst.align_offset(16).min(n);
        // SAFETY: within the caller's ranges (head <= n).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let body = (n - head) / 64 * 64;
        let mut i = head;
        while i < head + body {
            // SAFETY: i + 64 <= n; loads are unaligned-safe, stores are to
            // 16-byte aligned addresses (dst + head is aligned, steps of 16).
            unsafe {
                let s = src.add(i) as *const __m128i;
                let d = dst.add(i) as *mut __m128i;
                let a = _mm_loadu_si128(s);
                let b = _mm_loadu_si128(s.add(1));
                let c = _mm_loadu_si128(s.add(2));
                let e = _mm_loadu_si128(s.add(3));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
            i += 64;
        }
        // SAFETY: the tail lies within the caller's ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i) };
        // Order the streaming stores before anything that hands the slot to the
        // device (the transfer is queued after this returns).
        // SAFETY: a fence has no memory-safety preconditions.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from the caller.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, n)
    };
}

#[cfg(test)]
mod tests {
    use super::{cached_copy, stream_copy, CACHED_PIECE};

    #[test]
    fn cached_copy_copies_across_piece_boundaries_exactly() {
        let n = 3 * CACHED_PIECE + 123;
        let src: Vec<u8> = (0..n + 64).map(|i| (i * 13 + 5) as u8).collect();
        for (so, d_off, len) in [
            (0, 0, n),
            (7, 3, n - 7),
            (1, 0, CACHED_PIECE),
            (0, 9, 1),
            (5, 5, 0),
        ] {
            let mut dst = vec![0xEEu8; n + 64];
            // SAFETY: both ranges are inside their vectors and disjoint.
            unsafe { cached_copy(dst.as_mut_ptr().add(d_off), src.as_ptr().add(so), len) };
            assert_eq!(
                &dst[d_off..d_off + len],
                &src[so..so + len],
                "{so} {d_off} {len}"
            );
            assert!(dst[..d_off].iter().all(|&b| b == 0xEE));
            assert!(dst[d_off + len..].iter().all(|&b| b == 0xEE));
        }
    }

    #[test]
    fn copies_every_length_and_alignment_exactly() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        for so in [0usize, 1, 5, 16] {
            for d_off in [0usize, 1, 3, 8, 15] {
                for n in [0usize, 1, 15, 16, 63, 64, 65, 127, 200, 1000, 3000] {
                    let mut dst = vec![0xEEu8; 4200];
                    // SAFETY: both ranges are inside their vectors and disjoint.
                    unsafe { stream_copy(dst.as_mut_ptr().add(d_off), src.as_ptr().add(so), n) };
                    assert_eq!(&dst[d_off..d_off + n], &src[so..so + n], "{so} {d_off} {n}");
                    assert!(
                        dst[..d_off].iter().all(|&b| b == 0xEE),
                        "before {so} {d_off} {n}"
                    );
                    assert!(
                        dst[d_off + n..].iter().all(|&b| b == 0xEE),
                        "after {so} {d_off} {n}"
                    );
                }
            }
        }
    }
}
