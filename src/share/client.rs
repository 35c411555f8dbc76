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
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::manifest::{printable, Hello, Layout, Manifest, SharedTensor};
use super::memfd;
use super::wire::{self, Notice};
use crate::driver::sync_copy::copy_to_host;
use crate::driver::{BackendKind, DevicePtr, Driver, PhysHandle};
use crate::error::{Error, Result};
use crate::loader::dtype::Dtype;

/// How to attach.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// Map read-write (the owner must allow it); default read-only.
    pub read_write: bool,
    /// Longest attach, from connect to the last descriptor: one deadline for
    /// the whole handshake, however the owner paces its bytes.
    pub timeout: Duration,
    /// User ids the owner may run as; `None` accepts this process's user and root.
    pub allowed_owner_uids: Option<Vec<u32>>,
}

/// Where an attach spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttachStats {
    /// Physical chunks imported and mapped.
    pub chunks: usize,
    /// Connecting, the owner check and the manifest.
    pub handshake: Duration,
    /// Receiving every descriptor, importing it and mapping its chunk.
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
    /// Why the share is revoked for this importer, once it is.
    revoked: Option<Notice>,
    owner_gone: bool,
}

impl Notices {
    fn apply(&mut self, n: Notice) {
        match n {
            Notice::Version(v) => self.version = v,
            Notice::Revoked | Notice::Evicted => {
                self.revoked.get_or_insert(n);
            }
            Notice::Ready => {}
        }
    }
}

fn wrong_count(path: &Path, want: usize, sent: usize) -> Error {
    refused(
        path,
        format!("the manifest lists {want} chunks, the owner sent {sent} descriptors"),
    )
}

/// Receive the descriptors of `chunks` and import and map each one as its
/// message arrives, closing it at once, so that this process never holds
/// more than one message's descriptors ([`wire::FDS_PER_MESSAGE`]): a file table that
/// had to grow to hold them all would cost one RCU grace period per doubling
/// (the kernel waits for one when a threaded process's table grows), tens of
/// milliseconds on a busy host. Whatever succeeded is recorded in `mapping`,
/// so dropping it undoes it.
fn receive_and_map(
    sock: &UnixStream,
    path: &Path,
    mapping: &mut Mapping,
    chunks: &[usize],
    deadline: Instant,
) -> Result<()> {
    let want = chunks.len();
    let (mut next, mut off) = (0usize, 0usize);
    let mut batch = Vec::new();
    let mut byte = [0u8; 1];
    let host = mapping.driver.kind() == BackendKind::Host;
    while next < want {
        wire::recv_exact(sock, &mut byte, &mut batch, Some(deadline))
            .map_err(|e| refused(path, format!("receiving descriptors: {e}")))?;
        if batch.is_empty() {
            // The owner moved on before sending a descriptor per chunk.
            return Err(wrong_count(path, want, next));
        }
        if next + batch.len() > want {
            return Err(wrong_count(path, want, next + batch.len()));
        }
        for fd in batch.drain(..) {
            let size = chunks[next];
            if host {
                memfd::check_sealed(&fd)
                    .map_err(|e| refused(path, format!("chunk {next}: {e}")))?;
            }
            // The descriptor is the owner's: one that is not memory of the
            // size its manifest claims is the owner's fault, a refusal.
            let h = mapping.driver.import_fd(fd, size).map_err(|e| {
                refused(
                    path,
                    format!("chunk {next} ({size} bytes): the owner's descriptor cannot be imported: {e}"),
                )
            })?;
            mapping.handles.push(h);
            mapping.driver.map(mapping.va + off as u64, size, h)?;
            mapping.mapped.push((off, size));
            off += size;
            next += 1;
        }
    }
    Ok(())
}

/// An attached share. Dropping it detaches.
#[derive(Debug)]
pub struct Attachment {
    path: PathBuf,
    sock: UnixStream,
    /// The owner's process id as the kernel reported it (`SO_PEERCRED`).
    owner_pid: i32,
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
        let deadline = start + options.timeout;
        let sock = UnixStream::connect(path).map_err(|e| Error::io(path, e))?;
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
        // An owner may refuse before reading the request and close: its
        // refusal is still there to read, so a failed send is reported only
        // when no answer follows.
        let asked = wire::send_all(
            &sock,
            if options.read_write { b"w" } else { b"r" },
            Some(deadline),
        );
        let mut fds = Vec::new();
        let hello = match (wire::read_hello(&sock, &mut fds, Some(deadline)), asked) {
            (Ok(h), _) => h,
            (Err(_), Err(e)) => return Err(Error::io(path, e)),
            (Err(e), Ok(())) => return Err(refused(path, format!("reading the manifest: {e}"))),
        };
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
            Hello::Refused(why) => {
                return Err(refused(
                    path,
                    format!("the owner refused: {}", printable(&why)),
                ))
            }
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
        let handshake = start.elapsed();
        let mut mapping = Mapping {
            driver: driver.clone(),
            va: 0,
            total: 0,
            handles: Vec::with_capacity(want),
            mapped: Vec::with_capacity(want),
        };
        mapping.va = driver.reserve(layout.total, 0).map_err(|e| {
            refused(
                path,
                format!(
                    "cannot reserve the {} bytes of address space the owner's {want} chunks need: {e}",
                    layout.total
                ),
            )
        })?;
        mapping.total = layout.total;
        let t = Instant::now();
        receive_and_map(&sock, path, &mut mapping, &layout.chunks, deadline)?;
        let mut fds = Vec::new();
        let early = wire::read_until_ready(&sock, &mut fds, Some(deadline))
            .map_err(|e| refused(path, format!("finishing the handshake: {e}")))?;
        if !fds.is_empty() {
            return Err(wrong_count(path, want, want + fds.len()));
        }
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
            owner_pid: owner.pid,
            manifest,
            index,
            layout,
            read_write: options.read_write,
            mapping,
            notices: Mutex::new(notices),
            stats: AttachStats {
                chunks: want,
                handshake,
                import_map,
                access,
                total: start.elapsed(),
            },
        })
    }

    /// The process serving the share, as the kernel reported it for the
    /// socket (not as the owner's manifest says).
    pub fn owner_pid(&self) -> i32 {
        self.owner_pid
    }

    /// Where this attach spent its time.
    pub fn stats(&self) -> AttachStats {
        self.stats
    }

    /// Read the owner's notices; `ShareRevoked` once it revoked the share or
    /// evicted this importer.
    pub fn check(&self) -> Result<()> {
        let mut n = self.notices.lock().unwrap_or_else(|p| p.into_inner());
        if n.revoked.is_none() && !n.owner_gone {
            let Notices { pending, .. } = &mut *n;
            let (got, closed) = wire::poll_notices(&self.sock, pending)
                .map_err(|e| refused(&self.path, format!("reading the owner's notices: {e}")))?;
            for x in got {
                n.apply(x);
            }
            n.owner_gone |= closed;
        }
        let reason = match n.revoked {
            None => return Ok(()),
            Some(Notice::Evicted) => format!(
                "the owner (pid {}) evicted this importer: it left the owner's notices unread \
                 past the bound the owner keeps per importer (call `version` or `check` \
                 between the owner's publishes), or sent bytes after its request; detach and attach again",
                self.manifest.owner_pid
            ),
            Some(_) => format!(
                "the owner (pid {}) put tag `{}` to sleep",
                self.manifest.owner_pid,
                printable(&self.manifest.tag)
            ),
        };
        Err(Error::ShareRevoked {
            path: self.path.clone(),
            reason,
        })
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
                "share {}: no tensor `{}` (it has {} tensors)",
                self.path.display(),
                printable(name),
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
