//! OffloadCompressed: a segment's backup held as backup-codec frames
//! (`crate::codec`), encoded and decoded on the device, so only encoded
//! bytes cross the link and occupy the pinned arena.
//!
//! A segment is cut into frames of `SleepOptions::codec_frame_bytes` raw
//! bytes, passed through a ring of `codec_ring` device buffers (frame t of
//! the whole sleep or wake uses buffer t % ring). Sleep encodes frame j while
//! the copies of the frames before it to the host run, the host waiting only
//! to learn each frame's length; wake queues every frame's copy and decode
//! with the streams ordered on the device (a copy waits for the last decode
//! out of its buffer, a decode for its copy), so the host maps chunks and
//! queues work ahead of the link and never waits. Each frame's blocks carry
//! checksums: a corrupt backup fails the wake, and the caller unmaps what the
//! wake mapped (the tag stays asleep, the backup untouched).

use std::sync::Arc;

use super::options::CODEC_RING;
use super::{SegmentBackup, SleepEngine};
use crate::codec::{self, format};
use crate::driver::{CreateFlags, DevicePtr, Driver, EventId, PhysHandle, StreamId};
use crate::error::{Error, Result};
use crate::segment::map_new_at;
use crate::sleep::backup::BackupArena;
use crate::tag::TagId;

/// The most backup bytes a segment of `committed` bytes can take as frames
/// of `frame` raw bytes (every block stored raw): the host-memory check of a
/// sleep counts this.
pub(super) fn max_backup_bytes(committed: usize, frame: usize) -> usize {
    (0..committed)
        .step_by(frame)
        .map(|at| format::max_frame_bytes(frame.min(committed - at)))
        .sum()
}

/// One frame of a compressed backup: segment bytes `[offset, offset +
/// raw_len)`, encoded as `len` backup bytes from backup byte `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FrameRec {
    pub offset: usize,
    pub raw_len: usize,
    pub at: usize,
    pub len: usize,
}

/// A frame a wake queued for decoding, and whose verdict is in the status
/// word of its index in the wake's list: frame `frame` of a backup of `tag`,
/// decoded into the segment at `ptr`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Decoded {
    pub tag: TagId,
    pub ptr: DevicePtr,
    pub frame: usize,
    pub rec: FrameRec,
}

/// A host run of backup bytes: `len` bytes at `host` hold frame bytes from
/// `within`.
pub(super) type HostRun = (*mut u8, usize, usize);

/// A frame for [`SleepEngine::decode_pipeline`]: where it decodes and what
/// its verdict names (`label`), the segment the caller maps it into
/// (`seg`), and its encoded bytes in host memory (`runs`).
pub(super) struct FrameJob {
    pub seg: usize,
    pub label: Decoded,
    pub runs: Vec<HostRun>,
}

impl SegmentBackup {
    /// Backup bytes `[at, at + len)` as runs that each lie in one piece.
    pub(super) fn byte_runs(&self, arena: &BackupArena, at: usize, len: usize) -> Vec<HostRun> {
        let mut out = Vec::new();
        let mut done = 0usize;
        while done < len {
            let (host, left) = self.locate(arena, at + done);
            let n = left.min(len - done);
            out.push((host, n, done));
            done += n;
        }
        out
    }

    /// Keep only the frames that overlap a range of `needed` (segment
    /// `(offset, len)`): the others hold bytes no wake needs.
    pub(super) fn retain_frames_overlapping(&mut self, needed: &[(usize, usize)]) {
        self.frames.retain(|f| {
            needed
                .iter()
                .any(|&(o, l)| f.offset < o + l && o < f.offset + f.raw_len)
        });
    }

    /// True when the backup holds codec frames.
    pub(super) fn is_compressed(&self) -> bool {
        !self.frames.is_empty()
    }

    /// Raw bytes the frames decode to.
    pub(super) fn raw_len(&self) -> usize {
        if self.is_compressed() {
            self.frames.iter().map(|f| f.raw_len).sum()
        } else {
            self.len()
        }
    }
}

/// Device memory for the codec during one sleep or wake: a ring of frame
/// buffers and the encoder's scratch (at wake: the decoders' status words),
/// mapped on this device; events marking each buffer's last copy and its
/// last use.
#[derive(Debug)]
pub(super) struct CodecScratch {
    driver: Arc<dyn Driver>,
    va: DevicePtr,
    size: usize,
    /// What is still to give back: the reservation, the handle, the mapping.
    reserved: bool,
    handle: Option<PhysHandle>,
    mapped: bool,
    /// Raw bytes of the largest frame the buffers hold.
    pub(super) frame_raw: usize,
    pub(super) frames: Vec<DevicePtr>,
    pub(super) scratch: DevicePtr,
    /// Status words at `scratch` (wake).
    status_words: usize,
    /// One length word per buffer in pinned host memory (sleep; none at
    /// wake), shared with the engine: where the encode of the buffer's frame
    /// leaves the frame's length, read by the host with no copy once the
    /// encode has completed.
    words: Option<Arc<LengthWords>>,
    /// The buffer's frame is ready: encoded (sleep) or copied in (wake).
    pub(super) ready: Vec<EventId>,
    pub(super) done: Vec<EventId>,
    pub(super) used: Vec<bool>,
    /// Frames passed through the buffers so far: frame t of the whole
    /// sleep or wake uses buffer t % ring, so the buffers cycle across
    /// segments too and a segment's first frame never waits for the copy of
    /// the one before's last.
    pub(super) turn: usize,
}

/// A length word no encode has written since it was cleared.
const NO_LEN: u64 = u64::MAX;

/// Pinned host words, one per ring buffer of the largest ring, where the
/// encoder leaves each frame's length. The engine keeps them for its life:
/// pinning even these few bytes costs about a millisecond on the H200 and
/// unpinning a third of one, which every compressed sleep would otherwise
/// pay (2% of a 4 GiB sleep at the link's rate).
#[derive(Debug)]
pub(super) struct LengthWords {
    driver: Arc<dyn Driver>,
    ptr: u64,
}

impl LengthWords {
    const BYTES: usize = 8 * *CODEC_RING.end();

    pub(super) fn new(driver: &Arc<dyn Driver>) -> Result<LengthWords> {
        Ok(LengthWords {
            driver: driver.clone(),
            ptr: driver.host_alloc(Self::BYTES)? as u64,
        })
    }
}

impl Drop for LengthWords {
    fn drop(&mut self) {
        // An encode still queued may write a word: free only once the device
        // is idle, and keep the few bytes pinned when it cannot be shown so.
        if self.driver.synchronize().is_ok() {
            // SAFETY: from `host_alloc` with this length; the device is idle
            // and nothing holds the words any more (the last `Arc` drops
            // them: the engine's and every scratch's, stale ones included).
            let _ = unsafe { self.driver.host_free(self.ptr as *mut u8, Self::BYTES) };
        }
    }
}

impl CodecScratch {
    /// Map scratch for a sleep: `ring` buffers for frames of up to
    /// `frame_raw` raw bytes and the encoder's scratch; the frames' lengths
    /// go to `words`, which serve no other transition meanwhile (transitions
    /// run one at a time).
    pub(super) fn for_sleep(
        driver: &Arc<dyn Driver>,
        frame_raw: usize,
        ring: usize,
        words: Arc<LengthWords>,
    ) -> Result<CodecScratch> {
        let encoder = format::encode_scratch_bytes(frame_raw).next_multiple_of(256);
        let mut sc = Self::new(driver, frame_raw, ring, encoder, 0)?;
        debug_assert!(8 * sc.ring() <= LengthWords::BYTES);
        sc.words = Some(words);
        for k in 0..sc.ring() {
            sc.clear_len(k);
        }
        Ok(sc)
    }

    /// The length the encode of buffer `k`'s frame left, once it completed;
    /// `None` when it left none. The word is cleared again for the buffer's
    /// next frame.
    /// Device-visible address of buffer `k`'s length word (sleep).
    pub(super) fn len_word(&self, k: usize) -> u64 {
        self.words.as_ref().map_or(0, |w| w.ptr) + 8 * k as u64
    }

    pub(super) fn frame_len(&mut self, k: usize) -> Option<usize> {
        // SAFETY: `len_word(k)` is buffer k's word in the `LengthWords` the
        // scratch holds (a sleep's: only sleeps read lengths); the encode that writes word
        // `k` has completed (the caller synchronized its event) and the next
        // one into buffer `k` is queued only after this read.
        let word = unsafe { std::ptr::read_volatile(self.len_word(k) as *const u64) };
        self.clear_len(k);
        match u64::from_le(word) {
            NO_LEN => None,
            len => Some(len as usize),
        }
    }

    /// Mark buffer `k`'s length word as not written: an encode that leaves
    /// no length (a kernel of another build) is caught, not read as the
    /// length of the buffer's frame before.
    fn clear_len(&mut self, k: usize) {
        // SAFETY: as in `frame_len`; no encode into buffer `k` is queued
        // (none yet, or its last one completed and was read).
        unsafe { std::ptr::write_volatile(self.len_word(k) as *mut u64, NO_LEN.to_le()) };
    }

    /// Map scratch for a wake: `ring` buffers for frames of up to `frame_raw`
    /// raw bytes, and a status word for each of `frames` frames.
    pub(super) fn for_wake(
        driver: &Arc<dyn Driver>,
        frame_raw: usize,
        ring: usize,
        frames: usize,
    ) -> Result<CodecScratch> {
        Self::new(driver, frame_raw, ring, 4 * frames, frames)
    }

    /// Device bytes [`Self::for_wake`] maps for the same arguments.
    pub(super) fn wake_bytes(
        driver: &Arc<dyn Driver>,
        frame_raw: usize,
        ring: usize,
        frames: usize,
    ) -> usize {
        Self::size(driver, frame_raw, ring, 4 * frames)
    }

    /// Bytes mapped for `ring` buffers of frames of `frame_raw` raw bytes and
    /// `extra` bytes after them.
    fn size(driver: &Arc<dyn Driver>, frame_raw: usize, ring: usize, extra: usize) -> usize {
        let frame_room = format::max_frame_bytes(frame_raw).next_multiple_of(256);
        let extra = extra.max(8).next_multiple_of(256);
        (ring.max(2) * frame_room + extra).next_multiple_of(driver.granularity())
    }

    fn new(
        driver: &Arc<dyn Driver>,
        frame_raw: usize,
        ring: usize,
        extra: usize,
        status_words: usize,
    ) -> Result<CodecScratch> {
        let ring = ring.max(2);
        let frame_room = format::max_frame_bytes(frame_raw).next_multiple_of(256);
        let size = Self::size(driver, frame_raw, ring, extra);
        let va = driver.reserve(size, 0)?;
        let mut sc = CodecScratch {
            driver: driver.clone(),
            va,
            size,
            reserved: true,
            handle: None,
            mapped: false,
            frame_raw,
            frames: (0..ring).map(|k| va + (k * frame_room) as u64).collect(),
            scratch: va + (ring * frame_room) as u64,
            status_words,
            words: None,
            ready: vec![EventId(0); ring],
            done: vec![EventId(0); ring],
            used: vec![false; ring],
            turn: 0,
        };
        sc.handle = Some(
            // Its kind kept: a sleep falls back to raw backups when the
            // device is out of memory, and a wake says it is.
            map_new_at(driver.as_ref(), va, size, &[], CreateFlags::default()).map_err(|e| {
                e.with_context(&format!(
                    " (device scratch of {size} bytes for the backup codec)"
                ))
            })?,
        );
        sc.mapped = true;
        for k in 0..ring {
            sc.ready[k] = driver.event_create()?;
            sc.done[k] = driver.event_create()?;
        }
        Ok(sc)
    }

    /// Buffers in the ring.
    pub(super) fn ring(&self) -> usize {
        self.frames.len()
    }
}

impl CodecScratch {
    /// Give the scratch back to the driver, step by step; false when a step
    /// fails, what is left kept for a later try. A failed sleep or wake may
    /// leave copies or decodes queued on the scratch: nothing is unmapped
    /// before the device is shown idle.
    pub(super) fn try_release(&mut self) -> bool {
        if self.driver.synchronize().is_err() {
            return false;
        }
        for e in self.ready.iter_mut().chain(self.done.iter_mut()) {
            if e.0 != 0 {
                // An event that does not go away holds no memory.
                let _ = self.driver.event_destroy(*e);
                *e = EventId(0);
            }
        }
        if self.mapped {
            if self.driver.unmap(self.va, self.size).is_err() {
                return false;
            }
            self.mapped = false;
        }
        if let Some(h) = self.handle {
            if self.driver.release(h).is_err() {
                return false;
            }
            self.handle = None;
        }
        if self.reserved {
            if self.driver.free_va(self.va, self.size).is_err() {
                return false;
            }
            self.reserved = false;
        }
        true
    }
}

impl Drop for CodecScratch {
    fn drop(&mut self) {
        // Last try; the engine keeps a scratch it could not give back and
        // tries again before each transition and when it is dropped.
        let _ = self.try_release();
    }
}

/// A transition's scratch, given back when dropped, or kept by the engine
/// for a later try when the driver refuses now.
pub(super) struct ScratchGuard<'a> {
    engine: &'a SleepEngine,
    pub sc: Option<CodecScratch>,
}

impl Drop for ScratchGuard<'_> {
    fn drop(&mut self) {
        if let Some(mut sc) = self.sc.take() {
            if !sc.try_release() {
                self.engine.lock().stale_scratch.push(sc);
            }
        }
    }
}

impl SleepEngine {
    /// `sc` under a guard that gives it back.
    pub(super) fn guard_scratch(&self, sc: Option<CodecScratch>) -> ScratchGuard<'_> {
        ScratchGuard { engine: self, sc }
    }

    /// Try again to give back scratch an earlier transition could not.
    pub(super) fn release_stale_scratch(&self) {
        let mut stale = std::mem::take(&mut self.lock().stale_scratch);
        stale.retain_mut(|sc| !sc.try_release());
        self.lock().stale_scratch.extend(stale);
    }
}

impl SleepEngine {
    /// Queue the restore of the segments `ptrs` from their compressed
    /// backups: copy each frame to the device and decode it in place, one
    /// ring over all the segments' frames, so ring - 1 copies are queued
    /// ahead of every host wait, a segment's end included.
    /// `map_upto(p, end)` maps the chunks of segment `ptrs[p]` below segment
    /// offset `end`, called before each decode (so mapping overlaps the
    /// copies). `streams[0]` copies, `streams[1]` decodes. Each frame's
    /// verdict goes to a status word of the scratch, listed in `decoded` for
    /// [`Self::check_decoded`], which the wake calls once every frame is
    /// queued. Returns the encoded bytes copied. Nothing here writes the
    /// backup.
    pub(super) fn restore_compressed(
        &self,
        ptrs: &[DevicePtr],
        sc: &mut CodecScratch,
        streams: &[StreamId],
        decoded: &mut Vec<Decoded>,
        map_upto: &mut dyn FnMut(usize, usize) -> Result<()>,
    ) -> Result<u64> {
        // Every frame of every segment, in order.
        let mut jobs: Vec<FrameJob> = Vec::new();
        {
            let s = self.lock();
            for (p, ptr) in ptrs.iter().enumerate() {
                let b = &s.backups[ptr];
                for (j, f) in b.frames.iter().enumerate() {
                    jobs.push(FrameJob {
                        seg: p,
                        label: Decoded {
                            tag: b.tag,
                            ptr: *ptr,
                            frame: j,
                            rec: *f,
                        },
                        runs: b.byte_runs(&s.arena, f.at, f.len),
                    });
                }
            }
        }
        // SAFETY: the runs lie in this engine's backups of segments in this
        // wake (busy: kept and unchanged until it ends); `map_upto` maps each
        // destination before its decode.
        unsafe { self.decode_pipeline(&jobs, sc, streams, decoded, map_upto) }
    }

    /// Copy the frames `jobs` lists into the ring's buffers and decode each
    /// in place into `label.ptr + label.rec.offset`, one ring over all of
    /// them, the streams ordered on the device so the host never waits.
    /// `map_upto(seg, end)` runs before each decode is queued.
    /// `streams[0]` copies, `streams[1]` decodes; each verdict goes to the
    /// status word of its frame's place in `decoded`, which
    /// [`Self::check_decoded`] reads. Returns the encoded bytes copied.
    ///
    /// # Safety
    /// Every run's host bytes are pinned and stay allocated and unchanged
    /// until the decode stream is synchronized; each destination range is
    /// device memory of this engine's device, mapped by `map_upto` at the
    /// latest, that nothing else writes meanwhile.
    pub(super) unsafe fn decode_pipeline(
        &self,
        jobs: &[FrameJob],
        sc: &mut CodecScratch,
        streams: &[StreamId],
        decoded: &mut Vec<Decoded>,
        map_upto: &mut dyn FnMut(usize, usize) -> Result<()>,
    ) -> Result<u64> {
        let (copy_on, decode_on) = (streams[0], streams[1 % streams.len()]);
        let first = decoded.len();
        if first + jobs.len() > sc.status_words
            || jobs.iter().any(|f| f.label.rec.raw_len > sc.frame_raw)
        {
            return Err(Error::InvalidState(format!(
                "the wake's codec scratch holds {} status words and frames of {} raw bytes, \
                 too few for {} backup frames",
                sc.status_words,
                sc.frame_raw,
                jobs.len()
            )));
        }
        let status = sc.scratch + 4 * first as u64;
        if !jobs.is_empty() {
            // SAFETY: the status words lie in the scratch, mapped; no decode
            // queued before uses these.
            unsafe {
                self.driver
                    .memset_async(status, 0xFF, 4 * jobs.len(), decode_on)?
            };
        }
        let (base, ring) = (sc.turn, sc.ring());
        let mut copied = 0u64;
        // Each step queues one frame's copy into its buffer and its decode
        // out of it. The streams wait for each other on the device (a copy
        // for the last decode out of its buffer, a decode for its copy), so
        // the host never waits: it maps destinations and queues copies ahead
        // of the link, as the raw wake does.
        for (n, job) in jobs.iter().enumerate() {
            let f = job.label.rec;
            let k = (base + n) % ring;
            if sc.used[k] {
                self.driver.stream_wait_event(copy_on, sc.done[k])?;
            }
            for &(host, len, within) in &job.runs {
                // SAFETY: `host` holds `len` bytes of the frame, kept and
                // unchanged for the whole pipeline (the caller's contract);
                // the copy runs after the buffer's last decode (the wait
                // above).
                unsafe {
                    self.driver
                        .copy_htod_async(sc.frames[k] + within as u64, host, len, copy_on)?
                };
            }
            self.driver.event_record(sc.ready[k], copy_on)?;
            map_upto(job.seg, f.offset + f.raw_len)?;
            self.driver.stream_wait_event(decode_on, sc.ready[k])?;
            // SAFETY: the decode runs after the frame's copy into buffer k
            // (the wait above); the destination range is mapped (map_upto
            // above, or the caller's contract) and status word n lies in the
            // scratch.
            unsafe {
                self.driver.codec_decode_async(
                    sc.frames[k],
                    f.len,
                    job.label.ptr + f.offset as u64,
                    f.raw_len,
                    status + 4 * n as u64,
                    decode_on,
                )
            }?;
            self.driver.event_record(sc.done[k], decode_on)?;
            sc.used[k] = true;
            copied += f.len as u64;
            decoded.push(job.label);
        }
        sc.turn += jobs.len();
        Ok(copied)
    }

    /// Wait for the decodes `decoded` lists (queued on `streams[1]`) and
    /// fail when any frame was refused: a corrupt backup.
    pub(super) fn check_decoded(
        &self,
        sc: &CodecScratch,
        streams: &[StreamId],
        decoded: &[Decoded],
    ) -> Result<()> {
        let decode_on = streams[1 % streams.len()];
        let mut status = vec![0u8; 4 * decoded.len()];
        if !status.is_empty() {
            // SAFETY: `status` outlives the synchronize below; the words lie
            // in the scratch, written by the decodes queued on this stream.
            unsafe {
                self.driver.copy_dtoh_async(
                    status.as_mut_ptr(),
                    sc.scratch,
                    status.len(),
                    decode_on,
                )?
            };
        }
        self.driver.stream_synchronize(decode_on)?;
        for (d, w) in decoded.iter().zip(status.chunks_exact(4)) {
            let block = u32::from_le_bytes(w.try_into().expect("4 bytes"));
            if block != u32::MAX {
                return Err(Error::InvalidState(format!(
                    "the compressed host backup of tag {} is corrupt: segment at {:#x}, \
                     frame {} (segment bytes [{}, {})), block {block} fails its checksum; \
                     the tag stays asleep and its backup is left as it is",
                    d.tag,
                    d.ptr,
                    d.frame,
                    d.rec.offset,
                    d.rec.offset + d.rec.raw_len
                )));
            }
        }
        Ok(())
    }

    /// Decode the segment bytes `[off, off + dst.len())` of a compressed
    /// backup on the host (the reference codec), for reads of asleep memory.
    pub(super) fn read_compressed(
        b: &SegmentBackup,
        arena: &BackupArena,
        off: usize,
        dst: &mut [u8],
        tag: &str,
    ) -> Result<()> {
        let end = off + dst.len();
        for f in &b.frames {
            let (lo, hi) = (off.max(f.offset), end.min(f.offset + f.raw_len));
            if lo >= hi {
                continue;
            }
            let mut frame = vec![0u8; f.len];
            for (host, n, within) in b.byte_runs(arena, f.at, f.len) {
                // SAFETY: `host` holds `n` bytes of this backup; the engine
                // lock keeps the piece from being freed or reassigned.
                let from = unsafe { std::slice::from_raw_parts(host.cast_const(), n) };
                frame[within..within + n].copy_from_slice(from);
            }
            let mut raw = vec![0u8; f.raw_len];
            codec::decode(&frame, &mut raw).map_err(|e| {
                Error::InvalidState(format!(
                    "the compressed host backup of tag `{tag}` is corrupt (segment bytes [{}, {})): {e}",
                    f.offset,
                    f.offset + f.raw_len
                ))
            })?;
            dst[lo - off..hi - off].copy_from_slice(&raw[lo - f.offset..hi - f.offset]);
        }
        Ok(())
    }
}
