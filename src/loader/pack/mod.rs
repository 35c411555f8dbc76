//! Packing and unpacking checkpoints (docs/PACKED.md): a safetensors file, a
//! folder with its index, or a GGUF file becomes a packed checkpoint with
//! the same tensors, header and metadata, each tensor's bytes as codec
//! frames; unpacking gives the original files back bit for bit.
//!
//! Packing encodes on a driver when one is given (the CUDA kernels on a
//! GPU; the host backend runs the reference through the same calls) and on
//! CPU threads otherwise; it streams through a few batch buffers, so its
//! memory does not grow with the model, and writes each output under a
//! temporary name that is synced and renamed only once whole.

mod encode;
mod file;
mod output;
mod unpack;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use file::{layout_of, pieces};

use super::checkpoint::{Checkpoint, INDEX_FILE};
use super::packed::{self, SourceKind};
use crate::driver::Driver;
use crate::error::{Error, Result};
use encode::{CpuEncoder, DeviceEncoder, Encoder};
use output::Pending;

/// Raw bytes per batch on a device: large enough to fill the GPU and keep
/// the link busy between host waits; three batches are in flight.
const DEVICE_BATCH: usize = 256 << 20;
/// Largest batch on CPU threads.
const CPU_BATCH: usize = 256 << 20;

/// Progress of a pack or unpack: (raw bytes done, total), called from one
/// of its threads, one call at a time.
pub type PackProgress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// How to pack.
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// Raw bytes per frame: a multiple of 64 KiB up to 256 MiB.
    pub frame_bytes: u64,
    /// CPU threads reading, encoding (on the CPU) and writing (0: the CPUs, at most 16).
    pub threads: usize,
    /// Encode with this driver's codec; None: the reference encoder on CPU threads.
    pub driver: Option<Arc<dyn Driver>>,
    /// Replace an existing output file (a folder is never replaced).
    pub force: bool,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            frame_bytes: packed::DEFAULT_FRAME_RAW,
            threads: 0,
            driver: None,
            force: false,
        }
    }
}

/// One file written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileReport {
    /// The file written (under the output).
    pub path: PathBuf,
    /// Bytes of the original file.
    pub original_bytes: u64,
    /// Bytes of the packed file.
    pub packed_bytes: u64,
    /// Frames.
    pub frames: u64,
}

/// What a pack or unpack did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PackReport {
    /// Each file written.
    pub files: Vec<FileReport>,
    /// Which encoder (or decoder) ran.
    pub coder: String,
    /// Tensors in the checkpoint.
    pub tensors: usize,
    /// Bytes of the original files.
    pub original_bytes: u64,
    /// Bytes of the packed files.
    pub packed_bytes: u64,
    /// Seconds reading, coding and writing, up to the sync.
    pub seconds: f64,
    /// Seconds syncing the output to its disk and renaming it.
    pub sync_seconds: f64,
}

/// `Error::Cancelled` once `cancel` is set.
fn stopped(cancel: Option<&AtomicBool>, done: &AtomicU64, total: u64) -> Result<()> {
    if cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
        return Err(Error::Cancelled {
            done: done.load(Ordering::Relaxed),
            total,
        });
    }
    Ok(())
}

fn thread_count(t: usize) -> usize {
    if t == 0 {
        std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .min(16)
    } else {
        t.min(64)
    }
}

/// Which of `ckpt`'s files a path given as a file names (a GGUF split opens
/// every part; only the named one is written).
fn named_shard(ckpt: &Checkpoint, input: &Path) -> Result<usize> {
    let f = File::open(input).map_err(|e| Error::io(input, e))?;
    let id = super::FileIdentity::of(&f).map_err(|e| Error::io(input, e))?;
    ckpt.shards
        .iter()
        .position(|s| s.identity.dev == id.dev && s.identity.ino == id.ino)
        .ok_or_else(|| Error::checkpoint(input, None, "is not one of the checkpoint's files"))
}

/// Open a new file `rel` inside the pending folder `dir`.
fn create_in(dir: &Path, rel: &Path) -> Result<(File, PathBuf)> {
    let p = dir.join(rel);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .map_err(|e| Error::io(&p, e))?;
    Ok((f, p))
}

/// The folder's index, copied byte for byte.
fn copy_index(root: &Path, dir: &Path) -> Result<()> {
    let from = root.join(INDEX_FILE);
    if from.exists() {
        let to = dir.join(INDEX_FILE);
        std::fs::copy(&from, &to).map_err(|e| Error::io(&to, e))?;
        File::open(&to)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io(&to, e))?;
    }
    Ok(())
}

/// The files to write: (shard index, path relative to the output folder),
/// or one shard for a file.
fn targets(ckpt: &Checkpoint, input: &Path, dir: bool) -> Result<Vec<(usize, PathBuf)>> {
    if !dir {
        return Ok(vec![(named_shard(ckpt, input)?, PathBuf::new())]);
    }
    ckpt.shards
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let rel = s.path.strip_prefix(&ckpt.root).map_err(|_| {
                Error::checkpoint(&s.path, None, "is outside the checkpoint folder")
            })?;
            Ok((i, rel.to_path_buf()))
        })
        .collect()
}

/// Run `each(shard, out file, out path)` for every file of `ckpt` into
/// `output` (a folder for a folder, else a file), atomically; returns the
/// files written and the seconds the sync and rename took.
fn write_all(
    ckpt: &Checkpoint,
    input: &Path,
    output: &Path,
    force: bool,
    each: &mut dyn FnMut(usize, &File, &Path) -> Result<FileReport>,
) -> Result<(Vec<FileReport>, f64)> {
    let dir = std::fs::metadata(input)
        .map_err(|e| Error::io(input, e))?
        .is_dir();
    let mut files = Vec::new();
    if dir {
        let pending = Pending::folder(output)?;
        copy_index(&ckpt.root, pending.path())?;
        let mut sync = 0.0;
        for (i, rel) in targets(ckpt, input, true)? {
            let (f, p) = create_in(pending.path(), &rel)?;
            let mut r = each(i, &f, &p)?;
            let t = Instant::now();
            f.sync_all().map_err(|e| Error::io(&p, e))?;
            sync += t.elapsed().as_secs_f64();
            r.path = output.join(rel);
            files.push(r);
        }
        let t = Instant::now();
        pending.commit(None)?;
        Ok((files, sync + t.elapsed().as_secs_f64()))
    } else {
        let (i, _) = targets(ckpt, input, false)?[0].clone();
        let (pending, f) = Pending::file(output, force)?;
        let mut r = each(i, &f, pending.path())?;
        r.path = output.to_path_buf();
        files.push(r);
        let t = Instant::now();
        pending.commit(Some(&f))?;
        Ok((files, t.elapsed().as_secs_f64()))
    }
}

/// Pack the checkpoint at `input` (a safetensors file, a folder with its
/// index or a single `model.safetensors`, or a GGUF file) into `output` (a
/// folder for a folder, else a file). `progress(done, total)` counts raw
/// bytes; `cancel` set (from any thread) stops it with `Error::Cancelled`.
/// Nothing is left under `output` on failure.
pub fn pack(
    input: &Path,
    output: &Path,
    opts: &PackOptions,
    progress: Option<PackProgress<'_>>,
    cancel: Option<&AtomicBool>,
) -> Result<PackReport> {
    let fr = opts.frame_bytes;
    if fr == 0 || fr > packed::MAX_FRAME_RAW || !fr.is_multiple_of(crate::codec::BLOCK_BYTES as u64)
    {
        return Err(Error::InvalidArgument(format!(
            "frame size {fr} is not a multiple of 64 KiB from 64 KiB to 256 MiB"
        )));
    }
    let ckpt = Checkpoint::open(input)?;
    if ckpt.is_packed() {
        return Err(Error::InvalidArgument(format!(
            "{} is already packed",
            input.display()
        )));
    }
    let t0 = Instant::now();
    let threads = thread_count(opts.threads);
    let largest = ckpt.shards.iter().map(|s| s.len).max().unwrap_or(0);
    let cap = (largest as usize)
        .next_multiple_of(crate::codec::BLOCK_BYTES)
        .max(crate::codec::BLOCK_BYTES);
    let frame = (fr as usize).min(cap);
    let mut encoder: Box<dyn Encoder> = match &opts.driver {
        Some(d) => {
            let batch = DEVICE_BATCH.max(frame).min(cap.max(frame));
            Box::new(DeviceEncoder::new(d, batch, frame)?)
        }
        None => Box::new(CpuEncoder { threads }),
    };
    let batch = match &opts.driver {
        Some(_) => DEVICE_BATCH.max(frame).min(cap.max(frame)),
        None => (threads * frame)
            .clamp(frame, CPU_BATCH.max(frame))
            .min(cap.max(frame)),
    };
    let total = ckpt.data_bytes().max(1);
    let done = AtomicU64::new(0);
    let tick = |n: u64| {
        let d = done.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(p) = progress {
            p(d.min(total), total);
        }
    };
    // Batch buffers made by the first file, kept for the others.
    let mut slots = Vec::new();
    let (files, sync_seconds) =
        write_all(&ckpt, input, output, opts.force, &mut |i, out, out_path| {
            let sh = &ckpt.shards[i];
            let (kind, prefix_len) = match ckpt.gguf() {
                Some(g) => (SourceKind::Gguf, g.files[i].data_start.min(sh.len)),
                None => {
                    let mut n = [0u8; 8];
                    sh.file
                        .read_exact_at(&mut n, 0)
                        .map_err(|e| Error::io(&sh.path, e))?;
                    (SourceKind::Safetensors, 8 + u64::from_le_bytes(n))
                }
            };
            let tensors: Vec<_> = ckpt
                .tensors
                .values()
                .filter(|t| t.shard == i)
                .map(|t| (t.offset, t.len, layout_of(t.dtype)))
                .collect();
            let c = file::pack_file(
                &sh.file,
                &sh.path,
                kind,
                sh.len,
                prefix_len,
                &tensors,
                fr,
                out,
                out_path,
                encoder.as_mut(),
                opts.driver.as_ref(),
                &mut slots,
                threads,
                batch,
                &tick,
                &|| stopped(cancel, &done, total),
            )?;
            // The source must not have changed under the pack.
            sh.check_unchanged()?;
            Ok(FileReport {
                path: PathBuf::new(),
                original_bytes: c.original,
                packed_bytes: c.packed,
                frames: c.frames,
            })
        })?;
    let seconds = t0.elapsed().as_secs_f64() - sync_seconds;
    Ok(PackReport {
        coder: encoder.name(),
        tensors: ckpt.tensors.len(),
        original_bytes: files.iter().map(|f| f.original_bytes).sum(),
        packed_bytes: files.iter().map(|f| f.packed_bytes).sum(),
        files,
        seconds,
        sync_seconds,
    })
}

/// Unpack the packed checkpoint at `input` into `output`: every file as it
/// was before packing, bit for bit (docs/PACKED.md says what that covers),
/// the folder's index copied. `threads` decode (0: the CPUs, at most 16);
/// `progress` and `cancel` as for [`pack`].
pub fn unpack(
    input: &Path,
    output: &Path,
    threads: usize,
    force: bool,
    progress: Option<PackProgress<'_>>,
    cancel: Option<&AtomicBool>,
) -> Result<PackReport> {
    let ckpt = Checkpoint::open(input)?;
    if let Some(s) = ckpt.shards.iter().find(|s| s.packed.is_none()) {
        return Err(Error::InvalidArgument(format!(
            "{} is not packed",
            s.path.display()
        )));
    }
    let t0 = Instant::now();
    let threads = thread_count(threads);
    let total: u64 = ckpt
        .shards
        .iter()
        .filter_map(|s| s.packed.as_ref())
        .map(|p| p.orig_len)
        .sum::<u64>()
        .max(1);
    let done = AtomicU64::new(0);
    let tick = |n: u64| {
        let d = done.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(p) = progress {
            p(d.min(total), total);
        }
    };
    let (files, sync_seconds) = write_all(&ckpt, input, output, force, &mut |i, out, out_path| {
        let sh = &ckpt.shards[i];
        let ix = sh.packed.as_ref().expect("every shard is packed");
        unpack::unpack_file(
            &sh.file,
            &sh.path,
            ix,
            out,
            out_path,
            threads,
            &tick,
            &|| stopped(cancel, &done, total),
        )?;
        sh.check_unchanged()?;
        Ok(FileReport {
            path: PathBuf::new(),
            original_bytes: ix.orig_len,
            packed_bytes: sh.len,
            frames: ix.frames.len() as u64,
        })
    })?;
    Ok(PackReport {
        coder: format!("cpu ({threads} threads)"),
        tensors: ckpt.tensors.len(),
        original_bytes: files.iter().map(|f| f.original_bytes).sum(),
        packed_bytes: files.iter().map(|f| f.packed_bytes).sum(),
        files,
        seconds: t0.elapsed().as_secs_f64() - sync_seconds,
        sync_seconds,
    })
}
