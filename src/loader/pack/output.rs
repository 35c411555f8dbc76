//! Atomic output: a packed or unpacked checkpoint is written under a
//! temporary name in the destination's folder, synced, and renamed onto the
//! final name only once whole, so a failure (or a kill) never leaves a
//! half-written file under that name. A temporary left behind is removed when
//! the write fails or is dropped.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A file or folder being written under a temporary name.
#[derive(Debug)]
pub struct Pending {
    tmp: PathBuf,
    dest: PathBuf,
    dir: bool,
    done: bool,
}

fn tmp_name(dest: &Path) -> Result<PathBuf> {
    let name = dest.file_name().ok_or_else(|| {
        Error::InvalidArgument(format!("output {} has no file name", dest.display()))
    })?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut t = std::ffi::OsString::from(".");
    t.push(name);
    t.push(format!(".vmmw-tmp-{}-{nanos}", std::process::id()));
    Ok(dest.with_file_name(t))
}

/// Refuse an output that exists, unless `force` and it is a file (a folder
/// is never replaced: it may hold more than a checkpoint).
fn check_dest(dest: &Path, force: bool) -> Result<()> {
    match std::fs::symlink_metadata(dest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(dest, e)),
        Ok(m) if m.is_file() && force => Ok(()),
        Ok(m) => Err(Error::InvalidArgument(format!(
            "output {} exists ({}); remove it first{}",
            dest.display(),
            if m.is_dir() { "a folder" } else { "a file" },
            if m.is_dir() {
                ""
            } else {
                ", or pass --force to replace it"
            }
        ))),
    }
}

impl Pending {
    /// A new file for `dest`, open for writing.
    pub fn file(dest: &Path, force: bool) -> Result<(Pending, File)> {
        check_dest(dest, force)?;
        let tmp = tmp_name(dest)?;
        let f = OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| Error::io(&tmp, e))?;
        Ok((
            Pending {
                tmp,
                dest: dest.to_path_buf(),
                dir: false,
                done: false,
            },
            f,
        ))
    }

    /// A new folder for `dest`.
    pub fn folder(dest: &Path) -> Result<Pending> {
        check_dest(dest, false)?;
        let tmp = tmp_name(dest)?;
        std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        Ok(Pending {
            tmp,
            dest: dest.to_path_buf(),
            dir: true,
            done: false,
        })
    }

    /// The temporary path being written.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Sync and rename onto the final name, then sync the folder holding it.
    /// Files inside a pending folder are synced by their writers.
    pub fn commit(mut self, file: Option<&File>) -> Result<()> {
        if let Some(f) = file {
            f.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        }
        if self.dir {
            sync_dir(&self.tmp)?;
        }
        std::fs::rename(&self.tmp, &self.dest).map_err(|e| Error::io(&self.dest, e))?;
        self.done = true;
        let parent = match self.dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        sync_dir(parent)
    }
}

fn sync_dir(p: &Path) -> Result<()> {
    File::open(p)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(p, e))
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            let _ = if self.dir {
                std::fs::remove_dir_all(&self.tmp)
            } else {
                std::fs::remove_file(&self.tmp)
            };
        }
    }
}
