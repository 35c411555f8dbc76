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
//!   the page cache: the **read** path) into their own pinned slots (two per
//!   worker, events guard reuse) and queue async copies on their own stream.
//!   Conversions always go this way: source bytes land in a small device
//!   scratch buffer, then a conversion kernel writes the destination.
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
use super::plan::{Extent, Fill};
use super::staging::{resident_fraction, Pinned};
use crate::driver::{DevicePtr, Driver, EventId, StreamId};
use crate::error::{Error, Result};
use crate::segment::Segment;

/// How the engine moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Staged for ranges resident in the page cache, read (pread) for the rest.
    /// (Measured on the H200 box, 5.6 GB page-cached: staged 27.8 GB/s, direct
    /// 19.0 GB/s, so page-cached data is staged rather than registered.)
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
}

impl Strategy {
    /// Parse `auto`, `direct`, `staged`, `read`, `simple`.
    pub fn parse(s: &str) -> Result<Strategy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(Strategy::Auto),
            "direct" => Ok(Strategy::Direct),
            "staged" => Ok(Strategy::Staged),
            "read" => Ok(Strategy::Read),
            "simple" => Ok(Strategy::Simple),
            o => Err(Error::InvalidArgument(format!(
                "unknown copy strategy `{o}`: expected auto, direct, staged, read or simple"
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
    /// Bytes per pinned staging slot (each worker has two).
    pub slot_bytes: usize,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            strategy: Strategy::Auto,
            threads: 0,
            window_bytes: 64 << 20,
            slot_bytes: 16 << 20,
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

    // Partition: conversions always stage; the rest by strategy.
    let (mut direct, mut staged): (Vec<Extent>, Vec<Extent>) = match opts.strategy {
        Strategy::Direct | Strategy::Simple => extents.iter().partition(|e| e.convert.is_none()),
        Strategy::Auto | Strategy::Staged | Strategy::Read => (Vec::new(), extents.to_vec()),
    };
    direct.sort_by_key(|e| (e.shard, e.src));
    let windows = make_windows(shards, &direct, opts.window_bytes.max(PAGE as usize) as u64);
    staged.sort_by_key(|e| (e.shard, e.src));
    let jobs = make_jobs(&staged, opts.slot_bytes.max(PAGE as usize) as u64);

    let shared = Shared::default();
    let register = opts.strategy != Strategy::Simple;
    let direct_bytes: u64 = windows.iter().map(Window::bytes).sum();
    let next = AtomicUsize::new(0);
    run_workers(threads.min(windows.len()), &shared, ctl, total, &|| {
        direct_worker(d, shards, &windows, &next, &shared, register)
    });
    stats.direct_bytes = direct_bytes;
    if !shared.stop.load(Ordering::SeqCst) && !jobs.is_empty() {
        let read_mode = match opts.strategy {
            Strategy::Read => ReadMode::Pread,
            Strategy::Staged | Strategy::Simple | Strategy::Direct => ReadMode::Memcpy,
            Strategy::Auto => ReadMode::ByResidency,
        };
        let needs_scratch = jobs
            .iter()
            .any(|j| j.pieces.iter().any(|p| p.convert.is_some()));
        let counters = (AtomicU64::new(0), AtomicU64::new(0));
        let next = AtomicUsize::new(0);
        let slot = opts.slot_bytes.max(PAGE as usize);
        run_workers(threads.min(jobs.len()), &shared, ctl, total, &|| {
            staged_worker(
                driver,
                shards,
                &jobs,
                &next,
                &shared,
                slot,
                needs_scratch,
                read_mode,
                &counters,
            )
        });
        stats.staged_bytes = counters.0.load(Ordering::SeqCst);
        stats.read_bytes = counters.1.load(Ordering::SeqCst);
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
    work: &(dyn Fn() -> Result<()> + Sync),
) {
    if n == 0 {
        return;
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    if let Err(e) = work() {
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
/// them into jobs.
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
            Some(j) if j.bytes + b <= slot => {
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

fn direct_worker(
    d: &dyn Driver,
    shards: &[Shard],
    windows: &[Window],
    next: &AtomicUsize,
    sh: &Shared,
    register: bool,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadMode {
    Memcpy,
    Pread,
    ByResidency,
}

struct Slot {
    host: *mut u8,
    scratch: DevicePtr,
    event: EventId,
    inflight: Option<u64>,
}

#[allow(clippy::too_many_arguments)]
fn staged_worker(
    driver: &Arc<dyn Driver>,
    shards: &[Shard],
    jobs: &[Job],
    next: &AtomicUsize,
    sh: &Shared,
    slot_bytes: usize,
    needs_scratch: bool,
    mode: ReadMode,
    counters: &(AtomicU64, AtomicU64),
) -> Result<()> {
    let d: &dyn Driver = driver.as_ref();
    let slot_bytes = slot_bytes.div_ceil(PAGE as usize) * PAGE as usize;
    let pinned = Pinned::new(d, 2 * slot_bytes)?;
    let scratch = if needs_scratch {
        Some(Segment::allocate(driver.clone(), 2 * slot_bytes, 0)?)
    } else {
        None
    };
    let stream = d.stream_create()?;
    let mut slots: Vec<Slot> = Vec::new();
    let r = (|| -> Result<()> {
        for k in 0..2 {
            slots.push(Slot {
                // SAFETY: inside the pinned buffer of 2 * slot_bytes.
                host: unsafe { pinned.ptr().add(k * slot_bytes) },
                scratch: scratch
                    .as_ref()
                    .map_or(0, |s| s.ptr() + (k * slot_bytes) as u64),
                event: d.event_create()?,
                inflight: None,
            });
        }
        let mut k = 0usize;
        loop {
            if sh.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let i = next.fetch_add(1, Ordering::SeqCst);
            let Some(job) = jobs.get(i) else {
                return Ok(());
            };
            let slot = &mut slots[k % 2];
            k += 1;
            if let Some(b) = slot.inflight.take() {
                d.event_synchronize(slot.event)?;
                sh.done.fetch_add(b, Ordering::SeqCst);
            }
            let pread = match mode {
                ReadMode::Memcpy => false,
                ReadMode::Pread => true,
                ReadMode::ByResidency => {
                    let (a, b) = (
                        job.pieces[0].src,
                        job.pieces.last().map_or(0, |p| p.src + p.src_bytes()),
                    );
                    let s = &shards[job.pieces[0].shard as usize];
                    resident_fraction(s.ptr(a), b.saturating_sub(a) as usize) < 0.95
                }
            };
            let mut off = 0u64;
            for p in &job.pieces {
                let shard = &shards[p.shard as usize];
                for r in 0..p.height {
                    let src = p.src + r * p.src_pitch;
                    // SAFETY: the slot has `slot_bytes >= job.bytes` bytes and the
                    // previous copies from it completed (event synchronized above).
                    let dst = unsafe { slot.host.add((off + r * p.width) as usize) };
                    if pread {
                        // SAFETY: `dst` is valid for `p.width` writable bytes (above).
                        let buf = unsafe { std::slice::from_raw_parts_mut(dst, p.width as usize) };
                        use std::os::unix::fs::FileExt;
                        shard
                            .file
                            .read_exact_at(buf, src)
                            .map_err(|e| Error::io(&shard.path, e))?;
                    } else {
                        // SAFETY: the source row lies inside the mapping (checked in
                        // `execute`); `dst` as above.
                        unsafe {
                            std::ptr::copy_nonoverlapping(shard.ptr(src), dst, p.width as usize)
                        };
                    }
                }
                off += p.src_bytes();
            }
            let mut off = 0u64;
            for p in &job.pieces {
                // SAFETY: the slot stays untouched until this event completes.
                let host = unsafe { slot.host.add(off as usize) };
                match p.convert {
                    None => {
                        // SAFETY: the slot stays untouched until the event below completes.
                        unsafe { issue(d, p, host, p.width, stream) }?;
                    }
                    Some((from, to)) => {
                        let tmp = slot.scratch + off;
                        // SAFETY: scratch has room for the slot's bytes; host as above.
                        unsafe { d.copy_htod_async(tmp, host, p.src_bytes() as usize, stream) }?;
                        let per_row = (p.width / from.size() as u64) as usize;
                        if p.height == 1 || p.dst_pitch == p.dst_width() {
                            // SAFETY: destination rows are a validated extent, contiguous here.
                            unsafe {
                                d.convert_async(
                                    p.dst,
                                    to,
                                    tmp,
                                    from,
                                    per_row * p.height as usize,
                                    stream,
                                )
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
                }
                off += p.src_bytes();
            }
            d.event_record(slot.event, stream)?;
            slot.inflight = Some(job.bytes);
            if pread {
                counters.1.fetch_add(job.bytes, Ordering::Relaxed);
            } else {
                counters.0.fetch_add(job.bytes, Ordering::Relaxed);
            }
        }
    })();
    let mut first = r.err();
    for s in &mut slots {
        if let Some(b) = s.inflight.take() {
            match d.event_synchronize(s.event) {
                Ok(()) => {
                    sh.done.fetch_add(b, Ordering::SeqCst);
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        let _ = d.event_destroy(s.event);
    }
    let _ = d.stream_synchronize(stream);
    let _ = d.stream_destroy(stream);
    drop(scratch);
    drop(pinned);
    first.map_or(Ok(()), Err)
}
