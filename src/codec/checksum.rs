//! The per-block checksum: the range hash of the block's raw bytes (the same
//! function as `driver::hash`, restated here because the codec sits below the
//! driver), so a GPU thread block sums its words in any order and reduces once.
//!
//! A block is read as little-endian 64-bit words, the last zero-padded; word k
//! adds `mix(word, k)` to a wrapping 64-bit sum and the checksum is
//! `mix(sum, !len)`. A change of one word changes its term (`mix` is a
//! bijection for each index); two different blocks collide with a
//! probability of about 2^-64.

/// splitmix64's finaliser over word `w` and its index `k`.
#[inline]
pub fn mix(w: u64, k: u64) -> u64 {
    let mut z = w ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The checksum of one block's raw bytes.
pub fn block_checksum(bytes: &[u8]) -> u64 {
    let mut s = 0u64;
    let mut words = bytes.chunks_exact(8);
    let mut k = 0u64;
    for w in &mut words {
        s = s.wrapping_add(mix(u64::from_le_bytes(w.try_into().expect("8 bytes")), k));
        k += 1;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut w = [0u8; 8];
        w[..tail.len()].copy_from_slice(tail);
        s = s.wrapping_add(mix(u64::from_le_bytes(w), k));
    }
    mix(s, !(bytes.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_changed_byte_changes_it() {
        let mut b = vec![0u8; 4096];
        let c = block_checksum(&b);
        for i in [0, 1, 7, 8, 4095] {
            b[i] ^= 0x10;
            assert_ne!(block_checksum(&b), c);
            b[i] ^= 0x10;
        }
    }
}
