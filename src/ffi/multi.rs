//! Several devices of one host: peer access to a pool tag's memory, and one
//! load that fills destinations on several devices (replicas by fan-out over
//! peer copies, or tensor-parallel ranks at once).

use super::boundary::{arg, call, call_out, slice_arg};
use super::error::vmmw_error_t;
use super::loader::vmmw_loader_t;
use super::pool::vmmw_pool_t;
use super::status::vmmw_status_t;
use crate::devices::{self, replicas, MultiMode};
use crate::driver::{AccessMode, PeerAccess};
use crate::error::{Error, Result};
use crate::loader::PoolLoad;
use crate::loader::{Control, Session};
use crate::tag::TagId;

/// What a peer device may do with a tag's memory: one of the `VMMW_ACCESS_*` values.
pub type vmmw_access_t = i32;

/// Peer access: none (revokes an earlier grant).
pub const VMMW_ACCESS_NONE: vmmw_access_t = 0;
/// Peer access: read only.
pub const VMMW_ACCESS_READ: vmmw_access_t = 1;
/// Peer access: read and write.
pub const VMMW_ACCESS_READWRITE: vmmw_access_t = 2;

/// How `vmmw_loader_load_devices` divides the work: one of the `VMMW_MULTI_*` values.
pub type vmmw_multi_mode_t = i32;

/// Multi-device load: every device gets all of the checkpoint; each loads a
/// share from host memory and pulls the others' shares over peer copies.
pub const VMMW_MULTI_REPLICAS: vmmw_multi_mode_t = 0;
/// Multi-device load: each device loads its own loader's plan (tensor-parallel ranks).
pub const VMMW_MULTI_RANKS: vmmw_multi_mode_t = 1;

/// One peer device's access to a tag's memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct vmmw_peer_access_t {
    /// The peer's device ordinal.
    pub device: i32,
    /// A `VMMW_ACCESS_*` value.
    pub access: vmmw_access_t,
}

/// What a multi-device load did (`vmmw_loader_load_devices`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_multi_result_t {
    /// Source bytes read from host memory, over all devices.
    pub host_bytes: u64,
    /// Bytes moved between devices by peer copies.
    pub peer_bytes: u64,
    /// Device bytes written on all devices together.
    pub delivered_bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Seconds of the host phase (all devices at once).
    pub host_seconds: f64,
    /// Seconds of the peer exchange.
    pub peer_seconds: f64,
    /// Delivered bytes per second over all devices, in GB/s (10^9).
    pub gbps: f64,
    /// Devices whose share or plan failed midway and was redone.
    pub recovered_devices: u32,
}

fn access_mode(v: vmmw_access_t, device: i32) -> Result<AccessMode> {
    match v {
        VMMW_ACCESS_NONE => Ok(AccessMode::None),
        VMMW_ACCESS_READ => Ok(AccessMode::Read),
        VMMW_ACCESS_READWRITE => Ok(AccessMode::ReadWrite),
        other => Err(Error::InvalidArgument(format!(
            "peer access {other} for device {device}: expected VMMW_ACCESS_NONE, \
             VMMW_ACCESS_READ or VMMW_ACCESS_READWRITE"
        ))),
    }
}

/// Grant the listed peer devices access to every segment of `tag` in `pool`:
/// now, to segments the tag gets later, and again after every wake (access
/// is set again whenever memory is mapped). Peers granted before and missing
/// from the list lose their access; `count` 0 revokes all. Thread-safe.
///
/// Errors (all checked before anything changes; nothing changes):
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL, or `peers` is NULL with `count` > 0.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
/// - `VMMW_INVALID_ARGUMENT`: a peer that is the pool's own device, listed
///   twice, missing, unable to reach the pool's device
///   (`cuDeviceCanAccessPeer`), or an unknown access value.
///
/// # Safety
/// `pool` is a live handle; `peers` points to `count` entries (or `count` is
/// 0); `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_set_peer_access(
    pool: *mut vmmw_pool_t,
    tag: u32,
    peers: *const vmmw_peer_access_t,
    count: usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        // SAFETY: forwarded contract.
        let list = unsafe { slice_arg(peers, count, "peers") }?;
        let peers = list
            .iter()
            .map(|e| {
                Ok(PeerAccess {
                    device: e.device,
                    mode: access_mode(e.access, e.device)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        p.pool.set_peer_access(TagId(tag), &peers)
    })
}

/// Number of peer devices granted access to `tag` in `pool`. Read the
/// entries with `vmmw_pool_peer_access_at`. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
///
/// # Safety
/// `pool` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_peer_access_count(
    pool: *const vmmw_pool_t,
    tag: u32,
    out: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        crate::tag::check(TagId(tag))?;
        Ok(p.pool.peer_access(TagId(tag)).len())
    })
}

/// The `index`-th peer granted access to `tag` (sorted by device).
/// Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
/// - `VMMW_INVALID_ARGUMENT`: `index` is not below the count.
///
/// # Safety
/// `pool` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_peer_access_at(
    pool: *const vmmw_pool_t,
    tag: u32,
    index: usize,
    out: *mut vmmw_peer_access_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        crate::tag::check(TagId(tag))?;
        let list = p.pool.peer_access(TagId(tag));
        let e = list.get(index).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "peer index {index} of tag {tag}: only {} peers are granted",
                list.len()
            ))
        })?;
        Ok(vmmw_peer_access_t {
            device: e.device,
            access: match e.mode {
                AccessMode::None => VMMW_ACCESS_NONE,
                AccessMode::Read => VMMW_ACCESS_READ,
                AccessMode::ReadWrite => VMMW_ACCESS_READWRITE,
            },
        })
    })
}

/// Whether `pool`'s device can reach memory of device `peer` (1) or not (0)
/// (`cuDeviceCanAccessPeer`; on the host backend every other simulated device).
/// Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: there is no device `peer`.
///
/// # Safety
/// `pool` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_can_access_peer(
    pool: *const vmmw_pool_t,
    peer: i32,
    out: *mut i32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        Ok(i32::from(p.pool.driver().can_access_peer(peer)?))
    })
}

/// One load into several devices: `loaders[i]`'s destinations (registered or
/// allocated with `vmmw_loader_allocate`) on `pools[i]`'s device, for
/// `count` devices, all at once. Every loader must have opened the same
/// checkpoint; the load options of `loaders[0]` apply to every device.
///
/// `mode` `VMMW_MULTI_REPLICAS`: every loader has the same rules and
/// destinations of the same names and shapes; each device loads a share of
/// the checkpoint from host memory and pulls the other shares from the other
/// devices over peer copies, so host memory is read once. The tags owning
/// the destinations are granted read access for the other devices (kept
/// afterwards; see `vmmw_pool_set_peer_access`). `VMMW_MULTI_RANKS`: each
/// device loads its loader's plan (e.g. presets with different `tp_rank`).
///
/// Every check happens before any byte is written (destinations untouched).
/// A device that fails midway is repaired before returning: its share is
/// loaded again by a healthy device and pulled over the peer link (replicas),
/// or its plan is run once more (ranks), so on success every destination is
/// fully written. If the repair fails too, the error names that device; only
/// its destinations may be partly written. Each loader keeps its device's
/// executed plan (`vmmw_loader_result`, Reload sleep). `out` may be NULL.
///
/// Blocks until done; `vmmw_loader_cancel` on `loaders[0]` stops it. Once the
/// load ran its copies, every listed loader's pending cancel is cleared; a
/// load refused before its copies leaves them pending (the cancel rule of
/// `vmmw_loader_cancel`). Thread-safe; the loaders are held for the call.
///
/// Errors found before any byte is written (destinations untouched):
/// - `VMMW_NULL_ARGUMENT`: `loaders` or `pools` is NULL with `count` > 0, or
///   an entry is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `count` is 0, a loader is listed twice, or
///   `mode` is unknown.
/// - Each device's destinations fail as `vmmw_loader_load` checks them
///   (`VMMW_UNKNOWN_POINTER` for one whose pool block was freed since it was
///   registered, whatever now lives at its address).
///
/// Errors once copying started:
/// - `VMMW_CANCELLED`: destinations partly written.
/// - A device's failure whose repair failed too: the error names that device;
///   only its destinations may be partly written.
///
/// # Safety
/// `loaders` and `pools` point to `count` live handles each; `out` is NULL
/// or writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_load_devices(
    loaders: *const *mut vmmw_loader_t,
    pools: *const *mut vmmw_pool_t,
    count: usize,
    mode: vmmw_multi_mode_t,
    out: *mut vmmw_multi_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        let mode = match mode {
            VMMW_MULTI_REPLICAS => MultiMode::Replicas,
            VMMW_MULTI_RANKS => MultiMode::Ranks,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "multi-device mode {other}: expected VMMW_MULTI_REPLICAS or VMMW_MULTI_RANKS"
                )))
            }
        };
        // SAFETY: forwarded contract.
        unsafe {
            on_devices(
                loaders,
                pools,
                count,
                out,
                "vmmw_loader_load_devices",
                |ckpt, targets, options, ctl| {
                    devices::load_multi_into_pools(ckpt, targets, mode, options, ctl)
                },
            )
        }
    })
}

/// Wake replicas that slept without backups (`VMMW_POLICY_DISCARD`) by the
/// fan-out of `vmmw_loader_load_devices` with `VMMW_MULTI_REPLICAS`: every
/// tag owning one of `loaders[i]`'s destinations in `pools[i]` is woken
/// (memory mapped again at the same addresses, peer grants set again), then
/// the checkpoint, one copy in host memory (the page cache), is loaded once
/// and fanned out over peer copies. Host memory is read once for all devices.
/// For replicas slept with one host backup instead, see
/// `vmmw_replicas_wake_from_backup`.
///
/// The loaders, their checkpoint and rules are as `vmmw_loader_load_devices`
/// with `VMMW_MULTI_REPLICAS` needs them. On an error after the tags woke,
/// they stay awake and the destinations hold what the load reached (loading
/// again repairs them); an error before (a tag's wake refused, e.g.
/// `VMMW_OUT_OF_MEMORY`) leaves the tags not yet woken asleep. `out` may be
/// NULL. Blocks until done; `vmmw_loader_cancel` on `loaders[0]` stops it;
/// pending cancels follow the rule of `vmmw_loader_load_devices`.
/// Thread-safe; the loaders are held for the call.
///
/// Errors: as `vmmw_loader_load_devices`; the NULL and device-list checks
/// come before any tag wakes, a destination or plan mismatch after. A tag's
/// wake refused (e.g. `VMMW_OUT_OF_MEMORY`) leaves the tags not yet woken
/// asleep.
///
/// # Safety
/// `loaders` and `pools` point to `count` live handles each; `out` is NULL
/// or writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_replicas_wake_by_reload(
    loaders: *const *mut vmmw_loader_t,
    pools: *const *mut vmmw_pool_t,
    count: usize,
    out: *mut vmmw_multi_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        unsafe {
            on_devices(
                loaders,
                pools,
                count,
                out,
                "vmmw_replicas_wake_by_reload",
                replicas::wake_by_reload,
            )
        }
    })
}

/// The former name of `vmmw_replicas_wake_by_reload`, kept through 0.x;
/// removed at 1.0.
///
/// Errors: as `vmmw_replicas_wake_by_reload`.
///
/// # Safety
/// As `vmmw_replicas_wake_by_reload`.
#[no_mangle]
#[deprecated(
    note = "renamed vmmw_replicas_wake_by_reload (vmmw_replicas_wake_from_backup wakes from one host backup)"
)]
pub unsafe extern "C" fn vmmw_loader_wake_replicas(
    loaders: *const *mut vmmw_loader_t,
    pools: *const *mut vmmw_pool_t,
    count: usize,
    out: *mut vmmw_multi_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    // SAFETY: forwarded contract.
    unsafe { vmmw_replicas_wake_by_reload(loaders, pools, count, out, error) }
}

/// Lock the loaders (in address order), check they opened one checkpoint,
/// run `run` over their destinations on `pools`, keep each device's executed
/// plan in its loader and write `out` (when not NULL).
///
/// # Safety
/// As `vmmw_loader_load_devices`' contract on every pointer.
unsafe fn on_devices(
    loaders: *const *mut vmmw_loader_t,
    pools: *const *mut vmmw_pool_t,
    count: usize,
    out: *mut vmmw_multi_result_t,
    what: &str,
    run: impl FnOnce(
        crate::loader::Checkpoint,
        &[PoolLoad<'_>],
        &crate::loader::LoadOptions,
        &Control<'_>,
    ) -> Result<devices::MultiLoaded>,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let ls = unsafe { slice_arg(loaders, count, "loaders") }?;
    // SAFETY: forwarded contract.
    let ps = unsafe { slice_arg(pools, count, "pools") }?;
    let mut sessions = Vec::with_capacity(count);
    let mut pool_refs = Vec::with_capacity(count);
    for (&l, &p) in ls.iter().zip(ps) {
        // SAFETY: forwarded contract.
        sessions.push(&unsafe { arg(l, "loaders[i]") }?.session);
        // SAFETY: forwarded contract.
        pool_refs.push(&*unsafe { arg(p, "pools[i]") }?.pool);
    }
    let loaded = Session::load_many(&sessions, &pool_refs, what, run, |l| &l.plans)?;
    if !out.is_null() {
        let s = &loaded.stats;
        let r = vmmw_multi_result_t {
            host_bytes: s.host_bytes,
            peer_bytes: s.peer_bytes,
            delivered_bytes: s.delivered_bytes,
            seconds: s.seconds,
            host_seconds: s.host_seconds,
            peer_seconds: s.peer_seconds,
            gbps: s.aggregate_gbps(),
            recovered_devices: s.recovered.len() as u32,
        };
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(r) };
    }
    Ok(())
}
