//! The sleep engine: per-segment transitions of one tag, the streams and
//! events they run on, and the backup arena they fill.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::driver::{DevicePtr, Driver, EventId, StreamId};
use crate::error::{Error, Result};
use crate::segment::{Segment, SleepState};
use crate::sleep::backup::{BackupArena, BackupRange, DEFAULT_SLAB_BYTES};
use crate::sleep::reload::ReloadSource;
use crate::tag::TagId;

/// What sleep does with a tag's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(C)]
pub enum Policy {
    /// Copy to a pinned host backup, then release. Restored byte for byte at wake.
    Offload = 0,
    /// Release; contents are undefined after wake.
    Discard = 1,
    /// Release with no backup; restored from the checkpoint the bytes were loaded from.
    Reload = 2,
}

impl Policy {
    /// The segment state a segment is in after sleeping with this policy.
    pub fn asleep_state(self) -> SleepState {
        match self {
            Policy::Offload => SleepState::Offloaded,
            Policy::Discard => SleepState::Discarded,
            Policy::Reload => SleepState::Reloadable,
        }
    }

    /// Parse "offload", "discard" or "reload".
    pub fn parse(s: &str) -> Result<Policy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "offload" => Ok(Policy::Offload),
            "discard" => Ok(Policy::Discard),
            "reload" => Ok(Policy::Reload),
            other => Err(Error::InvalidArgument(format!(
                "unknown sleep policy `{other}`: expected offload, discard or reload"
            ))),
        }
    }
}

/// Tunables of the sleep engine.
#[derive(Debug, Clone)]
pub struct SleepOptions {
    /// Size of one copy on one stream.
    pub copy_piece_bytes: usize,
    /// Streams the copies are spread over (at least 2).
    pub streams: usize,
    /// At wake, each run of unmapped chunks is re-cut into physical chunks of
    /// this size: few driver calls, and the first copy starts after one small create.
    pub wake_coalesce_bytes: usize,
    /// Size of each pinned backup slab made on demand.
    pub backup_slab_bytes: usize,
    /// Slab size of the background pinning pipeline (first sleep, reserve-ahead).
    pub pipeline_slab_bytes: usize,
    /// Cap on pinned backup memory.
    pub host_memory_limit: u64,
    /// Free the backup of a segment once it is awake again (the memory stays
    /// pinned in the arena for the next sleep unless `release_pinned_after_wake`).
    pub free_backup_after_wake: bool,
    /// Also unpin and unmap backup slabs that hold nothing after wake.
    pub release_pinned_after_wake: bool,
    /// Fill discarded memory with this byte at wake, so stale reads are visible.
    pub debug_fill_discarded: Option<u8>,
}

/// Most streams a sleep engine spreads copies over.
pub const MAX_STREAMS: usize = 64;

impl SleepOptions {
    /// Refuse values no machine can honour: more than [`MAX_STREAMS`] streams,
    /// or sizes over [`crate::units::MAX_BYTES`]. Zero sizes are refused too
    /// (the C layer maps 0 to the default before this check).
    pub fn validate(&self) -> Result<()> {
        if self.streams == 0 || self.streams > MAX_STREAMS {
            return Err(Error::InvalidArgument(format!(
                "sleep option streams = {} must be in 1..={MAX_STREAMS}",
                self.streams
            )));
        }
        let max = crate::units::MAX_BYTES;
        for (what, n) in [
            ("copy_piece_bytes", self.copy_piece_bytes),
            ("wake_coalesce_bytes", self.wake_coalesce_bytes),
            ("backup_slab_bytes", self.backup_slab_bytes),
            ("pipeline_slab_bytes", self.pipeline_slab_bytes),
        ] {
            if n == 0 || n > max {
                return Err(Error::InvalidArgument(format!(
                    "sleep option {what} = {n} must be in 1..={max} (2^56)"
                )));
            }
        }
        Ok(())
    }
}

impl Default for SleepOptions {
    fn default() -> Self {
        SleepOptions {
            copy_piece_bytes: 64 << 20,
            streams: 2,
            wake_coalesce_bytes: 256 << 20,
            backup_slab_bytes: DEFAULT_SLAB_BYTES,
            pipeline_slab_bytes: crate::sleep::backup::PIPELINE_SLAB_BYTES,
            host_memory_limit: u64::MAX,
            free_backup_after_wake: false,
            release_pinned_after_wake: false,
            debug_fill_discarded: None,
        }
    }
}

/// What one sleep or wake of one tag did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CycleReport {
    /// Segments whose state changed.
    pub segments: usize,
    /// Physical bytes released (sleep) or mapped (wake).
    pub physical_bytes: u64,
    /// Bytes copied between device and host backup.
    pub copied_bytes: u64,
    /// Bytes restored from checkpoints (Reload).
    pub reloaded_bytes: u64,
    /// Pinned host bytes newly allocated during this call.
    pub newly_pinned_bytes: u64,
    /// Wall time of the call.
    pub seconds: f64,
}

/// A segment's backup: pieces of the arena that together hold its committed
/// bytes in order (piece k holds the bytes right after piece k-1).
#[derive(Debug, Clone)]
struct SegmentBackup {
    tag: TagId,
    pieces: Vec<BackupRange>,
}

impl SegmentBackup {
    fn len(&self) -> usize {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// Split the segment range `[off, off+len)` into spans of at most `max`
    /// bytes that each lie in one backup piece: `(segment offset, host ptr, n)`.
    fn spans(
        &self,
        arena: &BackupArena,
        off: usize,
        len: usize,
        max: usize,
    ) -> Vec<(usize, *mut u8, usize)> {
        let mut out = Vec::new();
        let mut piece_start = 0;
        for p in &self.pieces {
            let piece_end = piece_start + p.len;
            let lo = off.max(piece_start);
            let hi = (off + len).min(piece_end);
            let mut at = lo;
            while at < hi {
                let n = max.min(hi - at);
                // SAFETY: `at - piece_start < p.len`, inside the piece.
                let host = unsafe { arena.host_ptr(*p).add(at - piece_start) };
                out.push((at, host, n));
                at += n;
            }
            piece_start = piece_end;
        }
        out
    }
}

#[derive(Debug)]
struct EngineState {
    arena: BackupArena,
    streams: Vec<StreamId>,
    /// Backups by segment base address. A backup stays assigned after wake
    /// (unless configured otherwise), so the next sleep reuses the same memory.
    backups: HashMap<DevicePtr, SegmentBackup>,
    reload: HashMap<TagId, Vec<Arc<dyn ReloadSource>>>,
    options: SleepOptions,
}

/// Sleep and wake for the segments of one device. Calls are serialized.
#[derive(Debug)]
pub struct SleepEngine {
    driver: Arc<dyn Driver>,
    state: Mutex<EngineState>,
}

impl SleepEngine {
    /// An engine with `options` for `driver`. Nothing is allocated until used.
    pub fn new(driver: Arc<dyn Driver>, options: SleepOptions) -> SleepEngine {
        SleepEngine {
            state: Mutex::new(EngineState {
                arena: BackupArena::new(
                    driver.clone(),
                    options.backup_slab_bytes,
                    options.host_memory_limit,
                ),
                streams: Vec::new(),
                backups: HashMap::new(),
                reload: HashMap::new(),
                options,
            }),
            driver,
        }
    }

    fn lock(&self) -> MutexGuard<'_, EngineState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current options.
    pub fn options(&self) -> SleepOptions {
        self.lock().options.clone()
    }

    /// Replace the options (the host-memory limit applies to future pinning).
    pub fn set_options(&self, options: SleepOptions) {
        let mut s = self.lock();
        s.arena.set_limit(options.host_memory_limit);
        s.arena.set_slab_bytes(options.backup_slab_bytes);
        s.options = options;
    }

    /// Pin `bytes` of backup memory ahead of time, so even the first sleep
    /// runs at the link's rate.
    pub fn reserve_backup(&self, bytes: u64) -> Result<()> {
        self.lock().arena.reserve(bytes)
    }

    /// Unpin every backup slab that holds no backup of an asleep segment. The
    /// backups of awake segments are dropped first. Returns bytes unpinned.
    pub fn release_backup(&self, awake: &dyn Fn(DevicePtr) -> bool) -> u64 {
        let mut s = self.lock();
        let stale: Vec<DevicePtr> = s.backups.keys().copied().filter(|&va| awake(va)).collect();
        for va in stale {
            if let Some(b) = s.backups.remove(&va) {
                b.pieces.into_iter().for_each(|p| s.arena.free(p));
            }
        }
        s.arena.release_unused()
    }

    /// Pinned backup bytes held (in use or kept for reuse).
    pub fn backup_held_bytes(&self) -> u64 {
        self.lock().arena.held()
    }

    /// Backup bytes assigned to segments, per tag.
    pub fn backup_bytes_by_tag(&self) -> HashMap<TagId, u64> {
        let s = self.lock();
        let mut m = HashMap::new();
        for b in s.backups.values() {
            *m.entry(b.tag).or_insert(0) += b.len() as u64;
        }
        m
    }

    /// Forget a segment that is being freed: its backup returns to the arena.
    pub fn forget_segment(&self, va: DevicePtr) {
        let mut s = self.lock();
        if let Some(b) = s.backups.remove(&va) {
            b.pieces.into_iter().for_each(|p| s.arena.free(p));
        }
    }

    /// Register a source that can restore bytes of `tag` for the Reload policy.
    /// Sources whose every range the new one also covers are dropped: a newer
    /// load into the same parameters supersedes the older one (no replay of
    /// stale loads, no checkpoints kept open for nothing).
    pub fn add_reload_source(&self, tag: TagId, source: Arc<dyn ReloadSource>) {
        let new_ranges = source.covered_ranges();
        let covers = |&(a, l): &(DevicePtr, usize)| {
            new_ranges
                .iter()
                .any(|&(b, m)| b <= a && a + l as u64 <= b + m as u64)
        };
        let mut s = self.lock();
        let list = s.reload.entry(tag).or_default();
        list.retain(|old| !old.covered_ranges().iter().all(covers));
        list.push(source);
    }

    /// Drop the reload sources of `tag`.
    pub fn clear_reload_sources(&self, tag: TagId) {
        self.lock().reload.remove(&tag);
    }

    /// Wait until every reload source of `tag` has finished what it prepares
    /// after a Reload sleep (e.g. pinning the checkpoint's page cache).
    pub fn wait_reload_prepared(&self, tag: TagId) {
        let sources: Vec<Arc<dyn ReloadSource>> =
            self.lock().reload.get(&tag).cloned().unwrap_or_default();
        for src in sources {
            src.wait_prepared();
        }
    }

    /// True when `tag` has at least one reload source.
    pub fn has_reload_source(&self, tag: TagId) -> bool {
        self.lock().reload.get(&tag).is_some_and(|v| !v.is_empty())
    }

    fn ensure_streams(&self, s: &mut EngineState) -> Result<()> {
        let want = s.options.streams.max(2);
        while s.streams.len() < want {
            s.streams.push(self.driver.stream_create()?);
        }
        Ok(())
    }

    /// Put the awake segments among `segs` (all of tag `tag`) to sleep with `policy`.
    ///
    /// Offload checks the host-memory limit before anything moves. If a copy
    /// fails midway, the segments already copied are asleep with their backups
    /// and the rest stay awake; the error says so, and calling again finishes.
    pub fn sleep(
        &self,
        tag: TagId,
        segs: &mut [&mut Segment],
        policy: Policy,
    ) -> Result<CycleReport> {
        let t0 = Instant::now();
        let mut s = self.lock();
        let awake: Vec<usize> = (0..segs.len())
            .filter(|&i| segs[i].sleep_state() == SleepState::Awake)
            .collect();
        let mut report = CycleReport::default();
        if awake.is_empty() {
            report.seconds = t0.elapsed().as_secs_f64();
            return Ok(report);
        }
        match policy {
            Policy::Offload => self.offload(&mut s, tag, segs, &awake, &mut report)?,
            Policy::Discard | Policy::Reload => {
                if policy == Policy::Reload && !s.reload.get(&tag).is_some_and(|v| !v.is_empty()) {
                    return Err(Error::InvalidState(format!(
                        "tag {tag} has no reload source (load it with the loader first, or use Offload/Discard)"
                    )));
                }
                // No queued work may still touch memory that is unmapped.
                self.driver.synchronize()?;
                for &i in &awake {
                    let mapped = segs[i].mapped_bytes() as u64;
                    let r = segs[i].unmap_all();
                    // Once any chunk is gone the segment is asleep: wake maps
                    // every chunk that has no memory, whatever failed here.
                    if (segs[i].mapped_bytes() as u64) < mapped || r.is_ok() {
                        segs[i].set_sleep_state(policy.asleep_state());
                        report.segments += 1;
                    }
                    report.physical_bytes += mapped - segs[i].mapped_bytes() as u64;
                    r?;
                }
                if policy == Policy::Reload {
                    for src in s.reload.get(&tag).into_iter().flatten() {
                        src.prepare();
                    }
                }
            }
        }
        report.seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Back up and release the awake segments `awake` of `segs`.
    ///
    /// A backup covers a segment's whole committed range, not only its live
    /// blocks: the engine works on segments and never sees the pool's block
    /// map, and a wake then restores every chunk with whole-chunk copies. A
    /// tag holding one small block in a segment of its own therefore backs up
    /// the granularity (2 MiB); the need is checked against the limit and the
    /// host's available memory before anything moves, so too much fails with
    /// `HostOutOfMemory`. Arena-mode tags pack small blocks into one segment.
    fn offload(
        &self,
        s: &mut EngineState,
        tag: TagId,
        segs: &mut [&mut Segment],
        awake: &[usize],
        report: &mut CycleReport,
    ) -> Result<()> {
        // Check the host-memory limit before anything moves.
        let mut need_new = 0u64;
        for &i in awake {
            let have = s
                .backups
                .get(&segs[i].ptr())
                .is_some_and(|b| b.len() == segs[i].committed());
            if !have && segs[i].committed() > 0 {
                need_new += segs[i].committed() as u64;
            }
        }
        let can_pin = s.arena.limit().saturating_sub(s.arena.held()) + s.arena.free_bytes();
        if need_new > can_pin {
            return Err(Error::HostOutOfMemory {
                what: format!("backup for sleeping tag {tag}"),
                requested: need_new,
                limit: s.arena.limit(),
                in_use: s.arena.held(),
            });
        }
        // And against the host: populating more than it has available wakes
        // the kernel's out-of-memory killer instead of returning an error.
        crate::hostmem::check_available(
            need_new.saturating_sub(s.arena.free_bytes()),
            &format!("backup for sleeping tag {tag}"),
        )?;
        self.ensure_streams(s)?;
        // Our streams do not order against the caller's (PyTorch's) streams:
        // work still queued there may be writing these bytes.
        self.driver.synchronize()?;
        let held_before = s.arena.held();
        s.arena.set_growth_hint(Some(need_new));
        // Pin what is missing in the background, so pinning overlaps itself
        // (populate | register) and the copies into slabs already pinned.
        let missing = need_new.saturating_sub(s.arena.free_bytes());
        if missing > 0 {
            s.arena
                .start_prefetch(missing, s.options.pipeline_slab_bytes);
        }
        let piece = s.options.copy_piece_bytes.max(1 << 20);
        let streams = s.streams.clone();
        let mut next_stream = 0usize;
        // Issue every copy, one event per segment per stream it used; unmap
        // each segment once its events complete.
        let mut pending: Vec<(usize, Vec<EventId>)> = Vec::new();
        let mut failure: Option<Error> = None;
        for &i in awake {
            if segs[i].committed() == 0 {
                // Nothing committed (an arena whose first commit failed): asleep
                // trivially, with no backup.
                segs[i].set_sleep_state(SleepState::Offloaded);
                report.segments += 1;
                continue;
            }
            match self.issue_offload(s, tag, segs[i], piece, &streams, &mut next_stream) {
                Ok((events, bytes)) => {
                    report.copied_bytes += bytes;
                    pending.push((i, events));
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        for (i, events) in pending {
            let waited = events
                .iter()
                .try_for_each(|&e| self.driver.event_synchronize(e));
            for &e in &events {
                let _ = self.driver.event_destroy(e);
            }
            if let Err(e) = waited {
                failure.get_or_insert(e);
                continue;
            }
            let mapped = segs[i].mapped_bytes() as u64;
            let r = segs[i].unmap_all();
            if (segs[i].mapped_bytes() as u64) < mapped || r.is_ok() {
                // The backup is complete (its events were waited on); once any
                // chunk is gone the segment is asleep and wake restores it all.
                segs[i].set_sleep_state(SleepState::Offloaded);
                report.segments += 1;
            }
            report.physical_bytes += mapped - segs[i].mapped_bytes() as u64;
            if let Err(e) = r {
                failure.get_or_insert(e);
            }
        }
        if failure.is_some() {
            // Copies of a segment whose issue failed midway are covered by no
            // event: wait for them before anyone may reuse or free the backup.
            for &st in &streams {
                let _ = self.driver.stream_synchronize(st);
            }
        }
        s.arena.finish_prefetch();
        s.arena.set_growth_hint(None);
        report.newly_pinned_bytes = s.arena.held().saturating_sub(held_before);
        match failure {
            None => Ok(()),
            // Nothing went to sleep: the tag is as before, and the cause
            // (out of host memory, a driver error) is the whole story.
            Some(e) if report.segments == 0 => Err(e),
            Some(e) => Err(Error::InvalidState(format!(
                "sleep of tag {tag} stopped after {} of {} segments (those are asleep with their backups, the rest awake; sleeping again finishes): {e}",
                report.segments,
                awake.len()
            ))),
        }
    }

    fn issue_offload(
        &self,
        s: &mut EngineState,
        tag: TagId,
        seg: &Segment,
        piece: usize,
        streams: &[StreamId],
        next_stream: &mut usize,
    ) -> Result<(Vec<EventId>, u64)> {
        let len = seg.committed();
        let reuse = s.backups.get(&seg.ptr()).is_some_and(|b| b.len() == len);
        if !reuse {
            if let Some(old) = s.backups.remove(&seg.ptr()) {
                old.pieces.into_iter().for_each(|p| s.arena.free(p));
            }
            let pieces = s.arena.alloc_pieces(len)?;
            s.backups.insert(seg.ptr(), SegmentBackup { tag, pieces });
        }
        if let Some(b) = s.backups.get_mut(&seg.ptr()) {
            b.tag = tag;
        }
        let backup = &s.backups[&seg.ptr()];
        let mut used = vec![false; streams.len()];
        let mut copied = 0u64;
        for c in seg.chunks() {
            for (at, host, n) in backup.spans(&s.arena, c.offset, c.size, piece) {
                let k = *next_stream % streams.len();
                *next_stream += 1;
                // SAFETY: the chunk is mapped (the segment is awake); `host` points
                // into a backup piece with `n` bytes left; the backup outlives the
                // copy, which is synchronized before unmap.
                unsafe {
                    self.driver
                        .copy_dtoh_async(host, seg.ptr() + at as u64, n, streams[k])?
                };
                used[k] = true;
                copied += n as u64;
            }
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

    /// Wake the asleep segments among `segs` (all of tag `tag`). Transactional:
    /// on any failure every chunk mapped by this call is unmapped again and the
    /// segments stay asleep with their backups; the error is returned.
    pub fn wake(&self, tag: TagId, segs: &mut [&mut Segment]) -> Result<CycleReport> {
        let t0 = Instant::now();
        let mut s = self.lock();
        let asleep: Vec<usize> = (0..segs.len())
            .filter(|&i| segs[i].sleep_state() != SleepState::Awake)
            .collect();
        let mut report = CycleReport::default();
        if asleep.is_empty() {
            report.seconds = t0.elapsed().as_secs_f64();
            return Ok(report);
        }
        let needed: u64 = asleep
            .iter()
            .map(|&i| (segs[i].committed() - segs[i].mapped_bytes()) as u64)
            .sum();
        let free = self.driver.mem_info()?.free;
        if needed > free {
            return Err(Error::OutOfMemory {
                what: format!("wake of tag {tag} ({} segments)", asleep.len()),
                requested: needed,
                free,
            });
        }
        for &i in asleep.iter() {
            if segs[i].sleep_state() == SleepState::Reloadable
                && !s.reload.get(&tag).is_some_and(|v| !v.is_empty())
            {
                return Err(Error::InvalidState(format!(
                    "tag {tag} sleeps with Reload but its reload source is gone"
                )));
            }
        }
        self.ensure_streams(&mut s)?;
        let coalesce = s.options.wake_coalesce_bytes;
        for &i in &asleep {
            segs[i].rechunk_unmapped(coalesce);
        }
        let mut mapped: Vec<(usize, usize)> = Vec::new();
        let result = self.wake_inner(&s, tag, segs, &asleep, &mut mapped, &mut report);
        if let Err(e) = result {
            // Copies may still target chunks we are about to unmap.
            for &st in &s.streams {
                let _ = self.driver.stream_synchronize(st);
            }
            let _ = self.driver.synchronize();
            for &(i, c) in mapped.iter().rev() {
                let _ = segs[i].unmap_chunk(c);
            }
            return Err(e);
        }
        for &i in &asleep {
            segs[i].set_sleep_state(SleepState::Awake);
            if s.options.free_backup_after_wake {
                if let Some(b) = s.backups.remove(&segs[i].ptr()) {
                    b.pieces.into_iter().for_each(|p| s.arena.free(p));
                }
            }
        }
        if s.options.release_pinned_after_wake {
            s.arena.release_unused();
        }
        report.segments = asleep.len();
        report.seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    }

    fn wake_inner(
        &self,
        s: &EngineState,
        tag: TagId,
        segs: &mut [&mut Segment],
        asleep: &[usize],
        mapped: &mut Vec<(usize, usize)>,
        report: &mut CycleReport,
    ) -> Result<()> {
        let piece = s.options.copy_piece_bytes.max(1 << 20);
        let mut next_stream = 0usize;
        let mut reload_ranges: Vec<(DevicePtr, usize)> = Vec::new();
        for &i in asleep {
            let state = segs[i].sleep_state();
            let backup = match state {
                SleepState::Offloaded if segs[i].committed() > 0 => {
                    let b = s.backups.get(&segs[i].ptr()).ok_or_else(|| {
                        Error::InvalidState(format!(
                            "segment at {:#x} is offloaded but has no backup",
                            segs[i].ptr()
                        ))
                    })?;
                    Some(b)
                }
                _ => None,
            };
            for c in 0..segs[i].chunks().len() {
                let chunk = segs[i].chunks()[c];
                if chunk.handle.is_some() {
                    continue;
                }
                segs[i].map_chunk(c)?;
                mapped.push((i, c));
                report.physical_bytes += chunk.size as u64;
                let va = segs[i].ptr() + chunk.offset as u64;
                match (state, backup) {
                    (SleepState::Offloaded, Some(b)) => {
                        for (at, host, n) in b.spans(&s.arena, chunk.offset, chunk.size, piece) {
                            let st = s.streams[next_stream % s.streams.len()];
                            next_stream += 1;
                            // SAFETY: the chunk was just mapped; `host` points into a
                            // backup piece with `n` bytes left, alive (engine lock
                            // held) until the streams are synchronized below.
                            unsafe {
                                self.driver.copy_htod_async(
                                    segs[i].ptr() + at as u64,
                                    host,
                                    n,
                                    st,
                                )?
                            };
                            report.copied_bytes += n as u64;
                        }
                    }
                    (SleepState::Discarded, _) => {
                        if let Some(byte) = s.options.debug_fill_discarded {
                            let st = s.streams[next_stream % s.streams.len()];
                            next_stream += 1;
                            // SAFETY: the chunk was just mapped with access granted.
                            unsafe { self.driver.memset_async(va, byte, chunk.size, st)? };
                        }
                    }
                    (SleepState::Reloadable, _) => reload_ranges.push((va, chunk.size)),
                    _ => {}
                }
            }
        }
        for &st in &s.streams {
            self.driver.stream_synchronize(st)?;
        }
        if !reload_ranges.is_empty() {
            if let Some(sources) = s.reload.get(&tag) {
                for src in sources {
                    report.reloaded_bytes += src.reload(self.driver.as_ref(), &reload_ranges)?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for SleepEngine {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for &st in &s.streams {
            let _ = self.driver.stream_synchronize(st);
            let _ = self.driver.stream_destroy(st);
        }
    }
}
