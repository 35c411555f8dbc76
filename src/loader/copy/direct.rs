//! The direct path's worker: registers file windows read-only with the driver
//! and DMAs straight from the page cache, overlapping registration with transfer.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::issue::issue;
use super::jobs::Window;
use super::shared::Shared;
use crate::driver::{Driver, EventId};
use crate::error::Result;
use crate::loader::checkpoint::Shard;
use crate::loader::read_error::check_read;

#[allow(clippy::too_many_arguments)]
pub(super) fn direct_worker(
    d: &dyn Driver,
    shards: &[Shard],
    windows: &[Window],
    next: &AtomicUsize,
    sh: &Shared,
    register: bool,
    _worker: usize,
) -> Result<()> {
    let stream = d.stream_create()?;
    let mut events: Vec<EventId> = Vec::new();
    let mut pending: VecDeque<(*mut u8, u64, EventId)> = VecDeque::new();
    let retire = |pending: &mut VecDeque<(*mut u8, u64, EventId)>| -> Result<EventId> {
        let (ptr, bytes, ev) = pending.pop_front().expect("non-empty");
        let synced = d.event_synchronize(ev);
        if register {
            // SAFETY: registered below; its copies completed (event synchronized).
            // When the sync failed the device is in error; unregistering is still right.
            unsafe { d.host_unregister(ptr) }?;
        }
        synced?;
        sh.done.fetch_add(bytes, Ordering::SeqCst);
        Ok(ev)
    };
    let r = (|| -> Result<()> {
        for _ in 0..2 {
            events.push(d.event_create()?);
        }
        let mut free: Vec<EventId> = events.clone();
        loop {
            if sh.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let i = next.fetch_add(1, Ordering::SeqCst);
            let Some(w) = windows.get(i) else {
                return Ok(());
            };
            if free.is_empty() {
                free.push(retire(&mut pending)?);
            }
            let ev = free.pop().expect("an event is free");
            let shard = &shards[w.shard];
            let source = w.pieces.first().map_or(0, |p| p.source);
            check_read(d, &shard.path, source, w.lo, w.hi - w.lo)?;
            let base = shard.ptr(w.lo) as *mut u8;
            if register {
                // SAFETY: the window is inside the shard's live mapping (clamped to
                // its page-rounded length); unregistered in `retire` after its copies.
                unsafe { d.host_register(base, (w.hi - w.lo) as usize, true) }?;
            }
            pending.push_back((base, w.bytes(), ev));
            for p in &w.pieces {
                // SAFETY: the piece's rows lie inside the window (clip_src), which
                // stays mapped and registered until its event completes.
                unsafe { issue(d, p, shard.ptr(p.src), p.src_pitch, stream) }?;
            }
            d.event_record(ev, stream)?;
        }
    })();
    let mut first = r.err();
    while !pending.is_empty() {
        if let Err(e) = retire(&mut pending) {
            first.get_or_insert(e);
        }
    }
    for ev in events {
        let _ = d.event_destroy(ev);
    }
    let _ = d.stream_destroy(stream);
    first.map_or(Ok(()), Err)
}
