//! Split/merge bookkeeping of the blocks inside one segment.
//!
//! A [`BlockMap`] tiles a segment's whole reservation with blocks, each live
//! (held by a caller) or free. Taking part of a free block splits it; releasing
//! a block merges it with free neighbours, so two free blocks are never adjacent.
//! It touches no memory: the pool keeps its free-list index in step with the
//! [`Change`]s returned here.

use std::collections::BTreeMap;

use super::identity::BlockId;

/// One block: its size, whether a caller holds it, and (while live) the
/// identity of that allocation (see `identity.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockRec {
    pub size: usize,
    pub live: bool,
    /// The allocation's identity while live; `BlockId(0)` for a free block.
    pub id: BlockId,
}

/// The identity free blocks carry: none ever handed out.
const FREE: BlockId = BlockId(0);

/// Free blocks that disappeared and appeared, as `(offset, size)`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Change {
    pub removed_free: Vec<(usize, usize)>,
    pub added_free: Vec<(usize, usize)>,
}

/// Why a release was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseError {
    /// No block starts at that offset.
    NotABlockStart,
    /// The block there is already free.
    AlreadyFree,
}

/// The blocks of one segment, keyed by offset from its base.
#[derive(Debug)]
pub(crate) struct BlockMap {
    blocks: BTreeMap<usize, BlockRec>,
    total: usize,
}

impl BlockMap {
    /// One free block covering `total` bytes.
    pub fn new(total: usize) -> BlockMap {
        let mut blocks = BTreeMap::new();
        blocks.insert(
            0,
            BlockRec {
                size: total,
                live: false,
                id: FREE,
            },
        );
        BlockMap { blocks, total }
    }

    /// Mark the first `size` bytes of the free block at `offset` live as
    /// allocation `id`, splitting off the rest as a new free block.
    ///
    /// Panics when there is no free block of at least `size` bytes at `offset`
    /// (the pool only takes blocks it found in its free index).
    pub fn take(&mut self, offset: usize, size: usize, id: BlockId) -> Change {
        let rec = self.blocks[&offset];
        assert!(
            !rec.live && rec.size >= size && size > 0,
            "take({offset}, {size}) from block {rec:?}"
        );
        let mut ch = Change {
            removed_free: vec![(offset, rec.size)],
            added_free: Vec::new(),
        };
        self.blocks.insert(
            offset,
            BlockRec {
                size,
                live: true,
                id,
            },
        );
        if rec.size > size {
            let rest = (offset + size, rec.size - size);
            self.blocks.insert(
                rest.0,
                BlockRec {
                    size: rest.1,
                    live: false,
                    id: FREE,
                },
            );
            ch.added_free.push(rest);
        }
        ch
    }

    /// Mark the live block at `offset` free and merge it with free neighbours.
    /// Returns its size and the change; on error nothing changes.
    pub fn release(&mut self, offset: usize) -> Result<(usize, Change), ReleaseError> {
        let rec = *self
            .blocks
            .get(&offset)
            .ok_or(ReleaseError::NotABlockStart)?;
        if !rec.live {
            return Err(ReleaseError::AlreadyFree);
        }
        let mut ch = Change::default();
        let (mut start, mut size) = (offset, rec.size);
        if let Some((&prev, &p)) = self.blocks.range(..offset).next_back() {
            if !p.live {
                ch.removed_free.push((prev, p.size));
                self.blocks.remove(&offset);
                start = prev;
                size += p.size;
            }
        }
        let next_off = offset + rec.size;
        if let Some(&n) = self.blocks.get(&next_off) {
            if !n.live {
                ch.removed_free.push((next_off, n.size));
                self.blocks.remove(&next_off);
                size += n.size;
            }
        }
        self.blocks.insert(
            start,
            BlockRec {
                size,
                live: false,
                id: FREE,
            },
        );
        ch.added_free.push((start, size));
        Ok((rec.size, ch))
    }

    /// True when one free block covers everything.
    pub fn is_wholly_free(&self) -> bool {
        self.blocks.len() == 1 && self.blocks.get(&0).is_some_and(|b| !b.live)
    }

    /// The last block when it is free: `(offset, size)`.
    pub fn free_tail(&self) -> Option<(usize, usize)> {
        self.blocks
            .iter()
            .next_back()
            .filter(|(_, b)| !b.live)
            .map(|(&o, b)| (o, b.size))
    }

    /// End of the highest live block (0 when none).
    #[cfg(test)]
    pub fn live_end(&self) -> usize {
        self.blocks
            .iter()
            .rev()
            .find(|(_, b)| b.live)
            .map_or(0, |(&o, b)| o + b.size)
    }

    /// The block holding byte `offset`: `(its offset, record)`.
    pub fn containing(&self, offset: usize) -> Option<(usize, BlockRec)> {
        self.blocks
            .range(..=offset)
            .next_back()
            .filter(|(&o, b)| offset < o + b.size)
            .map(|(&o, &b)| (o, b))
    }

    /// Every block in address order, for invariant checks.
    pub fn iter(&self) -> impl Iterator<Item = (usize, BlockRec)> + '_ {
        self.blocks.iter().map(|(&o, &b)| (o, b))
    }

    /// Bytes this map tiles.
    pub fn total(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_tiling(m: &BlockMap) {
        let mut at = 0;
        let mut prev_free = false;
        for (o, b) in m.iter() {
            assert_eq!(o, at, "gap or overlap at {o}");
            assert!(!prev_free || b.live, "two adjacent free blocks at {o}");
            prev_free = !b.live;
            at += b.size;
        }
        assert_eq!(at, m.total());
    }

    #[test]
    fn split_and_merge_restore_one_free_block() {
        let mut m = BlockMap::new(4096);
        let c = m.take(0, 1024, BlockId(1));
        assert_eq!(c.removed_free, vec![(0, 4096)]);
        assert_eq!(c.added_free, vec![(1024, 3072)]);
        m.take(1024, 1024, BlockId(2));
        m.take(2048, 512, BlockId(3));
        assert_eq!(
            m.containing(1500).map(|(o, b)| (o, b.id)),
            Some((1024, BlockId(2)))
        );
        check_tiling(&m);
        assert_eq!(m.live_end(), 2560);
        // Free the middle one first: no neighbour is free.
        let (sz, c) = m.release(1024).unwrap();
        assert_eq!(sz, 1024);
        assert_eq!(c.added_free, vec![(1024, 1024)]);
        check_tiling(&m);
        // Freeing the last live block merges with both neighbours.
        let (_, c) = m.release(2048).unwrap();
        assert_eq!(c.added_free, vec![(1024, 3072)]);
        check_tiling(&m);
        assert_eq!(m.release(2048), Err(ReleaseError::NotABlockStart));
        assert_eq!(m.release(1024), Err(ReleaseError::AlreadyFree));
        m.release(0).unwrap();
        assert!(m.is_wholly_free());
        assert_eq!(m.free_tail(), Some((0, 4096)));
    }
}
