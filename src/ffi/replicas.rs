//! Replicas asleep on one host backup (`devices::replicas`): N tags on N
//! devices holding the same bytes sleep with one pinned host backup and wake
//! on every device from it, host memory read once.

use super::boundary::{arg, call, slice_arg};
use super::error::vmmw_error_t;
use super::numbers::or_default;
use super::options::{read_sized, SizedOptions};
use super::pool::vmmw_pool_t;
use super::sleep::{
    vmmw_policy_t, VMMW_POLICY_DISCARD, VMMW_POLICY_OFFLOAD, VMMW_POLICY_OFFLOAD_COMPRESSED,
    VMMW_POLICY_RELOAD,
};
use super::status::vmmw_status_t;
use crate::devices::replicas::{self, Replica, ReplicaSleepOptions, ReplicaWakeOptions};
use crate::error::{Error, Result};
use crate::sleep::Policy;
use crate::tag::TagId;

/// Options of `vmmw_replicas_sleep_with`. Start from
/// `VMMW_REPLICA_SLEEP_OPTIONS_INIT` (C) so `size` is set; every other field
/// 0 is its default.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_replica_sleep_options_t {
    /// `sizeof(vmmw_replica_sleep_options_t)` as the caller's header declares
    /// it (`VMMW_REPLICA_SLEEP_OPTIONS_INIT`): fields past it take their
    /// defaults.
    pub size: usize,
    /// How the holder (`pools[0]`'s tag) keeps the one host backup:
    /// `VMMW_POLICY_OFFLOAD` (0, the default: raw bytes) or
    /// `VMMW_POLICY_OFFLOAD_COMPRESSED` (codec frames, with the holder pool's
    /// sleep options; every device decodes a share of them at wake). Any
    /// other value is `VMMW_INVALID_ARGUMENT`.
    pub holder_policy: vmmw_policy_t,
}

// SAFETY: repr(C), `size` first, integers only.
unsafe impl SizedOptions for vmmw_replica_sleep_options_t {
    const NAME: &'static str = "vmmw_replica_sleep_options_t";
    fn defaults() -> Self {
        vmmw_replica_sleep_options_t {
            size: std::mem::size_of::<Self>(),
            holder_policy: VMMW_POLICY_OFFLOAD,
        }
    }
}

impl vmmw_replica_sleep_options_t {
    /// The Rust options; the core refuses a policy without a full backup.
    fn to_rust(self) -> Result<ReplicaSleepOptions> {
        let holder_policy = match self.holder_policy {
            VMMW_POLICY_OFFLOAD => Policy::Offload,
            VMMW_POLICY_OFFLOAD_COMPRESSED => Policy::OffloadCompressed,
            VMMW_POLICY_DISCARD => Policy::Discard,
            VMMW_POLICY_RELOAD => Policy::Reload,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "vmmw_replica_sleep_options_t.holder_policy is {other}: expected \
                     VMMW_POLICY_OFFLOAD (0) or VMMW_POLICY_OFFLOAD_COMPRESSED (3)"
                )))
            }
        };
        let o = ReplicaSleepOptions { holder_policy };
        o.validate()?;
        Ok(o)
    }
}

/// Options of `vmmw_replicas_wake_from_backup`. Start from `VMMW_REPLICA_WAKE_OPTIONS_INIT`
/// (C) so `size` is set; every other field 0 is its default.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_replica_wake_options_t {
    /// `sizeof(vmmw_replica_wake_options_t)` as the caller's header declares it
    /// (`VMMW_REPLICA_WAKE_OPTIONS_INIT`): fields past it take their defaults.
    pub size: usize,
    /// Size of one copy on one stream in bytes; 0 = 64 MiB.
    pub copy_piece_bytes: u64,
    /// 1: no peer copies, every device copies all of the backup from host
    /// memory (host memory read once per device). 0 (default): exchange the
    /// parts over peer copies wherever two devices can reach each other.
    pub no_peer_copies: i32,
}

// SAFETY: repr(C), `size` first, integers only.
unsafe impl SizedOptions for vmmw_replica_wake_options_t {
    const NAME: &'static str = "vmmw_replica_wake_options_t";
    fn defaults() -> Self {
        vmmw_replica_wake_options_t {
            size: std::mem::size_of::<Self>(),
            copy_piece_bytes: 0,
            no_peer_copies: 0,
        }
    }
}

/// What `vmmw_replicas_sleep` did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_replica_sleep_result_t {
    /// Bytes copied into the one host backup (from the first device;
    /// encoded bytes for `VMMW_POLICY_OFFLOAD_COMPRESSED`).
    pub backup_bytes: u64,
    /// Physical bytes released over all devices.
    pub released_bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// What `vmmw_replicas_wake_from_backup` did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_replica_wake_result_t {
    /// Bytes read from the host backup over all devices (the backup's size
    /// when every pair exchanged over peer copies).
    pub host_bytes: u64,
    /// Bytes moved between devices by peer copies.
    pub peer_bytes: u64,
    /// Device bytes restored on all devices together.
    pub delivered_bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Seconds spent mapping memory on every device.
    pub map_seconds: f64,
    /// Seconds of the host phase (each device its part, at once).
    pub host_seconds: f64,
    /// Seconds of the exchange between devices.
    pub peer_seconds: f64,
    /// Delivered bytes per second over all devices, in GB/s (10^9).
    pub gbps: f64,
    /// Ordered device pairs that copied from the backup instead of a peer
    /// (no peer access between them, or `no_peer_copies`).
    pub direct_pairs: u32,
}

/// `count` replicas: `tags[i]` in `pools[i]`.
///
/// # Safety
/// As the callers' contracts on `pools` and `tags`.
unsafe fn members<'a>(
    pools: *const *mut vmmw_pool_t,
    tags: *const u32,
    count: usize,
    what: &str,
) -> Result<Vec<Replica<'a>>> {
    // SAFETY: forwarded contract.
    let ps = unsafe { slice_arg(pools, count, "pools") }?;
    // SAFETY: forwarded contract.
    let ts = unsafe { slice_arg(tags, count, "tags") }?;
    if count == 0 {
        return Err(Error::InvalidArgument(format!(
            "{what} needs at least one replica (count is 0)"
        )));
    }
    ps.iter()
        .zip(ts)
        .map(|(&p, &t)| {
            // SAFETY: forwarded contract (live handles for the call).
            let p: &'a vmmw_pool_t = unsafe { arg(p, "pools[i]") }?;
            Ok(Replica {
                pool: &p.pool,
                tag: TagId(t),
            })
        })
        .collect()
}

/// Put replicas to sleep on one raw host backup: `vmmw_replicas_sleep_with`
/// with default options (the holder offloaded with `VMMW_POLICY_OFFLOAD`).
///
/// Errors: as `vmmw_replicas_sleep_with`.
///
/// # Safety
/// As `vmmw_replicas_sleep_with` with `options` NULL.
#[no_mangle]
pub unsafe extern "C" fn vmmw_replicas_sleep(
    pools: *const *mut vmmw_pool_t,
    tags: *const u32,
    count: usize,
    out: *mut vmmw_replica_sleep_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    // SAFETY: forwarded contract.
    unsafe { vmmw_replicas_sleep_with(pools, tags, count, std::ptr::null(), out, error) }
}

/// Put replicas to sleep on one host backup: `tags[i]` in `pools[i]`, one
/// pool per device, `count` of them. `pools[0]`'s tag (the holder) is
/// offloaded to pinned host memory with `options.holder_policy`
/// (`VMMW_POLICY_OFFLOAD` by default, or `VMMW_POLICY_OFFLOAD_COMPRESSED`
/// to keep the backup as codec frames, encoded with the holder pool's sleep
/// options); every other tag releases its physical memory without a copy.
/// The caller asserts every tag holds the same bytes;
/// the library checks the layout (same segments in the same creation order,
/// same sizes and live blocks: allocate the replicas the same way on every
/// device), not the bytes. Each tag is granted read access for the other
/// devices that can reach it, so the wake can exchange over peer copies.
/// Wake them with `vmmw_replicas_wake_from_backup`; waking one with `vmmw_pool_wake`
/// takes it out of the group (the holder gets its backup back, any other
/// tag undefined bytes). `options` may be NULL (defaults); `out` may be NULL.
///
/// A tag already asleep is accepted (the holder only when each of its
/// segments is offloaded or still awake, as a failed call leaves it), so a
/// call that failed midway can be repeated; the error says which device
/// stopped it. Blocks until done. Thread-safe; the rules of
/// `vmmw_pool_sleep` about other threads hold for every pool.
///
/// Errors that change nothing:
/// - `VMMW_NULL_ARGUMENT`: `pools` or `tags` is NULL with `count` > 0, or an
///   entry is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `count` is 0, a device is listed twice, pools
///   are on different backends, tags are laid out differently, bad
///   `options.size`, or `options.holder_policy` is not
///   `VMMW_POLICY_OFFLOAD` or `VMMW_POLICY_OFFLOAD_COMPRESSED`.
/// - `VMMW_UNSUPPORTED`: `options` from a newer header with fields this
///   library does not know set, or OffloadCompressed in a build without the
///   codec kernels.
/// - `VMMW_UNKNOWN_TAG`: a tag that never held memory in its pool.
/// - `VMMW_INVALID_STATE`: the holder is asleep without a backup.
/// - `VMMW_HOST_OUT_OF_MEMORY`: the backup does not fit; nothing sleeps.
///
/// Errors midway name the device that stopped the call; repeating the call
/// finishes it (see above).
///
/// # Safety
/// `pools` and `tags` point to `count` entries each (live pool handles);
/// `options` is NULL or readable for its `size` bytes; `out` is NULL or
/// writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_replicas_sleep_with(
    pools: *const *mut vmmw_pool_t,
    tags: *const u32,
    count: usize,
    options: *const vmmw_replica_sleep_options_t,
    out: *mut vmmw_replica_sleep_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let o = unsafe { read_sized(options) }?
            .unwrap_or_else(vmmw_replica_sleep_options_t::defaults)
            .to_rust()?;
        // SAFETY: forwarded contract.
        let m = unsafe { members(pools, tags, count, "vmmw_replicas_sleep") }?;
        let s = replicas::sleep_with(&m, &o)?;
        if !out.is_null() {
            let r = vmmw_replica_sleep_result_t {
                backup_bytes: s.backup_bytes,
                released_bytes: s.released_bytes,
                seconds: s.seconds,
            };
            // SAFETY: non-NULL and writable per the contract.
            unsafe { out.write(r) };
        }
        Ok(())
    })
}

/// Wake replicas put to sleep by `vmmw_replicas_sleep` or
/// `vmmw_replicas_sleep_with` (the same tags and pools, in any order). Every
/// device maps its memory again, copies its own 1/N part of the one host
/// backup over its own link (all devices at once), then pulls the other
/// parts from the devices that copied them (peer copies): host memory is
/// read once. A pair of devices without peer access copies that part from
/// the backup instead. A compressed backup is shared the same way by its
/// codec frames: each device decodes its part into its own memory, checking
/// every block's checksum, and a device that cannot read a peer decodes that
/// peer's frames itself. `options` may be NULL
/// (defaults); `out` may be NULL.
///
/// Nothing is lost on a failure. On success every tag is awake holding the
/// holder's bytes.
///
/// Blocks until done. Thread-safe; the rules of `vmmw_pool_wake` about other
/// threads hold for every pool.
///
/// Errors (nothing changes on any of them, unless said):
/// - `VMMW_NULL_ARGUMENT`: `pools` or `tags` is NULL with `count` > 0, or an
///   entry is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `count` is 0, a device is listed twice, or bad
///   `options.size`.
/// - `VMMW_UNSUPPORTED`: `options` from a newer header with fields this
///   library does not know set.
/// - `VMMW_UNKNOWN_TAG`: a tag that never held memory in its pool.
/// - `VMMW_INVALID_STATE`: a tag is not asleep in one group with every other
///   listed one (never slept with them, or woken or slept on its own since).
/// - `VMMW_OUT_OF_MEMORY`: free memory, checked on every device before
///   anything is mapped, is short.
/// - `VMMW_INVALID_STATE` naming a frame that fails its checksum: a corrupt
///   compressed backup (or a corrupt transfer), as below.
/// - A map, a copy or a decode that fails on any device: the memory mapped
///   on every device is released again and every tag stays asleep in its group with
///   the backup intact; the error names the device, and calling again can
///   succeed.
///
/// # Safety
/// `pools` and `tags` point to `count` entries each (live pool handles);
/// `options` is NULL or readable for its `size` bytes; `out` is NULL or
/// writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_replicas_wake_from_backup(
    pools: *const *mut vmmw_pool_t,
    tags: *const u32,
    count: usize,
    options: *const vmmw_replica_wake_options_t,
    out: *mut vmmw_replica_wake_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let o =
            unsafe { read_sized(options) }?.unwrap_or_else(vmmw_replica_wake_options_t::defaults);
        let opts = ReplicaWakeOptions {
            peer_copies: match o.no_peer_copies {
                0 => true,
                1 => false,
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "vmmw_replica_wake_options_t.no_peer_copies is {other}: expected 0 or 1"
                    )))
                }
            },
            copy_piece_bytes: or_default(
                o.copy_piece_bytes,
                ReplicaWakeOptions::default().copy_piece_bytes,
                "copy_piece_bytes",
            )?,
        };
        // SAFETY: forwarded contract.
        let m = unsafe { members(pools, tags, count, "vmmw_replicas_wake_from_backup") }?;
        let s = replicas::wake_from_backup(&m, &opts)?;
        if !out.is_null() {
            let r = vmmw_replica_wake_result_t {
                host_bytes: s.host_bytes,
                peer_bytes: s.peer_bytes,
                delivered_bytes: s.delivered_bytes,
                seconds: s.seconds,
                map_seconds: s.map_seconds,
                host_seconds: s.host_seconds,
                peer_seconds: s.peer_seconds,
                gbps: s.aggregate_gbps(),
                direct_pairs: s.direct_pairs as u32,
            };
            // SAFETY: non-NULL and writable per the contract.
            unsafe { out.write(r) };
        }
        Ok(())
    })
}

/// The former name of `vmmw_replicas_wake_from_backup`, kept through 0.x;
/// removed at 1.0.
///
/// Errors: as `vmmw_replicas_wake_from_backup`.
///
/// # Safety
/// As `vmmw_replicas_wake_from_backup`.
#[no_mangle]
#[deprecated(
    note = "renamed vmmw_replicas_wake_from_backup (vmmw_replicas_wake_by_reload wakes from the checkpoint)"
)]
pub unsafe extern "C" fn vmmw_replicas_wake(
    pools: *const *mut vmmw_pool_t,
    tags: *const u32,
    count: usize,
    options: *const vmmw_replica_wake_options_t,
    out: *mut vmmw_replica_wake_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    // SAFETY: forwarded contract.
    unsafe { vmmw_replicas_wake_from_backup(pools, tags, count, options, out, error) }
}
