//! Range hashes: how Reload proves that device bytes still hold what a load
//! wrote, without copying them off the device.
//!
//! A range is read as little-endian 64-bit words, the last one zero-padded;
//! word k adds `mix(word, k)` to a 64-bit wrapping sum, and the hash is
//! `finish(sum, len)`. A sum does not depend on the order of its terms, so the
//! GPU kernel (`kernels/hash.cu`, loaded as PTX by the CUDA backend) sums
//! tiles of one range in different thread blocks and adds them atomically;
//! this module is the reference both backends agree with (the host backend
//! computes it directly, tile by tile as the kernel does, and the driver
//! contract suite compares the two on a GPU).
//!
//! It detects changes, not adversaries: any change of one word changes its
//! term (`mix` is a bijection of the word for each index), and two ranges
//! with different bytes collide with a probability of about 2^-64.

use super::DevicePtr;

/// Bytes of one tile: the unit one GPU thread block sums.
pub const TILE_BYTES: usize = 1 << 20;

/// splitmix64's finaliser over word `w` and its index `k`.
pub fn mix(w: u64, k: u64) -> u64 {
    let mut z = w ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The sum of `bytes`, whose first word is word `word0` of its range.
pub fn sum(bytes: &[u8], word0: u64) -> u64 {
    let mut s = 0u64;
    let mut k = word0;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("chunks of 8"));
        s = s.wrapping_add(mix(w, k));
        k += 1;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut w = [0u8; 8];
        w[..tail.len()].copy_from_slice(tail);
        s = s.wrapping_add(mix(u64::from_le_bytes(w), k));
    }
    s
}

/// The hash of a range of `len` bytes whose words sum to `sum`.
pub fn finish(sum: u64, len: usize) -> u64 {
    mix(sum, !(len as u64))
}

/// The hash of `bytes`.
pub fn hash(bytes: &[u8]) -> u64 {
    finish(sum(bytes, 0), bytes.len())
}

/// One tile of a range, as the kernel takes it (`struct Tile` in
/// `kernels/hash.cu`: four 64-bit fields in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Tile {
    /// Address of the tile's first byte.
    pub ptr: DevicePtr,
    /// Bytes in the tile (a multiple of 8 except in a range's last tile).
    pub len: u64,
    /// Index, in its range, of the tile's first word.
    pub word0: u64,
    /// Index of the range in the list given to [`tiles`].
    pub out: u64,
}

/// `ranges` cut into tiles of at most [`TILE_BYTES`] each.
pub fn tiles(ranges: &[(DevicePtr, usize)]) -> Vec<Tile> {
    let mut out = Vec::new();
    for (i, &(ptr, len)) in ranges.iter().enumerate() {
        let mut at = 0usize;
        while at < len {
            let n = TILE_BYTES.min(len - at);
            out.push(Tile {
                ptr: ptr + at as u64,
                len: n as u64,
                word0: (at / 8) as u64,
                out: i as u64,
            });
            at += n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        (0..n).map(|i| (mix(i as u64, seed) >> 17) as u8).collect()
    }

    #[test]
    fn tiles_sum_to_the_whole_range() {
        for len in [
            0,
            1,
            7,
            8,
            9,
            TILE_BYTES - 3,
            TILE_BYTES,
            TILE_BYTES + 5,
            3 * TILE_BYTES + 17,
        ] {
            let b = bytes(len, 1);
            let base = 0x1000u64;
            let mut s = 0u64;
            for t in tiles(&[(base, len)]) {
                let lo = (t.ptr - base) as usize;
                s = s.wrapping_add(sum(&b[lo..lo + t.len as usize], t.word0));
            }
            assert_eq!(s, sum(&b, 0), "len {len}");
        }
    }

    #[test]
    fn any_one_byte_change_changes_the_hash() {
        let b = bytes(4099, 7);
        let h = hash(&b);
        for i in (0..b.len()).step_by(37).chain([b.len() - 1]) {
            for flip in [1u8, 0x80, 0xff] {
                let mut c = b.clone();
                c[i] ^= flip;
                assert_ne!(hash(&c), h, "byte {i} ^ {flip:#x}");
            }
        }
    }

    #[test]
    fn swapped_words_and_trailing_zeros_are_seen() {
        let b = bytes(64, 3);
        let h = hash(&b);
        let mut s = b.clone();
        s[..16].rotate_left(8);
        assert_ne!(hash(&s), h, "words in another order hash differently");
        s[..16].rotate_left(8);
        assert_eq!(hash(&s), h, "the same bytes hash the same");
        let mut z = b.clone();
        z.push(0);
        assert_ne!(hash(&z), h, "a trailing zero byte changes the length");
    }

    #[test]
    fn tiles_name_their_range_and_first_word() {
        let t = tiles(&[(0, 10), (1 << 30, 2 * TILE_BYTES + 8)]);
        assert_eq!(t.len(), 4);
        assert_eq!((t[0].out, t[0].len, t[0].word0), (0, 10, 0));
        assert_eq!(
            (t[2].out, t[2].ptr, t[2].word0),
            (1, (1 << 30) + TILE_BYTES as u64, (TILE_BYTES / 8) as u64)
        );
        assert_eq!(t[3].len, 8);
    }
}
