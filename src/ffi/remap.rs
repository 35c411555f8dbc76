//! Remap notices from C: a tag's epoch, and callbacks after each remap
//! (`pool::remap`), so an engine registers RDMA buffers again after a wake.

use std::ffi::c_void;
use std::sync::Arc;

use super::boundary::{call, call_out};
use super::error::vmmw_error_t;
use super::status::vmmw_status_t;
use crate::error::Error;
use crate::pool::remap;
use crate::tag::{self, TagId};

/// A remap callback: `user` as registered, the tag whose memory was mapped
/// anew, and its new epoch.
pub type vmmw_remap_fn = Option<unsafe extern "C" fn(user: *mut c_void, tag: u32, epoch: u64)>;

/// How many times `tag`'s physical memory was mapped anew in this process
/// (every wake, in any pool), into `*out`; 0 until its first wake. An engine
/// that registered the tag's memory with NCCL, NIXL or UCX registers it again
/// when this changed. Thread-safe.
///
/// Errors:
/// - `VMMW_UNKNOWN_TAG`: an id not from `vmmw_tag_id`.
/// - `VMMW_NULL_ARGUMENT`: `out` is NULL.
///
/// # Safety
/// `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_tag_remap_epoch(
    tag: u32,
    out: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        tag::check(TagId(tag))?;
        Ok(remap::epoch(TagId(tag)))
    })
}

/// Call `f(user, tag, epoch)` after every remap of any tag; the callback's id
/// goes to `*id` for `vmmw_remap_callback_remove`.
///
/// `f` runs on the thread that woke the tag (inside `vmmw_pool_wake` or a
/// replicas' wake), after the wake finished, with no lock of this library
/// held: it may call any `vmmw_` function, including removing itself. It must
/// not unwind (C++ exceptions, Go panics) into the library. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `f` or `id` is NULL.
///
/// # Safety
/// `f` stays callable and `user` valid for it until the callback is removed;
/// `id` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_remap_callback_add(
    f: vmmw_remap_fn,
    user: *mut c_void,
    id: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(id, "id", error, || {
        let f = f.ok_or(Error::NullArgument("f"))?;
        let user = user as usize;
        Ok(remap::on_remap(Arc::new(move |t: TagId, epoch: u64| {
            // SAFETY: the caller keeps `f` and `user` valid until removal.
            unsafe { f(user as *mut c_void, t.0, epoch) }
        })))
    })
}

/// Stop calling the callback `id`. When this returns no call of it starts
/// again and calls running on other threads have finished, so `user` may be
/// freed (a callback may remove itself; its own call goes on). Thread-safe.
///
/// Errors:
/// - `VMMW_INVALID_ARGUMENT`: no callback `id` is registered (never was, or
///   already removed).
///
/// # Safety
/// `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_remap_callback_remove(
    id: u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        if remap::remove(id) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "no remap callback {id} is registered"
            )))
        }
    })
}
