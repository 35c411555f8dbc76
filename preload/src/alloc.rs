//! What the intercepted entry points do: which allocations are ours, where
//! they go in the pool, how ours are freed, what free memory is reported.
//!
//! An allocation of ours goes to the current device's pool (`cudaGetDevice`
//! through the runtime) under the thread's tag. Above the pool's small
//! request size (1 MiB) it gets a segment of its own, rounded up to the
//! granularity (2 MiB): freeing it gives the memory back to the driver at
//! once, so `cudaMemGetInfo` moves as the runtime's would. Smaller ones are
//! blocks of shared 2 MiB segments, so a small buffer never costs a granule.

use std::ffi::c_void;

use vmmweights::Error;

use crate::config::Scope;
use crate::context::Kept;
use crate::cuda::{cudaError_t, ERROR_INVALID_VALUE, ERROR_MEMORY_ALLOCATION, SUCCESS};
use crate::owned::{self, Kind, Owned};
use crate::state::{self, State};
use crate::{real, thread};

/// Row pitches of `cudaMallocPitch` are multiples of this (the runtime's
/// texture pitch alignment on current GPUs).
pub const PITCH_ALIGN: usize = 512;

/// Whether an allocation by the calling thread is ours.
fn ours_here(s: &State) -> bool {
    match s.config.scope {
        Scope::All => true,
        Scope::Region => thread::region(s.config.region_default),
    }
}

/// `cudaMalloc`: ours when the scope says so, else the runtime's.
///
/// # Safety
/// `out` is NULL or writable.
pub unsafe fn malloc(out: *mut *mut c_void, size: usize) -> cudaError_t {
    // The runtime answers these as it does (a NULL out-pointer, size 0).
    if out.is_null() || size == 0 {
        // SAFETY: forwarded as given.
        return unsafe { real::malloc(out, size) };
    }
    let Some(s) = state::get().filter(|s| ours_here(s)) else {
        if let Some(s) = state::get() {
            s.count_passed();
        }
        // SAFETY: forwarded as given.
        return unsafe { real::malloc(out, size) };
    };
    let kept = Kept::now();
    let Some(device) = kept.device() else {
        // No current device: let the runtime say why.
        // SAFETY: forwarded as given.
        return unsafe { real::malloc(out, size) };
    };
    match allocate(s, device, size) {
        Ok(ptr) => {
            // SAFETY: `out` is non-NULL and writable per the caller's contract.
            unsafe { out.write(ptr as *mut c_void) };
            SUCCESS
        }
        Err(e) => {
            s.count_refused(size, device, &e);
            ERROR_MEMORY_ALLOCATION
        }
    }
}

/// Allocate `size` bytes on `device` under the thread's tag; the address.
fn allocate(s: &State, device: i32, size: usize) -> vmmweights::Result<u64> {
    let pool = s.pool(device)?;
    let tag = thread::tag(s.config.tag);
    let (block, kind) = if size > pool.config().small_request_max {
        (pool.alloc_segment(size, tag)?, Kind::Segment)
    } else {
        (pool.alloc_tagged(size, tag)?, Kind::Block)
    };
    owned::insert(block.ptr, Owned { device, kind, size });
    s.count_served();
    Ok(block.ptr)
}

/// `cudaMallocPitch`: a `width`-byte row rounded up to [`PITCH_ALIGN`],
/// `height` rows, as one allocation of ours when `cudaMalloc` would be.
///
/// # Safety
/// `out` and `pitch` are NULL or writable.
pub unsafe fn malloc_pitch(
    out: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> cudaError_t {
    let row = width.div_ceil(PITCH_ALIGN).saturating_mul(PITCH_ALIGN);
    let ours = state::get().is_some_and(ours_here);
    let total = row.checked_mul(height);
    if out.is_null() || pitch.is_null() || width == 0 || height == 0 || !ours {
        // SAFETY: forwarded as given.
        return unsafe { real::malloc_pitch(out, pitch, width, height) };
    }
    let Some(total) = total else {
        return ERROR_MEMORY_ALLOCATION;
    };
    // SAFETY: `out` is non-NULL and writable.
    let rc = unsafe { malloc(out, total) };
    if rc == SUCCESS {
        // SAFETY: `pitch` is non-NULL and writable.
        unsafe { pitch.write(row) };
    }
    rc
}

/// `cudaFree`: ours go back to the pool after the device is synchronized
/// (as the runtime's `cudaFree` waits for the device, so queued work that
/// still uses the memory finishes before the pool hands it out again);
/// every other pointer, and NULL, goes to the runtime.
///
/// # Safety
/// As `cudaFree`.
pub unsafe fn free(ptr: *mut c_void) -> cudaError_t {
    let addr = ptr as u64;
    let ours = !ptr.is_null()
        && matches!(state::existing(), Some(state::Made::Ready(_)))
        && owned::get(addr).is_some();
    if !ours {
        // SAFETY: forwarded as given.
        return unsafe { real::free(ptr) };
    }
    let Some(s) = state::get() else {
        // SAFETY: forwarded as given (unreachable: the state is ready).
        return unsafe { real::free(ptr) };
    };
    let Some(o) = owned::get(addr) else {
        // Freed by another thread meanwhile: the runtime says what a second free is.
        // SAFETY: forwarded as given.
        return unsafe { real::free(ptr) };
    };
    let _kept = Kept::now();
    if let Err(rc) = synchronize(o.device) {
        // The device holds a fault of the process's own work: the memory
        // may still be in use, so it stays allocated.
        return rc;
    }
    let Some(o) = owned::remove(addr) else {
        // SAFETY: forwarded as given (a racing free claimed it first).
        return unsafe { real::free(ptr) };
    };
    let r = s.pool(o.device).and_then(|pool| match o.kind {
        Kind::Segment => pool.free_segment(addr),
        Kind::Block => pool.free(addr),
    });
    match r {
        Ok(()) => SUCCESS,
        // Freed, but the driver did not take the memory back: the pool keeps
        // it and retries at its next free; the block is gone either way.
        Err(Error::UnknownPointer { .. }) => ERROR_INVALID_VALUE,
        Err(_) => SUCCESS,
    }
}

/// The runtime's `cudaDeviceSynchronize` of `device` on this thread (whose
/// device is put back by the caller's [`Kept`]).
pub fn synchronize(device: i32) -> Result<(), cudaError_t> {
    if real::current_device().ok() != Some(device) {
        // SAFETY: a device ordinal the runtime gave out.
        let rc = unsafe { real::set_device(device) };
        if rc != SUCCESS {
            return Err(rc);
        }
    }
    // SAFETY: no arguments.
    match unsafe { real::device_synchronize() } {
        SUCCESS => Ok(()),
        rc => Err(rc),
    }
}

/// `cudaMemGetInfo` of the current device from the pool's driver (true on
/// both backends), with the bytes the pool holds for reuse counted as free:
/// a `cudaMalloc` of them is served, the pool giving them back first.
///
/// # Safety
/// `free` and `total` are NULL or writable.
pub unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> cudaError_t {
    let answer = (!free.is_null() && !total.is_null())
        .then(state::get)
        .flatten()
        .and_then(|s| {
            let kept = Kept::now();
            let pool = s.pool(kept.device()?).ok()?;
            let mem = pool.driver().mem_info().ok()?;
            let free = mem.free.saturating_add(pool.cached_bytes()).min(mem.total);
            Some((free, mem.total))
        });
    match answer {
        Some((f, t)) => {
            // SAFETY: both are non-NULL and writable per the caller's contract.
            unsafe {
                free.write(f as usize);
                total.write(t as usize);
            }
            SUCCESS
        }
        // SAFETY: forwarded as given.
        None => unsafe { real::mem_get_info(free, total) },
    }
}
