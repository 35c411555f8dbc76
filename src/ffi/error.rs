//! The error object handed to C callers: a status and an owned message.
//!
//! Each failing call creates its own object (no thread-local "last error"), so
//! a caller whose work migrates between OS threads (a Go goroutine) always
//! reads the message of its own call.

use std::ffi::{c_char, CString};

use super::status::vmmw_status_t;

use crate::error::Error;

/// An error returned through a `vmmw_error_t** error` argument.
///
/// Owned by the caller once returned; free it with `vmmw_error_free`. Immutable,
/// so it may be read from any thread.
pub struct vmmw_error_t {
    status: vmmw_status_t,
    message: CString,
    /// The driver's code of a `VMMW_DRIVER_ERROR`; 0 otherwise.
    driver_code: i32,
}

impl vmmw_error_t {
    /// The C error object for `e`. Interior NUL bytes in the message (which
    /// cannot occur in our own messages, but may in a path) become U+FFFD.
    pub(crate) fn from_error(e: &Error) -> vmmw_error_t {
        let text = e.to_string().replace('\0', "\u{FFFD}");
        vmmw_error_t {
            status: e.status() as vmmw_status_t,
            // The replacement above removed every NUL, so this cannot fail;
            // fall back to an empty message rather than panicking.
            message: CString::new(text).unwrap_or_default(),
            driver_code: match e {
                Error::Driver { code, .. } => *code,
                _ => 0,
            },
        }
    }
}

/// The message of `error`: UTF-8, NUL-terminated, never NULL.
///
/// The string is owned by `error` and valid until `vmmw_error_free(error)`.
/// Returns "" when `error` is NULL. Thread-safe.
///
/// Errors: none. NULL gives "".
///
/// # Safety
/// `error` is NULL or an object returned through a `vmmw_error_t**` argument
/// and not yet freed.
#[no_mangle]
pub unsafe extern "C" fn vmmw_error_message(error: *const vmmw_error_t) -> *const c_char {
    // SAFETY: the caller passes NULL or a live error object.
    match unsafe { error.as_ref() } {
        Some(e) => e.message.as_ptr(),
        None => c"".as_ptr(),
    }
}

/// The status code of `error` (a `VMMW_*` value); `VMMW_NULL_ARGUMENT` when
/// `error` is NULL. Thread-safe.
///
/// Errors: none. NULL gives `VMMW_NULL_ARGUMENT`.
///
/// # Safety
/// As `vmmw_error_message`.
#[no_mangle]
pub unsafe extern "C" fn vmmw_error_status(error: *const vmmw_error_t) -> vmmw_status_t {
    // SAFETY: the caller passes NULL or a live error object.
    match unsafe { error.as_ref() } {
        Some(e) => e.status,
        None => super::status::VMMW_NULL_ARGUMENT,
    }
}

/// The driver's own code behind `error`: the `CUresult` of the failed CUDA
/// call on the cuda backend, the `errno` on the host backend; 0 when `error`
/// is not a driver error (its status is not `VMMW_DRIVER_ERROR`) or is NULL.
/// Thread-safe.
///
/// Errors: none. NULL gives 0.
///
/// # Safety
/// As `vmmw_error_message`.
#[no_mangle]
pub unsafe extern "C" fn vmmw_error_driver_code(error: *const vmmw_error_t) -> i32 {
    // SAFETY: the caller passes NULL or a live error object.
    unsafe { error.as_ref() }.map_or(0, |e| e.driver_code)
}

/// Free an error object. NULL is accepted and ignored.
///
/// Errors: none. NULL is ignored. An object already freed cannot be detected
/// (undefined behaviour).
///
/// # Safety
/// `error` is NULL or an object returned through a `vmmw_error_t**` argument,
/// not yet freed; it must not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vmmw_error_free(error: *mut vmmw_error_t) {
    if !error.is_null() {
        // SAFETY: created by `Box::into_raw` in `boundary::report`, freed once.
        drop(unsafe { Box::from_raw(error) });
    }
}
