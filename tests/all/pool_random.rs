//! Random alloc/free/trim sequences from several threads, checked against a
//! simple model: no two live blocks overlap (in addresses and in memory),
//! report invariants hold, and everything is released on drop.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use common::pool::*;
use vmmweights::{tag, Mode, Pool, TagId};

/// Live blocks of every thread: ptr -> (size, tag, fill byte).
type Model = Mutex<BTreeMap<u64, (usize, TagId, u8)>>;

fn insert_checked(model: &Model, ptr: u64, size: usize, tag: TagId, byte: u8) {
    let mut m = model.lock().unwrap();
    if let Some((&p, &(s, _, _))) = m.range(..=ptr).next_back() {
        assert!(
            p + s as u64 <= ptr,
            "new block {ptr:#x}+{size} overlaps {p:#x}+{s}"
        );
    }
    if let Some((&n, _)) = m.range(ptr..).next() {
        assert!(
            ptr + size as u64 <= n,
            "new block {ptr:#x}+{size} overlaps {n:#x}"
        );
    }
    m.insert(ptr, (size, tag, byte));
}

fn check_report(pool: &Pool) {
    let r = pool.report();
    let t = &r.total;
    assert!(t.live_bytes <= t.reserved_bytes, "live > reserved:\n{r}");
    assert!(
        t.tracked_bytes <= t.reserved_bytes,
        "tracked > reserved:\n{r}"
    );
    let sum = |f: fn(&vmmweights::report::TagUsage) -> u64| r.tags.iter().map(f).sum::<u64>();
    assert_eq!(sum(|u| u.live_bytes), t.live_bytes);
    assert_eq!(sum(|u| u.reserved_bytes), t.reserved_bytes);
    assert_eq!(sum(|u| u.tracked_bytes), t.tracked_bytes);
    assert_eq!(sum(|u| u.segments), t.segments);
    for u in &r.tags {
        assert!(
            u.live_bytes <= u.reserved_bytes,
            "tag {}: live > reserved\n{r}",
            u.tag
        );
        assert!(
            u.tracked_bytes <= u.reserved_bytes,
            "tag {}: tracked > reserved\n{r}",
            u.tag
        );
    }
}

fn run(seed: u64, threads: usize, ops: usize, arena_tag: bool) {
    let host = host(1 << 30);
    let pool = Arc::new(Pool::new(dyn_driver(&host), small_config()).unwrap());
    let tags = [
        tag::id("rand-a").unwrap(),
        tag::id("rand-b").unwrap(),
        tag::id("rand-c").unwrap(),
    ];
    if arena_tag {
        pool.set_tag_mode(
            tags[2],
            Mode::Arena {
                reserve_bytes: 64 << 20,
                grow_step: 0,
            },
        )
        .unwrap();
    }
    let model: Arc<Model> = Arc::default();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (pool, model) = (pool.clone(), model.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let mut mine: Vec<(u64, usize, u8)> = Vec::new();
                for i in 0..ops {
                    match rng.below(100) {
                        0..=54 => {
                            let size = match rng.below(10) {
                                0..=5 => 1 + rng.below(8 << 10) as usize,
                                6..=8 => 1 + rng.below(2 * G as u64) as usize,
                                _ => 1 + rng.below(6 * G as u64) as usize,
                            };
                            let tag = tags[rng.below(3) as usize];
                            let b = {
                                let _scope = tag::scope(tag).unwrap();
                                pool.alloc(size).unwrap()
                            };
                            assert_eq!(b.tag, tag);
                            assert!(b.size >= size && b.size % 512 == 0);
                            let seg = pool.segment_of(b.ptr).unwrap();
                            assert_eq!(seg.tag, tag, "block landed in another tag's segment");
                            let byte = (i % 251) as u8 + 1;
                            fill(b.ptr, b.size, byte);
                            insert_checked(&model, b.ptr, b.size, tag, byte);
                            mine.push((b.ptr, b.size, byte));
                        }
                        55..=94 if !mine.is_empty() => {
                            let (ptr, size, byte) =
                                mine.swap_remove(rng.below(mine.len() as u64) as usize);
                            verify(ptr, size, byte);
                            model.lock().unwrap().remove(&ptr);
                            pool.free(ptr).unwrap();
                        }
                        95..=97 => {
                            pool.trim().unwrap();
                        }
                        _ => {
                            check_report(&pool);
                            pool.check_invariants().unwrap();
                        }
                    }
                }
                mine
            })
        })
        .collect();
    let leftovers: Vec<_> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();

    // Quiescent: the pool's live blocks are exactly the model's.
    pool.check_invariants().unwrap();
    check_report(&pool);
    let m = model.lock().unwrap().clone();
    let live: BTreeMap<u64, (usize, TagId)> = pool
        .live_blocks()
        .into_iter()
        .map(|b| (b.ptr, (b.size, b.tag)))
        .collect();
    let expect: BTreeMap<u64, (usize, TagId)> =
        m.iter().map(|(&p, &(s, t, _))| (p, (s, t))).collect();
    assert_eq!(live, expect);
    let r = pool.report();
    let mut per_tag: HashMap<String, u64> = HashMap::new();
    for &(s, t, _) in m.values() {
        *per_tag.entry(tag::name_of(t)).or_default() += s as u64;
    }
    for u in &r.tags {
        assert_eq!(
            u.live_bytes,
            per_tag.get(&u.tag).copied().unwrap_or(0),
            "{r}"
        );
    }

    for (ptr, size, byte) in leftovers {
        verify(ptr, size, byte);
        pool.free(ptr).unwrap();
    }
    let released = pool.trim().unwrap();
    let r = pool.report();
    assert_eq!(r.total.live_bytes, 0, "{r}");
    assert_eq!(r.total.tracked_bytes, 0, "{r}");
    assert_eq!(r.total.segments, 0, "{r}");
    assert!(released > 0 || r.total.tracked_bytes == 0);
    assert_eq!(host.counts().physical_bytes, 0);
    drop(pool);
    let c = host.counts();
    assert_eq!(
        (c.reservations, c.handles, c.mappings, c.physical_bytes),
        (0, 0, 0, 0),
        "leak after drop: {c:?}"
    );
}

#[test]
fn random_sequences_from_four_threads() {
    run(0x1234_5678, 4, 1500, false);
}

#[test]
fn random_sequences_with_an_arena_tag() {
    run(0xdead_beef, 4, 1500, true);
}

#[test]
fn dropping_a_pool_with_live_blocks_releases_everything() {
    let host = host(1 << 30);
    let pool = Pool::new(dyn_driver(&host), small_config()).unwrap();
    let t = tag::id("rand-drop").unwrap();
    for i in 1..50 {
        pool.alloc_tagged(i * 3000, t).unwrap();
    }
    assert!(host.counts().handles > 0);
    drop(pool);
    let c = host.counts();
    assert_eq!((c.reservations, c.handles, c.mappings), (0, 0, 0), "{c:?}");
}
