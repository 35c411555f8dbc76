//! Attacks on swaps, waiting wakes and the chunks a stopped transition
//! leaves mapped, on the host backend: every case checks that no byte is
//! lost, or that the loss is refused loudly.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::loader::{generate, read, write_sharded, SMALL};
use common::swap::{config, pattern, write, G, POLICIES};
use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::{DevicePtr, Driver};
use vmmweights::loader::{Dtype, Session};
use vmmweights::pool::{Pool, SwapOptions};
use vmmweights::sleep::{Policy, WakeOptions};
use vmmweights::tag::{self, TagId};

fn unique(name: &str) -> TagId {
    common::swap::unique("swap-attack", name)
}

const BLOCK: usize = 4 << 20;
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

/// A tag holding a loaded checkpoint whose bytes were then written over in
/// part (Reload must keep those writes: README "What Reload restores"), and
/// a block no checkpoint restores.
struct Model {
    tag: TagId,
    _session: Session,
}

fn checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &generate(&SMALL, Dtype::Bf16), Dtype::Bf16, 2);
    dir
}

impl World {
    fn model(&self, dir: &std::path::Path, name: &str, seed: u64) -> Model {
        let tag = unique(name);
        let session = Session::open(dir).unwrap();
        session.allocate(&self.pool, tag).unwrap();
        session.load(&self.pool, None).unwrap();
        let b = self.pool.alloc_tagged(BLOCK, tag).unwrap();
        write(self.d(), b.ptr, &pattern(seed ^ b.ptr, b.size));
        // Every live block changed in its middle after the load.
        for blk in self.pool.live_blocks().into_iter().filter(|x| x.tag == tag) {
            let n = (blk.size / 3).clamp(1, 4096);
            write(
                self.d(),
                blk.ptr + (blk.size / 2) as u64,
                &pattern(seed ^ 0x5eed ^ blk.ptr, n.min(blk.size - blk.size / 2)),
            );
        }
        Model {
            tag,
            _session: session,
        }
    }

    fn bytes(&self, t: TagId) -> Blocks {
        self.pool
            .live_blocks()
            .into_iter()
            .filter(|b| b.tag == t)
            .map(|b| (b.ptr, read(self.d(), b.ptr, b.size)))
            .collect()
    }

    fn same(&self, t: TagId, before: &[(DevicePtr, Vec<u8>)], what: &str) {
        let now = self.bytes(t);
        assert_eq!(now.len(), before.len(), "{what}: live blocks changed");
        for ((p, a), (q, b)) in now.iter().zip(before) {
            assert_eq!(p, q, "{what}: a block moved");
            assert!(
                a == b,
                "{what}: block at {p:#x} differs at byte {:?}",
                first_diff(a, b)
            );
        }
    }
}

/// Every policy pair, with the loaded bytes of both tags written over after
/// their load: Reload on either side keeps the writes, on a device with room
/// for one model and a half.
#[test]
fn every_policy_pair_keeps_bytes_written_after_the_load() {
    let dir = checkpoint();
    let probe = World::new(1 << 30);
    let one = {
        let m = probe.model(dir.path(), "probe", 0);
        probe.mapped(m.tag)
    };
    // Room for one model and a half: the wake maps as the sleep releases.
    let limit = one + one / 2;
    for asleep in POLICIES {
        for sleeping in POLICIES {
            let what = format!("{sleeping:?} sleeps while {asleep:?} wakes, device {limit}");
            let w = World::new(limit);
            let a = w.model(dir.path(), "a", 31);
            w.pool.sleep(&[(a.tag, Policy::Offload)]).unwrap();
            let b = w.model(dir.path(), "b", 32);
            let bytes_b = w.bytes(b.tag);
            w.pool.sleep(&[(b.tag, asleep)]).unwrap();
            w.pool.wake(&[a.tag]).unwrap();
            let bytes_a = w.bytes(a.tag);
            let out = w.pool.swap(&[(a.tag, sleeping)], &[b.tag]).unwrap();
            assert!(
                out.is_ok(),
                "{what}: {:?} / {:?}",
                out.sleep_error,
                out.wake_error
            );
            if asleep != Policy::Discard {
                w.same(b.tag, &bytes_b, &what);
            }
            let back = w.pool.swap(&[(b.tag, asleep)], &[a.tag]).unwrap();
            assert!(
                back.is_ok(),
                "{what}, back: {:?} / {:?}",
                back.sleep_error,
                back.wake_error
            );
            if sleeping != Policy::Discard {
                w.same(a.tag, &bytes_a, &format!("{what}, back"));
            }
            w.pool.check_invariants().unwrap();
        }
    }
}

/// Each asleep byte the pool hands out of a backup is the byte the block
/// held: a read either fails loudly or returns exactly that.
fn backup_reads_are_fresh(w: &World, t: TagId, before: &[(DevicePtr, Vec<u8>)], what: &str) {
    if !w.pool.is_tag_asleep(t) {
        return;
    }
    for (p, want) in before {
        let mut got = vec![0u8; want.len()];
        if w.pool.read_backup(*p, &mut got).is_ok() {
            assert!(
                got == *want,
                "{what}: a backup read of the block at {p:#x} returned other bytes (byte {:?})",
                first_diff(&got, want)
            );
        }
    }
}

/// A swap whose sides fail midway at each driver step, then either a wake
/// straight away or a sleep that finishes first: no byte of either tag is
/// lost, and no backup read returns bytes the block did not hold. One pool
/// per policy goes through every case in turn, so what a stopped transition
/// leaves behind meets the next one.
#[test]
fn a_swap_failing_at_each_driver_step_loses_nothing() {
    let dir = checkpoint();
    let ops = [
        FaultOp::CopyDtoh,
        FaultOp::Unmap,
        FaultOp::Release,
        FaultOp::Codec,
        FaultOp::HostRegister,
        FaultOp::Hash,
        FaultOp::Create,
        FaultOp::Map,
        FaultOp::SetAccess,
        FaultOp::Reserve,
        FaultOp::CopyHtod,
        FaultOp::Synchronize,
        FaultOp::FileRead,
    ];
    let mut fired = 0;
    for sleeping in POLICIES {
        let w = World::new(1 << 30);
        let a = w.model(dir.path(), "a", 41);
        let b = w.model(dir.path(), "b", 42);
        for op in ops {
            for nth in [1, 3] {
                let finish_first = nth == 3;
                let what = format!("{sleeping:?} sleeping, {op:?} #{nth}");
                let bytes_b = w.bytes(b.tag);
                // The waking side decodes frames where the fault is the codec's.
                let asleep = match op {
                    FaultOp::Codec | FaultOp::Synchronize => Policy::OffloadCompressed,
                    FaultOp::FileRead => Policy::Reload,
                    _ => Policy::Offload,
                };
                w.pool.sleep(&[(b.tag, asleep)]).unwrap();
                let bytes_a = w.bytes(a.tag);
                w.h.fail_nth(op, nth);
                let out = w.pool.swap(&[(a.tag, sleeping)], &[b.tag]);
                fired += usize::from(!w.h.fault_pending(op));
                w.h.clear_faults();
                let out = match out {
                    Ok(out) => out,
                    Err(e) => panic!("{what}: refused up front: {e}"),
                };
                if out.sleep_error.is_some() {
                    backup_reads_are_fresh(&w, a.tag, &bytes_a, &what);
                    if finish_first {
                        w.pool.sleep(&[(a.tag, sleeping)]).unwrap();
                        backup_reads_are_fresh(&w, a.tag, &bytes_a, &what);
                    }
                }
                if out.wake_error.is_some() {
                    assert!(w.pool.is_tag_asleep(b.tag), "{what}");
                    w.pool.wake(&[b.tag]).unwrap();
                }
                w.same(b.tag, &bytes_b, &format!("{what}: b"));
                w.pool.wake(&[a.tag]).unwrap();
                if sleeping != Policy::Discard {
                    w.same(a.tag, &bytes_a, &format!("{what}: a"));
                }
                w.pool.check_invariants().unwrap();
            }
        }
    }
    assert!(fired > 70, "only {fired} faults fired");
}

/// Blocks of a tag and the bytes each holds.
type Blocks = Vec<(DevicePtr, Vec<u8>)>;

/// Swaps at once on one pool: two pairs of tags swapped back and forth on
/// three threads (one pair from both ends at once, so two swaps name the
/// same tags in the other order), while a fourth allocates and frees in the
/// swapped tags and writes in another. Nothing waits forever, allocations in
/// a tag in transition are refused or succeed whole, and every byte comes
/// back.
#[test]
fn swaps_at_once_and_allocations_in_their_tags_lose_nothing() {
    let w = World::new(1 << 30);
    let tags: Vec<(TagId, Blocks)> = ["a", "b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(k, n)| {
            let t = unique(n);
            let blocks = (0..3)
                .map(|j| {
                    let b = w.pool.alloc_tagged(BLOCK / 2 + j * G, t).unwrap();
                    let data = pattern((k * 10 + j) as u64 + 51, b.size);
                    write(w.d(), b.ptr, &data);
                    (b.ptr, data)
                })
                .collect();
            (t, blocks)
        })
        .collect();
    let (a, b, c, d) = (tags[0].0, tags[1].0, tags[2].0, tags[3].0);
    w.pool
        .sleep(&[(b, Policy::Offload), (d, Policy::Offload)])
        .unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let t0 = Instant::now();
    let w = &w;
    std::thread::scope(|s| {
        let pool = &w.pool;
        let swapper = |x: TagId, y: TagId, policy: Policy| {
            move || {
                for k in 0..6 {
                    let (from, to) = if k % 2 == 0 { (x, y) } else { (y, x) };
                    let out = pool.swap(&[(from, policy)], &[to]).unwrap();
                    assert!(out.is_ok(), "{:?} / {:?}", out.sleep_error, out.wake_error);
                }
            }
        };
        let h1 = s.spawn(swapper(a, b, Policy::Offload));
        let h2 = s.spawn(swapper(b, a, Policy::OffloadCompressed));
        let h3 = s.spawn(swapper(c, d, Policy::OffloadCompressed));
        let done = &done;
        let other = unique("other");
        let bg = s.spawn(move || {
            let mut ok = 0usize;
            while !done.load(Ordering::Acquire) {
                // Not written: a block of a tag may go to sleep as soon as
                // it is handed out, and bytes written into memory being put
                // to sleep are the caller's race.
                for t in [a, c] {
                    match pool.alloc_tagged(3 * G, t) {
                        Ok(blk) => {
                            pool.free(blk.ptr).unwrap();
                            ok += 1;
                        }
                        // Asleep or in transition: refused, nothing handed out.
                        Err(vmmweights::Error::InvalidState(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                let blk = pool.alloc_tagged(3 * G, other).unwrap();
                write(w.d(), blk.ptr, &pattern(blk.ptr, blk.size));
                assert!(read(w.d(), blk.ptr, blk.size) == pattern(blk.ptr, blk.size));
                pool.free(blk.ptr).unwrap();
            }
            ok
        });
        for h in [h1, h2, h3] {
            h.join().unwrap();
        }
        done.store(true, Ordering::Release);
        bg.join().unwrap();
    });
    assert!(t0.elapsed() < Duration::from_secs(120));
    w.pool.check_invariants().unwrap();
    let all: Vec<TagId> = tags.iter().map(|t| t.0).collect();
    w.pool.wake(&all).unwrap();
    for (t, blocks) in &tags {
        for (p, data) in blocks {
            let got = read(w.d(), *p, data.len());
            assert!(
                got == *data,
                "tag {t}: block at {p:#x} differs at byte {:?}",
                first_diff(&got, data)
            );
        }
    }
}

/// Two pools on one device stand for two processes. A wake whose deadline
/// passes while the other pool's sleep is still releasing fails as any wake
/// does: asleep, nothing left mapped, the backup whole for the next wake.
#[test]
fn a_waiting_wake_whose_deadline_passes_during_a_release_keeps_its_backup() {
    let probe = World::new(1 << 30);
    let (t, _, _) = probe.block("probe", 8 * BLOCK, 0);
    let one = probe.mapped(t);
    drop(probe);
    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: one + one / 2,
    }));
    let d: Arc<dyn Driver> = h.clone();
    let (w1, w2) = (
        World {
            h: h.clone(),
            pool: Pool::new(d.clone(), config()).unwrap(),
        },
        World {
            h: h.clone(),
            pool: Pool::new(d, config()).unwrap(),
        },
    );
    let (b, pb, data_b) = w2.block("b", 8 * BLOCK, 61);
    w2.pool.sleep(&[(b, Policy::Offload)]).unwrap();
    let (a, pa, data_a) = w1.block("a", 8 * BLOCK, 62);
    let (mut failed, mut woke) = (0, 0);
    for wait_us in [1u64, 200, 1000, 3000, 10_000, 200_000] {
        let r = std::thread::scope(|s| {
            s.spawn(|| w1.pool.sleep(&[(a, Policy::Offload)]).unwrap());
            w2.pool.wake_with(
                &[b],
                WakeOptions {
                    wait_for_memory: Duration::from_micros(wait_us),
                },
            )
        });
        match r {
            Ok(_) => woke += 1,
            Err(e) => {
                assert!(e.is_out_of_memory(), "{wait_us} us: {e}");
                assert!(w2.pool.is_tag_asleep(b), "{wait_us} us");
                assert_eq!(w2.mapped(b), 0, "{wait_us} us: the failed wake left chunks");
                failed += 1;
                w2.pool.wake(&[b]).unwrap();
            }
        }
        assert!(read(w2.d(), pb, data_b.len()) == data_b, "{wait_us} us: b");
        assert_eq!(
            h.counts().physical_bytes,
            w2.mapped(b),
            "{wait_us} us: memory neither pool tracks"
        );
        w2.pool.sleep(&[(b, Policy::Offload)]).unwrap();
        w1.pool.wake(&[a]).unwrap();
        assert!(read(w1.d(), pa, data_a.len()) == data_a, "{wait_us} us: a");
    }
    assert!(woke > 0, "no wake waited long enough ({failed} failed)");
}

/// `wait_for_memory` bounds the whole call (the C API's "in all"): a wake of
/// two tags where the first waits most of it does not give the second the
/// whole wait again.
#[test]
fn a_waiting_wake_of_several_tags_waits_at_most_its_wait_in_all() {
    let size = 4 * BLOCK;
    let probe = World::new(1 << 30);
    let (t, _, _) = probe.block("probe", size, 0);
    let one = probe.mapped(t);
    drop(probe);
    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 2 * one + one / 2,
    }));
    let d: Arc<dyn Driver> = h.clone();
    let (w1, w2) = (
        World {
            h: h.clone(),
            pool: Pool::new(d.clone(), config()).unwrap(),
        },
        World {
            h: h.clone(),
            pool: Pool::new(d, config()).unwrap(),
        },
    );
    let (t1, p1, data1) = w1.block("t1", size, 71);
    let (t2, _, _) = w1.block("t2", size, 72);
    w1.pool
        .sleep(&[(t1, Policy::Offload), (t2, Policy::Offload)])
        .unwrap();
    // The other "process" holds two models; it gives one back after 300 ms,
    // room for t1 only.
    let (o1, _, _) = w2.block("o1", size, 73);
    let (_o2, _, _) = w2.block("o2", size, 74);
    let wait = Duration::from_millis(600);
    let t0 = Instant::now();
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            w2.pool.sleep(&[(o1, Policy::Discard)]).unwrap();
        });
        w1.pool.wake_with(
            &[t1, t2],
            WakeOptions {
                wait_for_memory: wait,
            },
        )
    });
    let took = t0.elapsed();
    let e = r.unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(!w1.pool.is_tag_asleep(t1) && w1.pool.is_tag_asleep(t2));
    assert!(read(w1.d(), p1, data1.len()) == data1);
    assert!(
        took >= wait && took < wait + Duration::from_millis(250),
        "waited {took:?} for a wait of {wait:?}"
    );
}

/// A waiting wake holds its pool's transitions: a sleep of another tag of
/// the same pool, started while it waits, runs once it has ended (the
/// memory that sleep frees cannot make its room: a swap does that). Neither
/// call waits forever and nothing is lost either way.
#[test]
fn a_sleep_in_the_pool_of_a_waiting_wake_runs_after_it() {
    let size = 4 * BLOCK;
    let probe = World::new(1 << 30);
    let (t, _, _) = probe.block("probe", size, 0);
    let one = probe.mapped(t);
    drop(probe);
    let w = World::new(one + one / 2);
    let (b, pb, data_b) = w.block("b", size, 81);
    w.pool.sleep(&[(b, Policy::Offload)]).unwrap();
    let (a, _, _) = w.block("a", size, 82);
    let wait = Duration::from_millis(300);
    let t0 = Instant::now();
    let (r, slept_at) = std::thread::scope(|s| {
        let sleeper = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            w.pool.sleep(&[(a, Policy::Offload)]).unwrap();
            t0.elapsed()
        });
        let r = w.pool.wake_with(
            &[b],
            WakeOptions {
                wait_for_memory: wait,
            },
        );
        (r, sleeper.join().unwrap())
    });
    let e = r.unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(
        slept_at >= wait,
        "the sleep ran at {slept_at:?}, during the wait"
    );
    assert!(w.pool.is_tag_asleep(a) && w.pool.is_tag_asleep(b));
    w.pool.wake(&[b]).unwrap();
    assert!(read(w.d(), pb, data_b.len()) == data_b);
}

/// Each woken tag's report says the time its own wake waited for memory:
/// in a swap waking two tags where only the first waits, the second reports
/// no wait.
#[test]
fn each_tag_of_a_swap_reports_its_own_wait() {
    let size = 4 * BLOCK;
    let probe = World::new(1 << 30);
    let (t, _, _) = probe.block("probe", size, 0);
    let one = probe.mapped(t);
    drop(probe);
    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 3 * one,
    }));
    let d: Arc<dyn Driver> = h.clone();
    let (w1, w2) = (
        World {
            h: h.clone(),
            pool: Pool::new(d.clone(), config()).unwrap(),
        },
        World {
            h: h.clone(),
            pool: Pool::new(d, config()).unwrap(),
        },
    );
    let (t1, _, _) = w1.block("t1", size, 91);
    let (t2, _, _) = w1.block("t2", size, 92);
    w1.pool
        .sleep(&[(t1, Policy::Offload), (t2, Policy::Offload)])
        .unwrap();
    // The other "process" fills the device but for half a model, and gives
    // two models back after 200 ms: t1 waits for them, t2 does not.
    let (o1, _, _) = w2.block("o1", size, 93);
    let (o2, _, _) = w2.block("o2", size, 94);
    let (_o3, _, _) = w2.block("o3", one as usize / 2, 95);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            w2.pool
                .sleep(&[(o1, Policy::Discard), (o2, Policy::Discard)])
                .unwrap();
        });
        w1.pool
            .swap_with(
                &[],
                &[t1, t2],
                SwapOptions {
                    wait_for_memory: Duration::from_secs(20),
                },
            )
            .unwrap()
    });
    assert!(out.is_ok(), "{:?}", out.wake_error);
    let waited: Vec<f64> = out.woke.iter().map(|c| c.report.waited_seconds).collect();
    assert!(waited[0] >= 0.1, "{waited:?}");
    assert!(waited[1] < 0.05, "t2 reports t1's wait: {waited:?}");
}

/// A tag with no segment left (its blocks freed and trimmed) on either side
/// of a swap: accepted, reported as done with nothing moved, and the tag
/// allocates afterwards as a tag awake.
#[test]
fn a_tag_with_no_segments_on_either_side_of_a_swap() {
    let w = World::new(1 << 30);
    let (a, pa, data_a) = w.block("a", BLOCK, 101);
    let (b, pb, data_b) = w.block("b", BLOCK, 102);
    let empty = unique("empty");
    let e = w.pool.alloc_tagged(BLOCK, empty).unwrap();
    w.pool.free(e.ptr).unwrap();
    w.pool.trim().unwrap();
    assert_eq!(w.mapped(empty), 0);
    w.pool.sleep(&[(b, Policy::Offload)]).unwrap();
    let out = w
        .pool
        .swap(
            &[(a, Policy::Offload), (empty, Policy::Offload)],
            &[empty, b],
        )
        .unwrap_err();
    assert!(
        matches!(out, vmmweights::Error::InvalidArgument(_)),
        "{out}"
    );
    let out = w
        .pool
        .swap(&[(empty, Policy::Offload), (a, Policy::Offload)], &[b])
        .unwrap();
    assert!(out.is_ok(), "{:?} / {:?}", out.sleep_error, out.wake_error);
    assert_eq!(out.slept.len(), 2);
    assert_eq!(out.slept[0].report.physical_bytes, 0);
    assert!(read(w.d(), pb, data_b.len()) == data_b);
    let out = w.pool.swap(&[(b, Policy::Offload)], &[empty, a]).unwrap();
    assert!(out.is_ok(), "{:?} / {:?}", out.sleep_error, out.wake_error);
    assert_eq!(out.woke.len(), 2);
    assert!(read(w.d(), pa, data_a.len()) == data_a);
    assert!(!w.pool.is_tag_asleep(empty));
    let blk = w.pool.alloc_tagged(3000, empty).unwrap();
    w.pool.free(blk.ptr).unwrap();
    w.pool.check_invariants().unwrap();
}

/// The host-memory limit of the backup arena during a swap: a sleep side
/// whose backup does not fit under it is refused before anything moves (the
/// tag awake, untouched), the wake side goes on as far as the device allows,
/// and once the limit allows the same swap goes through.
#[test]
fn a_swap_whose_sleep_side_exceeds_the_host_limit_moves_nothing_of_it() {
    let probe = World::new(1 << 30);
    let (t, _, _) = probe.block("probe", BLOCK, 0);
    let one = probe.mapped(t);
    drop(probe);
    for (device, policy) in [
        (1u64 << 30, Policy::Offload),
        (1 << 30, Policy::OffloadCompressed),
        (one + one / 2, Policy::Offload),
        (one + one / 2, Policy::OffloadCompressed),
    ] {
        let what = format!("{policy:?} on a device of {device}");
        let w = World::new(device);
        let (b, pb, data_b) = w.block("b", BLOCK, 111);
        w.pool.sleep(&[(b, Policy::Offload)]).unwrap();
        let (a, pa, data_a) = w.block("a", BLOCK, 112);
        let held = w.pool.sleep_engine().backup_held_bytes();
        let mut o = w.pool.sleep_engine().options();
        o.host_memory_limit = held + (1 << 20);
        w.pool.set_sleep_options(o.clone()).unwrap();
        let out = w.pool.swap(&[(a, policy)], &[b]).unwrap();
        let e = out.sleep_error.as_ref().expect("the backup cannot fit");
        assert!(
            matches!(e, vmmweights::Error::HostOutOfMemory { .. }),
            "{what}: {e}"
        );
        assert!(!w.pool.is_tag_asleep(a), "{what}");
        assert_eq!(w.mapped(a), one, "{what}: a released memory");
        assert!(read(w.d(), pa, data_a.len()) == data_a, "{what}: a");
        if device < 1 << 30 {
            assert!(out.wake_error.is_some(), "{what}: b found room");
            assert!(w.pool.is_tag_asleep(b) && w.mapped(b) == 0, "{what}");
            o.host_memory_limit = u64::MAX;
            w.pool.set_sleep_options(o).unwrap();
            let out = w.pool.swap(&[(a, policy)], &[b]).unwrap();
            assert!(
                out.is_ok(),
                "{what}: {:?} / {:?}",
                out.sleep_error,
                out.wake_error
            );
            w.pool.swap(&[(b, Policy::Offload)], &[a]).unwrap();
            assert!(read(w.d(), pa, data_a.len()) == data_a, "{what}: a, back");
            w.pool.swap(&[(a, Policy::Offload)], &[b]).unwrap();
        } else {
            assert!(out.wake_error.is_none(), "{what}: {:?}", out.wake_error);
        }
        assert!(read(w.d(), pb, data_b.len()) == data_b, "{what}: b");
        assert!(
            w.pool.sleep_engine().backup_held_bytes()
                <= w.pool.sleep_engine().options().host_memory_limit
        );
        w.pool.check_invariants().unwrap();
    }
}
