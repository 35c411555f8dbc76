//! The byte layout of an encoded frame, shared by the encoder, the decoder
//! and the CUDA kernels (`kernels/codec.cu`). All integers are little-endian.
//!
//! ```text
//! frame   = header (32 bytes) | index (8 bytes per block) | block...
//! header  = magic "VMWC" | version u8 (1) | layout u8 (element width 1, 2, 4)
//!         | 0 u16 | block_bytes u32 (65536) | 0 u32 | raw_len u64 | frame_len u64
//! index   = the frame offset of each block's first byte, u64 each; block b
//!           ends where block b+1 starts (the last at frame_len)
//! block   = checksum u64 (of the block's raw bytes) | mode u8 | width u8
//!         | 0 u16 | escapes u32 | body
//! raw     : mode 0, width 0, escapes 0; body = the raw bytes
//! coded   : mode 1, width k in 1..=7; body =
//!           table   (2^k - 1 bytes: the block's most frequent field values,
//!                    most frequent first, ties by smaller value)
//!         | codes   (one k-bit code per element, packed from bit 0 of byte 0,
//!                    ceil(n*k/8) bytes; code 2^k-1 = escape)
//!         | escapes (the field value of each escaped element, in order)
//!         | rest    (the element's other bits, width-1 bytes per element)
//!         | tail    (raw_len's last bytes past whole elements, last block only)
//! ```
//!
//! Block b holds raw bytes `[b*65536, min((b+1)*65536, raw_len))`. The coded
//! field of an element is the 8 bits that hold a float's exponent: see
//! [`Layout::split`].

/// The frame's first four bytes.
pub const MAGIC: [u8; 4] = *b"VMWC";
/// The format version this crate writes and reads.
pub const VERSION: u8 = 1;
/// Raw bytes per block (the last block of a frame may be shorter).
pub const BLOCK_BYTES: usize = 1 << 16;
/// Bytes of the frame header.
pub const FRAME_HEADER_BYTES: usize = 32;
/// Bytes of one block header.
pub const BLOCK_HEADER_BYTES: usize = 16;
/// Block mode: the raw bytes follow the header.
pub const MODE_RAW: u8 = 0;
/// Block mode: table, codes, escapes, rest and tail follow the header.
pub const MODE_CODED: u8 = 1;
/// Widest code, in bits (a table of 127 values).
pub const MAX_WIDTH: u8 = 7;

/// How elements split into a coded field and raw bits: by element width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Layout {
    /// One-byte elements (fp8, int8, int4 pairs, bool, unknown): the whole
    /// byte is coded, nothing is raw.
    Bytes = 1,
    /// Two-byte elements (bf16, fp16, int16): bits 7..=14 are coded (bf16's
    /// exponent; fp16's exponent and top three mantissa bits); the sign and
    /// bits 0..=6 make the raw byte.
    Half = 2,
    /// Four-byte elements (fp32, int32): bits 23..=30 are coded (the
    /// exponent); the sign and the mantissa make three raw bytes.
    Single = 4,
}

impl Layout {
    /// Bytes per element.
    pub fn width(self) -> usize {
        self as usize
    }

    /// The layout of elements `width` bytes wide, if there is one.
    pub fn from_width(width: u8) -> Option<Layout> {
        match width {
            1 => Some(Layout::Bytes),
            2 => Some(Layout::Half),
            4 => Some(Layout::Single),
            _ => None,
        }
    }

    /// The layout for a safetensors dtype name ("BF16", "F32", ...); any
    /// dtype not listed is coded byte by byte.
    pub fn for_dtype(dtype: &str) -> Layout {
        match dtype.to_ascii_uppercase().as_str() {
            "BF16" | "F16" | "I16" | "U16" => Layout::Half,
            "F32" | "I32" | "U32" => Layout::Single,
            _ => Layout::Bytes,
        }
    }

    fn shift(self) -> u32 {
        match self {
            Layout::Bytes => 0,
            Layout::Half => 7,
            Layout::Single => 23,
        }
    }

    /// Split element `v` (its little-endian value) into its coded field and
    /// its other bits, packed downwards into `8 * (width - 1)` bits.
    #[inline]
    pub fn split(self, v: u32) -> (u8, u32) {
        let s = self.shift();
        let field = ((v >> s) & 0xFF) as u8;
        let rest = if self == Layout::Bytes {
            0
        } else {
            ((v >> (s + 8)) << s) | (v & ((1 << s) - 1))
        };
        (field, rest)
    }

    /// The element [`Layout::split`] made `(field, rest)` of.
    #[inline]
    pub fn join(self, field: u8, rest: u32) -> u32 {
        let s = self.shift();
        if self == Layout::Bytes {
            return field as u32;
        }
        ((rest >> s) << (s + 8)) | ((field as u32) << s) | (rest & ((1 << s) - 1))
    }
}

/// Blocks of a frame of `raw_len` bytes.
pub fn block_count(raw_len: usize) -> usize {
    raw_len.div_ceil(BLOCK_BYTES)
}

/// The frame offset where block data starts.
pub fn data_start(blocks: usize) -> usize {
    FRAME_HEADER_BYTES + 8 * blocks
}

/// The most bytes a frame of `raw_len` raw bytes can take (every block raw).
pub fn max_frame_bytes(raw_len: usize) -> usize {
    let n = block_count(raw_len);
    data_start(n) + n * BLOCK_HEADER_BYTES + raw_len
}

/// Raw bytes of block `b` in a frame of `raw_len` bytes.
pub fn block_raw_len(raw_len: usize, b: usize) -> usize {
    BLOCK_BYTES.min(raw_len - b * BLOCK_BYTES)
}

/// Bytes of a coded block's body parts for `n` elements, code width `k`,
/// `escapes` escapes and `tail` tail bytes, with the header.
pub fn coded_block_bytes(layout: Layout, n: usize, k: u8, escapes: usize, tail: usize) -> usize {
    BLOCK_HEADER_BYTES
        + table_len(k)
        + (n * k as usize).div_ceil(8)
        + escapes
        + n * (layout.width() - 1)
        + tail
}

/// Table entries for code width `k`: every code but the escape.
pub fn table_len(k: u8) -> usize {
    (1usize << k) - 1
}

/// Bytes of one block's slot in the GPU encoder's scratch: room for the
/// block stored raw.
pub const SLOT_BYTES: usize = BLOCK_HEADER_BYTES + BLOCK_BYTES;

/// Device scratch the GPU encoder needs for a frame of `raw_len` bytes: one
/// slot per block, each block's size (u32), and the frame length (u64).
pub fn encode_scratch_bytes(raw_len: usize) -> usize {
    let n = block_count(raw_len);
    n * SLOT_BYTES + (4 * n).next_multiple_of(8) + 8
}

/// The fields of a frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// How elements split.
    pub layout: Layout,
    /// Raw bytes the frame decodes to.
    pub raw_len: u64,
    /// Bytes of the whole frame.
    pub frame_len: u64,
}

impl FrameHeader {
    /// The header's 32 bytes.
    pub fn to_bytes(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut h = [0u8; FRAME_HEADER_BYTES];
        h[0..4].copy_from_slice(&MAGIC);
        h[4] = VERSION;
        h[5] = self.layout as u8;
        h[8..12].copy_from_slice(&(BLOCK_BYTES as u32).to_le_bytes());
        h[16..24].copy_from_slice(&self.raw_len.to_le_bytes());
        h[24..32].copy_from_slice(&self.frame_len.to_le_bytes());
        h
    }

    /// Parse and check a header: magic, version, layout, block size and the
    /// zero fields. The lengths are checked against the frame by the decoder.
    pub fn parse(b: &[u8]) -> std::result::Result<FrameHeader, String> {
        if b.len() < FRAME_HEADER_BYTES {
            return Err(format!(
                "frame of {} bytes is shorter than its {FRAME_HEADER_BYTES}-byte header",
                b.len()
            ));
        }
        if b[0..4] != MAGIC {
            return Err(format!("magic {:02x?} is not {:02x?}", &b[0..4], MAGIC));
        }
        if b[4] != VERSION {
            return Err(format!("version {} (this build reads {VERSION})", b[4]));
        }
        let layout = Layout::from_width(b[5])
            .ok_or_else(|| format!("element width {} is not 1, 2 or 4", b[5]))?;
        let block = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if block as usize != BLOCK_BYTES {
            return Err(format!(
                "block size {block} (this build uses {BLOCK_BYTES})"
            ));
        }
        if b[6..8] != [0, 0] || b[12..16] != [0; 4] {
            return Err("reserved header bytes are not zero".into());
        }
        Ok(FrameHeader {
            layout,
            raw_len: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            frame_len: u64::from_le_bytes(b[24..32].try_into().expect("8 bytes")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_join_are_inverse_on_every_value() {
        for v in 0..=0xFFFFu32 {
            let (f, r) = Layout::Half.split(v);
            assert!(r < 256);
            assert_eq!(Layout::Half.join(f, r), v);
        }
        for v in 0..=0xFFu32 {
            assert_eq!(Layout::Bytes.join(Layout::Bytes.split(v).0, 0), v);
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let (f, r) = Layout::Single.split(x);
            assert!(r < 1 << 24);
            assert_eq!(Layout::Single.join(f, r), x);
        }
    }

    #[test]
    fn bf16_field_is_the_exponent() {
        // 1.0 = 0x3F80: exponent 127, sign 0, mantissa 0.
        assert_eq!(Layout::Half.split(0x3F80), (127, 0));
        // -1.5 = 0xBFC0: exponent 127, sign in bit 7 of the rest, mantissa 0x40.
        assert_eq!(Layout::Half.split(0xBFC0), (127, 0xC0));
        // 1.0f32 = 0x3F80_0000.
        assert_eq!(Layout::Single.split(0x3F80_0000), (127, 0));
    }

    #[test]
    fn header_round_trips_and_refuses_bad_fields() {
        let h = FrameHeader {
            layout: Layout::Half,
            raw_len: 123_456,
            frame_len: 99_999,
        };
        let b = h.to_bytes();
        assert_eq!(FrameHeader::parse(&b), Ok(h));
        for (i, v) in [(0, b'X'), (4, 2), (5, 3), (6, 1), (9, 1), (12, 1)] {
            let mut c = b;
            c[i] = v;
            assert!(FrameHeader::parse(&c).is_err(), "byte {i} = {v}");
        }
        assert!(FrameHeader::parse(&b[..31]).is_err());
    }
}
