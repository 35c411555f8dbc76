//! The expandable arena: one reservation per tag, tracked bytes within one
//! granule of the live bytes while growing, within one grow step after trim.

use crate::common;

use common::pool::*;
use vmmweights::pool::SegmentClass;
use vmmweights::{tag, Mode, Pool, TagId};

fn arena_pool(
    t: TagId,
    grow_step: usize,
) -> (std::sync::Arc<vmmweights::driver::host::HostDriver>, Pool) {
    let host = host(1 << 30);
    let pool = Pool::new(dyn_driver(&host), small_config()).unwrap();
    pool.set_tag_mode(
        t,
        Mode::Arena {
            reserve_bytes: 256 << 20,
            grow_step,
        },
    )
    .unwrap();
    (host, pool)
}

fn usage(pool: &Pool, name: &str) -> vmmweights::report::TagUsage {
    pool.report().tag(name).cloned().unwrap_or_default()
}

#[test]
fn growing_arena_stays_within_one_granule_of_live_bytes() {
    let t = tag::id("arena-grow").unwrap();
    let (host, pool) = arena_pool(t, 0);
    let mut rng = Rng(99);
    let mut blocks = Vec::new();
    for _ in 0..400 {
        let size = 512 * (1 + rng.below(600) as usize); // up to ~300 KiB, all 512-multiples
        let b = pool.alloc_tagged(size, t).unwrap();
        assert_eq!(pool.segment_of(b.ptr).unwrap().class, SegmentClass::Arena);
        blocks.push(b);
        let u = usage(&pool, "arena-grow");
        assert_eq!(u.segments, 1, "one reservation per tag");
        assert!(
            u.tracked_bytes >= u.live_bytes && u.tracked_bytes - u.live_bytes < G as u64,
            "tracked {} vs live {}: more than one granule apart",
            u.tracked_bytes,
            u.live_bytes
        );
    }
    // Blocks are contiguous: the weights of a model sit in one range.
    blocks.sort_by_key(|b| b.ptr);
    for w in blocks.windows(2) {
        assert_eq!(w[0].ptr + w[0].size as u64, w[1].ptr);
    }
    // Free the upper half and trim: the tail is decommitted to within a granule.
    let keep = blocks.len() / 2;
    for b in &blocks[keep..] {
        pool.free(b.ptr).unwrap();
    }
    let before = usage(&pool, "arena-grow").tracked_bytes;
    let released = pool.trim().unwrap();
    let u = usage(&pool, "arena-grow");
    assert_eq!(released, before - u.tracked_bytes);
    assert!(u.tracked_bytes - u.live_bytes < G as u64, "{u:?}");
    // Freed holes are reused before the arena grows again.
    pool.free(blocks[3].ptr).unwrap();
    let again = pool.alloc_tagged(blocks[3].size, t).unwrap();
    assert_eq!(again.ptr, blocks[3].ptr);
    for b in blocks[..keep].iter() {
        pool.free(b.ptr).unwrap();
    }
    pool.check_invariants().unwrap();
    pool.trim().unwrap();
    assert_eq!(
        usage(&pool, "arena-grow").segments,
        0,
        "a wholly free arena is released"
    );
    assert_eq!(host.counts().reservations, 0);
    assert_eq!(host.counts().physical_bytes, 0);
}

#[test]
fn with_a_larger_grow_step_trim_keeps_less_than_one_step() {
    let t = tag::id("arena-step").unwrap();
    let step = 4 * G;
    let (_host, pool) = arena_pool(t, step);
    let mut blocks: Vec<_> = (0..64)
        .map(|i| pool.alloc_tagged(20_000 + i * 512, t).unwrap())
        .collect();
    let u = usage(&pool, "arena-step");
    assert!(
        u.tracked_bytes - u.live_bytes < G as u64,
        "growth commits to the granule: {u:?}"
    );
    let mut rng = Rng(5);
    for _ in 0..40 {
        let b = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
        pool.free(b.ptr).unwrap();
    }
    pool.trim().unwrap();
    let end = blocks.iter().map(|b| b.ptr + b.size as u64).max().unwrap();
    let base = pool.segment_of(blocks[0].ptr).unwrap().base;
    let u = usage(&pool, "arena-step");
    assert!(
        u.tracked_bytes < (end - base) + step as u64,
        "after trim, tracked {} must be less than one grow step past the live end {}",
        u.tracked_bytes,
        end - base
    );
    pool.check_invariants().unwrap();
}

#[test]
fn a_full_arena_falls_back_to_segments_of_the_same_tag() {
    let t = tag::id("arena-full").unwrap();
    let host = host(1 << 30);
    let pool = Pool::new(dyn_driver(&host), small_config()).unwrap();
    pool.set_tag_mode(
        t,
        Mode::Arena {
            reserve_bytes: 4 * G,
            grow_step: 0,
        },
    )
    .unwrap();
    let a = pool.alloc_tagged(3 * G, t).unwrap();
    let b = pool.alloc_tagged(2 * G, t).unwrap();
    assert_eq!(pool.segment_of(a.ptr).unwrap().class, SegmentClass::Arena);
    let sb = pool.segment_of(b.ptr).unwrap();
    assert_ne!(sb.class, SegmentClass::Arena);
    assert_eq!(sb.tag, t);
    // Changing the mode while the arena exists is refused and changes nothing.
    assert!(pool.set_tag_mode(t, Mode::Segments).is_err());
    assert!(matches!(pool.tag_mode(t), Mode::Arena { .. }));
    pool.free(a.ptr).unwrap();
    pool.free(b.ptr).unwrap();
    pool.trim().unwrap();
    pool.set_tag_mode(t, Mode::Segments).unwrap();
    drop(pool);
    assert_eq!(host.counts().reservations, 0);
}
