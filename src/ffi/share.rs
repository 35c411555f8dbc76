//! `vmmw_share_server_t` and `vmmw_share_t`: weights shared across processes, from C.
//!
//! An owner serves the destinations registered in a loader (they must lie in
//! one tag of a pool) on a Unix socket path; an importer attaches by that path
//! and reads the same tensors at its own addresses. The rules (read-only by
//! default, sleep policies, what survives whom) are in `docs/SHARING.md` and
//! [`crate::share`].

use std::ffi::{c_char, c_void};

use super::boundary::{arg, bytes_mut_arg, call, call_out, free_handle, into_handle, str_arg};
use super::buffer::write_str;
use super::destinations::vmmw_destination_t;
use super::device::vmmw_device_t;
use super::error::vmmw_error_t;
use super::loader::{vmmw_loader_t, VMMW_MAX_DIMS};
use super::options::{read_sized, SizedOptions};
use super::pool::vmmw_pool_t;
use super::status::vmmw_status_t;
use crate::error::{Error, Result};
use crate::share::{AttachOptions, Attachment, ImportedTensor, ServeOptions, Server, SleepPolicy};
use crate::tag::TagId;

/// What the owner's sleep of a shared tag does to attached importers: one of
/// the `VMMW_SHARE_SLEEP_*` values.
pub type vmmw_share_sleep_policy_t = i32;
/// Sleep policy: the owner's sleep of the shared tag fails (`VMMW_INVALID_STATE`)
/// while any importer is attached.
pub const VMMW_SHARE_SLEEP_REFUSE: vmmw_share_sleep_policy_t = 0;
/// Sleep policy: the sleep proceeds; importers' next call fails with
/// `VMMW_SHARE_REVOKED` and their mapping stays valid until they detach.
pub const VMMW_SHARE_SLEEP_REVOKE: vmmw_share_sleep_policy_t = 1;

/// How a share is served. Every field but `size` 0 means the default: refuse
/// sleep while attached, read-only importers, only this process's user may
/// attach. Start from `VMMW_SHARE_OPTIONS_INIT` (C) so `size` is set.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_share_options_t {
    /// `sizeof(vmmw_share_options_t)` as the caller's header declares it (see
    /// `VMMW_SHARE_OPTIONS_INIT`): fields past it take their defaults.
    pub size: usize,
    /// A `VMMW_SHARE_SLEEP_*` policy.
    pub sleep_policy: vmmw_share_sleep_policy_t,
    /// 1: importers may map read-write; 0: read-only only.
    pub allow_write: u32,
    /// 1: `allowed_uid` may attach instead of this process's user; 0: ignore it.
    pub use_allowed_uid: u32,
    /// The user id allowed to attach when `use_allowed_uid` is 1.
    pub allowed_uid: u32,
    /// 1: members of group `allowed_gid` (primary or supplementary) may attach
    /// too; 0: ignore it.
    pub use_allowed_gid: u32,
    /// The group id allowed to attach when `use_allowed_gid` is 1.
    pub allowed_gid: u32,
    /// Most connections served at once, handshaking and attached (past it a
    /// peer is refused with the reason); 0: 256.
    pub max_connections: u32,
    /// One deadline per handshake, in milliseconds; 0: 10000.
    pub handshake_timeout_ms: u32,
}

// SAFETY: repr(C), `size: usize` first, integers only.
unsafe impl SizedOptions for vmmw_share_options_t {
    const NAME: &'static str = "vmmw_share_options_t";
    fn defaults() -> Self {
        vmmw_share_options_t {
            size: std::mem::size_of::<Self>(),
            sleep_policy: VMMW_SHARE_SLEEP_REFUSE,
            allow_write: 0,
            use_allowed_uid: 0,
            allowed_uid: 0,
            use_allowed_gid: 0,
            allowed_gid: 0,
            max_connections: 0,
            handshake_timeout_ms: 0,
        }
    }
}

/// A running share (owner side). Thread-safe; free with `vmmw_share_server_free`.
pub struct vmmw_share_server_t {
    server: Server,
}

/// An attached share (importer side). Thread-safe except `vmmw_share_detach`
/// and `vmmw_share_free`, which must not race other calls on the same handle.
pub struct vmmw_share_t {
    attachment: Attachment,
}

fn serve_options(o: vmmw_share_options_t) -> Result<ServeOptions> {
    let sleep_policy = match o.sleep_policy {
        VMMW_SHARE_SLEEP_REFUSE => SleepPolicy::Refuse,
        VMMW_SHARE_SLEEP_REVOKE => SleepPolicy::Revoke,
        other => {
            return Err(Error::InvalidArgument(format!(
                "sleep_policy {other} is not VMMW_SHARE_SLEEP_REFUSE (0) or VMMW_SHARE_SLEEP_REVOKE (1)"
            )))
        }
    };
    if o.allow_write > 1 || o.use_allowed_uid > 1 || o.use_allowed_gid > 1 {
        return Err(Error::InvalidArgument(format!(
            "allow_write ({}), use_allowed_uid ({}) and use_allowed_gid ({}) must be 0 or 1",
            o.allow_write, o.use_allowed_uid, o.use_allowed_gid
        )));
    }
    let d = ServeOptions::default();
    Ok(ServeOptions {
        sleep_policy,
        allow_write: o.allow_write == 1,
        allowed_uids: (o.use_allowed_uid == 1).then(|| vec![o.allowed_uid]),
        allowed_gids: if o.use_allowed_gid == 1 {
            vec![o.allowed_gid]
        } else {
            Vec::new()
        },
        max_connections: match o.max_connections {
            0 => d.max_connections,
            n => n as usize,
        },
        handshake_timeout: match o.handshake_timeout_ms {
            0 => d.handshake_timeout,
            ms => std::time::Duration::from_millis(ms.into()),
        },
        log: d.log,
    })
}

/// Serve every destination registered in `loader` (after `vmmw_loader_allocate`
/// or `vmmw_loader_register`; they must lie in `tag`'s memory in `pool`) on a
/// new Unix socket at `path`, which must not exist. Checked now: the tag is
/// awake, every destination lies in it, the backend can export its memory
/// (`VMMW_UNSUPPORTED` otherwise). On success `*out` receives a server owned
/// by the caller; it accepts importers on its own thread until
/// `vmmw_share_server_free`. The loader may be freed afterwards (the list of
/// tensors is copied); the pool must outlive the server. Each attach,
/// refusal, eviction and detach writes one audit line on standard error
/// (`vmmw share: PATH: attach pid=.. uid=.. gid=.. access=..: ...`), through
/// a bounded queue and a writer thread: a standard error nobody reads never
/// stalls the server (lines past the queue are dropped and counted).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool`, `loader`, `path` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: options `size` or values out of range, no
///   destinations, or a destination outside the tag's memory.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
/// - `VMMW_INVALID_STATE`: the tag is asleep.
/// - `VMMW_IO`: `path` exists or cannot be bound.
/// - `VMMW_UNSUPPORTED`: the backend cannot export its memory.
///
/// # Safety
/// `pool` and `loader` are live handles; `path` is a NUL-terminated string;
/// `options` is NULL (defaults) or readable for its `size` bytes; `out` is
/// writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_serve(
    pool: *mut vmmw_pool_t,
    tag: u32,
    loader: *const vmmw_loader_t,
    path: *const c_char,
    options: *const vmmw_share_options_t,
    out: *mut *mut vmmw_share_server_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        // SAFETY: forwarded contract.
        let path = unsafe { str_arg(path, "path") }?;
        // SAFETY: forwarded contract (NULL, or readable for its `size` bytes).
        let o = unsafe { read_sized(options) }?.unwrap_or_else(vmmw_share_options_t::defaults);
        let options = serve_options(o)?;
        let server = Server::start(
            p.pool.clone(),
            TagId(tag),
            l.session.destinations(),
            path,
            options,
        )?;
        Ok(into_handle(vmmw_share_server_t { server }))
    })
}

/// Stop serving and remove the socket path (if it is still the socket this
/// server bound). A barrier: once it returns no descriptor leaves through
/// the share. Attached importers keep their
/// mappings (the memory lives while they map it) and stop counting against
/// the tag's sleep policy. NULL is a no-op.
///
/// Errors: none. NULL is ignored. A handle already freed cannot be detected
/// (undefined behaviour).
///
/// # Safety
/// `server` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_server_free(server: *mut vmmw_share_server_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(server) }
}

/// Number of importers attached now (connections open, handshakes included).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `server` or `out` is NULL.
///
/// # Safety
/// `server` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_server_attached(
    server: *const vmmw_share_server_t,
    out: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        Ok(unsafe { arg(server, "server") }?.server.attached() as u64)
    })
}

/// Announce new weights written in place by other means than an update (a
/// load of a new checkpoint): the served tag's version (`vmmw_tag_version`)
/// goes up by one and attached importers see it on their next call. `*out`
/// receives the new version.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `server` or `out` is NULL.
/// - `VMMW_INVALID_STATE`: an update of the tag is running; publish once it
///   has returned.
///
/// # Safety
/// `server` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_server_publish(
    server: *mut vmmw_share_server_t,
    out: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(server.cast_const(), "server") }?
            .server
            .publish()
    })
}

/// Attach to the share at `path` on `device` (which must use the owner's
/// backend): receive and validate the manifest, import and map every chunk at
/// this process's own addresses, read-only unless `read_write` is 1 and the
/// owner allows it. On success `*out` receives a handle owned by the caller
/// (`vmmw_share_detach` or `vmmw_share_free`). Takes at most 30 s when the
/// owner does not answer.
///
/// Errors (nothing is left behind on any of them):
/// - `VMMW_NULL_ARGUMENT`: `device`, `path` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `read_write` is not 0 or 1.
/// - `VMMW_IO`: no socket at `path`.
/// - `VMMW_SHARE_REFUSED`, naming the reason: peer not allowed, malformed
///   manifest, owner's tag asleep.
///
/// # Safety
/// `device` is a live handle; `path` is a NUL-terminated string; `out` is
/// writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_attach(
    device: *const vmmw_device_t,
    path: *const c_char,
    read_write: u32,
    out: *mut *mut vmmw_share_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        // SAFETY: forwarded contract.
        let path = unsafe { str_arg(path, "path") }?;
        if read_write > 1 {
            return Err(Error::InvalidArgument(format!(
                "read_write {read_write} must be 0 or 1"
            )));
        }
        let options = AttachOptions {
            read_write: read_write == 1,
            ..AttachOptions::default()
        };
        let attachment = Attachment::attach(d.driver().clone(), path, &options)?;
        Ok(into_handle(vmmw_share_t { attachment }))
    })
}

/// Number of tensors in the share.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `share` or `out` is NULL.
///
/// # Safety
/// `share` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_count(
    share: *const vmmw_share_t,
    out: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        Ok(unsafe { arg(share, "share") }?.attachment.len())
    })
}

/// The name of tensor `index` (0 ≤ index < count, in the owner's order), into
/// `buf` (buffer contract of `vmmw_device_describe`).
///
/// Errors (the last two are the buffer contract):
/// - `VMMW_NULL_ARGUMENT`: `share` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `index` is not below the count.
/// - `VMMW_BUFFER_TOO_SMALL`: `cap` is short; `*needed` is set, nothing is
///   written to `buf`.
/// - `VMMW_NULL_ARGUMENT`: `buf` is NULL and `cap` > 0; nothing is written.
///
/// # Safety
/// `share` is a live handle; `buf` is NULL or writable for `cap` bytes;
/// `needed` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_tensor_name(
    share: *const vmmw_share_t,
    index: usize,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let a = &unsafe { arg(share, "share") }?.attachment;
        let t = a.manifest().tensors.get(index).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "tensor index {index} is not below the count {}",
                a.len()
            ))
        })?;
        // SAFETY: forwarded contract.
        unsafe { write_str(&t.name, buf, cap, needed) }
    })
}

fn destination(t: &ImportedTensor) -> Result<vmmw_destination_t> {
    if t.shape.len() > VMMW_MAX_DIMS {
        return Err(Error::InvalidArgument(format!(
            "tensor `{}` has {} dimensions; vmmw_destination_t holds {VMMW_MAX_DIMS}",
            t.name,
            t.shape.len()
        )));
    }
    let mut out = vmmw_destination_t {
        ptr: t.ptr,
        bytes: t.bytes as u64,
        dtype: [0; 16],
        ndim: t.shape.len() as u32,
        shape: [0; VMMW_MAX_DIMS],
    };
    out.shape[..t.shape.len()].copy_from_slice(&t.shape);
    for (o, b) in out.dtype.iter_mut().zip(t.dtype.name().bytes().take(15)) {
        *o = b as c_char;
    }
    Ok(out)
}

/// The tensor called `name`, at this process's address.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `share`, `name` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: unknown name.
/// - `VMMW_SHARE_REVOKED`: the owner revoked the share.
///
/// # Safety
/// `share` is a live handle; `name` is a NUL-terminated string; `out` is
/// writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_tensor(
    share: *const vmmw_share_t,
    name: *const c_char,
    out: *mut vmmw_destination_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let a = &unsafe { arg(share, "share") }?.attachment;
        // SAFETY: forwarded contract.
        let name = unsafe { str_arg(name, "name") }?;
        destination(&a.tensor(name)?)
    })
}

/// The weights version: the manifest's, or a newer one the owner published
/// since.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `share` or `out` is NULL.
/// - `VMMW_SHARE_REVOKED`: the owner revoked the share.
///
/// # Safety
/// `share` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_version(
    share: *const vmmw_share_t,
    out: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(share, "share") }?.attachment.version()
    })
}

/// `*out` = 1 while the owner still serves, 0 once it stopped or exited. The
/// memory stays mapped and valid either way.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `share` or `out` is NULL.
///
/// # Safety
/// `share` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_owner_connected(
    share: *const vmmw_share_t,
    out: *mut u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        Ok(unsafe { arg(share, "share") }?.attachment.owner_connected() as u32)
    })
}

/// Copy `len` bytes of the share at this process's address `src` (inside the
/// share's mapped range) into host memory `dst`, and wait for the copy.
///
/// Errors (on any of them nothing is copied):
/// - `VMMW_NULL_ARGUMENT`: `share` is NULL, or `dst` is NULL with `len` > 0.
/// - `VMMW_INVALID_ARGUMENT`: the range is outside the share's mapping.
/// - `VMMW_SHARE_REVOKED`: the owner revoked the share.
///
/// # Safety
/// `share` is a live handle; `dst` is writable for `len` bytes (NULL when
/// `len` is 0); `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_read(
    share: *const vmmw_share_t,
    src: u64,
    dst: *mut c_void,
    len: usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let a = &unsafe { arg(share, "share") }?.attachment;
        // SAFETY: forwarded contract.
        let bytes = unsafe { bytes_mut_arg(dst.cast(), len, "dst") }?;
        a.read(src, bytes)
    })
}

/// Detach: unmap, release and close, then free the handle (also when an
/// unmap fails; the error is reported). Every pointer from this share becomes
/// invalid. The caller must have finished all device work that reads it.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `share` is NULL.
///
/// # Safety
/// `share` is a live handle, not used afterwards; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_detach(
    share: *mut vmmw_share_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        if share.is_null() {
            return Err(Error::NullArgument("share"));
        }
        // SAFETY: non-NULL and from `into_handle` (forwarded contract); freed once here.
        let s = unsafe { Box::from_raw(share) };
        s.attachment.detach()
    })
}

/// Detach ignoring errors and free the handle. NULL is a no-op.
///
/// Errors: none. NULL is ignored. A handle already freed cannot be detected
/// (undefined behaviour).
///
/// # Safety
/// `share` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vmmw_share_free(share: *mut vmmw_share_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(share) }
}
