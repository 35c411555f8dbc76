//! The host-memory limit on pinned backups, on the host backend: slabs are
//! whole pinned pages, and every way the arena grows (a sleep's background
//! pinning, pinning on demand, reserve-ahead) stays under the limit; a
//! backup that fits is not refused, and one accepted up front does not fail
//! midway for want of host memory.

use std::sync::Arc;
use std::time::Duration;

use vmmweights::codec::format::max_frame_bytes;
use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::{Driver, StreamId};
use vmmweights::sleep::{Policy, SleepEngine, SleepOptions};
use vmmweights::tag::TagId;
use vmmweights::{Error, Segment, SleepState};

use crate::sleep_engine::{fill, read};

const G: usize = 64 << 10;
const PAGE: u64 = 2 << 20;

fn driver() -> Arc<dyn Driver> {
    Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }))
}

fn options() -> SleepOptions {
    SleepOptions {
        copy_piece_bytes: 1 << 20,
        backup_slab_bytes: 4 << 20,
        ..SleepOptions::default()
    }
}

/// Small frames and slabs, so a few MiB make many of each.
fn codec_options() -> SleepOptions {
    SleepOptions {
        pipeline_slab_bytes: 2 << 20,
        codec_frame_bytes: 1 << 20,
        codec_ring: 2,
        ..SleepOptions::default()
    }
}

fn write(d: &dyn Driver, seg: &Segment, bytes: &[u8]) {
    // SAFETY: the segment is awake and at least `bytes.len()` long.
    unsafe { d.copy_htod_async(seg.ptr(), bytes.as_ptr(), bytes.len(), StreamId::DEFAULT) }
        .unwrap();
    d.synchronize().unwrap();
}

/// The most a compressed backup of `committed` bytes in frames of `frame`
/// takes: every frame stored raw.
fn bound(committed: usize, frame: usize) -> u64 {
    (0..committed)
        .step_by(frame)
        .map(|at| max_frame_bytes(frame.min(committed - at)) as u64)
        .sum()
}

#[test]
fn pinning_in_slabs_of_odd_sizes_stays_under_the_host_limit() {
    // Pinned slabs are whole 2 MiB pages: slabs of 3 MiB pin 4 MiB each.
    // The limit counts the pages, so a backup whose pages do not fit is
    // refused up front, and one whose pages fit never holds more.
    let d = driver();
    let engine = SleepEngine::new(
        d.clone(),
        SleepOptions {
            host_memory_limit: 9 << 20,
            pipeline_slab_bytes: 3 << 20,
            ..options()
        },
    );
    let mut seg = Segment::allocate(d.clone(), 9 << 20, G).unwrap();
    let data = fill(d.as_ref(), &seg, 11);
    let e = engine
        .sleep(TagId(5), &mut [&mut seg], Policy::Offload)
        .unwrap_err();
    assert!(matches!(e, Error::HostOutOfMemory { .. }), "{e}");
    assert_eq!(seg.sleep_state(), SleepState::Awake);
    assert!(read(d.as_ref(), &seg) == data);
    assert_eq!(engine.backup_held_bytes(), 0);
    let e = engine.reserve_backup(9 << 20).unwrap_err();
    assert!(matches!(e, Error::HostOutOfMemory { .. }), "{e}");
    assert_eq!(engine.backup_held_bytes(), 0);

    let mut seg = Segment::allocate(d.clone(), 7 << 20, G).unwrap();
    let data7 = fill(d.as_ref(), &seg, 12);
    engine
        .sleep(TagId(5), &mut [&mut seg], Policy::Offload)
        .unwrap();
    let held = engine.backup_held_bytes();
    assert!(
        held <= 9 << 20,
        "pinned {held} bytes under a limit of 9 MiB"
    );
    engine.wake(TagId(5), &mut [&mut seg]).unwrap();
    assert!(read(d.as_ref(), &seg) == data7);
}

/// A compressed sleep of a segment with an older, smaller backup next to a
/// new segment: the background pinning covers the new one, and the frames
/// past it pin on demand only what they still need, as the plan counted.
#[test]
fn a_compressed_sleep_accepted_up_front_does_not_fail_midway() {
    let d = driver();
    let opts = codec_options();
    let engine = SleepEngine::new(d.clone(), opts.clone());
    let t = TagId(7);
    let mut b = Segment::allocate(d.clone(), 8 << 20, G).unwrap();
    write(d.as_ref(), &b, &vec![0u8; b.committed()]);
    engine
        .sleep(t, &mut [&mut b], Policy::OffloadCompressed)
        .unwrap();
    engine.wake(t, &mut [&mut b]).unwrap();
    let held = engine.backup_held_bytes();
    assert!(engine.backup_bytes_by_tag()[&t] < b.committed() as u64);
    let data_b = fill(d.as_ref(), &b, 3);
    let mut c = Segment::allocate(d.clone(), 10 << 20, G).unwrap();
    let data_c = fill(d.as_ref(), &c, 4);
    let frame = opts.codec_frame_bytes;
    let total = bound(b.committed(), frame) + bound(c.committed(), frame);
    // Exactly what the plan accepts: what is held, and the pages of the rest.
    let limit = held + (total - held).next_multiple_of(PAGE);
    engine.set_options(SleepOptions {
        host_memory_limit: limit,
        ..opts
    });
    engine
        .sleep(t, &mut [&mut b, &mut c], Policy::OffloadCompressed)
        .unwrap();
    assert!(engine.backup_held_bytes() <= limit);
    engine.wake(t, &mut [&mut b, &mut c]).unwrap();
    assert!(read(d.as_ref(), &b) == data_b);
    assert!(read(d.as_ref(), &c) == data_c);
}

/// A reserve from another thread while a sleep pins its backup waits for
/// the sleep: the sleep's pinning ahead is counted before the reserve's.
#[test]
fn a_reserve_during_a_sleep_stays_under_the_limit() {
    let d = driver();
    let opts = codec_options();
    let mut seg = Segment::allocate(d.clone(), 20 << 20, G).unwrap();
    write(d.as_ref(), &seg, &vec![0u8; seg.committed()]);
    let limit = bound(seg.committed(), opts.codec_frame_bytes).next_multiple_of(PAGE);
    let engine = SleepEngine::new(
        d.clone(),
        SleepOptions {
            host_memory_limit: limit,
            ..opts
        },
    );
    let cell = std::sync::Mutex::new(&mut seg);
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let reserved = std::thread::scope(|s| {
        let engine = &engine;
        let reserve = s.spawn(move || {
            wait.recv().unwrap();
            // All the limit leaves as the sleep's pinning has it now.
            let r = engine.reserve_backup(limit - engine.backup_held_bytes());
            (r, engine.backup_held_bytes())
        });
        let segs = |f: &mut dyn FnMut(&mut [&mut Segment])| {
            // Once the sleep is under way, the other thread reserves; this
            // one gives it time to get there.
            if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
                go.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
            let mut s = cell.lock().unwrap();
            f(&mut [&mut **s]);
        };
        engine
            .sleep_tag(TagId(9), Policy::OffloadCompressed, &segs, None)
            .unwrap();
        reserve.join().unwrap()
    });
    let held = engine.backup_held_bytes();
    assert!(
        held <= limit,
        "{held} bytes pinned under a limit of {limit}"
    );
    let (r, held_then) = reserved;
    assert!(held_then <= limit, "{held_then} bytes pinned under {limit}");
    if let Err(e) = r {
        assert!(matches!(e, Error::HostOutOfMemory { .. }), "{e}");
    }
}

/// An Offload sleep after a compressed one: the old backup is freed before
/// the new one is placed, so its bytes count as room.
#[test]
fn an_offload_after_a_compressed_sleep_counts_the_old_backup_as_room() {
    let d = driver();
    let opts = SleepOptions {
        copy_piece_bytes: 1 << 20,
        ..codec_options()
    };
    let engine = SleepEngine::new(d.clone(), opts.clone());
    let t = TagId(3);
    let mut seg = Segment::allocate(d.clone(), 8 << 20, G).unwrap();
    write(d.as_ref(), &seg, &vec![0u8; seg.committed()]);
    engine
        .sleep(t, &mut [&mut seg], Policy::OffloadCompressed)
        .unwrap();
    engine.wake(t, &mut [&mut seg]).unwrap();
    let held = engine.backup_held_bytes();
    let data = fill(d.as_ref(), &seg, 5);
    let limit = held + (seg.committed() as u64 - held).next_multiple_of(PAGE);
    engine.set_options(SleepOptions {
        host_memory_limit: limit,
        ..opts
    });
    engine.sleep(t, &mut [&mut seg], Policy::Offload).unwrap();
    assert_eq!(seg.sleep_state(), SleepState::Offloaded);
    assert!(engine.backup_held_bytes() <= limit);
    engine.wake(t, &mut [&mut seg]).unwrap();
    assert!(read(d.as_ref(), &seg) == data);
}

/// Sizes near `u64::MAX` count as more than any limit, without overflow.
#[test]
fn a_reserve_past_what_any_host_has_is_refused() {
    for limit in [u64::MAX, 64 << 20] {
        let engine = SleepEngine::new(
            driver(),
            SleepOptions {
                host_memory_limit: limit,
                ..options()
            },
        );
        for bytes in [u64::MAX, u64::MAX - 1, u64::MAX - PAGE] {
            let e = engine.reserve_backup(bytes).unwrap_err();
            assert!(matches!(e, Error::HostOutOfMemory { .. }), "{bytes}: {e}");
        }
        assert_eq!(engine.backup_held_bytes(), 0);
    }
}
