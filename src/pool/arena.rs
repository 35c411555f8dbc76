//! The expandable per-tag arena: one large VA reservation per tag, with
//! physical memory committed as the arena grows (the way PyTorch's expandable
//! segments and ggml's VMM pool work), so a model's weights live in one
//! segment with little rounding waste.
//!
//! Growth commits exactly up to the end of the highest block, rounded up to
//! the granularity, in physical chunks of at most `grow_step` bytes. `trim`
//! decommits whole chunks past the last live block. So, per tag:
//! - while only growing, tracked bytes exceed the end of the highest live block
//!   by less than one granule;
//! - after a trim, by less than one chunk (`grow_step`; one granule by default).
//!
//! Holes left by frees in the middle stay backed and are reused best-fit.

use super::{
    apply, best_fit, grant_tag_peers, insert_segment, tag_create_flags, take, Block, Pool,
    SegmentClass, State,
};
use crate::driver::round_up;
use crate::error::{Error, Result};
use crate::segment::Segment;
use crate::tag::TagId;

impl Pool {
    /// Place `size` bytes in `tag`'s arena, creating the arena on first use.
    /// `Ok(None)` when the arena has no free range large enough.
    pub(super) fn arena_alloc(
        &self,
        st: &mut State,
        size: usize,
        tag: TagId,
        reserve_bytes: usize,
        grow_step: usize,
    ) -> Result<Option<Block>> {
        if st.tags.get(&tag).and_then(|t| t.arena).is_none() {
            let step = if grow_step == 0 {
                self.granularity
            } else {
                round_up(grow_step, self.granularity)
            };
            let mut seg = Segment::reserve(self.driver.clone(), reserve_bytes, step)
                .map_err(|e| self.unreservable(e, reserve_bytes, tag))?;
            seg.set_create_flags(tag_create_flags(st, tag));
            grant_tag_peers(st, tag, &mut seg)?;
            let base = insert_segment(st, seg, tag, SegmentClass::Arena);
            st.tags.entry(tag).or_default().arena = Some(base);
        }
        let Some((base, off)) = best_fit(&st.free, tag, SegmentClass::Arena, size) else {
            return Ok(None);
        };
        let block = take(st, base, off, size);
        let e = st.segs.get_mut(&base).expect("arena segment exists");
        let end = off + size;
        if end > e.seg.committed() {
            if let Err(err) = e.seg.commit(end) {
                // The segment is unchanged (commit is transactional); undo the split.
                let (_, ch) = e
                    .blocks
                    .release(off)
                    .expect("block just taken is live at that offset");
                e.live_bytes -= size;
                e.live_blocks -= 1;
                apply(&mut st.free, tag, SegmentClass::Arena, base, ch);
                return Err(err);
            }
        }
        Ok(Some(block))
    }

    /// A reservation the driver refused is a request the device cannot hold:
    /// out of memory, as the ordinary path reports a size over the device's
    /// (the arena's size is address space, which no pre-check can bound).
    /// Other errors (a bad argument) stay as they are.
    fn unreservable(&self, e: Error, reserve_bytes: usize, tag: TagId) -> Error {
        match e {
            Error::Driver { .. } => Error::OutOfMemory {
                what: format!(
                    "arena of tag `{}`: reserving {reserve_bytes} bytes of address space was refused ({e})",
                    crate::tag::name_of(tag)
                ),
                requested: reserve_bytes as u64,
                free: self.driver.mem_info().map_or(0, |m| m.free),
            },
            other => other,
        }
    }

    /// Decommit the free tail of every awake arena. Returns the tracked bytes
    /// released and the first driver error, if any (the bookkeeping is updated
    /// either way: a chunk whose unmap failed is dropped from the segment).
    pub(super) fn arena_trim_tails(&self, st: &mut State) -> (u64, Option<Error>) {
        let arenas: Vec<_> = st
            .tags
            .values()
            .filter(|t| !t.asleep && !t.transition)
            .filter_map(|t| t.arena)
            .collect();
        let mut released = 0u64;
        let mut first_error = None;
        let mut synced = false;
        for base in arenas {
            let Some(e) = st.segs.get_mut(&base) else {
                continue;
            };
            let Some((off, _)) = e.blocks.free_tail() else {
                continue;
            };
            if e.seg.committed() <= round_up(off, self.granularity) {
                continue;
            }
            if !synced {
                // No queued work may still touch the memory we unmap.
                if let Err(err) = self.driver.synchronize() {
                    return (released, Some(err));
                }
                synced = true;
            }
            let before = e.seg.mapped_bytes();
            if let Err(err) = e.seg.decommit(off) {
                first_error.get_or_insert(err);
            }
            released += (before - e.seg.mapped_bytes()) as u64;
        }
        (released, first_error)
    }
}
