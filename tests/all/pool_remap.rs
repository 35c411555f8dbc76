//! Remap notices: a tag's epoch goes up once per wake (never for a sleep or a
//! failed wake), callbacks get the tag and the new epoch after the wake on the
//! waking thread, may call back into the library (read the epoch, remove
//! themselves), and a panicking one does not stop the others.

use std::sync::{Arc, Mutex};

use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::Driver;
use vmmweights::pool::{remap, Pool, PoolConfig};
use vmmweights::sleep::Policy;
use vmmweights::tag;

const G: usize = 64 << 10;

fn pool() -> (Arc<HostDriver>, Pool) {
    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }));
    let d: Arc<dyn Driver> = h.clone();
    (h, Pool::new(d, PoolConfig::default()).unwrap())
}

#[test]
fn each_wake_raises_the_epoch_and_calls_back_after_it() {
    let (_h, p) = pool();
    let t = tag::id("remap-epoch").unwrap();
    let _b = p.alloc_tagged(3 * G, t).unwrap();
    assert_eq!(remap::epoch(t), 0);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let thread = std::thread::current().id();
    let id = remap::on_remap(Arc::new(move |tag, epoch| {
        if tag == t {
            // Re-entering the library is allowed: no lock of it is held.
            assert_eq!(remap::epoch(tag), epoch);
            s.lock()
                .unwrap()
                .push((epoch, std::thread::current().id() == thread));
        }
    }));
    let panicking = remap::on_remap(Arc::new(move |tag, _| {
        if tag == t {
            panic!("a callback that panics");
        }
    }));
    for cycle in 1..=3u64 {
        p.sleep(&[(t, Policy::Offload)]).unwrap();
        assert_eq!(remap::epoch(t), cycle - 1, "a sleep does not remap");
        p.wake(&[t]).unwrap();
        assert_eq!(remap::epoch(t), cycle);
    }
    assert_eq!(*seen.lock().unwrap(), vec![(1, true), (2, true), (3, true)]);
    assert!(remap::remove(id));
    assert!(remap::remove(panicking));
    assert!(!remap::remove(id), "removed once");
    p.sleep(&[(t, Policy::Offload)]).unwrap();
    p.wake(&[t]).unwrap();
    assert_eq!(remap::epoch(t), 4);
    assert_eq!(
        seen.lock().unwrap().len(),
        3,
        "a removed callback is not called"
    );
}

#[test]
fn a_failed_wake_leaves_the_epoch() {
    let (host, p) = pool();
    let t = tag::id("remap-failed-wake").unwrap();
    let _b = p.alloc_tagged(2 * G, t).unwrap();
    p.sleep(&[(t, Policy::Offload)]).unwrap();
    host.fail_nth(FaultOp::Create, 1);
    assert!(p.wake(&[t]).is_err());
    assert_eq!(remap::epoch(t), 0);
    p.wake(&[t]).unwrap();
    assert_eq!(remap::epoch(t), 1);
}
