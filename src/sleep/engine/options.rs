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
    /// Cap on pinned backup memory.
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
            codec_layout: Layout::Half,
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
    /// Wall time of the call.
    pub seconds: f64,
}
