//! Sleep and wake from C: release the physical memory behind a pool's tags
//! while every pointer stays valid, and bring it back at the same addresses.

use std::ffi::c_char;

use super::boundary::{arg, call, call_out, slice_arg};
use super::buffer::write_str;
use super::error::vmmw_error_t;
use super::numbers::or_default;
use super::options::{read_sized, SizedOptions};
use super::pool::vmmw_pool_t;
use super::status::vmmw_status_t;
use crate::error::{Error, Result};
use crate::pool::TagCycle;
use crate::sleep::{Policy, SleepOptions};
use crate::tag::TagId;

/// What sleep does with a tag's memory: one of the `VMMW_POLICY_*` values.
pub type vmmw_policy_t = i32;

/// Sleep policy: copy to a pinned host backup, restored byte for byte at wake.
pub const VMMW_POLICY_OFFLOAD: vmmw_policy_t = 0;
/// Sleep policy: drop the contents (undefined after wake), e.g. a KV cache.
pub const VMMW_POLICY_DISCARD: vmmw_policy_t = 1;
/// Sleep policy: restore at wake from the checkpoint the bytes were loaded
/// from (needs a load through `vmmw_loader_load` into this pool); every other
/// byte of the tag's live blocks (buffers the model computes, later
/// allocations, block padding, blocks freed and allocated again since the
/// load) is kept in the host backup, so the host holds only those. Before
/// anything is mapped at wake, each checkpoint file is checked to be the one
/// loaded (device, inode, size, modification time; and content checksums when
/// the load asked for them, `vmmw_loader_set_reload_check`): a changed file
/// fails the wake with `VMMW_CHECKPOINT_INVALID` naming it, the tag stays
/// asleep, and `vmmw_pool_forget_reload` then lets it wake. The check runs
/// right before the files are read: a file truncated while that very wake
/// reads it is not caught (a read through its mapping can then fault), so do not
/// modify checkpoints that sleeping tags reload from.
pub const VMMW_POLICY_RELOAD: vmmw_policy_t = 2;

/// Sleep policy: as `VMMW_POLICY_OFFLOAD`, but the host backup is held
/// losslessly compressed. The GPU encodes each segment (exponent bytes coded
/// per 64 KiB block, sign and mantissa kept raw), only the encoded bytes
/// cross the link and occupy pinned host memory, and wake decodes them on
/// the GPU, checking each block's checksum: a corrupt backup fails the wake
/// with the tag still asleep and the backup intact. About 70% of raw on bf16
/// weights; data that does not compress costs under 0.1% more than Offload.
/// Needs the codec kernels in the build (`VMMW_UNSUPPORTED` otherwise).
/// Replicas keep their one host backup this way when
/// `vmmw_replicas_sleep_with` says so.
pub const VMMW_POLICY_OFFLOAD_COMPRESSED: vmmw_policy_t = 3;

/// One tag and the policy it sleeps with.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_tag_policy_t {
    /// A tag id from `vmmw_tag_id`.
    pub tag: u32,
    /// A `VMMW_POLICY_*` value.
    pub policy: vmmw_policy_t,
}

/// Drop the host backups the `n` listed tags kept after their last wake (a
/// wake keeps a tag's backup, so its next sleep reuses the same memory,
/// unless `free_backup_after_wake` is set): the backups are released, and
/// their pinned memory stays in the pool's backup arena for the next sleep
/// of any tag, so it costs nothing to pin again. With `unpin` = 1, every
/// backup slab holding no asleep segment's bytes is also unpinned (as
/// `vmmw_pool_release_backup`). Asleep tags keep their backups; a tag
/// without one is no error. `*released` receives the bytes unpinned (0
/// without `unpin`). Thread-safe: a sleep or wake running now keeps the
/// backups it uses.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `released` is NULL, or `tags` is NULL
///   with `n` > 0.
/// - `VMMW_INVALID_ARGUMENT`: `unpin` is not 0 or 1; nothing changes.
/// - `VMMW_UNKNOWN_TAG`: a tag id never registered; nothing changes.
///
/// # Safety
/// `pool` is a live handle; `tags` is readable for `n` entries (NULL when `n`
/// is 0); `released` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_drop_backups(
    pool: *mut vmmw_pool_t,
    tags: *const u32,
    n: usize,
    unpin: u32,
    released: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(released, "released", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        // SAFETY: forwarded contract (`tags` readable for `n` entries).
        let tags: Vec<TagId> = unsafe { slice_arg(tags, n, "tags") }?
            .iter()
            .map(|&t| TagId(t))
            .collect();
        let unpin = match unpin {
            0 => false,
            1 => true,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unpin = {other} must be 0 or 1"
                )))
            }
        };
        p.pool.drop_backups(&tags, unpin)
    })
}

/// Tunables of a pool's sleep engine. Every field but `size` 0 means the
/// default. Start from `VMMW_SLEEP_OPTIONS_INIT` (C) so `size` is set.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_sleep_options_t {
    /// `sizeof(vmmw_sleep_options_t)` as the caller's header declares it (see
    /// `VMMW_SLEEP_OPTIONS_INIT`): fields past it take their defaults.
    pub size: usize,
    /// Bytes per copy on one stream (default 64 MiB).
    pub copy_piece_bytes: u64,
    /// Streams the copies are spread over (default 2, at most 64).
    pub streams: u32,
    /// 1: fill discarded memory with `debug_fill_byte` at wake, so stale reads show.
    pub debug_fill: u32,
    /// At wake, re-cut unmapped runs into physical chunks of this size (default 256 MiB).
    pub wake_coalesce_bytes: u64,
    /// Size of each pinned backup slab.
    pub backup_slab_bytes: u64,
    /// Cap on pinned backup memory (default unlimited), counted in whole
    /// pinned pages (2 MiB): an offload beyond it fails with
    /// `VMMW_HOST_OUT_OF_MEMORY` before anything moves.
    pub host_memory_limit: u64,
    /// 1: free a segment's backup once it is awake again.
    pub free_backup_after_wake: u32,
    /// 1: also unpin backup slabs that hold nothing after wake.
    pub release_pinned_after_wake: u32,
    /// The byte `debug_fill` writes.
    pub debug_fill_byte: u8,
    /// `VMMW_POLICY_OFFLOAD_COMPRESSED`: the width in bytes of the tag's
    /// elements, which decides the bits the codec codes: 2 (bf16, fp16; the
    /// default), 4 (fp32) or 1 (fp8, int8, anything else). Any other value is
    /// `VMMW_INVALID_ARGUMENT`.
    pub codec_element_bytes: u32,
}

// SAFETY: repr(C), `size: usize` first, integers only.
unsafe impl SizedOptions for vmmw_sleep_options_t {
    const NAME: &'static str = "vmmw_sleep_options_t";
    fn defaults() -> Self {
        vmmw_sleep_options_t {
            size: std::mem::size_of::<Self>(),
            copy_piece_bytes: 0,
            streams: 0,
            debug_fill: 0,
            wake_coalesce_bytes: 0,
            backup_slab_bytes: 0,
            host_memory_limit: 0,
            free_backup_after_wake: 0,
            release_pinned_after_wake: 0,
            debug_fill_byte: 0,
            codec_element_bytes: 0,
        }
    }
}

pub(super) fn policy(p: vmmw_policy_t, tag: u32) -> Result<Policy> {
    match p {
        VMMW_POLICY_OFFLOAD => Ok(Policy::Offload),
        VMMW_POLICY_DISCARD => Ok(Policy::Discard),
        VMMW_POLICY_RELOAD => Ok(Policy::Reload),
        VMMW_POLICY_OFFLOAD_COMPRESSED => Ok(Policy::OffloadCompressed),
        other => Err(Error::InvalidArgument(format!(
            "policy {other} for tag {tag} is not VMMW_POLICY_OFFLOAD (0), _DISCARD (1), _RELOAD (2) or _OFFLOAD_COMPRESSED (3)"
        ))),
    }
}

/// The C list of tags and their policies, as the pool takes it.
pub(super) fn tag_policies(items: &[vmmw_tag_policy_t]) -> Result<Vec<(TagId, Policy)>> {
    items
        .iter()
        .map(|i| Ok((TagId(i.tag), policy(i.policy, i.tag)?)))
        .collect()
}

pub(super) fn record(p: &vmmw_pool_t, cycles: Vec<TagCycle>) {
    *p.last_cycles.lock().unwrap_or_else(|e| e.into_inner()) = cycles;
}

/// Put the `n` listed tags to sleep, each with its policy. Every pointer stays
/// valid; touching a sleeping tag's memory faults until it wakes; allocating
/// in it fails with `VMMW_INVALID_STATE`. A tag already asleep is left as is.
/// The caller must make sure no queued GPU work still uses the memory (the
/// library synchronizes the device before unmapping, but cannot see work
/// queued later; when that synchronize fails nothing is unmapped and the error
/// is returned). Every entry is checked before anything moves. Tags are processed in order;
/// on a failure the earlier tags are asleep and the error names the failing one.
/// A sleep that fails midway leaves the failing tag partly asleep (the report
/// counts what is still mapped as tracked); calling again finishes it.
///
/// Rules with other threads: a tag that a `vmmw_loader_load` is writing into
/// is refused with `VMMW_LOAD_IN_PROGRESS` and nothing changes (also from the
/// load's own progress callback): sleep it once the load returned, or cancel
/// the load. The pool lock is not held across copies: while a tag sleeps or
/// wakes, other tags allocate and free freely; allocating in that tag fails
/// with `VMMW_INVALID_STATE`; freeing in it works (its segments are released
/// when the call ends); a second sleep or wake of it waits for the first.
/// Thread-safe.
///
/// Backups cover whole committed segments, not only live blocks: a tag
/// holding one small block in its own segment backs up the granularity.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL, or `items` is NULL with `n` > 0.
/// - `VMMW_INVALID_ARGUMENT`: an unknown policy; checked before anything moves.
/// - `VMMW_UNKNOWN_TAG`: a tag that never held memory in this pool (such as a
///   misspelling); checked before anything moves.
/// - `VMMW_INVALID_STATE`: Reload for a tag with no load behind it.
/// - `VMMW_LOAD_IN_PROGRESS`: a `vmmw_loader_load` is writing into a listed
///   tag; nothing changes.
/// - `VMMW_HOST_OUT_OF_MEMORY`: a backup over the limit or over the host's
///   available memory; that tag stays awake.
///
/// # Safety
/// `pool` is a live handle; `items` is readable for `n` entries (NULL when `n`
/// is 0); `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_sleep(
    pool: *mut vmmw_pool_t,
    items: *const vmmw_tag_policy_t,
    n: usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        // SAFETY: forwarded contract (`items` readable for `n` entries).
        let items: &[vmmw_tag_policy_t] = unsafe { slice_arg(items, n, "items") }?;
        let cycles = p.pool.sleep(&tag_policies(items)?)?;
        record(p, cycles);
        Ok(())
    })
}

/// Wake the `n` listed tags (every sleeping tag when `n` is 0), at the same
/// addresses. Offloaded contents come back byte for byte, reloadable ones are
/// re-read from their checkpoint, discarded ones are undefined. The bytes
/// needed are checked against free device memory first; each tag's wake is
/// transactional (on failure it stays asleep with its backup intact, and a
/// later wake can succeed). Waking an awake tag does nothing. Concurrency as
/// in `vmmw_pool_sleep`. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL, or `tags` is NULL with `n` > 0.
/// - `VMMW_UNKNOWN_TAG`: a tag that never held memory in this pool; nothing
///   changes.
/// - `VMMW_OUT_OF_MEMORY`: the bytes needed exceed free device memory;
///   nothing changes.
/// - `VMMW_CHECKPOINT_INVALID`: a Reload tag's checkpoint changed since its
///   load (see `VMMW_POLICY_RELOAD`); found before any byte is touched.
///
/// # Safety
/// `pool` is a live handle; `tags` is readable for `n` entries (NULL when `n`
/// is 0); `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_wake(
    pool: *mut vmmw_pool_t,
    tags: *const u32,
    n: usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        // SAFETY: forwarded contract (`tags` readable for `n` entries).
        let tags: Vec<TagId> = unsafe { slice_arg(tags, n, "tags") }?
            .iter()
            .map(|&t| TagId(t))
            .collect();
        let cycles = p.pool.wake(&tags)?;
        record(p, cycles);
        Ok(())
    })
}

/// Drop the reload sources of `tag` (what `vmmw_loader_load` registered).
/// A tag asleep with `VMMW_POLICY_RELOAD` then wakes with its backed-up bytes
/// restored and the loaded bytes undefined: the way to wake a tag whose
/// checkpoint changed, then load the new file into it. Later Reload sleeps of
/// the tag need a new load first. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
///
/// # Safety
/// `pool` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_forget_reload(
    pool: *mut vmmw_pool_t,
    tag: u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(pool, "pool") }?
            .pool
            .forget_reload_sources(TagId(tag))
    })
}

/// Pin `bytes` of host backup memory ahead of time, so even the first offload
/// sleep runs at the link's rate (pinning at sleep time is slow).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_HOST_OUT_OF_MEMORY`: beyond the sleep options' host-memory limit
///   or the host's available memory, checked before pinning (any size up to
///   `UINT64_MAX` is refused at once); a failure midway unpins what this call
///   pinned. The limit counts whole pinned pages (2 MiB).
///
/// Thread safety: safe from any thread; a call while a sleep or wake of the
/// pool's device runs waits for it to end.
///
/// # Safety
/// `pool` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_reserve_backup(
    pool: *mut vmmw_pool_t,
    bytes: u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(pool, "pool") }?.pool.reserve_backup(bytes)
    })
}

/// Unpin backup memory that holds no sleeping tag's contents; `*released`
/// receives the bytes unpinned.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `released` is NULL.
///
/// # Safety
/// `pool` is a live handle; `released` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_release_backup(
    pool: *mut vmmw_pool_t,
    released: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(released, "released", error, || {
        // SAFETY: forwarded contract.
        Ok(unsafe { arg(pool, "pool") }?.pool.release_backup())
    })
}

/// Replace the pool's sleep options (`options` NULL: all defaults). The
/// host-memory limit applies to future pinning. `options->size` must be set
/// (`VMMW_SLEEP_OPTIONS_INIT`); see `vmmw_sleep_options_t`.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `streams` over 64, or a size over 2^56; the
///   previous options stay.
///
/// # Safety
/// `pool` is a live handle; `options` is NULL or readable for
/// `options->size` bytes; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_set_sleep_options(
    pool: *mut vmmw_pool_t,
    options: *const vmmw_sleep_options_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        // SAFETY: forwarded contract (NULL means defaults).
        let o = unsafe { read_sized(options) }?.unwrap_or_else(vmmw_sleep_options_t::defaults);
        let d = SleepOptions::default();
        let opts = SleepOptions {
            copy_piece_bytes: or_default(
                o.copy_piece_bytes,
                d.copy_piece_bytes,
                "copy_piece_bytes",
            )?,
            streams: if o.streams == 0 {
                d.streams
            } else {
                o.streams as usize
            },
            wake_coalesce_bytes: or_default(
                o.wake_coalesce_bytes,
                d.wake_coalesce_bytes,
                "wake_coalesce_bytes",
            )?,
            backup_slab_bytes: or_default(
                o.backup_slab_bytes,
                d.backup_slab_bytes,
                "backup_slab_bytes",
            )?,
            host_memory_limit: if o.host_memory_limit == 0 {
                d.host_memory_limit
            } else {
                o.host_memory_limit
            },
            free_backup_after_wake: o.free_backup_after_wake != 0,
            release_pinned_after_wake: o.release_pinned_after_wake != 0,
            debug_fill_discarded: (o.debug_fill != 0).then_some(o.debug_fill_byte),
            pipeline_slab_bytes: d.pipeline_slab_bytes,
            codec_layout: match o.codec_element_bytes {
                0 => d.codec_layout,
                w => u8::try_from(w)
                    .ok()
                    .and_then(crate::codec::Layout::from_width)
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "sleep option codec_element_bytes = {w} must be 0 (default), 1, 2 or 4"
                        ))
                    })?,
            },
            codec_frame_bytes: d.codec_frame_bytes,
            codec_ring: d.codec_ring,
        };
        p.pool.set_sleep_options(opts)
    })
}

/// What the last successful `vmmw_pool_sleep` or `vmmw_pool_wake` on this
/// handle did, per tag (segments, bytes released or mapped, bytes copied,
/// seconds), as JSON into `buf` (buffer contract of `vmmw_device_describe`).
///
/// Errors (the last two are the buffer contract):
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_BUFFER_TOO_SMALL`: `cap` is short; `*needed` is set, nothing is
///   written to `buf`.
/// - `VMMW_NULL_ARGUMENT`: `buf` is NULL and `cap` > 0; nothing is written.
///
/// # Safety
/// `pool` is a live handle; `buf` is NULL or writable for `cap` bytes;
/// `needed` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_last_cycle_json(
    pool: *const vmmw_pool_t,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        let json = {
            let c = p.last_cycles.lock().unwrap_or_else(|e| e.into_inner());
            serde_json::to_string_pretty(&*c).map_err(|e| {
                Error::InvalidState(format!("cannot serialize the cycle report: {e}"))
            })?
        };
        // SAFETY: forwarded contract.
        unsafe { write_str(&json, buf, cap, needed) }
    })
}
