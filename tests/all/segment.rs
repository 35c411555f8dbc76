//! Segment and driver tests, written once and run on every available backend.
//!
//! The host backend always runs. The CUDA backend runs when `VMMW_BACKEND=cuda`
//! (then a missing driver is a failure) or when `VMMW_BACKEND` is `auto`/unset
//! and a CUDA device opens; otherwise each test prints `SKIP cuda: <reason>`.
//! CUDA parts are serialized by a lock, so free-memory checks are not disturbed
//! by other tests allocating at the same time.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use vmmweights::driver::cuda::CudaDriver;
use vmmweights::driver::host::{FaultOp, HostConfig, HostCounts, HostDriver};
use vmmweights::driver::sync_copy::{copy_to_device, copy_to_host};
use vmmweights::driver::testing::Testing;
use vmmweights::driver::{self, kernels, round_up, ConvertType, StreamId};
use vmmweights::{BackendChoice, BackendKind, DevicePtr, Driver, Error, Segment};

// ---------------------------------------------------------------- backends

/// One backend a test runs on.
struct Backend {
    driver: Arc<dyn Driver>,
    /// Held while the test uses a shared CUDA device.
    _serial: Option<MutexGuard<'static, ()>>,
}

impl Backend {
    fn name(&self) -> BackendKind {
        self.driver.kind()
    }

    fn host(&self) -> Option<&HostDriver> {
        self.driver.as_host()
    }
}

fn cuda_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process-wide CUDA driver, or why there is none. Shared so the primary
/// context is not torn down and rebuilt between tests.
fn cuda_driver() -> Result<Arc<CudaDriver>, String> {
    static CUDA: OnceLock<Result<Arc<CudaDriver>, String>> = OnceLock::new();
    CUDA.get_or_init(|| {
        let choice = BackendChoice::from_env().map_err(|e| e.to_string())?;
        match choice {
            BackendChoice::Host => Err("VMMW_BACKEND=host".to_owned()),
            BackendChoice::Cuda => match CudaDriver::open(0) {
                Ok(d) => Ok(Arc::new(d)),
                // Asked for explicitly: not having it is a failure, not a skip.
                Err(e) => panic!("VMMW_BACKEND=cuda but the CUDA driver did not open: {e}"),
            },
            BackendChoice::Auto => CudaDriver::open(0)
                .map(Arc::new)
                .map_err(|e| format!("no usable CUDA device ({e})")),
        }
    })
    .clone()
}

/// Print a skip notice that is seen even when the harness captures output
/// (it captures the print macros, not direct writes to the stderr handle).
fn skip(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIP cuda: {why}");
}

fn fresh_host() -> Arc<HostDriver> {
    Arc::new(HostDriver::new(HostConfig::default()))
}

/// The host backend (a fresh one, so its counters belong to this test) and,
/// when available, the CUDA backend. Prints why CUDA is skipped.
fn backends(test: &str) -> Vec<Backend> {
    let mut v = vec![Backend {
        driver: fresh_host(),
        _serial: None,
    }];
    match cuda_driver() {
        Ok(d) => v.push(Backend {
            driver: d,
            _serial: Some(cuda_lock()),
        }),
        Err(why) => skip(&format!("{why} [{test}]")),
    }
    v
}

/// Runs `f` on every backend, naming the backend in any failure message.
fn on_each_backend(test: &str, mut f: impl FnMut(&Backend)) {
    for b in backends(test) {
        println!("{test}: running on {} ({})", b.name(), b.driver.describe());
        f(&b);
    }
}

// ---------------------------------------------------------------- helpers

fn write(d: &dyn Driver, dst: DevicePtr, bytes: &[u8]) {
    // SAFETY: callers pass a mapped, accessible range of at least bytes.len().
    unsafe { copy_to_device(d, dst, bytes) }.expect("copy_to_device");
}

fn read(d: &dyn Driver, src: DevicePtr, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: callers pass a mapped, accessible range of `len` bytes.
    unsafe { copy_to_host(d, &mut out, src) }.expect("copy_to_host");
    out
}

fn fill(d: &dyn Driver, dst: DevicePtr, value: u8, len: usize) {
    // SAFETY: callers pass a mapped, accessible range of `len` bytes.
    unsafe { d.memset_async(dst, value, len, StreamId::DEFAULT) }.expect("memset");
    d.stream_synchronize(StreamId::DEFAULT).expect("sync");
}

/// Deterministic bytes that differ per seed and per position.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = vec![0u8; len.next_multiple_of(8)];
    // Whole words at a time: tests run unoptimized in CI.
    for w in v.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if got == want {
        return; // a memcmp; the byte-wise search below runs only on a mismatch
    }
    if let Some(i) = got.iter().zip(want).position(|(x, y)| x != y) {
        panic!(
            "{what}: byte {i} reads {:#04x}, wrote {:#04x}",
            got[i], want[i]
        );
    }
}

/// Live objects must be back to zero on the host backend.
fn assert_no_leaks(b: &Backend, what: &str) {
    if let Some(h) = b.host() {
        assert_eq!(
            h.counts(),
            HostCounts::default(),
            "{what}: host objects leaked"
        );
    }
}

/// Free device memory, to compare before and after on CUDA.
fn free_bytes(b: &Backend) -> u64 {
    b.driver.mem_info().expect("mem_info").free
}

fn check_chunk_layout(seg: &Segment, chunk_size: usize, what: &str) {
    let mut expect_offset = 0;
    for c in seg.chunks() {
        assert_eq!(c.offset, expect_offset, "{what}: chunks are contiguous");
        assert!(
            c.size > 0 && c.size % seg.driver().granularity() == 0,
            "{what}"
        );
        if chunk_size != 0 {
            assert!(
                c.size <= chunk_size,
                "{what}: chunk {} > {chunk_size}",
                c.size
            );
        }
        assert!(c.handle.is_some(), "{what}: chunk mapped");
        expect_offset += c.size;
    }
    assert_eq!(
        expect_offset,
        seg.committed(),
        "{what}: chunks cover the commit"
    );
}

// ---------------------------------------------------------------- sizes

#[test]
fn sizes_round_up_and_hold_data() {
    on_each_backend("sizes_round_up_and_hold_data", |b| {
        let d = &b.driver;
        let g = d.granularity();
        let sizes = [1, g - 1, g, g + 1, 3 * g, 3 * g + 7, 5 * g - 1, 7 * g];
        let chunk_sizes = [0, g, 2 * g, 3 * g, g + 1];
        let mut seed = 0;
        for &size in &sizes {
            for &chunk in &chunk_sizes {
                seed += 1;
                let what = format!("{}: size {size}, chunk {chunk}", b.name());
                let seg = Segment::allocate(d.clone(), size, chunk).expect(&what);
                let want = round_up(size, g);
                assert_eq!(seg.reserved(), want, "{what}: reserved");
                assert_eq!(seg.committed(), want, "{what}: committed");
                assert_eq!(seg.mapped_bytes(), want, "{what}: mapped");
                assert!(seg.is_fully_mapped(), "{what}");
                assert_eq!(seg.ptr() % g as u64, 0, "{what}: alignment");
                let eff_chunk = if chunk == 0 { 0 } else { round_up(chunk, g) };
                check_chunk_layout(&seg, eff_chunk, &what);
                let expected_chunks = if chunk == 0 {
                    1
                } else {
                    want.div_ceil(eff_chunk)
                };
                assert_eq!(seg.chunks().len(), expected_chunks, "{what}: chunk count");

                // Every byte of the rounded size is usable, across chunk borders.
                let data = pattern(want, seed);
                write(d.as_ref(), seg.ptr(), &data);
                assert_same(&what, &read(d.as_ref(), seg.ptr(), want), &data);

                // memset a run that straddles the first chunk border (if any).
                let start = g / 2;
                let len = (want - start).min(g);
                fill(d.as_ref(), seg.ptr() + start as u64, 0xA5, len);
                let mut expect = data.clone();
                expect[start..start + len].fill(0xA5);
                assert_same(
                    &format!("{what}: after memset"),
                    &read(d.as_ref(), seg.ptr(), want),
                    &expect,
                );
                drop(seg);
                assert_no_leaks(b, &what);
            }
        }
    });
}

#[test]
fn zero_size_is_rejected_and_changes_nothing() {
    on_each_backend("zero_size_is_rejected_and_changes_nothing", |b| {
        let err = Segment::allocate(b.driver.clone(), 0, 0).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        let err = Segment::reserve(b.driver.clone(), 0, 0).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert_no_leaks(b, "zero size");
    });
}

#[test]
fn pointers_are_aligned_and_disjoint() {
    on_each_backend("pointers_are_aligned_and_disjoint", |b| {
        let g = b.driver.granularity();
        let segs: Vec<Segment> = [1, g, 3 * g + 1, 2 * g, 5]
            .iter()
            .map(|&s| Segment::allocate(b.driver.clone(), s, g).unwrap())
            .collect();
        for (i, a) in segs.iter().enumerate() {
            assert_eq!(a.ptr() % g as u64, 0, "{}: segment {i} aligned", b.name());
            for (j, c) in segs.iter().enumerate().skip(i + 1) {
                let disjoint = a.ptr() + a.reserved() as u64 <= c.ptr()
                    || c.ptr() + c.reserved() as u64 <= a.ptr();
                assert!(disjoint, "{}: segments {i} and {j} overlap", b.name());
            }
        }
        // Each segment keeps its own bytes.
        for (i, s) in segs.iter().enumerate() {
            write(b.driver.as_ref(), s.ptr(), &pattern(s.reserved(), i as u64));
        }
        for (i, s) in segs.iter().enumerate() {
            let got = read(b.driver.as_ref(), s.ptr(), s.reserved());
            assert_same(
                &format!("segment {i}"),
                &got,
                &pattern(s.reserved(), i as u64),
            );
        }
        drop(segs);
        assert_no_leaks(b, "aligned segments");
    });
}

// ---------------------------------------------------------------- out of memory

fn assert_oom(r: vmmweights::Result<Segment>, what: &str) {
    match r {
        Err(Error::OutOfMemory {
            requested, free, ..
        }) => {
            assert!(requested > 0, "{what}: requested is reported");
            println!("{what}: out of memory as expected (requested {requested}, free {free})");
        }
        Err(e) => panic!("{what}: expected OutOfMemory, got {e}"),
        Ok(s) => panic!(
            "{what}: expected OutOfMemory, got a segment of {} bytes",
            s.reserved()
        ),
    }
}

#[test]
fn out_of_memory_at_the_limit_leaks_nothing() {
    on_each_backend("out_of_memory_at_the_limit_leaks_nothing", |b| {
        let d = &b.driver;
        let g = d.granularity();
        if let Some(h) = b.host() {
            h.set_memory_limit(4 * g as u64);
            // Exactly at the limit works.
            let full = Segment::allocate(d.clone(), 4 * g, 0).expect("allocation at the limit");
            // One granule more fails, in one chunk and in several.
            assert_oom(
                Segment::allocate(d.clone(), 1, 0),
                "host: 1 byte over a full limit",
            );
            let live = h.counts();
            assert_eq!((live.reservations, live.handles, live.mappings), (1, 1, 1));
            drop(full);
            assert_oom(
                Segment::allocate(d.clone(), 5 * g, 0),
                "host: one chunk over",
            );
            assert_oom(
                Segment::allocate(d.clone(), 6 * g, g),
                "host: the fifth of six chunks is over the limit",
            );
            assert_no_leaks(b, "host out of memory");
            // And the limit is usable again afterwards.
            drop(Segment::allocate(d.clone(), 4 * g, g).expect("after OOM"));
            assert_no_leaks(b, "host after OOM");
        } else {
            let info = d.mem_info().unwrap();
            let before = info.free;
            let too_much = round_up(info.total as usize, g) + g;
            assert_oom(
                Segment::allocate(d.clone(), too_much, 0),
                "cuda: one chunk larger than the device",
            );
            assert_eq!(
                free_bytes(b),
                before,
                "cuda: free memory after a failed single chunk"
            );
            // Several chunks: some are created before the device runs out.
            let chunk = round_up((info.total / 4) as usize, g);
            assert_oom(
                Segment::allocate(d.clone(), too_much, chunk),
                "cuda: chunks of a quarter of the device",
            );
            assert_eq!(
                free_bytes(b),
                before,
                "cuda: free memory after a failed chunked segment"
            );
        }
    });
}

// ---------------------------------------------------------------- fault injection

#[test]
fn injected_failures_at_each_step_leak_nothing() {
    for b in backends("injected_failures_at_each_step_leak_nothing") {
        let Some(h) = b.host() else {
            skip("fault injection is a host-backend hook; the real driver has no such switch");
            continue;
        };
        let d = &b.driver;
        let g = d.granularity();
        for op in [
            FaultOp::Reserve,
            FaultOp::Create,
            FaultOp::Map,
            FaultOp::SetAccess,
        ] {
            for nth in 1..=3u64 {
                let what = format!("{op:?} failing on call {nth}");
                h.fail_nth(op, nth);
                // Three chunks: reserve is called once, the others three times.
                let r = Segment::allocate(d.clone(), 3 * g, g);
                let should_fail = op != FaultOp::Reserve || nth == 1;
                match r {
                    Err(e) if should_fail => {
                        match op {
                            FaultOp::Create => {
                                assert!(matches!(e, Error::OutOfMemory { .. }), "{what}: {e}")
                            }
                            _ => assert!(matches!(e, Error::Driver { .. }), "{what}: {e}"),
                        }
                        assert_no_leaks(&b, &what);
                    }
                    Err(e) => panic!("{what}: unexpected failure {e}"),
                    Ok(seg) if !should_fail => drop(seg),
                    Ok(_) => panic!("{what}: the injected failure did not surface"),
                }
                h.clear_faults();
                assert_no_leaks(&b, &what);
            }
        }

        // map_all is transactional: a failure midway leaves every chunk unmapped.
        let mut seg = Segment::allocate(d.clone(), 4 * g, g).unwrap();
        let base = seg.ptr();
        seg.unmap_all().unwrap();
        for op in [FaultOp::Create, FaultOp::Map, FaultOp::SetAccess] {
            for nth in 1..=3u64 {
                h.fail_nth(op, nth);
                let e = seg.map_all().expect_err("map_all with an injected failure");
                h.clear_faults();
                assert_eq!(seg.mapped_bytes(), 0, "{op:?}/{nth}: {e}");
                let c = h.counts();
                assert_eq!(
                    (c.reservations, c.handles, c.mappings, c.physical_bytes),
                    (1, 0, 0, 0),
                    "{op:?}/{nth}: map_all rolled back"
                );
            }
        }
        seg.map_all().unwrap();
        assert_eq!(seg.ptr(), base);
        assert_eq!(seg.mapped_bytes(), 4 * g);

        // commit growth is transactional too.
        let mut grow = Segment::reserve(d.clone(), 8 * g, 2 * g).unwrap();
        grow.commit(g).unwrap();
        h.fail_nth(FaultOp::Map, 2);
        grow.commit(8 * g)
            .expect_err("commit with an injected map failure");
        h.clear_faults();
        assert_eq!(grow.committed(), g);
        assert_eq!(grow.chunks().len(), 1);
        assert_eq!(
            h.counts().handles,
            1 + 4,
            "one commit chunk + the 4 of `seg`"
        );
        grow.commit(8 * g).unwrap();
        assert_eq!(grow.mapped_bytes(), 8 * g);
        drop((seg, grow));
        assert_no_leaks(&b, "after fault-injection cases");
    }
}

// ---------------------------------------------------------------- segment operations

#[test]
fn unmap_all_and_map_all_keep_the_pointer() {
    on_each_backend("unmap_all_and_map_all_keep_the_pointer", |b| {
        let d = &b.driver;
        let g = d.granularity();
        let free0 = free_bytes(b);
        let mut seg = Segment::allocate(d.clone(), 4 * g, g).unwrap();
        let ptr = seg.ptr();
        write(d.as_ref(), ptr, &pattern(4 * g, 7));
        let free_mapped = free_bytes(b);
        assert!(
            free_mapped <= free0 - 4 * g as u64,
            "{}: memory is used",
            b.name()
        );

        d.synchronize().unwrap();
        seg.unmap_all().unwrap();
        assert_eq!(seg.ptr(), ptr);
        assert_eq!(seg.mapped_bytes(), 0);
        assert_eq!(seg.committed(), 4 * g, "chunks keep their places");
        assert!(seg.chunks().iter().all(|c| c.handle.is_none()));
        assert!(
            free_bytes(b) >= free_mapped + 4 * g as u64,
            "unmap returns memory"
        );
        if let Some(h) = b.host() {
            let c = h.counts();
            assert_eq!((c.reservations, c.handles, c.mappings), (1, 0, 0));
        }
        seg.unmap_all().unwrap(); // idempotent

        seg.map_all().unwrap();
        assert_eq!(seg.ptr(), ptr, "pointer stable across unmap/map");
        assert!(seg.is_fully_mapped());
        let data = pattern(4 * g, 8);
        write(d.as_ref(), ptr, &data);
        assert_same("after remap", &read(d.as_ref(), ptr, 4 * g), &data);

        // One chunk at a time.
        seg.unmap_chunk(2).unwrap();
        assert_eq!(seg.mapped_bytes(), 3 * g);
        assert!(!seg.is_fully_mapped());
        assert_same(
            "chunks 0-1 survive unmapping chunk 2",
            &read(d.as_ref(), ptr, 2 * g),
            &data[..2 * g],
        );
        seg.map_chunk(2).unwrap();
        seg.map_chunk(2).unwrap(); // no-op when mapped
        assert!(seg.is_fully_mapped());
        drop(seg);
        assert_no_leaks(b, "unmap/map");
    });
}

#[test]
fn commit_and_decommit_grow_and_shrink() {
    on_each_backend("commit_and_decommit_grow_and_shrink", |b| {
        let d = &b.driver;
        let g = d.granularity();
        let mut seg = Segment::reserve(d.clone(), 8 * g, 2 * g).unwrap();
        let ptr = seg.ptr();
        assert_eq!(
            (seg.reserved(), seg.committed(), seg.mapped_bytes()),
            (8 * g, 0, 0)
        );

        seg.commit(1).unwrap();
        assert_eq!(seg.committed(), g);
        seg.commit(5 * g).unwrap();
        let sizes: Vec<usize> = seg.chunks().iter().map(|c| c.size).collect();
        assert_eq!(sizes, vec![g, 2 * g, 2 * g]);
        assert_eq!(seg.committed(), 5 * g);
        let data = pattern(5 * g, 3);
        write(d.as_ref(), ptr, &data);

        // Past the reservation: an error, and nothing changes.
        let e = seg.commit(9 * g).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert_eq!(seg.committed(), 5 * g);
        // Committing less than is committed is a no-op.
        seg.commit(2 * g).unwrap();
        assert_eq!(seg.committed(), 5 * g);

        // Shrink to a point inside a chunk: rounds up to that chunk's end.
        d.synchronize().unwrap();
        seg.decommit(2 * g).unwrap();
        assert_eq!(seg.committed(), 3 * g);
        assert_eq!(seg.mapped_bytes(), 3 * g);
        assert_same("kept chunks", &read(d.as_ref(), ptr, 3 * g), &data[..3 * g]);

        seg.decommit(0).unwrap();
        assert_eq!((seg.committed(), seg.mapped_bytes()), (0, 0));
        assert!(seg.chunks().is_empty());
        if let Some(h) = b.host() {
            let c = h.counts();
            assert_eq!((c.reservations, c.handles, c.mappings), (1, 0, 0));
        }
        seg.commit(8 * g).unwrap();
        assert_eq!(seg.ptr(), ptr);
        assert_eq!(seg.mapped_bytes(), 8 * g);
        drop(seg);
        assert_no_leaks(b, "commit/decommit");
    });
}

#[test]
fn rechunk_unmapped_merges_adjacent_runs() {
    on_each_backend("rechunk_unmapped_merges_adjacent_runs", |b| {
        let d = &b.driver;
        let g = d.granularity();
        let mut seg = Segment::allocate(d.clone(), 6 * g, g).unwrap();
        for i in [1, 2, 3, 5] {
            seg.unmap_chunk(i).unwrap();
        }
        let layout = |s: &Segment| -> Vec<(usize, usize, bool)> {
            s.chunks()
                .iter()
                .map(|c| (c.offset / g, c.size / g, c.handle.is_some()))
                .collect()
        };
        seg.rechunk_unmapped(2 * g);
        assert_eq!(
            layout(&seg),
            vec![
                (0, 1, true),
                (1, 2, false),
                (3, 1, false),
                (4, 1, true),
                (5, 1, false)
            ]
        );
        seg.rechunk_unmapped(usize::MAX);
        assert_eq!(
            layout(&seg),
            vec![(0, 1, true), (1, 3, false), (4, 1, true), (5, 1, false)]
        );
        assert_eq!(seg.committed(), 6 * g);
        if let Some(h) = b.host() {
            assert_eq!(h.counts().handles, 2);
        }
        seg.map_all().unwrap();
        assert!(seg.is_fully_mapped());
        assert_eq!(seg.mapped_bytes(), 6 * g);
        let data = pattern(6 * g, 11);
        write(d.as_ref(), seg.ptr(), &data);
        assert_same(
            "after coalesce + map_all",
            &read(d.as_ref(), seg.ptr(), 6 * g),
            &data,
        );
        // The merged chunk is one physical handle now: 4 handles for 4 chunks.
        if let Some(h) = b.host() {
            assert_eq!(h.counts().handles, 4);
        }
        drop(seg);
        assert_no_leaks(b, "coalesce");
    });
}

#[test]
fn segments_work_from_many_threads() {
    on_each_backend("segments_work_from_many_threads", |b| {
        let g = b.driver.granularity();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let d = b.driver.clone();
                s.spawn(move || {
                    for round in 0..3 {
                        let seg = Segment::allocate(d.clone(), 2 * g + 1, g).unwrap();
                        let data = pattern(seg.reserved(), t * 10 + round);
                        write(d.as_ref(), seg.ptr(), &data);
                        assert_same(
                            &format!("thread {t} round {round}"),
                            &read(d.as_ref(), seg.ptr(), data.len()),
                            &data,
                        );
                    }
                });
            }
        });
        assert_no_leaks(b, "threads");
    });
}

// ---------------------------------------------------------------- faults on touch

const TOUCH_ENV: &str = "VMMW_TEST_TOUCH_CHILD";

/// In the child: set up the requested state and touch it.
fn touch_child(mode: &str) -> ! {
    let d: Arc<dyn Driver> = fresh_host();
    let g = d.granularity();
    let ptr = match mode {
        "mapped" => {
            let seg = Segment::allocate(d.clone(), g, 0).unwrap();
            let p = seg.ptr();
            std::mem::forget(seg);
            p
        }
        "unmapped" => {
            let mut seg = Segment::allocate(d.clone(), 2 * g, g).unwrap();
            seg.unmap_chunk(1).unwrap();
            let p = seg.ptr() + g as u64 + 8;
            std::mem::forget(seg);
            p
        }
        "reserved" => {
            let seg = Segment::reserve(d.clone(), g, 0).unwrap();
            let p = seg.ptr();
            std::mem::forget(seg);
            p
        }
        other => panic!("unknown touch mode {other}"),
    };
    println!("child: touching {mode} address {ptr:#x}");
    // SAFETY: deliberately not safe in the "unmapped"/"reserved" modes: the
    // point is that the process dies of SIGSEGV there, as a GPU would fault.
    let v = unsafe { std::ptr::read_volatile(ptr as *const u8) };
    println!("child: read {v:#x}, no fault");
    std::process::exit(0);
}

fn run_touch_child(mode: &str) -> std::process::Output {
    let exe = std::env::current_exe().unwrap();
    std::process::Command::new(exe)
        .args([
            "--exact",
            "segment::touching_unmapped_memory_faults",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(TOUCH_ENV, mode)
        .env("VMMW_BACKEND", "host")
        .output()
        .expect("spawn the test binary")
}

#[test]
fn touching_unmapped_memory_faults() {
    if let Ok(mode) = std::env::var(TOUCH_ENV) {
        touch_child(&mode);
    }
    use std::os::unix::process::ExitStatusExt;
    // The control: a mapped range is readable and the child exits normally,
    // so a SIGSEGV below is the unmapping's doing, not the harness's.
    let out = run_touch_child("mapped");
    assert!(
        out.status.success(),
        "mapped touch should succeed: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    for mode in ["unmapped", "reserved"] {
        let out = run_touch_child(mode);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("child: touching"),
            "{mode}: child ran:\n{stdout}"
        );
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGSEGV),
            "{mode}: child should die of SIGSEGV, got {:?}\n{stdout}",
            out.status
        );
        println!("{mode}: child died of SIGSEGV as expected");
    }
    match cuda_driver() {
        Ok(_) => skip(
            "touching unmapped device memory is an asynchronous illegal-address error that \
             poisons the whole context, not a process signal; checked on host only",
        ),
        Err(why) => skip(&format!("{why} [touching_unmapped_memory_faults]")),
    }
}

// ---------------------------------------------------------------- missing driver

#[test]
fn missing_cuda_driver_is_reported_not_panicked() {
    match CudaDriver::open(0) {
        Ok(d) => {
            println!(
                "CUDA present ({}); checking a bad ordinal instead",
                d.describe()
            );
            for ordinal in [-1, 9999] {
                match CudaDriver::open(ordinal) {
                    Err(Error::DriverUnavailable(msg)) => {
                        assert!(msg.contains(&ordinal.to_string()), "{msg}");
                        println!("device {ordinal}: {msg}");
                    }
                    Err(e) => panic!("device {ordinal}: expected DriverUnavailable, got {e}"),
                    Ok(_) => panic!("device {ordinal} opened"),
                }
            }
            let opened = driver::open(BackendChoice::Auto, 0).unwrap();
            assert_eq!(opened.driver.kind(), BackendKind::Cuda, "{}", opened.reason);
        }
        Err(Error::DriverUnavailable(msg)) => {
            println!("no CUDA here: {msg}");
            assert!(msg.len() > 10, "the message says why: {msg:?}");
            let e = driver::open(BackendChoice::Cuda, 0).unwrap_err();
            assert!(matches!(e, Error::DriverUnavailable(_)), "{e}");
            assert_eq!(e.status(), vmmweights::Status::DriverUnavailable);
            let opened = driver::open(BackendChoice::Auto, 0).unwrap();
            assert_eq!(opened.driver.kind(), BackendKind::Host);
            assert!(
                opened.reason.contains("host") && opened.reason.contains(&msg),
                "auto says why it fell back: {}",
                opened.reason
            );
            println!("auto: {}", opened.reason);
        }
        Err(e) => panic!("expected Ok or DriverUnavailable, got {e}"),
    }
    let e = BackendChoice::parse("gpu").unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("gpu"),
        "{e}"
    );
    assert_eq!(BackendChoice::parse(" CUDA ").unwrap(), BackendChoice::Cuda);
}

// ---------------------------------------------------------------- conversion kernels

/// Source bits for `t`: every value class (zeros, subnormals, halfway cases,
/// overflow, infinities, NaN) followed by pseudo-random bit patterns.
fn conversion_source(t: ConvertType, count: usize, seed: u64) -> Vec<u8> {
    let mut v = match t {
        ConvertType::F32 => {
            let specials: [u32; 14] = [
                0,
                0x8000_0000,
                1,           // smallest subnormal
                0x0080_0000, // smallest normal
                0x3F80_8000, // bf16 halfway, even below
                0x3F81_8000, // bf16 halfway, odd below
                0x3380_0000, // 2^-24: smallest f16 subnormal
                0x3300_0000, // 2^-25: f16 halfway to zero
                0x477F_F000, // 65520: rounds to f16 infinity
                0x477F_E000, // 65504: f16 max
                0x7F7F_FFFF, // f32 max: bf16 overflow to infinity
                0x7F80_0000, // +inf
                0xFF80_0000, // -inf
                0x7FC0_0001, // NaN
            ];
            specials
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>()
        }
        ConvertType::F16 | ConvertType::Bf16 => {
            // Every 16-bit pattern once, so all values are covered.
            (0..=u16::MAX).flat_map(|x| x.to_le_bytes()).collect()
        }
    };
    let want = count * t.size();
    let rest = want.saturating_sub(v.len());
    v.extend(pattern(rest, seed));
    v.truncate(want);
    v
}

fn is_nan(t: ConvertType, bytes: &[u8]) -> bool {
    match t {
        ConvertType::F32 => f32::from_le_bytes(bytes.try_into().unwrap()).is_nan(),
        ConvertType::F16 => half::f16::from_le_bytes(bytes.try_into().unwrap()).is_nan(),
        ConvertType::Bf16 => half::bf16::from_le_bytes(bytes.try_into().unwrap()).is_nan(),
    }
}

#[test]
fn conversion_kernels_match_the_cpu_bit_for_bit() {
    on_each_backend("conversion_kernels_match_the_cpu_bit_for_bit", |b| {
        let d = &b.driver;
        // Odd counts, so the tail of the kernel's grid-stride loop is hit. The
        // host path is the reference itself, so fewer values do there (tests
        // run unoptimized); every 16-bit pattern is still included.
        let count: usize = match b.name() {
            BackendKind::Cuda => 3_000_017,
            BackendKind::Host => 200_003,
        };
        let stream = d.stream_create().unwrap();
        for (n, (from, to)) in kernels::PAIRS.into_iter().enumerate() {
            let what = format!("{}: {from:?} -> {to:?}", b.name());
            let src = conversion_source(from, count, n as u64 + 1);
            let mut want = vec![0u8; count * to.size()];
            // SAFETY: both buffers are sized for `count` elements of their types.
            unsafe {
                vmmweights::driver::convert::convert_on_cpu(
                    want.as_mut_ptr(),
                    to,
                    src.as_ptr(),
                    from,
                    count,
                )
            };
            let src_seg = Segment::allocate(d.clone(), src.len(), 0).unwrap();
            let dst_seg = Segment::allocate(d.clone(), want.len(), 0).unwrap();
            write(d.as_ref(), src_seg.ptr(), &src);
            fill(d.as_ref(), dst_seg.ptr(), 0xEE, want.len());
            // SAFETY: both segments are mapped and sized for `count` elements, and disjoint.
            unsafe { d.convert_async(dst_seg.ptr(), to, src_seg.ptr(), from, count, stream) }
                .expect(&what);
            d.stream_synchronize(stream).unwrap();
            let got = read(d.as_ref(), dst_seg.ptr(), want.len());
            let (ss, ts) = (from.size(), to.size());
            let mut nans = 0;
            // Bits may differ only where the source is NaN (NaN payloads are not
            // specified); the per-element walk runs only when something differs.
            let elements = if got == want { 0 } else { count };
            for i in 0..elements {
                let (g, w) = (&got[i * ts..(i + 1) * ts], &want[i * ts..(i + 1) * ts]);
                if is_nan(from, &src[i * ss..(i + 1) * ss]) {
                    nans += 1;
                    assert!(is_nan(to, g), "{what}: element {i}: NaN in, {g:02x?} out");
                    continue;
                }
                assert_eq!(
                    g,
                    w,
                    "{what}: element {i}, source {:02x?}",
                    &src[i * ss..(i + 1) * ss]
                );
            }
            println!(
                "{what}: {count} values equal bit for bit ({nans} differing NaN sources still NaN)"
            );
        }
        d.stream_destroy(stream).unwrap();
        assert_no_leaks(b, "conversion");
    });
}
