//! Reading the host backup of asleep memory: the bytes an Offload sleep
//! copied out, without waking the tag.

use super::{segment_base, Pool};
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::segment::SleepState;
use crate::tag::TagId;

impl Pool {
    /// Copy the bytes of `[ptr, ptr + dst.len())` from the host backup its
    /// asleep segment keeps into `dst`. The range must lie in one segment of
    /// this pool whose tag is asleep with a backup holding every byte of it
    /// (an Offload sleep, or the changed bytes of a Reload sleep). Returns
    /// that tag. A sleep or wake of the tag running now is waited for; none
    /// starts during the copy.
    ///
    /// Errors: `UnknownPointer` when `ptr` is in no segment of this pool,
    /// `InvalidArgument` when the range runs past its segment (or overflows),
    /// `InvalidState` naming the tag when it is awake, was discarded, or its
    /// backup does not hold the whole range. Nothing is written to `dst` on
    /// error.
    pub fn read_backup(&self, ptr: DevicePtr, dst: &mut [u8]) -> Result<TagId> {
        let len = dst.len();
        let end = ptr.checked_add(len as u64).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "backup range at {ptr:#x} of {len} bytes runs past the end of the address space"
            ))
        })?;
        let mut st = self.lock();
        let base = segment_base(&st, ptr).ok_or(Error::UnknownPointer {
            ptr,
            why: "not inside any segment of this pool",
        })?;
        let tag = st.segs[&base].tag;
        while st.in_transition(tag) {
            st = self.settled.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        // The wait released the lock: the segment may be gone.
        let e = st.segs.get(&base).ok_or(Error::UnknownPointer {
            ptr,
            why: "its segment was released while a sleep or wake finished",
        })?;
        let name = crate::tag::name_of(e.tag);
        let seg_end = base + e.seg.reserved() as u64;
        if end > seg_end {
            return Err(Error::InvalidArgument(format!(
                "backup range [{ptr:#x}, {end:#x}) of tag `{name}` runs past the end of its segment [{base:#x}, {seg_end:#x})"
            )));
        }
        match e.seg.sleep_state() {
            SleepState::Offloaded | SleepState::Reloadable => {}
            SleepState::Awake => {
                return Err(Error::InvalidState(format!(
                    "tag `{name}` is awake: its memory at {ptr:#x} is on the device, read it there"
                )))
            }
            SleepState::Discarded => {
                return Err(Error::InvalidState(format!(
                    "tag `{name}` was put to sleep with the discard policy: no host backup holds its memory at {ptr:#x}"
                )))
            }
        }
        // The pool lock stays held: no sleep or wake of the tag starts while
        // the engine copies out of its backup.
        self.sleep
            .read_backup(base, (ptr - base) as usize, dst, &name)?;
        Ok(e.tag)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::driver::host::{HostConfig, HostDriver};
    use crate::error::{Error, Status};
    use crate::pool::{Pool, PoolConfig};
    use crate::sleep::Policy;
    use crate::tag;

    fn pool() -> Pool {
        Pool::new(
            Arc::new(HostDriver::new(HostConfig::default())),
            PoolConfig::default(),
        )
        .unwrap()
    }

    #[test]
    fn reads_what_an_offload_sleep_kept_and_refuses_everything_else() {
        let pool = pool();
        let t = tag::id("unit-backup-read").unwrap();
        let a = pool.alloc_tagged(8192, t).unwrap();
        let bytes: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        // SAFETY: `a` is a live block of 8192 bytes, nothing sleeps it meanwhile.
        unsafe { pool.write(a.ptr, &bytes) }.unwrap();

        let mut out = vec![0u8; 100];
        let e = pool.read_backup(a.ptr, &mut out).unwrap_err();
        assert_eq!(e.status(), Status::InvalidState, "{e}");
        assert!(e.to_string().contains("`unit-backup-read` is awake"), "{e}");

        pool.sleep(&[(t, Policy::Offload)]).unwrap();
        assert_eq!(pool.read_backup(a.ptr + 1000, &mut out).unwrap(), t);
        assert_eq!(out, bytes[1000..1100]);
        let mut all = vec![0u8; 8192];
        pool.read_backup(a.ptr, &mut all).unwrap();
        assert_eq!(all, bytes);
        pool.read_backup(a.ptr, &mut []).unwrap();

        // Outside the pool, past the segment, overflowing: refused, `out` untouched.
        let mut out = vec![7u8; 16];
        let e = pool.read_backup(0x1000, &mut out).unwrap_err();
        assert!(matches!(e, Error::UnknownPointer { .. }), "{e}");
        let reserved = {
            let st = pool.lock();
            let base = super::segment_base(&st, a.ptr).unwrap();
            base + st.segs[&base].seg.reserved() as u64
        };
        let e = pool.read_backup(reserved - 8, &mut out).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(
            e.to_string().contains("runs past the end of its segment"),
            "{e}"
        );
        let e = pool.read_backup(u64::MAX - 4, &mut out).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert_eq!(out, [7u8; 16]);

        // Awake again: the device holds the bytes, the backup is not read.
        pool.wake(&[t]).unwrap();
        let e = pool.read_backup(a.ptr, &mut out).unwrap_err();
        assert_eq!(e.status(), Status::InvalidState, "{e}");

        // Discarded: no backup to read.
        pool.sleep(&[(t, Policy::Discard)]).unwrap();
        let e = pool.read_backup(a.ptr, &mut out).unwrap_err();
        assert_eq!(e.status(), Status::InvalidState, "{e}");
        assert!(e.to_string().contains("discard policy"), "{e}");
        assert!(e.to_string().contains("unit-backup-read"), "{e}");
        assert_eq!(out, [7u8; 16]);
    }
}
