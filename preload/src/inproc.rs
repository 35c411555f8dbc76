//! The calls a process makes on its own interposer (the Rust side of the
//! `vmmw_preload_*` C functions; a torch_memory_saver layer builds on these):
//! choose the tag and region of the calling thread, sleep and wake from
//! inside, read the status. Sleep and wake are the control socket's own
//! (one runs at a time, whichever side asks), with the calling thread's
//! context and device put back afterwards.

use std::time::Duration;

use vmmweights::control::{Controlled, CycleAnswer, StatusAnswer, WirePolicy};
use vmmweights::tag;
use vmmweights::Result;

use crate::config::{Config, DEFAULT_TAG};
use crate::context::Kept;
use crate::{served, state, thread};

/// Allocations of the calling thread go under tag `name` from now on
/// (`None`: the process's tag again, `VMMW_PRELOAD_TAG`).
pub fn set_tag(name: Option<&str>) -> Result<()> {
    let id = name.map(tag::id).transpose()?;
    thread::set_tag(id);
    Ok(())
}

/// The tag the calling thread's allocations get.
pub fn tag_name() -> String {
    let default = match state::get() {
        Some(s) => s.config.tag,
        None => match Config::from_env() {
            Ok(c) => c.tag,
            Err(_) => return DEFAULT_TAG.to_owned(),
        },
    };
    tag::name_of(thread::tag(default))
}

/// Enter (`true`) or leave a region on the calling thread: in `region`
/// scope, its allocations are ours only inside one.
pub fn set_region(on: bool) {
    thread::set_region(on);
}

/// Whether the calling thread is inside a region (`VMMW_PRELOAD_REGION_DEFAULT`
/// until it chose), whatever the scope.
pub fn region() -> bool {
    let default = state::get().map_or_else(
        || Config::from_env().is_ok_and(|c| c.region_default),
        |s| s.config.region_default,
    );
    thread::region(default)
}

/// Synchronize every device the process used and sleep its tags (or
/// `tags`) with `policy`.
pub fn sleep(policy: WirePolicy, tags: Option<&[String]>) -> Result<CycleAnswer> {
    let _ = state::get();
    let _kept = Kept::now();
    served::interposed().sleep(policy, tags)
}

/// Wake every asleep tag (or `tags`), waiting up to `wait` for memory.
pub fn wake(tags: Option<&[String]>, wait: Option<Duration>) -> Result<CycleAnswer> {
    let _ = state::get();
    let _kept = Kept::now();
    served::interposed().wake(tags, wait)
}

/// The status the control socket answers.
pub fn status() -> Result<StatusAnswer> {
    let _kept = Kept::now();
    served::interposed().status()
}
