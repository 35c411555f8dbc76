//! Attacks on swaps, waiting wakes and the chunks a stopped transition
//! leaves mapped, on the host backend: every case checks that no byte is
//! lost, or that the loss is refused loudly.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::{DevicePtr, Driver};
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::tag::{self, TagId};

const G: usize = 64 << 10;
const BLOCK: usize = 4 << 20;

fn unique(name: &str) -> TagId {
    static N: AtomicUsize = AtomicUsize::new(0);
    tag::id(&format!(
        "swap-attack-{name}-{}",
        N.fetch_add(1, Ordering::Relaxed)
    ))
    .unwrap()
}

fn config() -> PoolConfig {
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

struct World {
    h: Arc<HostDriver>,
    pool: Pool,
}

impl World {
    fn new(limit: u64) -> World {
        let h = Arc::new(HostDriver::new(HostConfig {
            granularity: G,
            memory_limit: limit,
        }));
        let d: Arc<dyn Driver> = h.clone();
        World {
            pool: Pool::new(d, config()).unwrap(),
            h,
        }
    }

    fn d(&self) -> &dyn Driver {
        self.h.as_ref()
    }

    /// A tag holding one block of `len` random bytes.
    fn block(&self, name: &str, len: usize, seed: u64) -> (TagId, DevicePtr, Vec<u8>) {
        let t = unique(name);
        let b = self.pool.alloc_tagged(len, t).unwrap();
        let data = pattern(seed, b.size);
        write(self.d(), b.ptr, &data);
        (t, b.ptr, data)
    }

    fn mapped(&self, t: TagId) -> u64 {
        self.pool
            .report()
            .tag(&tag::name_of(t))
            .map_or(0, |u| u.tracked_bytes)
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
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

fn write(d: &dyn Driver, ptr: DevicePtr, data: &[u8]) {
    // SAFETY: `ptr` is a live awake block of at least `data.len()` bytes.
    unsafe { vmmweights::driver::sync_copy::copy_to_device(d, ptr, data) }.unwrap();
}

fn read(d: &dyn Driver, ptr: DevicePtr, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: `ptr` is a live awake block of at least `len` bytes.
    unsafe { vmmweights::driver::sync_copy::copy_to_host(d, &mut v, ptr) }.unwrap();
    v
}

/// The first offset where `a` and `b` differ.
fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// A wake that fails midway on a device that then refuses to synchronize
/// cannot unmap what it mapped: those chunks stay mapped in the asleep
/// segment, holding what the failed copies left. The next wake must still
/// restore the backup into them (they are not chunks a stopped sleep left
/// holding the bytes).
#[test]
fn a_wake_after_a_failed_wake_that_kept_its_chunks_restores_every_byte() {
    for policy in [Policy::Offload, Policy::OffloadCompressed] {
        let w = World::new(1 << 30);
        let (t, ptr, data) = w.block("kept", BLOCK, 21);
        w.pool.sleep(&[(t, policy)]).unwrap();
        assert_eq!(w.mapped(t), 0);
        // The third copy fails; the undo cannot show the device idle.
        w.h.fail_nth(FaultOp::CopyHtod, 3);
        w.h.fail_always(FaultOp::Synchronize);
        let e = w.pool.wake(&[t]).unwrap_err();
        w.h.clear_faults();
        assert!(w.pool.is_tag_asleep(t), "{policy:?}: {e}");
        assert!(
            w.mapped(t) > 0,
            "{policy:?}: the failed wake could not unmap its chunks"
        );
        w.pool.wake(&[t]).unwrap();
        let got = read(w.d(), ptr, data.len());
        assert!(
            got == data,
            "{policy:?}: byte {:?} differs after the second wake",
            first_diff(&got, &data)
        );
    }
}
