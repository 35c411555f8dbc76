//! A panic inside a swap, a sleep or a wake (a bug, or a reload source of
//! the caller's that panics) reaches the caller, and the pool stays usable:
//! the tags it named leave their transition, so later calls on them (and on
//! every other tag, which waits behind them) do not wait forever.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::{DevicePtr, Driver};
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::sleep::reload::ReloadSource;
use vmmweights::sleep::{Policy, WakeOptions};
use vmmweights::tag::{self, TagId};

const G: usize = 64 << 10;

fn unique(name: &str) -> TagId {
    static N: AtomicUsize = AtomicUsize::new(0);
    tag::id(&format!(
        "swap-panic-{name}-{}",
        N.fetch_add(1, Ordering::Relaxed)
    ))
    .unwrap()
}

/// A reload source over one block that panics in `reload` (the wake side)
/// or in `prepare` (the end of a Reload sleep) while armed.
#[derive(Debug)]
struct Panicking {
    range: (DevicePtr, usize),
    in_reload: AtomicBool,
    in_prepare: AtomicBool,
}

impl ReloadSource for Panicking {
    fn reload(&self, _: &dyn Driver, _: &[(DevicePtr, usize)]) -> vmmweights::Result<u64> {
        assert!(
            !self.in_reload.load(Ordering::Relaxed),
            "a reload source that panics"
        );
        Ok(0)
    }

    fn covered_ranges(&self) -> Vec<(DevicePtr, usize)> {
        vec![self.range]
    }

    fn prepare(&self) {
        assert!(
            !self.in_prepare.load(Ordering::Relaxed),
            "a reload source that panics"
        );
    }
}

struct World {
    pool: Arc<Pool>,
    a: TagId,
    b: TagId,
    src: Arc<Panicking>,
}

fn world() -> World {
    let d: Arc<dyn Driver> = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }));
    let pool = Arc::new(Pool::new(d, PoolConfig::default()).unwrap());
    let (a, b) = (unique("a"), unique("b"));
    pool.alloc_tagged(1 << 20, a).unwrap();
    let blk = pool.alloc_tagged(1 << 20, b).unwrap();
    let src = Arc::new(Panicking {
        range: (blk.ptr, blk.size),
        in_reload: AtomicBool::new(false),
        in_prepare: AtomicBool::new(false),
    });
    pool.add_reload_source(b, src.clone()).unwrap();
    World { pool, a, b, src }
}

/// Run `f` on a thread of its own; false when it has not returned within
/// ten seconds (it waits forever).
fn returns(f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(10)).is_ok()
}

fn quiet<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
}

#[test]
fn a_panic_on_the_wake_side_of_a_swap_leaves_the_pool_usable() {
    let w = world();
    w.pool.sleep(&[(w.b, Policy::Reload)]).unwrap();
    w.src.in_reload.store(true, Ordering::Relaxed);
    let r = quiet(|| w.pool.swap(&[(w.a, Policy::Offload)], &[w.b]));
    assert!(r.is_err(), "the panic reaches the caller");
    w.src.in_reload.store(false, Ordering::Relaxed);
    let (pool, a, b) = (w.pool.clone(), w.a, w.b);
    assert!(
        returns(move || {
            let _ = pool.swap(&[(a, Policy::Offload)], &[b]);
            let _ = pool.wake(&[a, b]);
        }),
        "a swap of the same tags after the panic waits forever"
    );
    w.pool.wake(&[]).unwrap();
    assert!(!w.pool.is_tag_asleep(w.a) && !w.pool.is_tag_asleep(w.b));
}

#[test]
fn a_panic_on_the_sleep_side_of_a_swap_leaves_the_pool_usable() {
    let w = world();
    w.pool.sleep(&[(w.a, Policy::Offload)]).unwrap();
    w.src.in_prepare.store(true, Ordering::Relaxed);
    let r = quiet(|| w.pool.swap(&[(w.b, Policy::Reload)], &[w.a]));
    assert!(r.is_err(), "the panic reaches the caller");
    w.src.in_prepare.store(false, Ordering::Relaxed);
    let (pool, a, b) = (w.pool.clone(), w.a, w.b);
    assert!(
        returns(move || {
            let _ = pool.swap(&[(a, Policy::Offload)], &[b]);
            let _ = pool.sleep(&[(b, Policy::Offload)]);
        }),
        "a swap of the same tags after the panic waits forever"
    );
}

#[test]
fn a_panic_in_a_sleep_or_a_waiting_wake_leaves_the_pool_usable() {
    let w = world();
    w.src.in_prepare.store(true, Ordering::Relaxed);
    assert!(quiet(|| w.pool.sleep(&[(w.b, Policy::Reload)])).is_err());
    w.src.in_prepare.store(false, Ordering::Relaxed);
    let (pool, b) = (w.pool.clone(), w.b);
    assert!(
        returns(move || {
            let _ = pool.sleep(&[(b, Policy::Reload)]);
        }),
        "a sleep after the panic waits forever"
    );
    w.src.in_reload.store(true, Ordering::Relaxed);
    let wait = WakeOptions {
        wait_for_memory: Duration::from_millis(5),
    };
    assert!(quiet(|| w.pool.wake_with(&[w.b], wait)).is_err());
    w.src.in_reload.store(false, Ordering::Relaxed);
    let (pool, b) = (w.pool.clone(), w.b);
    assert!(
        returns(move || {
            let _ = pool.wake(&[b]);
        }),
        "a wake after the panic waits forever"
    );
}
