//! The sleep of one tag, in phases: take the snapshot, check Reload's proofs
//! and plan what each segment keeps on the host, check room for the backup,
//! synchronize, issue the copies, unmap each segment as its copies complete,
//! finish.

use std::cell::RefCell;
use std::collections::HashSet;
use std::time::Instant;

use super::compressed::{self, CodecScratch};
use super::options::{CycleReport, Policy};
use super::plan::{self, SegTodo, Transition};
use super::release::{Pending, Progress, Unit};
use super::room::Releases;
use super::{SegmentBackup, SleepEngine, TagSegments};
use crate::codec::Layout;
use crate::driver::{DevicePtr, StreamId};
use crate::error::{Error, Result};
use crate::hostmem::pinned_len;
use crate::segment::{Segment, SleepState};
use crate::tag::TagId;

/// Where a sleep or wake runs: which of the engine's two sets of streams it
/// queues on (a swap runs its sleep and its wake at once, one on each, so
/// the two directions of the link overlap), whether the device was already
/// synchronized for it, and who hears of the memory a sleep releases.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Lane<'a> {
    /// The second set of streams.
    pub(super) second: bool,
    /// The caller synchronized the device after the last work it queued.
    pub(super) synced: bool,
    /// Told each time the sleep releases chunks, and when it ends.
    pub(super) releases: Option<&'a Releases>,
}

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
        let _one = self.one_transition();
        self.sleep_in(tag, policy, segs, in_use, Lane::default())
    }

    /// [`Self::sleep_tag`] within a transition the caller holds, on `lane`.
    pub(super) fn sleep_in(
        &self,
        tag: TagId,
        policy: Policy,
        segs: TagSegments<'_>,
        in_use: Option<&[(DevicePtr, usize)]>,
        lane: Lane<'_>,
    ) -> Result<CycleReport> {
        let t0 = Instant::now();
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
        if !lane.synced {
            self.driver.synchronize()?;
        }
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
        // Segments an earlier sleep left asleep with chunks whose copies
        // never completed: copied again before they are unmapped.
        let stale: Vec<Vec<(usize, usize)>> = {
            let s = self.lock();
            todo.iter()
                .map(|t| match s.backups.get(&t.ptr) {
                    Some(b) if t.state != SleepState::Awake => b.stale.clone(),
                    _ => Vec::new(),
                })
                .collect()
        };
        let refresh_frames = {
            let s = self.lock();
            todo.iter().zip(&stale).any(|(t, st)| {
                !st.is_empty() && s.backups.get(&t.ptr).is_some_and(|b| b.is_compressed())
            })
        };
        let compress = (policy == Policy::OffloadCompressed && keep.iter().any(|k| !k.is_empty()))
            || refresh_frames;
        if compress {
            self.release_stale_scratch();
        }
        let mut scratch = self.guard_scratch(if compress {
            let words = self.length_words()?;
            match CodecScratch::for_sleep(&self.driver, frame, ring, words) {
                Ok(sc) => Some(sc),
                // A nearly full device: raw backups need no device memory,
                // and a sleep that frees memory must not fail for want of it.
                Err(e) if e.is_out_of_memory() && !refresh_frames => {
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
        let run = self.plan_copies(tag, &todo, &keep, policy, frame, lane.second)?;
        if let Some(r) = lane.releases {
            // Hashed, scratch mapped: from here on this sleep only gives
            // device memory back.
            r.ready();
        }
        self.start_pinning(&todo, &run);
        let codec = scratch.sc.as_mut().map(|sc| (sc, layout));
        let mut progress = Progress::new(lane.releases);
        // A compressed backup is issued at the encoder's pace, so the
        // chunks whose copies completed meanwhile are unmapped between
        // frames instead of all after the last copy.
        let mut early_failure = None;
        let mut unmap_early = |pending: &mut Pending, report: &mut CycleReport| {
            let failure = self.unmap_completed(segs, &todo, pending, policy, report, &mut progress);
            early_failure = early_failure.take().or(failure);
        };
        let mut coded = HashSet::new();
        let (pending, failure) = self.issue_copies(
            tag,
            &todo,
            &keep,
            &stale,
            &run,
            codec,
            &mut report,
            &mut coded,
            &mut unmap_early,
        );
        let failure = early_failure.or(failure);
        let failure = self.unmap_as_copied(
            segs,
            &todo,
            pending,
            policy,
            failure,
            &mut report,
            &mut progress,
        );
        self.finish_sleep(
            segs,
            &todo,
            &run,
            failure.is_some(),
            &progress,
            &coded,
            &mut report,
        );
        // Every copy out of the scratch is complete (waited on, or the
        // streams synchronized after a failure).
        drop(scratch);
        report.seconds = t0.elapsed().as_secs_f64();
        let done = progress.emptied();
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
        second: bool,
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
        let streams = self.lane_streams(&mut s, second)?;
        Ok(CopyPlan {
            streams,
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

    /// Issue every copy: per run of chunks, the copies out of them and one
    /// event per stream they used (see [`Unit`]). Returns the units issued
    /// and not yet unmapped, in order, and the error that stopped the issue.
    /// `coded` receives the segments given compressed frames. `between` runs
    /// after each run of chunks a compressed backup covers, with the units
    /// pending so far.
    #[allow(clippy::too_many_arguments)]
    fn issue_copies(
        &self,
        tag: TagId,
        todo: &[SegTodo],
        keep: &[Vec<(usize, usize)>],
        stale: &[Vec<(usize, usize)>],
        run: &CopyPlan,
        mut codec: Option<(&mut CodecScratch, Layout)>,
        report: &mut CycleReport,
        coded: &mut HashSet<usize>,
        between: &mut dyn FnMut(&mut Pending, &mut CycleReport),
    ) -> (Pending, Option<Error>) {
        let mut next_stream = 0usize;
        let mut pending: Pending = Vec::new();
        let whole = |i: usize| Unit {
            seg: i,
            chunks: 0..todo[i].chunks.len(),
            events: Vec::new(),
        };
        for (i, t) in todo.iter().enumerate() {
            let refresh = !stale[i].is_empty();
            if keep[i].is_empty() && !refresh {
                if t.state == SleepState::Awake {
                    // A backup from an earlier Offload must not be restored
                    // over what this sleep does not keep.
                    self.lock().free_backup(t.ptr);
                }
                pending.push(whole(i));
                continue;
            }
            let frames = self
                .lock()
                .backups
                .get(&t.ptr)
                .is_some_and(|b| b.is_compressed());
            // Frames only for a compressed sleep, or to refresh a compressed
            // backup (whatever this sleep's policy).
            let encode = if refresh {
                frames
            } else {
                run.bound_only && codec.is_some()
            };
            if encode {
                let Some((sc, layout)) = codec.as_mut() else {
                    return (pending, Some(Error::InvalidState(format!(
                        "segment at {:#x} of tag {tag} needs its compressed backup refreshed but the sleep has no codec scratch",
                        t.ptr
                    ))));
                };
                coded.insert(i);
                let ranges = if refresh {
                    stale[i].clone()
                } else {
                    vec![(0, t.committed)]
                };
                let r = self.issue_compressed(
                    tag,
                    i,
                    t,
                    &ranges,
                    refresh,
                    *layout,
                    sc,
                    &run.streams,
                    &mut pending,
                    report,
                    run.piece,
                    between,
                );
                if let Err(e) = r {
                    return (pending, Some(e));
                }
                continue;
            }
            let ranges = if refresh { &stale[i] } else { &keep[i] };
            match self.issue_backup(
                tag,
                i,
                t,
                ranges,
                refresh,
                run,
                &mut next_stream,
                &mut pending,
            ) {
                Ok(bytes) => report.copied_bytes += bytes,
                Err(e) => return (pending, Some(e)),
            }
        }
        (pending, None)
    }

    /// Give `t` (snapshot index `i`) a backup holding `keep` and queue its
    /// device-to-host copies, one unit per run of chunks of at least a copy
    /// piece, so the memory goes back in runs that size as copies complete.
    /// With `refresh`, the segment keeps the backup it has and only the
    /// ranges `keep` (stale ones) are copied into it again. The arena is
    /// locked only to place the backup; the copies run without it.
    #[allow(clippy::too_many_arguments)]
    fn issue_backup(
        &self,
        tag: TagId,
        i: usize,
        t: &SegTodo,
        keep: &[(usize, usize)],
        refresh: bool,
        run: &CopyPlan,
        next_stream: &mut usize,
        pending: &mut Pending,
    ) -> Result<u64> {
        let (streams, piece) = (&run.streams, run.piece);
        // Per chunk, the host spans its copies fill.
        let spans: Vec<Vec<(usize, *mut u8, usize)>> = {
            let mut s = self.lock();
            let reuse = refresh
                || s.backups
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
                        stale: Vec::new(),
                    },
                );
            }
            let Some(b) = s.backups.get_mut(&t.ptr) else {
                return Err(Error::InvalidState(format!(
                    "segment at {:#x} of tag {tag} has stale backup ranges but no backup",
                    t.ptr
                )));
            };
            b.tag = tag;
            let b = &s.backups[&t.ptr];
            t.chunks
                .iter()
                .map(|c| {
                    let inside =
                        |&&(o, l): &&(usize, usize)| o < c.offset + c.size && c.offset < o + l;
                    if c.handle.is_none() || (refresh && !keep.iter().any(|r| inside(&r))) {
                        return Vec::new();
                    }
                    let mut v = Vec::new();
                    for &(o, l) in keep.iter().filter(inside) {
                        let (lo, hi) = (o.max(c.offset), (o + l).min(c.offset + c.size));
                        v.extend(b.spans(&s.arena, lo, hi - lo, piece));
                    }
                    v
                })
                .collect()
        };
        let mut copied = 0u64;
        let (mut used, mut first, mut bytes) = (vec![false; streams.len()], 0usize, 0usize);
        for (c, chunk_spans) in spans.iter().enumerate() {
            for &(at, host, n) in chunk_spans {
                let k = *next_stream % streams.len();
                *next_stream += 1;
                // SAFETY: the chunk is mapped (awake, or left mapped by an
                // earlier sleep) and the segment in this transition, so no one
                // unmaps it; `host` points into its backup with `n` bytes
                // left, kept (busy) until the copy is waited on before unmap.
                unsafe {
                    self.driver
                        .copy_dtoh_async(host, t.ptr + at as u64, n, streams[k])?
                };
                used[k] = true;
                copied += n as u64;
            }
            bytes += t.chunks[c].size;
            let last = c + 1 == t.chunks.len();
            if bytes >= piece || last {
                let events = self.record_events(streams, &used)?;
                pending.push(Unit {
                    seg: i,
                    chunks: first..c + 1,
                    events,
                });
                used.iter_mut().for_each(|u| *u = false);
                (first, bytes) = (c + 1, 0);
            }
        }
        if t.chunks.is_empty() {
            pending.push(Unit {
                seg: i,
                chunks: 0..0,
                events: Vec::new(),
            });
        }
        Ok(copied)
    }

    /// Stop the pinning, count what it pinned, and free the segments for
    /// other transitions.
    #[allow(clippy::too_many_arguments)]
    fn finish_sleep(
        &self,
        segs: TagSegments<'_>,
        todo: &[SegTodo],
        run: &CopyPlan,
        failed: bool,
        progress: &Progress<'_>,
        coded: &HashSet<usize>,
        report: &mut CycleReport,
    ) {
        if failed {
            // Copies of a unit whose issue failed midway are covered by no
            // event: wait for them before anyone may reuse or free the backup.
            for &st in &run.streams {
                let _ = self.driver.stream_synchronize(st);
            }
        }
        // Before the segments are free for others: a backup missing frames
        // is dropped, stale ranges are marked. Only now: until the streams
        // were idle its pieces took copies, and a slab they free wholly may
        // be unpinned (`release_backup`) at once.
        self.settle_backups(segs, todo, progress, coded);
        let mut s = self.lock();
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
