//! The importer's side: attach to a share by its socket path, map the owner's
//! memory at this process's own addresses, and detach.
//!
//! Attach receives and validates the manifest before importing anything,
//! takes exactly one descriptor per chunk (any other count is refused), maps
//! read-only unless asked and allowed otherwise, and undoes every step on
//! failure. Each descriptor is closed once imported; detach (or drop) unmaps,
//! releases and frees the VA. The connection stays open while attached: it is
//! how the owner counts importers and how its notices (new version, revoke)
//! arrive, read on each call through this API.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::manifest::{Hello, Layout, Manifest, SharedTensor};
use super::wire::{self, Notice};
use crate::driver::sync_copy::copy_to_host;
use crate::driver::{DevicePtr, Driver, PhysHandle};
use crate::error::{Error, Result};
use crate::loader::dtype::Dtype;

/// How to attach.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// Map read-write (the owner must allow it); default read-only.
    pub read_write: bool,
    /// Longest wait for the owner's manifest and descriptors.
    pub timeout: Duration,
    /// User ids the owner may run as; `None` accepts this process's user and root.
    pub allowed_owner_uids: Option<Vec<u32>>,
    /// Threads that import and map the chunks; 0 chooses (one per 16 chunks,
    /// at most 8). Each chunk costs an import and a map in the driver, so a
    /// share of many segments attaches faster spread over threads.
    pub threads: usize,
}

/// Where an attach spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttachStats {
    /// Physical chunks imported and mapped.
    pub chunks: usize,
    /// Threads that imported and mapped them.
    pub threads: usize,
    /// Connecting, the owner check, the manifest and the descriptors.
    pub handshake: Duration,
    /// Importing every descriptor and mapping every chunk.
    pub import_map: Duration,
    /// Setting access on the whole range.
    pub access: Duration,
    /// The whole attach.
    pub total: Duration,
}

impl Default for AttachOptions {
    fn default() -> Self {
        AttachOptions {
            read_write: false,
            timeout: Duration::from_secs(30),
            allowed_owner_uids: None,
            threads: 0,
        }
    }
}

/// One imported tensor: where it is in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedTensor {
    /// Its name.
    pub name: String,
    /// Address of element 0 in this process.
    pub ptr: DevicePtr,
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<u64>,
    /// Bytes it spans.
    pub bytes: usize,
}

/// Imported memory: handles, the VA and what is mapped; undone when dropped.
#[derive(Debug)]
struct Mapping {
    driver: Arc<dyn Driver>,
    va: DevicePtr,
    total: usize,
    handles: Vec<PhysHandle>,
    /// (offset, size) of each mapped chunk.
    mapped: Vec<(usize, usize)>,
}

impl Mapping {
    fn undo(&mut self) -> Result<()> {
        let mut first = None;
        if !self.mapped.is_empty() {
            // No queued work of ours may still read the memory.
            if let Err(e) = self.driver.synchronize() {
                first.get_or_insert(e);
            }
        }
        for (off, size) in self.mapped.drain(..) {
            if let Err(e) = self.driver.unmap(self.va + off as u64, size) {
                first.get_or_insert(e);
            }
        }
        for h in self.handles.drain(..) {
            if let Err(e) = self.driver.release(h) {
                first.get_or_insert(e);
            }
        }
        if self.total > 0 {
            if let Err(e) = self.driver.free_va(self.va, self.total) {
                first.get_or_insert(e);
            }
            self.total = 0;
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let _ = self.undo();
    }
}

#[derive(Debug, Default)]
struct Notices {
    pending: Vec<u8>,
    version: u64,
    revoked: bool,
    owner_gone: bool,
}

impl Notices {
    fn apply(&mut self, n: Notice) {
        match n {
            Notice::Version(v) => self.version = v,
            Notice::Revoked => self.revoked = true,
            Notice::Ready => {}
        }
    }
}

fn import_threads(asked: usize, chunks: usize) -> usize {
    let n = if asked == 0 {
        chunks.div_ceil(16).min(8)
    } else {
        asked
    };
    n.clamp(1, chunks.max(1))
}

/// The run (thread) chunk `i` of `chunks` goes to: `threads` contiguous
/// runs of whole chunks, none empty while `threads <= chunks`.
fn run_of(chunks: usize, threads: usize) -> impl Fn(usize) -> usize {
    let threads = threads.clamp(1, chunks.max(1));
    move |i| i * threads / chunks
}

/// Import chunk `i` from `fds[i]` and map it at its offset in `mapping`'s
/// range, spread over `threads` threads, each taking a contiguous run of
/// chunks. Whatever succeeded is recorded in `mapping` (so dropping it undoes
/// it) before the first error, if any, is returned.
fn import_and_map(
    mapping: &mut Mapping,
    fds: Vec<OwnedFd>,
    sizes: &[usize],
    threads: usize,
) -> Result<()> {
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut off = 0usize;
    for &size in sizes {
        offsets.push(off);
        off += size;
    }
    let run = run_of(sizes.len(), threads);
    let mut groups: Vec<Vec<(usize, OwnedFd)>> = Vec::new();
    for (i, fd) in fds.into_iter().enumerate() {
        if groups.len() <= run(i) {
            groups.push(Vec::new());
        }
        groups.last_mut().expect("pushed above").push((i, fd));
    }
    type Done = (Vec<(PhysHandle, Option<(usize, usize)>)>, Option<Error>);
    let work = |group: Vec<(usize, OwnedFd)>| -> Done {
        let mut done = Vec::with_capacity(group.len());
        for (i, fd) in group {
            let h = match mapping.driver.import_fd(fd, sizes[i]) {
                Ok(h) => h,
                Err(e) => return (done, Some(e)),
            };
            let va = mapping.va + offsets[i] as u64;
            if let Err(e) = mapping.driver.map(va, sizes[i], h) {
                done.push((h, None));
                return (done, Some(e));
            }
            done.push((h, Some((offsets[i], sizes[i]))));
        }
        (done, None)
    };
    let results: Vec<Done> = if groups.len() <= 1 {
        groups.into_iter().map(work).collect()
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .into_iter()
                .map(|g| s.spawn(move || work(g)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        (
                            Vec::new(),
                            Some(Error::Panic(
                                "a thread importing shared chunks panicked".into(),
                            )),
                        )
                    })
                })
                .collect()
        })
    };
    let mut first = None;
    for (done, err) in results {
        for (h, m) in done {
            mapping.handles.push(h);
            if let Some(m) = m {
                mapping.mapped.push(m);
            }
        }
        if let Some(e) = err {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// An attached share. Dropping it detaches.
#[derive(Debug)]
pub struct Attachment {
    path: PathBuf,
    sock: UnixStream,
    manifest: Manifest,
    index: HashMap<String, usize>,
    layout: Layout,
    read_write: bool,
    mapping: Mapping,
    notices: Mutex<Notices>,
    stats: AttachStats,
}

fn refused(path: &Path, reason: impl Into<String>) -> Error {
    Error::ShareRefused {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl Attachment {
    /// Attach to the share at `path` on `driver`'s device.
    pub fn attach(
        driver: Arc<dyn Driver>,
        path: impl AsRef<Path>,
        options: &AttachOptions,
    ) -> Result<Attachment> {
        let path = path.as_ref();
        let start = Instant::now();
        let sock = UnixStream::connect(path).map_err(|e| Error::io(path, e))?;
        sock.set_read_timeout(Some(options.timeout))
            .map_err(|e| Error::io(path, e))?;
        let owner = wire::peer_cred(&sock).map_err(|e| Error::io(path, e))?;
        let owner_ok = match &options.allowed_owner_uids {
            None => owner.uid == wire::own_uid() || owner.uid == 0,
            Some(u) => u.contains(&owner.uid),
        };
        if !owner_ok {
            return Err(refused(
                path,
                format!(
                    "the socket's owner (pid {}, uid {}) is not an allowed user (this process runs as uid {})",
                    owner.pid,
                    owner.uid,
                    wire::own_uid()
                ),
            ));
        }
        std::io::Write::write_all(&mut &sock, if options.read_write { b"w" } else { b"r" })
            .map_err(|e| Error::io(path, e))?;
        let mut fds = Vec::new();
        let hello = wire::read_hello(&sock, &mut fds)
            .map_err(|e| refused(path, format!("reading the manifest: {e}")))?;
        if !fds.is_empty() {
            return Err(refused(
                path,
                format!(
                    "the owner sent {} descriptors before its manifest",
                    fds.len()
                ),
            ));
        }
        let manifest = match hello {
            Hello::Manifest(m) => m,
            Hello::Refused(why) => return Err(refused(path, format!("the owner refused: {why}"))),
        };
        let layout = manifest
            .validate(driver.kind(), driver.granularity())
            .map_err(|e| refused(path, format!("invalid manifest: {e}")))?;
        if options.read_write && !manifest.writable {
            return Err(refused(
                path,
                "read-write access asked, the owner shares read-only",
            ));
        }
        let want = layout.chunks.len();
        let mut byte = [0u8; 1];
        for _ in 0..wire::batches(want) {
            wire::recv_exact(&sock, &mut byte, &mut fds)
                .map_err(|e| refused(path, format!("receiving descriptors: {e}")))?;
            if fds.len() > want {
                break;
            }
        }
        let early = if fds.len() == want {
            wire::read_until_ready(&sock, &mut fds)
                .map_err(|e| refused(path, format!("finishing the handshake: {e}")))?
        } else {
            Vec::new()
        };
        if fds.len() != want {
            return Err(refused(
                path,
                format!(
                    "the manifest lists {want} chunks, the owner sent {} descriptors",
                    fds.len()
                ),
            ));
        }
        let handshake = start.elapsed();
        let mut mapping = Mapping {
            driver: driver.clone(),
            va: 0,
            total: 0,
            handles: Vec::with_capacity(want),
            mapped: Vec::with_capacity(want),
        };
        mapping.va = driver.reserve(layout.total, 0)?;
        mapping.total = layout.total;
        let t = Instant::now();
        let threads = import_threads(options.threads, want);
        import_and_map(&mut mapping, fds, &layout.chunks, threads)?;
        let import_map = t.elapsed();
        let t = Instant::now();
        if options.read_write {
            driver.set_access(mapping.va, layout.total)?;
        } else {
            driver.set_access_read_only(mapping.va, layout.total)?;
        }
        let access = t.elapsed();
        let index = manifest
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let mut notices = Notices {
            version: manifest.version,
            ..Notices::default()
        };
        for n in early {
            notices.apply(n);
        }
        Ok(Attachment {
            path: path.to_path_buf(),
            sock,
            manifest,
            index,
            layout,
            read_write: options.read_write,
            mapping,
            notices: Mutex::new(notices),
            stats: AttachStats {
                chunks: want,
                threads,
                handshake,
                import_map,
                access,
                total: start.elapsed(),
            },
        })
    }

    /// Where this attach spent its time.
    pub fn stats(&self) -> AttachStats {
        self.stats
    }

    /// Read the owner's notices; `ShareRevoked` once it revoked the share.
    pub fn check(&self) -> Result<()> {
        let mut n = self.notices.lock().unwrap_or_else(|p| p.into_inner());
        if !n.revoked && !n.owner_gone {
            let Notices { pending, .. } = &mut *n;
            let (got, closed) = wire::poll_notices(&self.sock, pending)
                .map_err(|e| refused(&self.path, format!("reading the owner's notices: {e}")))?;
            for x in got {
                n.apply(x);
            }
            n.owner_gone |= closed;
        }
        if n.revoked {
            return Err(Error::ShareRevoked {
                path: self.path.clone(),
                reason: format!(
                    "the owner (pid {}) put tag `{}` to sleep",
                    self.manifest.owner_pid, self.manifest.tag
                ),
            });
        }
        Ok(())
    }

    /// The weights version: the manifest's, or a newer one the owner published.
    pub fn version(&self) -> Result<u64> {
        self.check()?;
        Ok(self
            .notices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .version)
    }

    /// False once the owner stopped serving or exited. The memory stays mapped
    /// and valid either way; only new versions and revokes no longer arrive.
    pub fn owner_connected(&self) -> bool {
        let _ = self.check();
        !self
            .notices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .owner_gone
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<ImportedTensor> {
        self.check()?;
        let i = *self.index.get(name).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "share {}: no tensor `{name}` (it has {} tensors)",
                self.path.display(),
                self.manifest.tensors.len()
            ))
        })?;
        Ok(self.imported(i))
    }

    /// Every tensor, in the owner's order.
    pub fn tensors(&self) -> Result<Vec<ImportedTensor>> {
        self.check()?;
        Ok((0..self.manifest.tensors.len())
            .map(|i| self.imported(i))
            .collect())
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.manifest.tensors.len()
    }

    /// True when the share has no tensors.
    pub fn is_empty(&self) -> bool {
        self.manifest.tensors.is_empty()
    }

    /// The manifest as received.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Base and size of the mapped range in this process.
    pub fn range(&self) -> (DevicePtr, usize) {
        (self.mapping.va, self.layout.total)
    }

    /// True when mapped read-write.
    pub fn is_read_write(&self) -> bool {
        self.read_write
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn imported(&self, i: usize) -> ImportedTensor {
        let t: &SharedTensor = &self.manifest.tensors[i];
        ImportedTensor {
            name: t.name.clone(),
            ptr: self.mapping.va + t.offset,
            dtype: t.dtype,
            shape: t.shape.clone(),
            bytes: self.layout.tensor_bytes[i],
        }
    }

    /// Copy `dst.len()` bytes of the share at address `src` (inside
    /// [`Attachment::range`]) into host memory, and wait for the copy.
    pub fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        self.check()?;
        let (base, total) = self.range();
        let inside = src >= base
            && (src - base)
                .checked_add(dst.len() as u64)
                .is_some_and(|end| end <= total as u64);
        if !inside {
            return Err(Error::InvalidArgument(format!(
                "share {}: [{src:#x}, +{}) is not inside the mapped range [{base:#x}, +{total})",
                self.path.display(),
                dst.len()
            )));
        }
        // SAFETY: the range is inside this attachment's mapping, which stays
        // mapped while `self` is borrowed (detach takes it by value).
        unsafe { copy_to_host(self.mapping.driver.as_ref(), dst, src) }
    }

    /// Unmap, release and close; the owner sees the importer gone.
    pub fn detach(mut self) -> Result<()> {
        let r = self.mapping.undo();
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::{import_threads, run_of};

    #[test]
    fn chunks_are_spread_over_exactly_the_threads_reported() {
        for chunks in 1..=40 {
            for asked in 0..=45 {
                let threads = import_threads(asked, chunks);
                let run = run_of(chunks, threads);
                let runs: Vec<usize> = (0..chunks).map(&run).collect();
                assert_eq!(runs[0], 0);
                assert!(
                    runs.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1),
                    "{chunks} chunks, {threads} threads: runs not contiguous: {runs:?}"
                );
                assert_eq!(
                    runs[chunks - 1] + 1,
                    threads,
                    "{chunks} chunks over {threads} threads (asked {asked}): {runs:?}"
                );
            }
        }
    }
}
