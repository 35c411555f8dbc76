//! Update transports from C: the IPC sender (`vmmw_update_sender_t`) and its
//! receiving call, and NCCL communicators (`vmmw_nccl_comm_t`) for the
//! broadcast transport (`update::transport`).

use std::ffi::{c_char, c_void};
use std::sync::Mutex;
use std::time::Duration;

use super::boundary::{arg, call, call_out, free_handle, into_handle, str_arg};
use super::error::vmmw_error_t;
use super::loader::vmmw_loader_t;
use super::options::read_sized;
use super::pool::vmmw_pool_t;
use super::status::vmmw_status_t;
use super::update::{options, vmmw_update_options_t, vmmw_update_result_t, vmmw_update_source_t};
use crate::driver::nccl::UNIQUE_ID_BYTES;
use crate::error::{Error, Result};
use crate::share::LogSink;
use crate::update::transport::broadcast::{self, BroadcastOptions, BroadcastSource, Ring};
use crate::update::transport::ipc::{IpcSender, SendReport, SenderOptions};
use crate::update::transport::nccl::NcclCollective;
use crate::update::transport::receiver::receive_ipc;
use crate::update::transport::send::SendTensor;
use crate::update::transport::{receive, send, DEFAULT_BUCKET_BYTES, DEFAULT_SLOTS};
use crate::update::UpdateResult;

/// An IPC update sender: a ring of device buffers in a pool, exported once,
/// and a control socket receivers connect to.
pub struct vmmw_update_sender_t {
    sender: Mutex<IpcSender>,
}

/// What one send did (from `vmmw_update_sender_send`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_send_report_t {
    /// The receivers' version after the update.
    pub version: u64,
    /// Buckets sent.
    pub buckets: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Seconds from the receivers' connections to their rings attached (the
    /// one handshake of the update).
    pub setup_seconds: f64,
    /// Seconds of the whole send, setup and the receivers' commit included.
    pub seconds: f64,
}

fn report(r: &SendReport) -> vmmw_send_report_t {
    vmmw_send_report_t {
        version: r.version,
        buckets: r.buckets,
        bytes: r.bytes,
        setup_seconds: r.setup.as_secs_f64(),
        seconds: r.total.as_secs_f64(),
    }
}

pub(super) fn timeout(ms: u64) -> Duration {
    if ms == 0 {
        Duration::from_secs(60)
    } else {
        Duration::from_millis(ms)
    }
}

fn c_result(r: &UpdateResult) -> vmmw_update_result_t {
    vmmw_update_result_t::from(r)
}

/// A new IPC sender: receivers connect at `path` (which must not exist; it
/// is removed when the sender is freed). Its ring, `slots` slots (0 = 2) of
/// `slot_bytes` each (0 = the default bucket size, 256 MiB) in `pool` under a
/// tag of their own, served at `path` + ".ring", is allocated at the first
/// `vmmw_update_sender_send` and kept until the sender is freed; a sender
/// that only sends directly (`vmmw_update_sender_send_direct`) never
/// allocates it. Receivers and their
/// answers are waited for at most `timeout_ms` each (0 = 60 s). `*out`
/// receives a handle owned by the caller (`vmmw_update_sender_free`).
///
/// Errors (nothing is left behind on any):
/// - `VMMW_NULL_ARGUMENT`: `pool`, `path` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: more than 64 slots; `path` not UTF-8.
/// - `VMMW_IO`: `path` cannot be bound (it exists, or its folder does not).
///
/// # Safety
/// `pool` is a live handle; `path` is NULL or a NUL-terminated string; `out`
/// is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_sender_new(
    pool: *mut vmmw_pool_t,
    path: *const c_char,
    slots: u32,
    slot_bytes: u64,
    timeout_ms: u64,
    out: *mut *mut vmmw_update_sender_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        // SAFETY: forwarded contract.
        let path = unsafe { str_arg(path, "path") }?;
        let options = SenderOptions {
            slots: if slots == 0 {
                DEFAULT_SLOTS
            } else {
                slots as usize
            },
            slot_bytes: if slot_bytes == 0 {
                DEFAULT_BUCKET_BYTES
            } else {
                usize::try_from(slot_bytes)
                    .map_err(|_| Error::InvalidArgument("slot_bytes does not fit".into()))?
            },
            timeout: timeout(timeout_ms),
            log: LogSink::discard(),
        };
        let sender = IpcSender::bind(p.pool.clone(), path, options)?;
        Ok(into_handle(vmmw_update_sender_t {
            sender: Mutex::new(sender),
        }))
    })
}

/// Free a sender: stop serving its ring, remove its socket, free the ring.
/// NULL is accepted.
///
/// # Safety
/// `sender` is NULL or a live handle not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_sender_free(sender: *mut vmmw_update_sender_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(sender) }
}

/// Wait for `receivers` receivers (0 = 1; the ranks of one engine, each
/// keeping its slices) and send them the tensors of `source` (whole tensors
/// of this process, `vmmw_update_source_add`) in buckets through the ring;
/// returns once every receiver committed the update, with `*out` saying
/// what was sent. On any failure each receiver is told to abort and keeps
/// its last version. One send at a time per sender (others wait).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `sender`, `source` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: more than 256 receivers; the source's tensors
///   are refused (no tensor, a name twice, a size that does not match the
///   shape).
/// - `VMMW_OUT_OF_MEMORY`: the ring (allocated at the first send) does not
///   fit on the device.
/// - `VMMW_UNSUPPORTED`: the pool's memory is not created shareable.
/// - `VMMW_INVALID_STATE`: no receiver connected in time, a receiver went
///   away, or a receiver refused the update (its reason in the message).
///
/// # Safety
/// `sender` and `source` are live handles; the source's tensors hold their
/// bytes until this returns; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_sender_send(
    sender: *mut vmmw_update_sender_t,
    source: *mut vmmw_update_source_t,
    receivers: u32,
    out: *mut vmmw_send_report_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    // SAFETY: forwarded contract.
    unsafe { send_with(sender, source, receivers, out, error, IpcSender::send_to) }
}

/// Wait for `receivers` receivers (0 = 1) and send them the tensors of
/// `source` directly, without the ring: every tensor must lie in device
/// memory of the sender's pool (a trainer that allocates its weights, or a
/// gathered copy of them, in the pool). The sender serves the pool segments
/// that hold them as read-only shares (one per tag, one handshake per
/// update) and sends one manifest; each receiver maps them and copies every
/// destination piece straight out of them. Returns once every receiver
/// committed the update, with `*out` saying what was sent (`buckets` = 0);
/// the tensors must not be written before it returns. On any failure each
/// receiver is told to abort and keeps its last version. One send at a time
/// per sender (others wait).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `sender`, `source` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: more than 256 receivers; the source's tensors
///   are refused (as `vmmw_update_sender_send`), or one lies in host memory
///   or outside the sender's pool (every such tensor named).
/// - `VMMW_UNSUPPORTED`: the pool's memory is not created shareable.
/// - `VMMW_INVALID_STATE`: a tag holding them is asleep, no receiver
///   connected in time, a receiver went away, or a receiver refused the
///   update (its reason in the message).
///
/// # Safety
/// `sender` and `source` are live handles; the source's tensors hold their
/// bytes until this returns; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_sender_send_direct(
    sender: *mut vmmw_update_sender_t,
    source: *mut vmmw_update_source_t,
    receivers: u32,
    out: *mut vmmw_send_report_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    // SAFETY: forwarded contract.
    unsafe {
        send_with(
            sender,
            source,
            receivers,
            out,
            error,
            IpcSender::send_direct_to,
        )
    }
}

/// Wait for `receivers` receivers that prepare
/// (`vmmw_update_receiver_prepare`) and offer them `source`'s tensors ahead
/// of any update: the shares and manifest `vmmw_update_sender_send_direct`
/// of them would serve, which each receiver attaches, checks against its
/// destinations and keeps, writing nothing. Returns once every receiver
/// attached; `*out` as for a send, with `version` 0. A later
/// `vmmw_update_sender_send_direct` of the same tensors in the same memory
/// is then one manifest those receivers recognize and the copies, so their
/// first update runs as fast as later ones. The tensors must stay where
/// they are (a free, a sleep or a wake of their memory makes the next send
/// attach again).
///
/// Errors: as `vmmw_update_sender_send_direct`; a receiver's refusal (its
/// destinations do not take the tensors) is `VMMW_INVALID_STATE` with its
/// reason.
///
/// # Safety
/// As `vmmw_update_sender_send_direct`.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_sender_offer_direct(
    sender: *mut vmmw_update_sender_t,
    source: *mut vmmw_update_source_t,
    receivers: u32,
    out: *mut vmmw_send_report_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    // SAFETY: forwarded contract.
    unsafe {
        send_with(
            sender,
            source,
            receivers,
            out,
            error,
            IpcSender::offer_direct_to,
        )
    }
}

/// The two sends' conversion: `serve` is the sender's way (ring or direct)
/// of serving `receivers` (0 = 1) the source's tensors.
///
/// # Safety
/// As `vmmw_update_sender_send`.
unsafe fn send_with(
    sender: *mut vmmw_update_sender_t,
    source: *mut vmmw_update_source_t,
    receivers: u32,
    out: *mut vmmw_send_report_t,
    error: *mut *mut vmmw_error_t,
    serve: fn(&mut IpcSender, &[SendTensor<'_>], usize) -> Result<SendReport>,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let s = unsafe { arg(sender.cast_const(), "sender") }?;
        // SAFETY: forwarded contract.
        let src = unsafe { arg(source.cast_const(), "source") }?;
        let mut tensors = src.tensors.lock().unwrap_or_else(|p| p.into_inner());
        let mut sender = s.sender.lock().unwrap_or_else(|p| p.into_inner());
        let r = send::with_source(&mut *tensors, |t| {
            serve(&mut sender, t, receivers.max(1) as usize)
        })?;
        Ok(report(&r))
    })
}

/// Receive one update from the IPC sender at `path` into the destinations of
/// `loader` in `pool`, through the loader's rules (a tensor-parallel rank
/// keeps its slices): connect, attach the sender's ring (one handshake),
/// apply each bucket as it lands, commit. `*out` as `vmmw_update`'s; the
/// sender is told the version, or why not. Waits at most `timeout_ms` (0 =
/// 60 s) for each message.
///
/// Errors (every destination keeps its last version on each):
/// - `VMMW_NULL_ARGUMENT`: `loader`, `pool`, `path`, `options` or `out` is NULL.
/// - `VMMW_IO`: nothing listens at `path`.
/// - `VMMW_SHARE_REFUSED`: the ring's share refused the attach or is not valid.
/// - `VMMW_INVALID_ARGUMENT`: the sender's ring is not valid (more than 64
///   slots, slots smaller than announced).
/// - `VMMW_INVALID_STATE`: the sender went away before the update began.
/// - `VMMW_UPDATE_SOURCE`: the sender died, aborted, ended short or broke
///   the protocol (a bucket out of order, past its slot, naming a tensor it
///   did not announce, a share another process serves); the message says
///   which.
/// - `VMMW_VERSION_MISMATCH`, `VMMW_PLAN_MISMATCH`: as `vmmw_update`.
///
/// # Safety
/// `loader` and `pool` are live handles; `path` is NULL or a NUL-terminated
/// string; `options` is NULL or readable for its `size`; `out` is writable;
/// `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_receive_ipc(
    loader: *mut vmmw_loader_t,
    pool: *mut vmmw_pool_t,
    path: *const c_char,
    timeout_ms: u64,
    options_in: *const vmmw_update_options_t,
    out: *mut vmmw_update_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader.cast_const(), "loader") }?;
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        // SAFETY: forwarded contract.
        let path = unsafe { str_arg(path, "path") }?;
        // SAFETY: forwarded contract (readable for its `size`).
        let o = unsafe { read_sized(options_in) }?.ok_or(Error::NullArgument("options"))?;
        let opts = options(&o)?;
        let r = receive_ipc(
            p.pool.driver().clone(),
            path,
            timeout(timeout_ms),
            &l.session,
            &p.pool,
            &opts,
        )?;
        Ok(c_result(&r))
    })
}

/// An NCCL communicator for the broadcast transport.
pub struct vmmw_nccl_comm_t {
    pub(super) coll: Mutex<NcclCollective>,
}

/// A new NCCL unique id into `out` (128 bytes): rank 0 makes it and shares
/// it with the other ranks (the way torch.distributed and vLLM bootstrap
/// NCCL); each then calls `vmmw_nccl_comm_new`. NCCL is opened on first use
/// (`VMMW_NCCL_LIBRARY`, else `libnccl.so.2`).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `out` is NULL.
/// - `VMMW_UNSUPPORTED`: NCCL cannot be opened (the message names every
///   library tried).
/// - `VMMW_DRIVER_ERROR`: NCCL failed (its code and text in the message).
///
/// # Safety
/// `out` is writable for 128 bytes; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_nccl_unique_id(
    out: *mut u8,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        if out.is_null() {
            return Err(Error::NullArgument("out"));
        }
        let id = NcclCollective::unique_id()?;
        // SAFETY: `out` is writable for 128 bytes per the contract.
        unsafe { std::ptr::copy_nonoverlapping(id.as_ptr(), out, UNIQUE_ID_BYTES) };
        Ok(())
    })
}

/// Join the communicator of `world` ranks named by `id` (128 bytes from
/// `vmmw_nccl_unique_id`) as `rank`, on `pool`'s device; blocks until every
/// rank joined. `*out` receives a handle owned by the caller
/// (`vmmw_nccl_comm_free`, which destroys the communicator).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool`, `id` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `rank` is not below `world`.
/// - `VMMW_UNSUPPORTED`: NCCL cannot be opened.
/// - `VMMW_DRIVER_ERROR`: NCCL failed.
///
/// # Safety
/// `pool` is a live handle; `id` is readable for 128 bytes; `out` is
/// writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_nccl_comm_new(
    pool: *mut vmmw_pool_t,
    id: *const u8,
    world: u32,
    rank: u32,
    out: *mut *mut vmmw_nccl_comm_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        if id.is_null() {
            return Err(Error::NullArgument("id"));
        }
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        // SAFETY: `id` is readable for 128 bytes per the contract.
        unsafe { std::ptr::copy_nonoverlapping(id, bytes.as_mut_ptr(), UNIQUE_ID_BYTES) };
        let coll =
            NcclCollective::from_unique_id(p.pool.driver(), &bytes, world as usize, rank as usize)?;
        Ok(into_handle(vmmw_nccl_comm_t {
            coll: Mutex::new(coll),
        }))
    })
}

/// Use a communicator the caller already has (an `ncclComm_t` of this
/// process, for the device of the pools it will be used with). `*out`
/// receives a handle owned by the caller; freeing it leaves the
/// communicator alone.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `comm` or `out` is NULL.
/// - `VMMW_UNSUPPORTED`: NCCL cannot be opened.
/// - `VMMW_DRIVER_ERROR`: NCCL refused the communicator.
///
/// # Safety
/// `comm` is a live `ncclComm_t` that outlives the handle and that nothing
/// else uses while a broadcast through the handle runs; `out` is writable;
/// `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_nccl_comm_from_raw(
    comm: *mut c_void,
    out: *mut *mut vmmw_nccl_comm_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let coll = unsafe { NcclCollective::from_raw(comm) }?;
        Ok(into_handle(vmmw_nccl_comm_t {
            coll: Mutex::new(coll),
        }))
    })
}

/// Free a communicator handle (destroying the communicator when it was
/// created by `vmmw_nccl_comm_new`). NULL is accepted.
///
/// # Safety
/// `comm` is NULL or a live handle not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vmmw_nccl_comm_free(comm: *mut vmmw_nccl_comm_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(comm) }
}

pub(super) fn ring_options(slot_bytes: u64, timeout_ms: u64) -> Result<BroadcastOptions> {
    Ok(BroadcastOptions {
        slots: DEFAULT_SLOTS,
        slot_bytes: if slot_bytes == 0 {
            DEFAULT_BUCKET_BYTES
        } else {
            usize::try_from(slot_bytes)
                .map_err(|_| Error::InvalidArgument("slot_bytes does not fit".into()))?
        },
        timeout: if timeout_ms == 0 {
            Duration::from_secs(300)
        } else {
            Duration::from_millis(timeout_ms)
        },
    })
}

/// Broadcast the tensors of `source` from this rank (the root) to every rank
/// of `comm`, in buckets of `slot_bytes` (0 = 256 MiB, at least 16; every
/// rank must pass the same) through a ring of two buffers in `pool`; this
/// rank applies nothing. Each broadcast is waited for at most `timeout_ms`
/// (0 = 300 s), NCCL's asynchronous errors polled meanwhile. Before any
/// bucket, every rank says whether it accepts the update, so a refusal on
/// any rank fails every rank at once.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `comm`, `pool` or `source` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: the source's tensors are refused, or the
///   ranks' bucket sizes differ.
/// - `VMMW_UPDATE_SOURCE`: a rank refused the update (every refusing rank's
///   problems listed); no bucket was broadcast.
/// - `VMMW_OUT_OF_MEMORY`: the ring does not fit.
/// - `VMMW_DRIVER_ERROR`: NCCL failed.
/// - `VMMW_INVALID_STATE`: a broadcast did not complete in time.
///
/// # Safety
/// `comm`, `pool` and `source` are live handles; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_broadcast_send(
    comm: *mut vmmw_nccl_comm_t,
    pool: *mut vmmw_pool_t,
    source: *mut vmmw_update_source_t,
    slot_bytes: u64,
    timeout_ms: u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let c = unsafe { arg(comm.cast_const(), "comm") }?;
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        // SAFETY: forwarded contract.
        let src = unsafe { arg(source.cast_const(), "source") }?;
        let ring = Ring::new(p.pool.clone(), &ring_options(slot_bytes, timeout_ms)?)?;
        let mut tensors = src.tensors.lock().unwrap_or_else(|p| p.into_inner());
        let mut coll = c.coll.lock().unwrap_or_else(|p| p.into_inner());
        send::with_source(&mut *tensors, |t| broadcast::send(&mut *coll, &ring, t))
    })
}

/// Receive one update broadcast from rank `root` of `comm` into the
/// destinations of `loader` in `pool`, through the loader's rules (a
/// tensor-parallel rank keeps its slices); `slot_bytes` and `timeout_ms` as
/// the root's `vmmw_update_broadcast_send`. `*out` as `vmmw_update`'s.
///
/// Errors (every destination keeps its last version on each):
/// - `VMMW_NULL_ARGUMENT`: `comm`, `loader`, `pool`, `options` or `out` is NULL.
/// - `VMMW_UPDATE_SOURCE`: the broadcast failed (NCCL's error, a rank gone,
///   a timeout), the ranks' bucket sizes differ, or another rank refused
///   the update: every rank says whether it accepts before any bucket, so
///   all fail together, at once, and this error lists each refusing rank's
///   problems. Also when a rank failed after the buckets began: every rank
///   votes after the last bucket, and none applies the update.
/// - `VMMW_VERSION_MISMATCH`, `VMMW_PLAN_MISMATCH`: this rank refused, as
///   `vmmw_update` would.
///
/// # Safety
/// `comm`, `loader` and `pool` are live handles; `options` is NULL or
/// readable for its `size`; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_broadcast_receive(
    comm: *mut vmmw_nccl_comm_t,
    loader: *mut vmmw_loader_t,
    pool: *mut vmmw_pool_t,
    root: u32,
    slot_bytes: u64,
    timeout_ms: u64,
    options_in: *const vmmw_update_options_t,
    out: *mut vmmw_update_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let c = unsafe { arg(comm.cast_const(), "comm") }?;
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader.cast_const(), "loader") }?;
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        // SAFETY: forwarded contract (readable for its `size`).
        let o = unsafe { read_sized(options_in) }?.ok_or(Error::NullArgument("options"))?;
        let opts = options(&o)?;
        let ring = Ring::new(p.pool.clone(), &ring_options(slot_bytes, timeout_ms)?)?;
        let mut coll = c.coll.lock().unwrap_or_else(|p| p.into_inner());
        let mut source = BroadcastSource::rank(&mut *coll, &ring, root as usize);
        let r = receive(&mut source, &l.session, &p.pool, &opts)?;
        Ok(c_result(&r))
    })
}

/// Broadcast the tensors of `source` from this rank (the root) to every rank
/// of `comm` and apply them here too, into the destinations of `loader` in
/// `pool` through its rules (a root that is an engine rank, or a checkpoint
/// read on one rank and broadcast). Arguments as
/// `vmmw_update_broadcast_send` and `vmmw_update_broadcast_receive`.
///
/// Errors (every destination here keeps its last version on each):
/// - `VMMW_NULL_ARGUMENT`: `comm`, `loader`, `pool`, `source`, `options` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: the source's tensors are refused.
/// - `VMMW_UPDATE_SOURCE`: the broadcast failed, the ranks' bucket sizes
///   differ, or another rank refused the update (each refusing rank's
///   problems listed; no bucket was broadcast).
/// - `VMMW_VERSION_MISMATCH`, `VMMW_PLAN_MISMATCH`: as `vmmw_update`.
///
/// # Safety
/// `comm`, `loader`, `pool` and `source` are live handles; `options` is NULL
/// or readable for its `size`; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_broadcast_root(
    comm: *mut vmmw_nccl_comm_t,
    loader: *mut vmmw_loader_t,
    pool: *mut vmmw_pool_t,
    source: *mut vmmw_update_source_t,
    slot_bytes: u64,
    timeout_ms: u64,
    options_in: *const vmmw_update_options_t,
    out: *mut vmmw_update_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let c = unsafe { arg(comm.cast_const(), "comm") }?;
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader.cast_const(), "loader") }?;
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool.cast_const(), "pool") }?;
        // SAFETY: forwarded contract.
        let src = unsafe { arg(source.cast_const(), "source") }?;
        // SAFETY: forwarded contract (readable for its `size`).
        let o = unsafe { read_sized(options_in) }?.ok_or(Error::NullArgument("options"))?;
        let opts = options(&o)?;
        let ring = Ring::new(p.pool.clone(), &ring_options(slot_bytes, timeout_ms)?)?;
        let mut tensors = src.tensors.lock().unwrap_or_else(|p| p.into_inner());
        let mut coll = c.coll.lock().unwrap_or_else(|p| p.into_inner());
        let r = send::with_source(&mut *tensors, |t| {
            let mut source = BroadcastSource::root(&mut *coll, &ring, t);
            receive(&mut source, &l.session, &p.pool, &opts)
        })?;
        Ok(c_result(&r))
    })
}

/// Register `len` bytes at `ptr` (device memory of the communicator's
/// device, e.g. a tag made RDMA-capable with `vmmw_pool_set_tag_rdma`) with
/// the communicator (`ncclCommRegister`); `*handle` receives the
/// registration for `vmmw_nccl_deregister`. A wake of the memory's tag maps
/// new pages: deregister and register again when `vmmw_tag_remap_epoch`
/// changed.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `comm` or `handle` is NULL.
/// - `VMMW_DRIVER_ERROR`: NCCL refused the registration.
///
/// # Safety
/// `comm` is a live handle; `ptr..ptr+len` is mapped device memory until
/// deregistered; `handle` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_nccl_register(
    comm: *mut vmmw_nccl_comm_t,
    ptr: u64,
    len: u64,
    handle: *mut *mut c_void,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(handle, "handle", error, || {
        // SAFETY: forwarded contract.
        let c = unsafe { arg(comm.cast_const(), "comm") }?;
        let coll = c.coll.lock().unwrap_or_else(|p| p.into_inner());
        let len =
            usize::try_from(len).map_err(|_| Error::InvalidArgument("len does not fit".into()))?;
        // SAFETY: forwarded contract.
        unsafe { coll.comm().register_raw(ptr, len) }
    })
}

/// Drop a registration made by `vmmw_nccl_register`.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `comm` or `handle` is NULL.
/// - `VMMW_DRIVER_ERROR`: NCCL refused.
///
/// # Safety
/// `comm` is a live handle; `handle` came from `vmmw_nccl_register` on it
/// and is not used again; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_nccl_deregister(
    comm: *mut vmmw_nccl_comm_t,
    handle: *mut c_void,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let c = unsafe { arg(comm.cast_const(), "comm") }?;
        if handle.is_null() {
            return Err(Error::NullArgument("handle"));
        }
        let coll = c.coll.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: forwarded contract.
        unsafe { coll.comm().deregister_raw(handle) }
    })
}
