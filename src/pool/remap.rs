//! Remap notices: a per-tag epoch that goes up each time a tag's physical
//! memory is mapped anew (a wake), and callbacks told of it.
//!
//! Memory registered with a NIC or a collective (NCCL's `ncclCommRegister`,
//! NIXL, UCX) is registered by its physical pages; a wake maps new pages at
//! the same addresses, so a registration taken before the sleep is stale.
//! An engine either polls [`epoch`] and registers again when it changed, or
//! registers a callback with [`on_remap`].
//!
//! Callbacks run on the thread that woke the tag, after the wake finished and
//! the tag left its transition, with no lock of this library held (the list
//! is copied out first), so a callback may call back into the library,
//! including to register another callback or remove itself. A panicking
//! callback is caught and does not stop the others.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::ThreadId;

use crate::tag::TagId;

/// A remap callback: the tag and its new epoch.
pub type RemapCallback = Arc<dyn Fn(TagId, u64) + Send + Sync>;

/// One registered callback and whether it may still start.
struct Entry {
    id: u64,
    f: RemapCallback,
    state: Mutex<EntryState>,
    idle: Condvar,
}

#[derive(Default)]
struct EntryState {
    removed: bool,
    /// Threads running the callback now.
    running: Vec<ThreadId>,
}

#[derive(Default)]
struct Notices {
    epochs: HashMap<TagId, u64>,
    callbacks: Vec<Arc<Entry>>,
    next_id: u64,
}

fn notices() -> std::sync::MutexGuard<'static, Notices> {
    static N: OnceLock<Mutex<Notices>> = OnceLock::new();
    N.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// How many times `tag`'s memory was mapped anew in this process (0 until
/// its first wake).
pub fn epoch(tag: TagId) -> u64 {
    notices().epochs.get(&tag).copied().unwrap_or(0)
}

/// Call `f` after every remap of any tag; returns an id for [`remove`].
pub fn on_remap(f: RemapCallback) -> u64 {
    let mut n = notices();
    n.next_id += 1;
    let id = n.next_id;
    n.callbacks.push(Arc::new(Entry {
        id,
        f,
        state: Mutex::new(EntryState::default()),
        idle: Condvar::new(),
    }));
    id
}

/// Stop calling the callback `id`; false when no such callback is registered.
/// When this returns no call of it starts again, and calls running on other
/// threads have finished (a callback may remove itself: its own call goes on).
pub fn remove(id: u64) -> bool {
    let entry = {
        let mut n = notices();
        let Some(i) = n.callbacks.iter().position(|e| e.id == id) else {
            return false;
        };
        n.callbacks.remove(i)
    };
    let me = std::thread::current().id();
    let mut st = entry.state.lock().unwrap_or_else(|p| p.into_inner());
    st.removed = true;
    while st.running.iter().any(|t| *t != me) {
        st = entry.idle.wait(st).unwrap_or_else(|p| p.into_inner());
    }
    true
}

/// `tag`'s memory was mapped anew: raise its epoch and tell the callbacks.
/// The caller holds no lock of this library.
pub(crate) fn remapped(tag: TagId) {
    let (epoch, callbacks) = {
        let mut n = notices();
        let e = n.epochs.entry(tag).or_insert(0);
        *e += 1;
        let e = *e;
        (e, n.callbacks.clone())
    };
    let me = std::thread::current().id();
    for entry in callbacks {
        {
            let mut st = entry.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.removed {
                continue;
            }
            st.running.push(me);
        }
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (entry.f)(tag, epoch)));
        let mut st = entry.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = st.running.iter().position(|t| *t == me) {
            st.running.swap_remove(i);
        }
        entry.idle.notify_all();
    }
}
