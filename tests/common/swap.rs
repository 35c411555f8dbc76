//! What the swap tests share: a pool cut into small granules and chunks (a
//! few MiB make runs of chunks that a sleep releases one by one and a wake
//! maps several at a time), tags of unique names, random bytes, and device
//! bytes written (`common::loader::read` reads them back).

use std::sync::atomic::{AtomicUsize, Ordering};

use vmmweights::driver::{DevicePtr, Driver};
use vmmweights::pool::PoolConfig;
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::tag::{self, TagId};

/// The host driver's granularity in the swap tests.
pub const G: usize = 64 << 10;

/// Every sleep policy.
pub const POLICIES: [Policy; 4] = [
    Policy::Offload,
    Policy::OffloadCompressed,
    Policy::Discard,
    Policy::Reload,
];

/// A tag named `{prefix}-{name}-{n}`, new for every call.
pub fn unique(prefix: &str, name: &str) -> TagId {
    static N: AtomicUsize = AtomicUsize::new(0);
    tag::id(&format!(
        "{prefix}-{name}-{}",
        N.fetch_add(1, Ordering::Relaxed)
    ))
    .unwrap()
}

/// Small granules and chunks, backup slabs and codec frames.
pub fn config() -> PoolConfig {
    PoolConfig {
        small_segment_bytes: 4 * G,
        small_request_max: 2 * G,
        large_segment_bytes: 16 * G,
        chunk_bytes: 4 * G,
        sleep: SleepOptions {
            copy_piece_bytes: 1 << 20,
            backup_slab_bytes: 4 << 20,
            wake_coalesce_bytes: 8 * G,
            codec_frame_bytes: 1 << 20,
            codec_ring: 2,
            ..SleepOptions::default()
        },
        ..PoolConfig::default()
    }
}

/// `len` random bytes from `seed` (xorshift).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Write `data` at `ptr`, a live awake block of at least `data.len()` bytes.
pub fn write(d: &dyn Driver, ptr: DevicePtr, data: &[u8]) {
    // SAFETY: the caller passes a live awake block of at least `data.len()` bytes.
    unsafe { vmmweights::driver::sync_copy::copy_to_device(d, ptr, data) }.unwrap();
}
