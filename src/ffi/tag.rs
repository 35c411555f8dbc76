//! Tags from C: a process-wide name registry and a per-OS-thread scope stack.
//! Every allocation gets the calling thread's current tag; sleep and wake act
//! per tag.

use std::ffi::c_char;

use super::boundary::{call, call_out, str_arg};
use super::buffer::write_str;
use super::error::vmmw_error_t;
use super::status::vmmw_status_t;
use crate::error::Error;
use crate::tag::{self, TagId};

/// The tag every allocation gets when no scope is open ("default").
pub const VMMW_TAG_DEFAULT: u32 = 0;

/// The id of tag `name`, registering it on first use; the same name always
/// gives the same id for the life of the process. Names are 1 to 64 bytes of
/// UTF-8 without control characters. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `name` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `name` is empty, over 64 bytes, not UTF-8, or
///   holds control characters.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_tag_id(
    name: *const c_char,
    out: *mut u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let name = unsafe { str_arg(name, "name") }?;
        Ok(tag::id(name)?.0)
    })
}

/// The name of a registered tag, into `buf` (the buffer contract of
/// `vmmw_device_describe`).
///
/// Errors (the last two are the buffer contract):
/// - `VMMW_UNKNOWN_TAG`: an id never handed out.
/// - `VMMW_BUFFER_TOO_SMALL`: `cap` is short; `*needed` is set, nothing is
///   written to `buf`.
/// - `VMMW_NULL_ARGUMENT`: `buf` is NULL and `cap` > 0; nothing is written.
///
/// # Safety
/// `buf` is NULL or writable for `cap` bytes; `needed` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_tag_name(
    tag: u32,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        let t = TagId(tag);
        tag::check(t)?;
        let name = t
            .name()
            .ok_or_else(|| Error::UnknownTag(format!("#{tag}")))?;
        // SAFETY: forwarded contract.
        unsafe { write_str(&name, buf, cap, needed) }
    })
}

/// Open a tag scope on the calling OS thread: allocations made by this thread
/// get `tag` until the matching `vmmw_tag_pop`. Scopes nest. (Go callers must
/// lock the goroutine to its thread for the scope; the Go binding does.)
///
/// Errors:
/// - `VMMW_UNKNOWN_TAG`: an id not from `vmmw_tag_id`.
///
/// # Safety
/// `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_tag_push(tag: u32, error: *mut *mut vmmw_error_t) -> vmmw_status_t {
    call(error, || tag::push(TagId(tag)))
}

/// Close the innermost tag scope of the calling OS thread.
///
/// Errors:
/// - `VMMW_INVALID_STATE`: no scope is open; nothing changes.
///
/// # Safety
/// `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_tag_pop(error: *mut *mut vmmw_error_t) -> vmmw_status_t {
    call(error, || tag::pop().map(|_| ()))
}

/// The tag allocations on the calling thread get now: the innermost scope,
/// else the process default.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `out` is NULL.
///
/// # Safety
/// `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_tag_current(
    out: *mut u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || Ok(tag::current().0))
}

/// Set the tag used by threads with no open scope (initially `VMMW_TAG_DEFAULT`).
///
/// Errors:
/// - `VMMW_UNKNOWN_TAG`: an id not from `vmmw_tag_id`.
///
/// # Safety
/// `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_tag_set_process_default(
    tag: u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || tag::set_process_default(TagId(tag)))
}
