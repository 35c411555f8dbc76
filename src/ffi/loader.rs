//! `vmmw_loader_t`: load a safetensors checkpoint in place into device memory.
//!
//! Flow: open the checkpoint, set mapping rules (JSON or a preset), register
//! destination parameters (your own device pointers) or let the loader
//! allocate them from a pool, check the plan, load (with a progress callback
//! and cancellation), read the result. Every check happens before any byte
//! is written: on a plan error the destinations are untouched.

use std::ffi::{c_char, c_void};
use std::ops::ControlFlow;

use super::boundary::{arg, call, call_out, free_handle, into_handle, str_arg};
use super::buffer::write_str;
use super::error::vmmw_error_t;
use super::numbers::or_default;
use super::options::{read_sized, SizedOptions};
use super::pool::vmmw_pool_t;
use super::status::vmmw_status_t;
use crate::error::Error;
use crate::loader::{self, LoadOptions, Progress, Rules, Session, Strategy, Tp};

/// How a load moves bytes from the checkpoint to the device: one of the
/// `VMMW_COPY_*` values.
pub type vmmw_copy_strategy_t = i32;

/// Copy strategy (the default): page-cached data copied into a pinned staging
/// ring sized to stay in the CPU's last-level cache, then DMA; data not in the
/// page cache read into large slots with pread.
pub const VMMW_COPY_AUTO: vmmw_copy_strategy_t = 0;
/// Copy strategy: register mmap windows read-only and DMA from the page cache.
pub const VMMW_COPY_DIRECT: vmmw_copy_strategy_t = 1;
/// Copy strategy: memcpy into pinned slots, then DMA.
pub const VMMW_COPY_STAGED: vmmw_copy_strategy_t = 2;
/// Copy strategy: pread into pinned slots, then DMA (cold data).
pub const VMMW_COPY_READ: vmmw_copy_strategy_t = 3;
/// Copy strategy: one thread, no pinning (the reference path).
pub const VMMW_COPY_SIMPLE: vmmw_copy_strategy_t = 4;

/// Most dimensions a destination can report through `vmmw_destination_t`.
pub const VMMW_MAX_DIMS: usize = 8;

/// Progress of a load: called on the loading thread with the bytes done and
/// the total. Return 0 to continue, non-zero to request cancellation (as
/// `vmmw_loader_cancel`: copies still in flight finish, and a load whose copies
/// all completed still succeeds). Must not call back into the same loader.
pub type vmmw_progress_fn =
    Option<unsafe extern "C" fn(done: u64, total: u64, user: *mut c_void) -> i32>;

/// Options of a load. Every field but `size` 0 means the default. Start from
/// `VMMW_LOAD_OPTIONS_INIT` (C) so `size` is set.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_load_options_t {
    /// `sizeof(vmmw_load_options_t)` as the caller's header declares it (see
    /// `VMMW_LOAD_OPTIONS_INIT`): fields past it take their defaults.
    pub size: usize,
    /// 1: registered destinations no source fills are left untouched instead of an error.
    pub allow_missing: u32,
    /// 1: checkpoint tensors with no destination are skipped instead of an error.
    pub allow_unexpected: u32,
    /// A `VMMW_COPY_*` strategy.
    pub strategy: vmmw_copy_strategy_t,
    /// Worker threads (0 = number of CPUs, at most 16; at most 256 when set).
    pub threads: u32,
    /// Bytes of file registered per direct window (0 = default; at most 4 GiB).
    pub window_bytes: u64,
    /// Bytes per pinned staging slot (0 = sized to keep the slots in use in the
    /// CPU's last-level cache; at most 4 GiB).
    pub slot_bytes: u64,
}

// SAFETY: repr(C), `size: usize` first, integers only.
unsafe impl SizedOptions for vmmw_load_options_t {
    const NAME: &'static str = "vmmw_load_options_t";
    fn defaults() -> Self {
        vmmw_load_options_t {
            size: std::mem::size_of::<Self>(),
            allow_missing: 0,
            allow_unexpected: 0,
            strategy: VMMW_COPY_AUTO,
            threads: 0,
            window_bytes: 0,
            slot_bytes: 0,
        }
    }
}

/// What a plan will do (from `vmmw_loader_plan`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct vmmw_plan_summary_t {
    /// Copies planned.
    pub extents: u64,
    /// Zero fills planned (padding).
    pub fills: u64,
    /// Bytes read from the checkpoint.
    pub src_bytes: u64,
    /// Bytes written to destinations.
    pub dst_bytes: u64,
    /// Source tensors loaded.
    pub sources: u64,
    /// Source tensors skipped by a rule.
    pub skipped: u64,
    /// Destinations left untouched (allowed missing).
    pub missing: u64,
    /// Sources with no destination (allowed unexpected).
    pub unexpected: u64,
    /// Destinations registered.
    pub destinations: u64,
}

/// What a load did (from `vmmw_loader_result`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_load_result_t {
    /// Source bytes copied.
    pub bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Source bytes per second, in GB/s (10^9).
    pub gbps: f64,
    /// Bytes through the direct (registered mmap) path.
    pub direct_bytes: u64,
    /// Bytes staged by memcpy.
    pub staged_bytes: u64,
    /// Bytes staged by pread.
    pub read_bytes: u64,
    /// Bytes zero-filled.
    pub filled_bytes: u64,
    /// Worker threads used.
    pub threads: u32,
}

/// A checkpoint being loaded: a [`Session`] behind a C handle. Thread-safe:
/// calls on one loader serialize (a load holds it for its duration), except
/// `vmmw_loader_cancel`, which may be called from any thread while a load runs.
pub struct vmmw_loader_t {
    pub(crate) session: Session,
}

/// Open a checkpoint: a `.safetensors` file, a folder holding
/// `model.safetensors.index.json` (or one `model.safetensors`), or a GGUF
/// file (by its magic bytes; any part of a split opens all parts;
/// docs/GGUF.md). Headers are
/// read and validated now. Opens never block. On success `*out` receives a
/// new loader owned by the caller (`vmmw_loader_free`). Initial rules: none
/// (every tensor to the destination of its own name).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `path` or `out` is NULL.
/// - `VMMW_IO`: missing or unreadable.
/// - `VMMW_CHECKPOINT_INVALID`, naming the file and tensor: not a regular
///   file (FIFO, device, socket); index over 64 MiB; header over 100 MB or
///   past the end; bad JSON, duplicate names, unknown dtype, more than 64
///   dims, overflowing shapes, offsets out of range or overlapping; shard
///   names with `..` or absolute; missing shards; for GGUF, docs/GGUF.md's
///   list (naming the metadata key where one is wrong).
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_open(
    path: *const c_char,
    out: *mut *mut vmmw_loader_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let path = unsafe { str_arg(path, "path") }?;
        Ok(into_handle(vmmw_loader_t {
            session: Session::open(path)?,
        }))
    })
}

/// Free a loader. NULL is accepted. Destinations it allocated stay in their
/// pool (free them with `vmmw_pool_dealloc`, or with the pool); the reload
/// source a load registered in the pool stays valid.
///
/// Errors: none. NULL is ignored. A handle already freed cannot be detected
/// (undefined behaviour).
///
/// # Safety
/// `loader` is NULL or a live handle, not used afterwards and not concurrently.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_free(loader: *mut vmmw_loader_t) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(loader) }
}

/// Replace the mapping rules with their JSON form (docs/RULES.md: every
/// field, match/to/fuse/shard/pad/skip, ties, tp, dtype, with an example of
/// each). Checked now. Sizes the rules produce are checked at plan time
/// (`VMMW_PLAN_MISMATCH` on overflow).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader` or `json` is NULL.
/// - `VMMW_INVALID_ARGUMENT`, naming the bad field or regex: bad JSON,
///   unknown field, bad regex, rank not below world; the previous rules stay.
///
/// # Safety
/// `loader` is a live handle; `json` is a NUL-terminated string; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_set_rules_json(
    loader: *mut vmmw_loader_t,
    json: *const c_char,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        // SAFETY: forwarded contract.
        let rules = Rules::from_json(unsafe { str_arg(json, "json") }?)?;
        l.session.set_rules(rules)
    })
}

/// Replace the mapping rules with a preset for a Hugging Face family
/// ("llama", "mistral", "qwen", "qwen2", "qwen3"): q/k/v fused into
/// `qkv_proj`, gate/up into `gate_up_proj`; with `tp_world` > 0, sharded for
/// rank `tp_rank`, kv heads cut by `head_dim`.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader` or `family` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: unknown family, or `tp_rank` >= `tp_world`.
///
/// # Safety
/// `loader` is a live handle; `family` is a NUL-terminated string; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_set_rules_preset(
    loader: *mut vmmw_loader_t,
    family: *const c_char,
    tp_rank: u32,
    tp_world: u32,
    head_dim: u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        // SAFETY: forwarded contract.
        let family = unsafe { str_arg(family, "family") }?;
        let tp = (tp_world > 0).then_some(Tp {
            rank: tp_rank as usize,
            world: tp_world as usize,
        });
        l.session.set_preset(family, tp, head_dim as usize)
    })
}

/// Set the load options (`options` NULL: defaults). `options->size` must be
/// set (`VMMW_LOAD_OPTIONS_INIT`); see `vmmw_load_options_t`.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: unknown strategy, `threads` over 256, or
///   `slot_bytes` or `window_bytes` over 4 GiB; the previous options stay.
///
/// # Safety
/// `loader` is a live handle; `options` is NULL or readable for
/// `options->size` bytes; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_set_options(
    loader: *mut vmmw_loader_t,
    options: *const vmmw_load_options_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        // SAFETY: forwarded contract (NULL means defaults).
        let o = unsafe { read_sized(options) }?.unwrap_or_else(vmmw_load_options_t::defaults);
        let mut opts = LoadOptions::default();
        opts.plan.allow_missing = o.allow_missing != 0;
        opts.plan.allow_unexpected = o.allow_unexpected != 0;
        opts.copy.strategy = match o.strategy {
            VMMW_COPY_AUTO => Strategy::Auto,
            VMMW_COPY_DIRECT => Strategy::Direct,
            VMMW_COPY_STAGED => Strategy::Staged,
            VMMW_COPY_READ => Strategy::Read,
            VMMW_COPY_SIMPLE => Strategy::Simple,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "copy strategy {other} is not one of VMMW_COPY_AUTO..VMMW_COPY_SIMPLE (0..4)"
                )))
            }
        };
        opts.copy.threads = o.threads as usize;
        opts.copy.window_bytes =
            or_default(o.window_bytes, opts.copy.window_bytes, "window_bytes")?;
        opts.copy.slot_bytes = or_default(o.slot_bytes, opts.copy.slot_bytes, "slot_bytes")?;
        l.session.set_options(opts.plan, opts.copy)
    })
}

/// Keep (`enable` 1) or not (0, the default) a checksum of every loaded
/// extent at the next loads of this loader, so each wake of a tag asleep
/// with `VMMW_POLICY_RELOAD` proves, before restoring anything, that the
/// checkpoint still holds the bytes loaded: a file rewritten in place fails
/// the wake with `VMMW_CHECKPOINT_INVALID` even when its size and
/// modification time were kept. It costs one more read of the loaded bytes at
/// load and one at each Reload wake. Without it, device, inode, size and
/// modification time are still checked at every wake. Thread-safe
/// (serializes with a running load).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `enable` is neither 0 nor 1; the previous
///   setting stays.
///
/// # Safety
/// `loader` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_set_reload_check(
    loader: *mut vmmw_loader_t,
    enable: u32,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        let on = match enable {
            0 => false,
            1 => true,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "reload check flag {other} is neither 0 nor 1"
                )))
            }
        };
        l.session.set_reload_check(on);
        Ok(())
    })
}

/// Build and check the plan against the registered destinations without
/// writing anything.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader` or `out` is NULL.
/// - `VMMW_PLAN_MISMATCH`: every missing, unexpected, mis-shaped or
///   mis-typed tensor, listed in one message.
/// - `VMMW_CHECKPOINT_INVALID` or `VMMW_IO`: reopening the checkpoint failed.
///
/// # Safety
/// `loader` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_plan(
    loader: *const vmmw_loader_t,
    out: *mut vmmw_plan_summary_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let s = unsafe { arg(loader, "loader") }?.session.plan()?;
        Ok(vmmw_plan_summary_t {
            extents: s.extents,
            fills: s.fills,
            src_bytes: s.src_bytes,
            dst_bytes: s.dst_bytes,
            sources: s.sources,
            skipped: s.skipped,
            missing: s.missing,
            unexpected: s.unexpected,
            destinations: s.destinations,
        })
    })
}

/// Load the checkpoint into the registered destinations on `pool`'s device,
/// calling `progress(done, total, user)` (may be NULL) on this thread as
/// bytes land. Blocks until done. Cancel from another thread with
/// `vmmw_loader_cancel`, or by returning non-zero from `progress`: the load
/// stops with `VMMW_CANCELLED`. A cancel requested before the load starts
/// stops it before any byte is written. Plan errors, and a checkpoint file
/// changed since `vmmw_loader_open` (`VMMW_CHECKPOINT_INVALID`), are found
/// before any byte is written. Any error once copying started (cancel, an
/// I/O error reading a shard, a driver error) leaves the destinations partly
/// written, with no rollback: each byte holds its old value or the
/// checkpoint's; load again to finish. After any failed load, older reload
/// sources no longer replay these destinations (a later Reload sleep keeps
/// their bytes in the host backup).
///
/// Pool tags holding destinations must be awake (`VMMW_INVALID_STATE` naming
/// the destination otherwise) and are pinned for the whole load, checked and
/// pinned under one lock: `vmmw_pool_sleep` of them, from another thread or
/// from `progress`, fails with `VMMW_LOAD_IN_PROGRESS` and changes nothing.
/// The executed plan is registered in the
/// pool as the reload source of the tags that own the destinations, so those
/// tags can sleep with `VMMW_POLICY_RELOAD`; it stops covering a block once
/// the block is freed. A loader can load again (the checkpoint is reopened);
/// the loader keeps its last checkpoint open and mapped until it is freed or
/// loads again.
///
/// Destinations hold an identity, not just an address: one whose pool block
/// was freed since it was registered or allocated is refused before any byte
/// is written (`VMMW_UNKNOWN_POINTER`, the message names the destination),
/// also when the pool handed that address to a new block meanwhile, so the
/// new owner's bytes are never overwritten and the load registers no reload
/// source over them. A block freed while the load runs fails the load the
/// same way after its copies, and no reload source is registered.
///
/// The cancel rule (docs/ABI.md): a load that ran its copies clears a
/// pending cancel; a load refused before its copies leaves it pending.
///
/// Errors found before any byte is written:
/// - `VMMW_NULL_ARGUMENT`: `loader` or `pool` is NULL.
/// - `VMMW_CHECKPOINT_INVALID`: a shard changed since `vmmw_loader_open`.
/// - `VMMW_PLAN_MISMATCH`.
/// - `VMMW_UNKNOWN_POINTER`, naming the destination: its pool block was freed
///   since registration, it lies in a free block of this pool, or it lies
///   outside this pool and not in a range declared with
///   `vmmw_loader_declare_foreign`.
/// - `VMMW_INVALID_ARGUMENT`: a destination runs past its block.
/// - `VMMW_INVALID_STATE`, naming the destination: its tag is asleep.
/// - `VMMW_CANCELLED`: a cancel requested before the load started.
///
/// Errors once copying started (destinations partly written, no rollback):
/// - `VMMW_CANCELLED`: `vmmw_loader_cancel`, or `progress` returned non-zero.
/// - `VMMW_IO`: reading a shard failed.
/// - `VMMW_DRIVER_ERROR`.
/// - `VMMW_UNKNOWN_POINTER`: a destination's block was freed while the load
///   ran; no reload source is registered.
///
/// # Safety
/// `loader` and `pool` are live handles; `progress` is NULL or a function
/// safe to call with `user`; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_load(
    loader: *mut vmmw_loader_t,
    pool: *mut vmmw_pool_t,
    progress: vmmw_progress_fn,
    user: *mut c_void,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        let forward = progress.map(|f| {
            move |done: u64, total: u64| {
                // SAFETY: the caller guarantees `progress` may be called with `user`.
                match unsafe { f(done, total, user) } {
                    0 => ControlFlow::Continue(()),
                    _ => ControlFlow::Break(()),
                }
            }
        });
        let on_progress = forward.as_ref().map(|f| f as Progress<'_>);
        l.session.load(&p.pool, on_progress)?;
        Ok(())
    })
}

/// Ask the running load of this loader (or, when none runs, the next one) to
/// stop; it fails with `VMMW_CANCELLED`. Thread-safe; returns at once. The
/// request stays pending until a load of this loader reaches its copies
/// (`vmmw_loader_load`, or `vmmw_loader_load_devices` and
/// `vmmw_loader_wake_replicas` with this loader listed): a load that ran its
/// copies clears it, a load refused before its copies leaves it pending.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader` is NULL.
///
/// # Safety
/// `loader` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_cancel(
    loader: *mut vmmw_loader_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        unsafe { arg(loader, "loader") }?.session.cancel();
        Ok(())
    })
}

/// What the last successful load did.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `loader` or `out` is NULL.
/// - `VMMW_INVALID_STATE`: no load completed yet.
///
/// # Safety
/// `loader` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_result(
    loader: *const vmmw_loader_t,
    out: *mut vmmw_load_result_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let s = unsafe { arg(loader, "loader") }?.session.stats()?;
        Ok(vmmw_load_result_t {
            bytes: s.bytes,
            seconds: s.seconds,
            gbps: s.gbps(),
            direct_bytes: s.direct_bytes,
            staged_bytes: s.staged_bytes,
            read_bytes: s.read_bytes,
            filled_bytes: s.filled_bytes,
            threads: s.threads as u32,
        })
    })
}

/// The last load's statistics and plan summary as JSON, into `buf` (buffer
/// contract of `vmmw_device_describe`).
///
/// Errors (the last two are the buffer contract):
/// - `VMMW_NULL_ARGUMENT`: `loader` is NULL.
/// - `VMMW_INVALID_STATE`: no load completed yet.
/// - `VMMW_BUFFER_TOO_SMALL`: `cap` is short; `*needed` is set, nothing is
///   written to `buf`.
/// - `VMMW_NULL_ARGUMENT`: `buf` is NULL and `cap` > 0; nothing is written.
///
/// # Safety
/// `loader` is a live handle; `buf` is NULL or writable for `cap` bytes;
/// `needed` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_loader_result_json(
    loader: *const vmmw_loader_t,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let l = unsafe { arg(loader, "loader") }?;
        let json = l.session.result_json()?;
        // SAFETY: forwarded contract.
        unsafe { write_str(&json, buf, cap, needed) }
    })
}

/// Bytes of pinned host staging the loader keeps cached for this pool's
/// driver into `*out` (0 when none). Loads and Reload wakes pin a staging ring
/// once (sized to the CPU's last-level cache, 128 MiB on a 300 MiB L3 with 16
/// workers) and reuse it. The cache is per opened driver: pools created from
/// one `vmmw_device_t` share it; a pool that opened its device itself
/// (`device_handle` NULL) has its own. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out` is NULL.
///
/// # Safety
/// `pool` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_staging_bytes(
    pool: *const vmmw_pool_t,
    out: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        Ok(loader::copy::staging::cached_staging_bytes(p.pool.driver()) as u64)
    })
}

/// Unpin and free the staging ring cached for this pool's driver (see
/// `vmmw_pool_staging_bytes`);
/// `*released` receives its bytes (0 when none was cached). The next load or
/// Reload wake pins a new one (milliseconds). A load running concurrently
/// keeps its ring and caches it again when it finishes. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `released` is NULL.
///
/// # Safety
/// `pool` is a live handle; `released` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_release_staging(
    pool: *mut vmmw_pool_t,
    released: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(released, "released", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        Ok(loader::copy::staging::release_staging_for(p.pool.driver()) as u64)
    })
}
