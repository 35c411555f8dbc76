//! The owner's side: a Unix socket that hands a tag's tensors to importers.
//!
//! Threads, and what bounds each:
//! - one accepts. The peer's credentials (`SO_PEERCRED`) are checked before
//!   anything is read, and a peer that is not allowed gets a refusal at once.
//!   Connections are counted (handshaking and attached); past
//!   [`ServeOptions::max_connections`] a peer gets a refusal saying so. When
//!   the process runs out of descriptors (`EMFILE`, `ENFILE`) accepting backs
//!   off, up to a second between tries, with one log line, never a spin.
//! - one per handshake (`share::handshake`): read the request, export under
//!   the pool's share gate, send the manifest and descriptors, all under one
//!   deadline ([`ServeOptions::handshake_timeout`]).
//! - one watches every attached importer (`share::watch`) with a single
//!   `poll`, asleep between events: a closed connection stops being counted.
//!
//! - the log's writer (`share::log`): audit lines go through a bounded
//!   queue, so no serving thread ever waits for a log reader; a reader that
//!   stalls loses lines, counted, not the server.
//!
//! Notices (publish, revoke) are sent without blocking. An importer whose
//! unread notices fill half its socket buffer is evicted: it is sent `X`
//! (its next call fails with `ShareRevoked`), gets no further notice, and is
//! still counted, by [`Server::attached`] and by the refuse policy, until it
//! closes its end. The kernel holds at most that half buffer per importer.

use std::os::fd::AsRawFd;
use std::os::linux::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::accept::{accept_loop, remove_if_ours, Accepting};
use super::connections::{Conns, Shared};
use super::export::export;
use super::options::{peer_allowed, peers_accepted, ServeOptions, SleepPolicy};
use super::wire::{self, Notice, PeerCred};
use crate::error::{Error, Result};
use crate::loader::registry::Destination;
use crate::pool::shares::TagShare;
use crate::pool::Pool;
use crate::tag::{self, TagId};

/// Longest wait at stop for the log's writer to write what was logged.
const LOG_FLUSH: Duration = Duration::from_millis(200);

impl Shared {
    fn allowed(&self, cred: &PeerCred, sock: &UnixStream) -> bool {
        peer_allowed(
            self.options.allowed_uids.as_deref(),
            &self.options.allowed_gids,
            cred,
            sock,
        )
    }

    fn accepts(&self) -> String {
        peers_accepted(
            self.options.allowed_uids.as_deref(),
            &self.options.allowed_gids,
        )
    }

    /// Check a new connection and start its handshake. False once stopping.
    fn admit(self: &Arc<Self>, sock: UnixStream) -> bool {
        let cred = match wire::peer_cred(&sock) {
            Ok(c) => c,
            Err(e) => {
                self.log(format!("refused a peer: credentials unavailable: {e}"));
                Self::refuse_now(sock, format!("peer credentials unavailable: {e}"));
                return true;
            }
        };
        if !self.allowed(&cred, &sock) {
            let why = format!(
                "peer pid {} with uid {} is not allowed (its group {} is not listed either); \
                 this share accepts {}",
                cred.pid,
                cred.uid,
                cred.gid,
                self.accepts()
            );
            self.log(format!(
                "refused pid={} uid={} gid={}: not allowed",
                cred.pid, cred.uid, cred.gid
            ));
            Self::refuse_now(sock, why);
            return true;
        }
        let sock = Arc::new(sock);
        let id = {
            let mut c = self.conns();
            if c.stopping {
                return false;
            }
            let open = c.open();
            if open >= self.options.max_connections {
                drop(c);
                self.log(format!(
                    "refused pid={} uid={}: {open} connections open, at most {}",
                    cred.pid, cred.uid, self.options.max_connections
                ));
                if let Ok(s) = Arc::try_unwrap(sock) {
                    Self::refuse_now(
                        s,
                        format!(
                            "too many connections: {open} open, this share serves at most {}",
                            self.options.max_connections
                        ),
                    );
                }
                return true;
            }
            c.next_id += 1;
            let id = c.next_id;
            c.handshaking.insert(id, sock.clone());
            id
        };
        let deadline = Instant::now() + self.options.handshake_timeout;
        let s = self.clone();
        // The thread owns the only other reference, and hands it on to the
        // attached set, so a connection no longer counted is closed too.
        let started = std::thread::Builder::new()
            .name("vmmw-share-conn".into())
            .spawn(move || {
                s.handshake(id, sock, cred, deadline);
                s.end_handshake(id);
            });
        if let Err(e) = started {
            self.log(format!(
                "refused pid={}: cannot start a thread: {e}",
                cred.pid
            ));
            if let Some(s) = self.end_handshake(id).and_then(|s| Arc::try_unwrap(s).ok()) {
                Self::refuse_now(s, format!("the owner cannot start a thread: {e}"));
            }
        }
        true
    }
}

impl TagShare for Shared {
    /// The tag moved to version `v`: importers get it now or in the manifest.
    fn version_moved(&self, _tag: TagId, v: u64) {
        let mut c = self.conns();
        if c.stopping || c.version == v {
            return;
        }
        c.version = v;
        let lines = c.notify_all(Notice::Version(v));
        drop(c);
        for l in lines {
            self.log(l);
        }
    }

    fn before_sleep(&self, tag: TagId) -> Result<()> {
        let mut c = self.conns();
        let open = c.open();
        if open == 0 {
            return Ok(());
        }
        match self.options.sleep_policy {
            SleepPolicy::Refuse => Err(Error::InvalidState(format!(
                "tag `{}` is shared through {} with {open} attached importer(s) and its share refuses \
                 sleep while attached: detach them, or serve it with the revoke policy",
                tag::name_of(tag),
                self.path.display(),
            ))),
            SleepPolicy::Revoke => {
                // New importers map new memory after the wake: a new version.
                c.version = self.pool.advance_version_for_revoke(tag);
                let lines = c.notify_all(Notice::Revoked);
                drop(c);
                for l in lines {
                    self.log(l);
                }
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
    /// The socket file as bound (device, inode): removed at stop only if unchanged.
    bound: (u64, u64),
    accept: Option<JoinHandle<()>>,
    watch: Option<JoinHandle<()>>,
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
        if options.max_connections == 0 {
            return Err(Error::InvalidArgument(format!(
                "share {}: max_connections must be at least 1",
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
        let bound = std::fs::symlink_metadata(&path)
            .map(|m| (m.st_dev(), m.st_ino()))
            .map_err(|e| Error::io(&path, e))?;
        let (wake, wake_rx) = UnixStream::pair().map_err(|e| Error::io(&path, e))?;
        wake.set_nonblocking(true)
            .map_err(|e| Error::io(&path, e))?;
        let listener_fd = listener.as_raw_fd();
        let shared = Arc::new(Shared {
            pool: pool.clone(),
            tag,
            tensors,
            path,
            options,
            conns: Mutex::new(Conns {
                version: pool.tag_version(tag)?,
                ..Conns::default()
            }),
            idle: Condvar::new(),
            wake,
        });
        let gate_id = pool.shares().add(tag, shared.clone());
        let fail = |e: std::io::Error| {
            pool.shares().remove(gate_id);
            remove_if_ours(&shared.path, bound);
            Error::InvalidState(format!("cannot start the share's threads: {e}"))
        };
        let s = shared.clone();
        let watch = std::thread::Builder::new()
            .name("vmmw-share-watch".into())
            .spawn(move || super::watch::run(&s, wake_rx))
            .map_err(fail)?;
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("vmmw-share".into())
            .spawn(move || accept_loop(listener, &s));
        let accept = match accept {
            Ok(a) => a,
            Err(e) => {
                shared.conns().stopping = true;
                shared.wake_watcher();
                let _ = watch.join();
                return Err(fail(e));
            }
        };
        Ok(Server {
            shared,
            gate_id,
            listener_fd,
            bound,
            accept: Some(accept),
            watch: Some(watch),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Importers counted now: connections open, handshaking or attached,
    /// evicted ones included until they close.
    pub fn attached(&self) -> usize {
        self.shared.conns().open()
    }

    /// Attached importers evicted for leaving their notices unread (or for
    /// sending bytes after their request) that have not closed yet.
    pub fn evicted(&self) -> usize {
        self.shared
            .conns()
            .attached
            .values()
            .filter(|a| a.evicted)
            .count()
    }

    /// The version new importers receive.
    pub fn version(&self) -> u64 {
        self.shared.conns().version
    }

    /// Tell importers the owner wrote new weights in place by other means
    /// than an update (a load of a new checkpoint): the tag's version goes up
    /// by one ([`Pool::publish`]), attached importers see it on their next
    /// call, and new ones get it in the manifest. Returns the new version;
    /// `InvalidState` while an update of the tag runs.
    pub fn publish(&self) -> Result<u64> {
        self.shared.pool.publish(self.shared.tag)
    }

    /// Stop serving. A barrier: once it returns no descriptor leaves this
    /// process through the share (handshakes in flight are cut and waited
    /// for). Attached importers keep their mappings (the memory lives while
    /// they hold it) and see the owner gone; the tag no longer refuses sleep
    /// on their account. The socket path is removed if it is still the
    /// socket this server bound (same device and inode).
    pub fn stop(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        {
            let mut c = self.shared.conns();
            c.stopping = true;
            // Every send of a handshake in flight fails from here on.
            for s in c.handshaking.values() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        self.shared.wake_watcher();
        self.shared.pool.shares().remove(self.gate_id);
        // SAFETY: the listener is owned by the accept thread and still open
        // (the thread is joined below); shutdown wakes its blocking accept.
        unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        let _ = accept.join();
        let mut c = self.shared.conns();
        while !c.handshaking.is_empty() {
            c = self.shared.idle.wait(c).unwrap_or_else(|p| p.into_inner());
        }
        drop(c);
        if let Some(w) = self.watch.take() {
            let _ = w.join();
        }
        let mut c = self.shared.conns();
        for a in c.attached.values() {
            let _ = a.sock.shutdown(std::net::Shutdown::Both);
        }
        c.attached.clear();
        drop(c);
        remove_if_ours(&self.shared.path, self.bound);
        // The last audit lines reach a reader that keeps up; one that
        // stalled costs the stop at most this.
        self.shared.options.log.flush(LOG_FLUSH);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Accepting for Arc<Shared> {
    fn stopping(&self) -> bool {
        self.conns().stopping
    }

    fn admit(&self, sock: UnixStream) -> bool {
        Shared::admit(self, sock)
    }

    fn log(&self, line: String) {
        Shared::log(self, line)
    }

    fn load_note(&self) -> String {
        format!(" ({} connections open)", self.conns().open())
    }
}
