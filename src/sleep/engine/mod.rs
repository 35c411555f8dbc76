//! The sleep engine: per-segment transitions of one tag, the streams and
//! events they run on, and the backup arena they fill.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::driver::{DevicePtr, Driver, PhysHandle, StreamId};
use crate::error::{Error, Result};
use crate::segment::{map_new_at, unmap_release_at, Segment, SleepState};
use crate::sleep::backup::{BackupArena, BackupRange};
use crate::tag::TagId;
use plan::{SegTodo, Transition};
use sources::{Registered, Replay};

mod options;
mod plan;
mod sleep;
mod sources;
mod staged;

pub use options::{CycleReport, Policy, SleepOptions, MAX_STREAMS};
pub use sources::Retired;
pub use staged::{HostSpan, StagedWake};

/// Access to one tag's segments for the short steps of a sleep or wake that
/// read or change them: the callee gets every segment of the tag, in a stable
/// order, and the pool holds its lock only for the call. Copies, reloads and
/// driver map calls run between these calls, with no pool lock held.
pub type TagSegments<'a> = &'a dyn Fn(&mut dyn FnMut(&mut [&mut Segment]));

/// A segment's backup: the segment byte ranges it holds and the pieces of the
/// arena their bytes lie in, back to back (piece k holds the bytes right
/// after piece k-1). Offload holds the whole committed range; Reload only the
/// bytes no reload source covers.
#[derive(Debug, Clone)]
struct SegmentBackup {
    tag: TagId,
    /// `(segment offset, len)`, sorted and disjoint.
    ranges: Vec<(usize, usize)>,
    pieces: Vec<BackupRange>,
}

impl SegmentBackup {
    fn len(&self) -> usize {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// Host address of backup byte `at` and the bytes left in its piece.
    fn locate(&self, arena: &BackupArena, mut at: usize) -> (*mut u8, usize) {
        for p in &self.pieces {
            if at < p.len {
                // SAFETY: `at < p.len`, inside the piece.
                return (unsafe { arena.host_ptr(*p).add(at) }, p.len - at);
            }
            at -= p.len;
        }
        unreachable!("backup offset {at} beyond its pieces")
    }

    /// The held bytes of segment range `[off, off+len)` as spans of at most
    /// `max` bytes that each lie in one piece: `(segment offset, host ptr, n)`.
    fn spans(
        &self,
        arena: &BackupArena,
        off: usize,
        len: usize,
        max: usize,
    ) -> Vec<(usize, *mut u8, usize)> {
        let mut out = Vec::new();
        let mut base = 0usize;
        for &(ro, rl) in &self.ranges {
            let (lo, hi) = (off.max(ro), (off + len).min(ro + rl));
            let mut at = lo;
            while at < hi {
                let (host, left) = self.locate(arena, base + at - ro);
                let n = max.min(hi - at).min(left);
                out.push((at, host, n));
                at += n;
            }
            base += rl;
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
    reload: HashMap<TagId, Vec<Registered>>,
    /// Tags a load registered a source for since the last
    /// [`SleepEngine::clear_reload_sources`]: they may sleep with Reload even
    /// once every byte changed (then everything live goes to the backup).
    loaded: HashSet<TagId>,
    /// Segments of the sleep or wake running now: their backups are in use.
    busy: HashSet<DevicePtr>,
    options: SleepOptions,
}

impl EngineState {
    fn free_backup(&mut self, va: DevicePtr) {
        if let Some(b) = self.backups.remove(&va) {
            b.pieces.into_iter().for_each(|p| self.arena.free(p));
        }
    }
}

/// Sleep and wake for the segments of one device. Transitions (sleep or wake
/// of one tag) run one at a time; the engine's bookkeeping lock is held only
/// for short steps, never across copies, so frees, reports and allocations of
/// other tags go on meanwhile.
#[derive(Debug)]
pub struct SleepEngine {
    driver: Arc<dyn Driver>,
    state: Mutex<EngineState>,
    transition: Mutex<()>,
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
                loaded: HashSet::new(),
                busy: HashSet::new(),
                options,
            }),
            transition: Mutex::new(()),
            driver,
        }
    }

    fn lock(&self) -> MutexGuard<'_, EngineState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn one_transition(&self) -> MutexGuard<'_, ()> {
        self.transition.lock().unwrap_or_else(|p| p.into_inner())
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
    /// backups of awake segments are dropped first (except those of a sleep
    /// running now). Returns bytes unpinned.
    pub fn release_backup(&self, awake: &dyn Fn(DevicePtr) -> bool) -> u64 {
        let mut s = self.lock();
        let stale: Vec<DevicePtr> = s
            .backups
            .keys()
            .copied()
            .filter(|va| awake(*va) && !s.busy.contains(va))
            .collect();
        for va in stale {
            s.free_backup(va);
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
        self.lock().free_backup(va);
    }

    fn ensure_streams(&self, s: &mut EngineState) -> Result<()> {
        let want = s.options.streams.max(2);
        while s.streams.len() < want {
            s.streams.push(self.driver.stream_create()?);
        }
        Ok(())
    }

    /// Wake the asleep segments among `segs` (all of tag `tag`). See [`Self::wake_tag`].
    pub fn wake(&self, tag: TagId, segs: &mut [&mut Segment]) -> Result<CycleReport> {
        let cell = RefCell::new(segs);
        self.wake_tag(tag, &|f| f(&mut cell.borrow_mut()))
    }

    /// Wake `tag`'s asleep segments. Transactional: free memory is checked
    /// and every reload source is [checked](crate::sleep::reload::ReloadSource::check) before
    /// anything is mapped; on any later failure every chunk mapped by this
    /// call is unmapped again (once the device is known idle; if even that
    /// synchronize fails they stay mapped and the segment stays asleep) and the
    /// segments stay asleep with their backups; the error is returned.
    ///
    /// Each segment gets back its backed-up bytes, then the bytes its tag's
    /// reload sources cover; bytes of a Discard sleep come back undefined.
    pub fn wake_tag(&self, tag: TagId, segs: TagSegments<'_>) -> Result<CycleReport> {
        let t0 = Instant::now();
        let _one = self.one_transition();
        let coalesce = self.lock().options.wake_coalesce_bytes;
        let todo = plan::snapshot(segs, Transition::Wake { coalesce });
        let mut report = CycleReport::default();
        if todo.is_empty() {
            report.seconds = t0.elapsed().as_secs_f64();
            return Ok(report);
        }
        let needed: u64 = todo.iter().map(SegTodo::unmapped_bytes).sum();
        let free = self.driver.mem_info()?.free;
        if needed > free {
            return Err(Error::OutOfMemory {
                what: format!("wake of tag {tag} ({} segments)", todo.len()),
                requested: needed,
                free,
            });
        }
        // What each source restores here, checked before any byte is touched.
        let reloadable: Vec<(DevicePtr, usize)> = todo
            .iter()
            .filter(|t| t.state == SleepState::Reloadable)
            .map(|t| (t.ptr, t.committed))
            .collect();
        let sources = self.replays(tag, &reloadable);
        for (src, _) in &sources {
            src.check()?;
        }
        {
            let mut s = self.lock();
            self.ensure_streams(&mut s)?;
            s.busy.extend(todo.iter().map(|t| t.ptr));
        }
        let mut made: Vec<(usize, usize, PhysHandle)> = Vec::new();
        let result = self.restore(&todo, &sources, &mut made, &mut report);
        let streams = self.lock().streams.clone();
        let installed = match result {
            Ok(()) => true,
            Err(_) => {
                // Copies may still target chunks about to be unmapped: unmap
                // only once the device is known idle.
                let mut idle = true;
                for &st in &streams {
                    idle &= self.driver.stream_synchronize(st).is_ok();
                }
                idle &= self.driver.synchronize().is_ok();
                if idle {
                    for &(i, c, h) in made.iter().rev() {
                        let (t, ch) = (&todo[i], todo[i].chunks[c]);
                        let _ = unmap_release_at(
                            self.driver.as_ref(),
                            t.ptr + ch.offset as u64,
                            ch.size,
                            h,
                        );
                    }
                }
                !idle
            }
        };
        if installed {
            let mut ok = true;
            segs(&mut |ss| {
                for (i, t) in todo.iter().enumerate() {
                    let Some(seg) = ss.iter_mut().find(|s| s.ptr() == t.ptr) else {
                        continue;
                    };
                    for &(_, c, h) in made.iter().filter(|m| m.0 == i) {
                        ok &= seg.install_handle(c, h).is_ok();
                    }
                    if result.is_ok() && seg.is_fully_mapped() {
                        seg.set_sleep_state(SleepState::Awake);
                    }
                }
            });
            debug_assert!(ok, "the chunks of a segment in transition do not change");
        }
        {
            let mut s = self.lock();
            for t in &todo {
                s.busy.remove(&t.ptr);
                if result.is_ok() && s.options.free_backup_after_wake {
                    s.free_backup(t.ptr);
                }
            }
            if result.is_ok() && s.options.release_pinned_after_wake {
                s.arena.release_unused();
            }
        }
        result?;
        report.segments = todo.len();
        report.seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Map every unmapped chunk of `todo`, copy the backups in, fill discarded
    /// memory when asked, then run the reload sources. No segment is touched:
    /// the handles made are listed in `made` for the caller to install or undo.
    fn restore(
        &self,
        todo: &[SegTodo],
        sources: &[Replay],
        made: &mut Vec<(usize, usize, PhysHandle)>,
        report: &mut CycleReport,
    ) -> Result<()> {
        let (piece, streams, fill) = {
            let s = self.lock();
            (
                s.options.copy_piece_bytes.max(1 << 20),
                s.streams.clone(),
                s.options.debug_fill_discarded,
            )
        };
        let mut next_stream = 0usize;
        for (i, t) in todo.iter().enumerate() {
            if t.state == SleepState::Offloaded
                && t.committed > 0
                && !self.lock().backups.contains_key(&t.ptr)
            {
                return Err(Error::InvalidState(format!(
                    "segment at {:#x} is offloaded but has no backup",
                    t.ptr
                )));
            }
            for (c, chunk) in t.chunks.iter().enumerate() {
                let va = t.ptr + chunk.offset as u64;
                if chunk.handle.is_none() {
                    let h = map_new_at(self.driver.as_ref(), va, chunk.size, &t.peers)?;
                    made.push((i, c, h));
                    report.physical_bytes += chunk.size as u64;
                }
                let spans = {
                    let s = self.lock();
                    s.backups
                        .get(&t.ptr)
                        .filter(|_| t.state != SleepState::Discarded)
                        .map(|b| b.spans(&s.arena, chunk.offset, chunk.size, piece))
                        .unwrap_or_default()
                };
                for (at, host, n) in spans {
                    let st = streams[next_stream % streams.len()];
                    next_stream += 1;
                    // SAFETY: the chunk is mapped (just now or before); `host`
                    // points into the segment's backup with `n` bytes left,
                    // kept (busy) until the streams are synchronized below.
                    unsafe {
                        self.driver
                            .copy_htod_async(t.ptr + at as u64, host, n, st)?
                    };
                    report.copied_bytes += n as u64;
                }
                if let (SleepState::Discarded, Some(byte)) = (t.state, fill) {
                    let st = streams[next_stream % streams.len()];
                    next_stream += 1;
                    // SAFETY: the chunk is mapped with access granted.
                    unsafe { self.driver.memset_async(va, byte, chunk.size, st)? };
                }
            }
        }
        for &st in &streams {
            self.driver.stream_synchronize(st)?;
        }
        for (src, parts) in sources {
            report.reloaded_bytes += src.reload(self.driver.as_ref(), parts)?;
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
