//! Packing one file: its pieces, then its frames through a three-stage
//! pipeline over a few batch buffers (memory bounded whatever the file's
//! size): a reader thread fills a batch's raw bytes with `pread`, the
//! calling thread encodes it, a writer thread writes its frames at their
//! final offsets; then the manifest and preamble at the file's start.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};

use super::encode::{Batch, BatchFrame, Encoder, MAX_BATCH_FRAMES};
use crate::codec::Layout;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::hostmem::PinnedHost;
use crate::loader::dtype::Dtype;
use crate::loader::packed::format::{self, FrameEntry, Index, Piece, SourceKind};

/// Batches in flight: one being read, one encoded, one written.
const SLOTS: usize = 3;

/// How a file's elements split for the codec: by element width; ggml's
/// block-quantized types, 8-byte types and bytes as bytes.
pub fn layout_of(dtype: Dtype) -> Layout {
    if dtype.is_quantized() {
        return Layout::Bytes;
    }
    match dtype.size() {
        2 => Layout::Half,
        4 => Layout::Single,
        _ => Layout::Bytes,
    }
}

/// The pieces of a file of `orig_len` bytes whose header ends at
/// `prefix_len`, holding `tensors` (offset, bytes, layout; any order): one
/// per tensor with bytes, one per gap between them.
pub fn pieces(
    prefix_len: u64,
    orig_len: u64,
    tensors: &[(u64, u64, Layout)],
    frame_raw: u64,
) -> Vec<Piece> {
    let mut t: Vec<_> = tensors.iter().filter(|t| t.1 > 0).copied().collect();
    t.sort_unstable_by_key(|t| t.0);
    let mut out = Vec::new();
    let mut at = prefix_len;
    let mut frames = 0u64;
    let mut push = |offset: u64, len: u64, layout: Layout, frames: &mut u64| {
        let p = Piece {
            offset,
            len,
            frame_raw,
            first_frame: *frames,
            layout,
        };
        *frames += p.frame_count();
        out.push(p);
    };
    for (off, len, layout) in t {
        if off > at {
            push(at, off - at, Layout::Bytes, &mut frames);
        }
        push(off, len, layout, &mut frames);
        at = off + len;
    }
    if at < orig_len {
        push(at, orig_len - at, Layout::Bytes, &mut frames);
    }
    out
}

/// What one packed file holds, for reports.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileCounts {
    /// Bytes of the original file.
    pub original: u64,
    /// Bytes of the packed file.
    pub packed: u64,
    /// Frames written.
    pub frames: u64,
}

/// Pack the original file `src` (`kind`, `orig_len` bytes, header ending at
/// `prefix_len`, holding `tensors`) into `out`, a new empty file, with
/// `encoder`; `progress(raw)` counts raw bytes written.
#[allow(clippy::too_many_arguments)]
pub fn pack_file(
    src: &File,
    src_path: &Path,
    kind: SourceKind,
    orig_len: u64,
    prefix_len: u64,
    tensors: &[(u64, u64, Layout)],
    frame_raw: u64,
    out: &File,
    out_path: &Path,
    encoder: &mut dyn Encoder,
    pinned_for: Option<&Arc<dyn Driver>>,
    slots: &mut Vec<Batch>,
    threads: usize,
    batch_raw: usize,
    progress: &(dyn Fn(u64) + Sync),
    stopped: &(dyn Fn() -> Result<()> + Sync),
) -> Result<FileCounts> {
    let pieces = pieces(prefix_len, orig_len, tensors, frame_raw);
    let n_frames: u64 = pieces.iter().map(Piece::frame_count).sum();
    let mut prefix = vec![0u8; prefix_len as usize];
    src.read_exact_at(&mut prefix, 0)
        .map_err(|e| Error::io(src_path, e))?;
    let manifest_len = format::manifest_len(prefix_len, pieces.len() as u64, n_frames);
    if manifest_len > format::MAX_MANIFEST {
        return Err(Error::InvalidArgument(format!(
            "{}: the packed manifest would be {manifest_len} bytes, over the {}-byte limit (a larger --frame size makes fewer frames)",
            src_path.display(),
            format::MAX_MANIFEST
        )));
    }
    let data_start = format::data_start_for(manifest_len);
    // Every frame, in file order: (index, original offset, raw bytes, layout).
    let specs: Vec<BatchFrame> = pieces
        .iter()
        .flat_map(|p| {
            (0..p.frame_count()).map(move |k| {
                let (lo, hi) = p.frame_range(k);
                BatchFrame {
                    index: (p.first_frame + k) as usize,
                    src: lo,
                    raw_len: (hi - lo) as usize,
                    layout: p.layout,
                    raw_at: 0,
                    out_at: 0,
                    out_len: 0,
                }
            })
        })
        .collect();
    let batches = cut_batches(specs, batch_raw);
    let entries = Mutex::new(vec![FrameEntry { at: 0, len: 0 }; n_frames as usize]);
    let end = run_pipeline(
        src, src_path, out, out_path, batches, encoder, pinned_for, slots, threads, batch_raw,
        data_start, &entries, progress, stopped,
    )?;
    // A cancel seen after the last batch still leaves nothing behind.
    stopped()?;
    let ix = Index {
        kind,
        orig_len,
        prefix,
        pieces,
        frames: entries.into_inner().unwrap_or_else(|p| p.into_inner()),
        data_start,
        file_len: end,
    };
    let manifest = ix.manifest();
    debug_assert_eq!(manifest.len() as u64, manifest_len);
    let mut head = ix.preamble(&manifest).to_vec();
    head.extend_from_slice(&manifest);
    head.resize(data_start as usize, 0);
    out.write_all_at(&head, 0)
        .map_err(|e| Error::io(out_path, e))?;
    // What was written reads back as a packed file.
    crate::loader::packed::read_index(out, end).map_err(|r| {
        Error::InvalidState(format!(
            "{}: the packed file just written does not read back: {r}",
            out_path.display()
        ))
    })?;
    Ok(FileCounts {
        original: orig_len,
        packed: end,
        frames: n_frames,
    })
}

/// The output file mapped for writing up to `bound` bytes (every frame at
/// its largest), its blocks reserved first with `fallocate`, so a write
/// through the mapping never meets a full disk (which would raise SIGBUS).
/// None where the file system cannot reserve or map: the writer then uses
/// `pwrite`.
struct OutMap {
    map: memmap2::MmapMut,
}

impl OutMap {
    fn new(out: &File, bound: u64) -> Option<OutMap> {
        use std::os::fd::AsRawFd;
        let len = libc::off_t::try_from(bound).ok().filter(|&l| l > 0)?;
        // SAFETY: fallocate on a descriptor this function borrows; mode 0
        // reserves blocks and extends the file, writing no data.
        if unsafe { libc::fallocate(out.as_raw_fd(), 0, 0, len) } != 0 {
            return None;
        }
        // SAFETY: `out` is the pack's own temporary file, open read-write,
        // its blocks reserved up to `bound`; nothing else maps or truncates
        // it while the mapping lives (it is dropped before `set_len`).
        let map = unsafe { memmap2::MmapOptions::new().len(bound as usize).map_mut(out) }.ok()?;
        Some(OutMap { map })
    }

    fn base(&self) -> usize {
        self.map.as_ptr() as usize
    }
}

/// The batch buffers of one pack (kept across its files): pinned with the
/// driver that encodes, or plain populated memory for the CPU encoder.
fn make_slots(batch_raw: usize, pinned_for: Option<&Arc<dyn Driver>>) -> Result<Vec<Batch>> {
    let mk = |len: usize, what: &str| -> Result<PinnedHost> {
        match pinned_for {
            Some(d) => PinnedHost::new(d, len, what),
            None => PinnedHost::populated(len, what),
        }
    };
    (0..SLOTS)
        .map(|_| {
            Ok(Batch {
                input: mk(batch_raw, "packing input batch")?,
                output: mk(Batch::output_room(batch_raw), "packing output batch")?,
                frames: Vec::new(),
            })
        })
        .collect()
}

/// Consecutive frames in batches of at most `batch_raw` raw bytes (a frame
/// is never split), each frame's `raw_at` set in its batch.
fn cut_batches(specs: Vec<BatchFrame>, batch_raw: usize) -> Vec<Vec<BatchFrame>> {
    let mut out: Vec<Vec<BatchFrame>> = Vec::new();
    let mut used = 0usize;
    for mut f in specs {
        let full = out.last().is_none_or(|b| b.len() >= MAX_BATCH_FRAMES);
        if full || used + f.raw_len > batch_raw {
            out.push(Vec::new());
            used = 0;
        }
        f.raw_at = used;
        used += f.raw_len;
        out.last_mut().expect("pushed").push(f);
    }
    out
}

/// Run `threads` threads over `n` items.
pub(super) fn parallel(
    n: usize,
    threads: usize,
    work: &(dyn Fn(usize) -> Result<()> + Sync),
) -> Result<()> {
    let next = AtomicUsize::new(0);
    let err = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, n.max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                if let Err(e) = work(i) {
                    *err.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    next.store(n, Ordering::Relaxed);
                }
            });
        }
    });
    match err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)]
fn run_pipeline(
    src: &File,
    src_path: &Path,
    out: &File,
    out_path: &Path,
    batches: Vec<Vec<BatchFrame>>,
    encoder: &mut dyn Encoder,
    pinned_for: Option<&Arc<dyn Driver>>,
    slots: &mut Vec<Batch>,
    threads: usize,
    batch_raw: usize,
    data_start: u64,
    entries: &Mutex<Vec<FrameEntry>>,
    progress: &(dyn Fn(u64) + Sync),
    stopped: &(dyn Fn() -> Result<()> + Sync),
) -> Result<u64> {
    if slots.is_empty() {
        slots.extend(make_slots(batch_raw, pinned_for)?);
    }
    let bound = data_start
        + batches
            .iter()
            .flatten()
            .map(|f| format::max_frame_bytes_for(f.raw_len))
            .sum::<u64>();
    let map = OutMap::new(out, bound);
    let mapped = map.as_ref().map(|m| m.base());
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    let fail = |e: Error| {
        stop.store(true, Ordering::SeqCst);
        failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
    };
    let end = AtomicU64::new(data_start);
    let (free_tx, free_rx) = sync_channel::<Batch>(SLOTS);
    let (enc_tx, enc_rx) = sync_channel::<Batch>(SLOTS);
    let (wr_tx, wr_rx) = sync_channel::<Batch>(SLOTS);
    for s in slots.drain(..) {
        free_tx.send(s).expect("room for every slot");
    }
    let free_rx = std::thread::scope(|s| {
        // Reader: raw bytes of each batch's frames.
        let reader = s.spawn(|| {
            let (enc_tx, free_rx) = (enc_tx, free_rx);
            for frames in batches {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                if let Err(e) = stopped() {
                    fail(e);
                    break;
                }
                let Ok(mut b) = free_rx.recv() else { break };
                b.frames = frames;
                let base = b.input.ptr() as usize;
                let fr = &b.frames;
                let r = parallel(fr.len(), threads, &|i| {
                    let f = fr[i];
                    // SAFETY: each frame's range of the input is its own,
                    // inside the buffer (a batch holds at most `batch_raw`).
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut((base + f.raw_at) as *mut u8, f.raw_len)
                    };
                    src.read_exact_at(dst, f.src)
                        .map_err(|e| Error::io(src_path, e))
                });
                if let Err(e) = r {
                    fail(e);
                    break;
                }
                if enc_tx.send(b).is_err() {
                    break;
                }
            }
            free_rx
        });
        // Writer: each batch's frames at their offsets, in order.
        s.spawn(|| {
            let (free_tx, wr_rx) = (free_tx, wr_rx);
            for b in wr_rx.iter() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let mut at = end.load(Ordering::SeqCst);
                let mut places = Vec::with_capacity(b.frames.len());
                {
                    let mut e = entries.lock().unwrap_or_else(|p| p.into_inner());
                    for f in &b.frames {
                        e[f.index] = FrameEntry {
                            at,
                            len: f.out_len as u64,
                        };
                        places.push(at);
                        at += f.out_len as u64;
                    }
                }
                end.store(at, Ordering::SeqCst);
                let output = b.output();
                let fr = &b.frames;
                // The batch's frames lie back to back in its output and in
                // the file.
                let first = places.first().copied().unwrap_or(at);
                let bytes = &output[..(at - first) as usize];
                let r = match mapped {
                    // Through the mapping on every thread: buffered writes
                    // to one file take its lock in turn.
                    Some(base) => {
                        let piece = bytes.len().div_ceil(threads.max(1)).max(1 << 20);
                        parallel(bytes.len().div_ceil(piece), threads, &|i| {
                            let lo = i * piece;
                            let n = piece.min(bytes.len() - lo);
                            // SAFETY: `first + lo + n` is at most the bound
                            // the mapping covers (every frame at its
                            // largest); pieces are disjoint, and nothing
                            // else touches the mapping.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    bytes.as_ptr().add(lo),
                                    (base + first as usize + lo) as *mut u8,
                                    n,
                                )
                            };
                            Ok(())
                        })
                    }
                    None => out
                        .write_all_at(bytes, first)
                        .map_err(|e| Error::io(out_path, e)),
                };
                if let Err(e) = r {
                    fail(e);
                    break;
                }
                progress(fr.iter().map(|f| f.raw_len as u64).sum());
                // The reader may be done (its end of the channel gone).
                let _ = free_tx.send(b);
            }
        });
        // Encoder, on this thread (the device encoder stays on one thread).
        for mut b in enc_rx.iter() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            if let Err(e) = encoder.encode(&mut b) {
                fail(e);
                break;
            }
            if wr_tx.send(b).is_err() {
                break;
            }
        }
        drop(wr_tx);
        // Unblock a reader waiting for a slot.
        drop(enc_rx);
        reader.join().ok()
    });
    // The slots back, for the next file (those a failure left in a channel
    // are dropped with it).
    if let Some(rx) = free_rx {
        slots.extend(rx.try_iter());
    }
    // Unmapped before the file is cut to its length (its pages stay in the
    // page cache, dirty, for the sync).
    drop(map);
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let end = end.load(Ordering::SeqCst);
    out.set_len(end).map_err(|e| Error::io(out_path, e))?;
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_gaps_and_skip_empty_tensors() {
        let t = [
            (100, 50, Layout::Half),
            (64, 0, Layout::Half),
            (160, 40, Layout::Single),
        ];
        let p = pieces(64, 210, &t, 65536);
        let got: Vec<(u64, u64, Layout)> = p.iter().map(|p| (p.offset, p.len, p.layout)).collect();
        assert_eq!(
            got,
            vec![
                (64, 36, Layout::Bytes),
                (100, 50, Layout::Half),
                (150, 10, Layout::Bytes),
                (160, 40, Layout::Single),
                (200, 10, Layout::Bytes),
            ]
        );
        assert_eq!(p[4].first_frame, 4);
    }
}
