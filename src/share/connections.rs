//! The owner's connections: what the accept loop, each handshake and the
//! watcher share ([`Shared`]), the importers attached ([`Attached`]) and the
//! counts that bound them ([`Conns`]).

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::manifest::Hello;
use super::options::ServeOptions;
use super::wire::{self, Notice, PeerCred};
use crate::loader::registry::Destination;
use crate::pool::Pool;
use crate::tag::TagId;

/// An attached importer, as the owner holds it.
#[derive(Debug)]
pub(super) struct Attached {
    pub(super) sock: Arc<UnixStream>,
    pub(super) cred: PeerCred,
    /// Its socket buffer: notices stop at half of it.
    pub(super) send_buffer: usize,
    /// Revoked or evicted: no notice is sent any more.
    pub(super) done: bool,
    /// Evicted (notices unread, or bytes sent after the request).
    pub(super) evicted: bool,
    /// False once it broke the protocol: then only its hang-up is watched.
    pub(super) reading: bool,
}

#[derive(Debug, Default)]
pub(super) struct Conns {
    /// Connections in their handshake, by id.
    pub(super) handshaking: HashMap<u64, Arc<UnixStream>>,
    /// Importers past their handshake, by id.
    pub(super) attached: HashMap<u64, Attached>,
    /// Handshaking connections that a revoke reached before they were ready.
    pub(super) revoke_pending: Vec<u64>,
    pub(super) next_id: u64,
    pub(super) version: u64,
    /// Set by `stop`: nothing is admitted or attached after it.
    pub(super) stopping: bool,
}

impl Conns {
    pub(super) fn open(&self) -> usize {
        self.handshaking.len() + self.attached.len()
    }

    /// Send `n` to every attached importer that still takes notices; returns
    /// the log lines (written once the lock is released).
    pub(super) fn notify_all(&mut self, n: Notice) -> Vec<String> {
        let mut lines = Vec::new();
        for a in self.attached.values_mut().filter(|a| !a.done) {
            let unread = wire::unread_bytes(&a.sock).unwrap_or(usize::MAX);
            let notice = match n {
                // A revoke always fits: earlier notices stopped at half the buffer.
                Notice::Revoked => n,
                _ if unread > a.send_buffer / 2 => Notice::Evicted,
                _ => n,
            };
            if notice == Notice::Evicted {
                a.evicted = true;
                lines.push(format!(
                    "evicted pid={} uid={}: {unread} bytes of notices unread (at most {} kept per importer); \
                     its next call fails with VMMW_SHARE_REVOKED, it stays counted until it detaches",
                    a.cred.pid,
                    a.cred.uid,
                    a.send_buffer / 2
                ));
            }
            // A failed send means the importer is gone (the watcher removes it)
            // or its buffer is full, which the bound above keeps from happening.
            let _ = wire::send_notice(&a.sock, notice);
            a.done |= notice != n || n == Notice::Revoked;
        }
        if n == Notice::Revoked {
            let ids: Vec<u64> = self.handshaking.keys().copied().collect();
            self.revoke_pending.extend(ids);
        }
        lines
    }
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) pool: Arc<Pool>,
    pub(super) tag: TagId,
    pub(super) tensors: Vec<Destination>,
    pub(super) path: PathBuf,
    pub(super) options: ServeOptions,
    pub(super) conns: Mutex<Conns>,
    /// Signalled when the last handshake ends.
    pub(super) idle: Condvar,
    /// Written to wake the watcher (a new importer, or stop).
    pub(super) wake: UnixStream,
}

impl Shared {
    pub(super) fn conns(&self) -> MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn log(&self, line: String) {
        self.options
            .log
            .line(&format!("{}: {line}", self.path.display()));
    }

    pub(super) fn wake_watcher(&self) {
        // Non-blocking: a full wake socket already holds a wake.
        let _ = wire::send_all(&self.wake, b"w", None);
    }

    /// Answer a connection with a refusal without waiting for it, then close it.
    pub(super) fn refuse_now(sock: UnixStream, reason: String) {
        let _ = sock.set_nonblocking(true);
        if let Ok(b) = wire::hello_bytes(&Hello::Refused(reason)) {
            let _ = wire::send_all(&sock, &b, None);
        }
    }

    /// Stop counting connection `id` as handshaking; returns its socket
    /// when it was still counted.
    pub(super) fn end_handshake(&self, id: u64) -> Option<Arc<UnixStream>> {
        let mut c = self.conns();
        let sock = c.handshaking.remove(&id);
        c.revoke_pending.retain(|&p| p != id);
        if c.handshaking.is_empty() {
            self.idle.notify_all();
        }
        sock
    }

    /// Register a finished handshake as attached, with the notices it missed
    /// and the end of the handshake. False when stopping (nothing is sent).
    pub(super) fn attach(&self, id: u64, sock: Arc<UnixStream>, cred: PeerCred, sent: u64) -> bool {
        let mut c = self.conns();
        if c.stopping {
            return false;
        }
        let mut done = false;
        if c.version != sent {
            let _ = wire::send_notice(&sock, Notice::Version(c.version));
        }
        if let Some(pos) = c.revoke_pending.iter().position(|&p| p == id) {
            c.revoke_pending.swap_remove(pos);
            let _ = wire::send_notice(&sock, Notice::Revoked);
            done = true;
        }
        // Registered before the importer's attach returns, so every later
        // notice reaches it.
        let _ = wire::send_notice(&sock, Notice::Ready);
        // Counted once: moved from the handshakes to the attached.
        c.handshaking.remove(&id);
        if c.handshaking.is_empty() {
            self.idle.notify_all();
        }
        c.attached.insert(
            id,
            Attached {
                send_buffer: wire::send_buffer(&sock).unwrap_or(0),
                sock,
                cred,
                done,
                evicted: false,
                reading: true,
            },
        );
        drop(c);
        self.wake_watcher();
        true
    }
}
