//! What a caller chooses and gets back: the sleep policy, the engine's
//! tunables and the report of one transition.

use crate::codec::Layout;
use crate::error::{Error, Result};
use crate::segment::SleepState;
use crate::sleep::backup::DEFAULT_SLAB_BYTES;

/// What sleep does with a tag's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(C)]
pub enum Policy {
    /// Copy to a pinned host backup, then release. Restored byte for byte at wake.
    Offload = 0,
    /// Release; contents are undefined after wake.
    Discard = 1,
    /// Release; the bytes the loader wrote (and no block freed since) are
    /// restored from the checkpoint they were loaded from, every other byte of
    /// the tag's segments is kept in the host backup.
    Reload = 2,
    /// As Offload, but the backup is held losslessly compressed: the device
    /// encodes each segment's bytes (`crate::codec`), only the encoded bytes
    /// cross the link and occupy the pinned backup, and wake decodes them on
    /// the device, checking every block's checksum. A corrupt backup fails
    /// the wake, leaving the tag asleep. Best on bf16 and fp16 weights
    /// (about 70% of raw on bf16); data that does not compress costs its
    /// headers (under 0.1%).
    OffloadCompressed = 3,
}

impl Policy {
    /// The segment state a segment is in after sleeping with this policy.
    pub fn asleep_state(self) -> SleepState {
        match self {
            Policy::Offload | Policy::OffloadCompressed => SleepState::Offloaded,
            Policy::Discard => SleepState::Discarded,
            Policy::Reload => SleepState::Reloadable,
        }
    }

    /// Parse "offload", "discard", "reload" or "offload_compressed".
    pub fn parse(s: &str) -> Result<Policy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "offload" => Ok(Policy::Offload),
            "offload_compressed" | "offload-compressed" => Ok(Policy::OffloadCompressed),
            "discard" => Ok(Policy::Discard),
            "reload" => Ok(Policy::Reload),
            other => Err(Error::InvalidArgument(format!(
                "unknown sleep policy `{other}`: expected offload, discard, reload or offload_compressed"
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
    /// Cap on pinned backup memory, counted in whole pinned pages
    /// ([`crate::hostmem::PINNED_UNIT_BYTES`]).
    pub host_memory_limit: u64,
    /// Free the backup of a segment once it is awake again (the memory stays
    /// pinned in the arena for the next sleep unless `release_pinned_after_wake`).
    pub free_backup_after_wake: bool,
    /// Also unpin and unmap backup slabs that hold nothing after wake.
    pub release_pinned_after_wake: bool,
    /// Fill discarded memory with this byte at wake, so stale reads are visible.
    pub debug_fill_discarded: Option<u8>,
    /// How OffloadCompressed splits elements (the width of the tag's dtype:
    /// [`Layout::Half`] for bf16 and fp16, the default).
    pub codec_layout: Layout,
    /// Raw bytes per OffloadCompressed frame (the unit encoded, copied and
    /// decoded in one step): a multiple of the codec's 64 KiB block in
    /// [`CODEC_FRAME_BYTES`]. Default: `VMMW_CODEC_FRAME_MIB` or 32 MiB.
    pub codec_frame_bytes: usize,
    /// Device frame buffers OffloadCompressed cycles through, in
    /// [`CODEC_RING`]: the sleep and the wake keep this many frames in
    /// flight, so a host wait for one frame overlaps the copies of the
    /// others. Default: `VMMW_CODEC_RING` or 3.
    pub codec_ring: usize,
}

/// Allowed `codec_frame_bytes`: 1 MiB to 256 MiB.
pub const CODEC_FRAME_BYTES: std::ops::RangeInclusive<usize> = (1 << 20)..=(256 << 20);
/// Allowed `codec_ring`.
pub const CODEC_RING: std::ops::RangeInclusive<usize> = 2..=8;

/// The codec's frame size and ring depth when the options do not say:
/// `VMMW_CODEC_FRAME_MIB` and `VMMW_CODEC_RING`, read once per process (a
/// value that is not a number in range is ignored with a warning).
fn codec_defaults() -> (usize, usize) {
    static DEFAULTS: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *DEFAULTS.get_or_init(|| {
        let read = |var: &str, scale: usize, ok: &std::ops::RangeInclusive<usize>, dflt: usize| {
            let Ok(v) = std::env::var(var) else {
                return dflt;
            };
            match v.trim().parse::<usize>().ok().and_then(|n| n.checked_mul(scale)) {
                Some(n) if ok.contains(&n) => n,
                _ => {
                    // Once per process; the engine runs on with the default.
                    eprintln!(
                        "vmmw: {var}={v:?} is not in {}..={} (units of {scale} bytes); using {dflt}",
                        ok.start() / scale,
                        ok.end() / scale
                    );
                    dflt
                }
            }
        };
        (
            read("VMMW_CODEC_FRAME_MIB", 1 << 20, &CODEC_FRAME_BYTES, 32 << 20),
            read("VMMW_CODEC_RING", 1, &CODEC_RING, 3),
        )
    })
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
        if !CODEC_FRAME_BYTES.contains(&self.codec_frame_bytes)
            || !self
                .codec_frame_bytes
                .is_multiple_of(crate::codec::format::BLOCK_BYTES)
        {
            return Err(Error::InvalidArgument(format!(
                "sleep option codec_frame_bytes = {} must be a multiple of {} in {}..={}",
                self.codec_frame_bytes,
                crate::codec::format::BLOCK_BYTES,
                CODEC_FRAME_BYTES.start(),
                CODEC_FRAME_BYTES.end()
            )));
        }
        if !CODEC_RING.contains(&self.codec_ring) {
            return Err(Error::InvalidArgument(format!(
                "sleep option codec_ring = {} must be in {}..={}",
                self.codec_ring,
                CODEC_RING.start(),
                CODEC_RING.end()
            )));
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
            codec_layout: Layout::Half,
            codec_frame_bytes: codec_defaults().0,
            codec_ring: codec_defaults().1,
        }
    }
}

/// How a wake gets its device memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WakeOptions {
    /// Zero (the default): the bytes the wake needs are compared with the
    /// device's free memory first, and a shortfall refuses the wake before
    /// anything moves. Otherwise: each physical chunk is created as soon as
    /// the device has room, waiting up to this long in all for memory being
    /// released meanwhile (another process's sleep, another pool's trim),
    /// polling the driver's free memory; then the wake fails
    /// transactionally. Longer than a year counts as a year.
    pub wait_for_memory: std::time::Duration,
}

/// What one sleep or wake of one tag did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CycleReport {
    /// Segments whose state changed.
    pub segments: usize,
    /// Physical bytes released (sleep) or mapped (wake).
    pub physical_bytes: u64,
    /// Bytes copied between device and host backup (encoded bytes for
    /// OffloadCompressed).
    pub copied_bytes: u64,
    /// OffloadCompressed: raw bytes the copied frames hold (the ratio to
    /// `copied_bytes` is the backup's compression).
    pub raw_bytes: u64,
    /// Bytes restored from checkpoints (Reload).
    pub reloaded_bytes: u64,
    /// Bytes a load wrote that changed since (found by hashing them on the
    /// device at a Reload sleep, or marked written): kept in the host backup
    /// from then on instead of being reloaded (Reload sleep).
    pub changed_bytes: u64,
    /// Pinned host bytes newly allocated during this call.
    pub newly_pinned_bytes: u64,
    /// OffloadCompressed: the codec's device buffers did not fit, so this
    /// sleep kept raw backups, as Offload does (nothing is lost: the backup
    /// is whole, only not smaller; the wake restores it as Offload's).
    pub codec_fallback: bool,
    /// Wall time of the call.
    pub seconds: f64,
    /// Wake: the part of `seconds` spent waiting for device memory another
    /// process or tag was releasing (a wake that may wait, or a swap).
    pub waited_seconds: f64,
}
