//! Checking a caller's device range against the pool: the loader writes
//! destinations and `vmmw_pool_write` copies only into memory the pool has
//! handed out and that is mapped now.

use super::{segment_base, Pool, State};
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::segment::SleepState;
use crate::tag::TagId;

impl Pool {
    /// True when any byte of `[ptr, ptr + len)` lies in a segment of this pool.
    pub fn overlaps_segments(&self, ptr: DevicePtr, len: usize) -> bool {
        touches_segments(&self.lock(), ptr, len)
    }

    /// Check that `[ptr, ptr + len)` lies inside one live block of this pool
    /// whose segment is awake and mapped over the whole range. Returns the
    /// block's tag. `what` names the range in errors ("destination `w`").
    ///
    /// Errors: `UnknownPointer` when `ptr` is in no segment of this pool or in
    /// a free block, `InvalidArgument` when the range runs past its block (or
    /// overflows), `InvalidState` when the block's tag is asleep.
    pub fn check_live_range(&self, ptr: DevicePtr, len: usize, what: &str) -> Result<TagId> {
        live_range_tag(&self.lock(), ptr, len, what)
    }

    /// Check every range of `ranges` under one hold of the pool's lock (an
    /// update checks hundreds of destinations): one that overlaps a segment
    /// of this pool as [`Pool::check_live_range`], named `what(i)` in the
    /// error; any other is handed to `outside(i)` (called under the lock:
    /// it must not call into the pool).
    pub fn check_live_ranges(
        &self,
        ranges: &[(DevicePtr, usize)],
        what: &dyn Fn(usize) -> String,
        outside: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<()> {
        let st = self.lock();
        for (i, &(ptr, len)) in ranges.iter().enumerate() {
            if !touches_segments(&st, ptr, len) {
                outside(i)?;
            } else if live_range_tag(&st, ptr, len, "").is_err() {
                // Named only when it fails: the check nearly always passes.
                live_range_tag(&st, ptr, len, &what(i))?;
            }
        }
        Ok(())
    }

    /// The caller wrote `[ptr, ptr + len)` since a load filled it (weights
    /// updated in place): no checkpoint restores those bytes any more, and a
    /// Reload sleep keeps them in the host backup. Optional: a Reload sleep
    /// finds changed bytes by itself (it hashes what was loaded, see
    /// [`crate::sleep::proof`]); marking names the change ahead of time. The
    /// range must lie in one live block of an awake tag (errors as
    /// [`Pool::check_live_range`]); a sleep or wake of its tag running now is
    /// waited for.
    pub fn mark_written(&self, ptr: DevicePtr, len: usize) -> Result<()> {
        let retired = {
            let mut st = self.lock();
            if let Some(base) = segment_base(&st, ptr) {
                let tag = st.segs[&base].tag;
                while st.in_transition(tag) {
                    st = self.settled.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            }
            let tag = live_range_tag(&st, ptr, len, "marked range")?;
            // Under the pool lock: no Reload sleep of the tag can start
            // between this and the coverage it computes.
            self.sleep.retire_range(tag, ptr, len)
        };
        drop(retired);
        Ok(())
    }
}

/// True when `[ptr, ptr + len)` overlaps a segment of the pool.
fn touches_segments(st: &State, ptr: DevicePtr, len: usize) -> bool {
    let end = ptr.saturating_add(len as u64);
    segment_base(st, ptr).is_some() || st.segs.range(ptr..end).next().is_some()
}

/// [`Pool::check_live_range`] under a lock already held.
fn live_range_tag(st: &State, ptr: DevicePtr, len: usize, what: &str) -> Result<TagId> {
    let end = ptr.checked_add(len as u64).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{what} at {ptr:#x} of {len} bytes runs past the end of the address space"
        ))
    })?;
    let base = segment_base(st, ptr).ok_or(Error::UnknownPointer {
        ptr,
        why: "not inside any segment of this pool",
    })?;
    let e = &st.segs[&base];
    let off = (ptr - base) as usize;
    let (boff, b) =
        e.blocks
            .containing(off)
            .filter(|(_, b)| b.live)
            .ok_or(Error::UnknownPointer {
                ptr,
                why: "inside a free block of this pool (freed, or never allocated)",
            })?;
    let (bstart, bend) = (base + boff as u64, base + (boff + b.size) as u64);
    if end > bend {
        return Err(Error::InvalidArgument(format!(
                "{what} [{ptr:#x}, {end:#x}) runs past the end of its block [{bstart:#x}, {bend:#x}) ({} bytes too many): it would overwrite memory it does not own",
                end - bend
            )));
    }
    if e.seg.sleep_state() != SleepState::Awake || end > base + e.seg.mapped_bytes() as u64 {
        return Err(Error::InvalidState(format!(
            "{what} at {ptr:#x} is in tag `{}`, which is asleep: wake it first",
            crate::tag::name_of(e.tag)
        )));
    }
    Ok(e.tag)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::driver::host::{HostConfig, HostDriver};
    use crate::error::{Error, Status};
    use crate::pool::{Pool, PoolConfig};
    use crate::sleep::Policy;
    use crate::tag;

    #[test]
    fn ranges_must_lie_in_one_live_awake_block() {
        let pool = Pool::new(
            Arc::new(HostDriver::new(HostConfig::default())),
            PoolConfig::default(),
        )
        .unwrap();
        let t = tag::id("unit-range").unwrap();
        let a = pool.alloc_tagged(4096, t).unwrap();
        let b = pool.alloc_tagged(4096, t).unwrap();
        assert_eq!(pool.check_live_range(a.ptr, 4096, "d").unwrap(), t);
        assert!(pool.overlaps_segments(a.ptr, 1));
        assert!(
            pool.overlaps_segments(a.ptr - 4096, 8192),
            "ends inside a segment"
        );
        assert!(!pool.overlaps_segments(0x1000, 4096));
        assert_eq!(pool.check_live_range(a.ptr + 100, 10, "d").unwrap(), t);
        // Past the block into the neighbour: refused, naming both ends.
        let e = pool.check_live_range(a.ptr, 8192, "d").unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(
            e.to_string().contains("runs past the end of its block"),
            "{e}"
        );
        // A free block, an address outside the pool, an overflowing range.
        pool.free(b.ptr).unwrap();
        let e = pool.check_live_range(b.ptr, 16, "d").unwrap_err();
        assert!(matches!(e, Error::UnknownPointer { .. }), "{e}");
        let e = pool.check_live_range(0x1000, 16, "d").unwrap_err();
        assert!(matches!(e, Error::UnknownPointer { .. }), "{e}");
        let e = pool.check_live_range(u64::MAX - 4, 16, "d").unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        // Asleep.
        pool.sleep(&[(t, Policy::Discard)]).unwrap();
        let e = pool.check_live_range(a.ptr, 16, "d").unwrap_err();
        assert_eq!(e.status(), Status::InvalidState, "{e}");
        pool.wake(&[t]).unwrap();
        pool.check_live_range(a.ptr, 16, "d").unwrap();
        pool.free(a.ptr).unwrap();
    }
}
