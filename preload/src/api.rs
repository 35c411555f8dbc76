//! The interposer's own C functions, `vmmw_preload_*`: what a process (or a
//! layer over this library, such as torch_memory_saver's preload mode)
//! calls from inside. Declared in `include/vmmw_preload.h` (cbindgen).
//!
//! Every function returns a status with the numbers of `vmmw_status_t`
//! (`include/vmmweights.h`: 0 is `VMMW_OK`) unless it says otherwise,
//! never unwinds (a panic returns `VMMW_PANIC`, 14), and checks its
//! pointers (`VMMW_NULL_ARGUMENT`, 2). Any thread may call any of them.
//! Why a sleep or wake was refused is the `"last"` field of
//! `vmmw_preload_status`.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use vmmweights::ffi::buffer::write_str;
use vmmweights::ffi::control::{tag_names, wire_policy};
use vmmweights::{Error, Result, Status};

use crate::inproc;
use crate::served;

/// A status: the numbers of `vmmw_status_t` in `vmmweights.h` (0: success).
pub type vmmw_preload_status_t = i32;

fn call(body: impl FnOnce() -> Result<()>) -> vmmw_preload_status_t {
    match catch_unwind(AssertUnwindSafe(|| {
        served::serve_on_first_call();
        body()
    })) {
        Ok(Ok(())) => Status::Ok as i32,
        Ok(Err(e)) => e.status() as i32,
        Err(_) => Status::Panic as i32,
    }
}

/// Allocations of the calling thread go under the tag named `name` from now
/// on (registered on first use); NULL returns to the process's tag
/// (`VMMW_PRELOAD_TAG`, default `process`). Tags are what a sleep or wake
/// can name one by one.
///
/// Errors: `VMMW_INVALID_ARGUMENT` (1): `name` is empty, longer than 64
/// bytes, not UTF-8 or has control characters; nothing changes.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn vmmw_preload_set_tag(name: *const c_char) -> vmmw_preload_status_t {
    call(|| {
        let name = if name.is_null() {
            None
        } else {
            // SAFETY: non-NULL and NUL-terminated per the contract.
            let s = unsafe { CStr::from_ptr(name) };
            Some(
                s.to_str()
                    .map_err(|e| Error::InvalidArgument(format!("tag name is not UTF-8: {e}")))?,
            )
        };
        inproc::set_tag(name)
    })
}

/// The name of the tag the calling thread's allocations get, copied into
/// `buf` with the `buf`/`cap`/`*needed` contract of `vmmweights.h`
/// (`*needed` counts the NUL; `VMMW_BUFFER_TOO_SMALL`, 16, writes nothing
/// to `buf`).
///
/// # Safety
/// `buf` is NULL or writable for `cap` bytes; `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_preload_get_tag(
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> vmmw_preload_status_t {
    // SAFETY: forwarded contract.
    call(|| unsafe { write_str(&inproc::tag_name(), buf, cap, needed) })
}

/// Enter (`enabled` non-zero) or leave (0) a region on the calling thread.
/// Under `VMMW_PRELOAD_SCOPE=region`, only allocations of threads inside a
/// region are ours; the rest go to the CUDA runtime. Under `all` it is
/// recorded and changes nothing.
#[no_mangle]
pub extern "C" fn vmmw_preload_set_region(enabled: i32) -> vmmw_preload_status_t {
    call(|| {
        inproc::set_region(enabled != 0);
        Ok(())
    })
}

/// 1 when the calling thread is inside a region, else 0 (its own choice, or
/// `VMMW_PRELOAD_REGION_DEFAULT` until it made one). Returns no status.
#[no_mangle]
pub extern "C" fn vmmw_preload_region() -> i32 {
    catch_unwind(|| i32::from(inproc::region())).unwrap_or(0)
}

/// Synchronize every device the process used (the runtime's
/// `cudaDeviceSynchronize`, on the calling thread, whose device is put back)
/// and sleep its tags with `policy` (`VMMW_POLICY_OFFLOAD` 0,
/// `VMMW_POLICY_DISCARD` 1, `VMMW_POLICY_OFFLOAD_COMPRESSED` 3): the `n_tags`
/// names in `tags`, or every tag when `n_tags` is 0. Pointers stay valid;
/// the process must not touch the memory (no kernel, no copy) until the
/// wake: it faults. The same operation as the control socket's; one sleep
/// or wake runs at a time.
///
/// Errors: `VMMW_INVALID_ARGUMENT` (a policy other than those, reload
/// included), `VMMW_UNKNOWN_TAG` (a name that holds no memory here),
/// `VMMW_INVALID_STATE` (nothing allocated yet, another sleep or wake
/// running, or the interposer passing everything to the runtime),
/// `VMMW_DRIVER_ERROR` (a device failed to synchronize: nothing slept),
/// `VMMW_HOST_OUT_OF_MEMORY` (no room for the backup).
///
/// # Safety
/// `tags` is NULL with `n_tags` 0, or points to `n_tags` NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn vmmw_preload_sleep(
    policy: i32,
    tags: *const *const c_char,
    n_tags: usize,
) -> vmmw_preload_status_t {
    call(|| {
        let policy = wire_policy(policy)?;
        // SAFETY: forwarded contract.
        let tags = unsafe { tag_names(tags, n_tags) }?;
        inproc::sleep(policy, tags.as_deref()).map(|_| ())
    })
}

/// Wake the process's asleep tags (the `n_tags` names in `tags`, or every
/// asleep tag when `n_tags` is 0), waiting up to `wait_memory_ms` for device
/// memory being released (0: refuse at once when it is short). A failed
/// wake leaves every tag asleep with its backup intact.
///
/// Errors: `VMMW_OUT_OF_MEMORY` (3: no room, also after the wait),
/// `VMMW_INVALID_ARGUMENT` (a wait over one hour), `VMMW_UNKNOWN_TAG`,
/// `VMMW_INVALID_STATE`, `VMMW_DRIVER_ERROR`.
///
/// # Safety
/// As `vmmw_preload_sleep`.
#[no_mangle]
pub unsafe extern "C" fn vmmw_preload_wake(
    wait_memory_ms: u64,
    tags: *const *const c_char,
    n_tags: usize,
) -> vmmw_preload_status_t {
    call(|| {
        // SAFETY: forwarded contract.
        let tags = unsafe { tag_names(tags, n_tags) }?;
        let wait = vmmweights::control::protocol::wait_of(Some(wait_memory_ms));
        if wait_memory_ms > vmmweights::control::protocol::MAX_WAIT_MEMORY_MS {
            return Err(Error::InvalidArgument(format!(
                "wait_memory_ms {wait_memory_ms} is over the limit of one hour"
            )));
        }
        inproc::wake(tags.as_deref(), wait).map(|_| ())
    })
}

/// The status the control socket answers (JSON: state, each tag of each
/// device, each device's memory, the last sleep or wake, the interposer's
/// counts), copied into `buf` with the `buf`/`cap`/`*needed` contract.
///
/// # Safety
/// `buf` is NULL or writable for `cap` bytes; `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_preload_status(
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> vmmw_preload_status_t {
    call(|| {
        if buf.is_null() && cap != 0 {
            return Err(Error::NullArgument("buf"));
        }
        let s = inproc::status()?;
        let text = serde_json::to_string(&s)
            .map_err(|e| Error::InvalidState(format!("status is not JSON: {e}")))?;
        // SAFETY: forwarded contract.
        unsafe { write_str(&text, buf, cap, needed) }
    })
}
