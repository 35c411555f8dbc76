//! What a control server serves: anything that can report, sleep and wake.
//! The interposer implements it over its pools; tests implement it to
//! attack the server without preloading anything.

use std::time::Duration;

use serde_json::Value;

use super::protocol::{refusal, CycleAnswer, Request, StatusAnswer, WirePolicy};
use crate::error::{panic_message, Error, Result};

/// An object a control socket drives. Called from the server's connection
/// threads, several at once: implementations serialize what must be.
pub trait Controlled: Send + Sync {
    /// What it holds and where it stands.
    fn status(&self) -> Result<StatusAnswer>;
    /// Synchronize and sleep every tag (or those named).
    fn sleep(&self, policy: WirePolicy, tags: Option<&[String]>) -> Result<CycleAnswer>;
    /// Wake every asleep tag (or those named), waiting up to `wait` for memory.
    fn wake(&self, tags: Option<&[String]>, wait: Option<Duration>) -> Result<CycleAnswer>;
}

/// The answer to one request: the target's answer, or a refusal saying why
/// (a panic in the target included, which never reaches the server's thread).
pub fn answer(target: &dyn Controlled, request: &Request) -> Value {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<Value> {
        match request {
            Request::Status {} => serde_json::to_value(target.status()?),
            Request::Sleep { policy, tags } => {
                serde_json::to_value(target.sleep(*policy, tags.as_deref())?)
            }
            Request::Wake {
                tags,
                wait_memory_ms,
            } => serde_json::to_value(
                target.wake(tags.as_deref(), super::protocol::wait_of(*wait_memory_ms))?,
            ),
        }
        .map_err(|e| Error::InvalidState(format!("the answer is not JSON: {e}")))
    }));
    match run {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => refusal(&e),
        Err(p) => refusal(&Error::Panic(panic_message(&*p))),
    }
}
