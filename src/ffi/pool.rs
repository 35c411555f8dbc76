//! `vmmw_pool_t`: the caching pool of VMM segments, from C.
//!
//! A handle is shared: each handle pointer the library gives out is one
//! reference, and `vmmw_pool_free` drops that reference. A pool from
//! `vmmw_pool_new` has one reference; the process-global pool of a device
//! (`vmmw_pool_default`, shared with the PyTorch entry points) has one more,
//! held by the registry of global pools, so it lives until the process exits.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use super::boundary::{arg, bytes_mut_arg, call, call_out, slice_arg};
use super::device::{backend_choice, vmmw_backend_t, vmmw_device_t, VMMW_BACKEND_AUTO};
use super::error::vmmw_error_t;
use super::numbers::{or_default, to_usize};
use super::options::{read_sized, SizedOptions};
use super::status::vmmw_status_t;
use crate::driver;
use crate::error::{Error, Result};
use crate::pool::{Mode, Pool, PoolConfig};
use crate::tag::TagId;

/// A caching pool on one device, behind a shared handle (see the module
/// documentation). Thread-safe: every function taking a pool may be called
/// concurrently, except `vmmw_pool_free` of the caller's last reference.
pub struct vmmw_pool_t {
    pub(crate) pool: Arc<Pool>,
    /// What the last sleep or wake through this handle did (`vmmw_pool_last_cycle_json`).
    pub(crate) last_cycles: Mutex<Vec<crate::pool::TagCycle>>,
}

/// How to create a pool. Every field but `size` 0 means the default: the
/// `VMMW_BACKEND_AUTO` backend on device 0 with default sizes. Start from
/// `VMMW_POOL_OPTIONS_INIT` (C) so `size` is set.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vmmw_pool_options_t {
    /// `sizeof(vmmw_pool_options_t)` as the caller's header declares it (see
    /// `VMMW_POOL_OPTIONS_INIT`): fields past it take their defaults.
    pub size: usize,
    /// An opened device to use; NULL opens `backend` on `device`. The pool
    /// keeps the driver alive on its own (the handle may be freed afterwards).
    pub device_handle: *const vmmw_device_t,
    /// A `VMMW_BACKEND_*` value (used when `device_handle` is NULL).
    pub backend: vmmw_backend_t,
    /// CUDA device ordinal (used when `device_handle` is NULL).
    pub device: i32,
    /// Every block size is rounded up to this power of two (default 512).
    pub align: u64,
    /// Requests up to this size come from small segments (default 1 MiB).
    pub small_request_max: u64,
    /// Size of a small segment (default 2 MiB).
    pub small_segment_bytes: u64,
    /// Size of a shared large segment (default 20 MiB); larger requests get their own.
    pub large_segment_bytes: u64,
    /// Largest physical chunk of a segment (default 0: one chunk per segment).
    pub chunk_bytes: u64,
}

impl vmmw_pool_t {
    fn new(pool: Arc<Pool>) -> vmmw_pool_t {
        vmmw_pool_t {
            pool,
            last_cycles: Mutex::new(Vec::new()),
        }
    }
}

/// Give out one reference to a shared pool handle; `vmmw_pool_free` drops it.
fn share_handle(handle: &Arc<vmmw_pool_t>) -> *mut vmmw_pool_t {
    Arc::into_raw(handle.clone()).cast_mut()
}

// SAFETY: repr(C), `size: usize` first, integers and a raw pointer only.
unsafe impl SizedOptions for vmmw_pool_options_t {
    const NAME: &'static str = "vmmw_pool_options_t";
    fn defaults() -> Self {
        vmmw_pool_options_t {
            size: std::mem::size_of::<Self>(),
            device_handle: std::ptr::null(),
            backend: VMMW_BACKEND_AUTO,
            device: 0,
            align: 0,
            small_request_max: 0,
            small_segment_bytes: 0,
            large_segment_bytes: 0,
            chunk_bytes: 0,
        }
    }
}

fn config_from(o: &vmmw_pool_options_t) -> Result<PoolConfig> {
    let d = PoolConfig::default();
    Ok(PoolConfig {
        align: or_default(o.align, d.align, "align")?,
        small_request_max: or_default(
            o.small_request_max,
            d.small_request_max,
            "small_request_max",
        )?,
        small_segment_bytes: or_default(
            o.small_segment_bytes,
            d.small_segment_bytes,
            "small_segment_bytes",
        )?,
        large_segment_bytes: or_default(
            o.large_segment_bytes,
            d.large_segment_bytes,
            "large_segment_bytes",
        )?,
        chunk_bytes: to_usize(o.chunk_bytes, "chunk_bytes")?,
        ..d
    })
}

/// Create a pool. `options` may be NULL (all defaults). On success `*out`
/// receives a new handle owned by the caller (`vmmw_pool_free`).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: unknown backend, `align` not a power of two, a
///   size over 2^56, or inconsistent sizes.
/// - `VMMW_DRIVER_UNAVAILABLE`.
///
/// # Safety
/// `options` is NULL or readable for `options->size` bytes; `out` is
/// writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_new(
    options: *const vmmw_pool_options_t,
    out: *mut *mut vmmw_pool_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract (NULL means defaults).
        let o = unsafe { read_sized(options) }?.unwrap_or_else(vmmw_pool_options_t::defaults);
        let config = config_from(&o)?;
        // SAFETY: forwarded contract: NULL or a live device handle.
        let driver = match unsafe { o.device_handle.as_ref() } {
            Some(d) => d.driver().clone(),
            None => {
                if o.device < 0 {
                    return Err(Error::InvalidArgument(format!(
                        "device ordinal {} must not be negative",
                        o.device
                    )));
                }
                driver::open(backend_choice(o.backend)?, o.device)?.driver
            }
        };
        let pool = Pool::new(driver, config)?;
        Ok(share_handle(&Arc::new(vmmw_pool_t::new(Arc::new(pool)))))
    })
}

/// The process-global pool of `device` (the one the PyTorch entry points
/// `vmmw_torch_malloc`/`vmmw_torch_free` use), created on first use with the
/// backend named by `VMMW_BACKEND` (auto by default). Every call returns the
/// same pointer and gives the caller one reference to it, which
/// `vmmw_pool_free` drops (once per call); the registry of global pools keeps
/// its own reference, so the pool and the handle live until the process exits
/// whether or not the caller frees it.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `out` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `device` is negative.
/// - `VMMW_DRIVER_UNAVAILABLE`.
///
/// # Safety
/// `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_default(
    device: i32,
    out: *mut *mut vmmw_pool_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        static HANDLES: OnceLock<Mutex<HashMap<i32, Arc<vmmw_pool_t>>>> = OnceLock::new();
        let mut map = HANDLES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(h) = map.get(&device) {
            return Ok(share_handle(h));
        }
        let pool = crate::pool::registry::global_pool(device)?;
        let h = Arc::new(vmmw_pool_t::new(pool));
        let p = share_handle(&h);
        map.insert(device, h);
        Ok(p)
    })
}

/// Drop the caller's reference to a pool handle. NULL is accepted. One
/// meaning for every handle: the handle and its pool are freed with their
/// last reference. A pool from `vmmw_pool_new` has only the caller's, so its
/// blocks still allocated are released with it (their pointers become
/// invalid; the device is synchronized first). The global pools of
/// `vmmw_pool_default` keep the registry's reference and live on.
///
/// Errors: none. NULL is ignored. Dropping more references than were given
/// out cannot be detected (undefined behaviour).
///
/// # Safety
/// `pool` is NULL or a handle holding the caller's reference, which is not
/// used afterwards; the last reference is not freed concurrently with other
/// calls on the handle.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_free(pool: *mut vmmw_pool_t) {
    if pool.is_null() {
        return;
    }
    // A panic in a destructor must not unwind into C; the memory is then leaked.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `pool` came from `share_handle` (`Arc::into_raw`) and this
        // reference is dropped once, per the contract.
        drop(unsafe { Arc::from_raw(pool.cast_const()) })
    }));
}

fn size_arg(size: u64) -> Result<usize> {
    to_usize(size, "size")
}

/// Allocate `size` bytes under the calling thread's current tag. `*out_ptr`
/// receives the device address (stable for the block's life, also across sleep
/// and wake).
///
/// Errors (`*out_ptr` is untouched on any of them):
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out_ptr` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `size` is 0.
/// - `VMMW_OUT_OF_MEMORY`: after returning cached memory and retrying; also
///   for sizes larger than the device, up to `UINT64_MAX`.
/// - `VMMW_INVALID_STATE`: the tag is asleep.
///
/// # Safety
/// `pool` is a live handle; `out_ptr` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_alloc(
    pool: *mut vmmw_pool_t,
    size: u64,
    out_ptr: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out_ptr, "out_ptr", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        Ok(p.pool.alloc(size_arg(size)?)?.ptr)
    })
}

/// Allocate `size` bytes under `tag` (ignoring the thread's scopes).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out_ptr` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
/// - `VMMW_INVALID_ARGUMENT`: `size` is 0.
/// - `VMMW_OUT_OF_MEMORY`: also for sizes larger than the device.
/// - `VMMW_INVALID_STATE`: the tag is asleep.
///
/// # Safety
/// As `vmmw_pool_alloc`.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_alloc_tagged(
    pool: *mut vmmw_pool_t,
    size: u64,
    tag: u32,
    out_ptr: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out_ptr, "out_ptr", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        Ok(p.pool.alloc_tagged(size_arg(size)?, TagId(tag))?.ptr)
    })
}

/// Give a block back to the pool (it returns to the pool's cache; see `vmmw_pool_trim`).
/// A block freed is no longer restored by a Reload wake, and no loader writes
/// into it again: a loader destination in it is refused at the next load, also once the same
/// address is handed out to a new block (blocks have an identity that is
/// never reused). When freeing releases a segment and the
/// device refuses to synchronize first, nothing is unmapped (queued work may
/// still use it): the block is freed, the error says its memory stays mapped,
/// and a later free or `vmmw_pool_trim` releases it. Thread-safe; also while
/// the block's tag sleeps or wakes (the segment is then released when that
/// call ends).
/// The pair of `vmmw_pool_alloc`; `vmmw_pool_free` destroys the pool itself.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_UNKNOWN_POINTER`: `ptr` is not the start of a live block of this
///   pool (0, foreign, interior, or already freed: a double free); nothing
///   changes.
///
/// # Safety
/// `pool` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_dealloc(
    pool: *mut vmmw_pool_t,
    ptr: u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(pool, "pool") }?.pool.free(ptr)
    })
}

/// Say that `[ptr, ptr+len)` was written since a load filled it (weights
/// updated in place): the checkpoint no longer restores those bytes, and a
/// Reload sleep of their tag keeps them in the host backup from then on.
/// Optional: a Reload sleep hashes what was loaded on the device and finds
/// changed bytes by itself; marking names them ahead of time (and is the way
/// for a caller who wants no surprise in what the backup holds). A later
/// load into the range makes its checkpoint the source again. Thread-safe; a
/// sleep or wake of the range's tag running now is waited for.
///
/// Errors (nothing changes on any of them):
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_UNKNOWN_POINTER`: `ptr` is in no live block of this pool.
/// - `VMMW_INVALID_ARGUMENT`: the range runs past its block.
/// - `VMMW_INVALID_STATE`: the block's tag is asleep.
///
/// # Safety
/// `pool` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_mark_written(
    pool: *mut vmmw_pool_t,
    ptr: u64,
    len: u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        p.pool.mark_written(ptr, size_arg(len)?)
    })
}

/// The former name of `vmmw_pool_dealloc`, kept through 0.x; removed at 1.0.
///
/// Errors: as `vmmw_pool_dealloc`:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_UNKNOWN_POINTER`: `ptr` is not the start of a live block of this
///   pool (0, foreign, interior, or already freed); nothing changes.
///
/// # Safety
/// As `vmmw_pool_dealloc`.
#[no_mangle]
#[deprecated(note = "renamed vmmw_pool_dealloc (vmmw_pool_free destroys the pool)")]
pub unsafe extern "C" fn vmmw_pool_free_ptr(
    pool: *mut vmmw_pool_t,
    ptr: u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    // SAFETY: forwarded contract.
    unsafe { vmmw_pool_dealloc(pool, ptr, error) }
}

/// Return cached memory to the driver; `*released` receives the physically
/// backed bytes released. Segments of a tag being put to sleep or woken are
/// left for a later trim; freed segments kept mapped after a failed device
/// synchronize are released now, or the error is returned again.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `released` is NULL.
///
/// # Safety
/// `pool` is a live handle; `released` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_trim(
    pool: *mut vmmw_pool_t,
    released: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(released, "released", error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(pool, "pool") }?.pool.trim()
    })
}

/// Place `tag`'s future blocks in one arena: `reserve_bytes` of VA reserved
/// once, physical memory committed as it grows in steps of up to `grow_step`
/// bytes (0 = granularity). The reservation is made at the first allocation
/// in the tag: one the driver cannot make (more address space than it has)
/// fails that allocation with `VMMW_OUT_OF_MEMORY`, as a request larger than
/// the device does.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
/// - `VMMW_INVALID_ARGUMENT`: `reserve_bytes` is 0, or a size is over 2^56.
/// - `VMMW_INVALID_STATE`: the tag has an arena of other dimensions still in
///   use.
///
/// # Safety
/// `pool` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_set_tag_arena(
    pool: *mut vmmw_pool_t,
    tag: u32,
    reserve_bytes: u64,
    grow_step: u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        let mode = Mode::Arena {
            reserve_bytes: to_usize(reserve_bytes, "reserve_bytes")?,
            grow_step: to_usize(grow_step, "grow_step")?,
        };
        p.pool.set_tag_mode(TagId(tag), mode)
    })
}

/// Place `tag`'s future blocks in cached, split segments (the default).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
///
/// # Safety
/// `pool` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_set_tag_segments(
    pool: *mut vmmw_pool_t,
    tag: u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(pool, "pool") }?
            .pool
            .set_tag_mode(TagId(tag), Mode::Segments)
    })
}

/// Create `tag`'s memory in this pool RDMA-capable (`rdma` != 0: the
/// driver's `gpuDirectRDMACapable` allocation flag, so NCCL's
/// `ncclCommRegister`, NIXL and UCX can register it) or not (0), from its
/// first allocation on and again at every wake. A wake maps new pages: watch
/// `vmmw_tag_remap_epoch` or register a `vmmw_remap_callback_add` to register
/// the memory again. Nothing changes on failure.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is not registered.
/// - `VMMW_UNSUPPORTED`: the device cannot create RDMA-capable VMM memory (the
///   driver reports `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`
///   = 0).
/// - `VMMW_INVALID_STATE`: the tag already holds segments in this pool,
///   created the other way (free its blocks and trim first).
///
/// # Safety
/// `pool` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_set_tag_rdma(
    pool: *mut vmmw_pool_t,
    tag: u32,
    rdma: i32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(pool, "pool") }?
            .pool
            .set_tag_rdma(TagId(tag), rdma != 0)
    })
}

/// Copy `len` bytes from host memory `src` to pool memory at device address
/// `dst`, and wait for the copy. The range must lie in one awake segment of
/// this pool. Must not race with sleeping the tag that owns the range.
///
/// Errors (on any of them nothing is copied):
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL, or `src` is NULL with `len` > 0.
/// - `VMMW_UNKNOWN_POINTER`: the range is not in this pool.
/// - `VMMW_INVALID_STATE`: the range is asleep.
/// - `VMMW_INVALID_ARGUMENT`: the range runs past the mapped part, or
///   overflows.
///
/// # Safety
/// `pool` is a live handle; `src` is readable for `len` bytes (NULL when `len`
/// is 0); `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_write(
    pool: *mut vmmw_pool_t,
    dst: u64,
    src: *const c_void,
    len: usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        // SAFETY: forwarded contract.
        let bytes = unsafe { slice_arg(src.cast(), len, "src") }?;
        // SAFETY: the caller does not sleep or free the range meanwhile.
        unsafe { p.pool.write(dst, bytes) }
    })
}

/// Copy `len` bytes of pool memory at device address `src` into host memory
/// `dst`, and wait for the copy. Same range rules as `vmmw_pool_write`.
///
/// Errors (on any of them nothing is copied):
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL, or `dst` is NULL with `len` > 0.
/// - `VMMW_UNKNOWN_POINTER`: the range is not in this pool.
/// - `VMMW_INVALID_STATE`: the range is asleep.
/// - `VMMW_INVALID_ARGUMENT`: the range runs past the mapped part, or
///   overflows.
///
/// # Safety
/// `pool` is a live handle; `dst` is writable for `len` bytes (NULL when `len`
/// is 0); `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_read(
    pool: *const vmmw_pool_t,
    src: u64,
    dst: *mut c_void,
    len: usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        // SAFETY: forwarded contract.
        let bytes = unsafe { bytes_mut_arg(dst.cast(), len, "dst") }?;
        // SAFETY: as in `vmmw_pool_write`.
        unsafe { p.pool.read(src, bytes) }
    })
}

/// Copy `len` bytes of asleep pool memory at device address `ptr` out of the
/// host backup its sleep kept, into host memory `dst`, without waking it. The
/// range must lie in one segment whose tag sleeps with a backup holding every
/// byte of it (Offload, or the changed bytes of a Reload sleep). Thread-safe:
/// a sleep or wake of the tag running now is waited for, and none starts
/// during the copy. `dst` stays the caller's. When `tag` is not NULL it
/// receives the tag whose backup was read (left as it is on error).
///
/// Errors (on any of them nothing is copied, and `*tag` is left as it is):
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL, or `dst` is NULL with `len` > 0.
/// - `VMMW_UNKNOWN_POINTER`: the range is not in this pool.
/// - `VMMW_INVALID_ARGUMENT`: the range runs past its segment, or overflows.
/// - `VMMW_INVALID_STATE`, naming the tag: the tag is awake or discarded, or
///   the backup holds only part of the range.
///
/// # Safety
/// `pool` is a live handle; `dst` is writable for `len` bytes (NULL when `len`
/// is 0); `tag` is NULL or writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_read_backup(
    pool: *const vmmw_pool_t,
    ptr: u64,
    dst: *mut c_void,
    len: usize,
    tag: *mut u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        // SAFETY: forwarded contract.
        let bytes = unsafe { bytes_mut_arg(dst.cast(), len, "dst") }?;
        let read = p.pool.read_backup(ptr, bytes)?;
        if !tag.is_null() {
            // SAFETY: non-null and writable by contract.
            unsafe { tag.write(read.0) };
        }
        Ok(())
    })
}

/// The host address of the pinned backup bytes of `len` bytes of pool memory
/// at device address `ptr`, without copying: `*host` receives it. The range
/// must lie in one segment whose backup holds every byte of it in one
/// contiguous piece: an asleep tag's backup (Offload, or the changed bytes of
/// a Reload sleep), or the backup an awake tag kept after its wake (the bytes
/// of its last sleep). When `tag` is not NULL it receives the tag.
///
/// Ownership and lifetime: the pool owns the memory; the caller reads it and
/// never frees or writes it. It stays valid, at the same address, while the
/// backup stays assigned: until the segment is freed, the pool's unused
/// backups are released (`vmmw_pool_release_backup`), a wake frees it
/// (`free_backup_after_wake` of `vmmw_sleep_options_t`), or a sleep of the
/// tag needs a backup of another shape (a sleep of the same ranges rewrites
/// the same bytes in place). The memory is page-locked and registered with
/// the device's driver. Thread-safe.
///
/// Errors (on any of them `*host` and `*tag` are left as they are):
/// - `VMMW_NULL_ARGUMENT`: `pool` or `host` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `len` is 0, the range runs past its segment,
///   or overflows.
/// - `VMMW_UNKNOWN_POINTER`: the range is not in this pool.
/// - `VMMW_INVALID_STATE`, naming the tag: no backup holds the range (an
///   awake tag whose backup was released, a discarded tag), the backup holds
///   only part of it, or the bytes lie in more than one piece.
///
/// # Safety
/// `pool` is a live handle; `host` is writable; `tag` is NULL or writable;
/// `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_backup_view(
    pool: *const vmmw_pool_t,
    ptr: u64,
    len: usize,
    host: *mut *const c_void,
    tag: *mut u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        if host.is_null() {
            return Err(Error::NullArgument("host"));
        }
        let (owner, at) = p.pool.backup_view(ptr, len)?;
        // SAFETY: `host` is non-null and writable by contract.
        unsafe { host.write(at.cast()) };
        if !tag.is_null() {
            // SAFETY: non-null and writable by contract.
            unsafe { tag.write(owner.0) };
        }
        Ok(())
    })
}
