//! `vmmw_device_t`: an opened backend (CUDA or the host simulation) for one device.
//!
//! Opening one picks the backend; pools and segments made from it keep the
//! driver alive on their own, so the handle may be freed before them.

use std::ffi::c_char;
use std::sync::Arc;

use super::boundary::{arg, call, call_out, free_handle, into_handle};
use super::buffer::write_str;
use super::error::vmmw_error_t;
use super::status::vmmw_status_t;
use crate::driver::{self, BackendChoice, BackendKind, Driver, Opened};
use crate::error::{Error, Result};

/// Which implementation opens a device: one of the `VMMW_BACKEND_*` values.
pub type vmmw_backend_t = i32;

/// Backend choice: the `VMMW_BACKEND` environment variable when set ("host",
/// "cuda", "auto"), else CUDA when a driver and the device are present, else host.
pub const VMMW_BACKEND_AUTO: vmmw_backend_t = 0;
/// The host simulation of CUDA VMM (no GPU needed).
pub const VMMW_BACKEND_HOST: vmmw_backend_t = 1;
/// The CUDA driver; opening fails with `VMMW_DRIVER_UNAVAILABLE` without one.
pub const VMMW_BACKEND_CUDA: vmmw_backend_t = 2;

/// An opened backend for one device. Thread-safe: every function taking a
/// device may be called concurrently, except `vmmw_device_free`.
pub struct vmmw_device_t {
    opened: Opened,
}

impl vmmw_device_t {
    /// The driver behind this handle.
    pub(crate) fn driver(&self) -> &Arc<dyn Driver> {
        &self.opened.driver
    }
}

pub(crate) fn backend_choice(backend: vmmw_backend_t) -> Result<BackendChoice> {
    match backend {
        VMMW_BACKEND_AUTO => BackendChoice::from_env(),
        VMMW_BACKEND_HOST => Ok(BackendChoice::Host),
        VMMW_BACKEND_CUDA => Ok(BackendChoice::Cuda),
        other => Err(Error::InvalidArgument(format!(
            "backend {other} is not one of VMMW_BACKEND_AUTO (0), VMMW_BACKEND_HOST (1), VMMW_BACKEND_CUDA (2)"
        ))),
    }
}

/// Open `backend` (a `VMMW_BACKEND_*` value) for CUDA device ordinal `device`.
///
/// On success `*out` receives a new handle owned by the caller (free it with
/// `vmmw_device_free`). Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: unknown backend, negative device, or bad
///   `VMMW_BACKEND`/`VMMW_HOST_*` environment variables.
/// - `VMMW_DRIVER_UNAVAILABLE`: CUDA requested but unusable.
///
/// # Safety
/// `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_device_open(
    backend: vmmw_backend_t,
    device: i32,
    out: *mut *mut vmmw_device_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        let choice = backend_choice(backend)?;
        if device < 0 {
            return Err(Error::InvalidArgument(format!(
                "device ordinal {device} must not be negative"
            )));
        }
        let opened = driver::open(choice, device)?;
        Ok(into_handle(vmmw_device_t { opened }))
    })
}

/// Free a device handle. NULL is accepted. Pools and segments created from it
/// stay valid (they hold the driver themselves).
///
/// Errors: none. NULL is ignored. A handle already freed, or not from this
/// library, cannot be detected (undefined behaviour).
///
/// # Safety
/// `device` is NULL or a live handle from `vmmw_device_open`, not used
/// afterwards and not concurrently.
#[no_mangle]
pub unsafe extern "C" fn vmmw_device_free(device: *mut vmmw_device_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(device) }
}

/// The backend behind `device`: `VMMW_BACKEND_HOST` or `VMMW_BACKEND_CUDA`.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `device` or `out` is NULL.
///
/// # Safety
/// `device` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_device_backend(
    device: *const vmmw_device_t,
    out: *mut vmmw_backend_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        Ok(match d.driver().kind() {
            BackendKind::Host => VMMW_BACKEND_HOST,
            BackendKind::Cuda => VMMW_BACKEND_CUDA,
        })
    })
}

/// The mapping granularity in bytes (2 MiB on an H200 and by default on host):
/// every reservation and physical allocation is a multiple of it.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `device` or `out` is NULL.
///
/// # Safety
/// `device` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_device_granularity(
    device: *const vmmw_device_t,
    out: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        Ok(d.driver().granularity() as u64)
    })
}

/// Free and total device memory in bytes (`cuMemGetInfo`, or the host backend's limit).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `device`, `free_bytes` or `total_bytes` is NULL;
///   nothing is written.
///
/// # Safety
/// `device` is a live handle; `free_bytes` and `total_bytes` are writable;
/// `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_device_mem_info(
    device: *const vmmw_device_t,
    free_bytes: *mut u64,
    total_bytes: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(free_bytes, "free_bytes", error, || {
        if total_bytes.is_null() {
            return Err(Error::NullArgument("total_bytes"));
        }
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        let info = d.driver().mem_info()?;
        // SAFETY: checked non-NULL above; writable per the contract. Written
        // only now that the call has succeeded.
        unsafe { total_bytes.write(info.total) };
        Ok(info.free)
    })
}

/// A human-readable description of the device ("NVIDIA H200 (cuda, device 0)").
///
/// Copies the text and a NUL into `buf[0..cap)`. `*needed` (when `needed` is
/// not NULL) receives the size required including the NUL, also on
/// `VMMW_BUFFER_TOO_SMALL`; pass `buf` NULL and `cap` 0 to query it.
///
/// Errors (the last two are the buffer contract):
/// - `VMMW_NULL_ARGUMENT`: `device` is NULL.
/// - `VMMW_BUFFER_TOO_SMALL`: `cap` is short; `*needed` is set, nothing is
///   written to `buf`.
/// - `VMMW_NULL_ARGUMENT`: `buf` is NULL and `cap` > 0; nothing is written.
///
/// # Safety
/// `device` is a live handle; `buf` is NULL or writable for `cap` bytes;
/// `needed` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_device_describe(
    device: *const vmmw_device_t,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        // SAFETY: forwarded contract.
        unsafe { write_str(&d.driver().describe(), buf, cap, needed) }
    })
}

/// Why this backend was chosen (useful with `VMMW_BACKEND_AUTO`), into a
/// buffer with the same contract as `vmmw_device_describe`.
///
/// Errors (the last two are the buffer contract):
/// - `VMMW_NULL_ARGUMENT`: `device` is NULL.
/// - `VMMW_BUFFER_TOO_SMALL`: `cap` is short; `*needed` is set, nothing is
///   written to `buf`.
/// - `VMMW_NULL_ARGUMENT`: `buf` is NULL and `cap` > 0; nothing is written.
///
/// # Safety
/// As `vmmw_device_describe`.
#[no_mangle]
pub unsafe extern "C" fn vmmw_device_choice_reason(
    device: *const vmmw_device_t,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        // SAFETY: forwarded contract.
        unsafe { write_str(&d.opened.reason, buf, cap, needed) }
    })
}

/// Wait until all work queued on the device has finished.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `device` is NULL.
///
/// # Safety
/// `device` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_device_synchronize(
    device: *const vmmw_device_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        d.driver().synchronize()
    })
}
