//! Where a server's audit lines (one per attach, refusal, eviction and
//! detach) and warnings (descriptor limit reached) go.

use std::fmt;
use std::sync::Arc;

/// A destination for a server's log lines. The default writes each line to
/// standard error, prefixed `vmmw share: `.
#[derive(Clone)]
pub struct LogSink(Arc<dyn Fn(&str) + Send + Sync>);

impl LogSink {
    /// Lines go to `f` (called from the server's threads, never with a lock held
    /// that the caller could need).
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> LogSink {
        LogSink(Arc::new(f))
    }

    /// Lines are dropped.
    pub fn discard() -> LogSink {
        LogSink::new(|_| {})
    }

    /// Write one line.
    pub fn line(&self, line: &str) {
        (self.0)(line)
    }
}

impl Default for LogSink {
    fn default() -> LogSink {
        LogSink::new(|l| eprintln!("vmmw share: {l}"))
    }
}

impl fmt::Debug for LogSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LogSink")
    }
}
