//! A swap on a device with barely room for one model: the waking side needs
//! memory that only the end of the sleep side frees (its codec scratch, its
//! last chunks). Whatever the room, the swap ends (no side waits for the
//! other forever) and either both sides succeed or the side that failed says
//! so with its tag as it was.

use crate::common;

use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::loader::read;
use common::swap::write;
use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::Driver;
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::tag::TagId;

fn unique(name: &str) -> TagId {
    common::swap::unique("swap-room", name)
}

const G: usize = 64 << 10;
const MODEL: usize = 4 << 20;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Half the bytes repeat, so the codec has something to save.
            if x & 1 == 0 {
                0
            } else {
                x as u8
            }
        })
        .collect()
}

fn config() -> PoolConfig {
    PoolConfig {
        small_segment_bytes: 4 * G,
        small_request_max: 2 * G,
        large_segment_bytes: 16 * G,
        chunk_bytes: 4 * G,
        sleep: SleepOptions {
            copy_piece_bytes: 1 << 20,
            wake_coalesce_bytes: 4 * G,
            codec_frame_bytes: 1 << 20,
            codec_ring: 2,
            ..SleepOptions::default()
        },
        ..PoolConfig::default()
    }
}

/// One case on a device of `one + extra` bytes: returns whether the swap
/// went through on both sides.
fn case(sleeping: Policy, asleep: Policy, extra: u64, one: u64) -> bool {
    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }));
    let d: Arc<dyn Driver> = h.clone();
    let pool = Pool::new(d, config()).unwrap();
    let (a, b) = (unique("a"), unique("b"));
    let blk_b = pool.alloc_tagged(MODEL, b).unwrap();
    let data_b = pattern(2, blk_b.size);
    write(h.as_ref(), blk_b.ptr, &data_b);
    pool.sleep(&[(b, asleep)]).unwrap();
    let blk_a = pool.alloc_tagged(MODEL, a).unwrap();
    let data_a = pattern(1, blk_a.size);
    write(h.as_ref(), blk_a.ptr, &data_a);
    h.set_memory_limit(one + extra);
    let what = format!("{sleeping:?} sleeping, {asleep:?} waking, {extra} bytes spare");
    let out = pool.swap(&[(a, sleeping)], &[b]);
    h.set_memory_limit(1 << 30);
    let out = match out {
        Ok(out) => out,
        // Refused up front: nothing moved.
        Err(e) => {
            assert!(e.is_out_of_memory(), "{what}: {e}");
            assert!(!pool.is_tag_asleep(a) && pool.is_tag_asleep(b), "{what}");
            return false;
        }
    };
    if out.wake_error.is_some() {
        assert!(pool.is_tag_asleep(b), "{what}");
    }
    if out.sleep_error.is_some() {
        // Finish what the sleep side left (it may have stopped midway).
        pool.sleep(&[(a, sleeping)]).unwrap();
    }
    pool.wake(&[b]).unwrap();
    assert!(
        read(h.as_ref(), blk_b.ptr, data_b.len()) == data_b,
        "{what}: b"
    );
    pool.wake(&[a]).unwrap();
    assert!(
        read(h.as_ref(), blk_a.ptr, data_a.len()) == data_a,
        "{what}: a"
    );
    pool.check_invariants().unwrap();
    out.is_ok()
}

#[test]
fn a_swap_on_a_device_with_barely_room_for_one_model_ends() {
    let one = {
        let h = Arc::new(HostDriver::new(HostConfig {
            granularity: G,
            memory_limit: 1 << 30,
        }));
        let d: Arc<dyn Driver> = h.clone();
        let pool = Pool::new(d, config()).unwrap();
        pool.alloc_tagged(MODEL, unique("probe")).unwrap();
        h.counts().physical_bytes
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut went = Vec::new();
        for sleeping in [Policy::OffloadCompressed, Policy::Offload] {
            for asleep in [Policy::OffloadCompressed, Policy::Offload] {
                for extra in [0, G as u64, 8 * G as u64, one] {
                    went.push((sleeping, asleep, extra, case(sleeping, asleep, extra, one)));
                }
            }
        }
        let _ = tx.send(went);
    });
    let went = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("a swap waited forever");
    for (sleeping, asleep, extra, ok) in went {
        // A raw backup needs no device memory to wake: room for one model
        // is enough, whatever the sleeping side (a compressed sleep with no
        // room for its scratch keeps a raw backup). A compressed one needs
        // its decode scratch besides.
        if asleep == Policy::Offload || extra == one {
            assert!(
                ok,
                "{sleeping:?} sleeping, {asleep:?} waking, {extra} spare"
            );
        }
    }
}
