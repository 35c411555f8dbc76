//! Content checksums of plan extents, for Reload's optional proof that the
//! checkpoint still holds the bytes that were loaded.
//!
//! Reads go through `pread`, never the mapping: a file shrunk underneath
//! gives an I/O error, not a fault. The checksum is a fast 64-bit mix (about
//! a memory pass), made to catch files rewritten in place, not adversaries.

use std::os::unix::fs::FileExt;

use super::checkpoint::Shard;
use super::plan::Extent;
use super::read_error::{check_read, read_failed};
use crate::driver::Driver;
use crate::error::Result;

const PIECE: usize = 8 << 20;
const K: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut h: u64, data: &[u8]) -> u64 {
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(K);
    }
    (h ^ data.len() as u64).wrapping_mul(K)
}

/// The checksum of `e`'s source bytes (its rows, in order) in `shard`. Each
/// read counts against `driver`'s fault table (when given).
pub fn extent(shard: &Shard, e: &Extent, driver: Option<&dyn Driver>) -> Result<u64> {
    let mut h = K ^ e.src;
    let mut buf = vec![0u8; PIECE.min((e.width * e.height) as usize).max(1)];
    let rows: Vec<(u64, u64)> = if shard.packed.is_some() {
        // A packed shard: the encoded frames that hold the extent's bytes.
        let end = e.src + (e.height - 1) * e.src_pitch + e.width;
        let (lo, hi) = shard.file_range(e.src, end).ok_or_else(|| {
            crate::error::Error::checkpoint(
                &shard.path,
                None,
                format!(
                    "original bytes [{}, {end}) are not in one packed piece",
                    e.src
                ),
            )
        })?;
        vec![(lo, hi - lo)]
    } else if e.src_pitch == e.width {
        vec![(e.src, e.width * e.height)]
    } else {
        (0..e.height)
            .map(|r| (e.src + r * e.src_pitch, e.width))
            .collect()
    };
    for (mut at, mut n) in rows {
        while n > 0 {
            let k = (n as usize).min(buf.len());
            if let Some(d) = driver {
                check_read(d, &shard.path, e.source, at, k as u64)?;
            }
            shard
                .file
                .read_exact_at(&mut buf[..k], at)
                .map_err(|err| read_failed(&shard.path, e.source, at, k as u64, err))?;
            h = mix(h, &buf[..k]);
            at += k as u64;
            n -= k as u64;
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::mix;

    #[test]
    fn mix_sees_every_byte_and_the_length() {
        let a = vec![7u8; 1001];
        let mut b = a.clone();
        b[1000] = 8;
        assert_ne!(mix(1, &a), mix(1, &b));
        b[1000] = 7;
        b[3] = 0;
        assert_ne!(mix(1, &a), mix(1, &b));
        assert_ne!(mix(1, &a[..1000]), mix(1, &a));
        assert_eq!(mix(1, &a), mix(1, &a.clone()));
    }
}
