//! Memory the pool holds for reuse: physically backed segments with no live
//! block, which [`Pool::trim`] (or the retry after out of memory) gives back
//! to the driver. A process's view of free device memory counts them as free
//! (the CUDA runtime interposer's `cudaMemGetInfo`, docs/PRELOAD.md).

use super::Pool;

impl Pool {
    /// Physically backed bytes of segments that hold no live block (arena
    /// tails not counted): what a trim would give back now.
    pub fn cached_bytes(&self) -> u64 {
        let st = self.lock();
        st.segs
            .values()
            .filter(|e| e.live_blocks == 0 && !st.in_transition(e.tag))
            .map(|e| e.seg.mapped_bytes() as u64)
            .sum()
    }
}
