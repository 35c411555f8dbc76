//! Giving freed segments back to the driver, and keeping what it refuses.
//!
//! A segment leaves the pool's bookkeeping when it is wholly free (free of a
//! dedicated segment, trim, the retry after out of memory, the end of a sleep
//! or wake that deferred a free). Releasing it synchronizes the device once,
//! then [`Segment::close`]s it. What the driver refuses is never dropped
//! silently: a device that refuses to synchronize keeps every such segment
//! mapped (queued work may still use it); a failed unmap or release keeps
//! the segment with its reservation (so the range is never handed out again)
//! and the memory still held. Either way the segment waits in the pool, is
//! counted in the report ([`Report::leaked_bytes`](crate::report::Report)),
//! the call returns an error naming it, and every later free or trim retries.

use super::{Pool, State};
use crate::error::{Error, Result};
use crate::segment::Segment;
use crate::tag::TagId;

/// A segment taken out of the pool's bookkeeping, to be given back.
#[derive(Debug)]
pub(super) struct Released {
    pub(super) seg: Segment,
    pub(super) tag: TagId,
}

impl Released {
    /// Physical bytes the driver has not taken back.
    fn held_bytes(&self) -> u64 {
        (self.seg.mapped_bytes() + self.seg.unreleased_bytes()) as u64
    }
}

/// What freed segments still hold because the driver refused to take it back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unreleased {
    /// Segments waiting for a later free or trim.
    pub segments: u64,
    /// Their physical bytes (mapped, or unmapped with a failed release), plus
    /// handles of live segments whose release failed.
    pub bytes: u64,
    /// VA they keep reserved.
    pub reserved_bytes: u64,
}

impl Pool {
    /// Give `segs` back (and every segment kept by an earlier failure).
    /// An error names the first segment the driver refused; those segments
    /// stay in the pool for a later free or trim.
    pub(super) fn release_segments(&self, segs: Vec<Released>) -> Result<()> {
        let zombies = std::mem::take(&mut self.lock().zombies);
        if segs.is_empty() && zombies.is_empty() {
            return Ok(());
        }
        match self.try_release(segs, zombies) {
            Ok(_) => Ok(()),
            Err((kept, _, e)) => {
                self.lock().zombies.extend(kept);
                Err(e)
            }
        }
    }

    /// As [`Pool::release_segments`], under the lock (the out-of-memory retry
    /// needs the memory back before it allocates); a failure is kept for the
    /// report and a later free or trim.
    /// Returns the physical bytes given back (kept segments of earlier
    /// failures included).
    pub(super) fn release_segments_locked(&self, st: &mut State, segs: Vec<Released>) -> u64 {
        let zombies = std::mem::take(&mut st.zombies);
        match self.try_release(segs, zombies) {
            Ok(bytes) => bytes,
            Err((kept, bytes, _)) => {
                st.zombies = kept;
                bytes
            }
        }
    }

    /// Synchronize once, then close every segment; returns the physical
    /// bytes given back, or the segments kept with those bytes and the first error.
    fn try_release(
        &self,
        mut segs: Vec<Released>,
        zombies: Vec<Released>,
    ) -> std::result::Result<u64, (Vec<Released>, u64, Error)> {
        segs.extend(zombies);
        if segs.iter().any(|r| r.seg.mapped_bytes() > 0) && self.driver.synchronize().is_err() {
            let n = segs.len();
            return Err((
                segs,
                0,
                Error::InvalidState(format!(
                    "{n} freed segment(s) stay mapped: the device refused to synchronize, so queued work may still use them; a later free or trim releases them"
                )),
            ));
        }
        let mut kept = Vec::new();
        let mut first_error = None;
        let mut given_back = 0u64;
        for r in segs {
            let (tag, held) = (r.tag, r.held_bytes());
            match r.seg.close() {
                Ok(()) => given_back += held,
                Err(refusal) => {
                    let (seg, e) = *refusal;
                    let r = Released { seg, tag };
                    given_back += held - r.held_bytes();
                    first_error.get_or_insert_with(|| refused(e, &r));
                    kept.push(r);
                }
            }
        }
        match first_error {
            None => Ok(given_back),
            Some(e) => Err((kept, given_back, e)),
        }
    }

    /// Segments freed but not yet given back: the device refused to
    /// synchronize, or to unmap or release their memory.
    pub fn segments_awaiting_release(&self) -> usize {
        self.lock().zombies.len()
    }

    /// What freed segments still hold (see [`Unreleased`]).
    pub fn unreleased(&self) -> Unreleased {
        Self::unreleased_locked(&self.lock())
    }

    pub(super) fn unreleased_locked(st: &State) -> Unreleased {
        let mut u = Unreleased::default();
        for r in &st.zombies {
            u.segments += 1;
            u.bytes += r.held_bytes();
            u.reserved_bytes += r.seg.reserved() as u64;
        }
        u.bytes += st
            .segs
            .values()
            .map(|e| e.seg.unreleased_bytes() as u64)
            .sum::<u64>();
        u
    }

    /// Retry the release of handles that live segments (sleep, arena trim)
    /// could not release. The first error is returned.
    pub(super) fn release_orphans_locked(st: &mut State) -> Result<()> {
        let mut first_error = None;
        for e in st.segs.values_mut() {
            if e.seg.unreleased_handles() > 0 {
                if let Err(err) = e.seg.release_orphans() {
                    first_error.get_or_insert(err);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The driver's error `e`, saying which segment it kept and what happens next.
fn refused(e: Error, r: &Released) -> Error {
    let what = format!(
        "; freed segment {:#x} ({} bytes reserved) of tag {} keeps {} bytes the driver did not take back: its range stays reserved (never reused) and is counted in the pool report's leaked_bytes; a later free or trim retries",
        r.seg.ptr(),
        r.seg.reserved(),
        r.tag,
        r.held_bytes()
    );
    e.with_context(&what)
}
