//! The two encoders of the packer: the reference encoder on the CPU, one
//! frame per thread, and the driver's codec (the CUDA kernels on a GPU, the
//! reference behind the host backend), one batch at a time: raw bytes in,
//! encodes queued back to back, lengths read from pinned words, encoded bytes
//! out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::codec::{self, format as cf, Layout};
use crate::driver::{Driver, StreamId};
use crate::error::{Error, Result};
use crate::hostmem::PinnedHost;
use crate::segment::Segment;

/// One frame of a batch: its raw bytes at `raw_at` of the input, its
/// encoded bytes at `out_at` of the output once encoded.
#[derive(Debug, Clone, Copy)]
pub struct BatchFrame {
    /// Index among the file's frames.
    pub index: usize,
    /// Offset of its raw bytes in the original file.
    pub src: u64,
    /// Raw bytes.
    pub raw_len: usize,
    /// How its elements split.
    pub layout: Layout,
    /// Offset in the batch's input.
    pub raw_at: usize,
    /// Offset in the batch's output (set by the encoder).
    pub out_at: usize,
    /// Encoded bytes (set by the encoder).
    pub out_len: usize,
}

/// A batch of consecutive frames in host buffers.
#[derive(Debug)]
pub struct Batch {
    /// Raw bytes of the frames, back to back.
    pub input: PinnedHost,
    /// Encoded frames, back to back.
    pub output: PinnedHost,
    /// The frames, in file order.
    pub frames: Vec<BatchFrame>,
}

/// Most frames in one batch (a file of many small tensors has many frames
/// smaller than the frame size).
pub const MAX_BATCH_FRAMES: usize = 1024;

impl Batch {
    /// Room the output of a batch of at most `raw` raw bytes in at most
    /// [`MAX_BATCH_FRAMES`] frames needs with every frame at its largest,
    /// each rounded up to 256 bytes (the device encoder's slots): a frame's
    /// header, and per 64 KiB block an index entry and a block header.
    pub fn output_room(raw: usize) -> usize {
        let per_block = 8 + cf::BLOCK_HEADER_BYTES;
        raw + MAX_BATCH_FRAMES * (cf::FRAME_HEADER_BYTES + per_block + 256)
            + per_block * (raw / crate::codec::BLOCK_BYTES + 1)
    }

    pub(super) fn input(&self) -> &[u8] {
        // SAFETY: the buffer is `len` bytes, owned by the batch; no copy
        // writes it while a shared slice exists (stages hand batches on).
        unsafe { std::slice::from_raw_parts(self.input.ptr(), self.input.len()) }
    }

    pub(super) fn output(&self) -> &[u8] {
        // SAFETY: as in `input`.
        unsafe { std::slice::from_raw_parts(self.output.ptr(), self.output.len()) }
    }

    fn output_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `input`, exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.output.ptr(), self.output.len()) }
    }
}

/// Encodes batches.
pub trait Encoder {
    /// Encode every frame of `b` into its output, back to back, setting each
    /// frame's `out_at` and `out_len`.
    fn encode(&mut self, b: &mut Batch) -> Result<()>;
    /// Which encoder this is, for reports.
    fn name(&self) -> String;
}

/// The reference encoder on `threads` CPU threads.
pub struct CpuEncoder {
    pub threads: usize,
}

impl Encoder for CpuEncoder {
    fn encode(&mut self, b: &mut Batch) -> Result<()> {
        let encoded: Vec<Mutex<Vec<u8>>> = b.frames.iter().map(|_| Mutex::default()).collect();
        let next = AtomicUsize::new(0);
        let input = b.input();
        std::thread::scope(|s| {
            for _ in 0..self.threads.clamp(1, b.frames.len().max(1)) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(f) = b.frames.get(i) else { break };
                    let raw = &input[f.raw_at..f.raw_at + f.raw_len];
                    *encoded[i].lock().unwrap_or_else(|p| p.into_inner()) =
                        codec::encode(raw, f.layout);
                });
            }
        });
        let mut at = 0usize;
        let mut frames = std::mem::take(&mut b.frames);
        let out = b.output_mut();
        for (f, e) in frames.iter_mut().zip(encoded) {
            let e = e.into_inner().unwrap_or_else(|p| p.into_inner());
            out[at..at + e.len()].copy_from_slice(&e);
            (f.out_at, f.out_len) = (at, e.len());
            at += e.len();
        }
        b.frames = frames;
        Ok(())
    }

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.threads)
    }
}

/// The driver's codec: device buffers for one batch, the encoder's scratch,
/// and pinned words where each encode leaves its frame's length.
pub struct DeviceEncoder {
    driver: Arc<dyn Driver>,
    seg: Segment,
    dev_in: u64,
    dev_out: u64,
    scratch: u64,
    words: *mut u8,
    words_len: usize,
    stream: StreamId,
    max_frames: usize,
}

impl DeviceEncoder {
    /// Buffers for batches of up to `batch_raw` raw bytes in frames of up
    /// to `frame_raw`.
    pub fn new(driver: &Arc<dyn Driver>, batch_raw: usize, frame_raw: usize) -> Result<Self> {
        let max_frames = MAX_BATCH_FRAMES;
        let out_room = Batch::output_room(batch_raw);
        let scratch = cf::encode_scratch_bytes(frame_raw).next_multiple_of(256);
        let in_room = batch_raw.next_multiple_of(256);
        let seg = Segment::allocate(driver.clone(), in_room + out_room + scratch, 0)
            .map_err(|e| e.with_context(" (device buffers for packing)"))?;
        let words_len = 8 * max_frames;
        let words = driver.host_alloc(words_len)?;
        let stream = match driver.stream_create() {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: from `host_alloc` with this length, unused.
                let _ = unsafe { driver.host_free(words, words_len) };
                return Err(e);
            }
        };
        let base = seg.ptr();
        Ok(DeviceEncoder {
            driver: driver.clone(),
            dev_in: base,
            dev_out: base + in_room as u64,
            scratch: base + (in_room + out_room) as u64,
            seg,
            words,
            words_len,
            stream,
            max_frames,
        })
    }
}

impl Drop for DeviceEncoder {
    fn drop(&mut self) {
        if self.driver.stream_synchronize(self.stream).is_ok() {
            let _ = self.driver.stream_destroy(self.stream);
            // SAFETY: from `host_alloc` with this length; the stream that
            // wrote the words is idle.
            let _ = unsafe { self.driver.host_free(self.words, self.words_len) };
        }
        let _ = &self.seg;
    }
}

impl Encoder for DeviceEncoder {
    fn encode(&mut self, b: &mut Batch) -> Result<()> {
        let d = self.driver.as_ref();
        if b.frames.len() > self.max_frames {
            return Err(Error::InvalidState(format!(
                "a batch of {} frames for an encoder of {}",
                b.frames.len(),
                self.max_frames
            )));
        }
        let raw: usize = b
            .frames
            .iter()
            .map(|f| f.raw_at + f.raw_len)
            .max()
            .unwrap_or(0);
        let on = self.stream;
        // SAFETY: the input holds `raw` bytes and stays untouched until the
        // stream is synchronized below; `dev_in` has room for a batch.
        unsafe { d.copy_htod_async(self.dev_in, b.input.ptr(), raw, on)? };
        let mut slots = Vec::with_capacity(b.frames.len());
        let mut at = 0u64;
        for (i, f) in b.frames.iter().enumerate() {
            let word = self.words as u64 + 8 * i as u64;
            // SAFETY: the word is pinned host memory from `host_alloc`, read
            // only after the stream is synchronized.
            unsafe { std::ptr::write_volatile(word as *mut u64, u64::MAX) };
            // SAFETY: source, destination and scratch lie in the segment
            // (room for the batch, every frame at its largest, one frame's
            // scratch used in stream order); the word as above.
            unsafe {
                d.codec_encode_async(
                    self.dev_in + f.raw_at as u64,
                    f.raw_len,
                    f.layout,
                    self.dev_out + at,
                    self.scratch,
                    word,
                    on,
                )?
            };
            slots.push(at);
            at += cf::max_frame_bytes(f.raw_len).next_multiple_of(256) as u64;
        }
        d.stream_synchronize(on)?;
        let mut out_at = 0usize;
        for (i, f) in b.frames.iter_mut().enumerate() {
            // SAFETY: the encodes have completed (synchronized above).
            let len = unsafe {
                u64::from_le(std::ptr::read_volatile(
                    (self.words as u64 + 8 * i as u64) as *const u64,
                ))
            } as usize;
            let max = cf::max_frame_bytes(f.raw_len);
            if len < cf::FRAME_HEADER_BYTES || len > max {
                return Err(Error::InvalidState(format!(
                    "the device encoder reports {len} bytes for a frame of {} raw bytes (at most {max}); the codec PTX does not match this build",
                    f.raw_len
                )));
            }
            (f.out_at, f.out_len) = (out_at, len);
            out_at += len;
        }
        for (f, &slot) in b.frames.iter().zip(&slots) {
            // SAFETY: the output has room for every frame at its largest;
            // the frame's bytes were written by the completed encode.
            unsafe {
                d.copy_dtoh_async(
                    b.output.ptr().add(f.out_at),
                    self.dev_out + slot,
                    f.out_len,
                    on,
                )?
            };
        }
        d.stream_synchronize(on)
    }

    fn name(&self) -> String {
        self.driver.describe()
    }
}
