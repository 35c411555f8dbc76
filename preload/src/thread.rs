//! What each thread of the process chose: the tag its allocations get, and
//! whether it is inside a region (`region` scope). Plain cells, so reading
//! them on every `cudaMalloc` costs nothing and works in any thread, one
//! being torn down included.

use std::cell::Cell;

use vmmweights::tag::TagId;

thread_local! {
    static TAG: Cell<Option<TagId>> = const { Cell::new(None) };
    static REGION: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Set this thread's tag (`None`: back to the process's tag).
pub fn set_tag(tag: Option<TagId>) {
    TAG.with(|t| t.set(tag));
}

/// This thread's tag, or `default`.
pub fn tag(default: TagId) -> TagId {
    TAG.with(|t| t.get()).unwrap_or(default)
}

/// Enter (true) or leave (false) a region on this thread.
pub fn set_region(on: bool) {
    REGION.with(|r| r.set(Some(on)));
}

/// Whether this thread is inside a region; `default` until it chose.
pub fn region(default: bool) -> bool {
    REGION.with(|r| r.get()).unwrap_or(default)
}
