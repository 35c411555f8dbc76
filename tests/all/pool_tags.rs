//! Tag scopes nest and unwind (also across panics); blocks of different tags
//! never share a segment; the process default applies to threads without a scope.

use crate::common;

use std::collections::HashMap;

use common::pool::*;
use vmmweights::{tag, Error, Pool, TagId};

#[test]
fn scopes_nest_and_unwind() {
    let (a, b, c) = (
        tag::id("scope-a").unwrap(),
        tag::id("scope-b").unwrap(),
        tag::id("scope-c").unwrap(),
    );
    assert_eq!(tag::id("scope-a").unwrap(), a, "same name, same id");
    assert_eq!(tag::lookup("scope-b"), Some(b));
    assert_eq!(tag::lookup("never-registered-here"), None);
    let base = tag::current();
    {
        let _ga = tag::scope(a).unwrap();
        assert_eq!(tag::current(), a);
        {
            let _gb = tag::scope(b).unwrap();
            assert_eq!(tag::current(), b);
            tag::push(c).unwrap();
            assert_eq!(tag::current(), c);
            assert_eq!(tag::pop().unwrap(), c);
            assert_eq!(tag::current(), b);
        }
        assert_eq!(tag::current(), a);
        // A push left open inside a guarded scope is closed with it.
        {
            let _gb = tag::scope(b).unwrap();
            tag::push(c).unwrap();
        }
        assert_eq!(tag::current(), a);
        assert_eq!(tag::depth(), 1);
    }
    assert_eq!(tag::current(), base);
    assert_eq!(tag::depth(), 0);
}

#[test]
fn pop_on_an_empty_stack_is_an_error_and_changes_nothing() {
    std::thread::spawn(|| {
        assert!(matches!(tag::pop(), Err(Error::InvalidState(_))));
        assert_eq!(tag::depth(), 0);
        let t = tag::id("pop-empty").unwrap();
        tag::push(t).unwrap();
        assert_eq!(tag::pop().unwrap(), t);
        assert!(tag::pop().is_err());
        assert!(matches!(
            tag::push(TagId(999_999)),
            Err(Error::UnknownTag(_))
        ));
        assert_eq!(tag::depth(), 0);
    })
    .join()
    .unwrap();
}

#[test]
fn scopes_unwind_across_panics() {
    std::thread::spawn(|| {
        let (a, b) = (tag::id("panic-a").unwrap(), tag::id("panic-b").unwrap());
        let _ga = tag::scope(a).unwrap();
        let r = std::panic::catch_unwind(|| {
            let _gb = tag::scope(b).unwrap();
            let _gc = tag::scope(a).unwrap();
            assert_eq!(tag::depth(), 3);
            panic!("boom inside two scopes");
        });
        assert!(r.is_err());
        assert_eq!(tag::depth(), 1);
        assert_eq!(tag::current(), a);
    })
    .join()
    .unwrap();
}

#[test]
fn scopes_are_per_thread_and_the_process_default_covers_threads_without_one() {
    // The only test in this binary that changes the process default.
    let w = tag::id("proc-default").unwrap();
    let _g = tag::scope(tag::id("main-thread-scope").unwrap()).unwrap();
    tag::set_process_default(w).unwrap();
    let seen = std::thread::spawn(tag::current).join().unwrap();
    assert_eq!(seen, w, "a thread with no scope uses the process default");
    assert_ne!(tag::current(), w, "a scope wins over the process default");
    assert!(tag::set_process_default(TagId(888_888)).is_err());
    assert_eq!(
        tag::process_default(),
        w,
        "a rejected default changes nothing"
    );
    tag::set_process_default(TagId::DEFAULT).unwrap();
}

#[test]
fn blocks_of_different_tags_never_share_a_segment() {
    let host = host(1 << 30);
    let pool = Pool::new(dyn_driver(&host), small_config()).unwrap();
    let tags: Vec<TagId> = ["seg-x", "seg-y", "seg-z"]
        .iter()
        .map(|n| tag::id(n).unwrap())
        .collect();
    let mut owner: HashMap<u64, TagId> = HashMap::new();
    let mut rng = Rng(7);
    let mut blocks = Vec::new();
    for i in 0..300 {
        let t = tags[i % 3];
        // Sizes from every class: small (shared), large (shared) and own segments.
        let size = [100, 5000, 70_000, 300_000][rng.below(4) as usize];
        let b = {
            let _s = tag::scope(t).unwrap();
            pool.alloc(size).unwrap()
        };
        let seg = pool.segment_of(b.ptr).unwrap();
        assert_eq!(seg.tag, t);
        if let Some(prev) = owner.insert(seg.base, t) {
            assert_eq!(prev, t, "segment {:#x} holds blocks of two tags", seg.base);
        }
        blocks.push(b);
        if i % 4 == 3 {
            let victim = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
            pool.free(victim.ptr).unwrap();
        }
    }
    let r = pool.report();
    for n in ["seg-x", "seg-y", "seg-z"] {
        let u = r.tag(n).expect("tag in the report");
        assert!(u.segments > 0 && u.live_bytes > 0, "{r}");
    }
    for b in blocks {
        pool.free(b.ptr).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(pool.report().total.segments, 0);
}
