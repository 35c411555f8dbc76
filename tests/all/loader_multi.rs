//! Several devices on the host backend's simulated devices: replicas filled
//! by fan-out (host memory read once, shares exchanged by peer copies),
//! tensor-parallel ranks against slices of the full tensors, peer access kept
//! across sleep/wake, and devices failing midway.

use crate::common;

use std::sync::Arc;

use common::loader::{generate, slice, write_sharded, Shape, Tensors, PATTERN, SMALL};
use common::pool::{small_config, G};
use vmmweights::devices::replicas::wake_by_reload as wake_replicas;
use vmmweights::devices::*;
use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::testing::Testing;
use vmmweights::driver::{AccessMode, PeerAccess, StreamId};
use vmmweights::loader::*;
use vmmweights::sleep::Policy;
use vmmweights::{tag, Driver, Error, Pool};

/// One pool per simulated device 0..n.
fn pools(n: usize) -> Vec<Pool> {
    (0..n)
        .map(|k| {
            let cfg = HostConfig {
                granularity: G,
                memory_limit: 1 << 30,
            };
            let d: Arc<dyn Driver> = Arc::new(HostDriver::for_device(cfg, k as i32).unwrap());
            Pool::new(d, small_config()).unwrap()
        })
        .collect()
}

fn host(p: &Pool) -> &HostDriver {
    p.driver().as_host().unwrap()
}

fn read(pool: &Pool, ptr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: nothing sleeps or frees the range during the read.
    unsafe { pool.read(ptr, &mut v) }.unwrap();
    v
}

fn fill_pattern(pool: &Pool, reg: &Registry) {
    for d in reg.iter() {
        // SAFETY: a destination allocated from this pool, awake.
        unsafe { pool.write(d.ptr, &vec![PATTERN; d.bytes()]) }.unwrap();
    }
}

/// Destinations for `rules` in `pool` under `tag`, filled with PATTERN.
fn destinations(pool: &Pool, ckpt: &Checkpoint, rules: &Rules, tag: tag::TagId) -> Registry {
    let mut reg = Registry::new();
    allocate_in_pool(
        &mut reg,
        &Plan::destinations(ckpt, rules).unwrap(),
        pool,
        tag,
    )
    .unwrap();
    fill_pattern(pool, &reg);
    reg
}

/// The bytes `name` must hold on `rank` of `world` (bf16), from the full tensors.
/// Each rank's llama TP rules and destinations for `tag` in its own pool.
fn tp_ranks(
    pools: &[Pool],
    ckpt: &Checkpoint,
    head_dim: usize,
    tag: tag::TagId,
) -> (Vec<Rules>, Vec<Registry>) {
    let world = pools.len();
    let rules: Vec<Rules> = (0..world)
        .map(|rank| Rules::preset("llama", Some(Tp { rank, world }), head_dim).unwrap())
        .collect();
    let regs = pools
        .iter()
        .zip(&rules)
        .map(|(p, r)| destinations(p, ckpt, r, tag))
        .collect();
    (rules, regs)
}

/// One multi-device load target per rank.
fn rank_targets<'a>(
    pools: &'a [Pool],
    rules: &'a [Rules],
    regs: &'a [Registry],
) -> Vec<PoolLoad<'a>> {
    (0..pools.len())
        .map(|k| PoolLoad {
            pool: &pools[k],
            rules: &rules[k],
            registry: &regs[k],
        })
        .collect()
}

fn expected(t: &Tensors, s: &Shape, name: &str, rank: usize, world: usize) -> Vec<u8> {
    let e = 2;
    let rows = |n: &str, a: usize, k: usize| {
        let (sh, b) = &t[n];
        slice(sh, b, e, 0, a, k)
    };
    let split0 = |n: &str| {
        let per = t[n].0[0] / world;
        rows(n, rank * per, per)
    };
    let kv = |n: &str| {
        if world <= s.kv_heads {
            split0(n)
        } else {
            // More ranks than kv heads: each head is replicated on world/kv ranks.
            let head = rank / (world / s.kv_heads);
            rows(n, head * s.head_dim, s.head_dim)
        }
    };
    if let Some(l) = name.strip_suffix(".self_attn.qkv_proj.weight") {
        let mut v = split0(&format!("{l}.self_attn.q_proj.weight"));
        v.extend(kv(&format!("{l}.self_attn.k_proj.weight")));
        v.extend(kv(&format!("{l}.self_attn.v_proj.weight")));
        return v;
    }
    if let Some(l) = name.strip_suffix(".mlp.gate_up_proj.weight") {
        let mut v = split0(&format!("{l}.mlp.gate_proj.weight"));
        v.extend(split0(&format!("{l}.mlp.up_proj.weight")));
        return v;
    }
    if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
        let (sh, b) = &t[name];
        let per = sh[1] / world;
        return slice(sh, b, e, 1, rank * per, per);
    }
    if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
        return split0(name);
    }
    t[name].1.clone()
}

/// Eight query heads (two kv heads), so world 8 cuts whole heads and replicates kv heads 4 times.
const TP: Shape = Shape {
    heads: 8,
    kv_heads: 2,
    head_dim: 8,
    ..SMALL
};

fn assert_full(pool: &Pool, reg: &Registry, t: &Tensors, rank: usize, world: usize) {
    assert_full_of(&SMALL, pool, reg, t, rank, world)
}

fn assert_full_of(s: &Shape, pool: &Pool, reg: &Registry, t: &Tensors, rank: usize, world: usize) {
    for d in reg.iter() {
        let got = read(pool, d.ptr, d.bytes());
        let want = expected(t, s, &d.name, rank, world);
        assert!(
            got == want,
            "device {} destination `{}` (rank {rank} of {world}): {} bytes, {} expected, first differing at {:?}",
            pool.device(),
            d.name,
            got.len(),
            want.len(),
            got.iter().zip(&want).position(|(a, b)| a != b)
        );
    }
}

fn setup() -> (tempfile::TempDir, Tensors) {
    setup_of(&SMALL)
}

fn setup_of(s: &Shape) -> (tempfile::TempDir, Tensors) {
    let t = generate(s, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 3);
    (dir, t)
}

fn replicas_on(n: usize, tag_name: &str) {
    let (dir, t) = setup();
    let pools = pools(n);
    let tag = tag::id(tag_name).unwrap();
    let rules = Rules::preset("llama", None, SMALL.head_dim).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let regs: Vec<Registry> = pools
        .iter()
        .map(|p| destinations(p, &ckpt, &rules, tag))
        .collect();
    let targets: Vec<PoolLoad> = pools
        .iter()
        .zip(&regs)
        .map(|(pool, registry)| PoolLoad {
            pool,
            rules: &rules,
            registry,
        })
        .collect();
    let plan = Plan::build(&ckpt, &rules, &regs[0], &PlanOptions::default()).unwrap();
    let loaded = load_multi_into_pools(
        ckpt,
        &targets,
        MultiMode::Replicas,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
    for (p, r) in pools.iter().zip(&regs) {
        assert_full(p, r, &t, 0, 1);
    }
    let s = &loaded.stats;
    assert_eq!(s.host_bytes, plan.src_bytes(), "host memory is read once");
    assert_eq!(
        s.peer_bytes,
        (n as u64 - 1) * plan.dst_bytes(),
        "every device pulls what it did not load"
    );
    assert_eq!(s.delivered_bytes, n as u64 * plan.dst_bytes());
    assert!(s.recovered.is_empty());
    // Each device loaded a share of its own from host memory.
    assert!(
        s.per_device.iter().all(|d| d.bytes > 0),
        "{:?}",
        s.per_device
    );
    // Peers got read access to each other's tag, and each pool can reload.
    for p in &pools {
        let peers: Vec<i32> = p.peer_access(tag).iter().map(|a| a.device).collect();
        assert_eq!(peers.len(), n - 1, "{peers:?}");
        assert!(!peers.contains(&p.device()));
    }
    for (k, p) in pools.iter().enumerate() {
        p.sleep(&[(tag, Policy::Reload)]).unwrap();
        p.wake(&[tag]).unwrap();
        assert_full(p, &regs[k], &t, 0, 1);
    }
}

#[test]
fn replicas_on_two_devices_read_host_memory_once() {
    replicas_on(2, "multi-replicas-2");
}

#[test]
fn replicas_on_three_devices_read_host_memory_once() {
    replicas_on(3, "multi-replicas-3");
}

#[test]
fn tensor_parallel_worlds_2_4_8_hold_slices_of_the_full_tensors() {
    let (dir, t) = setup_of(&TP);
    for world in [2usize, 4, 8] {
        let pools = pools(world);
        let tag = tag::id(&format!("multi-tp-{world}")).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let (rules, regs) = tp_ranks(&pools, &ckpt, TP.head_dim, tag);
        let plans: Vec<Plan> = rules
            .iter()
            .zip(&regs)
            .map(|(r, g)| Plan::build(&ckpt, r, g, &PlanOptions::default()).unwrap())
            .collect();
        let targets = rank_targets(&pools, &rules, &regs);
        let loaded = load_multi_into_pools(
            ckpt,
            &targets,
            MultiMode::Ranks,
            &LoadOptions::default(),
            &Control::default(),
        )
        .unwrap();
        for rank in 0..world {
            assert_full_of(&TP, &pools[rank], &regs[rank], &t, rank, world);
        }
        // No byte is read twice where ranks share none: for every sharded
        // tensor the ranks' reads add up to the tensor exactly.
        let plan_bytes: u64 = plans.iter().map(Plan::src_bytes).sum();
        assert_eq!(loaded.stats.host_bytes, plan_bytes);
        for name in [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.1.mlp.down_proj.weight",
            "model.embed_tokens.weight",
        ] {
            let read: u64 = plans
                .iter()
                .flat_map(|p| {
                    p.extents
                        .iter()
                        .filter(|e| p.sources[e.source as usize] == name)
                })
                .map(|e| e.src_bytes())
                .sum();
            assert_eq!(read as usize, t[name].1.len(), "{name} in world {world}");
        }
        if world > TP.kv_heads {
            // kv heads replicated: each head read by world/kv ranks.
            let name = "model.layers.0.self_attn.k_proj.weight";
            let read: u64 = plans
                .iter()
                .flat_map(|p| {
                    p.extents
                        .iter()
                        .filter(|e| p.sources[e.source as usize] == name)
                })
                .map(|e| e.src_bytes())
                .sum();
            assert_eq!(
                read as usize,
                t[name].1.len() * world / TP.kv_heads,
                "world {world}"
            );
        }
    }
}

#[test]
fn peer_access_is_kept_across_sleep_and_wake_and_for_new_segments() {
    let pools = pools(2);
    let (p0, p1) = (&pools[0], &pools[1]);
    let tag = tag::id("multi-peer-sleep").unwrap();
    let a = p0.alloc_tagged(3 * G, tag).unwrap();
    let data: Vec<u8> = (0..3 * G).map(|i| (i * 7 % 251) as u8).collect();
    // SAFETY: a live, awake block of 3 * G bytes.
    unsafe { p0.write(a.ptr, &data) }.unwrap();
    let b = p1.alloc_tagged(3 * G, tag).unwrap();
    let pull = |src: u64, len: usize| {
        // SAFETY: b is a live block of p1 of at least len bytes; src is p0 memory.
        unsafe {
            p1.driver()
                .copy_peer_async(b.ptr, src, 0, len, StreamId::DEFAULT)
        }
    };
    let e = pull(a.ptr, 3 * G).unwrap_err();
    assert!(e.to_string().contains("grant it access"), "{e}");

    let read_only = [PeerAccess {
        device: 1,
        mode: AccessMode::Read,
    }];
    p0.set_peer_access(tag, &read_only).unwrap();
    assert_eq!(p0.peer_access(tag), read_only);
    pull(a.ptr, 3 * G).unwrap();
    assert_eq!(read(p1, b.ptr, 3 * G), data);

    for policy in [Policy::Offload, Policy::Discard] {
        p0.sleep(&[(tag, policy)]).unwrap();
        assert!(pull(a.ptr, G).is_err(), "asleep memory is not readable");
        p0.wake(&[tag]).unwrap();
        assert!(
            p0.driver().peer_readable(a.ptr, 3 * G, 1).unwrap(),
            "access is set again after the remap ({policy:?})"
        );
        pull(a.ptr, 3 * G).unwrap();
        if policy == Policy::Offload {
            assert!(read(p1, b.ptr, 3 * G) == data, "offload restored the bytes");
        }
    }

    // A segment created after the grant gets it too; another tag does not.
    let c = p0.alloc_tagged(5 * G, tag).unwrap();
    assert!(p0.driver().peer_readable(c.ptr, 5 * G, 1).unwrap());
    let other = tag::id("multi-peer-other").unwrap();
    let d = p0.alloc_tagged(G, other).unwrap();
    assert!(!p0.driver().peer_readable(d.ptr, G, 1).unwrap());

    // Revoking takes it away from every segment; bad lists change nothing.
    p0.set_peer_access(tag, &[]).unwrap();
    assert!(!p0.driver().peer_readable(a.ptr, G, 1).unwrap());
    assert!(!p0.driver().peer_readable(c.ptr, G, 1).unwrap());
    let own = [PeerAccess {
        device: 0,
        mode: AccessMode::Read,
    }];
    assert!(p0.set_peer_access(tag, &own).is_err());
    let missing = [PeerAccess {
        device: 9999,
        mode: AccessMode::Read,
    }];
    let e = p0.set_peer_access(tag, &missing).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(p0.peer_access(tag).is_empty());
}

#[test]
fn replicas_refuse_before_any_byte_when_a_peer_may_not_read() {
    let (dir, _t) = setup();
    let pools = pools(2);
    let tag = tag::id("multi-no-grant").unwrap();
    let rules = Rules::preset("llama", None, SMALL.head_dim).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let regs: Vec<Registry> = pools
        .iter()
        .map(|p| destinations(p, &ckpt, &rules, tag))
        .collect();
    let devices: Vec<DeviceLoad> = pools
        .iter()
        .zip(&regs)
        .map(|(p, registry)| DeviceLoad {
            driver: p.driver(),
            rules: &rules,
            registry,
        })
        .collect();
    let e = load_multi(
        ckpt,
        &devices,
        MultiMode::Replicas,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("peer access"), "{e}");
    for (p, r) in pools.iter().zip(&regs) {
        for d in r.iter() {
            assert!(read(p, d.ptr, d.bytes()).iter().all(|&b| b == PATTERN));
        }
    }
    // Different rules on replicas, and a device listed twice, are refused too.
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let twice = [devices[0], devices[0]];
    let e = load_multi(
        ckpt,
        &twice,
        MultiMode::Replicas,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("listed twice"), "{e}");
}

fn replica_setup(
    n: usize,
    tag_name: &str,
) -> (tempfile::TempDir, Tensors, Vec<Pool>, Vec<Registry>, Rules) {
    let (dir, t) = setup();
    let pools = pools(n);
    let tag = tag::id(tag_name).unwrap();
    let rules = Rules::preset("llama", None, SMALL.head_dim).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let regs: Vec<Registry> = pools
        .iter()
        .map(|p| destinations(p, &ckpt, &rules, tag))
        .collect();
    (dir, t, pools, regs, rules)
}

fn load_replicas(
    dir: &tempfile::TempDir,
    pools: &[Pool],
    regs: &[Registry],
    rules: &Rules,
) -> vmmweights::Result<MultiLoaded> {
    let targets: Vec<PoolLoad> = pools
        .iter()
        .zip(regs)
        .map(|(pool, registry)| PoolLoad {
            pool,
            rules,
            registry,
        })
        .collect();
    load_multi_into_pools(
        Checkpoint::open(dir.path()).unwrap(),
        &targets,
        MultiMode::Replicas,
        &LoadOptions::default(),
        &Control::default(),
    )
}

#[test]
fn a_device_whose_host_link_fails_midway_is_filled_over_its_peers() {
    let (dir, t, pools, regs, rules) = replica_setup(3, "multi-fail-link");
    // Device 1's third host copy fails: its share is left half written.
    host(&pools[1]).fail_nth(FaultOp::CopyHtod, 3);
    let loaded = load_replicas(&dir, &pools, &regs, &rules).unwrap();
    assert_eq!(loaded.stats.recovered, vec![1]);
    for (p, r) in pools.iter().zip(&regs) {
        assert_full(p, r, &t, 0, 1);
    }
    // Its host link gone for good: still filled, all over the peer links.
    for (p, r) in pools.iter().zip(&regs) {
        fill_pattern(p, r);
    }
    host(&pools[1]).fail_always(FaultOp::CopyHtod);
    let loaded = load_replicas(&dir, &pools, &regs, &rules).unwrap();
    assert_eq!(loaded.stats.recovered, vec![1]);
    assert_eq!(loaded.stats.per_device[1].bytes, 0);
    for (p, r) in pools.iter().zip(&regs) {
        assert_full(p, r, &t, 0, 1);
    }
}

#[test]
fn a_lost_device_leaves_every_other_device_fully_written() {
    let (dir, t, pools, regs, rules) = replica_setup(3, "multi-fail-lost");
    host(&pools[2]).fail_always(FaultOp::CopyHtod);
    host(&pools[2]).fail_always(FaultOp::CopyPeer);
    let e = load_replicas(&dir, &pools, &regs, &rules).unwrap_err();
    assert!(
        e.to_string().contains("device 2") && e.to_string().contains("partly written"),
        "{e}"
    );
    assert!(
        matches!(e, Error::Driver { .. }),
        "the driver's status is kept: {e:?}"
    );
    for (p, r) in pools.iter().zip(&regs).take(2) {
        assert_full(p, r, &t, 0, 1);
    }
}

#[test]
fn a_rank_whose_link_fails_once_is_redone_whole() {
    let (dir, t) = setup();
    let world = 2;
    let pools = pools(world);
    let tag = tag::id("multi-fail-rank").unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (rules, regs) = tp_ranks(&pools, &ckpt, SMALL.head_dim, tag);
    host(&pools[1]).fail_nth(FaultOp::CopyHtod, 4);
    let targets = rank_targets(&pools, &rules, &regs);
    let loaded = load_multi_into_pools(
        ckpt,
        &targets,
        MultiMode::Ranks,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
    assert_eq!(loaded.stats.recovered, vec![1]);
    for rank in 0..world {
        assert_full(&pools[rank], &regs[rank], &t, rank, world);
    }
    // A rank that keeps failing is reported; the other rank is complete.
    fill_pattern(&pools[0], &regs[0]);
    host(&pools[1]).fail_always(FaultOp::CopyHtod);
    let e = load_multi_into_pools(
        Checkpoint::open(dir.path()).unwrap(),
        &targets,
        MultiMode::Ranks,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("device 1"), "{e}");
    assert_full(&pools[0], &regs[0], &t, 0, world);
}

#[test]
fn replicas_asleep_without_backups_wake_by_one_fan_out() {
    let (dir, t, pools, regs, rules) = replica_setup(3, "multi-wake-fanout");
    load_replicas(&dir, &pools, &regs, &rules).unwrap();
    let tag = tag::id("multi-wake-fanout").unwrap();
    for p in &pools {
        p.sleep(&[(tag, Policy::Discard)]).unwrap();
        assert!(p.is_tag_asleep(tag));
    }
    let targets: Vec<PoolLoad> = pools
        .iter()
        .zip(&regs)
        .map(|(pool, registry)| PoolLoad {
            pool,
            rules: &rules,
            registry,
        })
        .collect();
    let plan = Plan::build(
        &Checkpoint::open(dir.path()).unwrap(),
        &rules,
        &regs[0],
        &PlanOptions::default(),
    )
    .unwrap();
    let woken = wake_replicas(
        Checkpoint::open(dir.path()).unwrap(),
        &targets,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
    assert_eq!(
        woken.stats.host_bytes,
        plan.src_bytes(),
        "host memory read once"
    );
    for (p, r) in pools.iter().zip(&regs) {
        assert!(!p.is_tag_asleep(tag));
        assert_full(p, r, &t, 0, 1);
    }
}

#[test]
fn a_wake_of_replicas_refused_for_its_device_list_wakes_nothing() {
    let (dir, _t, pools, regs, rules) = replica_setup(2, "multi-wake-refused");
    load_replicas(&dir, &pools, &regs, &rules).unwrap();
    let tag = tag::id("multi-wake-refused").unwrap();
    for p in &pools {
        p.sleep(&[(tag, Policy::Discard)]).unwrap();
    }
    // Device 0 listed twice, then no device at all.
    let target = PoolLoad {
        pool: &pools[0],
        rules: &rules,
        registry: &regs[0],
    };
    let targets = [target, target];
    for targets in [&targets[..], &[]] {
        let e = wake_replicas(
            Checkpoint::open(dir.path()).unwrap(),
            targets,
            &LoadOptions::default(),
            &Control::default(),
        )
        .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        for p in &pools {
            assert!(p.is_tag_asleep(tag), "refused ({e}), yet the tag woke");
        }
    }
}
