//! Room for a wake: each device's free memory against what its tags need,
//! checked before anything is mapped, and the wait a wake may ask for
//! (`wait_memory_ms`) while another process or tag releases memory.
//!
//! A wake that does not wait checks every device's room once, before any
//! tag wakes ([`wait_for_room`]). A wake that waits does not wait for all of
//! it to fit first: [`wake_tag`] hands the wait to the pool's own wake, which
//! maps each chunk as soon as the device has room, so a process waking while
//! another sleeps overlaps the two directions of the link.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::pool::{Pool, TagCycle};
use crate::sleep::WakeOptions;
use crate::tag::TagId;

/// How often free memory is read while waiting.
const POLL: Duration = Duration::from_millis(20);

/// What one device's wake needs.
#[derive(Debug, Clone)]
pub struct Need {
    /// The device's pool.
    pub pool: Arc<Pool>,
    /// Physical bytes its tags map again.
    pub bytes: u64,
    /// The tags, for messages.
    pub tags: Vec<String>,
}

/// Wait until every device has room for its need, up to `wait` (`None`:
/// check once). Returns the time waited; out of memory, naming the first
/// device short, when the wait ends first. Nothing is mapped here.
pub fn wait_for_room(needs: &[Need], wait: Option<Duration>) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let short = first_short(needs)?;
        let Some((need, free)) = short else {
            return Ok(start.elapsed());
        };
        let waited = start.elapsed();
        if wait.is_none_or(|w| waited >= w) {
            let waited_text = match wait {
                Some(w) => format!(
                    "waited {:.3} s of the {:.3} s allowed",
                    waited.as_secs_f64(),
                    w.as_secs_f64()
                ),
                None => "wait_memory_ms would wait for memory being released".to_owned(),
            };
            return Err(Error::OutOfMemory {
                what: format!(
                    "wake of device {} tags [{}] (nothing mapped: every tag stays asleep with \
                     its backup; {waited_text})",
                    need.pool.device(),
                    need.tags.join(", ")
                ),
                requested: need.bytes,
                free,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// The first device whose free memory is short of its need, with that free memory.
fn first_short(needs: &[Need]) -> Result<Option<(&Need, u64)>> {
    for n in needs {
        if n.bytes == 0 {
            continue;
        }
        let free = n.pool.driver().mem_info()?.free;
        if free < n.bytes {
            return Ok(Some((n, free)));
        }
    }
    Ok(None)
}

/// Wake `tag` of `pool`, transactionally: on failure it stays asleep with its
/// backup. `wait` is the wake's wait for memory (`None`: the room was checked
/// already, [`wait_for_room`]); with one, each chunk is mapped as the device
/// has room, up to that long ([`Pool::wake_with`]).
pub fn wake_tag(pool: &Pool, tag: TagId, wait: Option<Duration>) -> Result<Vec<TagCycle>> {
    match wait {
        Some(w) if !w.is_zero() => pool.wake_with(&[tag], WakeOptions { wait_for_memory: w }),
        _ => pool.wake(&[tag]),
    }
}
