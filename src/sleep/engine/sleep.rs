//! The sleep of one tag, in phases: take the snapshot, check Reload's proofs
//! and plan what each segment keeps on the host, check room for the backup,
//! synchronize, issue the copies, unmap each segment as its copies complete,
//! finish.

use std::cell::RefCell;
use std::time::Instant;

use super::compressed::{self, CodecScratch};
use super::options::{CycleReport, Policy};
use super::plan::{self, SegTodo, Transition};
use super::{SegmentBackup, SleepEngine, TagSegments};
use crate::codec::Layout;
use crate::driver::{DevicePtr, EventId, StreamId};
use crate::error::{Error, Result};
use crate::hostmem::pinned_len;
use crate::segment::{Segment, SleepState};
use crate::tag::TagId;

/// What the copies of one sleep run with, fixed before the first one.
struct CopyPlan {
    streams: Vec<StreamId>,
    /// Size of one copy on one stream.
    piece: usize,
    /// Pinned bytes held before this sleep.
    held_before: u64,
    /// Backup bytes that no backup already assigned holds: for compressed
    /// backups, the most the frames can take (every block stored raw).
    need_new: u64,
    /// `need_new` is an upper bound (compressed backups): slabs pinned
    /// ahead that no frame took are given back at the end.
    bound_only: bool,
    /// Bytes to pin in the background: `need_new`, except that compressed
    /// backups count only segments without a backup yet (one that had one
    /// takes its frames from the pieces it frees, and pins any excess as
    /// frames come).
    pin_ahead: u64,
}

/// Slab size of the background pinning for compressed backups: their size is
/// known only as frames are encoded, so the arena keeps at most one slab
/// more than the frames take (the pipeline's lookahead is given back).
const COMPRESSED_PIN_SLAB_BYTES: usize = 64 << 20;

/// Compressed backups whose bound is below this many slabs pin on demand,
/// each frame's bytes exactly, at a cost too small to pipeline.
const COMPRESSED_PIN_MIN_SLABS: u64 = 4;

/// Per segment (an index into the snapshot), the events its copies record;
/// none when it copies nothing.
type Pending = Vec<(usize, Vec<EventId>)>;

impl SleepEngine {
    /// Put the awake segments among `segs` (all of tag `tag`) to sleep with
    /// `policy`. See [`Self::sleep_tag`].
    pub fn sleep(
        &self,
        tag: TagId,
        segs: &mut [&mut Segment],
        policy: Policy,
    ) -> Result<CycleReport> {
        let cell = RefCell::new(segs);
        self.sleep_tag(tag, policy, &|f| f(&mut cell.borrow_mut()), None)
    }

    /// Put `tag`'s awake segments to sleep with `policy`, and release what an
    /// earlier failed sleep left mapped.
    ///
    /// Offload keeps every committed byte in the host backup (whole
    /// segments: a tag holding one small block in a segment of its own backs
    /// up the granularity; the need is checked against the limit and the
    /// host's available memory before anything moves); Reload keeps the
    /// bytes of `in_use` (the tag's live blocks; `None`: every committed
    /// byte) that no reload source covers; Discard keeps none. The host-memory limit
    /// is checked before anything moves, and the device is synchronized before
    /// the copies and the unmaps: when that synchronize fails, nothing is
    /// unmapped and the error is returned. If a copy or an unmap fails midway,
    /// the segments done are asleep with their backups, a segment whose unmap
    /// failed is asleep with some chunks still mapped (counted as tracked), and
    /// the rest stay awake; the error says so, and calling again finishes the
    /// job, unmapping what is left.
    pub fn sleep_tag(
        &self,
        tag: TagId,
        policy: Policy,
        segs: TagSegments<'_>,
        in_use: Option<&[(DevicePtr, usize)]>,
    ) -> Result<CycleReport> {
        let t0 = Instant::now();
        let _one = self.one_transition();
        let mut report = CycleReport::default();
        let todo = plan::snapshot(segs, Transition::Sleep);
        if todo.is_empty() {
            report.seconds = t0.elapsed().as_secs_f64();
            return Ok(report);
        }
        if policy == Policy::Reload {
            self.require_reload_source(tag)?;
        }
        // Work still queued on other streams (the caller's) may be writing
        // these bytes: it must land before Reload hashes them, and none may
        // touch memory once it is unmapped.
        self.driver.synchronize()?;
        if policy == Policy::Reload {
            // What changed since the load (an update in place, a block reused
            // without our free) is kept in the backup, not reverted at wake.
            let readable: Vec<(DevicePtr, usize)> = todo
                .iter()
                .filter(|t| t.state == SleepState::Awake)
                .map(|t| (t.ptr, t.committed))
                .collect();
            report.changed_bytes = self.drop_changed_coverage(tag, &readable)?;
        }
        // What each awake segment keeps on the host.
        let coverage = self.lock().coverage(tag);
        let keep: Vec<Vec<(usize, usize)>> = todo
            .iter()
            .map(|t| t.host_keep(policy, &coverage, in_use))
            .collect();
        // Read once: the host-memory check and the frames agree on the size.
        let (layout, frame, ring) = {
            let o = &self.lock().options;
            (o.codec_layout, o.codec_frame_bytes, o.codec_ring)
        };
        let compress = policy == Policy::OffloadCompressed && keep.iter().any(|k| !k.is_empty());
        if compress {
            self.release_stale_scratch();
        }
        let mut scratch = self.guard_scratch(if compress {
            let words = self.length_words()?;
            match CodecScratch::for_sleep(&self.driver, frame, ring, words) {
                Ok(sc) => Some(sc),
                // A nearly full device: raw backups need no device memory,
                // and a sleep that frees memory must not fail for want of it.
                Err(e) if e.is_out_of_memory() => {
                    report.codec_fallback = true;
                    None
                }
                Err(e) => return Err(e),
            }
        } else {
            None
        });
        let policy = if report.codec_fallback {
            Policy::Offload
        } else {
            policy
        };
        let run = self.plan_copies(tag, &todo, &keep, policy, frame)?;
        self.start_pinning(&todo, &run);
        let codec = scratch.sc.as_mut().map(|sc| (sc, layout));
        // A compressed backup is issued at the encoder's pace, so the
        // segments whose copies completed meanwhile are unmapped between
        // segments instead of all after the last copy.
        let (mut early, mut early_failure) = (0usize, None);
        let mut unmap_early = |pending: &mut Pending, report: &mut CycleReport| {
            let (done, failure) = self.unmap_completed(segs, &todo, pending, policy, report);
            early += done;
            early_failure = early_failure.take().or(failure);
        };
        let (pending, failure, partial) = self.issue_copies(
            tag,
            &todo,
            &keep,
            &run,
            codec,
            &mut report,
            &mut unmap_early,
        );
        let failure = early_failure.or(failure);
        let (done, failure) =
            self.unmap_as_copied(segs, &todo, pending, policy, failure, &mut report);
        let done = done + early;
        self.finish_sleep(&todo, &run, failure.is_some(), partial, &mut report);
        // Every copy out of the scratch is complete (waited on, or the
        // streams synchronized after a failure).
        drop(scratch);
        report.seconds = t0.elapsed().as_secs_f64();
        match failure {
            None => {
                if policy == Policy::Reload {
                    self.sources(tag).iter().for_each(|s| s.prepare());
                }
                Ok(report)
            }
            // Nothing was unmapped: the tag is as before, and the cause (out
            // of host memory, a driver error) is the whole story.
            Some(e) if report.segments == 0 && report.physical_bytes == 0 => Err(e),
            Some(e) => Err(Error::InvalidState(format!(
                "sleep of tag {tag} stopped after {done} of {} segments (those are asleep with their backups, the rest awake or partly mapped; sleeping again finishes): {e}",
                todo.len()
            ))),
        }
    }

    /// Check that the backup the segments need (`keep`) fits under the
    /// host-memory limit and in the host's available memory, and make the
    /// streams. Compressed backups count frames of `frame` raw bytes stored
    /// raw. Nothing has moved when this fails.
    fn plan_copies(
        &self,
        tag: TagId,
        todo: &[SegTodo],
        keep: &[Vec<(usize, usize)>],
        policy: Policy,
        frame: usize,
    ) -> Result<CopyPlan> {
        let mut s = self.lock();
        let (mut need_new, mut pin_ahead) = (0u64, 0u64);
        for (t, k) in todo.iter().zip(keep) {
            let raw: usize = k.iter().map(|&(_, l)| l).sum();
            let old = s.backups.get(&t.ptr);
            need_new += if policy == Policy::OffloadCompressed {
                // At most every block stored raw; the segment's old backup
                // is freed first.
                let bound = if raw == 0 {
                    0
                } else {
                    compressed::max_backup_bytes(raw, frame)
                };
                if old.is_none() {
                    pin_ahead += bound as u64;
                }
                bound.saturating_sub(old.map_or(0, |b| b.len())) as u64
            } else if old.is_some_and(|b| &b.ranges == k && !b.is_compressed()) {
                0
            } else {
                // An old backup of other ranges (or a compressed one) is
                // freed before the new one is placed (`issue_backup`).
                raw.saturating_sub(old.map_or(0, |b| b.len())) as u64
            };
        }
        let room = s.arena.limit().saturating_sub(s.arena.held());
        // Slabs are whole pinned pages (see `start_pinning`): count the
        // pages the pinning takes, not the bytes.
        let to_pin = need_new.saturating_sub(s.arena.free_bytes());
        if to_pin > 0 && pinned_len(to_pin) > room {
            return Err(Error::HostOutOfMemory {
                what: format!("backup for sleeping tag {tag}"),
                requested: need_new,
                limit: s.arena.limit(),
                in_use: s.arena.held(),
            });
        }
        // And against the host: populating more than it has available
        // wakes the kernel's out-of-memory killer instead of an error.
        crate::hostmem::check_available(
            need_new.saturating_sub(s.arena.free_bytes()),
            &format!("backup for sleeping tag {tag}"),
        )?;
        self.ensure_streams(&mut s)?;
        Ok(CopyPlan {
            streams: s.streams.clone(),
            piece: s.options.copy_piece_bytes.max(1 << 20),
            held_before: s.arena.held(),
            need_new,
            bound_only: policy == Policy::OffloadCompressed,
            pin_ahead: if policy == Policy::OffloadCompressed {
                pin_ahead.min(need_new)
            } else {
                need_new
            },
        })
    }

    /// Mark the segments busy and start pinning the backup bytes missing.
    fn start_pinning(&self, todo: &[SegTodo], run: &CopyPlan) {
        let mut s = self.lock();
        // Pin what is missing in the background, so pinning overlaps itself
        // (populate | register) and the copies into slabs already pinned. A
        // compressed backup pins in smaller slabs up to its bound and gives
        // back what its frames did not take (see `finish_sleep`), so the
        // arena holds about the encoded size, not the raw one; a small one
        // pins each frame's bytes as they come (a growth hint of 0).
        let missing = run.pin_ahead.saturating_sub(s.arena.free_bytes());
        let slab = if run.bound_only {
            s.options.pipeline_slab_bytes.min(COMPRESSED_PIN_SLAB_BYTES)
        } else {
            s.options.pipeline_slab_bytes
        };
        // The arena pins slabs of whole pages, no more than `plan_copies`
        // counted.
        let slab = pinned_len(slab as u64) as usize;
        let on_demand = run.bound_only && missing < COMPRESSED_PIN_MIN_SLABS * slab as u64;
        s.arena
            .set_growth_hint(Some(if on_demand { 0 } else { run.need_new }));
        if missing > 0 && !on_demand {
            s.arena.start_prefetch(missing, slab);
        }
        s.busy.extend(todo.iter().map(|t| t.ptr));
    }

    /// Issue every copy, one event per segment per stream it used. Returns
    /// the segments issued and not yet unmapped, in order, the error that
    /// stopped the issue, and the segment whose compressed backup that error
    /// left missing frames (for [`Self::finish_sleep`] to drop). `between`
    /// runs after each compressed segment's frames are queued, with the
    /// segments pending so far.
    #[allow(clippy::too_many_arguments)]
    fn issue_copies(
        &self,
        tag: TagId,
        todo: &[SegTodo],
        keep: &[Vec<(usize, usize)>],
        run: &CopyPlan,
        mut codec: Option<(&mut CodecScratch, Layout)>,
        report: &mut CycleReport,
        between: &mut dyn FnMut(&mut Pending, &mut CycleReport),
    ) -> (Pending, Option<Error>, Option<DevicePtr>) {
        let mut next_stream = 0usize;
        let mut pending: Pending = Vec::new();
        for (i, t) in todo.iter().enumerate() {
            if keep[i].is_empty() {
                if t.state == SleepState::Awake {
                    // A backup from an earlier Offload must not be restored
                    // over what this sleep does not keep.
                    self.lock().free_backup(t.ptr);
                }
                pending.push((i, Vec::new()));
                continue;
            }
            if let Some((sc, layout)) = codec.as_mut() {
                match self.issue_compressed(tag, t.ptr, t.committed, *layout, sc, &run.streams) {
                    Ok(e) => {
                        report.copied_bytes += e.encoded;
                        report.raw_bytes += e.raw;
                        pending.push((i, e.events));
                        between(&mut pending, report);
                    }
                    Err(e) => return (pending, Some(e), Some(t.ptr)),
                }
                continue;
            }
            match self.issue_backup(tag, t, &keep[i], run.piece, &run.streams, &mut next_stream) {
                Ok((events, bytes)) => {
                    report.copied_bytes += bytes;
                    pending.push((i, events));
                }
                Err(e) => return (pending, Some(e), None),
            }
        }
        (pending, None, None)
    }

    /// Give `t` a backup holding `keep` and queue its device-to-host copies.
    /// The arena is locked only to place the backup; the copies run without it.
    fn issue_backup(
        &self,
        tag: TagId,
        t: &SegTodo,
        keep: &[(usize, usize)],
        piece: usize,
        streams: &[StreamId],
        next_stream: &mut usize,
    ) -> Result<(Vec<EventId>, u64)> {
        let spans = {
            let mut s = self.lock();
            let reuse = s
                .backups
                .get(&t.ptr)
                .is_some_and(|b| b.ranges == keep && !b.is_compressed());
            if !reuse {
                s.free_backup(t.ptr);
                let len = keep.iter().map(|&(_, l)| l).sum();
                let pieces = s.arena.alloc_pieces(len)?;
                s.backups.insert(
                    t.ptr,
                    SegmentBackup {
                        tag,
                        ranges: keep.to_vec(),
                        pieces,
                        frames: Vec::new(),
                    },
                );
            }
            let b = s.backups.get_mut(&t.ptr).expect("inserted above");
            b.tag = tag;
            let b = &s.backups[&t.ptr];
            b.spans(&s.arena, 0, t.committed, piece)
        };
        let mut used = vec![false; streams.len()];
        let mut copied = 0u64;
        for (at, host, n) in spans {
            let k = *next_stream % streams.len();
            *next_stream += 1;
            // SAFETY: the segment is awake (mapped) and in this transition, so
            // no one unmaps it; `host` points into its backup with `n` bytes
            // left, kept (busy) until the copy is synchronized before unmap.
            unsafe {
                self.driver
                    .copy_dtoh_async(host, t.ptr + at as u64, n, streams[k])?
            };
            used[k] = true;
            copied += n as u64;
        }
        let mut events = Vec::new();
        for (k, &u) in used.iter().enumerate() {
            if u {
                let e = self.driver.event_create()?;
                if let Err(err) = self.driver.event_record(e, streams[k]) {
                    let _ = self.driver.event_destroy(e);
                    return Err(err);
                }
                events.push(e);
            }
        }
        Ok((events, copied))
    }

    /// Unmap each segment of `pending` as soon as its copies are done, while
    /// the later segments' copies still run: unmapping and releasing all of
    /// them after the last copy would add their whole cost to the sleep.
    /// Returns how many unmapped fully and the first error (`failure`, the
    /// issue's, first).
    fn unmap_as_copied(
        &self,
        segs: TagSegments<'_>,
        todo: &[SegTodo],
        pending: Pending,
        policy: Policy,
        mut failure: Option<Error>,
        report: &mut CycleReport,
    ) -> (usize, Option<Error>) {
        let mut ready: Vec<usize> = Vec::new();
        let mut done = 0usize;
        for (i, events) in pending {
            if !events.is_empty() && !ready.is_empty() {
                let out = self.unmap_copied(segs, todo, &ready, policy, report);
                done += out.0;
                failure = failure.or(out.1);
                ready.clear();
            }
            let waited = events
                .iter()
                .try_for_each(|&e| self.driver.event_synchronize(e));
            for &e in &events {
                let _ = self.driver.event_destroy(e);
            }
            match waited {
                Ok(()) => ready.push(i),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        if !ready.is_empty() {
            let out = self.unmap_copied(segs, todo, &ready, policy, report);
            done += out.0;
            failure = failure.or(out.1);
        }
        (done, failure)
    }

    /// Unmap the segments at the front of `pending` whose copies have all
    /// completed, without waiting for any; they leave `pending`. Returns how
    /// many unmapped fully and the first unmap error. A segment whose event
    /// cannot be queried stays pending, for [`Self::unmap_as_copied`] to wait
    /// on and report.
    fn unmap_completed(
        &self,
        segs: TagSegments<'_>,
        todo: &[SegTodo],
        pending: &mut Pending,
        policy: Policy,
        report: &mut CycleReport,
    ) -> (usize, Option<Error>) {
        let complete = pending
            .iter()
            .take_while(|(_, events)| {
                events
                    .iter()
                    .all(|&e| self.driver.event_query(e).unwrap_or(false))
            })
            .count();
        if complete == 0 {
            return (0, None);
        }
        let ready: Vec<usize> = pending
            .drain(..complete)
            .map(|(i, events)| {
                for e in events {
                    let _ = self.driver.event_destroy(e);
                }
                i
            })
            .collect();
        self.unmap_copied(segs, todo, &ready, policy, report)
    }

    /// Unmap the segments `todo[i]` for `i` in `idx`, whose backups are
    /// complete, under one call of `segs` (the pool lock, held only for the
    /// unmaps). Returns how many unmapped fully and the first error.
    fn unmap_copied(
        &self,
        segs: TagSegments<'_>,
        todo: &[SegTodo],
        idx: &[usize],
        policy: Policy,
        report: &mut CycleReport,
    ) -> (usize, Option<Error>) {
        let mut done = 0usize;
        let mut failure: Option<Error> = None;
        segs(&mut |ss| {
            for &i in idx {
                let t = &todo[i];
                let Some(seg) = ss.iter_mut().find(|s| s.ptr() == t.ptr) else {
                    continue;
                };
                let mapped = seg.mapped_bytes() as u64;
                let r = seg.unmap_all();
                if t.state == SleepState::Awake
                    && ((seg.mapped_bytes() as u64) < mapped || r.is_ok())
                {
                    // The backup is complete (its events were waited on); once
                    // any chunk is gone the segment is asleep, and both a
                    // retried sleep and wake take care of what is still mapped.
                    seg.set_sleep_state(policy.asleep_state());
                    report.segments += 1;
                }
                if r.is_ok() {
                    done += 1;
                }
                report.physical_bytes += mapped - seg.mapped_bytes() as u64;
                if let Err(e) = r {
                    failure.get_or_insert(e);
                }
            }
        });
        (done, failure)
    }

    /// Stop the pinning, count what it pinned, drop the backup a failed
    /// compressed issue left `partial`, and free the segments for other
    /// transitions.
    fn finish_sleep(
        &self,
        todo: &[SegTodo],
        run: &CopyPlan,
        failed: bool,
        partial: Option<DevicePtr>,
        report: &mut CycleReport,
    ) {
        if failed {
            // Copies of a segment whose issue failed midway are covered by no
            // event: wait for them before anyone may reuse or free the backup.
            for &st in &run.streams {
                let _ = self.driver.stream_synchronize(st);
            }
        }
        let mut s = self.lock();
        if let Some(ptr) = partial {
            // A backup missing frames must never be restored. Freed only
            // now: until the streams were idle its pieces took copies, and a
            // slab they free wholly may be unpinned (`release_backup`) at once.
            s.free_backup(ptr);
        }
        if run.bound_only {
            s.arena.stop_prefetch();
        } else {
            s.arena.finish_prefetch();
        }
        s.arena.set_growth_hint(None);
        report.newly_pinned_bytes = s.arena.held().saturating_sub(run.held_before);
        for t in todo {
            s.busy.remove(&t.ptr);
        }
    }
}
