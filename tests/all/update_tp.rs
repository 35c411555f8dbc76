//! Tensor-parallel updates on every backend: for the llama, qwen2 and qwen3
//! models of `loader_tp` (kv heads cut, or replicated when the world
//! exceeds them; q/k/v biases; tied embeddings), worlds 2, 4 and 8, every
//! rank loads the checkpoint with its slice of the preset, then takes an
//! update from the trainer's full tensors and keeps only its slices. What
//! each destination must hold is sliced here from the full new tensors
//! (`loader_tp::expected`), not computed by the library. Even ranks update
//! from whole device tensors (direct), odd ranks from buckets cut at odd
//! byte offsets (staged).

use crate::common;
use crate::loader_tp::{expected, models, tensors, Model};
use crate::update::{on_device, Buckets};

use std::sync::Arc;

use common::backend::{on_each_backend, Backend};
use common::loader::*;
use vmmweights::loader::{Dtype, Session, Tp};
use vmmweights::update::{self, UpdateOptions};
use vmmweights::{tag, Pool, PoolConfig};

const WORLDS: [usize; 3] = [2, 4, 8];

/// The trainer's values: the same tensors as the checkpoint, other bytes.
fn new_values(m: &Model) -> Tensors {
    tensors(m)
        .into_iter()
        .enumerate()
        .map(|(i, (n, (sh, b)))| {
            let numel = b.len() / 2;
            (n, (sh, values(7000 + i as u64, numel, Dtype::Bf16)))
        })
        .collect()
}

fn case(b: &Backend, m: &Model) -> usize {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &tensors(m), Dtype::Bf16, 3);
    let new = new_values(m);
    let (_seg, mut whole) = on_device(&b.driver, &new);
    let s = &m.shape;
    let mut checked = 0;
    for world in WORLDS {
        for rank in 0..world {
            let what = format!("{} {}: rank {rank} of {world}", b.kind(), m.preset);
            let pool = Arc::new(Pool::new(b.driver.clone(), PoolConfig::default()).unwrap());
            let t = tag::id(&format!(
                "update-tp-{}-{}-{world}-{rank}",
                b.kind(),
                m.preset
            ))
            .unwrap();
            let session = Session::open(dir.path()).unwrap();
            session
                .set_preset(m.preset, Some(Tp { rank, world }), s.head_dim)
                .unwrap();
            session.allocate(&pool, t).unwrap();
            session.load(&pool, None).unwrap();
            let v0 = pool.tag_version(t).unwrap();
            let opts = UpdateOptions::from_version(v0);
            let r = if rank % 2 == 0 {
                update::update(&session, &pool, &mut whole, &opts)
            } else {
                update::update(&session, &pool, &mut Buckets::new(&new, 1021), &opts)
            }
            .expect(&what);
            assert_eq!(r.staged, rank % 2 == 1, "{what}");
            assert_eq!(r.version, v0 + 1, "{what}");
            for x in session.destinations() {
                let want = expected(&new, s, &x.name, rank, world);
                assert_eq!(want.len(), x.bytes(), "{what}: {} size", x.name);
                assert!(
                    read(b.driver.as_ref(), x.ptr, x.bytes()) == want,
                    "{what}: {} differs from the slice of the new tensors",
                    x.name
                );
                checked += 1;
            }
        }
    }
    checked
}

#[test]
fn every_rank_of_worlds_2_4_8_keeps_exactly_its_slices_of_the_update() {
    let mut checked = 0;
    on_each_backend("update_tp_every_rank", |b| {
        for m in &models() {
            checked += case(b, m);
        }
    });
    // 3 models, 14 ranks, at least the 2 layers' fused tensors each.
    assert!(checked > 3 * 14 * 4, "{checked} destinations checked");
}
