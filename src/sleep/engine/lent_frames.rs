//! Frames of another engine's compressed backup decoded into this engine's
//! device memory. The wake of replicas from one compressed backup
//! (`devices::replicas`) hands each member's engine a share of the holder's
//! frames; each decodes its share on its own device with its own scratch and
//! streams, through the same ring pipeline as a wake of its own
//! (`compressed.rs`), and reads every verdict before it returns.

use super::compressed::{CodecScratch, Decoded, FrameJob, FrameRec};
use super::SleepEngine;
use crate::codec::format;
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::tag::TagId;

/// One frame of a compressed backup, as plain data that copy threads can
/// take: segment bytes `[offset, offset + raw_len)` encoded as `len` bytes,
/// which lie in host memory as `runs` (`(host address, bytes)`, in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupFrame {
    /// The frame's index in its segment's backup.
    pub index: usize,
    /// Offset in the segment of the first raw byte.
    pub offset: usize,
    /// Raw bytes the frame decodes to.
    pub raw_len: usize,
    /// Encoded bytes.
    pub len: usize,
    /// The encoded bytes in pinned host memory, in order.
    pub runs: Vec<(usize, usize)>,
}

impl SleepEngine {
    /// Device bytes [`Self::decode_frames`] maps for its codec scratch when
    /// given `frames` frames of at most `largest` raw bytes: a wake of
    /// replicas counts them with the memory it maps.
    pub(crate) fn decode_scratch_bytes(&self, largest: usize, frames: usize) -> u64 {
        if frames == 0 {
            return 0;
        }
        let ring = self.lock().options.codec_ring;
        CodecScratch::wake_bytes(&self.driver, largest, ring, frames) as u64
    }

    /// Copy each frame of `frames` from host memory to this engine's device
    /// and decode it into `dst + frame.offset` (`dst` the base of the
    /// segment of `tag` that receives it), all in one ring on this engine's
    /// streams; then wait and check every frame's verdict. Returns the
    /// encoded bytes copied. A refused frame or a failed copy or decode is
    /// an error naming the tag, the segment and the frame; the caller
    /// unmaps what its wake mapped. The codec scratch is mapped for the
    /// call and given back after it (kept for a later try if the device
    /// refuses).
    ///
    /// # Safety
    /// The caller holds this engine's wake in steps ([`Self::stage_wake`]),
    /// with every destination range mapped and written by nothing else
    /// until return; every run's host bytes are pinned memory that stays
    /// allocated and unchanged until return.
    pub(crate) unsafe fn decode_frames(
        &self,
        tag: TagId,
        frames: &[(DevicePtr, &BackupFrame)],
    ) -> Result<u64> {
        if frames.is_empty() {
            return Ok(0);
        }
        self.release_stale_scratch();
        let (streams, ring) = {
            let mut s = self.lock();
            self.ensure_streams(&mut s)?;
            (s.streams.clone(), s.options.codec_ring)
        };
        let largest = frames.iter().map(|f| f.1.raw_len).max().unwrap_or(0);
        let mut guard = self.guard_scratch(Some(CodecScratch::for_wake(
            &self.driver,
            largest,
            ring,
            frames.len(),
        )?));
        let sc = guard.sc.as_mut().expect("set above");
        for (dst, f) in frames {
            let held: usize = f.runs.iter().map(|r| r.1).sum();
            if held != f.len || f.len > format::max_frame_bytes(f.raw_len) {
                return Err(Error::InvalidState(format!(
                    "frame {} of the backup of tag {tag} for the segment at {dst:#x}: {held} \
                     host bytes for a frame of {} encoded bytes ({} raw, at most {} encoded)",
                    f.index,
                    f.len,
                    f.raw_len,
                    format::max_frame_bytes(f.raw_len)
                )));
            }
        }
        let jobs: Vec<FrameJob> = frames
            .iter()
            .enumerate()
            .map(|(n, &(dst, f))| {
                let mut within = 0usize;
                let runs = f
                    .runs
                    .iter()
                    .map(|&(host, len)| {
                        within += len;
                        (host as *mut u8, len, within - len)
                    })
                    .collect();
                FrameJob {
                    seg: n,
                    label: Decoded {
                        tag,
                        ptr: dst,
                        frame: f.index,
                        rec: FrameRec {
                            offset: f.offset,
                            raw_len: f.raw_len,
                            at: 0,
                            len: f.len,
                        },
                    },
                    runs,
                }
            })
            .collect();
        let mut decoded = Vec::with_capacity(jobs.len());
        // SAFETY: the caller's contract: the runs stay pinned and unchanged,
        // the destinations are mapped (nothing to map per frame).
        let copied =
            unsafe { self.decode_pipeline(&jobs, sc, &streams, &mut decoded, &mut |_, _| Ok(())) };
        let checked = copied.and_then(|c| {
            self.check_decoded(sc, &streams, &decoded)?;
            for &st in &streams {
                self.driver.stream_synchronize(st)?;
            }
            Ok(c)
        });
        if checked.is_err() {
            // Copies or decodes queued before the error may still read the
            // runs: wait for them (the scratch's release waits too).
            for &st in &streams {
                let _ = self.driver.stream_synchronize(st);
            }
        }
        checked
    }
}
