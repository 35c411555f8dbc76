//! A lossless codec for weights in host backups, built for the GPU: fixed
//! blocks of 64 KiB raw bytes that encode and decode independently (one CUDA
//! thread block each), the exponent byte of each element coded against the
//! block's most frequent values at a per-block width, everything else stored
//! raw, and a checksum per block that the decoder checks.
//!
//! This module is the reference (the host backend runs it; the CUDA kernels
//! in `kernels/codec.cu` produce the same bytes, checked by the driver
//! contract suite on a GPU). The byte layout is in [`format`](mod@format); why it is
//! built this way, with figures, in docs/CODEC.md.

mod block;
pub mod checksum;
pub mod format;

pub use format::{Layout, BLOCK_BYTES};

use format::{block_count, block_raw_len, data_start, FrameHeader, FRAME_HEADER_BYTES};

/// A frame that does not decode: which block (when one is to blame) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt encoded frame{}: {reason}", block.map(|b| format!(", block {b}")).unwrap_or_default())]
pub struct Corrupt {
    /// The block whose bytes are wrong, or `None` for the header and index.
    pub block: Option<usize>,
    /// What is wrong, with the values found.
    pub reason: String,
}

fn frame_error(reason: impl Into<String>) -> Corrupt {
    Corrupt {
        block: None,
        reason: reason.into(),
    }
}

/// Encode `raw` as one frame.
pub fn encode(raw: &[u8], layout: Layout) -> Vec<u8> {
    let n = block_count(raw.len());
    let mut out = Vec::with_capacity(format::max_frame_bytes(raw.len()));
    out.resize(data_start(n), 0);
    for b in 0..n {
        let at = out.len() as u64;
        out[FRAME_HEADER_BYTES + 8 * b..FRAME_HEADER_BYTES + 8 * b + 8]
            .copy_from_slice(&at.to_le_bytes());
        let lo = b * BLOCK_BYTES;
        block::encode_block(&raw[lo..lo + block_raw_len(raw.len(), b)], layout, &mut out);
    }
    let header = FrameHeader {
        layout,
        raw_len: raw.len() as u64,
        frame_len: out.len() as u64,
    };
    out[..FRAME_HEADER_BYTES].copy_from_slice(&header.to_bytes());
    out
}

/// The checked header and block bounds of `frame`, which must decode to
/// `raw_len` bytes: what a decoder needs before it touches a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The parsed header.
    pub header: FrameHeader,
    /// Each block's `[start, end)` in the frame.
    pub blocks: Vec<(usize, usize)>,
}

/// Parse `frame`'s header and index and check them against each other and
/// against `raw_len`: every block lies inside the frame, after the index,
/// in order. Reads nothing past the index.
pub fn parse(frame: &[u8], raw_len: usize) -> Result<Frame, Corrupt> {
    let header = FrameHeader::parse(frame).map_err(frame_error)?;
    if header.raw_len != raw_len as u64 {
        return Err(frame_error(format!(
            "header says {} raw bytes, expected {raw_len}",
            header.raw_len
        )));
    }
    if header.frame_len != frame.len() as u64 {
        return Err(frame_error(format!(
            "header says the frame is {} bytes, it is {}",
            header.frame_len,
            frame.len()
        )));
    }
    let n = block_count(raw_len);
    let start = data_start(n);
    if frame.len() < start {
        return Err(frame_error(format!(
            "frame of {} bytes is shorter than its header and index ({start})",
            frame.len()
        )));
    }
    let mut blocks = Vec::with_capacity(n);
    let mut prev = start;
    for b in 0..n {
        let at = FRAME_HEADER_BYTES + 8 * b;
        let off = u64::from_le_bytes(frame[at..at + 8].try_into().expect("8 bytes"));
        let ok = if b == 0 {
            off == start as u64
        } else {
            off >= prev as u64 && off <= frame.len() as u64
        };
        if !ok {
            return Err(frame_error(format!(
                "index entry {b} = {off} is outside [{prev}, {}]",
                frame.len()
            )));
        }
        if b > 0 {
            blocks.push((prev, off as usize));
        }
        prev = off as usize;
    }
    if n > 0 {
        blocks.push((prev, frame.len()));
    } else if frame.len() != start {
        return Err(frame_error("an empty frame has bytes after its header"));
    }
    Ok(Frame { header, blocks })
}

/// Decode `frame` into `out`, which must be exactly the raw length. On an
/// error `out` may hold anything; nothing outside it is written.
pub fn decode(frame: &[u8], out: &mut [u8]) -> Result<(), Corrupt> {
    let f = parse(frame, out.len())?;
    for (b, &(lo, hi)) in f.blocks.iter().enumerate() {
        let o = b * BLOCK_BYTES;
        let len = block_raw_len(out.len(), b);
        block::decode_block(&frame[lo..hi], f.header.layout, &mut out[o..o + len]).map_err(
            |reason| Corrupt {
                block: Some(b),
                reason,
            },
        )?;
    }
    Ok(())
}

/// The bytes `decode` would fill from `frame`, read from its header, or an
/// error when the header is not one.
pub fn raw_len(frame: &[u8]) -> Result<u64, Corrupt> {
    Ok(FrameHeader::parse(frame).map_err(frame_error)?.raw_len)
}
