//! The client side of a control socket: what `vmmw ctl`, the C API
//! (`vmmw_control_*`) and the tests use.
//!
//! A refusal comes back as [`Error::ControlRefused`] carrying the status the
//! process named, so C callers see the same code (`VMMW_OUT_OF_MEMORY` for a
//! wake without room). Failing to reach the process is an [`Error::Io`] on
//! the socket path.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::line::{Line, LineReader};
use super::protocol::{CycleAnswer, Request, StatusAnswer, WirePolicy};
use crate::error::{Error, Result, Status};
use crate::share::wire;

/// Longest answer accepted (a status of many tags on many devices).
pub const MAX_ANSWER: usize = 16 << 20;
/// How long `status` waits for its answer unless set.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `sleep` and `wake` wait for their answers unless set (plus a
/// wake's own wait for memory): a sleep of a whole large GPU takes seconds.
pub const CYCLE_TIMEOUT: Duration = Duration::from_secs(600);

/// A connection to a control socket; requests go one at a time.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    sock: UnixStream,
    reader: LineReader,
    timeout: Option<Duration>,
}

impl Client {
    /// Connect to the socket at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client> {
        let path = path.as_ref().to_path_buf();
        let sock = UnixStream::connect(&path).map_err(|e| Error::io(&path, e))?;
        Ok(Client {
            path,
            sock,
            reader: LineReader::new(),
            timeout: None,
        })
    }

    /// Wait at most `timeout` for each answer (`None`: the defaults above).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Send `request` and return the answer as JSON, whatever it says.
    pub fn request_raw(&mut self, request: &Request) -> Result<Value> {
        let wait = self.timeout.unwrap_or(match request {
            Request::Status {} => STATUS_TIMEOUT,
            Request::Wake {
                wait_memory_ms: Some(ms),
                ..
            } => CYCLE_TIMEOUT + Duration::from_millis(*ms),
            _ => CYCLE_TIMEOUT,
        });
        let deadline = Instant::now() + wait;
        // A process may refuse a peer before reading anything (not allowed,
        // too many connections): the send then fails, and its refusal is
        // still there to read.
        let sent = wire::send_all(&self.sock, &request.to_line(), Some(deadline));
        let line = match self
            .reader
            .read(&self.sock, MAX_ANSWER, deadline)
            .map_err(|e| self.io(e, "reading the answer"))
        {
            Ok(Line::Got(l)) => l,
            Err(_) | Ok(Line::Closed) if sent.is_err() => {
                let e = sent.expect_err("checked above");
                return Err(self.io(e, "sending the request"));
            }
            Err(e) => return Err(e),
            Ok(Line::Closed) => {
                return Err(self.io(
                    std::io::ErrorKind::UnexpectedEof.into(),
                    "the process closed the connection without an answer",
                ))
            }
            Ok(Line::TooLong) => {
                return Err(self.refused(
                    Status::InvalidState,
                    format!("the answer is longer than {MAX_ANSWER} bytes"),
                ))
            }
            Ok(Line::TimedOut) => {
                return Err(self.io(
                    std::io::ErrorKind::TimedOut.into(),
                    &format!("no answer within {:.1} s", wait.as_secs_f64()),
                ))
            }
        };
        serde_json::from_slice(&line).map_err(|e| {
            self.refused(
                Status::InvalidState,
                format!("the answer is not JSON ({e}): is this a vmmweights control socket?"),
            )
        })
    }

    /// Send `request`: its answer when `ok`, else the refusal as an error.
    pub fn request(&mut self, request: &Request) -> Result<Value> {
        let v = self.request_raw(request)?;
        match v.get("ok") {
            Some(Value::Bool(true)) => Ok(v),
            Some(Value::Bool(false)) => {
                let code = v.get("code").and_then(Value::as_str).unwrap_or("");
                let message = v
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("refused without a reason")
                    .to_owned();
                let status = Status::from_name(code).unwrap_or(Status::InvalidState);
                Err(self.refused(status, message))
            }
            _ => Err(self.refused(
                Status::InvalidState,
                format!("the answer has no \"ok\": {}", truncate(&v.to_string())),
            )),
        }
    }

    /// `{"op":"status"}`.
    pub fn status(&mut self) -> Result<StatusAnswer> {
        let v = self.request(&Request::Status {})?;
        self.typed(v)
    }

    /// `{"op":"sleep"}` with `policy`, of `tags` (every tag when `None`).
    pub fn sleep(&mut self, policy: WirePolicy, tags: Option<Vec<String>>) -> Result<CycleAnswer> {
        let v = self.request(&Request::Sleep { policy, tags })?;
        self.typed(v)
    }

    /// `{"op":"wake"}` of `tags` (every asleep tag when `None`), waiting up
    /// to `wait_memory_ms` for memory (refusing at once when `None`).
    pub fn wake(
        &mut self,
        tags: Option<Vec<String>>,
        wait_memory_ms: Option<u64>,
    ) -> Result<CycleAnswer> {
        let v = self.request(&Request::Wake {
            tags,
            wait_memory_ms,
        })?;
        self.typed(v)
    }

    fn typed<T: serde::de::DeserializeOwned>(&self, v: Value) -> Result<T> {
        serde_json::from_value(v).map_err(|e| {
            self.refused(
                Status::InvalidState,
                format!("the answer lacks a field this client needs: {e}"),
            )
        })
    }

    fn io(&self, e: std::io::Error, what: &str) -> Error {
        Error::io(
            &self.path,
            std::io::Error::new(e.kind(), format!("{what}: {e}")),
        )
    }

    fn refused(&self, status: Status, message: String) -> Error {
        Error::ControlRefused {
            socket: self.path.clone(),
            status,
            message,
        }
    }
}

fn truncate(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}
