//! Swaps on the host backend: one tag put to sleep while another wakes, at
//! once (`Pool::swap`), and wakes that wait for memory (`Pool::wake_with`).
//!
//! Every pair of policies (the sleeping tag's, and the one the waking tag
//! slept with) gives back every byte at the same addresses; a device too
//! small for both tags at once makes the wake wait for the memory the sleep
//! releases chunk by chunk; a wake that fails midway leaves its tag asleep
//! with its backup intact while the sleep side is reported apart; a sleep
//! that stops midway loses nothing and finishes when called again; other
//! tags allocate meanwhile; bad lists and pinned tags are refused with
//! nothing changed; a wake waits for another pool (another process) to
//! release memory, and fails at its deadline naming the tag and the bytes.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
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
use vmmweights::{Error, SleepState};

fn unique(name: &str) -> TagId {
    common::swap::unique("swap", name)
}

/// The random block each tag holds besides its checkpoint: many chunks, so
/// a sleep releases it in several runs.
const BLOCK: usize = 4 << 20;
fn driver(limit: u64) -> Arc<HostDriver> {
    Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: limit,
    }))
}

/// A tag holding a loaded checkpoint (so it can sleep with Reload) and a
/// block of random bytes no checkpoint restores.
struct Model {
    tag: TagId,
    _session: Session,
}

struct World {
    h: Arc<HostDriver>,
    pool: Pool,
    _dir: tempfile::TempDir,
}

impl World {
    fn new(limit: u64) -> World {
        let h = driver(limit);
        let d: Arc<dyn Driver> = h.clone();
        World {
            pool: Pool::new(d, config()).unwrap(),
            h,
            _dir: checkpoint(),
        }
    }

    fn d(&self) -> &dyn Driver {
        self.h.as_ref()
    }

    fn model(&self, name: &str, seed: u64) -> Model {
        let tag = unique(name);
        let session = Session::open(self._dir.path()).unwrap();
        session.allocate(&self.pool, tag).unwrap();
        session.load(&self.pool, None).unwrap();
        let b = self.pool.alloc_tagged(BLOCK, tag).unwrap();
        let small = self.pool.alloc_tagged(3000, tag).unwrap();
        for (ptr, len) in [(b.ptr, b.size), (small.ptr, small.size)] {
            write(self.d(), ptr, &pattern(seed ^ ptr, len));
        }
        Model {
            tag,
            _session: session,
        }
    }

    /// Every live block of `tag` and its bytes.
    fn bytes(&self, tag: TagId) -> Vec<(DevicePtr, Vec<u8>)> {
        self.pool
            .live_blocks()
            .into_iter()
            .filter(|b| b.tag == tag)
            .map(|b| (b.ptr, read(self.d(), b.ptr, b.size)))
            .collect()
    }

    fn mapped(&self, tag: TagId) -> u64 {
        self.pool
            .report()
            .tag(&tag::name_of(tag))
            .map_or(0, |u| u.tracked_bytes)
    }
}

fn checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &generate(&SMALL, Dtype::Bf16), Dtype::Bf16, 2);
    dir
}

fn same(w: &World, tag: TagId, before: &[(DevicePtr, Vec<u8>)], what: &str) {
    let now = w.bytes(tag);
    assert_eq!(now.len(), before.len(), "{what}: live blocks changed");
    for ((p, a), (q, b)) in now.iter().zip(before) {
        assert_eq!(p, q, "{what}: a block moved");
        assert!(a == b, "{what}: bytes of the block at {p:#x} differ");
    }
}

#[test]
fn every_policy_pair_gives_back_every_byte_at_the_same_addresses() {
    for asleep in POLICIES {
        for sleeping in POLICIES {
            let what = format!("{sleeping:?} sleeps while {asleep:?} wakes");
            let w = World::new(1 << 30);
            let (a, b) = (w.model("a", 1), w.model("b", 2));
            let bytes_b = w.bytes(b.tag);
            w.pool.sleep(&[(b.tag, asleep)]).unwrap();
            let bytes_a = w.bytes(a.tag);
            let mapped_a = w.mapped(a.tag);
            let phys = w.h.counts().physical_bytes;
            let out = w.pool.swap(&[(a.tag, sleeping)], &[b.tag]).unwrap();
            assert!(
                out.is_ok(),
                "{what}: {:?} / {:?}",
                out.sleep_error,
                out.wake_error
            );
            assert_eq!((out.slept.len(), out.woke.len()), (1, 1), "{what}");
            assert!(
                w.pool.is_tag_asleep(a.tag) && !w.pool.is_tag_asleep(b.tag),
                "{what}"
            );
            assert_eq!(
                w.mapped(a.tag),
                0,
                "{what}: the sleeping tag released it all"
            );
            assert_eq!(out.slept[0].report.physical_bytes, mapped_a, "{what}");
            assert_eq!(
                w.h.counts().physical_bytes,
                phys - mapped_a + out.woke[0].report.physical_bytes,
                "{what}"
            );
            if asleep != Policy::Discard {
                same(&w, b.tag, &bytes_b, &what);
            }
            // And back: the tag put to sleep by the swap wakes whole.
            let back = w.pool.swap(&[(b.tag, Policy::Offload)], &[a.tag]).unwrap();
            assert!(
                back.is_ok(),
                "{what}, back: {:?} / {:?}",
                back.sleep_error,
                back.wake_error
            );
            if sleeping != Policy::Discard {
                same(&w, a.tag, &bytes_a, &format!("{what}, back"));
            }
            w.pool.check_invariants().unwrap();
            let again = w.pool.alloc_tagged(1000, a.tag).unwrap();
            w.pool.free(again.ptr).unwrap();
        }
    }
}

#[test]
fn a_device_too_small_for_both_makes_the_wake_wait_for_the_sleep() {
    // Room for one model and a half: the wake maps its chunks only as the
    // sleep releases the other's.
    let probe = World::new(1 << 30);
    let m = probe.model("probe", 0);
    let one = probe.mapped(m.tag);
    drop(m);
    drop(probe);
    for (asleep, sleeping) in [
        (Policy::Offload, Policy::Offload),
        (Policy::OffloadCompressed, Policy::Discard),
        (Policy::Reload, Policy::OffloadCompressed),
        (Policy::Discard, Policy::Reload),
    ] {
        let what = format!("{sleeping:?} sleeps while {asleep:?} wakes");
        let w = World::new(one + one / 2);
        let a = w.model("a", 3);
        w.pool.sleep(&[(a.tag, Policy::Offload)]).unwrap();
        let b = w.model("b", 4);
        let bytes_b = w.bytes(b.tag);
        w.pool.sleep(&[(b.tag, asleep)]).unwrap();
        w.pool.wake(&[a.tag]).unwrap();
        let bytes_a = w.bytes(a.tag);
        // Both awake would not fit: a wake alone is refused at once.
        let e = w.pool.wake(&[b.tag]).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        let out = w.pool.swap(&[(a.tag, sleeping)], &[b.tag]).unwrap();
        assert!(
            out.is_ok(),
            "{what}: {:?} / {:?}",
            out.sleep_error,
            out.wake_error
        );
        if asleep != Policy::Discard {
            same(&w, b.tag, &bytes_b, &what);
        }
        assert!(w.h.counts().physical_bytes <= one + one / 2);
        let back = w.pool.swap(&[(b.tag, Policy::Discard)], &[a.tag]).unwrap();
        assert!(
            back.is_ok(),
            "{what}, back: {:?} / {:?}",
            back.sleep_error,
            back.wake_error
        );
        if sleeping != Policy::Discard {
            same(&w, a.tag, &bytes_a, &format!("{what}, back"));
        }
    }
}

#[test]
fn a_wake_that_cannot_fit_even_after_the_sleep_fails_and_keeps_its_backup() {
    let w = World::new(1 << 30);
    let a = w.model("a", 5);
    let b = w.model("b", 6);
    let big = w.pool.alloc_tagged(8 << 20, b.tag).unwrap();
    write(w.d(), big.ptr, &pattern(77, big.size));
    let bytes_b = w.bytes(b.tag);
    w.pool.sleep(&[(b.tag, Policy::Offload)]).unwrap();
    let need = w
        .pool
        .report()
        .tag(&tag::name_of(b.tag))
        .unwrap()
        .offloaded_bytes;
    // Another tag stays awake, so the device holds more than b in all; after
    // a's sleep it has less than b needs free.
    let other = w.pool.alloc_tagged(8 * G, unique("other")).unwrap();
    let others = w.h.counts().physical_bytes - w.mapped(a.tag);
    assert!(others >= 8 * G as u64);
    w.h.set_memory_limit(w.h.counts().physical_bytes + need - 2 * G as u64 - w.mapped(a.tag));
    let bytes_a = w.bytes(a.tag);
    // Without a wait: refused up front, nothing changes.
    let e = w
        .pool
        .swap(&[(a.tag, Policy::Offload)], &[b.tag])
        .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(!w.pool.is_tag_asleep(a.tag) && w.pool.is_tag_asleep(b.tag));
    same(&w, a.tag, &bytes_a, "after the refused swap");
    // With one: the sleep happens, the wake waits, then fails naming b.
    let t = Instant::now();
    let out = w
        .pool
        .swap_with(
            &[(a.tag, Policy::Offload)],
            &[b.tag],
            SwapOptions {
                wait_for_memory: Duration::from_millis(50),
            },
        )
        .unwrap();
    assert!(out.sleep_error.is_none(), "{:?}", out.sleep_error);
    assert!(
        t.elapsed() >= Duration::from_millis(50),
        "{:?}",
        out.wake_error
    );
    assert_eq!(out.slept.len(), 1);
    let e = out.wake_error.expect("the wake cannot fit");
    match &e {
        Error::OutOfMemory {
            what, requested, ..
        } => {
            assert!(what.contains(&b.tag.to_string()), "{e}");
            assert!(*requested >= need - need / 8, "{e}");
        }
        other => panic!("{other}"),
    }
    assert!(w.pool.is_tag_asleep(a.tag) && w.pool.is_tag_asleep(b.tag));
    assert_eq!(
        w.mapped(b.tag),
        0,
        "the failed wake unmapped what it mapped"
    );
    w.h.set_memory_limit(1 << 30);
    w.pool.wake(&[b.tag]).unwrap();
    same(&w, b.tag, &bytes_b, "b after the failed wake");
    w.pool.free(other.ptr).unwrap();
    w.pool.wake(&[a.tag]).unwrap();
    same(&w, a.tag, &bytes_a, "a");
}

#[test]
fn a_wake_failing_midway_stays_asleep_while_the_sleep_is_reported_apart() {
    for (op, asleep) in [
        (FaultOp::CopyHtod, Policy::Offload),
        (FaultOp::SetAccess, Policy::Offload),
        (FaultOp::Map, Policy::Reload),
        (FaultOp::Codec, Policy::OffloadCompressed),
    ] {
        for nth in [1, 3] {
            let what = format!("{op:?} #{nth} waking {asleep:?}");
            let w = World::new(1 << 30);
            let a = w.model("a", 7);
            let b = w.model("b", 8);
            let bytes_b = w.bytes(b.tag);
            w.pool.sleep(&[(b.tag, asleep)]).unwrap();
            let bytes_a = w.bytes(a.tag);
            w.h.fail_nth(op, nth);
            // Discard copies and encodes nothing: the fault hits the wake.
            let out = w.pool.swap(&[(a.tag, Policy::Discard)], &[b.tag]).unwrap();
            let fired = !w.h.fault_pending(op);
            w.h.clear_faults();
            assert!(fired, "{what}: the fault was not reached");
            assert!(out.sleep_error.is_none(), "{what}: {:?}", out.sleep_error);
            assert!(out.wake_error.is_some(), "{what}");
            assert!(out.woke.is_empty(), "{what}");
            assert!(
                w.pool.is_tag_asleep(b.tag),
                "{what}: a failed wake left the tag awake"
            );
            assert_eq!(w.mapped(b.tag), 0, "{what}");
            assert!(w.pool.is_tag_asleep(a.tag), "{what}");
            w.pool.check_invariants().unwrap();
            w.pool.wake(&[b.tag]).unwrap();
            same(&w, b.tag, &bytes_b, &what);
            drop(bytes_a);
        }
    }
}

#[test]
fn a_sleep_stopping_midway_loses_nothing_and_finishes_when_called_again() {
    for policy in [Policy::Offload, Policy::OffloadCompressed, Policy::Reload] {
        for (op, nth) in [
            (FaultOp::CopyDtoh, 2),
            (FaultOp::CopyDtoh, 4),
            (FaultOp::Unmap, 3),
            (FaultOp::Codec, 3),
        ] {
            let what = format!("{policy:?} with {op:?} #{nth}");
            let w = World::new(1 << 30);
            let a = w.model("a", 9);
            let b = w.model("b", 10);
            let bytes_b = w.bytes(b.tag);
            w.pool.sleep(&[(b.tag, Policy::Offload)]).unwrap();
            let bytes_a = w.bytes(a.tag);
            w.h.fail_nth(op, nth);
            let out = w.pool.swap(&[(a.tag, policy)], &[b.tag]).unwrap();
            w.h.clear_faults();
            assert!(out.wake_error.is_none(), "{what}: {:?}", out.wake_error);
            same(&w, b.tag, &bytes_b, &what);
            if out.sleep_error.is_some() {
                // Calling again finishes the job, whatever state it left.
                w.pool.sleep(&[(a.tag, policy)]).unwrap();
            }
            assert_eq!(w.mapped(a.tag), 0, "{what}");
            w.pool.check_invariants().unwrap();
            w.pool.wake(&[a.tag]).unwrap();
            same(&w, a.tag, &bytes_a, &what);
            // And one more clean cycle.
            w.pool.sleep(&[(a.tag, policy)]).unwrap();
            w.pool.wake(&[a.tag]).unwrap();
            same(&w, a.tag, &bytes_a, &format!("{what}, next cycle"));
        }
    }
}

#[test]
fn other_tags_allocate_during_a_swap_and_the_swapped_ones_refuse() {
    let w = World::new(1 << 30);
    let a = w.model("a", 11);
    let b = w.model("b", 12);
    for _ in 0..6 {
        let blk = w.pool.alloc_tagged(BLOCK, a.tag).unwrap();
        write(w.d(), blk.ptr, &pattern(blk.ptr, blk.size));
        let blk = w.pool.alloc_tagged(BLOCK, b.tag).unwrap();
        write(w.d(), blk.ptr, &pattern(blk.ptr, blk.size));
    }
    let bytes_b = w.bytes(b.tag);
    w.pool.sleep(&[(b.tag, Policy::Offload)]).unwrap();
    let other = unique("other");
    let done = AtomicBool::new(false);
    let (ok, refused) = std::thread::scope(|s| {
        let pool = &w.pool;
        let done = &done;
        let bg = s.spawn(move || {
            let (mut ok, mut refused) = (0usize, 0usize);
            while !done.load(Ordering::Acquire) {
                let blk = pool.alloc_tagged(3 * G, other).unwrap();
                pool.free(blk.ptr).unwrap();
                ok += 1;
                match pool.alloc_tagged(100, a.tag) {
                    Err(Error::InvalidState(_)) => refused += 1,
                    Ok(blk) => pool.free(blk.ptr).unwrap(),
                    Err(e) => panic!("{e}"),
                }
            }
            (ok, refused)
        });
        for _ in 0..4 {
            let out = pool.swap(&[(a.tag, Policy::Offload)], &[b.tag]).unwrap();
            assert!(out.is_ok());
            let out = pool.swap(&[(b.tag, Policy::Offload)], &[a.tag]).unwrap();
            assert!(out.is_ok());
        }
        done.store(true, Ordering::Release);
        bg.join().unwrap()
    });
    assert!(ok > 0 && refused > 0, "allocations {ok}, refused {refused}");
    w.pool.check_invariants().unwrap();
    w.pool.swap(&[(a.tag, Policy::Offload)], &[b.tag]).unwrap();
    same(&w, b.tag, &bytes_b, "b");
}

#[test]
fn bad_lists_and_pinned_tags_are_refused_with_nothing_changed() {
    let w = World::new(1 << 30);
    let a = w.model("a", 13);
    let b = w.model("b", 14);
    w.pool.sleep(&[(b.tag, Policy::Offload)]).unwrap();
    let (bytes_a, phys) = (w.bytes(a.tag), w.h.counts().physical_bytes);
    let unchanged = |what: &str| {
        assert!(!w.pool.is_tag_asleep(a.tag), "{what}");
        assert!(w.pool.is_tag_asleep(b.tag), "{what}");
        assert_eq!(w.h.counts().physical_bytes, phys, "{what}");
        same(&w, a.tag, &bytes_a, what);
    };
    let e = w
        .pool
        .swap(&[(a.tag, Policy::Offload)], &[a.tag])
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.contains("both")),
        "{e}"
    );
    unchanged("a tag in both lists");
    let e = w
        .pool
        .swap(
            &[(a.tag, Policy::Offload), (a.tag, Policy::Discard)],
            &[b.tag],
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.contains("twice")),
        "{e}"
    );
    unchanged("a tag twice");
    let e = w
        .pool
        .swap(&[(a.tag, Policy::Offload)], &[b.tag, b.tag])
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    unchanged("a waking tag twice");
    let never = unique("never-used");
    for (s, k) in [(never, b.tag), (a.tag, never)] {
        let e = w.pool.swap(&[(s, Policy::Offload)], &[k]).unwrap_err();
        assert!(matches!(e, Error::UnknownTag(_)), "{e}");
        unchanged("an unknown tag");
    }
    let e = w
        .pool
        .swap(&[(TagId(u32::MAX - 3), Policy::Offload)], &[b.tag])
        .unwrap_err();
    assert!(
        matches!(e, Error::UnknownTag(_) | Error::InvalidArgument(_)),
        "{e}"
    );
    unchanged("an unregistered tag id");
    {
        let blk = w
            .pool
            .live_blocks()
            .into_iter()
            .find(|x| x.tag == a.tag)
            .unwrap();
        let _pin = w.pool.pin_for_load(&[(blk.ptr, blk.size, "x")]).unwrap();
        let e = w
            .pool
            .swap(&[(a.tag, Policy::Offload)], &[b.tag])
            .unwrap_err();
        assert!(matches!(e, Error::LoadInProgress { .. }), "{e}");
        unchanged("a pinned tag");
    }
    // Unpinned, the same swap goes through; and empty lists do nothing.
    let out = w.pool.swap(&[], &[]).unwrap();
    assert!(out.is_ok() && out.slept.is_empty() && out.woke.is_empty());
    let out = w.pool.swap(&[(a.tag, Policy::Offload)], &[b.tag]).unwrap();
    assert!(out.is_ok());
}

/// Two pools on one device stand for two processes: one puts its model to
/// sleep while the other wakes its own, waiting for the memory.
#[test]
fn a_wake_waits_for_memory_another_pool_releases() {
    let probe = World::new(1 << 30);
    let m = probe.model("probe", 0);
    let one = probe.mapped(m.tag);
    drop(m);
    drop(probe);
    let h = driver(one + one / 2);
    let d: Arc<dyn Driver> = h.clone();
    let dir = checkpoint();
    let (p1, p2) = (
        Pool::new(d.clone(), config()).unwrap(),
        Pool::new(d, config()).unwrap(),
    );
    let w1 = World {
        h: h.clone(),
        pool: p1,
        _dir: dir,
    };
    let w2 = World {
        h: h.clone(),
        pool: p2,
        _dir: checkpoint(),
    };
    let b = w2.model("b", 15);
    let bytes_b = w2.bytes(b.tag);
    w2.pool.sleep(&[(b.tag, Policy::Offload)]).unwrap();
    let a = w1.model("a", 16);
    // No room now: a plain wake is refused, a waiting one that nobody
    // makes room for fails at its deadline, naming the tag and the bytes.
    let e = w2.pool.wake(&[b.tag]).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let t = Instant::now();
    let e = w2
        .pool
        .wake_with(
            &[b.tag],
            WakeOptions {
                wait_for_memory: Duration::from_millis(40),
            },
        )
        .unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(40));
    match &e {
        Error::OutOfMemory {
            what,
            requested,
            free,
        } => {
            assert!(
                what.contains(&b.tag.to_string()) && what.contains("waited"),
                "{e}"
            );
            assert!(*requested > *free, "{e}");
        }
        other => panic!("{other}"),
    }
    assert!(w2.pool.is_tag_asleep(b.tag));
    assert_eq!(w2.mapped(b.tag), 0);
    // The other "process" sleeps 30 ms from now; the wake waits for it.
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(30));
            w1.pool.sleep(&[(a.tag, Policy::Offload)]).unwrap();
        });
        w2.pool
            .wake_with(
                &[b.tag],
                WakeOptions {
                    wait_for_memory: Duration::from_secs(20),
                },
            )
            .unwrap();
    });
    assert!(t.elapsed() >= Duration::from_millis(30));
    same(&w2, b.tag, &bytes_b, "b woken after the wait");
    assert_eq!(
        w2.pool.segment_of(bytes_b[0].0).unwrap().sleep_state,
        SleepState::Awake
    );
    // More than the device holds is refused at once, wait or not.
    w2.pool.sleep(&[(b.tag, Policy::Offload)]).unwrap();
    h.set_memory_limit(G as u64);
    let t = Instant::now();
    let e = w2
        .pool
        .wake_with(
            &[b.tag],
            WakeOptions {
                wait_for_memory: Duration::from_secs(20),
            },
        )
        .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// A sleep stopped midway through one segment: the runs of chunks copied
/// are released, the rest stay mapped and their backup is marked stale
/// (refused to backup reads), and the next sleep copies them again.
#[test]
fn a_segment_stopped_midway_keeps_its_uncopied_chunks_until_the_next_sleep() {
    for (policy, op, nth) in [
        (Policy::Offload, FaultOp::CopyDtoh, 6),
        (Policy::OffloadCompressed, FaultOp::Codec, 3),
        (Policy::OffloadCompressed, FaultOp::CopyDtoh, 3),
    ] {
        let what = format!("{policy:?} with {op:?} #{nth}");
        let w = World::new(1 << 30);
        let t = unique("one-block");
        let blk = w.pool.alloc_tagged(BLOCK, t).unwrap();
        let data = pattern(99, blk.size);
        write(w.d(), blk.ptr, &data);
        // Several cycles: the first sleep of an awake tag, then one whose
        // backup exists already.
        for round in 0..2 {
            w.h.fail_nth(op, nth);
            let e = w.pool.sleep(&[(t, policy)]).unwrap_err();
            w.h.clear_faults();
            assert!(matches!(e, Error::InvalidState(_)), "{what}: {e}");
            let mapped = w.mapped(t);
            assert!(
                mapped > 0 && mapped < BLOCK as u64,
                "{what}: {mapped} bytes still mapped"
            );
            let mut buf = vec![0u8; BLOCK];
            let e = w.pool.read_backup(blk.ptr, &mut buf).unwrap_err();
            assert!(
                matches!(e, Error::InvalidState(ref m) if m.contains("sleep")),
                "{what}: {e}"
            );
            let mut head = vec![0u8; G];
            w.pool.read_backup(blk.ptr, &mut head).unwrap();
            assert!(head[..] == data[..G], "{what}: the released run's backup");
            w.pool.sleep(&[(t, policy)]).unwrap();
            assert_eq!(w.mapped(t), 0, "{what}");
            w.pool.read_backup(blk.ptr, &mut buf).unwrap();
            assert!(
                buf == data,
                "{what}, round {round}: the backup after the second sleep"
            );
            w.pool.wake(&[t]).unwrap();
            assert!(
                read(w.d(), blk.ptr, blk.size) == data,
                "{what}, round {round}"
            );
        }
    }
}
