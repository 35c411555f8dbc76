//! The sleep engine: per-segment transitions of one tag, the streams and
//! events they run on, and the backup arena they fill.
//!
//! This file holds the engine, its state and its two locks; the rest lives
//! in one file per idea: `options.rs` (policy, tunables, report),
//! `sources.rs` (reload sources and their proofs), `plan.rs` (the snapshot
//! of a tag's segments and what each keeps on the host), `sleep.rs` and
//! `wake.rs` (the two transitions, phase by phase), `compressed.rs`
//! (OffloadCompressed's frames, scratch and ring pipelines), `encode.rs`
//! (those frames encoded at sleep), `release.rs` (memory given back chunk
//! by chunk as copies complete, and the stale ranges of a stopped sleep),
//! `room.rs` (a wake's device memory as the device has room), `swap.rs` (a
//! sleep and a wake at once), `read.rs` (asleep bytes read from a backup),
//! `staged.rs` (a wake in steps) and `lent_frames.rs` (frames of another
//! engine's backup decoded here).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::driver::{DevicePtr, Driver, StreamId};
use crate::error::Result;
use crate::segment::Segment;
use crate::sleep::backup::{BackupArena, BackupRange};
use crate::tag::TagId;
use sources::Registered;

mod compressed;
mod encode;
mod lent_frames;
mod options;
mod plan;
mod read;
mod release;
mod room;
mod sleep;
mod sources;
mod staged;
mod swap;
mod wake;

pub use lent_frames::BackupFrame;
pub use options::{
    CycleReport, Policy, SleepOptions, WakeOptions, CODEC_FRAME_BYTES, CODEC_RING, MAX_STREAMS,
};
pub use sources::Retired;
pub use staged::{HostSpan, StagedWake};
pub use swap::{SwapReport, SwapSleep, SwapWake, SyncTagSegments};

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
    /// OffloadCompressed: the codec frames the pieces hold, in segment
    /// order; empty for a backup of raw bytes.
    frames: Vec<compressed::FrameRec>,
    /// `(segment offset, len)` of chunks a sleep that stopped midway left
    /// mapped before their copies completed: the backup does not hold their
    /// bytes (the device does). Never restored or read; the next sleep
    /// copies them again (`release.rs`).
    stale: Vec<(usize, usize)>,
}

impl SegmentBackup {
    /// An error naming `tag` when segment range `[off, off+len)` touches a
    /// stale range (bytes the backup does not hold; see `stale`).
    fn check_fresh(&self, va: DevicePtr, off: usize, len: usize, tag: &str) -> Result<()> {
        match self.stale.iter().find(|&&(o, l)| o < off + len && off < o + l) {
            None => Ok(()),
            Some(&(o, l)) => Err(crate::error::Error::InvalidState(format!(
                "the host backup of tag `{tag}` does not hold bytes [{o}, {}) of segment {va:#x}: a sleep stopped before copying them (the device still holds them); sleep the tag again to finish",
                o + l
            ))),
        }
    }

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
    /// A second set, as many: a swap's wake queues on these while its sleep
    /// queues on `streams`, so the two directions of the link overlap.
    second_streams: Vec<StreamId>,
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
    /// Codec scratch a failed transition could not give back (the device
    /// would not synchronize, unmap or release): tried again before each
    /// transition and when the engine is dropped.
    stale_scratch: Vec<compressed::CodecScratch>,
    options: SleepOptions,
    /// Where compressed sleeps' encodes leave frame lengths, pinned at the
    /// first one and kept.
    length_words: Option<Arc<compressed::LengthWords>>,
}

impl EngineState {
    /// Return `va`'s backup to the arena (its memory stays pinned); the
    /// slabs it lay in.
    fn free_backup(&mut self, va: DevicePtr) -> Vec<usize> {
        let Some(b) = self.backups.remove(&va) else {
            return Vec::new();
        };
        let mut slabs: Vec<usize> = b.pieces.iter().map(|p| p.slab).collect();
        slabs.sort_unstable();
        slabs.dedup();
        b.pieces.into_iter().for_each(|p| self.arena.free(p));
        slabs
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
                second_streams: Vec::new(),
                backups: HashMap::new(),
                reload: HashMap::new(),
                loaded: HashSet::new(),
                busy: HashSet::new(),
                stale_scratch: Vec::new(),
                options,
                length_words: None,
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
    /// runs at the link's rate. Waits for a sleep or wake running now: its
    /// background pinning is counted against the limit only when it ends.
    pub fn reserve_backup(&self, bytes: u64) -> Result<()> {
        let _one = self.one_transition();
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

    /// Raw bytes the backups assigned to segments restore, per tag: equal to
    /// [`Self::backup_bytes_by_tag`] except for OffloadCompressed backups,
    /// which hold fewer (encoded) bytes than they restore.
    pub fn backup_raw_bytes_by_tag(&self) -> HashMap<TagId, u64> {
        let s = self.lock();
        let mut m = HashMap::new();
        for b in s.backups.values() {
            *m.entry(b.tag).or_insert(0) += b.raw_len() as u64;
        }
        m
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

    /// Drop the backups the awake segments of `tags` kept after their wake
    /// (`awake` says which segments are awake; a sleep or wake running now
    /// keeps its own): their pinned memory returns to the arena for the
    /// next sleep of any tag, or, with `unpin`, every slab holding no backup
    /// is unpinned as [`Self::release_backup`] does. Returns bytes unpinned.
    pub fn drop_backups(
        &self,
        tags: &HashSet<TagId>,
        awake: &dyn Fn(DevicePtr) -> bool,
        unpin: bool,
    ) -> u64 {
        let mut s = self.lock();
        let kept: Vec<DevicePtr> = s
            .backups
            .iter()
            .filter(|(va, b)| tags.contains(&b.tag) && awake(**va) && !s.busy.contains(va))
            .map(|(va, _)| *va)
            .collect();
        for va in kept {
            s.free_backup(va);
        }
        if unpin {
            s.arena.release_unused()
        } else {
            0
        }
    }

    /// Forget a segment that is being freed: its backup goes, and the
    /// slabs it lay in are unpinned when they hold no other backup (the
    /// memory of a freed allocation is given back, as `cudaFreeHost` of a
    /// per-allocation backup would). Slabs that were already empty (kept
    /// for the next sleep, or pinned ahead) stay.
    pub fn forget_segment(&self, va: DevicePtr) {
        let mut s = self.lock();
        if s.busy.contains(&va) {
            // A transition still copies into it: the range returns to the
            // arena, the slab stays pinned until the next release.
            s.free_backup(va);
            return;
        }
        let slabs = s.free_backup(va);
        s.arena.release_if_unused(&slabs);
    }

    /// The pinned words compressed sleeps' encodes leave frame lengths in,
    /// pinned at the first call.
    fn length_words(&self) -> Result<Arc<compressed::LengthWords>> {
        let mut s = self.lock();
        if s.length_words.is_none() {
            s.length_words = Some(Arc::new(compressed::LengthWords::new(&self.driver)?));
        }
        Ok(s.length_words.clone().expect("set above"))
    }

    fn ensure_streams(&self, s: &mut EngineState) -> Result<()> {
        let want = s.options.streams.max(2);
        while s.streams.len() < want {
            s.streams.push(self.driver.stream_create()?);
        }
        Ok(())
    }

    /// The streams of the first set, or of the `second` (made as needed).
    fn lane_streams(&self, s: &mut EngineState, second: bool) -> Result<Vec<StreamId>> {
        if !second {
            self.ensure_streams(s)?;
            return Ok(s.streams.clone());
        }
        let want = s.options.streams.max(2);
        while s.second_streams.len() < want {
            s.second_streams.push(self.driver.stream_create()?);
        }
        Ok(s.second_streams[..want].to_vec())
    }
}

impl Drop for SleepEngine {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for &st in s.streams.iter().chain(&s.second_streams) {
            let _ = self.driver.stream_synchronize(st);
            let _ = self.driver.stream_destroy(st);
        }
    }
}
