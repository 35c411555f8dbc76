//! The files of a checkpoint, whatever their format: opened only as regular
//! files, identified (device, inode, size, modification time) and mapped
//! read-only, so the copy engine can read or register their pages.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::packed;
use crate::error::{Error, Result};

/// What identifies a file's contents without reading them: device, inode,
/// size and modification time, recorded when a shard is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    /// Device of the file system.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub len: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl FileIdentity {
    /// The identity of an open file, from `fstat`.
    pub fn of(file: &File) -> std::io::Result<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        })
    }
}

/// One open, mapped shard file.
#[derive(Debug)]
pub struct Shard {
    /// The path as resolved inside the checkpoint (symlinks not followed in the name).
    pub path: PathBuf,
    /// The open file (used for positional reads when the data is not page-cached).
    pub file: File,
    /// A read-only mapping of the whole file (None for an empty file).
    pub map: Option<Mmap>,
    /// File size in bytes.
    pub len: u64,
    /// Identity, size and modification time when opened.
    pub identity: FileIdentity,
    /// A packed file's checked index (docs/PACKED.md), or None for a file
    /// read as it is. Tensors of a packed shard keep their offsets in the
    /// original file; the copy engine decodes the frames that hold them.
    pub packed: Option<Arc<packed::Index>>,
}

impl Shard {
    /// Check, without reading data, that the open file is still what was
    /// opened: same device, inode, size and modification time. A file
    /// truncated or rewritten in place since fails with
    /// `Error::Checkpoint` naming it; nothing is read. (A file replaced by
    /// rename is not a change here: this shard keeps the old file open and
    /// mapped, whose bytes are still those that were loaded.)
    pub fn check_unchanged(&self) -> Result<()> {
        let now = FileIdentity::of(&self.file).map_err(|e| Error::io(&self.path, e))?;
        if now == self.identity {
            return Ok(());
        }
        let was = self.identity;
        Err(Error::checkpoint(
            &self.path,
            None,
            format!(
                "the file changed since it was opened for loading (size {} -> {} bytes, mtime {} -> {} ns, inode {} -> {}): its bytes may no longer be those loaded, so nothing is read from it; load the new file again (a tag asleep with Reload stays asleep: forget its reload sources, wake it, then load)",
                was.len, now.len, was.mtime_ns, now.mtime_ns, was.ino, now.ino
            ),
        ))
    }

    /// Bytes of the original file: the file's own length, or a packed
    /// file's original length.
    pub fn original_len(&self) -> u64 {
        self.packed.as_ref().map_or(self.len, |p| p.orig_len)
    }

    /// The file bytes `[lo, hi)` of original bytes `[lo, hi)` live in: the
    /// same for a plain file; for a packed one, the frames that decode them
    /// (what a reader of that range must read), or None when the range is
    /// not in one piece.
    pub fn file_range(&self, lo: u64, hi: u64) -> Option<(u64, u64)> {
        match &self.packed {
            None => Some((lo, hi)),
            Some(ix) => {
                let f = ix.frames_for(lo, hi).ok()?;
                let (a, b) = (f.first()?.entry, f.last()?.entry);
                Some((a.at, b.at + b.len))
            }
        }
    }

    /// Read the original bytes `[offset, offset + out.len())` with `pread`
    /// (a file shrunk meanwhile gives an error, never a fault); a packed
    /// file's frames are decoded on the host and their checksums checked.
    pub fn read_original(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        match &self.packed {
            None => self
                .file
                .read_exact_at(out, offset)
                .map_err(|e| Error::io(&self.path, e)),
            Some(ix) => packed::decode_range(&self.file, ix, offset, out)
                .map_err(|r| Error::checkpoint(&self.path, None, r)),
        }
    }

    /// Address of byte `offset` of the mapping.
    pub fn ptr(&self, offset: u64) -> *const u8 {
        match &self.map {
            // `offset <= len` is guaranteed by validation for every tensor range.
            Some(m) => m.as_ptr().wrapping_add(offset as usize),
            None => std::ptr::null(),
        }
    }
}

/// Open `path` for reading only if it is a regular file (symlinks followed).
/// The open is non-blocking, so a FIFO is refused instead of waiting for a writer.
pub(super) fn open_regular(path: &Path) -> Result<(File, std::fs::Metadata)> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(Error::checkpoint(
            path,
            None,
            format!("is {kind}; checkpoint files must be regular files"),
        ));
    }
    Ok((file, meta))
}

/// Map `file` (of `len` bytes) read-only; None for an empty file.
pub(super) fn map_file(path: &Path, file: &File, len: u64) -> Result<Option<Mmap>> {
    Ok(if len > 0 {
        // SAFETY: the mapping is read-only. Another process may still change the
        // file while it is mapped: rewritten bytes change what we copy (the
        // loader and reload compare `identity` before reading, see
        // `check_unchanged`), and pages past a truncated end raise SIGBUS when
        // touched. So every read through the mapping follows a
        // `check_unchanged` of this shard (load and every Reload replay); a
        // truncation racing that read itself is not caught. Headers are parsed
        // from the mapping (GGUF) or checked through it (safetensors) right
        // after it is made, as bounded reads of bytes that may change.
        Some(unsafe { Mmap::map(file) }.map_err(|e| Error::io(path, e))?)
    } else {
        None
    })
}

/// Open and map one file as a shard, without reading its header (for
/// formats that parse their header from the mapping).
pub(super) fn map_shard(path: &Path) -> Result<Shard> {
    let (file, _) = open_regular(path)?;
    let identity = FileIdentity::of(&file).map_err(|e| Error::io(path, e))?;
    let map = map_file(path, &file, identity.len)?;
    Ok(Shard {
        path: path.to_path_buf(),
        file,
        map,
        len: identity.len,
        identity,
        packed: None,
    })
}
