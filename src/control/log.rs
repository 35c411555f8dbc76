//! Where a control server's lines go (one per refusal, failed accept and
//! served sleep or wake), without ever blocking the process it serves.
//!
//! Lines to standard error pass through a bounded queue drained by a thread
//! of their own: a full queue (a flood of refused connections, a stderr pipe
//! nobody reads) drops lines and counts them, and the next line that gets
//! through says how many were dropped.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Lines queued for standard error at most.
pub const QUEUE_LINES: usize = 64;

/// A destination for a control server's log lines.
#[derive(Clone)]
pub struct ControlLog(Arc<Sink>);

enum Sink {
    Discard,
    Stderr {
        prefix: String,
        queue: Mutex<Option<SyncSender<String>>>,
        dropped: AtomicU64,
    },
    Custom(Box<dyn Fn(&str) + Send + Sync>),
}

impl ControlLog {
    /// Lines go to standard error, each prefixed with `prefix`, through the
    /// bounded queue (the writer thread starts with the first line).
    pub fn stderr(prefix: &str) -> ControlLog {
        ControlLog(Arc::new(Sink::Stderr {
            prefix: prefix.to_owned(),
            queue: Mutex::new(None),
            dropped: AtomicU64::new(0),
        }))
    }

    /// Lines are dropped.
    pub fn discard() -> ControlLog {
        ControlLog(Arc::new(Sink::Discard))
    }

    /// Lines go to `f`, called on the server's threads; `f` must not block.
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> ControlLog {
        ControlLog(Arc::new(Sink::Custom(Box::new(f))))
    }

    /// Write one line; never blocks.
    pub fn line(&self, line: &str) {
        match &*self.0 {
            Sink::Discard => {}
            Sink::Custom(f) => f(line),
            Sink::Stderr {
                prefix,
                queue,
                dropped,
            } => {
                let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
                if q.is_none() {
                    *q = start_writer();
                }
                let Some(tx) = q.as_ref() else {
                    dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let lost = dropped.swap(0, Ordering::Relaxed);
                let text = if lost > 0 {
                    format!("{prefix}{line} ({lost} earlier lines dropped: the log queue was full)")
                } else {
                    format!("{prefix}{line}")
                };
                match tx.try_send(text) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => {
                        dropped.fetch_add(lost + 1, Ordering::Relaxed);
                    }
                    Err(TrySendError::Disconnected(_)) => {
                        dropped.fetch_add(lost + 1, Ordering::Relaxed);
                        *q = None;
                    }
                }
            }
        }
    }
}

/// The writer thread and its queue; `None` when no thread can start.
fn start_writer() -> Option<SyncSender<String>> {
    let (tx, rx) = sync_channel::<String>(QUEUE_LINES);
    std::thread::Builder::new()
        .name("vmmw-control-log".into())
        .spawn(move || {
            use std::io::Write;
            for line in rx {
                let _ = writeln!(std::io::stderr(), "{line}");
            }
        })
        .ok()
        .map(|_| tx)
}

impl Default for ControlLog {
    fn default() -> ControlLog {
        ControlLog::stderr("vmmw control: ")
    }
}

impl fmt::Debug for ControlLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match &*self.0 {
            Sink::Discard => "ControlLog(discard)",
            Sink::Stderr { .. } => "ControlLog(stderr)",
            Sink::Custom(_) => "ControlLog(custom)",
        })
    }
}
