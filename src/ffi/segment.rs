//! `vmmw_segment_t`: one raw VMM allocation (a VA reservation backed by
//! physical chunks), for callers that manage memory themselves. Most callers
//! want a pool instead.

use std::ffi::c_void;
use std::sync::Mutex;

use super::boundary::{arg, bytes_mut_arg, call, call_out, free_handle, into_handle, slice_arg};
use super::device::vmmw_device_t;
use super::error::vmmw_error_t;
use super::numbers::to_usize;
use super::status::vmmw_status_t;
use crate::driver::sync_copy::{copy_to_device, copy_to_host};
use crate::error::{Error, Result};
use crate::segment::Segment;

/// One VA reservation and the physical memory mapped into it. Thread-safe:
/// calls may run concurrently, except `vmmw_segment_free`.
pub struct vmmw_segment_t {
    seg: Mutex<Segment>,
}

impl vmmw_segment_t {
    fn lock(&self) -> std::sync::MutexGuard<'_, Segment> {
        // A panic while holding the lock was already reported as VMMW_PANIC;
        // the segment itself keeps consistent bookkeeping, so carry on.
        self.seg.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sizes and address of a segment.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct vmmw_segment_info_t {
    /// Base device address; stable for the segment's whole life.
    pub ptr: u64,
    /// Bytes of VA reserved (a granularity multiple).
    pub reserved: u64,
    /// Bytes from the base that have chunks.
    pub committed: u64,
    /// Bytes backed by physical memory right now.
    pub mapped: u64,
    /// Number of physical chunks.
    pub chunks: u64,
}

/// Reserve and back `size` bytes (rounded up to the granularity) on `device`,
/// in physical chunks of at most `chunk_size` bytes (0 = one chunk).
///
/// On success `*out` receives a new handle owned by the caller (free it with
/// `vmmw_segment_free`, which unmaps and releases everything). The segment
/// keeps the device's driver alive.
///
/// Errors (on any of them nothing is left allocated):
/// - `VMMW_NULL_ARGUMENT`: `device` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `size` is 0, or `size` or `chunk_size` is over 2^56.
/// - `VMMW_OUT_OF_MEMORY`.
/// - `VMMW_DRIVER_ERROR`.
///
/// # Safety
/// `device` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_segment_new(
    device: *const vmmw_device_t,
    size: u64,
    chunk_size: u64,
    out: *mut *mut vmmw_segment_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        let size = to_usize(size, "size")?;
        let chunk = to_usize(chunk_size, "chunk_size")?;
        let seg = Segment::allocate(d.driver().clone(), size, chunk)?;
        Ok(into_handle(vmmw_segment_t {
            seg: Mutex::new(seg),
        }))
    })
}

/// Free a segment: waits for the device, unmaps, releases its memory and its
/// VA. NULL is accepted.
///
/// Errors: none. NULL is ignored. A handle already freed cannot be detected
/// (undefined behaviour).
///
/// # Safety
/// `segment` is NULL or a live handle, not used afterwards and not concurrently.
#[no_mangle]
pub unsafe extern "C" fn vmmw_segment_free(segment: *mut vmmw_segment_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(segment) }
}

/// The segment's address and sizes.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `segment` or `out` is NULL.
///
/// # Safety
/// `segment` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_segment_info(
    segment: *const vmmw_segment_t,
    out: *mut vmmw_segment_info_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let s = unsafe { arg(segment, "segment") }?.lock();
        Ok(vmmw_segment_info_t {
            ptr: s.ptr(),
            reserved: s.reserved() as u64,
            committed: s.committed() as u64,
            mapped: s.mapped_bytes() as u64,
            chunks: s.chunks().len() as u64,
        })
    })
}

/// Copy `len` bytes from host memory `src` into the segment at `offset`, and
/// wait for the copy. The range must lie in the committed, mapped part.
///
/// Errors (on any of them nothing is copied):
/// - `VMMW_NULL_ARGUMENT`: `segment` is NULL, or `src` is NULL with `len` > 0.
/// - `VMMW_INVALID_ARGUMENT`: the range is outside the committed part, or
///   overflows.
/// - `VMMW_INVALID_STATE`: a chunk of the range is unmapped.
///
/// # Safety
/// `segment` is a live handle; `src` is readable for `len` bytes (may be NULL
/// when `len` is 0); `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_segment_write(
    segment: *mut vmmw_segment_t,
    offset: u64,
    src: *const c_void,
    len: usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let s = unsafe { arg(segment, "segment") }?.lock();
        // SAFETY: forwarded contract.
        let bytes = unsafe { slice_arg(src.cast(), len, "src") }?;
        let dst = checked_range(&s, offset, len)?;
        // SAFETY: `checked_range` verified the range is mapped; the lock keeps
        // it mapped for the duration of the copy.
        unsafe { copy_to_device(s.driver().as_ref(), dst, bytes) }
    })
}

/// Copy `len` bytes of the segment at `offset` into host memory `dst`, and
/// wait for the copy. Same range rules as `vmmw_segment_write`.
///
/// Errors (on any of them nothing is copied):
/// - `VMMW_NULL_ARGUMENT`: `segment` is NULL, or `dst` is NULL with `len` > 0.
/// - `VMMW_INVALID_ARGUMENT`: the range is outside the committed part, or
///   overflows.
/// - `VMMW_INVALID_STATE`: a chunk of the range is unmapped.
///
/// # Safety
/// `segment` is a live handle; `dst` is writable for `len` bytes (may be NULL
/// when `len` is 0); `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_segment_read(
    segment: *const vmmw_segment_t,
    offset: u64,
    dst: *mut c_void,
    len: usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let s = unsafe { arg(segment, "segment") }?.lock();
        // SAFETY: forwarded contract.
        let bytes = unsafe { bytes_mut_arg(dst.cast(), len, "dst") }?;
        let src = checked_range(&s, offset, len)?;
        // SAFETY: as in `vmmw_segment_write`.
        unsafe { copy_to_host(s.driver().as_ref(), bytes, src) }
    })
}

/// The device address of `[offset, offset+len)` after checking that it lies in
/// the committed part and that every chunk it touches is mapped.
fn checked_range(s: &Segment, offset: u64, len: usize) -> Result<u64> {
    let end = offset.checked_add(len as u64).ok_or_else(|| {
        Error::InvalidArgument(format!("range at offset {offset} of {len} bytes overflows"))
    })?;
    if end > s.committed() as u64 {
        return Err(Error::InvalidArgument(format!(
            "range [{offset}, {end}) exceeds the segment's {} committed bytes",
            s.committed()
        )));
    }
    let unmapped = s.chunks().iter().any(|c| {
        let (a, b) = (c.offset as u64, (c.offset + c.size) as u64);
        c.handle.is_none() && a < end && offset < b
    });
    if unmapped {
        return Err(Error::InvalidState(format!(
            "range [{offset}, {end}) touches memory that is not mapped (asleep)"
        )));
    }
    Ok(s.ptr() + offset)
}
