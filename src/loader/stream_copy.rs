//! A copy with non-temporal (streaming) stores, for filling staging slots.
//!
//! A plain large `memcpy` (glibc uses ordinary stores up to a threshold tied
//! to the L3 size, well above a 16 MiB slot on big servers) reads every
//! destination line before writing it and leaves it dirty in the cache, where
//! the DMA engine must then snoop it. Streaming stores write straight to
//! memory: one memory pass less per byte in a copy that is memory-bound when
//! 16 threads fill slots while the device reads others. Measured on the 2-core
//! build host, page cache -> anonymous huge-page buffer, 16 MiB chunks:
//! memcpy 3.6-4.0 GB/s, streaming 4.4-5.3 GB/s (not yet measured on the H200).

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
    use super::stream_copy;

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
