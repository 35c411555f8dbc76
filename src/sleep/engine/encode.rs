//! OffloadCompressed at sleep: a segment's bytes encoded on the device
//! frame by frame and copied into the arena (`compressed.rs` holds the
//! frames, the scratch and the wake's pipeline), the chunks released in runs
//! as the frames covering them are copied (`release.rs`).

use super::compressed::{CodecScratch, FrameRec};
use super::options::CycleReport;
use super::plan::SegTodo;
use super::release::{Pending, Unit};
use super::{SegmentBackup, SleepEngine};
use crate::codec::{format, Layout};
use crate::driver::StreamId;
use crate::error::{Error, Result};
use crate::tag::TagId;

impl SleepEngine {
    /// Give segment `t` (snapshot index `i`, of `tag`) a compressed backup
    /// of its bytes `ranges` (`refresh`: frames added to the backup it has,
    /// for the stale ranges an earlier sleep left; else a new backup of the
    /// whole segment): encode each frame on the device and queue its copy
    /// into the arena. `streams[0]` encodes, `streams[1]` copies. As soon as
    /// the frames queued cover a run of at least `piece` bytes of chunks, a
    /// unit for them goes to `pending` and `between` runs, so those chunks
    /// are unmapped while later frames encode. A frame is recorded only once
    /// its copies are queued. On an error the backup misses frames while
    /// copies into its pieces may still run: the sleep drops or trims it
    /// once the streams are synchronized (`release.rs`; the segment stays
    /// busy until then, so nothing restores, reads or unpins it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn issue_compressed(
        &self,
        tag: TagId,
        i: usize,
        t: &SegTodo,
        ranges: &[(usize, usize)],
        refresh: bool,
        layout: Layout,
        sc: &mut CodecScratch,
        streams: &[StreamId],
        pending: &mut Pending,
        report: &mut CycleReport,
        piece: usize,
        between: &mut dyn FnMut(&mut Pending, &mut CycleReport),
    ) -> Result<()> {
        let (encode_on, copy_on) = (streams[0], streams[1 % streams.len()]);
        let ptr = t.ptr;
        let mut at = {
            let mut s = self.lock();
            if !refresh {
                s.free_backup(ptr);
                s.backups.insert(
                    ptr,
                    SegmentBackup {
                        tag,
                        ranges: vec![(0, t.committed)],
                        pieces: Vec::new(),
                        frames: Vec::new(),
                        stale: Vec::new(),
                    },
                );
            }
            s.backups.get(&ptr).map_or(0, |b| b.len())
        };
        let (frame, ring) = (sc.frame_raw, sc.ring());
        // (segment offset, raw bytes) of every frame, in order.
        let specs: Vec<(usize, usize)> = ranges
            .iter()
            .flat_map(|&(o, l)| {
                (0..l)
                    .step_by(frame)
                    .map(move |j| (o + j, frame.min(l - j)))
            })
            .collect();
        let count = specs.len();
        let base = sc.turn;
        // Queue frame j's encode into its buffer, behind (on the device) the
        // copy that used the buffer a ring earlier: the host does not wait.
        let queue = |sc: &mut CodecScratch, j: usize| -> Result<()> {
            let k = (base + j) % ring;
            if sc.used[k] {
                self.driver.stream_wait_event(encode_on, sc.done[k])?;
            }
            // SAFETY: the segment's range is mapped (awake, or a chunk left
            // mapped) and in this transition; the frame buffer and the
            // encoder's scratch (used in stream order) lie in `sc`, the
            // length word in its pinned host words, read for the buffer's
            // last frame already; the encode runs after the copy that last
            // read the buffer (the wait above).
            unsafe {
                self.driver.codec_encode_async(
                    ptr + specs[j].0 as u64,
                    specs[j].1,
                    layout,
                    sc.frames[k],
                    sc.scratch,
                    sc.len_word(k),
                    encode_on,
                )
            }?;
            self.driver.event_record(sc.ready[k], encode_on)
        };
        // The encodes of the first ring - 1 frames go first; each step then
        // waits for the oldest, queues its copy, and queues one more encode,
        // so the encoder is never idle while the host learns a length.
        for j in 0..count.min(ring - 1) {
            queue(sc, j)?;
        }
        let (mut next_chunk, mut first, mut run_bytes) = (0usize, 0usize, 0usize);
        for (j, &(offset, raw_len)) in specs.iter().enumerate() {
            let k = (base + j) % ring;
            self.driver.event_synchronize(sc.ready[k])?;
            let max = format::max_frame_bytes(raw_len);
            let len = match sc.frame_len(k) {
                Some(len) if len > 0 && len <= max => len,
                got => {
                    let got = got.map_or("no length".to_owned(), |n| format!("{n} bytes"));
                    return Err(Error::InvalidState(format!(
                        "the device encoder reports {got} for a frame of {raw_len} raw bytes \
                         (1 to {max} possible); the codec PTX does not match this build"
                    )));
                }
            };
            let runs = {
                let mut guard = self.lock();
                let s = &mut *guard;
                let pieces = s.arena.alloc_pieces(len)?;
                let b = s.backups.get_mut(&ptr).expect("inserted or kept above");
                b.pieces.extend(pieces);
                b.byte_runs(&s.arena, at, len)
            };
            for (host, n, within) in runs {
                // SAFETY: `host` points at `n` bytes of this segment's backup,
                // kept (busy) until the copies are waited on; the frame
                // buffer holds the encoded frame (its encode completed).
                unsafe {
                    self.driver
                        .copy_dtoh_async(host, sc.frames[k] + within as u64, n, copy_on)?
                };
            }
            self.driver.event_record(sc.done[k], copy_on)?;
            sc.used[k] = true;
            if let Some(b) = self.lock().backups.get_mut(&ptr) {
                b.frames.push(FrameRec {
                    offset,
                    raw_len,
                    at,
                    len,
                });
            }
            at += len;
            report.copied_bytes += len as u64;
            report.raw_bytes += raw_len as u64;
            if j + ring - 1 < count {
                // Its buffer held frame j - 1, whose copy runs ahead of
                // frame j's: the link stays busy while the host waits.
                queue(sc, j + ring - 1)?;
            }
            if refresh {
                continue;
            }
            // The chunks the frames queued so far cover end to end.
            while next_chunk < t.chunks.len()
                && t.chunks[next_chunk].offset + t.chunks[next_chunk].size <= offset + raw_len
            {
                run_bytes += t.chunks[next_chunk].size;
                next_chunk += 1;
            }
            if next_chunk > first && (run_bytes >= piece || j + 1 == count) {
                let events = self.record_events(&[copy_on], &[true])?;
                pending.push(Unit {
                    seg: i,
                    chunks: first..next_chunk,
                    events,
                });
                (first, run_bytes) = (next_chunk, 0);
                between(pending, report);
            }
        }
        sc.turn += count;
        if refresh {
            if let Some(b) = self.lock().backups.get_mut(&ptr) {
                b.frames.sort_by_key(|f| f.offset);
            }
        }
        // Chunks past the last frame (none when the frames cover the
        // segment), or every chunk of a refreshed segment.
        let rest = if refresh { 0 } else { first };
        let events = self.record_events(&[copy_on], &[true])?;
        pending.push(Unit {
            seg: i,
            chunks: rest..t.chunks.len(),
            events,
        });
        Ok(())
    }
}
