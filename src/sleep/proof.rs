//! Reload's proof that a source still describes the device: what a load wrote,
//! cut into blocks, each with the hash of its bytes taken on the device right
//! after the load. At a Reload sleep the blocks are hashed again; a block
//! whose bytes changed since (a weight updated in place, a freed block reused
//! by PyTorch's caching allocator without our free) is no longer restored from
//! the checkpoint but kept in the host backup, so a wake never reverts a write.
//! Hashing reads HBM at terabytes per second: milliseconds for 16 GB.

use crate::driver::{DevicePtr, Driver};
use crate::error::Result;
use crate::sleep::ranges;

/// Bytes of one proof block: the unit a changed byte sends to the backup.
pub const BLOCK_BYTES: usize = 2 << 20;

/// The blocks of what a source wrote and their hashes after the load.
#[derive(Debug, Clone, Default)]
pub struct Proofs {
    /// `(address, length, hash)`, in the order of the ranges they were cut from.
    blocks: Vec<(DevicePtr, usize, u64)>,
}

/// Each range of `set` cut into blocks of at most [`BLOCK_BYTES`].
fn blocks_of(set: &[(DevicePtr, usize)]) -> Vec<(DevicePtr, usize)> {
    let mut out = Vec::new();
    for &(a, l) in set {
        let mut at = 0usize;
        while at < l {
            let n = BLOCK_BYTES.min(l - at);
            out.push((a + at as u64, n));
            at += n;
        }
    }
    out
}

impl Proofs {
    /// Hash `written` (the ranges a load just wrote, each cut on its own) on `driver`.
    ///
    /// # Safety
    /// Every range is mapped and readable by the driver's device, and no
    /// queued work still writes it.
    pub unsafe fn take(driver: &dyn Driver, written: &[(DevicePtr, usize)]) -> Result<Proofs> {
        let blocks = blocks_of(written);
        // SAFETY: forwarded from this function's contract.
        let hashes = unsafe { driver.hash_ranges(&blocks) }?;
        Ok(Proofs {
            blocks: blocks
                .into_iter()
                .zip(hashes)
                .map(|((a, l), h)| (a, l, h))
                .collect(),
        })
    }

    /// The blocks that still matter: those holding a byte of `live`.
    pub fn relevant(&self, live: &[(DevicePtr, usize)]) -> Vec<(DevicePtr, usize, u64)> {
        self.blocks
            .iter()
            .copied()
            .filter(|&(a, l, _)| !ranges::intersect(live, a, l).is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cut_each_range_at_block_size() {
        let b = blocks_of(&[(0, 10), (1 << 30, 2 * BLOCK_BYTES + 1)]);
        assert_eq!(
            b,
            vec![
                (0, 10),
                (1 << 30, BLOCK_BYTES),
                ((1 << 30) + BLOCK_BYTES as u64, BLOCK_BYTES),
                ((1 << 30) + 2 * BLOCK_BYTES as u64, 1),
            ]
        );
    }

    #[test]
    fn relevant_keeps_blocks_touching_live_bytes() {
        let p = Proofs {
            blocks: vec![(0, 100, 1), (100, 100, 2), (200, 100, 3)],
        };
        let r = p.relevant(&[(150, 10), (299, 1)]);
        assert_eq!(r, vec![(100, 100, 2), (200, 100, 3)]);
    }
}
