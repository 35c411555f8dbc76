//! The byte layout of a packed checkpoint file and its bounded, checked
//! parser. All integers are little-endian. docs/PACKED.md says why.
//!
//! ```text
//! file     = preamble (64 bytes) | manifest | zero padding to data_start | frames
//! preamble = magic "VMMWPACK" | version u32 (1) | flags u32 (0)
//!          | kind u32 (1 safetensors, 2 GGUF) | 0 u32
//!          | orig_len u64      bytes of the original file
//!          | prefix_len u64    original bytes [0, prefix_len) kept verbatim
//!          | manifest_len u64  bytes of the manifest
//!          | data_start u64    where the frames start: 64 + manifest_len
//!                              rounded up to 4096
//!          | manifest_sum u64  codec checksum of preamble[0..56] ++ manifest
//! manifest = prefix (prefix_len bytes: the original header, verbatim)
//!          | piece_count u64 | piece...    (40 bytes each)
//!          | frame_count u64 | frame...    (16 bytes each)
//! piece    = offset u64 | len u64 | frame_raw u64 | first_frame u64
//!          | layout u8 (element width 1, 2, 4) | 0 (7 bytes)
//! frame    = at u64 (file offset) | len u64 (bytes of the codec frame)
//! ```
//!
//! The pieces tile the original bytes after the prefix, in order: each
//! tensor is one piece, and the bytes between tensors (GGUF's alignment
//! padding, anything else a file holds there) are pieces of their own. A
//! piece of `len` bytes is cut into frames of `frame_raw` raw bytes (the last
//! shorter), numbered from `first_frame`; each frame is one backup-codec frame
//! ([`crate::codec`]), which decodes on its own and carries a checksum of its
//! decoded bytes per 64 KiB block. The frames tile `[data_start, file_len)`
//! in order, with no byte outside a frame.

use crate::codec::{format as cf, Layout};

/// The file's first eight bytes. A safetensors file starts with its header
/// length (these bytes read as about 5.2e18, past any header limit) and a
/// GGUF file with "GGUF", so the three never look alike.
pub const MAGIC: [u8; 8] = *b"VMMWPACK";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the preamble.
pub const PREAMBLE_BYTES: usize = 64;
/// Bytes of one piece record.
pub const PIECE_BYTES: usize = 40;
/// Bytes of one frame record.
pub const FRAME_BYTES: usize = 16;
/// Frames start at a multiple of this (page-aligned reads and registrations).
pub const DATA_ALIGN: u64 = 4096;
/// Largest manifest read: the original header (GGUF's limit is 256 MiB,
/// safetensors' 100 MB) and the piece and frame tables.
pub const MAX_MANIFEST: u64 = 512 << 20;
/// Largest raw bytes per frame.
pub const MAX_FRAME_RAW: u64 = 256 << 20;
/// Raw bytes per frame unless the packer is told otherwise: 256 codec blocks,
/// about two GPU thread blocks per SM for each decode launch, and the unit a
/// tensor-parallel slice decodes whole.
pub const DEFAULT_FRAME_RAW: u64 = 16 << 20;

/// What format the original file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// A safetensors file.
    Safetensors = 1,
    /// A GGUF file.
    Gguf = 2,
}

/// One piece of the original file: `len` bytes at original offset `offset`,
/// as frames of `frame_raw` raw bytes from frame `first_frame` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Offset in the original file.
    pub offset: u64,
    /// Raw bytes.
    pub len: u64,
    /// Raw bytes per frame (the last frame may be shorter).
    pub frame_raw: u64,
    /// Index of the piece's first frame in [`Index::frames`].
    pub first_frame: u64,
    /// How the codec split its elements.
    pub layout: Layout,
}

impl Piece {
    /// Frames the piece is cut into.
    pub fn frame_count(&self) -> u64 {
        self.len.div_ceil(self.frame_raw)
    }

    /// Original bytes `[lo, hi)` of frame `k` of this piece.
    pub fn frame_range(&self, k: u64) -> (u64, u64) {
        let lo = self.offset + k * self.frame_raw;
        (lo, (lo + self.frame_raw).min(self.offset + self.len))
    }
}

/// Where one frame's bytes are in the packed file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameEntry {
    /// File offset.
    pub at: u64,
    /// Bytes of the codec frame.
    pub len: u64,
}

/// A checked packed file: what it holds and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// The original file's format.
    pub kind: SourceKind,
    /// Bytes of the original file.
    pub orig_len: u64,
    /// The original file's bytes `[0, prefix.len())`, verbatim.
    pub prefix: Vec<u8>,
    /// The pieces, in original order.
    pub pieces: Vec<Piece>,
    /// The frames, in file order.
    pub frames: Vec<FrameEntry>,
    /// Where the frames start.
    pub data_start: u64,
    /// Bytes of the packed file.
    pub file_len: u64,
}

/// One frame a range of original bytes needs: its index, its entry and the
/// original bytes it decodes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameUse {
    /// Index into [`Index::frames`].
    pub frame: usize,
    /// The piece it belongs to.
    pub piece: usize,
    /// Its bytes in the packed file.
    pub entry: FrameEntry,
    /// Original bytes `[lo, hi)` it decodes to.
    pub raw: (u64, u64),
    /// The piece's layout.
    pub layout: Layout,
}

impl Index {
    /// The piece holding original byte `offset`.
    pub fn piece_at(&self, offset: u64) -> Option<usize> {
        let i = self.pieces.partition_point(|p| p.offset + p.len <= offset);
        (i < self.pieces.len() && self.pieces[i].offset <= offset).then_some(i)
    }

    /// The frames that decode the original bytes `[lo, hi)`, in order; an
    /// error when the range is empty, leaves the data section or crosses a
    /// piece boundary (a tensor is one piece, and a copy reads one tensor).
    pub fn frames_for(&self, lo: u64, hi: u64) -> Result<Vec<FrameUse>, String> {
        let p = self
            .piece_at(lo)
            .filter(|_| lo < hi)
            .ok_or_else(|| format!("original bytes [{lo}, {hi}) are not in a packed piece"))?;
        let piece = self.pieces[p];
        if hi > piece.offset + piece.len {
            return Err(format!(
                "original bytes [{lo}, {hi}) cross the end of the piece [{}, {})",
                piece.offset,
                piece.offset + piece.len
            ));
        }
        let k0 = (lo - piece.offset) / piece.frame_raw;
        let k1 = (hi - piece.offset).div_ceil(piece.frame_raw);
        Ok((k0..k1)
            .map(|k| {
                let frame = (piece.first_frame + k) as usize;
                FrameUse {
                    frame,
                    piece: p,
                    entry: self.frames[frame],
                    raw: piece.frame_range(k),
                    layout: piece.layout,
                }
            })
            .collect())
    }

    /// Raw bytes of the largest frame.
    pub fn max_frame_raw(&self) -> u64 {
        self.pieces
            .iter()
            .map(|p| p.frame_raw.min(p.len))
            .max()
            .unwrap_or(0)
    }

    /// Bytes the frames take in the file.
    pub fn frame_bytes(&self) -> u64 {
        self.file_len - self.data_start
    }

    /// The manifest's bytes for these fields (the prefix, the tables).
    pub fn manifest(&self) -> Vec<u8> {
        manifest_bytes(&self.prefix, &self.pieces, &self.frames)
    }

    /// The preamble for these fields and `manifest`.
    pub fn preamble(&self, manifest: &[u8]) -> [u8; PREAMBLE_BYTES] {
        let mut b = [0u8; PREAMBLE_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..20].copy_from_slice(&(self.kind as u32).to_le_bytes());
        b[24..32].copy_from_slice(&self.orig_len.to_le_bytes());
        b[32..40].copy_from_slice(&(self.prefix.len() as u64).to_le_bytes());
        b[40..48].copy_from_slice(&(manifest.len() as u64).to_le_bytes());
        b[48..56].copy_from_slice(&self.data_start.to_le_bytes());
        let sum = manifest_sum(&b[..56], manifest);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
        b
    }
}

/// The most bytes a frame of `raw_len` raw bytes takes (every block raw).
pub fn max_frame_bytes_for(raw_len: usize) -> u64 {
    cf::max_frame_bytes(raw_len) as u64
}

/// Where the frames start for a manifest of `manifest_len` bytes.
pub fn data_start_for(manifest_len: u64) -> u64 {
    (PREAMBLE_BYTES as u64 + manifest_len).div_ceil(DATA_ALIGN) * DATA_ALIGN
}

/// Bytes of the manifest for a prefix of `prefix_len` bytes, `pieces` pieces
/// and `frames` frames: known before any frame is encoded, so the packer
/// writes frames from their final place on.
pub fn manifest_len(prefix_len: u64, pieces: u64, frames: u64) -> u64 {
    prefix_len + 8 + PIECE_BYTES as u64 * pieces + 8 + FRAME_BYTES as u64 * frames
}

fn manifest_bytes(prefix: &[u8], pieces: &[Piece], frames: &[FrameEntry]) -> Vec<u8> {
    let mut m = Vec::with_capacity(manifest_len(
        prefix.len() as u64,
        pieces.len() as u64,
        frames.len() as u64,
    ) as usize);
    m.extend_from_slice(prefix);
    m.extend_from_slice(&(pieces.len() as u64).to_le_bytes());
    for p in pieces {
        for v in [p.offset, p.len, p.frame_raw, p.first_frame] {
            m.extend_from_slice(&v.to_le_bytes());
        }
        m.extend_from_slice(&[p.layout as u8, 0, 0, 0, 0, 0, 0, 0]);
    }
    m.extend_from_slice(&(frames.len() as u64).to_le_bytes());
    for f in frames {
        m.extend_from_slice(&f.at.to_le_bytes());
        m.extend_from_slice(&f.len.to_le_bytes());
    }
    m
}

/// The checksum the preamble stores: the codec's block checksum over the
/// preamble's first 56 bytes and the manifest, so a changed byte anywhere
/// in them is refused before any field is believed.
pub fn manifest_sum(head: &[u8], manifest: &[u8]) -> u64 {
    let mut all = Vec::with_capacity(head.len() + manifest.len());
    all.extend_from_slice(head);
    all.extend_from_slice(manifest);
    crate::codec::checksum::block_checksum(&all)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// True when `head` (a file's first bytes) starts with the packed magic.
pub fn is_packed(head: &[u8]) -> bool {
    head.len() >= MAGIC.len() && head[..MAGIC.len()] == MAGIC
}

/// The fields of a preamble, checked on their own: what [`parse_manifest`]
/// needs to know how many bytes to read next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    /// The original file's format.
    pub kind: SourceKind,
    /// Bytes of the original file.
    pub orig_len: u64,
    /// Bytes of the kept header.
    pub prefix_len: u64,
    /// Bytes of the manifest.
    pub manifest_len: u64,
    /// Where the frames start.
    pub data_start: u64,
    /// The stored checksum.
    pub sum: u64,
}

/// Parse and check the preamble of a packed file of `file_len` bytes.
pub fn parse_preamble(b: &[u8], file_len: u64) -> Result<Preamble, String> {
    if b.len() < PREAMBLE_BYTES || file_len < PREAMBLE_BYTES as u64 {
        return Err(format!(
            "packed file of {file_len} bytes is shorter than its {PREAMBLE_BYTES}-byte preamble"
        ));
    }
    if !is_packed(b) {
        return Err(format!("magic {:02x?} is not \"VMMWPACK\"", &b[..8]));
    }
    let version = u32_at(b, 8);
    if version != VERSION {
        return Err(format!(
            "packed format version {version} (this build reads version {VERSION})"
        ));
    }
    if u32_at(b, 12) != 0 || u32_at(b, 20) != 0 {
        return Err("reserved preamble bytes are not zero (flags of a newer writer?)".into());
    }
    let kind = match u32_at(b, 16) {
        1 => SourceKind::Safetensors,
        2 => SourceKind::Gguf,
        k => {
            return Err(format!(
                "source kind {k} is neither safetensors (1) nor GGUF (2)"
            ))
        }
    };
    let p = Preamble {
        kind,
        orig_len: u64_at(b, 24),
        prefix_len: u64_at(b, 32),
        manifest_len: u64_at(b, 40),
        data_start: u64_at(b, 48),
        sum: u64_at(b, 56),
    };
    let room = file_len - PREAMBLE_BYTES as u64;
    if p.manifest_len > MAX_MANIFEST || p.manifest_len > room {
        return Err(format!(
            "manifest of {} bytes runs past the end of the file ({file_len} bytes) or over the {MAX_MANIFEST}-byte limit",
            p.manifest_len
        ));
    }
    if p.data_start != data_start_for(p.manifest_len) || p.data_start > file_len {
        return Err(format!(
            "frames start at byte {}, expected {} (after the manifest, 4096-aligned) and inside the file ({file_len} bytes)",
            p.data_start,
            data_start_for(p.manifest_len)
        ));
    }
    if p.prefix_len > p.manifest_len || p.prefix_len > p.orig_len {
        return Err(format!(
            "kept header of {} bytes is longer than the manifest ({}) or the original file ({})",
            p.prefix_len, p.manifest_len, p.orig_len
        ));
    }
    Ok(p)
}

/// Parse and check the manifest `m` of the file whose preamble is `head`
/// (already checked as `pre`), `file_len` bytes long. Every count is checked
/// against the bytes left before anything is allocated for it, every offset
/// with checked arithmetic; on success the pieces tile the original bytes
/// after the prefix and the frames tile the file after `data_start`.
pub fn parse_manifest(
    head: &[u8],
    pre: &Preamble,
    m: &[u8],
    file_len: u64,
) -> Result<Index, String> {
    if m.len() as u64 != pre.manifest_len {
        return Err(format!(
            "manifest holds {} bytes, the preamble says {}",
            m.len(),
            pre.manifest_len
        ));
    }
    let sum = manifest_sum(&head[..56], m);
    if sum != pre.sum {
        return Err(format!(
            "manifest checksum {sum:016x} is not the stored {:016x}: the header is corrupt",
            pre.sum
        ));
    }
    let mut pos = pre.prefix_len as usize;
    let count = |pos: &mut usize, rec: usize, what: &str| -> Result<usize, String> {
        if m.len() - *pos < 8 {
            return Err(format!("manifest ends before its {what} count"));
        }
        let n = u64_at(m, *pos);
        *pos += 8;
        let left = (m.len() - *pos) as u64;
        if n > left / rec as u64 {
            return Err(format!(
                "{n} {what}s need {} bytes, the manifest has {left} left",
                n.saturating_mul(rec as u64)
            ));
        }
        Ok(n as usize)
    };
    let n_pieces = count(&mut pos, PIECE_BYTES, "piece")?;
    let mut pieces = Vec::with_capacity(n_pieces);
    let (mut next_off, mut next_frame) = (pre.prefix_len, 0u64);
    for i in 0..n_pieces {
        let r = &m[pos..pos + PIECE_BYTES];
        pos += PIECE_BYTES;
        let layout = Layout::from_width(r[32])
            .ok_or_else(|| format!("piece {i}: element width {} is not 1, 2 or 4", r[32]))?;
        if r[33..40] != [0; 7] {
            return Err(format!("piece {i}: reserved bytes are not zero"));
        }
        let p = Piece {
            offset: u64_at(r, 0),
            len: u64_at(r, 8),
            frame_raw: u64_at(r, 16),
            first_frame: u64_at(r, 24),
            layout,
        };
        if p.offset != next_off || p.len == 0 {
            return Err(format!(
                "piece {i} covers original bytes [{}, +{}), expected a non-empty piece at {next_off}",
                p.offset, p.len
            ));
        }
        if p.frame_raw == 0
            || p.frame_raw > MAX_FRAME_RAW
            || !p.frame_raw.is_multiple_of(cf::BLOCK_BYTES as u64)
        {
            return Err(format!(
                "piece {i}: {} raw bytes per frame is not a multiple of {} up to {MAX_FRAME_RAW}",
                p.frame_raw,
                cf::BLOCK_BYTES
            ));
        }
        if p.first_frame != next_frame {
            return Err(format!(
                "piece {i}: first frame {}, expected {next_frame}",
                p.first_frame
            ));
        }
        next_off = p
            .offset
            .checked_add(p.len)
            .filter(|&e| e <= pre.orig_len)
            .ok_or_else(|| {
                format!(
                    "piece {i} [{}, +{}) runs past the original file ({} bytes)",
                    p.offset, p.len, pre.orig_len
                )
            })?;
        next_frame += p.frame_count();
        pieces.push(p);
    }
    if next_off != pre.orig_len {
        return Err(format!(
            "the pieces end at original byte {next_off}, the original file has {} bytes",
            pre.orig_len
        ));
    }
    let n_frames = count(&mut pos, FRAME_BYTES, "frame")?;
    if n_frames as u64 != next_frame {
        return Err(format!(
            "{n_frames} frames listed, the pieces need {next_frame}"
        ));
    }
    if pos + n_frames * FRAME_BYTES != m.len() {
        return Err(format!(
            "manifest has {} bytes after its frame table",
            m.len() - pos - n_frames * FRAME_BYTES
        ));
    }
    let mut frames = Vec::with_capacity(n_frames);
    let mut at = pre.data_start;
    for p in &pieces {
        for k in 0..p.frame_count() {
            let f = p.first_frame + k;
            let (lo, hi) = p.frame_range(k);
            let e = FrameEntry {
                at: u64_at(m, pos),
                len: u64_at(m, pos + 8),
            };
            pos += FRAME_BYTES;
            let max = cf::max_frame_bytes((hi - lo) as usize) as u64;
            if e.at != at || e.len < cf::FRAME_HEADER_BYTES as u64 || e.len > max {
                return Err(format!(
                    "frame {f} at byte {} of {} bytes: expected it at {at}, {} to {max} bytes for {} raw bytes",
                    e.at,
                    e.len,
                    cf::FRAME_HEADER_BYTES,
                    hi - lo
                ));
            }
            at = e.at.checked_add(e.len).filter(|&x| x <= file_len).ok_or_else(|| {
                format!(
                    "frame {f} [{}, +{}) runs past the end of the file ({file_len} bytes; truncated?)",
                    e.at, e.len
                )
            })?;
            frames.push(e);
        }
    }
    if at != file_len {
        return Err(format!(
            "the frames end at byte {at}, the file has {file_len} bytes"
        ));
    }
    Ok(Index {
        kind: pre.kind,
        orig_len: pre.orig_len,
        prefix: m[..pre.prefix_len as usize].to_vec(),
        pieces,
        frames,
        data_start: pre.data_start,
        file_len,
    })
}

/// Check the padding between the manifest and the frames: zero bytes only,
/// so no byte of a packed file is outside what the format describes.
pub fn check_padding(pad: &[u8]) -> Result<(), String> {
    match pad.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(i) => Err(format!(
            "padding byte {i} before the frames is {:#04x}, not zero",
            pad[i]
        )),
    }
}

/// Parse a whole packed file held in memory (tests and the fuzz target).
pub fn parse(file: &[u8]) -> Result<Index, String> {
    let pre = parse_preamble(file, file.len() as u64)?;
    let end = PREAMBLE_BYTES + pre.manifest_len as usize;
    let ix = parse_manifest(file, &pre, &file[PREAMBLE_BYTES..end], file.len() as u64)?;
    check_padding(&file[end..pre.data_start as usize])?;
    Ok(ix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let raw: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let prefix = b"HEADER!!".to_vec();
        let pieces = vec![Piece {
            offset: 8,
            len: raw.len() as u64,
            frame_raw: 131072,
            first_frame: 0,
            layout: Layout::Half,
        }];
        let frames_raw: Vec<Vec<u8>> = raw
            .chunks(131072)
            .map(|c| crate::codec::encode(c, Layout::Half))
            .collect();
        let ml = manifest_len(8, 1, frames_raw.len() as u64);
        let ds = data_start_for(ml);
        let mut at = ds;
        let frames: Vec<FrameEntry> = frames_raw
            .iter()
            .map(|f| {
                let e = FrameEntry {
                    at,
                    len: f.len() as u64,
                };
                at += f.len() as u64;
                e
            })
            .collect();
        let ix = Index {
            kind: SourceKind::Safetensors,
            orig_len: 8 + raw.len() as u64,
            prefix,
            pieces,
            frames,
            data_start: ds,
            file_len: at,
        };
        let m = ix.manifest();
        assert_eq!(m.len() as u64, ml);
        let mut out = ix.preamble(&m).to_vec();
        out.extend_from_slice(&m);
        out.resize(ds as usize, 0);
        for f in frames_raw {
            out.extend_from_slice(&f);
        }
        out
    }

    #[test]
    fn round_trips_and_finds_frames() {
        let f = sample();
        let ix = parse(&f).unwrap();
        assert_eq!(ix.frames.len(), 2);
        let u = ix.frames_for(8 + 131_000, 8 + 131_100).unwrap();
        assert_eq!(u.len(), 2);
        assert_eq!(u[1].raw, (8 + 131072, 8 + 200_000));
        assert!(ix.frames_for(0, 4).is_err());
        assert!(ix.frames_for(8, 8 + 200_001).is_err());
    }

    #[test]
    fn every_changed_header_byte_is_refused() {
        let f = sample();
        let ix = parse(&f).unwrap();
        let end = ix.data_start as usize;
        for i in 0..end {
            let mut g = f.clone();
            g[i] ^= 0x40;
            assert!(parse(&g).is_err(), "byte {i}");
        }
        assert!(parse(&f[..f.len() - 1]).is_err());
    }
}
