//! The control socket's server: a Unix socket serving one [`Controlled`]
//! object, on threads of its own so the process it serves never waits on it.
//!
//! Threads, and what bounds each:
//! - one accepts. The peer's credentials (`SO_PEERCRED`) are checked before
//!   anything is read, by the rule every socket of this library applies
//!   (`share::options::peer_allowed`: this process's user unless others are
//!   listed); a peer not allowed is answered with a refusal and closed.
//!   Connections are counted; past [`ControlOptions::max_connections`] a
//!   peer is refused saying so. Out of descriptors, accepting backs off up to
//!   a second between tries, never spinning.
//! - one per connection, reading requests in turn: each line whole within
//!   [`ControlOptions::request_timeout`] and at most
//!   [`MAX_LINE`] bytes, each answer taken by the
//!   peer within [`ControlOptions::answer_timeout`]. A bad line (not JSON, an
//!   unknown operation or field) is answered with a refusal and the
//!   connection stays usable; a line too long or too slow is answered with a
//!   refusal and the connection closed. Nothing a peer sends changes anything
//!   unless it is a whole, valid request.
//!
//! None of these threads takes an asynchronous signal of the process's
//! (`spawn_without_signals`).

use std::os::fd::AsRawFd;
use std::os::linux::fs::MetadataExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::line::{Line, LineReader};
use super::log::ControlLog;
use super::protocol::{line_of, refusal, refusal_with, Request, MAX_LINE};
use super::target::{answer, Controlled};
use crate::error::{Error, Result, Status};
use crate::share::accept::{accept_loop, remove_if_ours, Accepting};
use crate::share::options::{peer_allowed, peers_accepted};
use crate::share::wire::{self, PeerCred};

/// Connections served at once unless set.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16;
/// How long a whole request may take to arrive unless set.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a peer may take to read an answer unless set.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How a control socket is served.
#[derive(Debug, Clone)]
pub struct ControlOptions {
    /// User ids allowed to connect; `None` allows only this process's user.
    pub allowed_uids: Option<Vec<u32>>,
    /// Group ids whose members may connect too.
    pub allowed_gids: Vec<u32>,
    /// Most connections served at once; past it a peer is refused. At least 1.
    pub max_connections: usize,
    /// A whole request line must arrive within this, counted from the
    /// connection or the previous answer; a silent peer is cut after it.
    pub request_timeout: Duration,
    /// The peer must take each answer within this.
    pub answer_timeout: Duration,
    /// Where refusals and served sleeps and wakes are logged.
    pub log: ControlLog,
}

impl Default for ControlOptions {
    fn default() -> ControlOptions {
        ControlOptions {
            allowed_uids: None,
            allowed_gids: Vec::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            answer_timeout: DEFAULT_ANSWER_TIMEOUT,
            log: ControlLog::default(),
        }
    }
}

#[derive(Default)]
struct Conns {
    open: std::collections::HashMap<u64, Arc<UnixStream>>,
    next_id: u64,
    stopping: bool,
}

struct Shared {
    target: Arc<dyn Controlled>,
    path: PathBuf,
    options: ControlOptions,
    conns: Mutex<Conns>,
    /// Signalled when the last connection ends.
    idle: Condvar,
    /// Requests answered, refusals included.
    answered: AtomicU64,
    /// Connections refused at accept.
    refused: AtomicU64,
}

impl Shared {
    fn conns(&self) -> MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn log(&self, line: String) {
        self.options
            .log
            .line(&format!("{}: {line}", self.path.display()));
    }

    /// Answer `sock` with a refusal without waiting for it, then close it.
    fn refuse_now(&self, sock: UnixStream, status: Status, why: &str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let _ = sock.set_nonblocking(true);
        let _ = wire::send_all(&sock, &line_of(&refusal_with(status, why)), None);
    }

    /// Check a new connection and start serving it. False once stopping.
    fn admit(self: &Arc<Self>, sock: UnixStream) -> bool {
        let cred = match wire::peer_cred(&sock) {
            Ok(c) => c,
            Err(e) => {
                self.log(format!("refused a peer: credentials unavailable: {e}"));
                self.refuse_now(
                    sock,
                    Status::ShareRefused,
                    &format!("peer credentials unavailable: {e}"),
                );
                return true;
            }
        };
        let uids = self.options.allowed_uids.as_deref();
        let gids = &self.options.allowed_gids;
        if !peer_allowed(uids, gids, &cred, &sock) {
            self.log(format!(
                "refused pid={} uid={} gid={}: not allowed",
                cred.pid, cred.uid, cred.gid
            ));
            self.refuse_now(
                sock,
                Status::ShareRefused,
                &format!(
                    "peer pid {} with uid {} is not allowed (its group {} is not listed either); \
                     this control socket accepts {}",
                    cred.pid,
                    cred.uid,
                    cred.gid,
                    peers_accepted(uids, gids)
                ),
            );
            return true;
        }
        let sock = Arc::new(sock);
        let id = {
            let mut c = self.conns();
            if c.stopping {
                return false;
            }
            let open = c.open.len();
            if open >= self.options.max_connections {
                drop(c);
                self.log(format!(
                    "refused pid={} uid={}: {open} connections open, at most {}",
                    cred.pid, cred.uid, self.options.max_connections
                ));
                if let Ok(s) = Arc::try_unwrap(sock) {
                    self.refuse_now(
                        s,
                        Status::ShareRefused,
                        &format!(
                            "too many connections: {open} open, this control socket serves at most {}",
                            self.options.max_connections
                        ),
                    );
                }
                return true;
            }
            c.next_id += 1;
            let id = c.next_id;
            c.open.insert(id, sock.clone());
            id
        };
        let s = self.clone();
        let started = std::thread::Builder::new()
            .name("vmmw-control-conn".into())
            .spawn(move || {
                s.serve(&sock, cred);
                s.end(id);
            });
        if let Err(e) = started {
            self.log(format!(
                "refused pid={}: cannot start a thread: {e}",
                cred.pid
            ));
            if let Some(s) = self.end(id).and_then(|s| Arc::try_unwrap(s).ok()) {
                self.refuse_now(
                    s,
                    Status::InvalidState,
                    &format!("the process cannot start a thread: {e}"),
                );
            }
        }
        true
    }

    /// Stop counting connection `id`; returns its socket when it was counted.
    fn end(&self, id: u64) -> Option<Arc<UnixStream>> {
        let mut c = self.conns();
        let s = c.open.remove(&id);
        if c.open.is_empty() {
            self.idle.notify_all();
        }
        s
    }

    /// Serve requests on one connection until it closes, breaks a bound or
    /// the server stops.
    fn serve(&self, sock: &UnixStream, cred: PeerCred) {
        let mut reader = LineReader::new();
        loop {
            let deadline = Instant::now() + self.options.request_timeout;
            let (answer, close) = match reader.read(sock, MAX_LINE, deadline) {
                Ok(Line::Got(line)) => (self.request(&line, cred), false),
                Ok(Line::Closed) | Err(_) => return,
                Ok(Line::TooLong) => (
                    refusal_with(
                        Status::InvalidArgument,
                        &format!(
                            "a request is one JSON object on one line of at most {MAX_LINE} bytes; \
                             closing this connection"
                        ),
                    ),
                    true,
                ),
                Ok(Line::TimedOut) => (
                    refusal_with(
                        Status::Io,
                        &format!(
                            "no complete request within {:.1} s; closing this connection",
                            self.options.request_timeout.as_secs_f64()
                        ),
                    ),
                    true,
                ),
            };
            self.answered.fetch_add(1, Ordering::Relaxed);
            let sent = wire::send_all(
                sock,
                &line_of(&answer),
                Some(Instant::now() + self.options.answer_timeout),
            );
            if close || sent.is_err() || self.conns().stopping {
                return;
            }
        }
    }

    fn request(&self, line: &[u8], cred: PeerCred) -> Value {
        let request = match Request::parse(line) {
            Ok(r) => r,
            Err(e) => return refusal(&e),
        };
        let a = answer(&*self.target, &request);
        if !matches!(request, Request::Status {}) {
            let outcome = if a["ok"] == Value::Bool(true) {
                format!(
                    "{:.3} s, {} bytes",
                    a["seconds"].as_f64().unwrap_or(0.0),
                    a["bytes"].as_u64().unwrap_or(0)
                )
            } else {
                format!(
                    "refused: {} {}",
                    a["code"].as_str().unwrap_or("?"),
                    a["error"].as_str().unwrap_or("")
                )
            };
            let op = match request {
                Request::Wake { .. } => "wake",
                _ => "sleep",
            };
            self.log(format!(
                "{op} for pid={} uid={}: {outcome}",
                cred.pid, cred.uid
            ));
        }
        a
    }
}

/// A running control socket. Dropping it stops serving (as [`Server::stop`]).
pub struct Server {
    shared: Arc<Shared>,
    listener_fd: i32,
    /// The socket file as bound (device, inode): removed only if unchanged.
    bound: (u64, u64),
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Serve `target` on a new Unix socket at `path` (which must not exist),
    /// readable and writable by its owner only; the peer check applies on
    /// top. Returns once the socket accepts.
    pub fn start(
        path: impl AsRef<Path>,
        target: Arc<dyn Controlled>,
        options: ControlOptions,
    ) -> Result<Server> {
        let path = path.as_ref().to_path_buf();
        if options.max_connections == 0 {
            return Err(Error::InvalidArgument(format!(
                "control socket {}: max_connections must be at least 1",
                path.display()
            )));
        }
        if options.request_timeout.is_zero() || options.answer_timeout.is_zero() {
            return Err(Error::InvalidArgument(format!(
                "control socket {}: the request and answer timeouts must be positive",
                path.display()
            )));
        }
        let listener = UnixListener::bind(&path).map_err(|e| Error::io(&path, e))?;
        let meta = std::fs::symlink_metadata(&path).map_err(|e| Error::io(&path, e))?;
        let bound = (meta.st_dev(), meta.st_ino());
        if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)) {
            remove_if_ours(&path, bound);
            return Err(Error::io(&path, e));
        }
        let listener_fd = listener.as_raw_fd();
        let shared = Arc::new(Shared {
            target,
            path,
            options,
            conns: Mutex::new(Conns::default()),
            idle: Condvar::new(),
            answered: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let s = shared.clone();
        let accept = spawn_without_signals("vmmw-control", move || accept_loop(listener, &s));
        let accept = match accept {
            Ok(a) => a,
            Err(e) => {
                remove_if_ours(&shared.path, bound);
                return Err(Error::InvalidState(format!(
                    "control socket {}: cannot start its thread: {e}",
                    shared.path.display()
                )));
            }
        };
        Ok(Server {
            shared,
            listener_fd,
            bound,
            accept: Some(accept),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.shared.conns().open.len()
    }

    /// Requests answered so far (refusals of bad requests included).
    pub fn answered(&self) -> u64 {
        self.shared.answered.load(Ordering::Relaxed)
    }

    /// Connections refused at accept so far (peer not allowed, too many).
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Remove the socket file if it is still the one bound here, so no new
    /// peer can connect; connections open are served on. For a process's
    /// exit, where the server itself is never dropped.
    pub fn remove_socket_file(&self) {
        remove_if_ours(&self.shared.path, self.bound);
    }

    /// Stop serving: no connection is accepted from here on, open ones are
    /// cut (a sleep or wake running finishes first, and this waits for it),
    /// and the socket file is removed if it is still the one bound here.
    pub fn stop(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        {
            let mut c = self.shared.conns();
            c.stopping = true;
            for s in c.open.values() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        // SAFETY: the listener is owned by the accept thread and still open
        // (the thread is joined below); shutdown wakes its blocking accept.
        unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        let _ = accept.join();
        let mut c = self.shared.conns();
        while !c.open.is_empty() {
            c = self.shared.idle.wait(c).unwrap_or_else(|p| p.into_inner());
        }
        drop(c);
        remove_if_ours(&self.shared.path, self.bound);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Start a thread that takes none of the process's asynchronous signals.
/// The server's threads (the connection threads and the log's writer are
/// started from this one and inherit its mask) live inside a program we did
/// not write: one that blocks a signal in all of its threads and takes it
/// with `sigwait` or a `signalfd` must get it, never see it delivered to a
/// thread of ours (where SIGTERM's or SIGUSR1's default action ends the
/// process). Faults (SIGSEGV, SIGBUS, ...) stay unblocked: a thread's own
/// fault reaches the program's handler as ever.
fn spawn_without_signals<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<JoinHandle<T>> {
    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigfillset initialises `all`; sigdelset only edits it;
    // pthread_sigmask reads `all` and initialises `old` with this thread's
    // mask, put back below once the new thread has inherited the blocked one.
    let blocked = unsafe {
        libc::sigfillset(all.as_mut_ptr());
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(all.as_mut_ptr(), sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, all.as_ptr(), old.as_mut_ptr()) == 0
    };
    let r = std::thread::Builder::new().name(name.into()).spawn(f);
    if blocked {
        // SAFETY: `old` was initialised by the successful call above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut()) };
    }
    r
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
}
