//! GGUF checkpoints: the format of llama.cpp and ggml-based runtimes,
//! versions 2 and 3 (github ggml-org/ggml `docs/gguf.md`), one file or a
//! split (`name-00001-of-0000N.gguf`) opened as one checkpoint.
//!
//! [`Checkpoint::open`](super::Checkpoint::open) picks this format by the
//! file's first four bytes ("GGUF"), never by its name. Tensors keep their
//! ggml type: plain types (F32, F16, BF16, I8..I64, F64) become the matching
//! [`Dtype`], block-quantized ones [`Dtype::Ggml`],
//! and every tensor is copied as the file's raw bytes.
//!
//! Shapes: GGUF lists dimensions fastest first (`ne[0]` is the row length).
//! The loader's [`TensorInfo::shape`] is row-major
//! like safetensors', so it is `ne` reversed: a weight of `ne = [4096,
//! 11008]` has shape `[11008, 4096]`, dim 0 is its rows and a row slice
//! (tensor parallelism along dim 0) cuts whole rows, hence whole blocks.
//! [`TensorInfo::ggml_ne`] gives the file's order back.

mod header;
mod split;
mod value;

use std::collections::BTreeMap;
use std::path::Path;

pub use super::ggml_type::GgmlType;
pub use header::{
    parse as parse_header, Header, HeaderError, RawTensor, DEFAULT_ALIGNMENT, MAGIC, MAX_DEPTH,
    MAX_DIMS, MAX_HEADER, MAX_KEY, MAX_NAME, MAX_STRING,
};
pub use split::{SplitPlace, KEY_COUNT, KEY_NO, KEY_TENSORS, MAX_SPLITS};
pub use value::{Array, Metadata, Value, ValueRef, ValueType};

use super::dtype::Dtype;
use super::packed;
use super::shard::{map_shard, open_regular, Shard};
use super::tensor::TensorInfo;
use crate::error::{Error, Result};

/// What a GGUF checkpoint's files say besides their tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufInfo {
    /// One entry per file, in split order (one for an unsplit file).
    pub files: Vec<GgufFile>,
}

/// One GGUF file's version, alignment and metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufFile {
    /// Format version (2 or 3).
    pub version: u32,
    /// `general.alignment`, or 32.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    /// The file's metadata.
    pub metadata: Metadata,
}

impl GgufInfo {
    /// The checkpoint's metadata: the first file's (the parts of a split
    /// after the first carry only their `split.*` keys).
    pub fn metadata(&self) -> &Metadata {
        &self.files[0].metadata
    }
}

/// True when `path`'s first four bytes are GGUF's magic, or it is a packed
/// file whose preamble says it holds a GGUF file.
pub fn sniff(path: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    let mut head = [0u8; 20];
    let Some((f, _)) = open_regular(path).ok() else {
        return false;
    };
    if f.read_exact_at(&mut head[..4], 0).is_err() {
        return false;
    }
    if head[..4] == MAGIC {
        return true;
    }
    f.read_exact_at(&mut head, 0).is_ok()
        && packed::format::is_packed(&head)
        && u32::from_le_bytes(head[16..20].try_into().expect("4 bytes"))
            == packed::SourceKind::Gguf as u32
}

/// Open the GGUF file `path` and, when it is part of a split, every other part.
pub fn open(path: &Path) -> Result<(Vec<Shard>, BTreeMap<String, TensorInfo>, GgufInfo)> {
    let (shard, header) = open_file(path)?;
    let place = split::place(&header.metadata).map_err(|r| Error::checkpoint(path, None, r))?;
    let Some(place) = place else {
        let mut tensors = BTreeMap::new();
        add_tensors(&mut tensors, &header, 0, path)?;
        let info = GgufInfo {
            files: vec![file_info(header)],
        };
        return Ok((vec![shard], tensors, info));
    };
    let paths = split::part_paths(path, place).map_err(|r| Error::checkpoint(path, None, r))?;
    for p in &paths {
        if !p.exists() {
            return Err(Error::checkpoint(
                path,
                None,
                format!("a part of the split is missing: {}", p.display()),
            ));
        }
    }
    let mut shards = Vec::with_capacity(paths.len());
    let mut tensors = BTreeMap::new();
    let mut files = Vec::with_capacity(paths.len());
    let mut first = Some((shard, header));
    for (i, p) in paths.iter().enumerate() {
        let (shard, header) = match first.take_if(|_| i as u64 == place.no) {
            Some(sh) => sh,
            None => open_file(p)?,
        };
        let mine = split::place(&header.metadata).map_err(|r| Error::checkpoint(p, None, r))?;
        if mine.map(|m| (m.no, m.count)) != Some((i as u64, place.count)) {
            return Err(Error::checkpoint(
                p,
                None,
                format!(
                    "is named part {} of {} but its `{KEY_NO}`/`{KEY_COUNT}` say {}",
                    i + 1,
                    place.count,
                    mine.map_or("it is not part of a split".to_owned(), |m| format!(
                        "part {} of {}",
                        m.no + 1,
                        m.count
                    ))
                ),
            ));
        }
        add_tensors(&mut tensors, &header, i, p)?;
        files.push(file_info(header));
        shards.push(shard);
    }
    // The stated total, where the parts state one.
    let first_place = split::place(&files[0].metadata).ok().flatten();
    if let Some(total) = first_place.and_then(|p| p.tensors) {
        if total != tensors.len() as u64 {
            return Err(Error::checkpoint(
                &paths[0],
                None,
                format!(
                    "`{KEY_TENSORS}` is {total}, but the {} parts hold {} tensors",
                    place.count,
                    tensors.len()
                ),
            ));
        }
    }
    Ok((shards, tensors, GgufInfo { files }))
}

fn file_info(h: Header) -> GgufFile {
    GgufFile {
        version: h.version,
        alignment: h.alignment,
        data_start: h.data_start,
        metadata: h.metadata,
    }
}

fn add_tensors(
    out: &mut BTreeMap<String, TensorInfo>,
    header: &Header,
    shard: usize,
    path: &Path,
) -> Result<()> {
    for t in &header.tensors {
        if out.contains_key(&t.name) {
            return Err(Error::checkpoint(
                path,
                Some(&t.name),
                "tensor is also in an earlier part of the split",
            ));
        }
        out.insert(
            t.name.clone(),
            TensorInfo {
                name: t.name.clone(),
                shard,
                dtype: Dtype::from_ggml(t.ty),
                shape: t.ne.iter().rev().map(|&d| d as usize).collect(),
                offset: t.offset,
                len: t.len,
            },
        );
    }
    Ok(())
}

/// Open, map and validate one GGUF file, or a packed one through its kept
/// header.
fn open_file(path: &Path) -> Result<(Shard, Header)> {
    let mut shard = map_shard(path)?;
    let bytes: &[u8] = shard.map.as_deref().unwrap_or(&[]);
    if !packed::format::is_packed(bytes) {
        let header = parse_header(bytes)
            .map_err(|e| Error::checkpoint(path, e.tensor.as_deref(), e.reason))?;
        return Ok((shard, header));
    }
    let ix =
        packed::read_index(&shard.file, shard.len).map_err(|r| Error::checkpoint(path, None, r))?;
    if ix.kind != packed::SourceKind::Gguf {
        return Err(Error::checkpoint(
            path,
            None,
            "is a packed safetensors file, named where a GGUF file is expected",
        ));
    }
    let header = header::parse_prefix(&ix.prefix, ix.orig_len)
        .map_err(|e| Error::checkpoint(path, e.tensor.as_deref(), e.reason))?;
    let kept = header.data_start.min(ix.orig_len);
    if kept != ix.prefix.len() as u64 {
        return Err(Error::checkpoint(
            path,
            None,
            format!(
                "the kept header holds {} bytes, the GGUF header it holds ends (aligned) at {kept}",
                ix.prefix.len()
            ),
        ));
    }
    packed::check_tensors(
        &ix,
        header
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.offset, t.len)),
    )
    .map_err(|(t, r)| Error::checkpoint(path, Some(&t), r))?;
    shard.packed = Some(std::sync::Arc::new(ix));
    Ok((shard, header))
}
