//! The core calls the C API and the command line share for loading into a
//! pool: tagged allocation that gives every block back on failure, the awake
//! check before a load, reload-source registration, and checked pool reads
//! and writes. Host backend.

use crate::common;

use common::loader::{generate, write_sharded, SMALL};
use common::pool;
use vmmweights::loader::{
    allocate_in_pool, load_into_pool, Checkpoint, Control, Dtype, LoadOptions, Plan, Registry,
    Rules,
};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Error, Pool};

fn checkpoint() -> (tempfile::TempDir, Checkpoint) {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &generate(&SMALL, Dtype::Bf16), Dtype::Bf16, 2);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    (dir, ckpt)
}

fn read(pool: &Pool, ptr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: nothing sleeps or frees the range during the read.
    unsafe { pool.read(ptr, &mut v) }.unwrap();
    v
}

#[test]
fn failed_tagged_allocation_gives_every_block_back() {
    let h = pool::host(2 * pool::G as u64);
    let pool = Pool::new(pool::dyn_driver(&h), pool::small_config()).unwrap();
    let t = tag::id("test-into-pool-rollback").unwrap();
    let (_dir, ckpt) = checkpoint();
    let specs = Plan::destinations(&ckpt, &Rules::default()).unwrap();
    let mut reg = Registry::new();
    let err = allocate_in_pool(&mut reg, &specs, &pool, t).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(reg.is_empty(), "nothing is registered on failure");
    assert_eq!(
        pool.report().total.live_bytes,
        0,
        "every block taken is freed"
    );
}

#[test]
fn load_into_pool_checks_awake_and_registers_the_reload_source() {
    let h = pool::host(1 << 30);
    let pool = Pool::new(pool::dyn_driver(&h), pool::small_config()).unwrap();
    let t = tag::id("test-into-pool-load").unwrap();
    let (_dir, ckpt) = checkpoint();
    let rules = Rules::default();
    let mut reg = Registry::new();
    allocate_in_pool(
        &mut reg,
        &Plan::destinations(&ckpt, &rules).unwrap(),
        &pool,
        t,
    )
    .unwrap();
    let opts = LoadOptions::default();

    pool.sleep(&[(t, Policy::Discard)]).unwrap();
    let err = load_into_pool(&pool, ckpt, &rules, &reg, &opts, &Control::default()).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidState(m) if m.contains("destination `") && m.contains("test-into-pool-load")),
        "{err}"
    );
    pool.wake(&[t]).unwrap();

    let (_dir2, ckpt) = checkpoint();
    load_into_pool(&pool, ckpt, &rules, &reg, &opts, &Control::default()).unwrap();
    let loaded: Vec<Vec<u8>> = reg.iter().map(|d| read(&pool, d.ptr, d.bytes())).collect();
    // Reload needs the source the load registered: without it the sleep is refused
    // or the bytes would not come back.
    pool.sleep(&[(t, Policy::Reload)]).unwrap();
    pool.wake(&[t]).unwrap();
    let again: Vec<Vec<u8>> = reg.iter().map(|d| read(&pool, d.ptr, d.bytes())).collect();
    assert_eq!(loaded, again);
}

#[test]
fn pool_read_write_refuse_ranges_outside_one_awake_segment() {
    let h = pool::host(1 << 30);
    let pool = Pool::new(pool::dyn_driver(&h), pool::small_config()).unwrap();
    let t = tag::id("test-into-pool-range").unwrap();
    let b = pool.alloc_tagged(4096, t).unwrap();
    let data = vec![7u8; 4096];
    // SAFETY: nothing sleeps or frees the block during these calls.
    unsafe {
        pool.write(b.ptr, &data).unwrap();
        assert_eq!(read(&pool, b.ptr, 4096), data);
        let past = pool.segment_of(b.ptr).unwrap();
        let end = past.base + past.tracked_bytes as u64;
        assert!(matches!(
            pool.write(end - 16, &data),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            pool.write(u64::MAX - 8, &data),
            Err(Error::UnknownPointer { .. }) | Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            pool.write(1 << 12, &data),
            Err(Error::UnknownPointer { .. })
        ));
    }
    pool.sleep(&[(t, Policy::Discard)]).unwrap();
    let mut back = vec![0u8; 16];
    // SAFETY: the check refuses the asleep range before any copy.
    let err = unsafe { pool.read(b.ptr, &mut back) }.unwrap_err();
    assert!(matches!(err, Error::InvalidState(_)), "{err}");
}

#[test]
fn session_cancel_is_kept_by_a_refused_load_and_cleared_by_one_that_copied() {
    let h = pool::host(1 << 30);
    let pool = Pool::new(pool::dyn_driver(&h), pool::small_config()).unwrap();
    let t = tag::id("test-into-pool-session-cancel").unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &generate(&SMALL, Dtype::Bf16), Dtype::Bf16, 2);
    let session = vmmweights::loader::Session::open(dir.path()).unwrap();
    session.cancel();
    // No destination yet: refused at plan time, before any copy.
    let err = session.load(&pool, None).unwrap_err();
    assert_eq!(err.status(), vmmweights::Status::PlanMismatch, "{err}");
    assert!(session.cancel_pending(), "a refused load keeps the request");
    session.allocate(&pool, t).unwrap();
    let err = session.load(&pool, None).unwrap_err();
    assert!(matches!(err, Error::Cancelled { .. }), "{err}");
    assert!(!session.cancel_pending(), "the cancelled load consumed it");
    assert!(session.last_result().is_none());
    // A progress callback's Break cancels as `cancel` does; on the last call
    // the copies are done and the load succeeds. Either way it ran its
    // copies, so no request is left pending.
    let stop = |_done: u64, _total: u64| std::ops::ControlFlow::Break(());
    match session.load(&pool, Some(&stop)) {
        Ok(_) | Err(Error::Cancelled { .. }) => {}
        Err(e) => panic!("{e}"),
    }
    assert!(!session.cancel_pending());
    let ex = session.load(&pool, None).unwrap();
    assert_eq!(session.plan().unwrap().src_bytes, ex.plan().src_bytes());
    assert!(session.last_result().is_some());
    for d in session.destinations() {
        pool.free(d.ptr).unwrap();
    }
}
