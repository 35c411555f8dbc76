//! PyTorch integration: the logic behind the two
//! entry points `torch.cuda.memory.CUDAPluggableAllocator` loads
//! (`vmmw_torch_malloc` / `vmmw_torch_free` in [`crate::ffi::torch`]).
//!
//! PyTorch's caching allocator still splits and caches on its side; our entry
//! points see segment-sized requests, and each call creates or frees exactly
//! one segment, tagged with the calling thread's current tag ([`crate::tag`]).
//! No Python callbacks and no GIL: these paths are plain Rust; the panic
//! boundary is the C layer's. Out of memory returns NULL (PyTorch frees its cache and retries);
//! other failures return NULL with one line on stderr; freeing an unknown
//! pointer is reported and counted, never a crash.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use super::registry::{existing_pool, global_pool};
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::tag;

static MALLOCS: AtomicU64 = AtomicU64::new(0);
static FAILED_MALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
static UNKNOWN_FREES: AtomicU64 = AtomicU64::new(0);

/// What the entry points have done in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Counters {
    /// Successful `vmmw_torch_malloc` calls.
    pub mallocs: u64,
    /// `vmmw_torch_malloc` calls that returned NULL (out of memory or another error).
    pub failed_mallocs: u64,
    /// Successful `vmmw_torch_free` calls.
    pub frees: u64,
    /// `vmmw_torch_free` calls with a pointer we did not hand out (or a failure while freeing).
    pub unknown_frees: u64,
}

/// The entry points' counters.
pub fn counters() -> Counters {
    Counters {
        mallocs: MALLOCS.load(Ordering::Relaxed),
        failed_mallocs: FAILED_MALLOCS.load(Ordering::Relaxed),
        frees: FREES.load(Ordering::Relaxed),
        unknown_frees: UNKNOWN_FREES.load(Ordering::Relaxed),
    }
}

/// One new segment of at least `size` bytes on `device` under the calling
/// thread's current tag: the logic of `vmmw_torch_malloc`.
pub fn malloc(size: isize, device: i32) -> Result<DevicePtr> {
    let size = usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| Error::InvalidArgument(format!("size {size} must be positive")))?;
    let pool = global_pool(device)?;
    Ok(pool.alloc_segment(size, tag::current())?.ptr)
}

/// Count a `vmmw_torch_malloc` call's outcome and report a failure other
/// than out of memory on stderr.
pub fn record_malloc(size: isize, device: i32, outcome: &Result<DevicePtr>) {
    match outcome {
        Ok(_) => {
            MALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            FAILED_MALLOCS.fetch_add(1, Ordering::Relaxed);
            // Out of memory is expected traffic (PyTorch frees its cache and
            // retries, or raises its own error); anything else deserves a line.
            if !e.is_out_of_memory() {
                let _ = writeln!(
                    std::io::stderr(),
                    "vmmweights: vmmw_torch_malloc({size} bytes, device {device}) failed: {e}"
                );
            }
        }
    }
}

/// Release the segment at `ptr` on `device`: the logic of `vmmw_torch_free`.
pub fn free(ptr: DevicePtr, device: i32) -> Result<()> {
    let pool = existing_pool(device).ok_or(Error::UnknownPointer {
        ptr,
        why: "no vmmweights pool exists for this device yet",
    })?;
    // Releasing the segment synchronizes the device before unmapping (see
    // `Segment`'s drop), which covers the stream PyTorch passes and any other
    // stream the memory was recorded on.
    pool.free_segment(ptr)
}

/// Count a `vmmw_torch_free` call's outcome; a failure (an unknown pointer)
/// is reported on stderr, nothing else happens.
pub fn record_free(ptr: DevicePtr, size: isize, device: i32, outcome: &Result<()>) {
    match outcome {
        Ok(()) => {
            FREES.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            UNKNOWN_FREES.fetch_add(1, Ordering::Relaxed);
            let _ = writeln!(
                std::io::stderr(),
                "vmmweights: vmmw_torch_free({ptr:#x}, {size} bytes, device {device}) ignored: {e}"
            );
        }
    }
}
