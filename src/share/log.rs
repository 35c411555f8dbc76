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
//! counted, and the writer writes `vmmw: N log lines dropped` where they
//! were lost: between the lines written before and after them, or once the
//! queue runs dry. A server's threads never wait on the log.
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
    /// `vmmw: N log lines dropped` where they were lost (see the module).
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
    tx: Option<SyncSender<Queued>>,
    counts: Arc<Counts>,
}

/// A line, and how many lines had been dropped before it was queued: the
/// writer says how many were lost exactly where they were lost.
struct Queued {
    dropped_before: u64,
    line: String,
}

/// What the callers and the writer thread share.
#[derive(Default)]
struct Counts {
    dropped_total: AtomicU64,
    /// Handed to the queue and not yet written.
    pending: AtomicUsize,
}

impl Queue {
    fn start(capacity: usize, write: impl Fn(&str) + Send + 'static) -> Arc<Queue> {
        let (tx, rx) = sync_channel::<Queued>(capacity);
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let started = std::thread::Builder::new()
            .name("vmmw-log".into())
            .spawn(move || {
                block_signals();
                c.drain(rx, write)
            });
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
            let q = Queued {
                dropped_before: c.dropped_total.load(Ordering::Acquire),
                line,
            };
            match tx.try_send(q) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    c.pending.fetch_sub(1, Ordering::AcqRel);
                    false
                }
            }
        });
        if !sent {
            c.dropped_total.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Counts {
    /// The writer thread: every line in turn; where lines were dropped
    /// between two written ones, a note of how many, and the count of the
    /// latest drops as soon as the queue runs dry.
    fn drain(&self, rx: Receiver<Queued>, write: impl Fn(&str)) {
        let mut said = 0u64;
        let say = |upto: u64, said: &mut u64| {
            if upto > *said {
                let n = upto - *said;
                write(&format!(
                    "vmmw: {n} log line{} dropped (the log's reader fell behind)",
                    if n == 1 { "" } else { "s" }
                ));
                *said = upto;
            }
        };
        while let Ok(q) = rx.recv() {
            say(q.dropped_before, &mut said);
            write(&q.line);
            // The last line queued: the drops since are said now, before a
            // flush sees the queue empty.
            if self.pending.load(Ordering::Acquire) == 1 {
                say(self.dropped_total.load(Ordering::Acquire), &mut said);
            }
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Block every signal on the calling thread (the writer): a thread the
/// library starts on its own must not take a signal the application waits
/// for on a thread of its choosing (`vmmw serve` takes SIGTERM with
/// `sigwait`; with the default action here, it would end the process).
fn block_signals() {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigfillset initialises the whole set it is given; the set is
    // then only read, and pthread_sigmask changes this thread's mask alone.
    unsafe {
        if libc::sigfillset(set.as_mut_ptr()) == 0 {
            libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut());
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
        assert_eq!(lines[0], "line 0", "{lines:?}");
        // Notes where lines were lost, their counts adding up to the drops;
        // the written lines in the order they were logged.
        let mut noted = 0;
        let mut written = Vec::new();
        for l in &lines {
            match l.strip_prefix("vmmw: ") {
                Some(note) => noted += note.split(' ').next().unwrap().parse::<u64>().unwrap(),
                None => written.push(l[5..].parse::<u64>().unwrap()),
            }
        }
        assert_eq!(noted, sink.dropped(), "{lines:?}");
        assert!(written.windows(2).all(|w| w[0] < w[1]), "{lines:?}");
        assert_eq!(written.len() as u64 + noted, 1000, "{lines:?}");
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
