//! The error a failed read of checkpoint bytes gives: [`Error::Io`] naming the
//! shard file, whose OS error says which bytes were being read and for which
//! tensor. The copy workers know only a tensor's index in the plan
//! ([`Extent::source`](super::plan::Extent::source)); [`name_tensor`] puts the
//! name in once the caller that holds the plan sees the error.

use std::fmt;
use std::path::Path;

use crate::driver::{testing, Driver};
use crate::error::{Error, Result};

/// What was being read when the OS (or an injected fault) refused.
#[derive(Debug)]
struct SourceRead {
    /// Index into the plan's source names.
    source: u32,
    /// The name, once known.
    tensor: Option<String>,
    /// File byte range `[start, end)`.
    start: u64,
    end: u64,
    cause: std::io::Error,
}

impl fmt::Display for SourceRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reading bytes {}..{}", self.start, self.end)?;
        match &self.tensor {
            Some(t) => write!(f, " of tensor `{}`", t.escape_debug())?,
            None => write!(f, " of source tensor #{}", self.source)?,
        }
        write!(f, ": {}", self.cause)
    }
}

impl std::error::Error for SourceRead {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cause)
    }
}

/// An [`Error::Io`] on `path` for a read of `[start, start+len)` for plan
/// source `source` that failed with `cause`.
pub(crate) fn read_failed(
    path: &Path,
    source: u32,
    start: u64,
    len: u64,
    cause: std::io::Error,
) -> Error {
    let kind = cause.kind();
    Error::io(
        path,
        std::io::Error::new(
            kind,
            SourceRead {
                source,
                tensor: None,
                start,
                end: start + len,
                cause,
            },
        ),
    )
}

/// Count one read of checkpoint bytes against `driver`'s fault table; the
/// error [`read_failed`] makes when an injected failure fires.
#[inline]
pub(crate) fn check_read(
    driver: &dyn Driver,
    path: &Path,
    source: u32,
    start: u64,
    len: u64,
) -> Result<()> {
    testing::file_read(driver).map_err(|e| read_failed(path, source, start, len, e))
}

/// What stands for the tensor's name in an error about plan source `n` until
/// [`name_tensor`] knows the name.
const UNNAMED: &str = "source tensor #";

/// An [`Error::Checkpoint`] on `path` about the bytes of plan source
/// `source`: a packed frame that does not decode, a frame missing for a copy.
pub(crate) fn source_invalid(path: &Path, source: u32, reason: String) -> Error {
    Error::checkpoint(path, Some(&format!("{UNNAMED}{source}")), reason)
}

/// Put the tensor's name (from `names`, the plan's sources) into a read error
/// made by [`read_failed`] or [`source_invalid`]; any other error is
/// returned as it is.
pub(crate) fn name_tensor(mut e: Error, names: &[String]) -> Error {
    if let Error::Checkpoint {
        tensor: Some(t), ..
    } = &mut e
    {
        let named = t
            .strip_prefix(UNNAMED)
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| names.get(n));
        if let Some(name) = named {
            *t = name.clone();
        }
    }
    if let Error::Io { source, .. } = &mut e {
        if let Some(r) = source
            .get_mut()
            .and_then(|inner| inner.downcast_mut::<SourceRead>())
        {
            if r.tensor.is_none() {
                r.tensor = names.get(r.source as usize).cloned();
            }
        }
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_file_bytes_and_tensor() {
        let e = read_failed(
            Path::new("/m/a.safetensors"),
            1,
            100,
            20,
            std::io::Error::other("EIO"),
        );
        let unnamed = e.to_string();
        assert!(unnamed.contains("/m/a.safetensors"), "{unnamed}");
        assert!(unnamed.contains("bytes 100..120"), "{unnamed}");
        assert!(unnamed.contains("source tensor #1"), "{unnamed}");
        let named = name_tensor(e, &["x".into(), "layers.0.w".into()]).to_string();
        assert!(named.contains("tensor `layers.0.w`"), "{named}");
        assert!(named.contains("EIO"), "{named}");
        let other = name_tensor(Error::InvalidState("s".into()), &[]);
        assert!(matches!(other, Error::InvalidState(_)));
    }
}
