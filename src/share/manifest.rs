//! The manifest an owner sends with its file descriptors: what an importer
//! needs to map the memory and rebuild every tensor, and nothing it has to trust.
//!
//! Layout: the importer maps the chunks back to back in one VA reservation, in
//! the order listed; a tensor's `offset` is into that concatenation. The
//! manifest comes from another process, so [`Manifest::validate`] checks every
//! number (counts, sizes, offsets, overflow) before anything is imported.

use std::collections::HashSet;

use crate::driver::BackendKind;
use crate::loader::dtype::Dtype;

/// The wire format this library speaks. A different number is refused.
pub const FORMAT: u32 = 1;
/// Most chunks one manifest may list.
pub const MAX_CHUNKS: usize = 1 << 16;
/// Most tensors one manifest may list.
pub const MAX_TENSORS: usize = 1 << 20;
/// Longest tensor name, in bytes.
pub const MAX_NAME_BYTES: usize = 4096;
/// Most dimensions of one tensor.
pub const MAX_DIMS: usize = 16;
/// Most bytes one share may span (256 TiB: more than any host's devices hold).
pub const MAX_TOTAL_BYTES: u64 = 1 << 48;
/// Longest manifest accepted on the wire, in bytes.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// `s` as it may be printed: control characters and bidirectional overrides
/// (which reorder what follows them on a terminal) escaped as `\n`,
/// `\u{202e}`. Names in a manifest come from another process; every message
/// that quotes one goes through this.
pub fn printable(s: &str) -> String {
    let hazard = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(hazard) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if hazard(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// One tensor of a share.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SharedTensor {
    /// The name the owner registered (a destination name of its loader).
    pub name: String,
    /// Element type (safetensors name: "BF16", "F32", ...).
    pub dtype: Dtype,
    /// Shape, row-major and contiguous.
    pub shape: Vec<u64>,
    /// Offset of element 0 into the concatenated chunks.
    pub offset: u64,
}

/// What an owner sends first on every connection.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// Wire format ([`FORMAT`]).
    pub format: u32,
    /// The weights' version, the owner's tag version
    /// ([`crate::Pool::tag_version`]): moves when the owner updates or
    /// publishes new weights, or revokes (its memory changes), so an
    /// importer knows which it reads.
    pub version: u64,
    /// The owner's backend; an importer on another backend cannot map the memory.
    pub backend: BackendKind,
    /// The owner's tag name (for messages).
    pub tag: String,
    /// The owner's process id (for messages).
    pub owner_pid: u32,
    /// True when the owner allows importers to map read-write.
    pub writable: bool,
    /// Chunk sizes in bytes, in mapping order; one file descriptor each.
    pub chunks: Vec<u64>,
    /// The tensors.
    pub tensors: Vec<SharedTensor>,
}

/// The first message: a manifest, or the owner's reason for refusing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hello {
    /// Attach: the manifest follows, then one descriptor per chunk.
    Manifest(Manifest),
    /// Refused, with the owner's reason.
    Refused(String),
}

/// A validated manifest's numbers, in the importer's units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Chunk sizes, each a granularity multiple.
    pub chunks: Vec<usize>,
    /// Sum of the chunk sizes: the VA to reserve.
    pub total: usize,
    /// Bytes of each tensor, in manifest order.
    pub tensor_bytes: Vec<usize>,
}

impl Manifest {
    /// Check every field against this process's backend and granularity and
    /// the limits above; the error names the field and the values.
    pub fn validate(
        &self,
        backend: BackendKind,
        granularity: usize,
    ) -> std::result::Result<Layout, String> {
        if self.format != FORMAT {
            return Err(format!(
                "manifest format {} is not the format {FORMAT} this library speaks",
                self.format
            ));
        }
        if self.backend != backend {
            return Err(format!(
                "the owner's memory is on the {} backend, this process uses the {backend} backend",
                self.backend
            ));
        }
        if self.chunks.is_empty() || self.chunks.len() > MAX_CHUNKS {
            return Err(format!(
                "manifest lists {} chunks; expected 1 to {MAX_CHUNKS}",
                self.chunks.len()
            ));
        }
        if self.tensors.len() > MAX_TENSORS {
            return Err(format!(
                "manifest lists {} tensors; at most {MAX_TENSORS} are accepted",
                self.tensors.len()
            ));
        }
        let g = granularity as u64;
        let mut total: u64 = 0;
        let mut chunks = Vec::with_capacity(self.chunks.len());
        for (i, &c) in self.chunks.iter().enumerate() {
            if c == 0 || c % g != 0 {
                return Err(format!(
                    "chunk {i} has {c} bytes; expected a non-zero multiple of the granularity {g}"
                ));
            }
            total = total
                .checked_add(c)
                .filter(|&t| t <= MAX_TOTAL_BYTES)
                .ok_or_else(|| {
                    format!("chunks add up to more than {MAX_TOTAL_BYTES} bytes at chunk {i}")
                })?;
            chunks.push(usize::try_from(c).map_err(|_| format!("chunk {i} size {c} overflows"))?);
        }
        let total_usize =
            usize::try_from(total).map_err(|_| format!("total {total} bytes overflows"))?;
        let mut names = HashSet::with_capacity(self.tensors.len());
        let mut tensor_bytes = Vec::with_capacity(self.tensors.len());
        for (i, t) in self.tensors.iter().enumerate() {
            if t.name.is_empty() || t.name.len() > MAX_NAME_BYTES || t.name.contains('\0') {
                return Err(format!(
                    "tensor {i} has an empty, NUL-containing or over-long name ({} bytes, at most {MAX_NAME_BYTES})",
                    t.name.len()
                ));
            }
            if !names.insert(t.name.as_str()) {
                return Err(format!("tensor `{}` is listed twice", printable(&t.name)));
            }
            if t.shape.len() > MAX_DIMS {
                return Err(format!(
                    "tensor `{}` has {} dimensions; at most {MAX_DIMS}",
                    printable(&t.name),
                    t.shape.len()
                ));
            }
            let bytes = t.dtype.bytes(&t.shape).ok_or_else(|| {
                format!(
                    "tensor `{}`: shape {:?} overflows (or is not whole blocks)",
                    printable(&t.name),
                    t.shape
                )
            })?;
            let end = t.offset.checked_add(bytes).ok_or_else(|| {
                format!(
                    "tensor `{}`: offset {} + {bytes} bytes overflows",
                    printable(&t.name),
                    t.offset
                )
            })?;
            if end > total {
                return Err(format!(
                    "tensor `{}` spans [{}, {end}) but the chunks hold {total} bytes",
                    printable(&t.name),
                    t.offset
                ));
            }
            // Quantized blocks are raw bytes (sizes such as 34): no element alignment.
            if !t.dtype.is_quantized() && t.offset % t.dtype.size() as u64 != 0 {
                return Err(format!(
                    "tensor `{}`: offset {} is not aligned to its element (or block) size {}",
                    printable(&t.name),
                    t.offset,
                    t.dtype.size()
                ));
            }
            tensor_bytes.push(bytes as usize);
        }
        Ok(Layout {
            chunks,
            total: total_usize,
            tensor_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: usize = 2 << 20;

    fn good() -> Manifest {
        Manifest {
            format: FORMAT,
            version: 1,
            backend: BackendKind::Host,
            tag: "weights".into(),
            owner_pid: 1,
            writable: false,
            chunks: vec![G as u64, 2 * G as u64],
            tensors: vec![SharedTensor {
                name: "w".into(),
                dtype: Dtype::Bf16,
                shape: vec![1024, 1024],
                offset: G as u64,
            }],
        }
    }

    fn refused(m: Manifest, needle: &str) {
        let e = m.validate(BackendKind::Host, G).unwrap_err();
        assert!(e.contains(needle), "`{e}` should mention `{needle}`");
    }

    #[test]
    fn a_good_manifest_validates() {
        let l = good().validate(BackendKind::Host, G).unwrap();
        assert_eq!(l.total, 3 * G);
        assert_eq!(l.tensor_bytes, vec![2 << 20]);
    }

    #[test]
    fn names_are_printed_escaped() {
        assert_eq!(printable("model.norm"), "model.norm");
        assert_eq!(
            printable("w\n\u{1b}[31m\u{202e}x\u{2066}"),
            "w\\n\\u{1b}[31m\\u{202e}x\\u{2066}"
        );
        let mut m = good();
        m.tensors.push(m.tensors[0].clone());
        m.tensors[0].name = "a\nb".into();
        m.tensors[1].name = "a\nb".into();
        refused(m, "tensor `a\\nb` is listed twice");
    }

    #[test]
    fn hostile_manifests_are_refused() {
        let mut m = good();
        m.format = 2;
        refused(m, "format 2");
        let mut m = good();
        m.backend = BackendKind::Cuda;
        refused(m, "cuda backend");
        let mut m = good();
        m.chunks.clear();
        refused(m, "0 chunks");
        let mut m = good();
        m.chunks[1] = 4096;
        refused(m, "chunk 1 has 4096 bytes");
        let mut m = good();
        m.chunks = vec![u64::MAX / 2 + 1, u64::MAX / 2 + 1];
        refused(m, "add up to more than");
        let mut m = good();
        m.chunks = vec![(1u64 << 47) + G as u64; 3];
        refused(m, "add up to more than 281474976710656 bytes at chunk 1");
        let mut m = good();
        m.tensors[0].offset = 2 * G as u64 + 1;
        refused(m, "spans");
        let mut m = good();
        m.tensors[0].offset = u64::MAX - 10;
        refused(m, "overflows");
        let mut m = good();
        m.tensors[0].shape = vec![u64::MAX, 4];
        refused(m, "overflows");
        let mut m = good();
        m.tensors[0].shape = vec![1; MAX_DIMS + 1];
        refused(m, "dimensions");
        let mut m = good();
        m.tensors.push(m.tensors[0].clone());
        refused(m, "listed twice");
        let mut m = good();
        m.tensors[0].name.clear();
        refused(m, "name");
        let mut m = good();
        m.tensors[0].offset = G as u64 + 1;
        refused(m, "aligned");
        let mut m = good();
        m.chunks = vec![G as u64; MAX_CHUNKS + 1];
        refused(m, "chunks; expected 1 to");
    }
}
