//! Extents of packed shards (docs/PACKED.md): read the codec frames that
//! hold the bytes a plan copies, with the plain engine (direct windows or
//! staged slots, page cache or `pread`, as the options say) into a device
//! buffer, and decode them on the device straight into the destinations.
//!
//! The frames a plan needs are read in chunks of consecutive frames into two
//! device buffers in turn: while the engine reads chunk c + 1 into one, the
//! decodes of chunk c run from the other on a stream of their own (the
//! engine's call returns once its copies have landed; the decodes are only
//! queued), so neither the reads nor the decoder wait for the other. A frame
//! whose raw bytes one extent receives whole and contiguous decodes straight
//! into the destination; any other (a tensor-parallel slice, a conversion, a
//! frame two extents share) decodes into a device scratch, from which each
//! extent's rows are copied or converted. Every block's checksum is checked
//! by the decoder; each frame's verdict lands in a status word, read once
//! every decode has run, and a refused frame fails the load naming the file,
//! the tensor and the frame.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::execute::execute as execute_plain;
use super::options::{Control, CopyOptions, CopyStats, Strategy};
use super::scratch_release;
use super::staging::resident_share;
use crate::driver::{DevicePtr, Driver, EventId, StreamId};
use crate::error::{Error, Result};
use crate::loader::checkpoint::Shard;
use crate::loader::packed::FrameUse;
use crate::loader::plan::{Extent, Fill};
use crate::loader::read_error::source_invalid;
use crate::segment::Segment;

/// Bounds of one compressed-frame buffer of a page-cached load (two are
/// mapped): large enough that the engine's start and drain per chunk cost
/// little against the chunk's transfer, small enough to leave the device its
/// memory. A load from disk reads as much as a third of the free memory per
/// chunk instead: its large `pread` slots drain slowly at each chunk's end,
/// and its decodes are short against the disk's time anyway.
const MAX_CHUNK: u64 = 2 << 30;
const MIN_CHUNK: u64 = 32 << 20;

/// The largest page-cached chunk: [`MAX_CHUNK`], or `VMMW_PACKED_CHUNK_MIB`
/// (32 to 16384) to measure others.
fn chunk_cap() -> u64 {
    std::env::var("VMMW_PACKED_CHUNK_MIB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|m| (32..=16384).contains(m))
        .map_or(MAX_CHUNK, |m| m << 20)
}

/// One frame a plan needs, and the extents (indices into the packed
/// extents) that receive its bytes.
struct Work {
    shard: u32,
    f: FrameUse,
    targets: Vec<u32>,
    /// Where it decodes when one extent receives it whole and contiguous.
    direct: Option<DevicePtr>,
    /// Offset in its chunk's buffer.
    at: u64,
}

/// True when any shard is packed.
pub(super) fn any_packed(shards: &[Shard]) -> bool {
    shards.iter().any(|s| s.packed.is_some())
}

/// Rows `[r0, r1]` of `e` whose source bytes meet original bytes `[fs, fe)`.
fn rows_in(e: &Extent, fs: u64, fe: u64) -> Option<(u64, u64)> {
    let p = pitch(e);
    if fe <= e.src {
        return None;
    }
    let r0 = if fs < e.src + e.width {
        0
    } else {
        (fs - e.src - e.width) / p + 1
    };
    let r1 = ((fe - e.src).div_ceil(p) - 1).min(e.height - 1);
    (r0 <= r1).then_some((r0, r1))
}

fn pitch(e: &Extent) -> u64 {
    if e.height == 1 {
        e.width.max(1)
    } else {
        e.src_pitch
    }
}

fn dst_pitch(e: &Extent) -> u64 {
    if e.height == 1 {
        e.dst_width()
    } else {
        e.dst_pitch
    }
}

/// Where frame `f` decodes when `e` receives all of it as one run of
/// unconverted, contiguous bytes.
fn direct_target(e: &Extent, fs: u64, fe: u64) -> Option<DevicePtr> {
    let contiguous = e.height == 1 || (e.src_pitch == e.width && e.dst_pitch == e.width);
    let covers = e.src <= fs && fe <= e.src + e.width * e.height;
    (contiguous && covers && e.convert.is_none()).then(|| e.dst + (fs - e.src))
}

/// Copy (or convert) the part of `e` that frame bytes `[fs, fe)`, decoded at
/// `s` on the device, hold; returns the source bytes placed.
fn place(d: &dyn Driver, e: &Extent, fs: u64, fe: u64, s: DevicePtr, on: StreamId) -> Result<u64> {
    let Some((r0, r1)) = rows_in(e, fs, fe) else {
        return Ok(0);
    };
    let (p, dp) = (pitch(e), dst_pitch(e));
    let row = |r: u64| e.src + r * p;
    let full = |r: u64| row(r) >= fs && row(r) + e.width <= fe;
    let mut placed = 0u64;
    // Part of row r: source bytes [a, b).
    let part = |r: u64, placed: &mut u64| -> Result<()> {
        let (a, b) = (row(r).max(fs), (row(r) + e.width).min(fe));
        let src = s + (a - fs);
        // SAFETY: `src..+(b-a)` lies in the decoded frame in the scratch;
        // the destination row lies in a destination the plan checked; both
        // are used in the order of `on`, after the frame's decode.
        unsafe {
            match e.convert {
                Some((f, t)) => {
                    let dst = e.dst + r * dp + (a - row(r)) / f.size() as u64 * t.size() as u64;
                    d.convert_async(dst, t, src, f, ((b - a) / f.size() as u64) as usize, on)?
                }
                None => {
                    let dst = e.dst + r * dp + (a - row(r));
                    let w = (b - a) as usize;
                    d.copy_2d_dtod_async(dst, w, src, w, w, 1, on)?
                }
            }
        }
        *placed += b - a;
        Ok(())
    };
    // Whole rows [r, r + n).
    let rows = |r: u64, n: u64, placed: &mut u64| -> Result<()> {
        let src = s + (row(r) - fs);
        let dst = e.dst + r * dp;
        // SAFETY: as in `part`, for each of the `n` rows.
        unsafe {
            match e.convert {
                Some((f, t)) => {
                    let per = e.width / f.size() as u64;
                    if n == 1 || (p == e.width && dp == e.dst_width()) {
                        d.convert_async(dst, t, src, f, (per * n) as usize, on)?;
                    } else {
                        for k in 0..n {
                            d.convert_async(dst + k * dp, t, src + k * p, f, per as usize, on)?;
                        }
                    }
                }
                None => d.copy_2d_dtod_async(
                    dst,
                    dp as usize,
                    src,
                    p as usize,
                    e.width as usize,
                    n as usize,
                    on,
                )?,
            }
        }
        *placed += e.width * n;
        Ok(())
    };
    let mut r = r0;
    if !full(r0) {
        part(r0, &mut placed)?;
        r += 1;
    }
    let last_partial = r1 >= r && !full(r1);
    let end = if last_partial { r1 } else { r1 + 1 };
    if end > r {
        rows(r, end - r, &mut placed)?;
    }
    if last_partial {
        part(r1, &mut placed)?;
    }
    Ok(placed)
}

/// The frames the packed `extents` need, in file order, each with its
/// targets.
fn works(shards: &[Shard], extents: &[Extent]) -> Result<Vec<Work>> {
    let mut by_frame: BTreeMap<(u32, usize), (FrameUse, Vec<u32>)> = BTreeMap::new();
    for (i, e) in extents.iter().enumerate() {
        let sh = &shards[e.shard as usize];
        let ix = sh
            .packed
            .as_ref()
            .expect("packed extents read packed shards");
        if e.height > 1 && e.src_pitch < e.width {
            return Err(source_invalid(
                &sh.path,
                e.source,
                format!(
                    "copy rows {} bytes apart overlap ({} bytes each)",
                    e.src_pitch, e.width
                ),
            ));
        }
        let hi = e.src + (e.height - 1) * e.src_pitch + e.width;
        let uses = ix
            .frames_for(e.src, hi)
            .map_err(|r| source_invalid(&sh.path, e.source, r))?;
        for u in uses {
            if rows_in(e, u.raw.0, u.raw.1).is_some() {
                by_frame
                    .entry((e.shard, u.frame))
                    .or_insert((u, Vec::new()))
                    .1
                    .push(i as u32);
            }
        }
    }
    Ok(by_frame
        .into_iter()
        .map(|((shard, _), (f, targets))| {
            let direct = match targets.as_slice() {
                [t] => direct_target(&extents[*t as usize], f.raw.0, f.raw.1),
                _ => None,
            };
            Work {
                shard,
                f,
                targets,
                direct,
                at: 0,
            }
        })
        .collect())
}

/// Cut `works` into chunks of at most `chunk` encoded bytes (a larger frame
/// alone), setting each frame's offset in its chunk; returns each chunk's
/// range of `works`.
fn chunks(works: &mut [Work], chunk: u64) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut start, mut used) = (0usize, 0u64);
    for (i, w) in works.iter_mut().enumerate() {
        let len = w.f.entry.len;
        if i > start && used + len > chunk {
            out.push((start, i));
            (start, used) = (i, 0);
        }
        w.at = used;
        used += len.next_multiple_of(256);
    }
    if start < works.len() {
        out.push((start, works.len()));
    }
    out
}

/// The plain extents that read chunk `works` into the buffer at `buf`: one
/// per run of frames adjacent in a file.
fn reads(works: &[Work], extents: &[Extent], buf: DevicePtr) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    for w in works {
        let (at, len) = (w.f.entry.at, w.f.entry.len);
        let dst = buf + w.at;
        if let Some(last) = out.last_mut() {
            if last.shard == w.shard && last.src + last.width == at && last.dst + last.width == dst
            {
                last.width += len;
                last.src_pitch = last.width;
                last.dst_pitch = last.width;
                continue;
            }
        }
        out.push(Extent {
            shard: w.shard,
            src: at,
            src_pitch: len,
            width: len,
            height: 1,
            dst,
            dst_pitch: len,
            convert: None,
            source: extents[w.targets[0] as usize].source,
        });
    }
    out
}

/// Copy `extents` (of plain and packed shards) and zero `fills`, as
/// [`super::execute`] does.
pub(super) fn execute(
    driver: &Arc<dyn Driver>,
    shards: &[Shard],
    extents: &[Extent],
    fills: &[Fill],
    opts: &CopyOptions,
    ctl: &Control<'_>,
) -> Result<CopyStats> {
    opts.validate()?;
    let t0 = Instant::now();
    let total: u64 = extents.iter().map(Extent::src_bytes).sum();
    let cancelled = || ctl.cancel.is_some_and(|c| c.load(Ordering::SeqCst));
    if cancelled() {
        return Err(Error::Cancelled { done: 0, total });
    }
    let (plain, packed): (Vec<Extent>, Vec<Extent>) = extents
        .iter()
        .partition(|e| shards[e.shard as usize].packed.is_none());
    let quiet = Control {
        progress: None,
        cancel: ctl.cancel,
    };
    let mut stats = CopyStats::default();
    if !plain.is_empty() || !fills.is_empty() {
        let s =
            execute_plain(driver, shards, &plain, fills, opts, &quiet).map_err(|e| match e {
                Error::Cancelled { done, .. } => Error::Cancelled { done, total },
                e => e,
            })?;
        stats = CopyStats {
            packed_bytes: 0,
            ..s
        };
    }
    let mut done = stats.bytes;
    let mut works = works(shards, &packed)?;
    if !works.is_empty() {
        let d = driver.as_ref();
        let need: u64 = works
            .iter()
            .map(|w| w.f.entry.len.next_multiple_of(256))
            .sum();
        let largest = works.iter().map(|w| w.f.entry.len).max().unwrap_or(0);
        let free = d.mem_info().map_or(MIN_CHUNK * 8, |m| m.free);
        let cold = match opts.strategy {
            Strategy::Read => true,
            Strategy::Auto | Strategy::Hybrid => {
                resident_share(shards, &reads(&works, &packed, 0)) < 0.5
            }
            _ => false,
        };
        let cap = if cold {
            (free / 3).max(MIN_CHUNK)
        } else {
            (free / 16).clamp(MIN_CHUNK, chunk_cap())
        };
        let chunk = cap.min(need).max(largest).next_multiple_of(256);
        let ranges = chunks(&mut works, chunk);
        let raw_scratch = works
            .iter()
            .filter(|w| w.direct.is_none())
            .map(|w| w.f.raw.1 - w.f.raw.0)
            .max()
            .unwrap_or(0)
            .next_multiple_of(256);
        let bufs = if ranges.len() > 1 { 2 } else { 1 };
        let status_bytes = (4 * works.len() as u64).next_multiple_of(256);
        let size = bufs * chunk + raw_scratch + status_bytes;
        scratch_release::retry(driver);
        let seg = Segment::allocate(driver.clone(), size as usize, 0).map_err(|e| {
            e.with_context(&format!(
                " (device buffers of {size} bytes for decoding a packed checkpoint)"
            ))
        })?;
        let base = seg.ptr();
        let scratch = base + bufs * chunk;
        let status = scratch + raw_scratch;
        let mut events: Vec<EventId> = Vec::new();
        let mut stream = None;
        let r = (|| -> Result<()> {
            let on = d.stream_create()?;
            stream = Some(on);
            for _ in 0..bufs {
                events.push(d.event_create()?);
            }
            // SAFETY: the status words lie in the segment, used only on `on`.
            unsafe { d.memset_async(status, 0xFF, 4 * works.len(), on)? };
            let mut next_progress = done;
            for (c, &(lo, hi)) in ranges.iter().enumerate() {
                if cancelled() {
                    return Err(Error::Cancelled { done, total });
                }
                let b = c % bufs as usize;
                let buf = base + b as u64 * chunk;
                if c >= bufs as usize {
                    d.event_synchronize(events[b])?;
                }
                let rd = reads(&works[lo..hi], &packed, buf);
                let s =
                    execute_plain(driver, shards, &rd, &[], opts, &quiet).map_err(|e| match e {
                        Error::Cancelled { .. } => Error::Cancelled { done, total },
                        e => e,
                    })?;
                stats.packed_bytes += s.bytes;
                stats.direct_bytes += s.direct_bytes;
                stats.staged_bytes += s.staged_bytes;
                stats.read_bytes += s.read_bytes;
                stats.streamed_bytes += s.streamed_bytes;
                stats.threads = s.threads;
                stats.ring_bytes = stats.ring_bytes.max(s.ring_bytes);
                stats.ring_reused |= s.ring_reused;
                stats.ring_seconds += s.ring_seconds;
                stats.slot_bytes = s.slot_bytes;
                stats.depth = s.depth;
                stats.cache_resident = s.cache_resident;
                stats.slot_fill_seconds += s.slot_fill_seconds;
                stats.issue_seconds += s.issue_seconds;
                stats.wait_seconds += s.wait_seconds;
                stats.direct_seconds += s.direct_seconds;
                for (n, w) in works[lo..hi].iter().enumerate() {
                    let (raw, dst) = (w.f.raw.1 - w.f.raw.0, w.direct.unwrap_or(scratch));
                    // SAFETY: the frame's bytes landed at `buf + w.at` (the
                    // engine's copies completed when it returned); `dst` is a
                    // destination the plan checked, receiving exactly these
                    // bytes, or the scratch; the status word lies in the
                    // segment; everything is used in the order of `on`.
                    unsafe {
                        d.codec_decode_async(
                            buf + w.at,
                            w.f.entry.len as usize,
                            dst,
                            raw as usize,
                            status + 4 * (lo + n) as u64,
                            on,
                        )?
                    };
                    if w.direct.is_some() {
                        next_progress += raw;
                    } else {
                        for &t in &w.targets {
                            next_progress +=
                                place(d, &packed[t as usize], w.f.raw.0, w.f.raw.1, scratch, on)?;
                        }
                    }
                    stats.frames += 1;
                }
                d.event_record(events[b], on)?;
                done = next_progress;
                if let Some(p) = ctl.progress {
                    p(done.min(total), total);
                }
            }
            // Every verdict, once every decode has run.
            let mut words = vec![0u8; 4 * works.len()];
            // SAFETY: `words` outlives the synchronize below; the status
            // words were written by the decodes queued on `on`.
            unsafe { d.copy_dtoh_async(words.as_mut_ptr(), status, words.len(), on)? };
            d.stream_synchronize(on)?;
            for (w, v) in works.iter().zip(words.chunks_exact(4)) {
                let block = u32::from_le_bytes(v.try_into().expect("4 bytes"));
                if block != u32::MAX {
                    let sh = &shards[w.shard as usize];
                    return Err(source_invalid(
                        &sh.path,
                        packed[w.targets[0] as usize].source,
                        format!(
                            "packed frame {} (file bytes [{}, +{}), original bytes [{}, {})) fails its check at block {block}: the file is corrupt; the destinations hold partly loaded bytes",
                            w.f.frame, w.f.entry.at, w.f.entry.len, w.f.raw.0, w.f.raw.1
                        ),
                    ));
                }
            }
            Ok(())
        })();
        // Nothing is given back while a decode may still use it.
        let idle = match stream {
            Some(on) => d.stream_synchronize(on).is_ok(),
            None => true,
        };
        for e in events {
            let _ = d.event_destroy(e);
        }
        if let Some(on) = stream {
            let _ = d.stream_destroy(on);
        }
        if idle || d.synchronize().is_ok() {
            scratch_release::give_back(seg);
        } else {
            std::mem::forget(seg);
        }
        r?;
    }
    if let Some(p) = ctl.progress {
        p(total, total);
    }
    stats.bytes = total;
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(src: u64, pitch: u64, width: u64, height: u64) -> Extent {
        Extent {
            shard: 0,
            src,
            src_pitch: pitch,
            width,
            height,
            dst: 0,
            dst_pitch: width,
            convert: None,
            source: 0,
        }
    }

    #[test]
    fn rows_meet_a_frame_exactly() {
        // Rows of 10 bytes every 100 bytes from 1000: [1000,1010), [1100,1110), ...
        let e = ext(1000, 100, 10, 5);
        assert_eq!(rows_in(&e, 0, 1000), None);
        assert_eq!(rows_in(&e, 0, 1001), Some((0, 0)));
        assert_eq!(rows_in(&e, 1010, 1100), None);
        assert_eq!(rows_in(&e, 1005, 1105), Some((0, 1)));
        assert_eq!(rows_in(&e, 1109, 10_000), Some((1, 4)));
        assert_eq!(rows_in(&e, 1110, 1200), None);
        let one = ext(50, 0, 30, 1);
        assert_eq!(rows_in(&one, 60, 70), Some((0, 0)));
        assert_eq!(rows_in(&one, 80, 90), None);
        assert_eq!(direct_target(&one, 50, 80), Some(0));
        assert_eq!(direct_target(&one, 40, 80), None);
    }
}
