//! The accept loop every Unix socket server of this library runs (the share
//! owner's and the control socket's): connections handed to the server one
//! by one, and a listener that runs out of descriptors backs off instead of
//! spinning.

use std::os::linux::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// Longest wait between accepts while the process has no descriptor left.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What the accept loop serves.
pub(crate) trait Accepting {
    /// True once the server is stopping: the loop ends.
    fn stopping(&self) -> bool;
    /// Take one accepted connection; false ends the loop.
    fn admit(&self, sock: UnixStream) -> bool;
    /// One line of the server's log.
    fn log(&self, line: String);
    /// What the log line about a failing accept adds (say, the connections
    /// open); empty by default.
    fn load_note(&self) -> String {
        String::new()
    }
}

/// Accept connections on `listener` until `server` stops or refuses one.
pub(crate) fn accept_loop(listener: UnixListener, server: &impl Accepting) {
    let mut backoff = Duration::ZERO;
    let mut failed = 0u64;
    loop {
        match listener.accept() {
            Ok((sock, _)) => {
                if failed > 0 {
                    server.log(format!(
                        "accepting again after {failed} failed accepts (longest wait {backoff:?})"
                    ));
                    (backoff, failed) = (Duration::ZERO, 0);
                }
                if !server.admit(sock) {
                    return;
                }
            }
            Err(_) if server.stopping() => return,
            Err(e) if transient(&e) => {}
            Err(e) => {
                // Out of descriptors (EMFILE/ENFILE) or memory: the pending
                // connection stays queued; wait, never spin.
                if failed == 0 {
                    server.log(format!(
                        "cannot accept: {e}; retrying with a back-off of up to {MAX_BACKOFF:?}{}",
                        server.load_note()
                    ));
                }
                failed += 1;
                backoff = (backoff * 2).clamp(Duration::from_millis(10), MAX_BACKOFF);
                let until = Instant::now() + backoff;
                while Instant::now() < until && !server.stopping() {
                    std::thread::sleep(Duration::from_millis(10).min(backoff));
                }
            }
        }
    }
}

/// Errors of `accept` that concern one connection, not the listener.
fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::ECONNABORTED | libc::EPROTO)
    )
}

/// Remove the socket file at `path` only if it is the one bound (`bound`:
/// device and inode), not one another server bound there since.
pub(crate) fn remove_if_ours(path: &Path, bound: (u64, u64)) {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if (m.st_dev(), m.st_ino()) == bound {
            let _ = std::fs::remove_file(path);
        }
    }
}
