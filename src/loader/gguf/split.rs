//! Split GGUF files (`name-00001-of-00003.gguf`, as llama.cpp's `gguf-split`
//! and the `gguf` package write them): where the other parts of a split are,
//! and the `split.*` keys each part must carry.

use std::path::{Path, PathBuf};

use super::value::Metadata;

/// `split.no`: this part's index, from 0.
pub const KEY_NO: &str = "split.no";
/// `split.count`: how many parts.
pub const KEY_COUNT: &str = "split.count";
/// `split.tensors.count`: tensors in all parts together.
pub const KEY_TENSORS: &str = "split.tensors.count";

/// Most parts a split may have (the names hold five digits).
pub const MAX_SPLITS: u64 = 99_999;

/// A part's place in its split, from its metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlace {
    /// Index, from 0.
    pub no: u64,
    /// Number of parts.
    pub count: u64,
    /// Tensors in all parts, when the part states it.
    pub tensors: Option<u64>,
}

/// The part's `split.*` keys; None when the file is not part of a split (no
/// `split.count`, or a count of 1 with no other part).
pub fn place(meta: &Metadata) -> std::result::Result<Option<SplitPlace>, String> {
    let int = |key: &str| -> std::result::Result<Option<u64>, String> {
        match meta.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_int()
                .and_then(|i| u64::try_from(i).ok())
                .map(Some)
                .ok_or_else(|| format!("metadata key `{key}` is {v}, not a count")),
        }
    };
    let Some(count) = int(KEY_COUNT)? else {
        return Ok(None);
    };
    let no = int(KEY_NO)?.unwrap_or(0);
    if count == 0 || count > MAX_SPLITS {
        return Err(format!(
            "metadata key `{KEY_COUNT}` is {count}, must be 1..={MAX_SPLITS}"
        ));
    }
    if no >= count {
        return Err(format!(
            "metadata key `{KEY_NO}` is {no}, but `{KEY_COUNT}` is {count}"
        ));
    }
    let tensors = int(KEY_TENSORS)?;
    if count == 1 {
        return Ok(None);
    }
    Ok(Some(SplitPlace { no, count, tensors }))
}

/// The paths of every part of the split `path` belongs to, in order, from
/// the naming rule `{prefix}-{no+1:05}-of-{count:05}.gguf`.
pub fn part_paths(path: &Path, place: SplitPlace) -> std::result::Result<Vec<PathBuf>, String> {
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .ok_or_else(|| "the file name is not UTF-8".to_owned())?;
    let tail = format!("-{:05}-of-{:05}.gguf", place.no + 1, place.count);
    let Some(prefix) = file.strip_suffix(&tail) else {
        return Err(format!(
            "the file is part {} of {} of a split (`{KEY_NO}`, `{KEY_COUNT}`), but its name does not end in `{tail}`, so the other parts cannot be found",
            place.no + 1,
            place.count
        ));
    };
    let dir = path.parent().unwrap_or(Path::new(""));
    Ok((0..place.count)
        .map(|i| dir.join(format!("{prefix}-{:05}-of-{:05}.gguf", i + 1, place.count)))
        .collect())
}
