//! The copy engine: executes a plan's extents from the shard files into device
//! memory, using only the [`Driver`](crate::driver::Driver) seam.
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
//!   Slot size and depth keep the slots in use in the CPU's last-level cache
//!   where they fit ([`geometry`]); **stream** fills
//!   with streaming stores, for rings that cannot fit.
//!   The ring is pinned once and cached process-wide per driver
//!   ([`staging::acquire_ring`]), so later loads and Reload replays skip
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
//! copies and returns [`Error::Cancelled`](crate::error::Error::Cancelled);
//! destinations are then partly written (complete windows/slots landed, the
//! rest untouched).

mod direct;
mod execute;
mod extents;
pub mod geometry;
mod issue;
mod jobs;
mod options;
mod packed;
mod scratch_release;
mod shared;
pub mod slot_copy;
mod staged;
pub mod staging;

/// Copy `extents` and zero `fills` into device memory. Synchronous: every copy
/// has completed when it returns. Extents of packed shards (docs/PACKED.md)
/// are read as codec frames and decoded on the device.
pub fn execute(
    driver: &std::sync::Arc<dyn crate::driver::Driver>,
    shards: &[crate::loader::checkpoint::Shard],
    extents: &[crate::loader::plan::Extent],
    fills: &[crate::loader::plan::Fill],
    opts: &CopyOptions,
    ctl: &Control<'_>,
) -> crate::error::Result<CopyStats> {
    if packed::any_packed(shards) {
        packed::execute(driver, shards, extents, fills, opts, ctl)
    } else {
        execute::execute(driver, shards, extents, fills, opts, ctl)
    }
}
pub(crate) use extents::{clip_rows, sub_extent};
pub use options::{
    Control, CopyOptions, CopyStats, Strategy, MAX_DEPTH, MAX_SLOT_BYTES, MAX_THREADS,
};
pub use scratch_release::unreleased_scratch;

const PAGE: u64 = 4096;

fn page_down(x: u64) -> u64 {
    x & !(PAGE - 1)
}
