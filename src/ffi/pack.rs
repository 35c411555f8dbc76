//! C access to packing (docs/PACKED.md): `vmmw_pack` and `vmmw_unpack`
//! convert their arguments and call `loader::pack`. Loading a packed
//! checkpoint needs nothing new: `vmmw_loader_open` recognizes it.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use super::boundary::{call, str_arg};
use super::error::vmmw_error_t;
use super::loader::vmmw_progress_fn;
use super::options::{read_sized, SizedOptions};
use super::status::vmmw_status_t;
use crate::driver::{self, BackendChoice, BackendKind};
use crate::error::Result;
use crate::loader::pack::{self, PackOptions, PackReport};

/// Options of `vmmw_pack` and `vmmw_unpack`. Every field but `size` 0 means
/// the default. Start from `VMMW_PACK_OPTIONS_INIT` (C) so `size` is set.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vmmw_pack_options_t {
    /// `sizeof(vmmw_pack_options_t)` as the caller's header declares it.
    pub size: usize,
    /// Raw bytes per frame (0: 16 MiB): a multiple of 64 KiB up to 256 MiB.
    pub frame_bytes: u64,
    /// CPU threads reading, writing and coding (0: the CPUs, at most 16).
    pub threads: u32,
    /// 1: encode with the reference encoder on CPU threads even where a GPU
    /// is present (packing only).
    pub cpu: u32,
    /// 1: replace an existing output file (a folder is never replaced).
    pub force: u32,
    /// The CUDA device that encodes (packing only; `VMMW_BACKEND` picks the
    /// backend as for every call: with `host`, the host backend's codec).
    pub device: i32,
}

// SAFETY: `#[repr(C)]`, `size` first, integer fields only.
unsafe impl SizedOptions for vmmw_pack_options_t {
    const NAME: &'static str = "vmmw_pack_options_t";
    fn defaults() -> Self {
        vmmw_pack_options_t {
            size: std::mem::size_of::<Self>(),
            frame_bytes: 0,
            threads: 0,
            cpu: 0,
            force: 0,
            device: 0,
        }
    }
}

/// What a pack or unpack wrote.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct vmmw_pack_report_t {
    /// Bytes of the original files.
    pub original_bytes: u64,
    /// Bytes of the packed files.
    pub packed_bytes: u64,
    /// Files written (the index of a folder not counted).
    pub files: u64,
    /// Tensors in the checkpoint.
    pub tensors: u64,
    /// Seconds reading, coding and writing.
    pub seconds: f64,
    /// Seconds syncing the output to its disk and renaming it into place.
    pub sync_seconds: f64,
}

impl From<&PackReport> for vmmw_pack_report_t {
    fn from(r: &PackReport) -> Self {
        vmmw_pack_report_t {
            original_bytes: r.original_bytes,
            packed_bytes: r.packed_bytes,
            files: r.files.len() as u64,
            tensors: r.tensors as u64,
            seconds: r.seconds,
            sync_seconds: r.sync_seconds,
        }
    }
}

/// Run `f` with a progress forwarder and a cancel flag: a non-zero return of
/// `progress` sets the flag.
fn with_progress(
    progress: vmmw_progress_fn,
    user: *mut c_void,
    f: impl FnOnce(Option<pack::PackProgress<'_>>, &AtomicBool) -> Result<PackReport>,
) -> Result<PackReport> {
    let cancel = AtomicBool::new(false);
    let user = user as usize;
    let forward = progress.map(|p| {
        let cancel = &cancel;
        move |done: u64, total: u64| {
            // SAFETY: the caller guarantees `progress` may be called with
            // `user`, from the packer's threads one call at a time.
            if unsafe { p(done, total, user as *mut c_void) } != 0 {
                cancel.store(true, Ordering::SeqCst);
            }
        }
    });
    let on = forward.as_ref().map(|f| f as pack::PackProgress<'_>);
    f(on, &cancel)
}

/// Pack the checkpoint at `input` (a safetensors file, a folder with its
/// index, or a GGUF file) into `output` (a folder for a folder, else a file;
/// it must not exist unless `force` and it is a file): the same tensors,
/// header and metadata, each tensor's bytes as codec frames. Encodes on the
/// GPU where one opens (`VMMW_BACKEND` unset or `cuda`), else on CPU threads.
/// Streams through a bounded set of buffers. Writes under a temporary name in
/// the output's folder, syncs, and renames: on any failure nothing is left
/// under `output`. `progress(done, total, user)` (may be NULL) counts raw
/// bytes, called from one of the packer's threads, one call at a time;
/// returning non-zero stops the pack (`VMMW_CANCELLED`). On success
/// `*report` (may be NULL) receives what was written.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `input` or `output` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: the output exists, the input is already packed,
///   a bad frame size or option struct.
/// - `VMMW_IO`, `VMMW_CHECKPOINT_INVALID`: reading or validating the input,
///   writing the output.
/// - `VMMW_CANCELLED`, `VMMW_OUT_OF_MEMORY` (the GPU's buffers), `VMMW_DRIVER_ERROR`.
///
/// Thread safety: any thread; packs of different outputs may run at once.
///
/// # Safety
/// `input` and `output` are NUL-terminated strings; `options` is NULL or
/// readable for its `size` bytes; `progress` is NULL or safe to call with
/// `user` from another thread; `report` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pack(
    input: *const c_char,
    output: *const c_char,
    options: *const vmmw_pack_options_t,
    progress: vmmw_progress_fn,
    user: *mut c_void,
    report: *mut vmmw_pack_report_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let input = unsafe { str_arg(input, "input") }?;
        // SAFETY: forwarded contract.
        let output = unsafe { str_arg(output, "output") }?;
        // SAFETY: forwarded contract.
        let o = unsafe { read_sized(options) }?.unwrap_or_else(vmmw_pack_options_t::defaults);
        let driver = if o.cpu != 0 {
            None
        } else {
            let choice = BackendChoice::from_env()?;
            let opened = driver::open(choice, o.device)?;
            match (opened.driver.kind(), choice) {
                (BackendKind::Cuda, _) | (BackendKind::Host, BackendChoice::Host) => {
                    Some(opened.driver)
                }
                (BackendKind::Host, _) => None,
            }
        };
        let opts = PackOptions {
            frame_bytes: if o.frame_bytes == 0 {
                crate::loader::packed::DEFAULT_FRAME_RAW
            } else {
                o.frame_bytes
            },
            threads: o.threads as usize,
            driver,
            force: o.force != 0,
        };
        let r = with_progress(progress, user, |p, c| {
            pack::pack(input.as_ref(), output.as_ref(), &opts, p, Some(c))
        })?;
        if !report.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { report.write((&r).into()) };
        }
        Ok(())
    })
}

/// Give back the original files of the packed checkpoint at `input`, bit for
/// bit, into `output` (as `vmmw_pack` writes: atomically, a folder for a
/// folder). Every frame's checksums are checked. `options` (may be NULL)
/// gives `threads` and `force`; `progress`, `user` and `report` as for
/// `vmmw_pack`.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `input` or `output` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: the output exists, or a file is not packed.
/// - `VMMW_CHECKPOINT_INVALID`: a header refused, or a frame that fails its
///   checksum (naming the file and the frame).
/// - `VMMW_IO`, `VMMW_CANCELLED`.
///
/// Thread safety: any thread.
///
/// # Safety
/// As for `vmmw_pack`.
#[no_mangle]
pub unsafe extern "C" fn vmmw_unpack(
    input: *const c_char,
    output: *const c_char,
    options: *const vmmw_pack_options_t,
    progress: vmmw_progress_fn,
    user: *mut c_void,
    report: *mut vmmw_pack_report_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let input = unsafe { str_arg(input, "input") }?;
        // SAFETY: forwarded contract.
        let output = unsafe { str_arg(output, "output") }?;
        // SAFETY: forwarded contract.
        let o = unsafe { read_sized(options) }?.unwrap_or_else(vmmw_pack_options_t::defaults);
        let r = with_progress(progress, user, |p, c| {
            pack::unpack(
                input.as_ref(),
                output.as_ref(),
                o.threads as usize,
                o.force != 0,
                p,
                Some(c),
            )
        })?;
        if !report.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { report.write((&r).into()) };
        }
        Ok(())
    })
}
