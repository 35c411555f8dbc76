//! Reading an asleep segment's bytes out of its host backup, for callers
//! that want the contents of released memory without waking it.

use super::SleepEngine;
use crate::driver::DevicePtr;
use crate::error::{Error, Result};

impl SleepEngine {
    /// Copy segment bytes `[off, off + dst.len())` of the segment based at
    /// `va` from its host backup into `dst`. `tag` names the segment's tag in
    /// errors. The caller guarantees no sleep or wake of the segment starts
    /// meanwhile (the pool holds its lock across the call).
    ///
    /// Errors: `InvalidState` when the segment has no backup, a transition is
    /// using it, or the backup does not hold every byte of the range (a
    /// Reload sleep keeps only the bytes no checkpoint restores).
    pub fn read_backup(&self, va: DevicePtr, off: usize, dst: &mut [u8], tag: &str) -> Result<()> {
        let s = self.lock();
        let b = match s.backups.get(&va) {
            Some(b) if !s.busy.contains(&va) => b,
            Some(_) => {
                return Err(Error::InvalidState(format!(
                    "the host backup of tag `{tag}` at {va:#x} is being written or read by a sleep or wake"
                )))
            }
            None => {
                return Err(Error::InvalidState(format!(
                    "tag `{tag}` holds no host backup of segment {va:#x}"
                )))
            }
        };
        b.check_fresh(va, off, dst.len(), tag)?;
        if b.is_compressed() {
            return Self::read_compressed(b, &s.arena, off, dst, tag);
        }
        let spans = b.spans(&s.arena, off, dst.len(), usize::MAX);
        let held: usize = spans.iter().map(|&(_, _, n)| n).sum();
        if held != dst.len() {
            return Err(Error::InvalidState(format!(
                "the host backup of tag `{tag}` holds {held} of the {} bytes at {:#x}: the rest is restored from its checkpoint at wake, not kept on the host",
                dst.len(),
                va + off as u64
            )));
        }
        for (at, host, n) in spans {
            let to = &mut dst[at - off..at - off + n];
            // SAFETY: `host` points at `n` bytes of one arena piece assigned to
            // this backup; the engine lock keeps the piece from being freed or
            // reassigned, and no transition writes it (the segment is not busy
            // and the caller keeps new transitions from starting).
            let from = unsafe { std::slice::from_raw_parts(host.cast_const(), n) };
            to.copy_from_slice(from);
        }
        Ok(())
    }
}

impl SleepEngine {
    /// The host address of the backup bytes of segment range `[off, off +
    /// len)` of the segment based at `va`, when one arena piece holds all of
    /// them. The address stays valid while the backup stays assigned (see
    /// [`crate::pool::Pool::backup_view`]). `tag` names the segment's tag in
    /// errors.
    ///
    /// Errors: `InvalidState` when the segment has no backup, a transition is
    /// using it, the backup does not hold every byte of the range, or the
    /// range spans two arena pieces (its bytes are not contiguous on the host).
    pub fn backup_host_range(
        &self,
        va: DevicePtr,
        off: usize,
        len: usize,
        tag: &str,
    ) -> Result<*mut u8> {
        let s = self.lock();
        let b = match s.backups.get(&va) {
            Some(b) if !s.busy.contains(&va) => b,
            Some(_) => {
                return Err(Error::InvalidState(format!(
                    "the host backup of tag `{tag}` at {va:#x} is being written or read by a sleep or wake"
                )))
            }
            None => {
                return Err(Error::InvalidState(format!(
                    "tag `{tag}` holds no host backup of segment {va:#x}"
                )))
            }
        };
        b.check_fresh(va, off, len, tag)?;
        match b.spans(&s.arena, off, len, usize::MAX)[..] {
            [(at, host, n)] if at == off && n == len => Ok(host),
            ref spans if spans.iter().map(|&(_, _, n)| n).sum::<usize>() == len => Err(Error::InvalidState(format!(
                "the host backup of tag `{tag}` holds the {len} bytes at {:#x} in {} separate pieces, not one contiguous range: copy them out with a backup read instead",
                va + off as u64,
                spans.len()
            ))),
            ref spans => Err(Error::InvalidState(format!(
                "the host backup of tag `{tag}` holds {} of the {len} bytes at {:#x}: the rest is restored from its checkpoint at wake, not kept on the host",
                spans.iter().map(|&(_, _, n)| n).sum::<usize>(),
                va + off as u64
            ))),
        }
    }
}
