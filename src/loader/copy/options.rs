//! The engine's public knobs and report: which path moves the bytes
//! ([`Strategy`]), its tuning ([`CopyOptions`]), progress and cancellation
//! ([`Control`]), and what an execution did ([`CopyStats`]).

use std::sync::atomic::AtomicBool;

use crate::error::{Error, Result};

/// How the engine moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Staging ring for everything: page-cached ranges copied into slots sized
    /// to stay in the CPU cache (streaming stores into large slots when they
    /// cannot), the rest by pread (chosen per slot with `mincore`); see
    /// [`geometry`](crate::loader::copy::geometry).
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
    /// the CPU's last-level cache, see [`geometry`](crate::loader::copy::geometry)).
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

/// Most worker threads a load may ask for.
pub const MAX_THREADS: usize = 256;
/// Largest staging slot or direct window: 4 GiB.
pub const MAX_SLOT_BYTES: usize = 4 << 30;
/// Most staging slots per worker.
pub const MAX_DEPTH: usize = 64;

impl CopyOptions {
    /// Refuse values no machine can honour: more than [`MAX_THREADS`] threads,
    /// slots or windows over [`MAX_SLOT_BYTES`], a depth over [`MAX_DEPTH`],
    /// `direct_percent` over 100.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: usize, max: usize| {
            Err(Error::InvalidArgument(format!(
                "load option {what} = {v} is over the limit of {max}"
            )))
        };
        if self.threads > MAX_THREADS {
            return bad("threads", self.threads, MAX_THREADS);
        }
        if self.window_bytes > MAX_SLOT_BYTES {
            return bad("window_bytes", self.window_bytes, MAX_SLOT_BYTES);
        }
        if self.slot_bytes > MAX_SLOT_BYTES {
            return bad("slot_bytes", self.slot_bytes, MAX_SLOT_BYTES);
        }
        if self.depth > MAX_DEPTH {
            return bad("depth", self.depth, MAX_DEPTH);
        }
        if self.direct_percent > 100 {
            return bad("direct_percent", self.direct_percent as usize, 100);
        }
        Ok(())
    }

    pub(super) fn thread_count(&self) -> usize {
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
    /// Encoded bytes read from packed files (docs/PACKED.md); `bytes` counts
    /// the original bytes they decoded to.
    pub packed_bytes: u64,
    /// Packed frames decoded on the device.
    pub frames: u64,
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
