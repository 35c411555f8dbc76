//! What becomes of a host backup after the wake, on the host backend: a
//! wake keeps it (the next sleep reuses the same memory); `drop_backups`
//! releases it per tag while the pinned memory stays in the arena (or is
//! unpinned with `unpin`); memory freed while it holds a backup gives the
//! backup's pinned memory back at once. These are what the memory-saver
//! shims build their default and retained modes on.

use std::sync::Arc;

use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::{DevicePtr, Driver, StreamId};
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::{tag, Error};

const G: usize = 64 << 10;
const MIB: usize = 1 << 20;

fn pool() -> Pool {
    let d: Arc<dyn Driver> = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }));
    let config = PoolConfig {
        sleep: SleepOptions {
            copy_piece_bytes: MIB,
            backup_slab_bytes: 4 * MIB,
            ..SleepOptions::default()
        },
        ..PoolConfig::default()
    };
    Pool::new(d, config).unwrap()
}

fn write(p: &Pool, ptr: DevicePtr, byte: u8, len: usize) {
    let data = vec![byte; len];
    // SAFETY: `ptr` is an awake block of at least `len` bytes.
    unsafe {
        p.driver()
            .copy_htod_async(ptr, data.as_ptr(), len, StreamId::DEFAULT)
    }
    .unwrap();
    p.driver().synchronize().unwrap();
}

fn first_byte(p: &Pool, ptr: DevicePtr) -> u8 {
    let mut b = [0u8; 1];
    // SAFETY: `ptr` is an awake block.
    unsafe {
        p.driver()
            .copy_dtoh_async(b.as_mut_ptr(), ptr, 1, StreamId::DEFAULT)
    }
    .unwrap();
    p.driver().synchronize().unwrap();
    b[0]
}

fn backup_bytes(p: &Pool, name: &str) -> u64 {
    p.report()
        .tags
        .iter()
        .find(|t| t.tag == name)
        .map_or(0, |t| t.host_backup_bytes)
}

#[test]
fn drop_backups_releases_the_named_tags_and_keeps_the_arena_pinned() {
    let p = pool();
    let (a, b) = (
        tag::id("backups-drop-a").unwrap(),
        tag::id("backups-drop-b").unwrap(),
    );
    let pa = p.alloc_segment(4 * MIB, a).unwrap().ptr;
    let pb = p.alloc_segment(4 * MIB, b).unwrap().ptr;
    write(&p, pa, 1, 4 * MIB);
    write(&p, pb, 2, 4 * MIB);
    p.sleep(&[(a, Policy::Offload), (b, Policy::Offload)])
        .unwrap();
    p.wake(&[a, b]).unwrap();
    assert!(
        backup_bytes(&p, "backups-drop-a") >= 4 * MIB as u64,
        "a wake keeps the backup"
    );

    assert_eq!(p.drop_backups(&[a], false).unwrap(), 0, "nothing unpinned");
    assert_eq!(backup_bytes(&p, "backups-drop-a"), 0);
    assert!(
        backup_bytes(&p, "backups-drop-b") >= 4 * MIB as u64,
        "only the named tag"
    );

    // The next sleep of `a` takes the memory kept in the arena: the arena
    // does not grow.
    write(&p, pa, 3, 4 * MIB);
    p.sleep(&[(a, Policy::Offload)]).unwrap();
    assert!(
        p.drop_backups(&[a], true).is_ok(),
        "an asleep tag keeps its backup"
    );
    assert!(backup_bytes(&p, "backups-drop-a") >= 4 * MIB as u64);
    p.wake(&[a]).unwrap();
    assert_eq!(
        first_byte(&p, pa),
        3,
        "the backup taken from the kept arena came back"
    );
    assert_eq!(first_byte(&p, pb), 2);

    // With unpin, every slab left empty goes too: nothing left to release.
    p.drop_backups(&[a, b], true).unwrap();
    assert_eq!(backup_bytes(&p, "backups-drop-b"), 0);
    assert_eq!(p.release_backup(), 0);
    p.free_segment(pa).unwrap();
    p.free_segment(pb).unwrap();
}

#[test]
fn drop_backups_keeps_pinned_memory_a_later_release_gives_back() {
    let p = pool();
    let t = tag::id("backups-kept").unwrap();
    let ptr = p.alloc_segment(8 * MIB, t).unwrap().ptr;
    write(&p, ptr, 9, 8 * MIB);
    p.sleep(&[(t, Policy::Offload)]).unwrap();
    p.wake(&[t]).unwrap();
    p.drop_backups(&[t], false).unwrap();
    assert!(
        p.release_backup() >= 8 * MIB as u64,
        "the dropped backup's pinned memory was still held"
    );
    p.free_segment(ptr).unwrap();
}

#[test]
fn freeing_memory_that_holds_a_backup_unpins_it_at_once() {
    for asleep in [false, true] {
        let p = pool();
        let t = tag::id("backups-freed").unwrap();
        let keep = tag::id("backups-freed-keep").unwrap();
        let ptr = p.alloc_segment(4 * MIB, t).unwrap().ptr;
        let other = p.alloc_segment(4 * MIB, keep).unwrap().ptr;
        write(&p, ptr, 5, 4 * MIB);
        write(&p, other, 6, 4 * MIB);
        // Two sleeps, so the two backups lie in slabs of their own.
        p.sleep(&[(keep, Policy::Offload)]).unwrap();
        p.sleep(&[(t, Policy::Offload)]).unwrap();
        p.wake(&[keep]).unwrap();
        if !asleep {
            p.wake(&[t]).unwrap();
        }
        assert!(backup_bytes(&p, "backups-freed") >= 4 * MIB as u64);
        p.free_segment(ptr).unwrap();
        assert_eq!(backup_bytes(&p, "backups-freed"), 0);
        // Only the other tag's backup is left pinned: what a release finds
        // is that one's slab alone, once it is dropped.
        p.drop_backups(&[keep], false).unwrap();
        let left = p.release_backup();
        assert!(
            (4 * MIB as u64..8 * MIB as u64).contains(&left),
            "freed {}: {left} bytes still pinned, want only the other tag's slab",
            if asleep { "asleep" } else { "awake" }
        );
        assert_eq!(first_byte(&p, other), 6);
        p.free_segment(other).unwrap();
    }
}

#[test]
fn drop_backups_refuses_a_tag_never_registered_and_changes_nothing() {
    let p = pool();
    let t = tag::id("backups-refused").unwrap();
    let ptr = p.alloc_segment(4 * MIB, t).unwrap().ptr;
    p.sleep(&[(t, Policy::Offload)]).unwrap();
    p.wake(&[t]).unwrap();
    let e = p
        .drop_backups(&[t, tag::TagId(u32::MAX)], false)
        .unwrap_err();
    assert!(matches!(e, Error::UnknownTag(_)), "{e}");
    assert!(
        backup_bytes(&p, "backups-refused") >= 4 * MIB as u64,
        "nothing dropped"
    );
    p.free_segment(ptr).unwrap();
}
