//! Host access to pool memory: reading and writing a range after checking that
//! it lies in one awake, mapped segment of the pool. The C read/write calls and
//! the loader's awake check use these, so every caller refuses the same ranges
//! with the same errors.

use super::{Pool, SegmentInfo};
use crate::driver::sync_copy::{copy_to_device, copy_to_host};
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::segment::SleepState;

impl SegmentInfo {
    /// `InvalidState` naming `what` and the tag when this segment (which holds
    /// `ptr`) is asleep: its memory would fault if touched.
    pub fn ensure_awake(&self, ptr: DevicePtr, what: &str) -> Result<()> {
        if self.sleep_state != SleepState::Awake {
            return Err(Error::InvalidState(format!(
                "{what} at {ptr:#x} is in tag `{}`, which is asleep: wake it before touching its memory",
                crate::tag::name_of(self.tag)
            )));
        }
        Ok(())
    }
}

impl Pool {
    /// Check that `[ptr, ptr+len)` lies in one awake, mapped segment of this
    /// pool: `UnknownPointer` outside the pool, `InvalidState` when asleep,
    /// `InvalidArgument` when it overflows or runs past the mapped part.
    pub fn check_range(&self, ptr: DevicePtr, len: usize) -> Result<()> {
        let end = ptr.checked_add(len as u64).ok_or_else(|| {
            Error::InvalidArgument(format!("range at {ptr:#x} of {len} bytes overflows"))
        })?;
        let seg = self.segment_of(ptr).ok_or(Error::UnknownPointer {
            ptr,
            why: "not inside any segment of this pool",
        })?;
        seg.ensure_awake(ptr, "range")?;
        if end > seg.base + seg.tracked_bytes as u64 {
            return Err(Error::InvalidArgument(format!(
                "range [{ptr:#x}, {end:#x}) runs past the mapped part of its segment [{:#x}, {:#x})",
                seg.base,
                seg.base + seg.tracked_bytes as u64
            )));
        }
        Ok(())
    }

    /// Copy `src` to pool memory at `dst` and wait for the copy, after
    /// [`Pool::check_range`] (nothing copied when it fails). Empty `src` is a
    /// no-op.
    ///
    /// # Safety
    /// No other thread sleeps, trims or frees the memory holding the range
    /// during the call (the check cannot keep it mapped while the copy runs).
    pub unsafe fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.check_range(dst, src.len())?;
        // SAFETY: the range is mapped (checked above; the caller keeps it so).
        unsafe { copy_to_device(self.driver().as_ref(), dst, src) }
    }

    /// Copy pool memory at `src` into `dst` and wait for the copy. Same rules
    /// as [`Pool::write`].
    ///
    /// # Safety
    /// As [`Pool::write`].
    pub unsafe fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.check_range(src, dst.len())?;
        // SAFETY: as in `write`.
        unsafe { copy_to_host(self.driver().as_ref(), dst, src) }
    }
}
