//! The panic boundary and argument helpers every `vmmw_*` entry point uses.
//!
//! `call` runs a body under `catch_unwind`, turns an `Err` or a panic into a
//! status code, and hands the error object to the caller when it asked for one.
//! `call_out` does the same and writes the out-parameter only on success, after
//! checking it for NULL before the body runs (so a NULL out-pointer changes
//! nothing).

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::error::vmmw_error_t;
use super::status::{vmmw_status_t, VMMW_OK};
use crate::error::{Error, Result};

/// Run `body`; return `VMMW_OK` or the error's status, storing the error
/// object into `*error` when `error` is non-NULL.
pub(crate) fn call(
    error: *mut *mut vmmw_error_t,
    body: impl FnOnce() -> Result<()>,
) -> vmmw_status_t {
    let outcome = catch_unwind(AssertUnwindSafe(body))
        .unwrap_or_else(|p| Err(Error::Panic(crate::error::panic_message(&*p))));
    match outcome {
        Ok(()) => VMMW_OK,
        Err(e) => report(error, &e),
    }
}

/// As [`call`], and write the value `body` returns into `*out` on success.
/// `out` is checked for NULL (named `out_name` in the message) before `body` runs.
pub(crate) fn call_out<T>(
    out: *mut T,
    out_name: &'static str,
    error: *mut *mut vmmw_error_t,
    body: impl FnOnce() -> Result<T>,
) -> vmmw_status_t {
    call(error, || {
        if out.is_null() {
            return Err(Error::NullArgument(out_name));
        }
        let value = body()?;
        // SAFETY: `out` is non-NULL and, per every entry point's contract,
        // points to writable storage for a `T`.
        unsafe { out.write(value) };
        Ok(())
    })
}

/// Store `e` into `*error` (when asked) and return its status. Never panics
/// out: a failure to build the object (allocation) just leaves `*error` as is.
fn report(error: *mut *mut vmmw_error_t, e: &Error) -> vmmw_status_t {
    let status = e.status() as i32;
    if !error.is_null() {
        if let Ok(obj) = catch_unwind(AssertUnwindSafe(|| vmmw_error_t::from_error(e))) {
            // SAFETY: `error` is non-NULL and points to a writable `vmmw_error_t*`
            // (the documented contract of every `error` argument).
            unsafe { error.write(Box::into_raw(Box::new(obj))) };
        }
    }
    status
}

/// Borrow `*p`, or fail with `NullArgument(name)`.
///
/// # Safety
/// `p` is NULL or points to a live `T` that outlives `'a` and is not mutated meanwhile.
pub(crate) unsafe fn arg<'a, T>(p: *const T, name: &'static str) -> Result<&'a T> {
    // SAFETY: forwarded from the caller.
    unsafe { p.as_ref() }.ok_or(Error::NullArgument(name))
}

/// Borrow a NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, name: &'static str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::NullArgument(name));
    }
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str()
        .map_err(|e| Error::InvalidArgument(format!("`{name}` is not valid UTF-8: {e}")))
}

/// Borrow `len` elements at `p` (`p` may be NULL only when `len` is 0).
///
/// # Safety
/// `p` points to `len` readable elements that outlive `'a` (or `len` is 0).
pub(crate) unsafe fn slice_arg<'a, T>(
    p: *const T,
    len: usize,
    name: &'static str,
) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::NullArgument(name));
    }
    // SAFETY: non-NULL and valid for `len` elements per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// Borrow `len` writable bytes at `p` (`p` may be NULL only when `len` is 0).
///
/// # Safety
/// `p` points to `len` writable bytes, not aliased, that outlive `'a` (or `len` is 0).
pub(crate) unsafe fn bytes_mut_arg<'a>(
    p: *mut u8,
    len: usize,
    name: &'static str,
) -> Result<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Error::NullArgument(name));
    }
    // SAFETY: non-NULL, valid and unaliased for `len` bytes per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// Move `value` into a new heap handle for C (freed by the matching `_free`).
pub(crate) fn into_handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Drop a handle created by [`into_handle`]; NULL is ignored.
///
/// # Safety
/// `p` is NULL or came from `into_handle::<T>` and is not used afterwards.
pub(crate) unsafe fn free_handle<T>(p: *mut T) {
    if !p.is_null() {
        // A panic in a destructor must not unwind into C; the memory is then leaked.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: from `Box::into_raw` in `into_handle`, freed once.
            drop(unsafe { Box::from_raw(p) })
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::error::{vmmw_error_free, vmmw_error_message, vmmw_error_status};
    use crate::ffi::status::*;

    #[test]
    fn panic_becomes_status_and_message() {
        let mut err: *mut vmmw_error_t = std::ptr::null_mut();
        let rc = call(&mut err, || panic!("boom in test"));
        assert_eq!(rc, VMMW_PANIC);
        assert!(!err.is_null());
        // SAFETY: `err` was just returned by `call`.
        unsafe {
            assert_eq!(vmmw_error_status(err), VMMW_PANIC);
            let msg = CStr::from_ptr(vmmw_error_message(err)).to_str().unwrap();
            assert!(msg.contains("boom in test"), "{msg}");
            vmmw_error_free(err);
        }
    }

    #[test]
    fn out_is_untouched_on_failure_and_null_out_is_refused() {
        let mut out = 7u32;
        let rc = call_out(&mut out, "out", std::ptr::null_mut(), || {
            Err(Error::InvalidArgument("no".into()))
        });
        assert_eq!(rc, VMMW_INVALID_ARGUMENT);
        assert_eq!(out, 7);

        let mut ran = false;
        let mut err: *mut vmmw_error_t = std::ptr::null_mut();
        let rc = call_out(std::ptr::null_mut::<u32>(), "out", &mut err, || {
            ran = true;
            Ok(1)
        });
        assert_eq!(rc, VMMW_NULL_ARGUMENT);
        assert!(!ran, "the body must not run when the out-pointer is NULL");
        // SAFETY: returned by `call_out`.
        unsafe {
            let msg = CStr::from_ptr(vmmw_error_message(err)).to_str().unwrap();
            assert!(msg.contains("`out`"), "{msg}");
            vmmw_error_free(err);
        }

        let rc = call_out(&mut out, "out", std::ptr::null_mut(), || Ok(9));
        assert_eq!(rc, VMMW_OK);
        assert_eq!(out, 9);
    }

    #[test]
    fn nul_in_message_is_replaced() {
        let mut err: *mut vmmw_error_t = std::ptr::null_mut();
        let rc = call(&mut err, || Err(Error::InvalidArgument("a\0b".into())));
        assert_eq!(rc, VMMW_INVALID_ARGUMENT);
        // SAFETY: returned by `call`.
        unsafe {
            let msg = CStr::from_ptr(vmmw_error_message(err)).to_str().unwrap();
            assert!(msg.ends_with("a\u{FFFD}b"), "{msg}");
            vmmw_error_free(err);
        }
    }
}
