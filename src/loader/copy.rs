//! The copy engine: executes a plan's extents from the shard files into device
//! memory, using only the [`Driver`] seam.
//!
//! Paths, chosen by [`Strategy`] (and per slot under `Auto`: memcpy when the
//! range is in the page cache, pread when not, checked with `mincore`):
//! - **direct**: a window of the file's mapping (page cache) is registered
//!   read-only with the driver and the device DMAs straight from it. Each
//!   worker registers its next window while its previous window's copies run,
//!   so registration overlaps transfer; windows are unregistered once their
//!   event has completed.
//! - **staged**: workers `memcpy` from the mapping (or `pread`, for data not in
//!   the page cache: the **read** path; **populate** faults a slot's pages in
//!   at once first) into their own slots of a pinned staging ring (`depth` per
//!   worker, events guard reuse) and queue async copies on their own stream.
//!   The ring is pinned once and cached process-wide per driver
//!   ([`super::staging::acquire_ring`]), so later loads and Reload replays skip
//!   pinning. A job reads one shard; adjacent pieces are read and transferred
//!   as one. Conversions always go this way: source bytes land in one of two
//!   slot-sized device scratch buffers shared by all workers, then a
//!   conversion kernel writes the destination.
//! - **hybrid**: direct windows for a share of the bytes on a quarter of the
//!   threads, concurrently with staging for the rest.
//! - **simple**: one thread, copies straight from the mapping with no pinning
//!   (the baseline, and what pageable-memory loaders do).
//!
//! Progress counts source bytes whose copies have completed. Cancellation is
//! checked before each window or slot: on cancel the engine waits for queued
//! copies and returns [`Error::Cancelled`]; destinations are then partly
//! written (complete windows/slots landed, the rest untouched).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::checkpoint::Shard;
use super::geometry::{self, CachedFill, Geometry};
use super::plan::{Extent, Fill};
use super::slot_copy::{cached_copy, stream_copy};
use super::staging::{acquire_ring, resident_fraction, resident_share, return_ring};
use crate::driver::{DevicePtr, Driver, EventId, StreamId};
use crate::error::{Error, Result};
use crate::segment::Segment;

/// How the engine moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Staging ring for everything: page-cached ranges copied into slots sized
    /// to stay in the CPU cache (streaming stores into large slots when they
    /// cannot), the rest by pread (chosen per slot with `mincore`); see
    /// [`super::geometry`].
    #[default]
    Auto,
    /// Register mmap windows read-only and DMA from the page cache.
    Direct,
    /// memcpy from the mapping into pinned slots, then DMA.
    Staged,
    /// pread into pinned slots, then DMA (cold data).
    Read,
    /// One thread, copies from the mapping without pinning.
    Simple,
    /// Like `staged`, but each slot's pages are first faulted in at once with
    /// `madvise(MADV_POPULATE_READ)`.
    Populate,
    /// `direct` for `direct_percent` of the bytes, concurrently with staging
    /// (as `auto`) for the rest (different CPU costs, one link).
    Hybrid,
    /// Like `staged`, but slots are filled with streaming (non-temporal) stores.
    Stream,
    /// DMA straight from the mapping, which the caller has already registered
    /// with the driver (Reload replays after `ExecutedPlan` pinned the
    /// checkpoint's page cache): no per-window registration, no staging copy.
    Registered,
}

impl Strategy {
    /// Parse `auto`, `direct`, `staged`, `read`, `simple`, `registered`,
    /// `populate`, `hybrid` or `stream` (case-insensitive; empty is `auto`).
    pub fn parse(s: &str) -> Result<Strategy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(Strategy::Auto),
            "direct" => Ok(Strategy::Direct),
            "staged" => Ok(Strategy::Staged),
            "read" => Ok(Strategy::Read),
            "simple" => Ok(Strategy::Simple),
            "registered" => Ok(Strategy::Registered),
            "populate" => Ok(Strategy::Populate),
            "hybrid" => Ok(Strategy::Hybrid),
            "stream" => Ok(Strategy::Stream),
            o => Err(Error::InvalidArgument(format!(
                "unknown copy strategy `{o}`: expected auto, direct, staged, read, simple, populate, hybrid or stream"
            ))),
        }
    }
}

/// Tuning of the copy engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOptions {
    /// Which path(s) to use.
    pub strategy: Strategy,
    /// Worker threads (0 = the number of CPUs, at most 16).
    pub threads: usize,
    /// Bytes of file registered per direct window.
    pub window_bytes: usize,
    /// Bytes per pinned staging slot (0 = chosen to keep the slots in use in
    /// the CPU's last-level cache, see [`geometry`]).
    pub slot_bytes: usize,
    /// Staging slots per worker: transfers in flight while it fills the next
    /// (0 = chosen with the slot size).
    pub depth: usize,
    /// Share of the bytes, in percent, that `Hybrid` sends through direct windows.
    pub direct_percent: u8,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            strategy: Strategy::Auto,
            threads: 0,
            window_bytes: 64 << 20,
            slot_bytes: 0,
            depth: 0,
            direct_percent: 25,
        }
    }
}

impl CopyOptions {
    fn thread_count(&self) -> usize {
        if self.strategy == Strategy::Simple {
            return 1;
        }
        if self.threads > 0 {
            return self.threads;
        }
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(4)
            .min(16)
    }
}

/// Progress reporting and cancellation for one execution.
#[derive(Clone, Copy, Default)]
pub struct Control<'a> {
    /// Called on the calling thread with (bytes done, bytes total).
    pub progress: Option<&'a dyn Fn(u64, u64)>,
    /// Set to true (from any thread) to stop.
    pub cancel: Option<&'a AtomicBool>,
}

impl std::fmt::Debug for Control<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("progress", &self.progress.is_some())
            .field("cancel", &self.cancel.is_some())
            .finish()
    }
}

/// What an execution did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CopyStats {
    /// Source bytes copied.
    pub bytes: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Bytes through the direct (registered mmap) path.
    pub direct_bytes: u64,
    /// Bytes staged by memcpy from the mapping.
    pub staged_bytes: u64,
    /// Bytes staged by pread.
    pub read_bytes: u64,
    /// Bytes zero-filled.
    pub filled_bytes: u64,
    /// Worker threads used.
    pub threads: usize,
    /// Whether the pinned staging ring was reused from an earlier load or replay.
    pub ring_reused: bool,
    /// Bytes of the staging ring (0 when nothing was staged).
    pub ring_bytes: u64,
    /// Seconds spent acquiring (or pinning) the staging ring.
    pub ring_seconds: f64,
    /// Seconds spent on zero fills.
    pub fill_zero_seconds: f64,
    /// Seconds filling slots (memcpy or pread), summed over staging workers.
    pub slot_fill_seconds: f64,
    /// Seconds queuing transfers, summed over staging workers.
    pub issue_seconds: f64,
    /// Seconds waiting for a slot's (or scratch buffer's) transfers, setting up
    /// streams and events, and draining at the end, summed over workers.
    pub wait_seconds: f64,
    /// Seconds of the direct (registered window) phase, wall.
    pub direct_seconds: f64,
    /// Bytes per staging slot used (0 when nothing was staged).
    pub slot_bytes: u64,
    /// Staging slots per worker used.
    pub depth: usize,
    /// Whether the slots in use were sized to stay in the CPU cache and
    /// page-cached slots filled with plain stores to keep them there.
    pub cache_resident: bool,
    /// Bytes of `staged_bytes` filled with streaming (non-temporal) stores.
    pub streamed_bytes: u64,
}

impl CopyStats {
    /// Source bytes per second, in GB/s (10^9).
    pub fn gbps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

/// A registered-window job: the part of the file `[lo, hi)` and the copies from it.
#[derive(Debug)]
struct Window {
    shard: usize,
    lo: u64,
    hi: u64,
    pieces: Vec<Extent>,
}

impl Window {
    fn bytes(&self) -> u64 {
        self.pieces.iter().map(Extent::src_bytes).sum()
    }
}

/// A staging job: pieces whose source bytes fit one slot together.
#[derive(Debug)]
struct Job {
    pieces: Vec<Extent>,
    bytes: u64,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    done: AtomicU64,
    error: Mutex<Option<Error>>,
}

impl Shared {
    fn fail(&self, e: Error) {
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert(e);
        self.stop.store(true, Ordering::SeqCst);
    }
}

const PAGE: u64 = 4096;

/// Copy `extents` and zero `fills` into device memory. Synchronous: every copy
/// has completed when it returns.
pub fn execute(
    driver: &Arc<dyn Driver>,
    shards: &[Shard],
    extents: &[Extent],
    fills: &[Fill],
    opts: &CopyOptions,
    ctl: &Control<'_>,
) -> Result<CopyStats> {
    let t0 = Instant::now();
    let total: u64 = extents.iter().map(Extent::src_bytes).sum();
    let threads = opts.thread_count();
    let mut stats = CopyStats {
        threads,
        ..Default::default()
    };
    if ctl.cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
        return Err(Error::Cancelled { done: 0, total });
    }
    for e in extents {
        let s = &shards[e.shard as usize];
        if s.map.is_none() || e.src + (e.height - 1) * e.src_pitch + e.width > s.len {
            return Err(Error::checkpoint(
                &s.path,
                None,
                format!(
                    "copy extent at byte {} runs past the end of the file ({} bytes)",
                    e.src, s.len
                ),
            ));
        }
    }

    let d: &dyn Driver = driver.as_ref();
    let stream = d.stream_create()?;
    let r = (|| {
        for f in fills {
            // SAFETY: fills come from a validated plan: inside registered destinations.
            unsafe { d.memset_async(f.dst, 0, f.len as usize, stream) }?;
            stats.filled_bytes += f.len;
        }
        Ok::<(), Error>(())
    })();
    let r = r.and_then(|_| d.stream_synchronize(stream));
    let _ = d.stream_destroy(stream);
    r?;

    stats.fill_zero_seconds = t0.elapsed().as_secs_f64();

    // Partition: conversions always stage; the rest by strategy.
    let (mut direct, mut staged): (Vec<Extent>, Vec<Extent>) = match opts.strategy {
        Strategy::Direct | Strategy::Simple | Strategy::Registered => {
            extents.iter().partition(|e| e.convert.is_none())
        }
        Strategy::Hybrid => hybrid_split(extents, opts.direct_percent),
        _ => (Vec::new(), extents.to_vec()),
    };
    direct.sort_by_key(|e| (e.shard, e.src));
    let windows = make_windows(shards, &direct, opts.window_bytes.max(PAGE as usize) as u64);
    staged.sort_by_key(|e| (e.shard, e.src));
    // As `n_staged` below, before the cap at the number of jobs (which
    // depends on the slot size chosen here).
    let staging_workers = if opts.strategy == Strategy::Hybrid && !windows.is_empty() {
        threads
            .saturating_sub((threads / 4).max(1).min(windows.len()))
            .max(1)
    } else {
        threads
    };
    let geom = staging_geometry(opts, shards, &staged, staging_workers);
    let slot_bytes = (geom.slot_bytes.max(PAGE as usize) as u64).div_ceil(PAGE) * PAGE;
    let jobs = make_jobs(&staged, slot_bytes);

    let shared = Shared::default();
    let register = !matches!(opts.strategy, Strategy::Simple | Strategy::Registered);
    let direct_bytes: u64 = windows.iter().map(Window::bytes).sum();
    let next = AtomicUsize::new(0);
    // Hybrid runs both paths at once: a quarter of the threads on windows.
    let (n_direct, n_staged) = if opts.strategy == Strategy::Hybrid && !windows.is_empty() {
        let nd = (threads / 4).max(1).min(windows.len());
        (nd, threads.saturating_sub(nd).max(1).min(jobs.len()))
    } else if !windows.is_empty() {
        (threads.min(windows.len()), 0)
    } else {
        (0, threads.min(jobs.len()))
    };
    let direct_only = |w: usize| direct_worker(d, shards, &windows, &next, &shared, register, w);
    if opts.strategy != Strategy::Hybrid {
        let td = Instant::now();
        run_workers(n_direct, &shared, ctl, total, &direct_only);
        stats.direct_seconds = td.elapsed().as_secs_f64();
    }
    stats.direct_bytes = direct_bytes;
    let staging = opts.strategy == Strategy::Hybrid || !shared.stop.load(Ordering::SeqCst);
    if staging && !jobs.is_empty() && n_staged > 0 {
        let fill = match opts.strategy {
            Strategy::Read => SlotFill::Pread,
            Strategy::Hybrid => SlotFill::ByResidency,
            Strategy::Populate => SlotFill::Populate,
            Strategy::Stream => SlotFill::Stream,
            Strategy::Staged | Strategy::Simple | Strategy::Direct | Strategy::Registered => {
                SlotFill::Memcpy
            }
            Strategy::Auto => SlotFill::ByResidency,
        };
        let cached = match geom.fill {
            CachedFill::CacheResident => SlotFill::Memcpy,
            CachedFill::Streaming => SlotFill::Stream,
        };
        let depth = geom.depth;
        stats.slot_bytes = slot_bytes;
        stats.depth = depth;
        stats.cache_resident = match fill {
            SlotFill::ByResidency => cached == SlotFill::Memcpy,
            f => f == SlotFill::Memcpy && geom.fill == CachedFill::CacheResident,
        };
        let tr = Instant::now();
        let ring_len = n_staged * depth * slot_bytes as usize;
        let (ring, reused) = acquire_ring(driver, ring_len)?;
        stats.ring_seconds = tr.elapsed().as_secs_f64();
        stats.ring_reused = reused;
        stats.ring_bytes = ring.len() as u64;
        let needs_scratch = jobs
            .iter()
            .any(|j| j.pieces.iter().any(|p| p.convert.is_some()));
        let scratch_seg = if needs_scratch {
            Some(Segment::allocate(
                driver.clone(),
                2 * slot_bytes as usize,
                0,
            )?)
        } else {
            None
        };
        let mut scratch_events = Vec::new();
        let setup = (|| -> Result<Option<Mutex<Scratch>>> {
            let Some(seg) = scratch_seg.as_ref() else {
                return Ok(None);
            };
            for _ in 0..2 {
                scratch_events.push(d.event_create()?);
            }
            Ok(Some(Mutex::new(Scratch {
                bufs: [
                    (seg.ptr(), scratch_events[0], false),
                    (seg.ptr() + slot_bytes, scratch_events[1], false),
                ],
                turn: 0,
            })))
        })();
        let scratch = match setup {
            Ok(s) => s,
            Err(e) => {
                for ev in scratch_events {
                    let _ = d.event_destroy(ev);
                }
                return_ring(ring);
                return Err(e);
            }
        };
        let stage = Stage {
            d,
            shards,
            jobs: &jobs,
            next: AtomicUsize::new(0),
            sh: &shared,
            ring: ring.ptr(),
            slot_bytes: slot_bytes as usize,
            depth,
            fill,
            cached,
            scratch,
            staged: AtomicU64::new(0),
            read: AtomicU64::new(0),
            streamed: AtomicU64::new(0),
            fill_ns: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            issue_ns: AtomicU64::new(0),
        };
        let td = Instant::now();
        let direct_secs = AtomicU64::new(0);
        run_workers(
            n_direct_for(opts, n_direct) + n_staged,
            &shared,
            ctl,
            total,
            &|w| {
                if opts.strategy == Strategy::Hybrid && w < n_direct {
                    let r = direct_only(w);
                    direct_secs.store(ns(td), Ordering::Relaxed);
                    r
                } else {
                    stage.worker(w - n_direct_for(opts, n_direct))
                }
            },
        );
        if opts.strategy == Strategy::Hybrid {
            stats.direct_seconds = direct_secs.load(Ordering::Relaxed) as f64 / 1e9;
        }
        // Every worker synchronized its slots (and the scratch events ride on
        // their streams), so the ring and scratch are idle now.
        for ev in scratch_events {
            let _ = d.event_destroy(ev);
        }
        drop(scratch_seg);
        return_ring(ring);
        stats.staged_bytes = stage.staged.load(Ordering::SeqCst);
        stats.read_bytes = stage.read.load(Ordering::SeqCst);
        stats.streamed_bytes = stage.streamed.load(Ordering::SeqCst);
        stats.slot_fill_seconds = stage.fill_ns.load(Ordering::Relaxed) as f64 / 1e9;
        stats.wait_seconds = stage.wait_ns.load(Ordering::Relaxed) as f64 / 1e9;
        stats.issue_seconds = stage.issue_ns.load(Ordering::Relaxed) as f64 / 1e9;
    } else if opts.strategy == Strategy::Hybrid {
        run_workers(n_direct, &shared, ctl, total, &direct_only);
    }
    let done = shared.done.load(Ordering::SeqCst);
    if let Some(e) = shared
        .error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        return Err(e);
    }
    if shared.stop.load(Ordering::SeqCst) || done < total {
        return Err(Error::Cancelled { done, total });
    }
    if let Some(p) = ctl.progress {
        p(total, total);
    }
    stats.bytes = total;
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(stats)
}

/// Run `work` on `n` threads; poll progress and cancellation on the calling
/// thread until they finish. A worker's error stops the others.
fn run_workers(
    n: usize,
    shared: &Shared,
    ctl: &Control<'_>,
    total: u64,
    work: &(dyn Fn(usize) -> Result<()> + Sync),
) {
    if n == 0 {
        return;
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|w| {
                s.spawn(move || {
                    if let Err(e) = work(w) {
                        shared.fail(e);
                    }
                })
            })
            .collect();
        let mut last = u64::MAX;
        while !handles.iter().all(|h| h.is_finished()) {
            if ctl.cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
                shared.stop.store(true, Ordering::SeqCst);
            }
            let done = shared.done.load(Ordering::Relaxed);
            if done != last {
                if let Some(p) = ctl.progress {
                    p(done, total);
                }
                last = done;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        for h in handles {
            if let Err(p) = h.join() {
                shared.fail(Error::Panic(crate::panic_message(p.as_ref())));
            }
        }
    });
}

/// The part of `e` whose source bytes lie in `[lo, hi)`, as up to three
/// extents (partial first row, whole rows, partial last row). Byte-exact cuts:
/// only for extents without conversion.
pub(crate) fn clip_src(e: &Extent, lo: u64, hi: u64, out: &mut Vec<Extent>) {
    for seg in clip_rows(e.src, e.src_pitch, e.width, e.height, lo, hi) {
        out.push(sub_extent(e, seg, 1, 1));
    }
}

/// A run of rows `[r0, r1)` of a 2D region, or one row's bytes `[a, b)` (then `r1 == r0 + 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowSeg {
    pub r0: u64,
    pub r1: u64,
    pub bytes: Option<(u64, u64)>,
}

/// The rows of a region (`height` rows of `width` bytes, `pitch` apart from
/// `start`) that intersect `[lo, hi)`: whole rows as runs, cut rows as byte ranges.
pub(crate) fn clip_rows(
    start: u64,
    pitch: u64,
    width: u64,
    height: u64,
    lo: u64,
    hi: u64,
) -> Vec<RowSeg> {
    let mut out = Vec::new();
    let (p, w) = (pitch.max(width), width);
    if w == 0 || height == 0 || hi <= start || lo >= hi {
        return out;
    }
    let r_lo = if lo < start + w {
        0
    } else {
        (lo - start - w) / p + 1
    };
    let r_hi = (hi - start).div_ceil(p).min(height);
    let mut r = r_lo;
    while r < r_hi {
        let s = start + r * p;
        if s >= lo && s + w <= hi {
            let last = ((hi - w - start) / p + 1).min(r_hi);
            out.push(RowSeg {
                r0: r,
                r1: last,
                bytes: None,
            });
            r = last;
        } else {
            let a = s.max(lo);
            let b = (s + w).min(hi);
            if a < b {
                out.push(RowSeg {
                    r0: r,
                    r1: r + 1,
                    bytes: Some((a - s, b - s)),
                });
            }
            r += 1;
        }
    }
    out
}

/// The sub-extent of `e` for a row segment; byte offsets are in units where
/// `num/den` converts them to source bytes (1/1 for source-side cuts).
pub(crate) fn sub_extent(e: &Extent, seg: RowSeg, num: u64, den: u64) -> Extent {
    match seg.bytes {
        None => {
            let mut x = Extent {
                src: e.src + seg.r0 * e.src_pitch,
                dst: e.dst + seg.r0 * e.dst_pitch,
                height: seg.r1 - seg.r0,
                ..*e
            };
            if x.height == 1 {
                x.src_pitch = x.width;
                x.dst_pitch = x.dst_width();
            }
            x
        }
        Some((a, b)) => {
            let (sa, sb) = (a * num / den, b * num / den);
            let mut x = Extent {
                src: e.src + seg.r0 * e.src_pitch + sa,
                width: sb - sa,
                height: 1,
                ..*e
            };
            let dst_a = match e.convert {
                Some((f, t)) => sa / f.size() as u64 * t.size() as u64,
                None => sa,
            };
            x.dst = e.dst + seg.r0 * e.dst_pitch + dst_a;
            x.src_pitch = x.width;
            x.dst_pitch = x.dst_width();
            x
        }
    }
}

fn page_down(x: u64) -> u64 {
    x & !(PAGE - 1)
}

/// Cut the (sorted, non-converting) extents into page-aligned, disjoint
/// windows of at most `wbytes` over the bytes they read.
fn make_windows(shards: &[Shard], extents: &[Extent], wbytes: u64) -> Vec<Window> {
    let wbytes = wbytes.div_ceil(PAGE) * PAGE;
    // Merged page-aligned spans per shard.
    let mut spans: Vec<(usize, u64, u64)> = Vec::new();
    for e in extents {
        let shard = e.shard as usize;
        let lo = page_down(e.src);
        let end = e.src + (e.height - 1) * e.src_pitch + e.width;
        let hi = end.div_ceil(PAGE) * PAGE;
        match spans.last_mut() {
            Some((s, a, b)) if *s == shard && lo <= *b + (1 << 20) => {
                *a = (*a).min(lo);
                *b = (*b).max(hi);
            }
            _ => spans.push((shard, lo, hi)),
        }
    }
    let mut windows = Vec::new();
    let mut first = 0usize;
    for (shard, a, b) in spans {
        let cap = shards[shard].len.div_ceil(PAGE) * PAGE;
        let b = b.min(cap);
        let mut lo = a;
        while lo < b {
            let hi = (lo + wbytes).min(b);
            let mut pieces = Vec::new();
            // Extents are sorted by start; skip those that end before this window.
            while first < extents.len() && {
                let e = &extents[first];
                (e.shard as usize) < shard
                    || (e.shard as usize == shard
                        && e.src + (e.height - 1) * e.src_pitch + e.width <= lo
                        && e.height == 1)
            } {
                first += 1;
            }
            for e in &extents[first..] {
                if e.shard as usize != shard || e.src >= hi {
                    break;
                }
                clip_src(e, lo, hi, &mut pieces);
            }
            if !pieces.is_empty() {
                windows.push(Window {
                    shard,
                    lo,
                    hi,
                    pieces,
                });
            }
            lo = hi;
        }
    }
    windows
}

/// Split extents into pieces of at most `slot` source bytes (row groups, or
/// 4 KiB-multiple chunks of one row: element-aligned for every dtype) and pack
/// them, in file order, into jobs of one shard each.
/// Slot size, depth and page-cached fill for `workers` staging workers:
/// [`geometry::with_overrides`] for the CPU's last-level cache and the caller's
/// explicit slot size or depth, except that `read`, and `auto`/`hybrid` on a
/// checkpoint mostly not in the page cache, keep large slots: those slots are
/// filled by `pread`, and large reads keep the disk busy.
fn staging_geometry(
    opts: &CopyOptions,
    shards: &[Shard],
    staged: &[Extent],
    workers: usize,
) -> Geometry {
    let nonzero = |v: usize| (v != 0).then_some(v);
    let (slot, depth) = (nonzero(opts.slot_bytes), nonzero(opts.depth));
    let cold = match opts.strategy {
        Strategy::Read => true,
        Strategy::Auto | Strategy::Hybrid => resident_share(shards, staged) < 0.5,
        _ => false,
    };
    let llc = if cold {
        None
    } else {
        geometry::usable_cache_bytes(geometry::last_level_caches(), workers)
    };
    geometry::with_overrides(llc, workers, slot, depth)
}

fn make_jobs(extents: &[Extent], slot: u64) -> Vec<Job> {
    let chunk = (slot / PAGE).max(1) * PAGE;
    let mut pieces = Vec::new();
    for e in extents {
        if e.width <= slot {
            let per = (slot / e.width.max(1)).max(1);
            let mut r = 0;
            while r < e.height {
                let n = per.min(e.height - r);
                pieces.push(Extent {
                    src: e.src + r * e.src_pitch,
                    dst: e.dst + r * e.dst_pitch,
                    height: n,
                    ..*e
                });
                r += n;
            }
        } else {
            for r in 0..e.height {
                let mut off = 0;
                while off < e.width {
                    let n = chunk.min(e.width - off);
                    let dst_off = match e.convert {
                        Some((f, t)) => off / f.size() as u64 * t.size() as u64,
                        None => off,
                    };
                    let mut p = Extent {
                        src: e.src + r * e.src_pitch + off,
                        dst: e.dst + r * e.dst_pitch + dst_off,
                        width: n,
                        height: 1,
                        ..*e
                    };
                    p.src_pitch = n;
                    p.dst_pitch = p.dst_width();
                    pieces.push(p);
                    off += n;
                }
            }
        }
    }
    let mut jobs: Vec<Job> = Vec::new();
    for p in pieces {
        let b = p.src_bytes();
        match jobs.last_mut() {
            // A job reads one shard (its fill reads one file).
            Some(j) if j.bytes + b <= slot && j.pieces[0].shard == p.shard => {
                j.bytes += b;
                j.pieces.push(p);
            }
            _ => jobs.push(Job {
                pieces: vec![p],
                bytes: b,
            }),
        }
    }
    jobs
}

/// Queue the copy of one piece whose rows are at `src` with `src_pitch`.
///
/// # Safety
/// `src` must stay valid until the stream passes the copy; the destination is
/// a validated plan extent.
unsafe fn issue(
    d: &dyn Driver,
    p: &Extent,
    src: *const u8,
    src_pitch: u64,
    stream: StreamId,
) -> Result<()> {
    if p.height == 1 {
        // SAFETY: forwarded.
        unsafe { d.copy_htod_async(p.dst, src, p.width as usize, stream) }
    } else {
        // SAFETY: forwarded.
        unsafe {
            d.copy_2d_htod_async(
                p.dst,
                p.dst_pitch as usize,
                src,
                src_pitch as usize,
                p.width as usize,
                p.height as usize,
                stream,
            )
        }
    }
}

/// Threads the staging phase runs for direct windows (Hybrid runs both at once).
fn n_direct_for(opts: &CopyOptions, n_direct: usize) -> usize {
    if opts.strategy == Strategy::Hybrid {
        n_direct
    } else {
        0
    }
}

/// Hybrid's split: every extent without conversion is a candidate for direct;
/// whole extents go there, in file order spread evenly, until `percent` of the bytes.
fn hybrid_split(extents: &[Extent], percent: u8) -> (Vec<Extent>, Vec<Extent>) {
    let total: u64 = extents.iter().map(Extent::src_bytes).sum();
    let goal = total / 100 * percent.min(100) as u64;
    let (mut direct, mut staged) = (Vec::new(), Vec::new());
    let (mut seen, mut sent) = (0u64, 0u64);
    for e in extents {
        seen += e.src_bytes();
        // Keep the direct share proportional to the bytes seen so far.
        if e.convert.is_none() && sent < goal && sent * 100 < seen * percent as u64 {
            sent += e.src_bytes();
            direct.push(*e);
        } else {
            staged.push(*e);
        }
    }
    (direct, staged)
}

#[allow(clippy::too_many_arguments)]
fn direct_worker(
    d: &dyn Driver,
    shards: &[Shard],
    windows: &[Window],
    next: &AtomicUsize,
    sh: &Shared,
    register: bool,
    _worker: usize,
) -> Result<()> {
    let stream = d.stream_create()?;
    let mut events: Vec<EventId> = Vec::new();
    let mut pending: VecDeque<(*mut u8, u64, EventId)> = VecDeque::new();
    let retire = |pending: &mut VecDeque<(*mut u8, u64, EventId)>| -> Result<EventId> {
        let (ptr, bytes, ev) = pending.pop_front().expect("non-empty");
        let synced = d.event_synchronize(ev);
        if register {
            // SAFETY: registered below; its copies completed (event synchronized).
            // When the sync failed the device is in error; unregistering is still right.
            unsafe { d.host_unregister(ptr) }?;
        }
        synced?;
        sh.done.fetch_add(bytes, Ordering::SeqCst);
        Ok(ev)
    };
    let r = (|| -> Result<()> {
        for _ in 0..2 {
            events.push(d.event_create()?);
        }
        let mut free: Vec<EventId> = events.clone();
        loop {
            if sh.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let i = next.fetch_add(1, Ordering::SeqCst);
            let Some(w) = windows.get(i) else {
                return Ok(());
            };
            if free.is_empty() {
                free.push(retire(&mut pending)?);
            }
            let ev = free.pop().expect("an event is free");
            let shard = &shards[w.shard];
            let base = shard.ptr(w.lo) as *mut u8;
            if register {
                // SAFETY: the window is inside the shard's live mapping (clamped to
                // its page-rounded length); unregistered in `retire` after its copies.
                unsafe { d.host_register(base, (w.hi - w.lo) as usize, true) }?;
            }
            pending.push_back((base, w.bytes(), ev));
            for p in &w.pieces {
                // SAFETY: the piece's rows lie inside the window (clip_src), which
                // stays mapped and registered until its event completes.
                unsafe { issue(d, p, shard.ptr(p.src), p.src_pitch, stream) }?;
            }
            d.event_record(ev, stream)?;
        }
    })();
    let mut first = r.err();
    while !pending.is_empty() {
        if let Err(e) = retire(&mut pending) {
            first.get_or_insert(e);
        }
    }
    for ev in events {
        let _ = d.event_destroy(ev);
    }
    let _ = d.stream_destroy(stream);
    first.map_or(Ok(()), Err)
}

/// How a staging worker fills a slot from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotFill {
    /// Plain stores from the mapping ([`cached_copy`]; faults page-cache pages
    /// in one by one).
    Memcpy,
    /// `madvise(MADV_POPULATE_READ)` on the job's pages, then memcpy.
    Populate,
    /// `pread` into the slot: no user page tables touched.
    Pread,
    /// Copy from the mapping with streaming stores ([`stream_copy`]).
    Stream,
    /// `Stage::cached` when the job's pages are resident (`mincore`), pread when not.
    ByResidency,
}

/// `MADV_POPULATE_READ` (Linux 5.14); older kernels answer EINVAL, harmlessly.
const MADV_POPULATE_READ: libc::c_int = 22;

/// Everything the staging workers share for one execution.
struct Stage<'a> {
    d: &'a dyn Driver,
    shards: &'a [Shard],
    jobs: &'a [Job],
    next: AtomicUsize,
    sh: &'a Shared,
    ring: *mut u8,
    slot_bytes: usize,
    depth: usize,
    fill: SlotFill,
    /// What `ByResidency` uses for resident slots: `Memcpy` when the slots in
    /// use fit in the CPU cache, else `Stream` (see [`geometry`]).
    cached: SlotFill,
    scratch: Option<Mutex<Scratch>>,
    staged: AtomicU64,
    read: AtomicU64,
    /// Bytes filled with streaming stores (part of `staged`).
    streamed: AtomicU64,
    /// Nanoseconds, summed over workers.
    fill_ns: AtomicU64,
    wait_ns: AtomicU64,
    issue_ns: AtomicU64,
}

// SAFETY: `ring` is a pinned buffer that outlives the execution; each worker
// uses only its own slots of it.
unsafe impl Sync for Stage<'_> {}

/// Two slot-sized device buffers shared by all workers, for conversions: source
/// bytes land here, a kernel writes the destination. Each buffer's event
/// guards its reuse (recorded on whichever worker's stream used it last).
struct Scratch {
    bufs: [(DevicePtr, EventId, bool); 2],
    turn: usize,
}

struct Slot {
    host: *mut u8,
    event: EventId,
    inflight: Option<u64>,
}

fn ns(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

impl Stage<'_> {
    fn worker(&self, w: usize) -> Result<()> {
        let d = self.d;
        let t_setup = Instant::now();
        let stream = d.stream_create()?;
        let mut slots: Vec<Slot> = Vec::new();
        let r = (|| -> Result<()> {
            for k in 0..self.depth {
                slots.push(Slot {
                    // SAFETY: the ring holds `workers * depth` slots of `slot_bytes`.
                    host: unsafe { self.ring.add((w * self.depth + k) * self.slot_bytes) },
                    event: d.event_create()?,
                    inflight: None,
                });
            }
            self.wait_ns.fetch_add(ns(t_setup), Ordering::Relaxed);
            let mut k = 0usize;
            loop {
                if self.sh.stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
                let i = self.next.fetch_add(1, Ordering::SeqCst);
                let Some(job) = self.jobs.get(i) else {
                    return Ok(());
                };
                let slot = &mut slots[k % self.depth];
                k += 1;
                if let Some(b) = slot.inflight.take() {
                    let t = Instant::now();
                    d.event_synchronize(slot.event)?;
                    self.wait_ns.fetch_add(ns(t), Ordering::Relaxed);
                    self.sh.done.fetch_add(b, Ordering::SeqCst);
                }
                let t = Instant::now();
                let used = self.fill_slot(job, slot.host)?;
                self.fill_ns.fetch_add(ns(t), Ordering::Relaxed);
                let t = Instant::now();
                self.issue_job(job, slot.host, stream)?;
                d.event_record(slot.event, stream)?;
                self.issue_ns.fetch_add(ns(t), Ordering::Relaxed);
                slot.inflight = Some(job.bytes);
                let c = if used == SlotFill::Pread {
                    &self.read
                } else {
                    &self.staged
                };
                c.fetch_add(job.bytes, Ordering::Relaxed);
                if used == SlotFill::Stream {
                    self.streamed.fetch_add(job.bytes, Ordering::Relaxed);
                }
            }
        })();
        let mut first = r.err();
        let t_drain = Instant::now();
        for s in &mut slots {
            if let Some(b) = s.inflight.take() {
                match d.event_synchronize(s.event) {
                    Ok(()) => {
                        self.sh.done.fetch_add(b, Ordering::SeqCst);
                    }
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            let _ = d.event_destroy(s.event);
        }
        if let Err(e) = d.stream_synchronize(stream) {
            first.get_or_insert(e);
        }
        let _ = d.stream_destroy(stream);
        self.wait_ns.fetch_add(ns(t_drain), Ordering::Relaxed);
        first.map_or(Ok(()), Err)
    }

    /// Copy the job's source rows into the slot, packed in piece order.
    /// Returns the fill it used (never `ByResidency`).
    fn fill_slot(&self, job: &Job, host: *mut u8) -> Result<SlotFill> {
        let first = &job.pieces[0];
        let shard = &self.shards[first.shard as usize];
        // Pieces are sorted by source offset within one shard.
        let (a, b) = job.pieces.iter().fold((u64::MAX, 0), |(a, b), p| {
            (
                a.min(p.src),
                b.max(p.src + (p.height - 1) * p.src_pitch + p.width),
            )
        });
        let fill = match self.fill {
            SlotFill::ByResidency => {
                if resident_fraction(shard.ptr(a), (b - a) as usize) >= 0.95 {
                    self.cached
                } else {
                    SlotFill::Pread
                }
            }
            f => f,
        };
        if fill == SlotFill::Populate {
            let lo = page_down(a);
            // SAFETY: advice on pages of the shard's live read-only mapping
            // (extents were checked against the file length); it only faults
            // them in. Failure (old kernel) just leaves memcpy to fault them.
            unsafe {
                libc::madvise(
                    shard.ptr(lo) as *mut libc::c_void,
                    (b - lo) as usize,
                    MADV_POPULATE_READ,
                )
            };
        }
        // Source runs (file offset, slot offset, length), merged when adjacent
        // on both sides, so contiguous tensors take one read.
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        let mut off = 0u64;
        for p in &job.pieces {
            for r in 0..p.height {
                let (src, dst) = (p.src + r * p.src_pitch, off + r * p.width);
                match runs.last_mut() {
                    Some((s, o, n)) if *s + *n == src && *o + *n == dst => *n += p.width,
                    _ => runs.push((src, dst, p.width)),
                }
            }
            off += p.src_bytes();
        }
        for (src, dst, n) in runs {
            // SAFETY: the slot has `slot_bytes >= job.bytes` bytes and its previous
            // copies completed (event synchronized by the caller).
            let dst = unsafe { host.add(dst as usize) };
            if fill == SlotFill::Pread {
                // SAFETY: `dst` is valid for `n` writable bytes (above).
                let buf = unsafe { std::slice::from_raw_parts_mut(dst, n as usize) };
                use std::os::unix::fs::FileExt;
                shard
                    .file
                    .read_exact_at(buf, src)
                    .map_err(|e| Error::io(&shard.path, e))?;
            } else if fill == SlotFill::Stream {
                // SAFETY: the source run lies inside the mapping (checked in
                // `execute`); `dst` as above; a slot never overlaps the mapping.
                unsafe { stream_copy(dst, shard.ptr(src), n as usize) };
            } else {
                // SAFETY: as above.
                unsafe { cached_copy(dst, shard.ptr(src), n as usize) };
            }
        }
        Ok(fill)
    }

    /// Queue the job's transfers from the slot: contiguous runs of plain pieces
    /// as one copy, strided pieces as 2D copies, conversions through scratch.
    fn issue_job(&self, job: &Job, host: *mut u8, stream: StreamId) -> Result<()> {
        let d = self.d;
        // (dst, slot offset, len) of the current contiguous run.
        let mut run: Option<(DevicePtr, u64, u64)> = None;
        let flush = |run: &mut Option<(DevicePtr, u64, u64)>| -> Result<()> {
            if let Some((dst, o, n)) = run.take() {
                // SAFETY: the slot stays untouched until the slot's event completes;
                // the destination bytes are validated plan extents.
                unsafe { d.copy_htod_async(dst, host.add(o as usize), n as usize, stream) }?;
            }
            Ok(())
        };
        let mut off = 0u64;
        let mut converts = false;
        for p in &job.pieces {
            let n = p.src_bytes();
            if p.convert.is_some() {
                converts = true;
            } else if p.height == 1 || p.dst_pitch == p.width {
                match run.as_mut() {
                    Some((dst, o, len)) if *dst + *len == p.dst && *o + *len == off => *len += n,
                    _ => {
                        flush(&mut run)?;
                        run = Some((p.dst, off, n));
                    }
                }
            } else {
                flush(&mut run)?;
                // SAFETY: as above.
                unsafe { issue(d, p, host.add(off as usize), p.width, stream) }?;
            }
            off += n;
        }
        flush(&mut run)?;
        if converts {
            self.issue_conversions(job, host, stream)?;
        }
        Ok(())
    }

    fn issue_conversions(&self, job: &Job, host: *mut u8, stream: StreamId) -> Result<()> {
        let d = self.d;
        let scratch = self
            .scratch
            .as_ref()
            .expect("scratch exists when a job converts");
        let mut g = scratch.lock().unwrap_or_else(|p| p.into_inner());
        let k = g.turn % 2;
        g.turn += 1;
        let (base, ev, used) = g.bufs[k];
        if used {
            let t = Instant::now();
            d.event_synchronize(ev)?;
            self.wait_ns.fetch_add(ns(t), Ordering::Relaxed);
        }
        let mut off = 0u64;
        for p in &job.pieces {
            if let Some((from, to)) = p.convert {
                let tmp = base + off;
                // SAFETY: scratch has `slot_bytes >= job.bytes`; the slot as in `issue_job`.
                unsafe {
                    d.copy_htod_async(tmp, host.add(off as usize), p.src_bytes() as usize, stream)
                }?;
                let per_row = (p.width / from.size() as u64) as usize;
                if p.height == 1 || p.dst_pitch == p.dst_width() {
                    // SAFETY: destination rows are a validated extent, contiguous here.
                    unsafe {
                        d.convert_async(p.dst, to, tmp, from, per_row * p.height as usize, stream)
                    }?;
                } else {
                    for r in 0..p.height {
                        // SAFETY: one destination row of a validated extent.
                        unsafe {
                            d.convert_async(
                                p.dst + r * p.dst_pitch,
                                to,
                                tmp + r * p.width,
                                from,
                                per_row,
                                stream,
                            )
                        }?;
                    }
                }
            }
            off += p.src_bytes();
        }
        d.event_record(ev, stream)?;
        g.bufs[k].2 = true;
        Ok(())
    }
}
