//! How a sleep gives the device its memory back: chunk by chunk, each run of
//! a segment's chunks unmapped and released as soon as the copies out of it
//! have completed, while the copies of the runs after it still go on. A wake
//! beside the sleep (a swap) or in another process (a wake that waits for
//! memory) maps its own chunks into the memory freed this way.
//!
//! A segment becomes asleep when its first chunk goes. When a sleep stops
//! midway, a segment may so be asleep with chunks still mapped whose copies
//! never completed: their ranges are marked *stale* in its backup (never read
//! by a wake, which restores only unmapped chunks, nor by a backup read), and
//! the next sleep copies them again before unmapping them.

use std::collections::HashSet;
use std::ops::Range;

use super::options::{CycleReport, Policy};
use super::plan::SegTodo;
use super::room::Releases;
use super::{SleepEngine, TagSegments};
use crate::driver::{DevicePtr, EventId, StreamId};
use crate::error::{Error, Result};
use crate::segment::SleepState;
use crate::sleep::ranges;

/// The copies out of chunks `chunks` of segment `seg` (an index into the
/// sleep's snapshot) and the events they recorded (none when the chunks
/// copy nothing: they are unmapped in turn, right away).
#[derive(Debug)]
pub(super) struct Unit {
    pub(super) seg: usize,
    pub(super) chunks: Range<usize>,
    pub(super) events: Vec<EventId>,
}

/// The units of one sleep not yet unmapped, in the order they were issued.
pub(super) type Pending = Vec<Unit>;

/// What one sleep has released so far, and who hears of it.
#[derive(Debug, Default)]
pub(super) struct Progress<'a> {
    /// `(segment, chunk)` whose copies completed (or that copy nothing).
    copied: HashSet<(usize, usize)>,
    /// Segments with no chunk left mapped.
    emptied: HashSet<usize>,
    /// Told after each batch of unmaps.
    pub(super) releases: Option<&'a Releases>,
}

impl<'a> Progress<'a> {
    /// Nothing released yet; `releases` hears of each release.
    pub(super) fn new(releases: Option<&'a Releases>) -> Progress<'a> {
        Progress {
            releases,
            ..Progress::default()
        }
    }

    /// Segments with no chunk left mapped.
    pub(super) fn emptied(&self) -> usize {
        self.emptied.len()
    }
}

impl SleepEngine {
    /// Record an event on every stream of `streams` that `used` marks.
    pub(super) fn record_events(
        &self,
        streams: &[StreamId],
        used: &[bool],
    ) -> Result<Vec<EventId>> {
        let mut events = Vec::new();
        for (k, _) in used.iter().enumerate().filter(|(_, &u)| u) {
            let e = match self.driver.event_create() {
                Ok(e) => e,
                Err(err) => {
                    events
                        .into_iter()
                        .for_each(|e| drop(self.driver.event_destroy(e)));
                    return Err(err);
                }
            };
            if let Err(err) = self.driver.event_record(e, streams[k]) {
                let _ = self.driver.event_destroy(e);
                events
                    .into_iter()
                    .for_each(|e| drop(self.driver.event_destroy(e)));
                return Err(err);
            }
            events.push(e);
        }
        Ok(events)
    }

    /// Unmap each unit of `pending` as soon as its copies are done, while
    /// the later units' copies still run. Returns the first error
    /// (`failure`, the issue's, first).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn unmap_as_copied(
        &self,
        segs: TagSegments<'_>,
        todo: &[SegTodo],
        pending: Pending,
        policy: Policy,
        mut failure: Option<Error>,
        report: &mut CycleReport,
        progress: &mut Progress<'_>,
    ) -> Option<Error> {
        let mut ready: Vec<(usize, Range<usize>)> = Vec::new();
        for u in pending {
            if !u.events.is_empty() && !ready.is_empty() {
                let e = self.unmap_units(segs, todo, &ready, policy, report, progress);
                failure = failure.or(e);
                ready.clear();
            }
            let waited = u
                .events
                .iter()
                .try_for_each(|&e| self.driver.event_synchronize(e));
            for &e in &u.events {
                let _ = self.driver.event_destroy(e);
            }
            match waited {
                Ok(()) => ready.push((u.seg, u.chunks)),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        if !ready.is_empty() {
            let e = self.unmap_units(segs, todo, &ready, policy, report, progress);
            failure = failure.or(e);
        }
        failure
    }

    /// Unmap the units at the front of `pending` whose copies have all
    /// completed, without waiting for any; they leave `pending`. Returns the
    /// first unmap error. A unit whose event cannot be queried stays pending,
    /// for [`Self::unmap_as_copied`] to wait on and report.
    pub(super) fn unmap_completed(
        &self,
        segs: TagSegments<'_>,
        todo: &[SegTodo],
        pending: &mut Pending,
        policy: Policy,
        report: &mut CycleReport,
        progress: &mut Progress<'_>,
    ) -> Option<Error> {
        let complete = pending
            .iter()
            .take_while(|u| {
                u.events
                    .iter()
                    .all(|&e| self.driver.event_query(e).unwrap_or(false))
            })
            .count();
        if complete == 0 {
            return None;
        }
        let ready: Vec<(usize, Range<usize>)> = pending
            .drain(..complete)
            .map(|u| {
                for e in u.events {
                    let _ = self.driver.event_destroy(e);
                }
                (u.seg, u.chunks)
            })
            .collect();
        self.unmap_units(segs, todo, &ready, policy, report, progress)
    }

    /// Unmap the chunks of `ready`, whose copies have completed, under one
    /// call of `segs` (the pool lock, held only for the unmaps), and tell
    /// the releases. Returns the first error.
    fn unmap_units(
        &self,
        segs: TagSegments<'_>,
        todo: &[SegTodo],
        ready: &[(usize, Range<usize>)],
        policy: Policy,
        report: &mut CycleReport,
        progress: &mut Progress<'_>,
    ) -> Option<Error> {
        let mut failure: Option<Error> = None;
        let mut released = 0u64;
        segs(&mut |ss| {
            for (i, chunks) in ready {
                let t = &todo[*i];
                progress.copied.extend(chunks.clone().map(|c| (*i, c)));
                let Some(seg) = ss.iter_mut().find(|s| s.ptr() == t.ptr) else {
                    continue;
                };
                let before = seg.mapped_bytes() as u64;
                for c in chunks.clone() {
                    // The tag is in transition: its chunks do not change
                    // while it sleeps; a mismatch is a bug caught here
                    // rather than an unmap of the wrong range.
                    if seg.chunks().get(c).map(|ch| ch.offset) != Some(t.chunks[c].offset) {
                        failure.get_or_insert(Error::InvalidState(format!(
                            "segment at {:#x} changed its chunks during its sleep",
                            t.ptr
                        )));
                        continue;
                    }
                    if let Err(e) = seg.unmap_chunk(c) {
                        failure.get_or_insert(e);
                    }
                }
                let after = seg.mapped_bytes() as u64;
                if t.state == SleepState::Awake
                    && after < before
                    && seg.sleep_state() == SleepState::Awake
                {
                    // The backup of every chunk gone is complete (its
                    // events were waited on); once any chunk is gone the
                    // segment is asleep, and both a retried sleep and a
                    // wake take care of what is still mapped.
                    seg.set_sleep_state(policy.asleep_state());
                    report.segments += 1;
                }
                if after == 0 {
                    progress.emptied.insert(*i);
                }
                report.physical_bytes += before - after;
                released += before - after;
            }
        });
        if released > 0 {
            if let Some(r) = progress.releases {
                r.released();
            }
        }
        failure
    }

    /// After the sleep: mark the chunks of asleep segments still mapped
    /// whose copies did not complete as stale in their backups (the next
    /// sleep copies them again), clear what completed copies refreshed, drop
    /// the frames of a compressed backup that no unmapped or copied chunk
    /// needs, and drop the compressed backup of a segment this sleep left
    /// awake (it may miss frames). `compressed`: the segments this sleep
    /// wrote compressed frames for.
    pub(super) fn settle_backups(
        &self,
        segs: TagSegments<'_>,
        todo: &[SegTodo],
        progress: &Progress<'_>,
        compressed: &HashSet<usize>,
    ) {
        // (index, awake, stale ranges, ranges that keep their frames)
        type Found = (usize, bool, Vec<(usize, usize)>, Vec<(usize, usize)>);
        let mut found: Vec<Found> = Vec::new();
        segs(&mut |ss| {
            for (i, t) in todo.iter().enumerate() {
                let Some(seg) = ss.iter().find(|s| s.ptr() == t.ptr) else {
                    continue;
                };
                let (mut stale, mut needed) = (Vec::new(), Vec::new());
                for (c, ch) in seg.chunks().iter().enumerate() {
                    let copied = progress.copied.contains(&(i, c));
                    if ch.handle.is_some() && !copied {
                        stale.push((ch.offset, ch.size));
                    } else {
                        needed.push((ch.offset, ch.size));
                    }
                }
                found.push((i, seg.sleep_state() == SleepState::Awake, stale, needed));
            }
        });
        let mut s = self.lock();
        for (i, awake, stale, needed) in found {
            let ptr = todo[i].ptr;
            if awake {
                // Still awake: the next sleep backs it up whole. A compressed
                // backup written now may miss frames and is never restored.
                if compressed.contains(&i) {
                    s.free_backup(ptr);
                }
                continue;
            }
            if let Some(b) = s.backups.get_mut(&ptr) {
                let mut stale = stale;
                if b.is_compressed() && !stale.is_empty() {
                    b.retain_frames_overlapping(&needed);
                    // A frame kept may run into a stale chunk (a chunk ending
                    // inside a frame): its bytes there are held (recorded
                    // frames were copied whole, the streams are idle). Only
                    // what no frame covers is stale, so the next sleep's
                    // frames continue where the kept ones end instead of
                    // overlapping them.
                    let mut left: Vec<(DevicePtr, usize)> =
                        stale.iter().map(|&(o, l)| (o as DevicePtr, l)).collect();
                    for f in &b.frames {
                        left = ranges::subtract(&left, f.offset as DevicePtr, f.raw_len);
                    }
                    stale = left.iter().map(|&(o, l)| (o as usize, l)).collect();
                }
                b.stale = stale;
            }
        }
    }
}
