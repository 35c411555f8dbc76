//! The state one execution's workers share: the stop flag, the bytes done,
//! the first error, and whether a worker panicked. Kept apart from
//! `execute` so the workers (`direct`, `staged`) depend on it and not on the
//! function that runs them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::Error;

#[derive(Default)]
pub(super) struct Shared {
    pub(super) stop: AtomicBool,
    pub(super) done: AtomicU64,
    error: Mutex<Option<Error>>,
    /// A worker panicked: it unwound without waiting for its queued copies.
    panicked: AtomicBool,
}

impl Shared {
    /// Keep `e` unless an error is already kept, and stop every worker.
    pub(super) fn fail(&self, e: Error) {
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert(e);
        self.stop.store(true, Ordering::SeqCst);
    }

    /// As [`Shared::fail`], for a worker that panicked.
    pub(super) fn fail_panicked(&self, e: Error) {
        self.panicked.store(true, Ordering::SeqCst);
        self.fail(e);
    }

    /// True when a worker panicked.
    pub(super) fn panicked(&self) -> bool {
        self.panicked.load(Ordering::SeqCst)
    }

    /// The first error kept, taken out.
    pub(super) fn take_error(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}
