//! RDMA-capable tags on the host backend: every chunk of such a tag is created
//! with the flag, again at each wake (and the remap epoch says the pages are
//! new); other tags are not; a device without support and a tag that already
//! holds memory are refused, changing nothing.

use std::sync::Arc;

use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::Driver;
use vmmweights::pool::{remap, Mode, Pool, PoolConfig};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Error};

const G: usize = 64 << 10;

fn setup() -> (Arc<HostDriver>, Pool) {
    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }));
    let d: Arc<dyn Driver> = h.clone();
    let config = PoolConfig {
        small_segment_bytes: 4 * G,
        small_request_max: 2 * G,
        large_segment_bytes: 16 * G,
        chunk_bytes: 4 * G,
        ..PoolConfig::default()
    };
    (h, Pool::new(d, config).unwrap())
}

#[test]
fn an_rdma_tag_creates_every_chunk_with_the_flag_again_at_each_wake() {
    let (h, p) = setup();
    let t = tag::id("rdma-weights").unwrap();
    let other = tag::id("rdma-other").unwrap();
    p.set_tag_rdma(t, true).unwrap();
    assert!(p.tag_rdma(t) && !p.tag_rdma(other));
    let _plain = p.alloc_tagged(G, other).unwrap();
    assert_eq!(h.rdma_handles_created(), 0, "other tags are created plain");
    let _small = p.alloc_tagged(G, t).unwrap();
    let _large = p.alloc_tagged(12 * G, t).unwrap();
    let _dedicated = p.alloc_segment(9 * G, t).unwrap();
    let created = h.rdma_handles_created();
    assert!(
        created >= 3,
        "each placement created RDMA-capable chunks ({created})"
    );
    let epoch = remap::epoch(t);
    p.sleep(&[(t, Policy::Offload)]).unwrap();
    p.wake(&[t]).unwrap();
    let woken = h.rdma_handles_created();
    assert!(
        woken > created,
        "the wake made the chunks again with the flag ({created} -> {woken})"
    );
    assert_eq!(remap::epoch(t), epoch + 1, "and raised the remap epoch");
    p.sleep(&[(other, Policy::Offload)]).unwrap();
    p.wake(&[other]).unwrap();
    assert_eq!(h.rdma_handles_created(), woken, "a plain tag wakes plain");
}

#[test]
fn an_rdma_arena_grows_with_the_flag() {
    let (h, p) = setup();
    let t = tag::id("rdma-arena").unwrap();
    p.set_tag_rdma(t, true).unwrap();
    p.set_tag_mode(
        t,
        Mode::Arena {
            reserve_bytes: 64 * G,
            grow_step: 2 * G,
        },
    )
    .unwrap();
    let _a = p.alloc_tagged(3 * G, t).unwrap();
    let first = h.rdma_handles_created();
    let _b = p.alloc_tagged(3 * G, t).unwrap();
    assert!(first > 0 && h.rdma_handles_created() > first);
}

#[test]
fn unsupported_devices_and_late_flags_are_refused_changing_nothing() {
    let (h, p) = setup();
    let t = tag::id("rdma-refused").unwrap();
    h.set_rdma_supported(false);
    let e = p.set_tag_rdma(t, true).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(
        e.to_string().contains("cannot create RDMA-capable memory")
            && e.to_string().contains("rdma-refused"),
        "{e}"
    );
    assert!(!p.tag_rdma(t));
    p.set_tag_rdma(t, false).unwrap();
    h.set_rdma_supported(true);
    let _b = p.alloc_tagged(G, t).unwrap();
    let e = p.set_tag_rdma(t, true).unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e}");
    assert!(e.to_string().contains("before its first allocation"), "{e}");
    assert!(!p.tag_rdma(t));
    assert_eq!(h.rdma_handles_created(), 0);
}
