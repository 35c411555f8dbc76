//! The persistent receiving side of the IPC transport from C
//! (`vmmw_update_receiver_t`, `update::transport::receiver::UpdateReceiver`):
//! direct updates' imports kept across updates from one sender.

use std::ffi::c_char;
use std::sync::Mutex;

use super::boundary::{arg, call, call_out, free_handle, into_handle, str_arg};
use super::error::vmmw_error_t;
use super::loader::vmmw_loader_t;
use super::numbers::or_default;
use super::options::read_sized;
use super::pool::vmmw_pool_t;
use super::status::vmmw_status_t;
use super::transport::timeout;
use super::update::{options, vmmw_update_options_t, vmmw_update_result_t};
use crate::error::Error;
use crate::update::transport::import_cache::CacheLimits;
use crate::update::transport::receiver::{ReceiverOptions, UpdateReceiver};

/// A receiver of updates from one IPC sender that keeps the shares of its
/// direct updates imported between updates. Its calls may come from any
/// thread; they run one at a time.
pub struct vmmw_update_receiver_t {
    receiver: Mutex<UpdateReceiver>,
}

/// What a receiver's last receive did, and what it keeps now
/// (`vmmw_update_receiver_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_receive_stats_t {
    /// 1 for a direct update, 0 for one through the sender's ring.
    pub direct: u32,
    /// Shares attached by the last receive (the ring's one, or a direct
    /// update's shares not kept from before).
    pub attached: u32,
    /// Direct shares whose kept import the last receive reused.
    pub reused: u32,
    /// Physical chunks the last receive imported.
    pub chunks: u64,
    /// Seconds from connecting to every share imported and the manifest checked.
    pub setup_seconds: f64,
    /// Seconds of the whole last receive.
    pub seconds: f64,
    /// Shares kept imported now.
    pub kept_imports: u64,
    /// Bytes of the sender's memory kept mapped now: memory that stays
    /// allocated on the device, also after the sender frees it or puts it
    /// to sleep, until the imports are dropped.
    pub kept_bytes: u64,
}

/// A new receiver for the IPC sender at `path`, importing on `pool`'s
/// device. Connects at each `vmmw_update_receiver_receive`, not now. Waits
/// at most `timeout_ms` (0 = 60 s) for each message and attach. Keeps at
/// most `max_kept_imports` shares (0 = 64, as many as one update names) and
/// `max_kept_bytes` bytes (0 = no byte bound) imported between updates; to
/// keep none, use `vmmw_update_receive_ipc`. `*out` receives a handle owned
/// by the caller (`vmmw_update_receiver_free`); it holds a reference to the
/// pool's device, not to the pool.
///
/// Errors (nothing is left behind on any):
/// - `VMMW_NULL_ARGUMENT`: `pool`, `path` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `path` is not UTF-8; `max_kept_imports` does
///   not fit in size_t.
///
/// # Safety
/// `pool` is a live handle; `path` is NULL or a NUL-terminated string; `out`
/// is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_receiver_new(
    pool: *mut vmmw_pool_t,
    path: *const c_char,
    timeout_ms: u64,
    max_kept_imports: u64,
    max_kept_bytes: u64,
    out: *mut *mut vmmw_update_receiver_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        // SAFETY: forwarded contract.
        let path = unsafe { str_arg(path, "path") }?;
        let d = CacheLimits::default();
        let options = ReceiverOptions {
            timeout: timeout(timeout_ms),
            cache: CacheLimits {
                max_imports: or_default(max_kept_imports, d.max_imports, "max_kept_imports")?,
                max_bytes: if max_kept_bytes == 0 {
                    d.max_bytes
                } else {
                    max_kept_bytes
                },
            },
        };
        let r = UpdateReceiver::new(p.pool.driver().clone(), path, options);
        Ok(into_handle(vmmw_update_receiver_t {
            receiver: Mutex::new(r),
        }))
    })
}

/// Free a receiver: its kept imports are dropped (the sender's memory they
/// kept alive goes). NULL is accepted.
///
/// # Safety
/// `receiver` is NULL or a live handle not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_receiver_free(receiver: *mut vmmw_update_receiver_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(receiver) }
}

/// Receive one update from the receiver's sender into the destinations of
/// `loader` in `pool`, as `vmmw_update_receive_ipc`, but a direct update
/// reuses every share this receiver kept imported from the same sender over
/// the same memory (the sender says so by the share's generation; the
/// manifest is still checked against the imports before any byte moves)
/// and attaches only the others; the imports it used are kept for the next
/// update. `*out` as `vmmw_update`'s.
///
/// Errors: as `vmmw_update_receive_ipc`, and `VMMW_UPDATE_SOURCE` when the
/// sender claims a kept share with other segments than it maps, a tensor
/// past its segment, or a share another process serves. On any error every destination keeps its last version
/// and the kept imports are dropped, except `VMMW_INVALID_ARGUMENT` for a
/// `pool` on another device than the one given to
/// `vmmw_update_receiver_new`, refused before anything is touched.
///
/// # Safety
/// `receiver`, `loader` and `pool` are live handles; `options` is NULL or
/// readable for its `size`; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_receiver_receive(
    receiver: *mut vmmw_update_receiver_t,
    loader: *mut vmmw_loader_t,
    pool: *mut vmmw_pool_t,
    options_in: *const vmmw_update_options_t,
    out: *mut vmmw_update_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let r = unsafe { arg(receiver.cast_const(), "receiver") }?;
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader.cast_const(), "loader") }?;
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        // SAFETY: forwarded contract (readable for its `size`).
        let o = unsafe { read_sized(options_in) }?.ok_or(Error::NullArgument("options"))?;
        let opts = options(&o)?;
        let mut r = r.receiver.lock().unwrap_or_else(|e| e.into_inner());
        let done = r.receive(&l.session, &p.pool, &opts)?;
        Ok(vmmw_update_result_t::from(&done))
    })
}

/// Prepare for the updates to come from the receiver's sender, which
/// offers its tensors (`vmmw_update_sender_offer_direct`): connect, attach
/// every share it names, check the offered manifest against `loader`'s
/// destinations in `pool` as an update with `options` would (its plan and
/// version: nothing is written), and keep the imports and the manifest. The
/// first update of those tensors afterwards attaches and checks nothing, as
/// later ones do, so it runs as fast as they do. `vmmw_update_receiver_stats`
/// then says what was attached and how long it took.
///
/// Errors: as `vmmw_update_receiver_receive` (nothing is written on any);
/// `VMMW_INVALID_STATE` when the sender sends an update or its ring instead
/// of an offer (the sender is told). On any error the kept imports are
/// dropped, except `VMMW_INVALID_ARGUMENT` for a `pool` on another device.
///
/// Thread safety: as `vmmw_update_receiver_receive`.
///
/// # Safety
/// `receiver`, `loader` and `pool` are live handles; `options` is readable
/// for its `size`; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_receiver_prepare(
    receiver: *mut vmmw_update_receiver_t,
    loader: *mut vmmw_loader_t,
    pool: *mut vmmw_pool_t,
    options_in: *const vmmw_update_options_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let r = unsafe { arg(receiver.cast_const(), "receiver") }?;
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader.cast_const(), "loader") }?;
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        // SAFETY: forwarded contract (readable for its `size`).
        let o = unsafe { read_sized(options_in) }?.ok_or(Error::NullArgument("options"))?;
        let opts = options(&o)?;
        let mut r = r.receiver.lock().unwrap_or_else(|e| e.into_inner());
        r.prepare(&l.session, &p.pool, &opts).map(|_| ())
    })
}

/// What the receiver's last successful receive or prepare did (all 0 before
/// the first) and what it keeps imported now, into `*out`.
///
/// Errors: `VMMW_NULL_ARGUMENT`: `receiver` or `out` is NULL.
///
/// # Safety
/// `receiver` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_receiver_stats(
    receiver: *const vmmw_update_receiver_t,
    out: *mut vmmw_receive_stats_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let r = unsafe { arg(receiver, "receiver") }?;
        let r = r.receiver.lock().unwrap_or_else(|e| e.into_inner());
        let last = r.last_receive().unwrap_or_default();
        Ok(vmmw_receive_stats_t {
            direct: last.direct as u32,
            attached: last.attached as u32,
            reused: last.reused as u32,
            chunks: last.chunks as u64,
            setup_seconds: last.setup.as_secs_f64(),
            seconds: last.total.as_secs_f64(),
            kept_imports: r.kept_imports() as u64,
            kept_bytes: r.kept_bytes(),
        })
    })
}

/// Drop every import the receiver keeps: the sender's memory they kept
/// alive goes, and the next update attaches again.
///
/// Errors: `VMMW_NULL_ARGUMENT`: `receiver` is NULL.
///
/// # Safety
/// `receiver` is NULL or a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_receiver_drop_imports(
    receiver: *mut vmmw_update_receiver_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let r = unsafe { arg(receiver.cast_const(), "receiver") }?;
        r.receiver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drop_imports();
        Ok(())
    })
}
