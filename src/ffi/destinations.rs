//! A loader's destinations, from C: parameters registered at the caller's
//! device pointers, names declared as filled elsewhere, destinations the
//! loader allocates from a pool, and reading them back.

use std::ffi::c_char;

use super::boundary::{arg, call, call_out, slice_arg, str_arg};
use super::buffer::write_str;
use super::error::vmmw_error_t;
use super::loader::{vmmw_loader_t, VMMW_MAX_DIMS};
use super::numbers::to_usize;
use super::pool::vmmw_pool_t;
use super::status::vmmw_status_t;
use crate::error::{Error, Result};
use crate::loader::Dtype;
use crate::tag::TagId;

/// One destination parameter.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_destination_t {
    /// Device address of element 0.
    pub ptr: u64,
    /// Bytes it spans.
    pub bytes: u64,
    /// Element type name ("BF16", "F32", ...), NUL-terminated.
    pub dtype: [c_char; 16],
    /// Number of dimensions (at most `VMMW_MAX_DIMS`).
    pub ndim: u32,
    /// The shape; entries past `ndim` are 0.
    pub shape: [u64; VMMW_MAX_DIMS],
}

fn parse_dtype(s: &str) -> Result<Dtype> {
    Dtype::parse(s).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "unknown dtype `{s}`: expected one of {}",
            Dtype::known_names()
        ))
    })
}

/// Register a destination parameter: `ndim` dimensions `shape` of `dtype`
/// ("BF16", "F16", "F32", ... or "bfloat16", "float16", "float32") at device
/// address `ptr`, contiguous, row-major. The memory stays the caller's; the
/// loader only writes it during `vmmw_loader_load`. The loader records now
/// which pool block holds `ptr` (any pool of this process), or that none
/// does: a later load refuses the destination with `VMMW_UNKNOWN_POINTER`
/// once that block is freed, even when the same address was handed out
/// again (register it again to load into the new block). An exact alias of a
/// registered destination (same `ptr`, dtype and shape: tied weights) is
/// accepted as that destination under a second name, filled from whichever
/// name the checkpoint has. Checked against the pool at load.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader`, `name` or `dtype` is NULL, or `shape` is
///   NULL with `ndim` > 0.
/// - `VMMW_INVALID_ARGUMENT`, nothing registered: `ndim` over 64 (refused
///   before `shape` is read); empty or duplicate name, unknown dtype, NULL
///   `ptr`, byte size overflowing or past the end of the address space,
///   overlap with another destination.
///
/// # Safety
/// `loader` is a live handle; `name` and `dtype` are NUL-terminated strings;
/// `shape` is readable for `ndim` entries (NULL when `ndim` is 0: a scalar);
/// `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_register(
    loader: *mut vmmw_loader_t,
    name: *const c_char,
    ptr: u64,
    dtype: *const c_char,
    shape: *const u64,
    ndim: usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        // SAFETY: forwarded contract.
        let name = unsafe { str_arg(name, "name") }?;
        // SAFETY: forwarded contract.
        let dtype = parse_dtype(unsafe { str_arg(dtype, "dtype") }?)?;
        // Refused before `shape` is read: a wrong `ndim` must not read past the array.
        if ndim > crate::loader::checkpoint::MAX_DIMS {
            return Err(Error::InvalidArgument(format!(
                "destination with {ndim} dimensions: at most {} are supported",
                crate::loader::checkpoint::MAX_DIMS
            )));
        }
        // SAFETY: forwarded contract (`shape` readable for `ndim` entries).
        let shape: &[u64] = unsafe { slice_arg(shape, ndim, "shape") }?;
        let shape = shape
            .iter()
            .map(|&d| to_usize(d, "shape"))
            .collect::<Result<Vec<_>>>()?;
        l.session.register(name, ptr, dtype, &shape)
    })
}

/// Declare `[ptr, ptr + bytes)` as device memory the caller owns outside the
/// pool loads run on (`cudaMalloc`'d, PyTorch's own allocator's). A load
/// checks every destination before writing anything: one touching the memory
/// of the pool passed to `vmmw_loader_load` must lie inside one live, awake
/// block of it (`VMMW_UNKNOWN_POINTER` in a free block, `VMMW_INVALID_ARGUMENT`
/// when it runs past its block, `VMMW_INVALID_STATE` when asleep), declared or
/// not; any other destination must lie wholly inside one range declared here
/// (else `VMMW_UNKNOWN_POINTER`, which also refuses memory of another pool).
/// Declaring each registered tensor's own range is safe: pool memory is
/// checked all the same.
///
/// What the caller guarantees for a declared range: whenever a load runs, it
/// is mapped, writable by the device, and still the memory the destinations
/// in it were registered in. The library sees no allocator but its own
/// pools: it refuses a declared destination only when its memory became a
/// pool block since registration; a range freed and reused by another
/// allocator (`cudaFree`, PyTorch's caching allocator) is written as if it
/// were still yours.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `ptr` is NULL, `bytes` is 0, or the range
///   overflows.
///
/// # Safety
/// `loader` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_declare_foreign(
    loader: *mut vmmw_loader_t,
    ptr: u64,
    bytes: u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        l.session.declare_foreign(ptr, bytes)
    })
}

/// Allocate every destination the rules produce from this checkpoint (names,
/// dtypes and shapes as the plan needs them: fused, sharded, padded) in
/// `pool` under `tag`, and register them. The blocks belong to the pool: find
/// them with `vmmw_loader_destination`, free them with `vmmw_pool_dealloc`
/// (or with the pool). Each destination records its block's identity, as
/// `vmmw_loader_register` does: once a block is freed, a later load refuses
/// that destination with `VMMW_UNKNOWN_POINTER`, also when the pool handed
/// the same address to a new owner.
///
/// Errors (on any of them nothing is registered and every block taken is
/// freed again):
/// - `VMMW_NULL_ARGUMENT`: `loader` or `pool` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
/// - `VMMW_PLAN_MISMATCH`: the rules give an overflowing shape, or parts that
///   do not fit.
/// - `VMMW_OUT_OF_MEMORY`.
/// - `VMMW_INVALID_STATE`: the tag is asleep.
///
/// # Safety
/// `loader` and `pool` are live handles; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_allocate(
    loader: *mut vmmw_loader_t,
    pool: *mut vmmw_pool_t,
    tag: u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        l.session.allocate(&p.pool, TagId(tag))
    })
}

/// Number of registered destinations.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader` or `out` is NULL.
///
/// # Safety
/// `loader` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_destination_count(
    loader: *const vmmw_loader_t,
    out: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        Ok(unsafe { arg(loader, "loader") }?
            .session
            .destination_count())
    })
}

/// The name of destination `index` (0 ≤ index < count, in name order), into
/// `buf` (buffer contract of `vmmw_device_describe`).
///
/// Errors (the last two are the buffer contract):
/// - `VMMW_NULL_ARGUMENT`: `loader` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `index` is not below the count.
/// - `VMMW_BUFFER_TOO_SMALL`: `cap` is short; `*needed` is set, nothing is
///   written to `buf`.
/// - `VMMW_NULL_ARGUMENT`: `buf` is NULL and `cap` > 0; nothing is written.
///
/// # Safety
/// `loader` is a live handle; `buf` is NULL or writable for `cap` bytes;
/// `needed` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_destination_name(
    loader: *const vmmw_loader_t,
    index: usize,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let dests = unsafe { arg(loader, "loader") }?.session.destinations();
        let n = dests.len();
        let d = dests.get(index).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "destination index {index} is not below the count {n}"
            ))
        })?;
        // SAFETY: forwarded contract.
        unsafe { write_str(&d.name, buf, cap, needed) }
    })
}

/// The destination named `name`.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader`, `name` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: no destination is registered under `name`, or
///   it has more than `VMMW_MAX_DIMS` dimensions.
///
/// # Safety
/// `loader` is a live handle; `name` is a NUL-terminated string; `out` is
/// writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_destination(
    loader: *const vmmw_loader_t,
    name: *const c_char,
    out: *mut vmmw_destination_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        // SAFETY: forwarded contract.
        let name = unsafe { str_arg(name, "name") }?;
        let d = l.session.destination(name).ok_or_else(|| {
            Error::InvalidArgument(format!("no destination `{name}` is registered"))
        })?;
        if d.shape.len() > VMMW_MAX_DIMS {
            return Err(Error::InvalidArgument(format!(
                "destination `{name}` has {} dimensions; vmmw_destination_t holds {VMMW_MAX_DIMS}",
                d.shape.len()
            )));
        }
        let mut out = vmmw_destination_t {
            ptr: d.ptr,
            bytes: d.bytes() as u64,
            dtype: [0; 16],
            ndim: d.shape.len() as u32,
            shape: [0; VMMW_MAX_DIMS],
        };
        for (o, &s) in out.shape.iter_mut().zip(&d.shape) {
            *o = s as u64;
        }
        for (o, b) in out.dtype.iter_mut().zip(d.dtype.name().bytes().take(15)) {
            *o = b as c_char;
        }
        Ok(out)
    })
}
