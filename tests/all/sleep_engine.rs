//! Sleep/wake engine on the host backend: contents, pointers, faults while
//! asleep, transactional wake, limits, concurrency.

use std::sync::Arc;

use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::{DevicePtr, Driver, StreamId};
use vmmweights::sleep::reload::ReloadSource;
use vmmweights::sleep::{Policy, SleepEngine, SleepOptions};
use vmmweights::tag::TagId;
use vmmweights::{Error, Segment, SleepState};

const G: usize = 64 << 10;

fn host(limit: u64) -> (Arc<HostDriver>, Arc<dyn Driver>) {
    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: limit,
    }));
    let d: Arc<dyn Driver> = h.clone();
    (h, d)
}

fn options() -> SleepOptions {
    SleepOptions {
        copy_piece_bytes: 1 << 20,
        backup_slab_bytes: 4 << 20,
        ..SleepOptions::default()
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random bytes (they do not compress) over the whole segment.
pub(crate) fn fill(d: &dyn Driver, seg: &Segment, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let bytes: Vec<u8> = (0..seg.committed()).map(|_| r.next() as u8).collect();
    // SAFETY: the segment is awake and `committed` bytes long.
    unsafe { d.copy_htod_async(seg.ptr(), bytes.as_ptr(), bytes.len(), StreamId::DEFAULT) }
        .unwrap();
    bytes
}

pub(crate) fn read(d: &dyn Driver, seg: &Segment) -> Vec<u8> {
    let mut out = vec![0u8; seg.committed()];
    // SAFETY: the segment is awake and `committed` bytes long.
    unsafe { d.copy_dtoh_async(out.as_mut_ptr(), seg.ptr(), out.len(), StreamId::DEFAULT) }
        .unwrap();
    d.synchronize().unwrap();
    out
}

#[test]
fn offload_round_trips_over_many_cycles_with_interleaved_allocations() {
    let (h, d) = host(1 << 30);
    let engine = SleepEngine::new(d.clone(), options());
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut segs: Vec<(Segment, Vec<u8>, DevicePtr)> = Vec::new();
    for cycle in 0..12 {
        // Interleave: add a few segments of random sizes and chunkings, drop one.
        for _ in 0..3 {
            let size = (1 + rng.below(40) as usize) * G / 2 + rng.below(G as u64) as usize;
            let chunk = [0, G, 2 * G, 5 * G][rng.below(4) as usize];
            let seg = Segment::allocate(d.clone(), size, chunk).unwrap();
            let data = fill(d.as_ref(), &seg, rng.next());
            let p = seg.ptr();
            segs.push((seg, data, p));
        }
        if cycle % 3 == 2 {
            let (seg, _, _) = segs.remove(rng.below(segs.len() as u64) as usize);
            engine.forget_segment(seg.ptr());
        }
        let before = h.counts().physical_bytes;
        let mut refs: Vec<&mut Segment> = segs.iter_mut().map(|(s, _, _)| s).collect();
        let r = engine.sleep(TagId(7), &mut refs, Policy::Offload).unwrap();
        assert_eq!(r.segments, segs.len());
        assert_eq!(r.physical_bytes, before, "every physical byte released");
        assert_eq!(h.counts().physical_bytes, 0);
        for (s, _, p) in &segs {
            assert_eq!(s.sleep_state(), SleepState::Offloaded);
            assert_eq!(s.mapped_bytes(), 0);
            assert_eq!(s.ptr(), *p);
        }
        // Sleeping again is a no-op.
        let mut refs: Vec<&mut Segment> = segs.iter_mut().map(|(s, _, _)| s).collect();
        assert_eq!(
            engine
                .sleep(TagId(7), &mut refs, Policy::Offload)
                .unwrap()
                .segments,
            0
        );
        let w = engine.wake(TagId(7), &mut refs).unwrap();
        assert_eq!(w.physical_bytes, before);
        assert_eq!(
            engine.wake(TagId(7), &mut refs).unwrap().segments,
            0,
            "wake of awake is a no-op"
        );
        for (s, data, p) in &segs {
            assert_eq!(s.ptr(), *p, "pointer stable");
            assert_eq!(s.sleep_state(), SleepState::Awake);
            assert!(
                &read(d.as_ref(), s) == data,
                "contents back byte for byte (cycle {cycle})"
            );
        }
        // Change contents, so a stale backup would be caught next cycle.
        for (s, data, _) in segs.iter_mut() {
            *data = fill(d.as_ref(), s, rng.next());
        }
    }
    drop(segs);
    drop(engine);
    let c = h.counts();
    assert_eq!(
        (c.reservations, c.handles, c.mappings, c.streams),
        (0, 0, 0, 0)
    );
}

#[test]
fn second_sleep_reuses_pinned_backup_and_reserve_ahead_pins_before() {
    let (_h, d) = host(1 << 30);
    let engine = SleepEngine::new(d.clone(), options());
    engine.reserve_backup(8 << 20).unwrap();
    let mut seg = Segment::allocate(d.clone(), 6 << 20, G).unwrap();
    fill(d.as_ref(), &seg, 3);
    let r1 = engine
        .sleep(TagId(1), &mut [&mut seg], Policy::Offload)
        .unwrap();
    assert_eq!(
        r1.newly_pinned_bytes, 0,
        "reserve-ahead covered the first sleep"
    );
    engine.wake(TagId(1), &mut [&mut seg]).unwrap();
    let r2 = engine
        .sleep(TagId(1), &mut [&mut seg], Policy::Offload)
        .unwrap();
    assert_eq!(r2.newly_pinned_bytes, 0);
    assert_eq!(engine.backup_bytes_by_tag()[&TagId(1)], 6 << 20);
}

#[test]
fn discard_comes_back_mapped_with_debug_pattern() {
    let (h, d) = host(1 << 30);
    let engine = SleepEngine::new(
        d.clone(),
        SleepOptions {
            debug_fill_discarded: Some(0xA5),
            ..options()
        },
    );
    let mut seg = Segment::allocate(d.clone(), 3 * G, G).unwrap();
    fill(d.as_ref(), &seg, 11);
    engine
        .sleep(TagId(2), &mut [&mut seg], Policy::Discard)
        .unwrap();
    assert_eq!(seg.sleep_state(), SleepState::Discarded);
    assert_eq!(h.counts().physical_bytes, 0);
    assert!(
        engine.backup_bytes_by_tag().is_empty(),
        "discard keeps no backup"
    );
    engine.wake(TagId(2), &mut [&mut seg]).unwrap();
    assert!(read(d.as_ref(), &seg).iter().all(|&b| b == 0xA5));
}

#[test]
fn wake_fails_cleanly_when_memory_is_short_then_succeeds() {
    let (h, d) = host(64 << 20);
    let engine = SleepEngine::new(d.clone(), options());
    let mut a = Segment::allocate(d.clone(), 8 << 20, G).unwrap();
    let mut b = Segment::allocate(d.clone(), 8 << 20, 2 * G).unwrap();
    let da = fill(d.as_ref(), &a, 5);
    let db = fill(d.as_ref(), &b, 6);
    engine
        .sleep(TagId(3), &mut [&mut a, &mut b], Policy::Offload)
        .unwrap();

    // Not enough free memory: refused before anything is mapped, with both numbers.
    h.set_memory_limit(10 << 20);
    let e = engine.wake(TagId(3), &mut [&mut a, &mut b]).unwrap_err();
    match &e {
        Error::OutOfMemory {
            requested, free, ..
        } => {
            assert_eq!(*requested, 16 << 20);
            assert_eq!(*free, 10 << 20);
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    assert_eq!(h.counts().physical_bytes, 0);

    // Enough by the numbers, but a create fails midway: everything rolls back.
    h.set_memory_limit(64 << 20);
    h.fail_nth(FaultOp::Create, 2);
    let e = engine.wake(TagId(3), &mut [&mut a, &mut b]).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(
        h.counts().physical_bytes,
        0,
        "chunks mapped before the failure were undone"
    );
    assert_eq!(h.counts().mappings, 0);
    assert_eq!(a.sleep_state(), SleepState::Offloaded);
    assert_eq!(b.sleep_state(), SleepState::Offloaded);

    // A map failure in the second segment (chunks were coalesced at the first wake attempt), likewise.
    h.fail_nth(FaultOp::Map, 2);
    engine.wake(TagId(3), &mut [&mut a, &mut b]).unwrap_err();
    assert_eq!(h.counts().mappings, 0);

    // Memory available again: everything comes back intact.
    engine.wake(TagId(3), &mut [&mut a, &mut b]).unwrap();
    assert!(read(d.as_ref(), &a) == da);
    assert!(read(d.as_ref(), &b) == db);
}

#[test]
fn offload_over_the_host_limit_changes_nothing() {
    let (h, d) = host(1 << 30);
    let engine = SleepEngine::new(
        d.clone(),
        SleepOptions {
            host_memory_limit: 4 << 20,
            ..options()
        },
    );
    let mut seg = Segment::allocate(d.clone(), 8 << 20, G).unwrap();
    let data = fill(d.as_ref(), &seg, 9);
    let e = engine
        .sleep(TagId(4), &mut [&mut seg], Policy::Offload)
        .unwrap_err();
    assert!(
        matches!(e, Error::HostOutOfMemory { requested, .. } if requested == 8 << 20),
        "{e}"
    );
    assert_eq!(seg.sleep_state(), SleepState::Awake);
    assert_eq!(h.counts().physical_bytes, 8 << 20);
    assert!(read(d.as_ref(), &seg) == data);
}

#[derive(Debug)]
struct PatternSource {
    ranges: Vec<(DevicePtr, usize)>,
}

impl ReloadSource for PatternSource {
    fn reload(
        &self,
        driver: &dyn Driver,
        ranges: &[(DevicePtr, usize)],
    ) -> vmmweights::Result<u64> {
        let mut n = 0;
        for &(a, l) in &self.ranges {
            for &(b, m) in ranges {
                let lo = a.max(b);
                let hi = (a + l as u64).min(b + m as u64);
                if lo < hi {
                    let bytes: Vec<u8> = (lo..hi).map(|x| (x % 251) as u8).collect();
                    // SAFETY: [lo, hi) is inside a range the engine just mapped.
                    unsafe {
                        driver.copy_htod_async(
                            lo,
                            bytes.as_ptr(),
                            bytes.len(),
                            StreamId::DEFAULT,
                        )?
                    };
                    n += bytes.len() as u64;
                }
            }
        }
        driver.synchronize()?;
        Ok(n)
    }

    fn covered_ranges(&self) -> Vec<(DevicePtr, usize)> {
        self.ranges.clone()
    }
}

#[test]
fn reload_restores_from_the_source_and_needs_one() {
    let (h, d) = host(1 << 30);
    let engine = SleepEngine::new(d.clone(), options());
    let mut seg = Segment::allocate(d.clone(), 4 * G, G).unwrap();
    let e = engine
        .sleep(TagId(5), &mut [&mut seg], Policy::Reload)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e}");
    assert_eq!(seg.sleep_state(), SleepState::Awake);

    let whole = [(seg.ptr(), seg.committed())];
    engine
        .add_reload_source_within(
            TagId(5),
            Arc::new(PatternSource {
                ranges: whole.to_vec(),
            }),
            None,
            &whole,
        )
        .unwrap();
    engine
        .sleep(TagId(5), &mut [&mut seg], Policy::Reload)
        .unwrap();
    assert_eq!(seg.sleep_state(), SleepState::Reloadable);
    assert_eq!(h.counts().physical_bytes, 0);
    let r = engine.wake(TagId(5), &mut [&mut seg]).unwrap();
    assert_eq!(r.reloaded_bytes, seg.committed() as u64);
    let got = read(d.as_ref(), &seg);
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, &b)| b == ((seg.ptr() + i as u64) % 251) as u8));
}

#[test]
fn concurrent_sleep_and_wake_from_threads_are_safe() {
    let (h, d) = host(1 << 30);
    let engine = Arc::new(SleepEngine::new(d.clone(), options()));
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let engine = engine.clone();
            let d = d.clone();
            s.spawn(move || {
                let mut segs: Vec<Segment> = (0..3)
                    .map(|k| Segment::allocate(d.clone(), (k + 1) * 3 * G, G).unwrap())
                    .collect();
                let data: Vec<Vec<u8>> = segs
                    .iter()
                    .enumerate()
                    .map(|(k, s)| fill(d.as_ref(), s, t * 100 + k as u64 + 1))
                    .collect();
                for round in 0..10 {
                    let policy = if round % 4 == 3 {
                        Policy::Discard
                    } else {
                        Policy::Offload
                    };
                    let mut refs: Vec<&mut Segment> = segs.iter_mut().collect();
                    engine.sleep(TagId(t as u32), &mut refs, policy).unwrap();
                    engine.wake(TagId(t as u32), &mut refs).unwrap();
                    if policy == Policy::Offload {
                        for (s, want) in segs.iter().zip(&data) {
                            assert!(&read(d.as_ref(), s) == want);
                        }
                    } else {
                        for (s, want) in segs.iter().zip(&data) {
                            // SAFETY: awake segment of `want.len()` bytes.
                            unsafe {
                                d.copy_htod_async(
                                    s.ptr(),
                                    want.as_ptr(),
                                    want.len(),
                                    StreamId::DEFAULT,
                                )
                                .unwrap()
                            };
                        }
                    }
                }
            });
        }
    });
    assert_eq!(h.counts().physical_bytes, 0, "all segments dropped");
}

/// Child half of `touching_asleep_memory_faults`: runs only when re-executed.
#[test]
fn child_touches_asleep_memory() {
    if std::env::var("VMMW_SLEEP_FAULT_CHILD").is_err() {
        return;
    }
    let (_h, d) = host(1 << 30);
    let engine = SleepEngine::new(d.clone(), options());
    let mut seg = Segment::allocate(d.clone(), 2 * G, G).unwrap();
    engine
        .sleep(TagId(1), &mut [&mut seg], Policy::Offload)
        .unwrap();
    // SAFETY: deliberately invalid: the memory is asleep and must fault.
    unsafe { std::ptr::write_volatile(seg.ptr() as *mut u8, 1) };
    eprintln!("write to asleep memory did not fault");
    std::process::exit(3);
}

#[test]
fn touching_asleep_memory_faults() {
    use std::os::unix::process::ExitStatusExt;
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "sleep_engine::child_touches_asleep_memory",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("VMMW_SLEEP_FAULT_CHILD", "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "child should die of SIGSEGV; status {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn rechunk_recuts_unmapped_runs_and_keeps_contents_through_wake() {
    let (h, d) = host(1 << 30);
    let engine = SleepEngine::new(
        d.clone(),
        SleepOptions {
            wake_coalesce_bytes: 3 * G,
            ..options()
        },
    );
    let mut seg = Segment::allocate(d.clone(), 10 * G, G).unwrap();
    assert_eq!(seg.chunks().len(), 10);
    let data = fill(d.as_ref(), &seg, 77);
    engine
        .sleep(TagId(9), &mut [&mut seg], Policy::Offload)
        .unwrap();
    engine.wake(TagId(9), &mut [&mut seg]).unwrap();
    let sizes: Vec<usize> = seg.chunks().iter().map(|c| c.size).collect();
    assert_eq!(sizes, vec![3 * G, 3 * G, 3 * G, G], "runs re-cut at wake");
    assert_eq!(h.counts().handles, 4);
    assert!(read(d.as_ref(), &seg) == data);
}
