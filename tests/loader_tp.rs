//! Tensor-parallel slicing and fusing: for world sizes 1, 2 and 4 every
//! rank's destinations hold exactly the slices of the full tensors, computed
//! here independently (column-parallel rows, row-parallel columns, kv heads
//! replicated when the world exceeds them, q/k/v and gate/up fused).

mod common;

use common::loader::*;
use vmmweights::loader::*;

fn expected(t: &Tensors, s: &Shape, name: &str, rank: usize, world: usize) -> Vec<u8> {
    let e = 2; // bf16
    let get = |n: &str| &t[n];
    let rows = |n: &str, a: usize, k: usize| {
        let (sh, b) = get(n);
        slice(sh, b, e, 0, a, k)
    };
    let cols = |n: &str| {
        let (sh, b) = get(n);
        let per = sh[1] / world;
        slice(sh, b, e, 1, rank * per, per)
    };
    let split0 = |n: &str| {
        let (sh, _) = get(n);
        let per = sh[0] / world;
        rows(n, rank * per, per)
    };
    let kv = |n: &str| {
        if world <= s.kv_heads {
            split0(n)
        } else {
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
        return cols(name);
    }
    if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
        return split0(name);
    }
    get(name).1.clone()
}

#[test]
fn world_1_2_4_give_exact_slices_of_the_full_tensors() {
    let s = SMALL;
    let t = generate(&s, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 3);
    let d = host();
    let mut checked = 0;
    for world in [1, 2, 4] {
        for rank in 0..world {
            let rules = Rules::preset("llama", Some(Tp { rank, world }), s.head_dim).unwrap();
            let ckpt = Checkpoint::open(dir.path()).unwrap();
            let specs = Plan::destinations(&ckpt, &rules).unwrap();
            // Fused destinations exist and unfused q/k/v/gate/up do not.
            assert!(specs
                .iter()
                .any(|x| x.name == "model.layers.1.self_attn.qkv_proj.weight"));
            assert!(!specs.iter().any(|x| x.name.contains("k_proj")));
            let alloc = SegmentAllocator::new(d.clone(), 4 << 20);
            let mut reg = Registry::new();
            reg.allocate(&specs, &alloc).unwrap();
            fill_pattern(d.as_ref(), &reg);
            for strategy in [
                Strategy::Direct,
                Strategy::Staged,
                Strategy::Read,
                Strategy::Hybrid,
            ] {
                let opts = LoadOptions {
                    copy: CopyOptions {
                        strategy,
                        threads: 2,
                        window_bytes: 8192,
                        slot_bytes: 4096,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let ckpt = Checkpoint::open(dir.path()).unwrap();
                load(&d, ckpt, &rules, &reg, &opts, &Control::default()).unwrap();
                for x in reg.iter() {
                    let want = expected(&t, &s, &x.name, rank, world);
                    assert_eq!(want.len(), x.bytes(), "{} size, world {world}", x.name);
                    assert_eq!(
                        read(d.as_ref(), x.ptr, x.bytes()),
                        want,
                        "{} rank {rank} of {world} ({strategy:?})",
                        x.name
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 100);
}

#[test]
fn kv_heads_replicate_when_world_exceeds_them() {
    let s = SMALL; // 2 kv heads
    let t = generate(&s, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_file(&dir.path().join("model.safetensors"), &t, Dtype::Bf16);
    let d = host();
    let mut k_parts = Vec::new();
    for rank in 0..4 {
        let rules = Rules::preset("qwen3", Some(Tp { rank, world: 4 }), s.head_dim).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 4 << 20);
        load(
            &d,
            ckpt,
            &rules,
            &reg,
            &LoadOptions::default(),
            &Control::default(),
        )
        .unwrap();
        let qkv = reg.get("model.layers.0.self_attn.qkv_proj.weight").unwrap();
        // 1 q head + 1 k head + 1 v head per rank.
        assert_eq!(qkv.shape, vec![3 * s.head_dim, s.hidden]);
        let all = read(d.as_ref(), qkv.ptr, qkv.bytes());
        let row = s.hidden * 2;
        k_parts.push(all[s.head_dim * row..2 * s.head_dim * row].to_vec());
    }
    assert_eq!(k_parts[0], k_parts[1], "ranks 0 and 1 share kv head 0");
    assert_eq!(k_parts[2], k_parts[3], "ranks 2 and 3 share kv head 1");
    assert_ne!(k_parts[0], k_parts[2]);
}

#[test]
fn pad_zero_fills_and_tie_feeds_lm_head_from_embeddings() {
    let s = Shape {
        tied: true,
        ..SMALL
    };
    let t = generate(&s, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_file(&dir.path().join("model.safetensors"), &t, Dtype::Bf16);
    let mut rules = Rules::preset("llama", None, s.head_dim).unwrap();
    for r in &mut rules.rules {
        if r.pattern.contains("embed_tokens") || r.pattern.contains("lm_head") {
            r.pad = Some(Pad {
                dim: 0,
                to: None,
                multiple_of: Some(64),
            });
        }
    }
    let d = host();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 4 << 20);
    fill_pattern(d.as_ref(), &reg);
    load(
        &d,
        ckpt,
        &rules,
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
    let emb = &t["model.embed_tokens.weight"].1;
    for name in ["lm_head.weight", "model.embed_tokens.weight"] {
        let x = reg.get(name).unwrap();
        assert_eq!(
            x.shape,
            vec![128, s.hidden],
            "{name}: 120 rows padded to 128"
        );
        let got = read(d.as_ref(), x.ptr, x.bytes());
        assert_eq!(&got[..emb.len()], &emb[..], "{name}");
        assert!(
            got[emb.len()..].iter().all(|&b| b == 0),
            "{name}: pad rows are zero"
        );
    }
}

#[test]
fn every_destination_byte_is_written_exactly_once() {
    let s = Shape {
        tied: true,
        ..SMALL
    };
    let t = generate(&s, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    let d = host();
    for (rank, world) in [(0, 1), (1, 2), (3, 4)] {
        let mut rules = Rules::preset("qwen3", Some(Tp { rank, world }), s.head_dim).unwrap();
        rules.dtype = Some(Dtype::F32); // conversions change row widths; coverage must still be exact
        for r in &mut rules.rules {
            if r.pattern.contains("lm_head") {
                r.pad = Some(Pad {
                    dim: 0,
                    to: None,
                    multiple_of: Some(64),
                });
            }
        }
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 4 << 20);
        let plan = Plan::build(&ckpt, &rules, &reg, &PlanOptions::default()).unwrap();
        let mut iv: Vec<(u64, u64)> = Vec::new();
        for e in &plan.extents {
            for r in 0..e.height {
                let a = e.dst + r * e.dst_pitch;
                iv.push((a, a + e.dst_width()));
            }
        }
        iv.extend(plan.fills.iter().map(|f| (f.dst, f.dst + f.len)));
        iv.sort_unstable();
        for w in iv.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlap {w:?} (world {world})");
        }
        let written: u64 = iv.iter().map(|(a, b)| b - a).sum();
        let dest: u64 = reg.iter().map(|x| x.bytes() as u64).sum();
        assert_eq!(written, dest, "world {world}");
        assert!(
            plan.fills.iter().map(|f| f.len).sum::<u64>() > 0,
            "lm_head pad is zero-filled"
        );
        assert_eq!(plan.dst_bytes(), dest);
    }
}
