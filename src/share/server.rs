//! The owner's side: a Unix socket that hands a tag's tensors to importers.
//!
//! One thread accepts; each connection gets a thread that checks the peer's
//! credentials, exports the memory (under the pool's share gate, so the tag
//! cannot sleep meanwhile), sends the manifest and descriptors, and then waits
//! for the importer to close its end (detach, exit or crash). While a
//! connection is open the importer counts as attached.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::export::export;
use super::manifest::Hello;
use super::wire::{self, Notice, PeerCred};
use crate::error::{Error, Result};
use crate::loader::registry::Destination;
use crate::pool::shares::TagShare;
use crate::pool::Pool;
use crate::tag::{self, TagId};

/// What the owner's sleep of a shared tag does to attached importers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SleepPolicy {
    /// The sleep fails (`InvalidState`) while any importer is attached.
    #[default]
    Refuse,
    /// The sleep proceeds; every attached importer is told, and its next call
    /// through the API fails with `ShareRevoked`. Its mapping stays valid (the
    /// memory lives until it detaches), so nothing faults.
    Revoke,
}

/// How a share is served.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// What the owner's sleep of the tag does to importers.
    pub sleep_policy: SleepPolicy,
    /// Allow importers to map read-write (default: read-only).
    pub allow_write: bool,
    /// User ids allowed to attach; `None` allows only this process's user.
    pub allowed_uids: Option<Vec<u32>>,
}

#[derive(Debug, Default)]
struct Conns {
    /// Connection id -> its stream once the manifest is sent (None while handshaking).
    open: HashMap<u64, Option<UnixStream>>,
    /// Handshaking connections that a revoke reached before they were ready.
    revoke_pending: Vec<u64>,
    next_id: u64,
    version: u64,
}

#[derive(Debug)]
struct Shared {
    pool: Arc<Pool>,
    tag: TagId,
    tensors: Vec<Destination>,
    path: PathBuf,
    options: ServeOptions,
    conns: Mutex<Conns>,
    stopping: AtomicBool,
}

impl Shared {
    fn conns(&self) -> MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn allowed(&self, cred: &PeerCred) -> bool {
        match &self.options.allowed_uids {
            None => cred.uid == wire::own_uid(),
            Some(uids) => uids.contains(&cred.uid),
        }
    }

    fn refuse(&self, sock: &mut UnixStream, reason: String) {
        let _ = wire::write_hello(sock, &Hello::Refused(reason));
    }

    /// One connection, from handshake to close.
    fn serve(&self, mut sock: UnixStream) {
        // The request is read before anything is refused, so the importer
        // never writes into a closed socket and always reads the reason.
        let mut ask = [0u8; 1];
        let _ = sock.set_read_timeout(Some(std::time::Duration::from_secs(30)));
        let asked = std::io::Read::read_exact(&mut sock, &mut ask);
        let _ = sock.set_read_timeout(None);
        let cred = match wire::peer_cred(&sock) {
            Ok(c) => c,
            Err(e) => return self.refuse(&mut sock, format!("peer credentials unavailable: {e}")),
        };
        if !self.allowed(&cred) {
            let allowed = match &self.options.allowed_uids {
                None => format!("uid {} (the owner's)", wire::own_uid()),
                Some(u) => format!("uids {u:?}"),
            };
            return self.refuse(
                &mut sock,
                format!(
                    "peer pid {} with uid {} is not allowed; this share accepts {allowed}",
                    cred.pid, cred.uid
                ),
            );
        }
        match (asked, ask[0]) {
            (Ok(()), b'r') => {}
            (Ok(()), b'w') if self.options.allow_write => {}
            (Ok(()), b'w') => {
                return self.refuse(
                    &mut sock,
                    "read-write access asked, the owner shares read-only".into(),
                )
            }
            _ => {
                return self.refuse(
                    &mut sock,
                    "no valid access request (r or w) received".into(),
                )
            }
        }
        // Export under the gate: the tag is wholly awake for this attach, and a
        // sleep waits until the connection is counted.
        let (id, exported, sent_version) = {
            let gate = self.pool.shares().lock();
            let mut c = self.conns();
            let version = c.version;
            match export(
                &self.pool,
                self.tag,
                &self.tensors,
                version,
                self.options.allow_write,
            ) {
                Ok(x) => {
                    c.next_id += 1;
                    let id = c.next_id;
                    c.open.insert(id, None);
                    drop(gate);
                    (id, x, version)
                }
                Err(e) => {
                    drop(c);
                    drop(gate);
                    return self.refuse(&mut sock, e.to_string());
                }
            }
        };
        let sent =
            wire::write_hello(&mut sock, &Hello::Manifest(exported.manifest)).and_then(|()| {
                let fds: Vec<_> = exported.fds.iter().map(|f| f.as_fd()).collect();
                wire::send_fds(&sock, &fds)
            });
        // The importer has its own references now (or failed); ours close here.
        drop(exported.fds);
        if sent.is_ok() {
            let mut c = self.conns();
            match sock.try_clone() {
                Ok(clone) => {
                    if self.stopping.load(Ordering::SeqCst) {
                        c.open.remove(&id);
                        return;
                    }
                    // Notices that came while the manifest was on its way.
                    if c.version != sent_version {
                        let _ = wire::send_notice(&clone, Notice::Version(c.version));
                    }
                    if let Some(pos) = c.revoke_pending.iter().position(|&p| p == id) {
                        c.revoke_pending.swap_remove(pos);
                        let _ = wire::send_notice(&clone, Notice::Revoked);
                    }
                    // Registered before the importer's attach returns, so every
                    // later notice reaches it.
                    let _ = wire::send_notice(&clone, Notice::Ready);
                    c.open.insert(id, Some(clone));
                }
                Err(_) => {
                    c.open.remove(&id);
                    return;
                }
            }
        }
        if sent.is_ok() {
            wire::wait_for_close(&sock);
        }
        let mut c = self.conns();
        c.open.remove(&id);
        c.revoke_pending.retain(|&p| p != id);
    }

    fn notify_all(c: &mut Conns, n: Notice) {
        let ids: Vec<u64> = c.open.keys().copied().collect();
        for id in ids {
            match &c.open[&id] {
                // An importer that stopped reading loses its connection,
                // never stalls the owner.
                Some(s) if wire::send_notice(s, n).is_err() => {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
                Some(_) => {}
                None if n == Notice::Revoked => c.revoke_pending.push(id),
                None => {}
            }
        }
    }
}

impl TagShare for Shared {
    fn before_sleep(&self, tag: TagId) -> Result<()> {
        let mut c = self.conns();
        if c.open.is_empty() {
            return Ok(());
        }
        match self.options.sleep_policy {
            SleepPolicy::Refuse => Err(Error::InvalidState(format!(
                "tag `{}` is shared through {} with {} attached importer(s) and its share refuses \
                 sleep while attached: detach them, or serve it with the revoke policy",
                tag::name_of(tag),
                self.path.display(),
                c.open.len()
            ))),
            SleepPolicy::Revoke => {
                c.version += 1;
                Self::notify_all(&mut c, Notice::Revoked);
                Ok(())
            }
        }
    }
}

/// A running share. Dropping it stops serving (as [`Server::stop`]).
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    gate_id: u64,
    listener_fd: i32,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Serve `tensors` (which must lie in `tag`'s memory in `pool`) on a Unix
    /// socket at `path`. The path must not exist; it is removed by `stop`.
    /// The first export is tried here, so a tensor outside the tag, an asleep
    /// tag or a backend that cannot export fails now, not at the first attach.
    pub fn start(
        pool: Arc<Pool>,
        tag: TagId,
        tensors: Vec<Destination>,
        path: impl AsRef<Path>,
        options: ServeOptions,
    ) -> Result<Server> {
        let path = path.as_ref().to_path_buf();
        tag::check(tag)?;
        if tensors.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "share {}: no tensors to share",
                path.display()
            )));
        }
        if !pool.driver().shareable() {
            return Err(Error::Unsupported(format!(
                "share {}: the {} backend's memory is not created shareable",
                path.display(),
                pool.driver().kind()
            )));
        }
        drop(export(&pool, tag, &tensors, 0, options.allow_write)?);
        let listener = UnixListener::bind(&path).map_err(|e| Error::io(&path, e))?;
        let listener_fd = listener.as_raw_fd();
        let shared = Arc::new(Shared {
            pool: pool.clone(),
            tag,
            tensors,
            path,
            options,
            conns: Mutex::new(Conns {
                version: 1,
                ..Conns::default()
            }),
            stopping: AtomicBool::new(false),
        });
        let gate_id = pool.shares().add(tag, shared.clone());
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("vmmw-share".into())
            .spawn(move || accept_loop(listener, s))
            .map_err(|e| {
                pool.shares().remove(gate_id);
                let _ = std::fs::remove_file(&shared.path);
                Error::InvalidState(format!("cannot start the share's thread: {e}"))
            })?;
        Ok(Server {
            shared,
            gate_id,
            listener_fd,
            accept: Some(accept),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Importers attached now (connections open, including ones handshaking).
    pub fn attached(&self) -> usize {
        self.shared.conns().open.len()
    }

    /// The version new importers receive.
    pub fn version(&self) -> u64 {
        self.shared.conns().version
    }

    /// Tell importers the owner wrote new weights in place: the version goes
    /// up by one, attached importers see it on their next call, and new ones
    /// get it in the manifest. Returns the new version.
    pub fn publish(&self) -> u64 {
        let mut c = self.shared.conns();
        c.version += 1;
        let v = c.version;
        Shared::notify_all(&mut c, Notice::Version(v));
        v
    }

    /// Stop accepting and remove the socket path. Attached importers keep
    /// their mappings (the memory lives while they hold it) and see the owner
    /// gone; the tag no longer refuses sleep on their account.
    pub fn stop(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.pool.shares().remove(self.gate_id);
        // SAFETY: the listener is owned by the accept thread and still open
        // (the thread is joined below); shutdown wakes its blocking accept.
        unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        let _ = accept.join();
        let mut c = self.shared.conns();
        for s in c.open.values().flatten() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        c.open.clear();
        drop(c);
        let _ = std::fs::remove_file(&self.shared.path);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(sock) = conn else {
            if shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            continue;
        };
        let s = shared.clone();
        let _ = std::thread::Builder::new()
            .name("vmmw-share-conn".into())
            .spawn(move || s.serve(sock));
    }
}
