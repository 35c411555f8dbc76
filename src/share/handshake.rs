//! One importer's handshake on the owner's side, under one deadline: read its
//! request, export the tag's memory under the pool's share gate (so the tag
//! cannot sleep meanwhile), send the manifest and the descriptors, and
//! register it as attached. Each attach and refusal writes one audit line.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::connections::Shared;
use super::export::export;
use super::manifest::Hello;
use super::wire::{self, PeerCred};
use crate::driver::BackendKind;

/// Longest wait to send a refusal.
const REFUSAL_GRACE: Duration = Duration::from_millis(200);

impl Shared {
    /// The handshake of connection `id` from a peer already admitted.
    pub(super) fn handshake(
        &self,
        id: u64,
        sock: Arc<UnixStream>,
        cred: PeerCred,
        deadline: Instant,
    ) {
        let who = format!("pid={} uid={} gid={}", cred.pid, cred.uid, cred.gid);
        let refuse = |access: &str, reason: String| {
            // Uncounted before the importer can read why: a refused peer is
            // never seen as attached. A refusal carries no descriptor, so it
            // may leave after `stop` returned.
            self.end_handshake(id);
            self.log(format!("refused {who} access={access}: {reason}"));
            // A refusal is short and goes out even once the deadline has
            // passed (a silent peer is told why it was cut), within a grace.
            let grace = Some(Instant::now() + REFUSAL_GRACE);
            let _ = wire::write_hello(&sock, &Hello::Refused(reason), grace);
        };
        let mut ask = [0u8; 1];
        // Descriptors an importer sends are closed when `stray` drops.
        let mut stray = Vec::new();
        let asked = wire::recv_exact(&sock, &mut ask, &mut stray, Some(deadline));
        let access = match (&asked, ask[0]) {
            (Ok(()), b'r') => "read",
            (Ok(()), b'w') if self.options.allow_write => "write",
            (Ok(()), b'w') => {
                return refuse(
                    "write",
                    "read-write access asked, the owner shares read-only".into(),
                )
            }
            (Err(e), _) => {
                return refuse("none", format!("no access request (r or w) received: {e}"))
            }
            (Ok(()), b) => {
                return refuse(
                    "none",
                    format!("no valid access request (r or w) received (byte {b:#04x})"),
                )
            }
        };
        // Export under the gate: the tag is wholly awake for this attach, and
        // a sleep waits until the connection is counted (it is, as handshaking).
        let (exported, version) = {
            let _gate = self.pool.shares().lock();
            let version = self.conns().version;
            match export(
                &self.pool,
                self.tag,
                &self.tensors,
                version,
                self.options.allow_write,
            ) {
                Ok(x) => (x, version),
                Err(e) => return refuse(access, e.to_string()),
            }
        };
        let chunks = exported.manifest.chunks.len();
        let bytes: u64 = exported.manifest.chunks.iter().sum();
        let tensors = exported.manifest.tensors.len();
        let sent = wire::write_hello(&sock, &Hello::Manifest(exported.manifest), Some(deadline))
            .and_then(|()| {
                let fds: Vec<_> = exported.fds.iter().map(|f| f.as_fd()).collect();
                wire::send_fds(&sock, &fds, Some(deadline))
            });
        // The importer has its own references now (or failed); ours close here.
        drop(exported.fds);
        let descriptors = match (self.pool.driver().kind(), self.options.allow_write) {
            (BackendKind::Host, false) => "sealed read-only memfds",
            (BackendKind::Host, true) => "read-write memfds",
            // A CUDA handle carries no access: the importer sets its own.
            (BackendKind::Cuda, _) => "CUDA handles (access set by the importer)",
        };
        match sent {
            Err(e) => self.log(format!(
                "handshake of {who} access={access} cut after the manifest: {e}"
            )),
            Ok(()) if self.attach(id, sock, cred, version) => self.log(format!(
                "attach {who} access={access}: version {version}, {tensors} tensors, \
                 {chunks} chunks of {bytes} bytes as {descriptors}"
            )),
            Ok(()) => self.log(format!("handshake of {who} ended: the server stopped")),
        }
    }
}
