//! Unpacking one packed file: its kept header, then every frame decoded on
//! the host (checksums checked) and written at its original offset, on
//! several threads, one frame each at a time (memory bounded by the threads).
//! The pieces tile the original file, so every byte, padding and bytes
//! between tensors included, comes back as it was.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::file::parallel;
use crate::error::{Error, Result};
use crate::loader::packed::{self, FrameUse, Index};

/// Write the original of the packed file `src` (index `ix`) into `out`, a
/// new empty file; `progress(raw)` counts raw bytes written.
#[allow(clippy::too_many_arguments)]
pub fn unpack_file(
    src: &File,
    src_path: &Path,
    ix: &Index,
    out: &File,
    out_path: &Path,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
    stopped: &(dyn Fn() -> Result<()> + Sync),
) -> Result<()> {
    out.write_all_at(&ix.prefix, 0)
        .map_err(|e| Error::io(out_path, e))?;
    let uses: Vec<FrameUse> = ix
        .pieces
        .iter()
        .enumerate()
        .flat_map(|(pi, p)| {
            (0..p.frame_count()).map(move |k| {
                let frame = (p.first_frame + k) as usize;
                FrameUse {
                    frame,
                    piece: pi,
                    entry: ix.frames[frame],
                    raw: p.frame_range(k),
                    layout: p.layout,
                }
            })
        })
        .collect();
    let written = AtomicU64::new(ix.prefix.len() as u64);
    parallel(uses.len(), threads, &|i| {
        stopped()?;
        let u = &uses[i];
        let raw = packed::decode_frame(src, u).map_err(|r| Error::checkpoint(src_path, None, r))?;
        out.write_all_at(&raw, u.raw.0)
            .map_err(|e| Error::io(out_path, e))?;
        written.fetch_add(raw.len() as u64, Ordering::Relaxed);
        progress(raw.len() as u64);
        Ok(())
    })?;
    stopped()?;
    let len = out.metadata().map_err(|e| Error::io(out_path, e))?.len();
    if len != ix.orig_len || written.load(Ordering::Relaxed) != ix.orig_len {
        return Err(Error::InvalidState(format!(
            "{}: unpacked {len} bytes, the original had {}",
            out_path.display(),
            ix.orig_len
        )));
    }
    Ok(())
}
