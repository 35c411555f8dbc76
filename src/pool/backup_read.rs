//! Reading the host backup of asleep memory: the bytes an Offload sleep
//! copied out, without waking the tag.

use std::sync::MutexGuard;

use super::{segment_base, Pool, State};
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
        let (_st, base, tag, name) = self.backup_segment(ptr, dst.len(), false)?;
        // The pool lock (`_st`) stays held: no sleep or wake of the tag starts
        // while the engine copies out of its backup.
        self.sleep
            .read_backup(base, (ptr - base) as usize, dst, &name)?;
        Ok(tag)
    }

    /// The host address of the pinned backup bytes of `[ptr, ptr + len)`,
    /// without copying, and the tag they belong to. The range must lie in one
    /// segment whose backup holds every byte of it in one contiguous piece:
    /// an asleep tag's (Offload, or the changed bytes of a Reload sleep), or
    /// the backup an awake tag kept after its wake (it holds the bytes of its
    /// last sleep, not what the device holds since).
    ///
    /// The bytes stay at that address, and the address valid, while the
    /// backup stays assigned to the segment: until the segment is freed, the
    /// pool's unused backups are released ([`Pool::release_backup`]), a wake
    /// frees it (`SleepOptions::free_backup_after_wake`), or a sleep of the
    /// tag needs a backup of another shape (a sleep of the same ranges
    /// rewrites the same bytes in place). The pool owns the memory;
    /// callers read it and never free it.
    ///
    /// Errors: as [`Pool::read_backup`], except that an awake tag with a kept
    /// backup is read; `InvalidArgument` for `len` 0; `InvalidState` when the
    /// bytes lie in more than one piece of the backup arena.
    pub fn backup_view(&self, ptr: DevicePtr, len: usize) -> Result<(TagId, *const u8)> {
        if len == 0 {
            return Err(Error::InvalidArgument(format!(
                "a backup view at {ptr:#x} of 0 bytes: name at least one byte"
            )));
        }
        let (_st, base, tag, name) = self.backup_segment(ptr, len, true)?;
        let host = self
            .sleep
            .backup_host_range(base, (ptr - base) as usize, len, &name)?;
        Ok((tag, host.cast_const()))
    }

    /// The pool lock (no transition of the tag running), the base and tag of
    /// the segment holding `[ptr, ptr + len)`, and the tag's name, once the
    /// range is checked to lie in one segment whose tag keeps a backup of it
    /// (`awake_ok`: a backup kept after wake counts).
    fn backup_segment(
        &self,
        ptr: DevicePtr,
        len: usize,
        awake_ok: bool,
    ) -> Result<(MutexGuard<'_, State>, DevicePtr, TagId, String)> {
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
        let tag = e.tag;
        let name = crate::tag::name_of(tag);
        let seg_end = base + e.seg.reserved() as u64;
        if end > seg_end {
            return Err(Error::InvalidArgument(format!(
                "backup range [{ptr:#x}, {end:#x}) of tag `{name}` runs past the end of its segment [{base:#x}, {seg_end:#x})"
            )));
        }
        match e.seg.sleep_state() {
            SleepState::Offloaded | SleepState::Reloadable => {}
            SleepState::Awake if awake_ok => {}
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
        Ok((st, base, tag, name))
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

    #[test]
    fn a_backup_view_is_the_pinned_backup_in_place_while_it_stays_assigned() {
        let pool = pool();
        let t = tag::id("unit-backup-view").unwrap();
        let a = pool.alloc_tagged(8192, t).unwrap();
        let first: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        // SAFETY: `a` is a live block of 8192 bytes, nothing sleeps it meanwhile.
        unsafe { pool.write(a.ptr, &first) }.unwrap();

        let e = pool.backup_view(a.ptr, 64).unwrap_err();
        assert!(e.to_string().contains("holds no host backup"), "{e}");

        pool.sleep(&[(t, Policy::Offload)]).unwrap();
        let (owner, host) = pool.backup_view(a.ptr, 8192).unwrap();
        assert_eq!(owner, t);
        // SAFETY: the view holds 8192 bytes while the backup stays assigned.
        let seen = |h: *const u8| unsafe { std::slice::from_raw_parts(h, 8192) }.to_vec();
        assert_eq!(seen(host), first);
        let (_, inner) = pool.backup_view(a.ptr + 100, 10).unwrap();
        assert_eq!(inner, host.wrapping_add(100));

        // Kept after wake: the same bytes at the same address.
        pool.wake(&[t]).unwrap();
        let (_, kept) = pool.backup_view(a.ptr, 8192).unwrap();
        assert_eq!((kept, seen(kept)), (host, first.clone()));

        // The next sleep of the same ranges rewrites the bytes in place.
        let second: Vec<u8> = first.iter().map(|b| b.wrapping_add(7)).collect();
        // SAFETY: as above.
        unsafe { pool.write(a.ptr, &second) }.unwrap();
        pool.sleep(&[(t, Policy::Offload)]).unwrap();
        let (_, again) = pool.backup_view(a.ptr, 8192).unwrap();
        assert_eq!((again, seen(again)), (host, second));

        // Released after wake: no view.
        pool.wake(&[t]).unwrap();
        pool.release_backup();
        let e = pool.backup_view(a.ptr, 8192).unwrap_err();
        assert_eq!(e.status(), Status::InvalidState, "{e}");

        // Bad input: 0 bytes, outside the pool, past the segment, discarded.
        let e = pool.backup_view(a.ptr, 0).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        let e = pool.backup_view(0x1000, 8).unwrap_err();
        assert!(matches!(e, Error::UnknownPointer { .. }), "{e}");
        let e = pool.backup_view(u64::MAX - 4, 8).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        pool.sleep(&[(t, Policy::Discard)]).unwrap();
        let e = pool.backup_view(a.ptr, 8).unwrap_err();
        assert!(e.to_string().contains("discard policy"), "{e}");
    }
}
