//! Swaps and waiting wakes from C: some tags put to sleep while others wake
//! at once (`vmmw_pool_swap`), and a wake that waits for device memory being
//! released instead of refusing at once (`vmmw_pool_wake_with`).

use std::time::Duration;

use super::boundary::{arg, call, slice_arg};
use super::error::vmmw_error_t;
use super::options::{read_sized, SizedOptions};
use super::pool::vmmw_pool_t;
use super::sleep::{record, tag_policies, vmmw_tag_policy_t};
use super::status::{vmmw_status_t, VMMW_OK};
use crate::pool::{SwapOptions, TagCycle};
use crate::sleep::WakeOptions;
use crate::tag::TagId;

/// Options of `vmmw_pool_wake_with`. Start from `VMMW_WAKE_OPTIONS_INIT` (C)
/// so `size` is set; every other field 0 is its default.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_wake_options_t {
    /// `sizeof(vmmw_wake_options_t)` as the caller's header declares it
    /// (`VMMW_WAKE_OPTIONS_INIT`): fields past it take their defaults.
    pub size: usize,
    /// 0 (the default): as `vmmw_pool_wake`, the bytes needed are compared
    /// with free device memory first and a shortfall fails at once with
    /// `VMMW_OUT_OF_MEMORY`, nothing changed. Otherwise: each physical chunk
    /// is mapped as soon as the device has room, waiting up to this many
    /// milliseconds in all for memory being released meanwhile (another
    /// process putting its model to sleep, another pool trimming), polling
    /// the driver's free memory; then the wake fails as any wake does: the
    /// tag asleep, its backup intact, `VMMW_OUT_OF_MEMORY` naming the tag,
    /// the bytes needed and free. Values over a year count as a year.
    pub wait_memory_ms: u64,
}

// SAFETY: repr(C), `size: usize` first, integers only.
unsafe impl SizedOptions for vmmw_wake_options_t {
    const NAME: &'static str = "vmmw_wake_options_t";
    fn defaults() -> Self {
        vmmw_wake_options_t {
            size: std::mem::size_of::<Self>(),
            wait_memory_ms: 0,
        }
    }
}

/// Options of `vmmw_pool_swap`. Start from `VMMW_SWAP_OPTIONS_INIT` (C) so
/// `size` is set; every other field 0 is its default.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_swap_options_t {
    /// `sizeof(vmmw_swap_options_t)` as the caller's header declares it
    /// (`VMMW_SWAP_OPTIONS_INIT`): fields past it take their defaults.
    pub size: usize,
    /// Once the sleep side has ended, how many milliseconds the wake side may
    /// still wait for device memory released elsewhere before it fails (the
    /// tag asleep, its backup intact). 0 (the default): the swap is refused
    /// up front, nothing changed, when the waking tags need more than the
    /// free memory plus what the sleeping tags hold; and the wake fails as
    /// soon as the sleep has ended without making room.
    pub wait_memory_ms: u64,
}

// SAFETY: repr(C), `size: usize` first, integers only.
unsafe impl SizedOptions for vmmw_swap_options_t {
    const NAME: &'static str = "vmmw_swap_options_t";
    fn defaults() -> Self {
        vmmw_swap_options_t {
            size: std::mem::size_of::<Self>(),
            wait_memory_ms: 0,
        }
    }
}

/// What `vmmw_pool_swap` did, each side on its own.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_swap_result_t {
    /// `VMMW_OK`, or why the sleep side stopped (the tag it names is as a
    /// failed `vmmw_pool_sleep` leaves it, the tags after it awake).
    pub sleep_status: vmmw_status_t,
    /// `VMMW_OK`, or why the wake side stopped (that tag is asleep with its
    /// backup intact; the ones after it are as they were).
    pub wake_status: vmmw_status_t,
    /// Tags of the sleep list put to sleep.
    pub slept_tags: u64,
    /// Tags of the wake list woken.
    pub woken_tags: u64,
    /// Physical bytes the sleep side released.
    pub released_bytes: u64,
    /// Physical bytes the wake side mapped.
    pub mapped_bytes: u64,
    /// Bytes the sleep side copied device to host (encoded bytes for
    /// `VMMW_POLICY_OFFLOAD_COMPRESSED`).
    pub copied_out_bytes: u64,
    /// Bytes the wake side copied host to device, and restored from
    /// checkpoints (Reload).
    pub copied_in_bytes: u64,
    /// Wall time of the sleep side, in seconds.
    pub sleep_seconds: f64,
    /// Wall time of the wake side, in seconds.
    pub wake_seconds: f64,
    /// Wall time of the whole swap, in seconds.
    pub seconds: f64,
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Wake the `n` listed tags (every sleeping tag when `n` is 0) as
/// `vmmw_pool_wake` does, with `options` (NULL: the defaults, which make it
/// `vmmw_pool_wake`). With `wait_memory_ms` set, a wake short of free device
/// memory waits for memory another process or pool releases, mapping each
/// chunk as the device has room, instead of failing at once: how two
/// processes swap (one sleeps while the other wakes with a wait). Each tag's
/// wake stays transactional. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL, or `tags` is NULL with `n` > 0.
/// - `VMMW_INVALID_ARGUMENT`, `VMMW_UNSUPPORTED`: a bad `options->size`
///   (docs/ABI.md).
/// - `VMMW_UNKNOWN_TAG`: a tag that never held memory in this pool; nothing
///   changes.
/// - `VMMW_OUT_OF_MEMORY`: without a wait, the bytes needed exceed free device
///   memory (nothing changes); with one, more than the device's total, or the
///   wait ran out (that tag asleep, its backup intact; the message names the
///   tag, the bytes needed and free).
/// - `VMMW_CHECKPOINT_INVALID`: as in `vmmw_pool_wake`.
///
/// # Safety
/// `pool` is a live handle; `tags` is readable for `n` entries (NULL when `n`
/// is 0); `options` is NULL or readable for `options->size` bytes; `error` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_wake_with(
    pool: *mut vmmw_pool_t,
    tags: *const u32,
    n: usize,
    options: *const vmmw_wake_options_t,
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
        // SAFETY: forwarded contract (NULL means defaults).
        let o = unsafe { read_sized(options) }?.unwrap_or_else(vmmw_wake_options_t::defaults);
        let cycles = p.pool.wake_with(
            &tags,
            WakeOptions {
                wait_for_memory: millis(o.wait_memory_ms),
            },
        )?;
        record(p, cycles);
        Ok(())
    })
}

/// Put the `n_sleep` tags of `sleep` to sleep (each with its policy) and wake
/// the `n_wake` tags of `wake`, at once: the sleep's device-to-host copies
/// and the wake's host-to-device copies (or Reload re-reads, or compressed
/// decodes) share the link's two directions, and each chunk of the waking
/// tags is mapped as soon as the sleeping ones free room for it. A swap
/// between two models takes about the link time of the larger one, not the
/// sum. `options` NULL: the defaults.
///
/// Refused, nothing changed (`*result` not written): a NULL argument, a bad
/// policy or `options->size`, a tag unknown to the pool (`VMMW_UNKNOWN_TAG`),
/// a tag listed twice or in both lists (`VMMW_INVALID_ARGUMENT`), a
/// sleeping tag a `vmmw_loader_load` writes into (`VMMW_LOAD_IN_PROGRESS`),
/// and (with no `wait_memory_ms`) waking tags that need more than the free
/// device memory plus what the sleeping tags hold (`VMMW_OUT_OF_MEMORY`).
///
/// Otherwise the swap runs and `*result` (when not NULL) is written, also
/// when a side failed, with each side's status: the call returns `VMMW_OK`
/// when both succeeded, else the wake side's status when it failed, else the
/// sleep side's (the error message names the failing tag and says how the
/// other side ended). Each sleeping tag ends as `vmmw_pool_sleep` leaves it,
/// each waking tag's wake is transactional (on a failure it stays asleep with
/// its backup intact); no byte is lost. `vmmw_pool_last_cycle_json` then
/// lists every tag slept and woken. Concurrency as in `vmmw_pool_sleep`:
/// thread-safe; every listed tag refuses allocation until the call returns.
///
/// # Safety
/// `pool` is a live handle; `sleep` is readable for `n_sleep` entries and
/// `wake` for `n_wake` (each NULL when its count is 0); `options` is NULL or
/// readable for `options->size` bytes; `result` is NULL or writable; `error`
/// is NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn vmmw_pool_swap(
    pool: *mut vmmw_pool_t,
    sleep: *const vmmw_tag_policy_t,
    n_sleep: usize,
    wake: *const u32,
    n_wake: usize,
    options: *const vmmw_swap_options_t,
    result: *mut vmmw_swap_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        // SAFETY: forwarded contract (`sleep` readable for `n_sleep` entries).
        let items: &[vmmw_tag_policy_t] = unsafe { slice_arg(sleep, n_sleep, "sleep") }?;
        let sleep = tag_policies(items)?;
        // SAFETY: forwarded contract (`wake` readable for `n_wake` entries).
        let wake: Vec<TagId> = unsafe { slice_arg(wake, n_wake, "wake") }?
            .iter()
            .map(|&t| TagId(t))
            .collect();
        // SAFETY: forwarded contract (NULL means defaults).
        let o = unsafe { read_sized(options) }?.unwrap_or_else(vmmw_swap_options_t::defaults);
        let out = p.pool.swap_with(
            &sleep,
            &wake,
            SwapOptions {
                wait_for_memory: millis(o.wait_memory_ms),
            },
        )?;
        let sum = |c: &[TagCycle], f: &dyn Fn(&TagCycle) -> u64| c.iter().map(f).sum::<u64>();
        let status = |e: &Option<crate::Error>| e.as_ref().map_or(VMMW_OK, |e| e.status() as i32);
        let r = vmmw_swap_result_t {
            sleep_status: status(&out.sleep_error),
            wake_status: status(&out.wake_error),
            slept_tags: out.slept.len() as u64,
            woken_tags: out.woke.len() as u64,
            released_bytes: sum(&out.slept, &|c| c.report.physical_bytes),
            mapped_bytes: sum(&out.woke, &|c| c.report.physical_bytes),
            copied_out_bytes: sum(&out.slept, &|c| c.report.copied_bytes),
            copied_in_bytes: sum(&out.woke, &|c| {
                c.report.copied_bytes + c.report.reloaded_bytes
            }),
            sleep_seconds: out.sleep_seconds,
            wake_seconds: out.wake_seconds,
            seconds: out.seconds,
        };
        if !result.is_null() {
            // SAFETY: non-NULL and writable (the caller's contract).
            unsafe { result.write(r) };
        }
        let mut cycles = out.slept;
        cycles.extend(out.woke);
        record(p, cycles);
        match (out.wake_error, out.sleep_error) {
            (None, None) => Ok(()),
            (Some(e), None) => Err(e.with_context("; the sleep side succeeded")),
            (Some(e), Some(s)) => Err(e.with_context(&format!("; the sleep side failed too: {s}"))),
            (None, Some(s)) => Err(s.with_context("; the wake side succeeded")),
        }
    })
}
