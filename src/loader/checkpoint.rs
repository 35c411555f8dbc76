//! Opening a checkpoint: one `.safetensors` file, a folder with
//! `model.safetensors.index.json` and its shards, or a GGUF file (picked by
//! its magic bytes, see [`super::gguf`]). Headers are read and
//! validated without reading tensor data; the files are memory-mapped so the
//! copy engine can read (or register) their pages later.
//!
//! Validation, in order, each failure naming the file and, where known, the tensor:
//! the file is a regular file (after following symlinks; opened non-blocking,
//! so a FIFO or device cannot hang the open), header length vs file size and
//! the header cap, header JSON (no duplicate names, bounded nesting), each
//! entry's dtype (known), shape (at most [`MAX_DIMS`] dims, byte size fits in
//! u64), offsets (ordered, in range, size = elements x dtype size), no two
//! tensors overlapping, and finally the safetensors crate's own checks on the
//! mapping. Index files are capped at [`MAX_INDEX`] bytes. Names are printed
//! escaped (`escape_debug`), so control characters cannot forge messages.
//!
//! A shard whose device, inode, size or modification time changed after it
//! was opened is refused by [`Checkpoint::check_unchanged`], which the loader calls before
//! any byte is written and again after the copies. A shard truncated by
//! another process *while* a copy reads it through the mapping raises SIGBUS
//! (the kernel's rule for mappings past a file's end); the loader cannot
//! turn that into an error without giving up the mapping.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use super::dtype::Dtype;
use super::gguf::{self, GgufInfo, Metadata};
use super::not_checkpoint;
use super::packed;
use super::shard::{map_file, open_regular};
pub use super::shard::{FileIdentity, Shard};
pub use super::tensor::TensorInfo;
use crate::error::{Error, Result};

/// The index file name Hugging Face uses for sharded checkpoints.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Largest header accepted (the safetensors crate's limit).
pub const MAX_HEADER: u64 = 100_000_000;

/// Largest index file accepted (real ones are well under 1 MB).
pub const MAX_INDEX: u64 = 64 << 20;

/// The dtype names a safetensors header may use, for error messages.
const SAFETENSORS_NAMES: &str =
    "BOOL, U8, I8, F8_E4M3, F8_E5M2, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64";

/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 64;

/// Which format a checkpoint's files are in, with what the format adds.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Format {
    /// safetensors: one file or an indexed folder.
    #[default]
    Safetensors,
    /// GGUF: one file or a split, with its metadata.
    Gguf(GgufInfo),
}

/// An opened, validated checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    /// The file or folder that was opened.
    pub root: PathBuf,
    /// Shard files, in index order (one entry for a single file).
    pub shards: Vec<Shard>,
    /// Every tensor by name.
    pub tensors: BTreeMap<String, TensorInfo>,
    /// The files' format, and a GGUF checkpoint's metadata.
    pub format: Format,
}

#[derive(serde::Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

#[derive(serde::Deserialize)]
struct RawIndex {
    weight_map: UniqueMap<String>,
}

struct Index {
    weight_map: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Open `path`: a `.safetensors` file, or a folder holding
    /// `model.safetensors.index.json` (or a single `model.safetensors`).
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let root = path.as_ref().to_path_buf();
        let meta = std::fs::metadata(&root).map_err(|e| Error::io(&root, e))?;
        if !meta.is_dir() {
            if gguf::sniff(&root) {
                let (shards, tensors, info) = gguf::open(&root)?;
                return Ok(Checkpoint {
                    root,
                    shards,
                    tensors,
                    format: Format::Gguf(info),
                });
            }
            let (shard, tensors) = open_shard(&root, 0)?;
            return Ok(Checkpoint {
                root,
                shards: vec![shard],
                tensors: tensors.into_iter().map(|t| (t.name.clone(), t)).collect(),
                format: Format::Safetensors,
            });
        }
        let index_path = root.join(INDEX_FILE);
        if !index_path.exists() {
            let single = root.join("model.safetensors");
            if single.exists() {
                let (shard, tensors) = open_shard(&single, 0)?;
                return Ok(Checkpoint {
                    root,
                    shards: vec![shard],
                    tensors: tensors.into_iter().map(|t| (t.name.clone(), t)).collect(),
                    format: Format::Safetensors,
                });
            }
            return Err(Error::checkpoint(
                &root,
                None,
                not_checkpoint::describe_folder(&root, INDEX_FILE),
            ));
        }
        Self::open_index(root, &index_path)
    }

    fn open_index(root: PathBuf, index_path: &Path) -> Result<Checkpoint> {
        let text = read_index(index_path)?;
        let raw: RawIndex = serde_json::from_str(&text).map_err(|e| {
            Error::checkpoint(index_path, None, format!("index JSON is invalid: {e}"))
        })?;
        let index = Index {
            weight_map: raw.weight_map.0.into_iter().collect(),
        };
        // Shard file names in order of first appearance (sorted names give a stable order).
        let mut names: Vec<&str> = index.weight_map.values().map(String::as_str).collect();
        names.sort_unstable();
        names.dedup();
        let mut shards = Vec::with_capacity(names.len());
        let mut tensors = BTreeMap::new();
        let mut shard_of: HashMap<&str, usize> = HashMap::new();
        // Every name must resolve before any shard is read.
        let paths = names
            .iter()
            .map(|n| resolve_inside(&root, index_path, n))
            .collect::<Result<Vec<_>>>()?;
        for (i, (name, path)) in names.iter().zip(paths).enumerate() {
            let (shard, list) = open_shard(&path, i)?;
            for t in list {
                match index.weight_map.get(&t.name) {
                    Some(n) if n == name => {}
                    Some(n) => {
                        return Err(Error::checkpoint(
                            &path,
                            Some(&t.name),
                            format!(
                                "tensor is in this shard but the index places it in `{}`",
                                n.escape_debug()
                            ),
                        ))
                    }
                    None => {
                        return Err(Error::checkpoint(
                            &path,
                            Some(&t.name),
                            format!("tensor is in this shard but missing from {INDEX_FILE}"),
                        ))
                    }
                }
                tensors.insert(t.name.clone(), t);
            }
            shard_of.insert(name, i);
            shards.push(shard);
        }
        for (tensor, file) in &index.weight_map {
            if !tensors.contains_key(tensor) {
                return Err(Error::checkpoint(
                    &shards[shard_of[file.as_str()]].path,
                    Some(tensor),
                    format!("{INDEX_FILE} places the tensor in this shard, but the shard does not hold it"),
                ));
            }
        }
        Ok(Checkpoint {
            root,
            shards,
            tensors,
            format: Format::Safetensors,
        })
    }

    /// The metadata of the checkpoint at `path`: a GGUF checkpoint's (its
    /// first file's), empty for safetensors. Opens and validates the whole
    /// checkpoint.
    pub fn read_metadata(path: impl AsRef<Path>) -> Result<Metadata> {
        let c = Checkpoint::open(path)?;
        Ok(c.gguf().map(|g| g.metadata().clone()).unwrap_or_default())
    }

    /// A GGUF checkpoint's metadata (None for safetensors).
    pub fn gguf(&self) -> Option<&GgufInfo> {
        match &self.format {
            Format::Gguf(g) => Some(g),
            Format::Safetensors => None,
        }
    }

    /// Total bytes of tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.tensors.values().map(|t| t.len).sum()
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// A tensor's bytes read with `pread`, a packed file's decoded on the
    /// host (their checksums checked).
    pub fn read_tensor(&self, name: &str) -> Result<Vec<u8>> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::checkpoint(&self.root, Some(name), "no tensor of that name"))?;
        let mut out = vec![0u8; t.len as usize];
        self.shards[t.shard]
            .read_original(t.offset, &mut out)
            .map_err(|e| match e {
                Error::Checkpoint { file, reason, .. } => Error::Checkpoint {
                    file,
                    tensor: Some(name.to_owned()),
                    reason,
                },
                e => e,
            })?;
        Ok(out)
    }

    /// Bytes a tensor takes in its packed file (its frames), or None when
    /// its file is not packed. An empty tensor takes none.
    pub fn packed_len(&self, t: &TensorInfo) -> Option<u64> {
        let ix = self.shards.get(t.shard)?.packed.as_ref()?;
        if t.len == 0 {
            return Some(0);
        }
        let frames = ix.frames_for(t.offset, t.offset + t.len).ok()?;
        Some(frames.iter().map(|f| f.entry.len).sum())
    }

    /// True when any of the files is packed (docs/PACKED.md).
    pub fn is_packed(&self) -> bool {
        self.shards.iter().any(|s| s.packed.is_some())
    }

    /// [`Shard::check_unchanged`] for every shard.
    pub fn check_unchanged(&self) -> Result<()> {
        self.shards.iter().try_for_each(Shard::check_unchanged)
    }

    /// The bytes of a tensor, read through the mapping (for tests and tools);
    /// None for a tensor of a packed file, whose bytes are encoded (read
    /// them with [`Checkpoint::read_tensor`]).
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        let t = self.tensors.get(name)?;
        if self.shards[t.shard].packed.is_some() {
            return None;
        }
        let m = self.shards[t.shard].map.as_ref()?;
        m.get(t.offset as usize..(t.offset + t.len) as usize)
    }
}

/// Resolve a shard name from the index inside `root`: relative, no `..`, no
/// root or prefix components. The final file may itself be a symlink (the
/// Hugging Face cache layout), which is followed as usual when opened.
fn resolve_inside(root: &Path, index_path: &Path, name: &str) -> Result<PathBuf> {
    let p = Path::new(name);
    let ok = !name.is_empty()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !ok {
        return Err(Error::checkpoint(
            index_path,
            None,
            format!("shard name `{}` must be a relative path inside the checkpoint folder (no `..`, no absolute path)", name.escape_debug()),
        ));
    }
    let path = root.join(p);
    if !path.exists() {
        return Err(Error::checkpoint(
            index_path,
            None,
            format!(
                "shard `{}` named by the index does not exist ({})",
                name.escape_debug(),
                path.display()
            ),
        ));
    }
    Ok(path)
}

fn bad(path: &Path, tensor: Option<&str>, reason: String) -> Error {
    Error::checkpoint(path, tensor, reason)
}

/// Read an index file: a regular file of at most [`MAX_INDEX`] bytes.
fn read_index(path: &Path) -> Result<String> {
    use std::io::Read;
    let (file, meta) = open_regular(path)?;
    if meta.len() > MAX_INDEX {
        return Err(bad(
            path,
            None,
            format!(
                "index file is {} bytes, over the {MAX_INDEX}-byte limit",
                meta.len()
            ),
        ));
    }
    let mut text = String::new();
    // `take` bounds the read even if the file grows after the size check.
    file.take(MAX_INDEX + 1)
        .read_to_string(&mut text)
        .map_err(|e| Error::io(path, e))?;
    if text.len() as u64 > MAX_INDEX {
        return Err(bad(
            path,
            None,
            format!("index file grew over the {MAX_INDEX}-byte limit while read"),
        ));
    }
    Ok(text)
}

/// A JSON object's entries in file order, refusing a name that appears twice
/// (serde_json would silently keep the last one).
struct UniqueMap<V>(Vec<(String, V)>);

impl<'de, V: serde::Deserialize<'de>> serde::Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit<V>(std::marker::PhantomData<V>);
        impl<'de, V: serde::Deserialize<'de>> serde::de::Visitor<'de> for Visit<V> {
            type Value = UniqueMap<V>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object keyed by tensor name")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<UniqueMap<V>, A::Error> {
                let mut seen = std::collections::HashSet::new();
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, V>()? {
                    if !seen.insert(k.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "tensor name `{}` appears twice",
                            k.escape_debug()
                        )));
                    }
                    out.push((k, v));
                }
                Ok(UniqueMap(out))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// Open, map and validate one shard; returns its tensors sorted by offset. A
/// packed file (its magic) is read through its kept header.
fn open_shard(path: &Path, index: usize) -> Result<(Shard, Vec<TensorInfo>)> {
    let (file, _) = open_regular(path)?;
    let identity = FileIdentity::of(&file).map_err(|e| Error::io(path, e))?;
    let len = identity.len;
    let mut magic = [0u8; 8];
    if len >= 8 {
        read_exact_at(&file, &mut magic, 0).map_err(|e| Error::io(path, e))?;
    }
    if packed::format::is_packed(&magic) {
        return open_packed_shard(path, index, file, identity);
    }
    let tensors = parse_header(path, index, len, &|buf, off| read_exact_at(&file, buf, off))
        .map_err(|e| {
            // A file that is not safetensors at all (a ZIP, a pickle, text) is
            // named for what it is, not for the length its first bytes make.
            match not_checkpoint::describe_file(path) {
                Some(what) => bad(path, None, format!("not a safetensors file: {what}")),
                None => e,
            }
        })?;
    let map = map_file(path, &file, len)?;
    if let Some(m) = &map {
        safetensors::SafeTensors::read_metadata(m).map_err(|e| {
            bad(
                path,
                None,
                format!("rejected by the safetensors format checks: {e:?}"),
            )
        })?;
    }
    Ok((
        Shard {
            path: path.to_path_buf(),
            file,
            map,
            len,
            identity,
            packed: None,
        },
        tensors,
    ))
}

/// A packed safetensors shard: the index checked, the kept header parsed as
/// the original file's (`orig_len` bytes), the tensors tiling the data
/// section as the safetensors crate requires of a plain file, and each
/// tensor one piece.
fn open_packed_shard(
    path: &Path,
    index: usize,
    file: File,
    identity: FileIdentity,
) -> Result<(Shard, Vec<TensorInfo>)> {
    let ix = packed::read_index(&file, identity.len).map_err(|r| bad(path, None, r))?;
    if ix.kind != packed::SourceKind::Safetensors {
        return Err(bad(
            path,
            None,
            "is a packed GGUF file, named where a safetensors shard is expected".into(),
        ));
    }
    let prefix = &ix.prefix;
    let tensors = parse_header(path, index, ix.orig_len, &|buf, off| {
        let lo = off as usize;
        match prefix.get(lo..lo + buf.len()) {
            Some(b) => {
                buf.copy_from_slice(b);
                Ok(())
            }
            None => Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the packed file's kept header is shorter than the header it states",
            )),
        }
    })?;
    let data_start = 8 + u64::from_le_bytes(prefix[..8].try_into().expect("8 bytes"));
    if data_start != prefix.len() as u64 {
        return Err(bad(
            path,
            None,
            format!(
                "the kept header holds {} bytes, the safetensors header it holds ends at {data_start}",
                prefix.len()
            ),
        ));
    }
    let mut end = data_start;
    for t in &tensors {
        if t.offset != end {
            return Err(bad(
                path,
                Some(&t.name),
                format!(
                    "data starts at byte {} of the original file, expected {end}: safetensors data has no gaps",
                    t.offset
                ),
            ));
        }
        end += t.len;
    }
    if end != ix.orig_len {
        return Err(bad(
            path,
            None,
            format!(
                "the tensors end at byte {end} of the original file, which had {} bytes",
                ix.orig_len
            ),
        ));
    }
    packed::check_tensors(
        &ix,
        tensors.iter().map(|t| (t.name.as_str(), t.offset, t.len)),
    )
    .map_err(|(t, r)| bad(path, Some(&t), r))?;
    let map = map_file(path, &file, identity.len)?;
    Ok((
        Shard {
            path: path.to_path_buf(),
            file,
            map,
            len: identity.len,
            identity,
            packed: Some(std::sync::Arc::new(ix)),
        },
        tensors,
    ))
}

/// Parse and check a safetensors header of a file of `len` bytes, read
/// through `read(buf, offset)`; returns its tensors sorted by offset.
fn parse_header(
    path: &Path,
    index: usize,
    len: u64,
    read: &dyn Fn(&mut [u8], u64) -> std::io::Result<()>,
) -> Result<Vec<TensorInfo>> {
    if len < 8 {
        return Err(bad(
            path,
            None,
            format!("file is {len} bytes, too short for the 8-byte header length"),
        ));
    }
    let mut lenbuf = [0u8; 8];
    read(&mut lenbuf, 0).map_err(|e| Error::io(path, e))?;
    let n = u64::from_le_bytes(lenbuf);
    if n > MAX_HEADER || n > len - 8 {
        return Err(bad(
            path,
            None,
            format!(
                "header length {n} runs past the end of the file ({len} bytes) or over the {MAX_HEADER}-byte limit"
            ),
        ));
    }
    let mut header = vec![0u8; n as usize];
    read(&mut header, 8).map_err(|e| Error::io(path, e))?;
    let text = std::str::from_utf8(&header)
        .map_err(|e| bad(path, None, format!("header is not UTF-8: {e}")))?;
    let UniqueMap::<serde_json::Value>(raw) = serde_json::from_str(text)
        .map_err(|e| bad(path, None, format!("header JSON is invalid: {e}")))?;
    let data_start = 8 + n;
    let data_len = len - data_start;
    let mut tensors = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        if name == "__metadata__" {
            continue;
        }
        let e: Entry = serde_json::from_value(value)
            .map_err(|e| bad(path, Some(&name), format!("header entry is malformed: {e}")))?;
        // ggml's quantized types exist only in GGUF files.
        let dtype = Dtype::parse(&e.dtype)
            .filter(|d| !d.is_quantized())
            .ok_or_else(|| {
                bad(
                    path,
                    Some(&name),
                    format!(
                        "unknown dtype `{}` (known: {})",
                        e.dtype.escape_debug(),
                        SAFETENSORS_NAMES
                    ),
                )
            })?;
        if e.shape.len() > MAX_DIMS {
            return Err(bad(
                path,
                Some(&name),
                format!(
                    "shape has {} dimensions, over the limit of {MAX_DIMS}",
                    e.shape.len()
                ),
            ));
        }
        let [begin, end] = e.data_offsets;
        if begin > end || end > data_len {
            return Err(bad(
                path,
                Some(&name),
                format!(
                    "data offsets [{begin}, {end}) are out of range: the data section holds {data_len} bytes (file {len} bytes; truncated?)"
                ),
            ));
        }
        let numel = e
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size() as u64));
        if numel != Some(end - begin) {
            return Err(bad(
                path,
                Some(&name),
                format!(
                    "shape {:?} of {dtype} needs {} bytes but data offsets [{begin}, {end}) hold {}",
                    e.shape,
                    numel.map_or("too many".to_owned(), |v| v.to_string()),
                    end - begin
                ),
            ));
        }
        tensors.push(TensorInfo {
            name,
            shard: index,
            dtype,
            shape: e.shape.iter().map(|&d| d as usize).collect(),
            offset: data_start + begin,
            len: end - begin,
        });
    }
    tensors.sort_by_key(|t| (t.offset, t.len));
    for w in tensors.windows(2) {
        if w[1].offset < w[0].offset + w[0].len {
            return Err(bad(
                path,
                Some(&w[1].name),
                format!(
                    "data overlaps tensor `{}` (bytes {}..{} and {}..{} of the file)",
                    w[0].name.escape_debug(),
                    w[0].offset,
                    w[0].offset + w[0].len,
                    w[1].offset,
                    w[1].offset + w[1].len
                ),
            ));
        }
    }
    Ok(tensors)
}

fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, offset)
}
