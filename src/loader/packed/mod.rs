//! Packed checkpoints: a safetensors or GGUF file whose tensors' bytes are
//! stored as backup-codec frames ([`crate::codec`]), with the original
//! header kept verbatim (docs/PACKED.md).
//!
//! This module owns the format ([`format`](mod@format)) and reading it on the host:
//! the checked index of a packed file ([`read_index`]) and the decode of
//! any range of original bytes ([`decode_range`]). The loader opens packed
//! files by their magic (`checkpoint.rs`, `gguf/`), gives their tensors the
//! offsets they had in the original file, and the copy engine decodes the
//! frames a plan reads on the device (`copy/packed.rs`). Packing and
//! unpacking are `loader::pack`.

pub mod format;

use std::fs::File;
use std::os::unix::fs::FileExt;

pub use format::{
    FrameEntry, FrameUse, Index, Piece, SourceKind, DEFAULT_FRAME_RAW, MAGIC, MAX_FRAME_RAW,
    MAX_MANIFEST, VERSION,
};

/// Read and check the index of the packed file `file` (`file_len` bytes):
/// the preamble first, then at most [`MAX_MANIFEST`] bytes of manifest, then
/// the padding before the frames. Reads nothing past `data_start`.
pub fn read_index(file: &File, file_len: u64) -> Result<Index, String> {
    let mut head = [0u8; format::PREAMBLE_BYTES];
    if file_len < head.len() as u64 {
        return Err(format!(
            "packed file of {file_len} bytes is shorter than its {}-byte preamble",
            head.len()
        ));
    }
    file.read_exact_at(&mut head, 0)
        .map_err(|e| format!("reading the preamble: {e}"))?;
    let pre = format::parse_preamble(&head, file_len)?;
    let mut rest = vec![0u8; (pre.data_start - format::PREAMBLE_BYTES as u64) as usize];
    file.read_exact_at(&mut rest, format::PREAMBLE_BYTES as u64)
        .map_err(|e| format!("reading the manifest: {e} (the file shrank?)"))?;
    let (m, pad) = rest.split_at(pre.manifest_len as usize);
    let ix = format::parse_manifest(&head, &pre, m, file_len)?;
    format::check_padding(pad)?;
    Ok(ix)
}

/// Decode the original bytes `[lo, lo + out.len())` of the packed file
/// `file` into `out` on the host (the reference decoder), reading only the
/// frames they need. The range lies in one piece or in the kept header; an
/// error names the frame that does not decode.
pub fn decode_range(file: &File, ix: &Index, lo: u64, out: &mut [u8]) -> Result<(), String> {
    if out.is_empty() {
        return Ok(());
    }
    let hi = lo + out.len() as u64;
    let plen = ix.prefix.len() as u64;
    let mut at = lo;
    if at < plen {
        let n = (hi.min(plen) - at) as usize;
        out[..n].copy_from_slice(&ix.prefix[at as usize..at as usize + n]);
        at += n as u64;
    }
    while at < hi {
        let p = ix
            .piece_at(at)
            .ok_or_else(|| format!("original byte {at} is past the file"))?;
        let piece = ix.pieces[p];
        let end = hi.min(piece.offset + piece.len);
        for u in ix.frames_for(at, end)? {
            let raw = decode_frame(file, &u)?;
            let (a, b) = (at.max(u.raw.0), end.min(u.raw.1));
            out[(a - lo) as usize..(b - lo) as usize]
                .copy_from_slice(&raw[(a - u.raw.0) as usize..(b - u.raw.0) as usize]);
        }
        at = end;
    }
    Ok(())
}

/// Read and decode one frame on the host.
pub fn decode_frame(file: &File, u: &FrameUse) -> Result<Vec<u8>, String> {
    let mut enc = vec![0u8; u.entry.len as usize];
    file.read_exact_at(&mut enc, u.entry.at)
        .map_err(|e| format!("reading frame {}: {e}", u.frame))?;
    let mut raw = vec![0u8; (u.raw.1 - u.raw.0) as usize];
    crate::codec::decode(&enc, &mut raw).map_err(|e| {
        format!(
            "frame {} (original bytes [{}, {})): {e}",
            u.frame, u.raw.0, u.raw.1
        )
    })?;
    Ok(raw)
}

/// Check the tensors a packed file's kept header lists against its pieces:
/// each tensor with bytes is exactly one piece (so its frames decode on
/// their own, whatever else is in the file). An error names the tensor.
pub fn check_tensors<'a>(
    ix: &Index,
    tensors: impl IntoIterator<Item = (&'a str, u64, u64)>,
) -> Result<(), (String, String)> {
    for (name, offset, len) in tensors {
        if len == 0 {
            continue;
        }
        let ok = ix
            .piece_at(offset)
            .map(|p| ix.pieces[p])
            .is_some_and(|p| p.offset == offset && p.len == len);
        if !ok {
            return Err((
                name.to_owned(),
                format!(
                    "the packed file holds no piece of exactly the tensor's bytes [{offset}, +{len}) of the original file; every tensor is packed as a piece of its own"
                ),
            ));
        }
    }
    Ok(())
}
