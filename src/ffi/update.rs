//! `vmmw_update_source_t` and `vmmw_update`: new weights into the
//! destinations a loader registered, through its rules; and each tag's
//! weights version in a pool (docs/UPDATES.md).
//!
//! Flow: load as usual (`vmmw_loader_*`), then for each update make a source
//! (`vmmw_update_source_new`), add the trainer's tensors by checkpoint name
//! (`vmmw_update_source_add`), and call `vmmw_update` with the version the
//! update replaces (`vmmw_pool_tag_version`). A source serves any number of
//! updates while its tensors stay valid.

use std::ffi::c_char;
use std::sync::Mutex;

use super::boundary::{arg, call, call_out, free_handle, into_handle, slice_arg, str_arg};
use super::error::vmmw_error_t;
use super::loader::vmmw_loader_t;
use super::numbers::to_usize;
use super::options::{read_sized, SizedOptions};
use super::pool::vmmw_pool_t;
use super::status::vmmw_status_t;
use crate::error::{Error, Result};
use crate::loader::{Dtype, PlanOptions};
use crate::tag::TagId;
use crate::update::{self, Bytes, Staging, Tensors, UpdateOptions, UpdateResult};

/// Where an update source tensor's bytes lie: one of the `VMMW_UPDATE_*` values.
pub type vmmw_update_memory_t = i32;

/// Device memory the destinations' device can read (its own memory from
/// any allocator: a trainer's tensors, `cudaMalloc`, a pool block).
pub const VMMW_UPDATE_DEVICE: vmmw_update_memory_t = 0;
/// Host memory of this process (pageable or pinned).
pub const VMMW_UPDATE_HOST: vmmw_update_memory_t = 1;

/// How an update keeps its failure rule: one of the `VMMW_STAGING_*` values.
pub type vmmw_staging_t = i32;

/// Staging (the default): a source of whole tensors of this process is
/// copied straight into the destinations (its bytes cannot go missing
/// midway).
pub const VMMW_STAGING_AUTO: vmmw_staging_t = 0;
/// Staging: always copy into scratch device memory first, then into the
/// destinations (costs device memory equal to the bytes written).
pub const VMMW_STAGING_ALWAYS: vmmw_staging_t = 1;

/// Whole tensors, by checkpoint name, that an update reads. Calls on one
/// source serialize; an update holds it for its duration.
pub struct vmmw_update_source_t {
    pub(crate) tensors: Mutex<Tensors>,
}

/// Options of an update. Start from `VMMW_UPDATE_OPTIONS_INIT` (C) so `size`
/// is set, then set `expected_version`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_update_options_t {
    /// `sizeof(vmmw_update_options_t)` as the caller's header declares it.
    pub size: usize,
    /// The tag version the update replaces (`vmmw_pool_tag_version`); it
    /// produces the next one. Required: 0 is `VMMW_INVALID_ARGUMENT`.
    pub expected_version: u64,
    /// 1: version `tag` (required when the destinations lie outside the
    /// pool); 0: the one pool tag the destinations lie in.
    pub tag_set: u32,
    /// The tag to version when `tag_set` is 1.
    pub tag: u32,
    /// 1: update only the destinations the source fills; the others keep
    /// their bytes.
    pub allow_missing: u32,
    /// 1: source tensors no destination receives are skipped instead of an error.
    pub allow_unexpected: u32,
    /// A `VMMW_STAGING_*` value.
    pub staging: vmmw_staging_t,
}

// SAFETY: repr(C), `size: usize` first, integers only.
unsafe impl SizedOptions for vmmw_update_options_t {
    const NAME: &'static str = "vmmw_update_options_t";
    fn defaults() -> Self {
        vmmw_update_options_t {
            size: std::mem::size_of::<Self>(),
            expected_version: 0,
            tag_set: 0,
            tag: 0,
            allow_missing: 0,
            allow_unexpected: 0,
            staging: VMMW_STAGING_AUTO,
        }
    }
}

/// What an update did (from `vmmw_update`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_update_result_t {
    /// The tag versioned.
    pub tag: u32,
    /// 1 when the update staged through scratch device memory.
    pub staged: u32,
    /// 1 when the copies into the destinations failed once and ran again.
    pub retried: u32,
    /// The tag's new version.
    pub version: u64,
    /// Bytes written into destinations.
    pub bytes: u64,
    /// Destinations written.
    pub destinations: u64,
    /// Copies issued (a 2D copy counts once).
    pub copies: u64,
    /// Seconds from the first copy to the last byte in place.
    pub seconds: f64,
    /// Bytes written per second, in GB/s (10^9).
    pub gbps: f64,
    /// Seconds checking and planning, up to the first copy queued.
    pub plan_seconds: f64,
    /// Seconds queuing the copies on the device.
    pub issue_seconds: f64,
    /// Seconds waiting for the device to finish the copies.
    pub wait_seconds: f64,
    /// Seconds of Reload retirement (while the device copies), version
    /// publish and release.
    pub bookkeeping_seconds: f64,
}

impl From<&UpdateResult> for vmmw_update_result_t {
    fn from(r: &UpdateResult) -> Self {
        vmmw_update_result_t {
            tag: r.tag.0,
            staged: r.staged as u32,
            retried: r.retried as u32,
            version: r.version,
            bytes: r.bytes,
            destinations: r.destinations,
            copies: r.copies,
            seconds: r.seconds,
            gbps: r.gbps(),
            plan_seconds: r.phases.plan,
            issue_seconds: r.phases.issue,
            wait_seconds: r.phases.wait,
            bookkeeping_seconds: r.phases.bookkeeping,
        }
    }
}

/// A new, empty update source. On success `*out` receives a handle owned
/// by the caller (`vmmw_update_source_free`).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `out` is NULL.
///
/// # Safety
/// `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_source_new(
    out: *mut *mut vmmw_update_source_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        Ok(into_handle(vmmw_update_source_t {
            tensors: Mutex::new(Tensors::new()),
        }))
    })
}

/// Free an update source. NULL is accepted. The tensors it named stay the
/// caller's.
///
/// Errors: none. NULL is ignored.
///
/// # Safety
/// `source` is NULL or a live handle, not used afterwards and not concurrently.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_source_free(source: *mut vmmw_update_source_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(source) }
}

/// Add tensor `name` (its checkpoint name: the loader's rules map it) of
/// `dtype` ("BF16", "F16", "F32", ... or "bfloat16", ...) and `ndim`
/// dimensions `shape`, lying contiguously at `ptr` in `memory`
/// (`VMMW_UPDATE_DEVICE` or `VMMW_UPDATE_HOST`). The memory stays the
/// caller's and is only read, during each `vmmw_update` of this source.
///
/// Errors (nothing added on any of them):
/// - `VMMW_NULL_ARGUMENT`: `source`, `name` or `dtype` is NULL, or `shape` is
///   NULL with `ndim` > 0.
/// - `VMMW_INVALID_ARGUMENT`: `ndim` over 64 (refused before `shape` is
///   read); empty or duplicate name, unknown dtype or memory kind, NULL
///   `ptr`, a byte size that overflows or runs past the address space.
///
/// # Safety
/// `source` is a live handle; `name` and `dtype` are NUL-terminated strings;
/// `shape` is readable for `ndim` entries; `ptr` holds the tensor's bytes,
/// readable as `memory` says (device memory readable by the device of the
/// pool later updates run on), from now until the last `vmmw_update` of
/// this source returns; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update_source_add(
    source: *mut vmmw_update_source_t,
    name: *const c_char,
    dtype: *const c_char,
    shape: *const u64,
    ndim: usize,
    ptr: u64,
    memory: vmmw_update_memory_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let s = unsafe { arg(source.cast_const(), "source") }?;
        // SAFETY: forwarded contract.
        let name = unsafe { str_arg(name, "name") }?;
        // SAFETY: forwarded contract.
        let dtype_name = unsafe { str_arg(dtype, "dtype") }?;
        let dtype = Dtype::parse(dtype_name).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "unknown dtype `{dtype_name}`: expected one of {}",
                Dtype::known_names()
            ))
        })?;
        if ndim > crate::loader::checkpoint::MAX_DIMS {
            return Err(Error::InvalidArgument(format!(
                "update source tensor with {ndim} dimensions: at most {} are supported",
                crate::loader::checkpoint::MAX_DIMS
            )));
        }
        // SAFETY: forwarded contract (`shape` readable for `ndim` entries).
        let shape: &[u64] = unsafe { slice_arg(shape, ndim, "shape") }?;
        let shape = shape
            .iter()
            .map(|&d| to_usize(d, "shape"))
            .collect::<Result<Vec<_>>>()?;
        let at = match memory {
            VMMW_UPDATE_DEVICE => Bytes::Device(ptr),
            VMMW_UPDATE_HOST => Bytes::Host(ptr as usize as *const u8),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "update source memory {other}: expected VMMW_UPDATE_DEVICE (0) or VMMW_UPDATE_HOST (1)"
                )))
            }
        };
        let mut t = s.tensors.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the caller vouches for the memory until the last update returns.
        unsafe { t.add(name, dtype, &shape, at) }
    })
}

pub(crate) fn options(o: &vmmw_update_options_t) -> Result<UpdateOptions> {
    let flag = |v: u32, what: &str| match v {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(Error::InvalidArgument(format!(
            "vmmw_update_options_t.{what} is {other}: expected 0 or 1"
        ))),
    };
    Ok(UpdateOptions {
        expected_version: o.expected_version,
        tag: flag(o.tag_set, "tag_set")?.then_some(TagId(o.tag)),
        plan: PlanOptions {
            allow_missing: flag(o.allow_missing, "allow_missing")?,
            allow_unexpected: flag(o.allow_unexpected, "allow_unexpected")?,
        },
        staging: match o.staging {
            VMMW_STAGING_AUTO => Staging::Auto,
            VMMW_STAGING_ALWAYS => Staging::Always,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "vmmw_update_options_t.staging is {other}: expected VMMW_STAGING_AUTO (0) or VMMW_STAGING_ALWAYS (1)"
                )))
            }
        },
    })
}

/// Update the destinations registered in `loader` (by `vmmw_loader_allocate`
/// and a load, or by hand) from `source`, through the loader's rules (rename,
/// skip, ties and aliases, fused q/k/v and gate/up, tensor-parallel slices),
/// on `pool`'s device. On success the tag's version is
/// `options->expected_version + 1`, every destination the update writes
/// holds the new bytes, a Reload sleep keeps them (it no longer restores the
/// checkpoint over them), and importers of a share of the tag see the new
/// version. `*out` receives what was done.
///
/// Failure rule: every destination is either untouched or wholly new, never
/// a mix; see docs/UPDATES.md for how (direct copies rolled forward once on
/// a device error, or staging).
///
/// Errors, nothing written on any of them (every problem listed in one message):
/// - `VMMW_NULL_ARGUMENT`: `loader`, `pool`, `source`, `options` or `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `expected_version` 0, a flag not 0 or 1, an
///   unknown staging value.
/// - `VMMW_VERSION_MISMATCH`: the tag is at another version (and nothing else is wrong).
/// - `VMMW_PLAN_MISMATCH`: missing, unknown or mis-shaped tensors, a dtype
///   that would need a conversion, destinations spanning several tags or
///   none, the version (listed with the rest).
/// - `VMMW_UNKNOWN_TAG`: `options->tag` is not registered.
/// - `VMMW_UNKNOWN_POINTER`, `VMMW_INVALID_STATE`: a destination freed, or
///   asleep; another update of the tag running.
/// - `VMMW_OUT_OF_MEMORY`: no room for the staging scratch.
/// - `VMMW_DRIVER_ERROR`: a copy into the staging scratch failed.
///
/// Errors after the copies into the destinations started:
/// - `VMMW_UPDATE_TORN`: they failed and so did their retry; the
///   destinations hold a mix, the tag is marked torn (`vmmw_pool_tag_torn`),
///   its version stays. Update again to repair.
///
/// Thread safety: one update of a tag at a time per pool; a sleep of the tag
/// meanwhile fails with `VMMW_LOAD_IN_PROGRESS`. No kernel may read the
/// destinations while the update writes them.
///
/// # Safety
/// `loader`, `pool` and `source` are live handles; `options` is readable for
/// its `size`; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_update(
    loader: *mut vmmw_loader_t,
    pool: *mut vmmw_pool_t,
    source: *mut vmmw_update_source_t,
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
        let s = unsafe { arg(source.cast_const(), "source") }?;
        // SAFETY: forwarded contract (readable for its `size`).
        let o = unsafe { read_sized(options_in) }?.ok_or(Error::NullArgument("options"))?;
        let opts = options(&o)?;
        let mut t = s.tensors.lock().unwrap_or_else(|p| p.into_inner());
        let r = update::update(&l.session, &p.pool, &mut *t, &opts)?;
        Ok(vmmw_update_result_t::from(&r))
    })
}

/// The weights version of `tag` in `pool` (1 until an update or a publish
/// moves it) into `*out`. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
///
/// # Safety
/// `pool` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_tag_version(
    pool: *const vmmw_pool_t,
    tag: u32,
    out: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(pool, "pool") }?.pool.tag_version(TagId(tag))
    })
}

/// The tag of the live block of `pool` holding `ptr` into `*out` (the tag an
/// update of tensors there versions). Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out` is NULL.
/// - `VMMW_UNKNOWN_POINTER`: `ptr` is in no live block of this pool.
/// - `VMMW_INVALID_STATE`: the block's tag is asleep.
///
/// # Safety
/// `pool` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_tag_of(
    pool: *const vmmw_pool_t,
    ptr: u64,
    out: *mut u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        Ok(p.pool.check_live_range(ptr, 1, "address")?.0)
    })
}

/// 1 into `*out` while `tag`'s destinations in `pool` may hold a mix of
/// versions (an update failed with `VMMW_UPDATE_TORN`), else 0. The next
/// successful update clears it. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
///
/// # Safety
/// `pool` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_tag_torn(
    pool: *const vmmw_pool_t,
    tag: u32,
    out: *mut i32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        Ok(p.pool.tag_torn(TagId(tag))? as i32)
    })
}

/// Announce that `tag`'s weights in `pool` were rewritten in place by other
/// means than `vmmw_update` (a load of a new checkpoint): its version moves
/// by one (into `*out`) and importers of a share of the tag see it.
/// Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
/// - `VMMW_INVALID_STATE`: an update of the tag is running.
///
/// # Safety
/// `pool` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_publish(
    pool: *mut vmmw_pool_t,
    tag: u32,
    out: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(pool.cast_const(), "pool") }?
            .pool
            .publish(TagId(tag))
    })
}
