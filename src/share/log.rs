//! Where a server's audit lines (one per attach, refusal, eviction and
//! detach) and warnings (descriptor limit reached) go, without ever making
//! the server wait for them.
//!
//! A serving thread that writes to standard error itself blocks when nobody
//! reads it (a supervisor that does not drain the pipe): once the pipe is
//! full every thread that logs waits on the stderr lock, the accept loop
//! included, and the server stops serving. So [`LogSink::stderr`] (the
//! default) and [`LogSink::queued`] hand each line to a bounded queue that
//! one writer thread empties; when the queue is full the line is dropped and
//! counted, and the writer writes `vmmw: N log lines dropped` before the
//! next line it gets through. A server's threads never wait on the log.
//!
//! Other servers of the library (the control channel) use the same sink:
//! `LogSink::stderr("vmmw ctl")` for their own prefix.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Lines a queued sink holds before it drops: a few seconds of a busy
/// server's audit lines, at most a few hundred KiB.
pub const QUEUE_LINES: usize = 1024;

/// A destination for a server's log lines; cheap to clone (clones share the
/// destination). The default, [`LogSink::stderr`]`("vmmw share")`, never
/// blocks the server.
#[derive(Clone)]
pub struct LogSink(Arc<dyn Fn(&str) + Send + Sync>, Option<Arc<Queue>>);

impl LogSink {
    /// Lines go to `f`, called on the server's threads with no lock held
    /// that the caller could need. `f` must not block: a blocking `f` stalls
    /// the thread that logs (the accept loop among them). For a writer that
    /// may block, use [`LogSink::queued`].
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> LogSink {
        LogSink(Arc::new(f), None)
    }

    /// Lines are dropped.
    pub fn discard() -> LogSink {
        LogSink::new(|_| {})
    }

    /// Lines go to standard error as `PREFIX: line`, through the process's
    /// one stderr writer thread (shared by every sink made here) and its
    /// bounded queue: never blocking, dropping with a count when standard
    /// error is not read.
    pub fn stderr(prefix: &str) -> LogSink {
        static STDERR: OnceLock<Arc<Queue>> = OnceLock::new();
        let q = STDERR
            .get_or_init(|| {
                Queue::start(QUEUE_LINES, |l: &str| {
                    let mut e = std::io::stderr().lock();
                    let _ = e.write_all(l.as_bytes());
                    let _ = e.write_all(b"\n");
                })
            })
            .clone();
        let prefix = prefix.to_owned();
        let sink = q.clone();
        LogSink(
            Arc::new(move |l: &str| sink.push(format!("{prefix}: {l}"))),
            Some(q),
        )
    }

    /// Lines go to `f` on a writer thread of this sink's own, through a
    /// queue of `capacity` lines: the caller never waits for `f`; a line
    /// that finds the queue full is dropped and counted, and `f` gets
    /// `N log lines dropped` before the next line that gets through.
    pub fn queued(capacity: usize, f: impl Fn(&str) + Send + 'static) -> LogSink {
        let q = Queue::start(capacity.max(1), f);
        let sink = q.clone();
        LogSink(Arc::new(move |l: &str| sink.push(l.to_owned())), Some(q))
    }

    /// Write one line (for a queued sink: hand it on, or drop it when full).
    pub fn line(&self, line: &str) {
        (self.0)(line)
    }

    /// Lines a queued sink dropped because its queue was full, since it
    /// started (for [`LogSink::stderr`]: every stderr sink of the process);
    /// 0 for the others.
    pub fn dropped(&self) -> u64 {
        self.1
            .as_ref()
            .map_or(0, |q| q.counts.dropped_total.load(Ordering::Relaxed))
    }

    /// Wait up to `timeout` for a queued sink's writer to write every line
    /// handed to it so far; true when it did (always for an unqueued sink).
    /// For a server stopping: what it logged last reaches its reader, and a
    /// stalled reader costs at most `timeout`.
    pub fn flush(&self, timeout: Duration) -> bool {
        let Some(q) = &self.1 else { return true };
        let end = Instant::now() + timeout;
        while q.counts.pending.load(Ordering::Acquire) > 0 {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

impl Default for LogSink {
    fn default() -> LogSink {
        LogSink::stderr("vmmw share")
    }
}

impl fmt::Debug for LogSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.1.is_some() {
            "LogSink(queued)"
        } else {
            "LogSink"
        })
    }
}

/// A bounded queue of lines and the thread that writes them.
struct Queue {
    /// None when the writer thread could not start: every line is dropped.
    tx: Option<SyncSender<String>>,
    counts: Arc<Counts>,
}

/// What the callers and the writer thread share.
#[derive(Default)]
struct Counts {
    /// Dropped since the writer last said so.
    dropped_unsaid: AtomicU64,
    dropped_total: AtomicU64,
    /// Handed to the queue and not yet written.
    pending: AtomicUsize,
}

impl Queue {
    fn start(capacity: usize, write: impl Fn(&str) + Send + 'static) -> Arc<Queue> {
        let (tx, rx) = sync_channel::<String>(capacity);
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let started = std::thread::Builder::new()
            .name("vmmw-log".into())
            .spawn(move || c.drain(rx, write));
        Arc::new(Queue {
            tx: started.is_ok().then_some(tx),
            counts,
        })
    }

    /// Hand `line` to the writer, or drop and count it; never waits.
    fn push(&self, line: String) {
        let c = &self.counts;
        let sent = self.tx.as_ref().is_some_and(|tx| {
            c.pending.fetch_add(1, Ordering::AcqRel);
            match tx.try_send(line) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    c.pending.fetch_sub(1, Ordering::AcqRel);
                    false
                }
            }
        });
        if !sent {
            c.dropped_unsaid.fetch_add(1, Ordering::Relaxed);
            c.dropped_total.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Counts {
    /// The writer thread: every line in turn, each preceded by the count of
    /// lines dropped since the last one written, and the count said as soon
    /// as the queue runs dry too.
    fn drain(&self, rx: Receiver<String>, write: impl Fn(&str)) {
        let say_dropped = || {
            let n = self.dropped_unsaid.swap(0, Ordering::Relaxed);
            if n > 0 {
                write(&format!(
                    "vmmw: {n} log line{} dropped (the log's reader fell behind)",
                    if n == 1 { "" } else { "s" }
                ));
            }
        };
        while let Ok(line) = rx.recv() {
            say_dropped();
            write(&line);
            self.pending.fetch_sub(1, Ordering::AcqRel);
            if self.pending.load(Ordering::Acquire) == 0 {
                say_dropped();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::sync::Mutex;

    #[test]
    fn a_stalled_writer_never_blocks_the_caller_and_drops_are_counted() {
        let (gate_tx, gate_rx) = channel::<()>();
        let got = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = got.clone();
        let gate = Mutex::new(gate_rx);
        let sink = LogSink::queued(4, move |l| {
            // Stalls on the first line until the test opens the gate.
            if seen.lock().unwrap().is_empty() {
                let _ = gate.lock().unwrap().recv();
            }
            seen.lock().unwrap().push(l.to_owned());
        });
        let t0 = Instant::now();
        for i in 0..1000 {
            sink.line(&format!("line {i}"));
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "logging waited on the writer"
        );
        // The writer holds one line, the queue four; the rest were dropped.
        assert!(sink.dropped() >= 1000 - 5, "dropped {}", sink.dropped());
        assert!(
            !sink.flush(Duration::from_millis(20)),
            "flushed while stalled"
        );
        gate_tx.send(()).unwrap();
        assert!(sink.flush(Duration::from_secs(5)));
        let lines = got.lock().unwrap().clone();
        assert_eq!(lines[0], "line 0");
        let note = lines
            .iter()
            .find(|l| l.contains("dropped"))
            .expect("a dropped-lines note");
        let n: u64 = note.split(' ').nth(1).unwrap().parse().unwrap();
        assert_eq!(n, sink.dropped(), "{lines:?}");
        assert_eq!(lines.len() as u64 + n - 1, 1000, "{lines:?}");
    }

    #[test]
    fn lines_arrive_in_order_when_the_writer_keeps_up() {
        let got = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = got.clone();
        let sink = LogSink::queued(QUEUE_LINES, move |l| {
            seen.lock().unwrap().push(l.to_owned())
        });
        for i in 0..100 {
            sink.line(&format!("{i}"));
            assert!(sink.flush(Duration::from_secs(5)));
        }
        let want: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        assert_eq!(*got.lock().unwrap(), want);
        assert_eq!(sink.dropped(), 0);
    }
}
