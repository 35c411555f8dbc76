//! The device pointers this library handed out, so `cudaFree` knows which
//! are ours (and on which device) and passes every other one to the runtime.
//! Split in shards by address, so threads freeing at once rarely meet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// How a pointer was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A segment of its own (`Pool::alloc_segment`): freeing releases it.
    Segment,
    /// A block of a shared segment (`Pool::alloc_tagged`).
    Block,
}

/// One pointer of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owned {
    /// Its device.
    pub device: i32,
    /// How it was made.
    pub kind: Kind,
    /// The bytes the process asked for.
    pub size: usize,
}

const SHARDS: usize = 16;

struct Table {
    shards: [Mutex<HashMap<u64, Owned>>; SHARDS],
    count: AtomicU64,
    bytes: AtomicU64,
}

fn table() -> &'static Table {
    static T: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
    T.get_or_init(|| Table {
        shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        count: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
    })
}

fn shard(ptr: u64) -> MutexGuard<'static, HashMap<u64, Owned>> {
    // Allocations are at least 512-byte aligned: mix the bits above.
    let i = ((ptr >> 9) ^ (ptr >> 21)) as usize % SHARDS;
    // Entries go in and out whole: a poisoned shard is still consistent.
    table().shards[i].lock().unwrap_or_else(|p| p.into_inner())
}

/// Record `ptr` as ours.
pub fn insert(ptr: u64, o: Owned) {
    shard(ptr).insert(ptr, o);
    table().count.fetch_add(1, Ordering::Relaxed);
    table().bytes.fetch_add(o.size as u64, Ordering::Relaxed);
}

/// What `ptr` is, if ours.
pub fn get(ptr: u64) -> Option<Owned> {
    shard(ptr).get(&ptr).copied()
}

/// Forget `ptr`; what it was, if it was ours (a second caller gets `None`).
pub fn remove(ptr: u64) -> Option<Owned> {
    let o = shard(ptr).remove(&ptr)?;
    table().count.fetch_sub(1, Ordering::Relaxed);
    table().bytes.fetch_sub(o.size as u64, Ordering::Relaxed);
    Some(o)
}

/// Pointers of ours live now, and the bytes the process asked for.
pub fn totals() -> (u64, u64) {
    let t = table();
    (
        t.count.load(Ordering::Relaxed),
        t.bytes.load(Ordering::Relaxed),
    )
}
