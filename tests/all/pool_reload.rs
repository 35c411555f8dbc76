//! Load a generated checkpoint into pool memory, sleep the weights with the
//! Reload policy (host backup only for bytes the loader did not write), wake, and get the same bytes back at the
//! same addresses, restored from the checkpoint through the executed plan.

use crate::common;

use std::sync::Arc;

use common::loader::*;
use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::loader::*;
use vmmweights::sleep::Policy;
use vmmweights::{tag, Driver, Pool, PoolConfig};

#[test]
fn reload_wake_restores_loaded_bytes_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = generate(&SMALL, Dtype::Bf16);
    write_sharded(dir.path(), &tensors, Dtype::Bf16, 2);

    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: 64 << 10,
        memory_limit: 1 << 30,
    }));
    let d: Arc<dyn Driver> = h.clone();
    let pool = Pool::new(d.clone(), PoolConfig::default()).unwrap();
    let weights = tag::id("test-reload-weights").unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let rules = Rules::preset("llama", None, SMALL.head_dim).unwrap();
    let mut reg = Registry::new();
    {
        let _scope = tag::scope(weights).unwrap();
        reg.allocate(&Plan::destinations(&ckpt, &rules).unwrap(), &pool)
            .unwrap();
    }
    let plan = load(
        &d,
        ckpt,
        &rules,
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
    let before: Vec<(u64, Vec<u8>)> = reg
        .iter()
        .map(|dst| (dst.ptr, read(d.as_ref(), dst.ptr, dst.bytes())))
        .collect();
    assert!(before.iter().any(|(_, b)| b.iter().any(|&x| x != 0)));

    let plan = Arc::new(plan);
    pool.add_reload_source(weights, plan.clone()).unwrap();
    let tracked = pool
        .report()
        .tag("test-reload-weights")
        .unwrap()
        .tracked_bytes;
    let phys = h.counts().physical_bytes;
    pool.sleep(&[(weights, Policy::Reload)]).unwrap();
    let rep = pool.report();
    let w = rep.tag("test-reload-weights").unwrap();
    assert_eq!(w.reloadable_bytes, tracked);
    // Only the bytes of live blocks the loader did not write (here the
    // padding that rounds each block to the pool's alignment) stay on the host.
    let loaded: u64 = reg.iter().map(|d| d.bytes() as u64).sum();
    assert_eq!(
        w.host_backup_bytes,
        w.live_bytes - loaded,
        "Reload keeps only the uncovered live bytes"
    );
    assert_eq!(h.counts().physical_bytes, phys - tracked);

    let woke = pool.wake(&[weights]).unwrap();
    let loaded: u64 = reg.iter().map(|d| d.bytes() as u64).sum();
    assert!(
        woke[0].report.reloaded_bytes >= loaded,
        "{:?}",
        woke[0].report
    );
    for (ptr, bytes) in &before {
        assert!(
            &read(d.as_ref(), *ptr, bytes.len()) == bytes,
            "tensor at {ptr:#x}"
        );
    }

    // The Reload sleep pinned the checkpoint's page cache in the background;
    // once that is done, the next wake DMAs from it (no staging copy).
    pool.sleep_engine().wait_reload_prepared(weights);
    let pinned = plan.pinned_source_bytes().unwrap();
    assert!(pinned >= loaded, "pinned {pinned} of {loaded} loaded bytes");
    pool.sleep(&[(weights, Policy::Reload)]).unwrap();
    pool.wake(&[weights]).unwrap();
    let replay = plan.last_replay().unwrap();
    assert!(
        replay.direct_bytes > 0 && replay.staged_bytes == 0,
        "{replay:?}"
    );
    for (ptr, bytes) in &before {
        assert!(
            &read(d.as_ref(), *ptr, bytes.len()) == bytes,
            "tensor at {ptr:#x} after the pinned replay"
        );
    }
}
