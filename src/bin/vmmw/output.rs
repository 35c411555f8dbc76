//! What `vmmw` writes: stdout lines that end the process quietly when their
//! reader has gone away, names escaped before they reach a terminal, stdout
//! kept for one JSON document under `--json`, and byte progress drawn as a bar
//! only on a terminal.

use std::fmt;
use std::io::{ErrorKind, IsTerminal, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use crate::escape::{escape_controls, escape_name};
use crate::exit::{CliError, CliResult};

/// `println!` for the command's output on stdout, through [`write_stdout`].
macro_rules! outln {
    () => {
        $crate::output::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for the command's output on stdout, through [`write_stdout`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!($($arg)*))
    };
}

/// Write to stdout. When its reader has gone away (`vmmw plan ck | head -1`)
/// the process ends at once with exit code 0 and nothing on stderr, as `cat`
/// does: what is left to print has no reader. Any other write error (a full
/// disk) ends it with the failure code and a message.
pub fn write_stdout(args: fmt::Arguments<'_>) {
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("vmmw: error: writing to stdout: {e}");
        std::process::exit(crate::exit::FAILURE.into());
    }
}

/// While alive, fd 1 points at stderr, so that every human line goes there;
/// [`StdoutToStderr::finish`] restores fd 1 and writes the JSON document to it.
pub struct StdoutToStderr {
    saved: Option<OwnedFd>,
}

impl StdoutToStderr {
    /// Redirect fd 1 to fd 2 (nothing happens when that fails: the JSON then
    /// follows the human lines on stdout, and the failure is reported).
    pub fn new() -> StdoutToStderr {
        let _ = std::io::stdout().flush();
        // SAFETY: dup has no memory-safety preconditions; a valid result is a
        // new descriptor we own.
        let fd = unsafe { libc::dup(1) };
        if fd < 0 {
            eprintln!("vmmw: warning: could not save stdout; JSON follows the other output");
            return StdoutToStderr { saved: None };
        }
        // SAFETY: `fd` was just returned by dup and nothing else owns it.
        let saved = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: dup2 on two open descriptors has no memory-safety preconditions.
        if unsafe { libc::dup2(2, 1) } < 0 {
            eprintln!("vmmw: warning: could not point stdout at stderr");
        }
        StdoutToStderr { saved: Some(saved) }
    }

    fn restore(&mut self) {
        let _ = std::io::stdout().flush();
        if let Some(saved) = self.saved.take() {
            // SAFETY: both descriptors are open; `saved` is closed when dropped after.
            unsafe { libc::dup2(saved.as_raw_fd(), 1) };
        }
    }

    /// Restore stdout and write `doc` to it as pretty JSON and a newline.
    pub fn finish(mut self, doc: &serde_json::Value) {
        self.restore();
        let text = serde_json::to_string_pretty(doc).expect("a JSON value serializes");
        write_stdout(format_args!("{text}\n"));
        let _ = std::io::stdout().flush();
    }
}

impl Drop for StdoutToStderr {
    fn drop(&mut self) {
        self.restore();
    }
}

/// Where a benchmark's `--json [FILE]` goes.
pub enum JsonTarget {
    /// No `--json`.
    Off,
    /// `--json` alone (or `--json -`): stdout, through a scratch file the benchmark writes.
    Stdout(ScratchFile),
    /// `--json FILE`.
    File,
}

/// A file in the temporary folder, removed when dropped.
pub struct ScratchFile(pub std::path::PathBuf);

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl JsonTarget {
    /// Resolve a benchmark's `json` option, replacing `-` with a scratch file's path.
    pub fn resolve(json: &mut Option<std::path::PathBuf>) -> JsonTarget {
        match json {
            None => JsonTarget::Off,
            Some(p) if p.as_os_str() == "-" => {
                let f = std::env::temp_dir().join(format!("vmmw-{}.json", std::process::id()));
                *p = f.clone();
                JsonTarget::Stdout(ScratchFile(f))
            }
            Some(_) => JsonTarget::File,
        }
    }
}

/// Read back the JSON document a benchmark wrote to a scratch file.
pub fn read_json(f: &ScratchFile) -> CliResult<serde_json::Value> {
    let text = std::fs::read_to_string(&f.0)
        .map_err(|e| CliError::failure(format!("reading {}: {e}", f.0.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| CliError::failure(format!("{} is not JSON: {e}", f.0.display())))
}

/// Byte progress: a bar with bytes and rate (decimal units, GB and GB/s, as
/// the summaries print them) and time left when stderr is a
/// terminal; otherwise a plain line per tenth when asked for, or nothing.
pub struct Progress {
    /// On a terminal: the bar, made at the first update (when the total is known).
    bar: Option<OnceLock<ProgressBar>>,
    lines: bool,
    label: String,
    tenth: AtomicU64,
}

impl Progress {
    /// Progress for `label` ("load"); `lines` asks for plain lines off a terminal.
    pub fn new(label: &str, lines: bool) -> Progress {
        Progress {
            bar: std::io::stderr().is_terminal().then(OnceLock::new),
            lines,
            label: label.to_owned(),
            tenth: AtomicU64::new(0),
        }
    }

    fn make_bar(&self, total: u64) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>8} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
            )
            .expect("a fixed, valid template")
            .progress_chars("=> "),
        );
        bar.set_message(self.label.clone());
        bar
    }

    /// Record `done` of `total` bytes.
    pub fn update(&self, done: u64, total: u64) {
        if let Some(cell) = &self.bar {
            let bar = cell.get_or_init(|| self.make_bar(total));
            bar.set_length(total);
            bar.set_position(done);
        } else if self.lines && total > 0 {
            let tenth = done.saturating_mul(10) / total;
            if self.tenth.fetch_max(tenth + 1, Ordering::Relaxed) < tenth + 1 {
                eprintln!(
                    "{}: {} of {} bytes ({}%)",
                    self.label,
                    done,
                    total,
                    done.saturating_mul(100) / total
                );
            }
        }
    }

    /// Remove the bar (the caller prints the summary).
    pub fn finish(&self) {
        if let Some(bar) = self.bar.as_ref().and_then(OnceLock::get) {
            bar.finish_and_clear();
        }
    }
}
