//! The control channel from C: ask a process serving a control socket (a
//! program run under the CUDA runtime interposer, `vmmw exec`, or one that
//! called `vmmw_control_serve`) for its status, to sleep, or to wake
//! (docs/PRELOAD.md). Each call opens a connection, sends one request and
//! waits for its answer; a refusal comes back as the status the process
//! named (`VMMW_OUT_OF_MEMORY` for a wake without room), its reason in the
//! error object.

use std::ffi::c_char;

use super::boundary::{call, call_out, free_handle, into_handle, slice_arg, str_arg};
use super::buffer::write_str;
use super::error::vmmw_error_t;
use super::sleep::{
    vmmw_policy_t, VMMW_POLICY_DISCARD, VMMW_POLICY_OFFLOAD, VMMW_POLICY_OFFLOAD_COMPRESSED,
    VMMW_POLICY_RELOAD,
};
use super::status::vmmw_status_t;
use crate::control::{
    Client, ControlOptions, CycleAnswer, ProcessPools, Request, Server, WirePolicy,
};
use crate::error::{Error, Result};

/// What a sleep or wake through a control socket did (`vmmw_control_sleep`,
/// `vmmw_control_wake`). The whole answer, each tag included, is the
/// `"last"` field of the next `vmmw_control_status`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_control_result_t {
    /// Wall time of the call in the process, in seconds.
    pub seconds: f64,
    /// Of it, the synchronization of every device before a sleep (0 for a wake).
    pub sync_seconds: f64,
    /// Of it, a wake's wait for memory (0 for a sleep).
    pub wait_seconds: f64,
    /// Physical device bytes released (sleep) or mapped again (wake).
    pub bytes: u64,
    /// Bytes the host backups hold after a sleep, or restored from them by a wake.
    pub backup_bytes: u64,
}

impl From<&CycleAnswer> for vmmw_control_result_t {
    fn from(a: &CycleAnswer) -> Self {
        vmmw_control_result_t {
            seconds: a.seconds,
            sync_seconds: a.sync_seconds,
            wait_seconds: a.wait_seconds,
            bytes: a.bytes,
            backup_bytes: a.backup_bytes,
        }
    }
}

/// A control socket this process serves over its default pools
/// (`vmmw_control_serve`). Free with `vmmw_control_server_free`.
pub struct vmmw_control_server_t {
    _server: Server,
}

/// The control channel's policy for a `vmmw_policy_t`: offload, discard or
/// offload-compressed. Reload is refused (a controlled process has no
/// checkpoint the library loaded). Shared with the interposer's
/// `vmmw_preload_sleep`.
pub fn wire_policy(p: vmmw_policy_t) -> Result<WirePolicy> {
    match p {
        VMMW_POLICY_OFFLOAD => Ok(WirePolicy::Offload),
        VMMW_POLICY_OFFLOAD_COMPRESSED => Ok(WirePolicy::OffloadCompressed),
        VMMW_POLICY_DISCARD => Ok(WirePolicy::Discard),
        VMMW_POLICY_RELOAD => Err(Error::InvalidArgument(
            "policy VMMW_POLICY_RELOAD: a controlled process sleeps with offload, \
             offload-compressed or discard (it has no checkpoint the library loaded)"
                .into(),
        )),
        other => Err(Error::InvalidArgument(format!("unknown policy {other}"))),
    }
}

/// The tag names of a C array (`n` 0: every tag, `None`). Shared with the
/// interposer's `vmmw_preload_sleep` and `vmmw_preload_wake`.
///
/// # Safety
/// `tags` is NULL with `n` 0, or points to `n` NUL-terminated strings.
pub unsafe fn tag_names(tags: *const *const c_char, n: usize) -> Result<Option<Vec<String>>> {
    if n == 0 {
        return Ok(None);
    }
    // SAFETY: forwarded contract.
    let ptrs = unsafe { slice_arg(tags, n, "tags") }?;
    let mut names = Vec::with_capacity(n);
    for &p in ptrs {
        // SAFETY: forwarded contract.
        names.push(unsafe { str_arg(p, "tags[i]") }?.to_owned());
    }
    Ok(Some(names))
}

/// The status of the process serving the control socket at `socket`, as
/// the JSON the socket answers (docs/PRELOAD.md): its pid, state
/// (`awake`, `asleep`, `sleeping`, `waking`), each tag of each device,
/// each device's memory, the host backup, the last sleep or wake.
/// Copied into `buf` with the `buf`/`cap`/`*needed` contract of every
/// string this library returns (`*needed` includes the NUL; the status is
/// read anew at each call, so ask with room to spare).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `socket` is NULL, or `buf` NULL with `cap` > 0.
/// - `VMMW_IO`: nobody serves `socket` (missing, refused, not a socket), or
///   no answer within 30 seconds.
/// - `VMMW_BUFFER_TOO_SMALL`: `*needed` says how much room the answer needs.
/// - the status the process refused with (`VMMW_SHARE_REFUSED`: this user is
///   not allowed on its socket; `VMMW_INVALID_STATE`: the answer is not one
///   of a vmmweights control socket).
///
/// # Safety
/// `socket` is a NUL-terminated string; `buf` is NULL or writable for `cap`
/// bytes; `needed` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_control_status(
    socket: *const c_char,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let socket = unsafe { str_arg(socket, "socket") }?;
        if buf.is_null() && cap != 0 {
            return Err(Error::NullArgument("buf"));
        }
        let v = Client::connect(socket)?.request(&crate::control::Request::Status {})?;
        // SAFETY: forwarded contract.
        unsafe { write_str(&v.to_string(), buf, cap, needed) }
    })
}

/// Ask the process serving `socket` to synchronize every device it used
/// and sleep its tags (the `n_tags` names in `tags`, or every tag when
/// `n_tags` is 0) with `policy` (`VMMW_POLICY_OFFLOAD`,
/// `VMMW_POLICY_OFFLOAD_COMPRESSED` or `VMMW_POLICY_DISCARD`). On success
/// `*result`, when `result` is not NULL, receives the figures. Waits for the
/// answer up to 10 minutes.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `socket`, or `tags` with `n_tags` > 0, or one of its strings is NULL.
/// - `VMMW_INVALID_ARGUMENT`: an unknown policy, or `VMMW_POLICY_RELOAD`, or
///   a tag that is no tag name (empty, over 64 bytes, control characters);
///   refused before `socket` is reached.
/// - `VMMW_IO`: nobody serves `socket`, or no answer in time.
/// - the status the process refused with: `VMMW_UNKNOWN_TAG` (a tag it does
///   not hold), `VMMW_INVALID_STATE` (nothing allocated yet, a sleep or wake
///   running), `VMMW_DRIVER_ERROR` (a device failed to synchronize: nothing
///   slept), `VMMW_HOST_OUT_OF_MEMORY` (no room for the backup),
///   `VMMW_SHARE_REFUSED` (this user is not allowed on its socket).
///
/// # Safety
/// `socket` is a NUL-terminated string; `tags` is NULL with `n_tags` 0 or
/// points to `n_tags` NUL-terminated strings; `result` and `error` are NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_control_sleep(
    socket: *const c_char,
    policy: vmmw_policy_t,
    tags: *const *const c_char,
    n_tags: usize,
    result: *mut vmmw_control_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let socket = unsafe { str_arg(socket, "socket") }?;
        let policy = wire_policy(policy)?;
        // SAFETY: forwarded contract.
        let tags = unsafe { tag_names(tags, n_tags) }?;
        // Bad arguments are refused here, whoever serves the path.
        Request::Sleep {
            policy,
            tags: tags.clone(),
        }
        .check()?;
        let a = Client::connect(socket)?.sleep(policy, tags)?;
        if !result.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { result.write((&a).into()) };
        }
        Ok(())
    })
}

/// Ask the process serving `socket` to wake its asleep tags (the `n_tags`
/// names in `tags`, or every asleep tag when `n_tags` is 0). With
/// `wait_memory_ms` > 0 it waits up to that long for device memory another
/// process or tag is releasing; with 0 it refuses at once when memory is
/// short. On success `*result`, when `result` is not NULL, receives the
/// figures. A wake that fails leaves the process asleep with every backup
/// intact.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `socket`, or `tags` with `n_tags` > 0, or one of its strings is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `wait_memory_ms` over one hour, or a tag that
///   is no tag name; refused before `socket` is reached.
/// - `VMMW_IO`: nobody serves `socket`, or no answer in time.
/// - the status the process refused with: `VMMW_OUT_OF_MEMORY` (no room,
///   also after the wait), `VMMW_UNKNOWN_TAG`, `VMMW_INVALID_STATE`,
///   `VMMW_DRIVER_ERROR`, `VMMW_SHARE_REFUSED`.
///
/// # Safety
/// As `vmmw_control_sleep`.
#[no_mangle]
pub unsafe extern "C" fn vmmw_control_wake(
    socket: *const c_char,
    wait_memory_ms: u64,
    tags: *const *const c_char,
    n_tags: usize,
    result: *mut vmmw_control_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let socket = unsafe { str_arg(socket, "socket") }?;
        // SAFETY: forwarded contract.
        let tags = unsafe { tag_names(tags, n_tags) }?;
        let wait = (wait_memory_ms > 0).then_some(wait_memory_ms);
        Request::Wake {
            tags: tags.clone(),
            wait_memory_ms: wait,
        }
        .check()?;
        let a = Client::connect(socket)?.wake(tags, wait)?;
        if !result.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { result.write((&a).into()) };
        }
        Ok(())
    })
}

/// Serve a control socket at `socket` (which must not exist) over this
/// process's default pools (those of `vmmw_pool_default`, every device),
/// so `vmmw ctl`, `vmmw_control_*` and a service can sleep and wake this
/// process as they do one under the interposer. Peers must run as this
/// process's user. A sleep synchronizes each device through the pool's
/// driver first. On success `*out` receives the server, owned by the
/// caller; it answers on threads of its own until `vmmw_control_server_free`.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `socket` or `out` is NULL.
/// - `VMMW_IO`: `socket` exists or cannot be bound.
///
/// # Safety
/// `socket` is a NUL-terminated string; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_control_serve(
    socket: *const c_char,
    out: *mut *mut vmmw_control_server_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let socket = unsafe { str_arg(socket, "socket") }?;
        let target = std::sync::Arc::new(ProcessPools::registry(None));
        let server = Server::start(socket, target, ControlOptions::default())?;
        Ok(into_handle(vmmw_control_server_t { _server: server }))
    })
}

/// Stop serving: no connection is accepted from here on, open ones are
/// closed once a sleep or wake running has answered (this waits for it),
/// and the socket file is removed if it is still the one bound. NULL is a
/// no-op.
///
/// # Safety
/// `server` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vmmw_control_server_free(server: *mut vmmw_control_server_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(server) }
}
