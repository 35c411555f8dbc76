//! Dtype conversion during the load (bf16 <-> f32 <-> f16), including sliced
//! (row-parallel, strided) tensors and rows split across staging slots.

use crate::common;

use common::loader::*;
use half::{bf16, f16};
use vmmweights::loader::*;

fn to_f32(b: &[u8], dt: Dtype) -> Vec<f32> {
    match dt {
        Dtype::F32 => b
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Dtype::Bf16 => b
            .chunks(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => b
            .chunks(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => unreachable!(),
    }
}

fn from_f32(v: &[f32], dt: Dtype) -> Vec<u8> {
    let mut out = Vec::new();
    for &x in v {
        match dt {
            Dtype::F32 => out.extend(x.to_le_bytes()),
            Dtype::Bf16 => out.extend(bf16::from_f32(x).to_le_bytes()),
            Dtype::F16 => out.extend(f16::from_f32(x).to_le_bytes()),
            _ => unreachable!(),
        }
    }
    out
}

#[test]
fn every_conversion_pair_matches_the_cpu_reference() {
    let s = SMALL;
    let d = host();
    for src in [Dtype::Bf16, Dtype::F16, Dtype::F32] {
        let t = generate(&s, src);
        let dir = tempfile::tempdir().unwrap();
        write_sharded(dir.path(), &t, src, 2);
        for dst in [Dtype::Bf16, Dtype::F16, Dtype::F32] {
            for world in [1, 2] {
                let mut rules = Rules::preset(
                    "llama",
                    Some(Tp {
                        rank: world - 1,
                        world,
                    }),
                    s.head_dim,
                )
                .unwrap();
                rules.dtype = Some(dst);
                let ckpt = Checkpoint::open(dir.path()).unwrap();
                let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 4 << 20);
                fill_pattern(d.as_ref(), &reg);
                let opts = LoadOptions {
                    copy: CopyOptions {
                        threads: 2,
                        slot_bytes: 4096,
                        window_bytes: 8192,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                load(&d, ckpt, &rules, &reg, &opts, &Control::default()).unwrap();
                // o_proj of the last rank: row-parallel (strided) and converted.
                let name = "model.layers.1.self_attn.o_proj.weight";
                let (sh, b) = &t[name];
                let per = sh[1] / world;
                let want = slice(sh, b, src.size(), 1, (world - 1) * per, per);
                let want = from_f32(&to_f32(&want, src), dst);
                let x = reg.get(name).unwrap();
                assert_eq!(
                    read(d.as_ref(), x.ptr, x.bytes()),
                    want,
                    "{src} -> {dst}, world {world}"
                );
                // A whole replicated tensor and a big one split across slots.
                for name in ["model.norm.weight", "model.layers.0.input_layernorm.weight"] {
                    let want = from_f32(&to_f32(&t[name].1, src), dst);
                    let x = reg.get(name).unwrap();
                    assert_eq!(
                        read(d.as_ref(), x.ptr, x.bytes()),
                        want,
                        "{name} {src} -> {dst}"
                    );
                }
                let (sh, b) = &t["lm_head.weight"];
                let per = sh[0] / world;
                let want = slice(sh, b, src.size(), 0, (world - 1) * per, per);
                let want = from_f32(&to_f32(&want, src), dst);
                let x = reg.get("lm_head.weight").unwrap();
                assert_eq!(
                    read(d.as_ref(), x.ptr, x.bytes()),
                    want,
                    "lm_head {src} -> {dst}"
                );
            }
        }
    }
}

#[test]
fn non_float_dtypes_do_not_convert() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tensors::new();
    t.insert("mask".into(), (vec![16], values(3, 16, Dtype::U8)));
    write_file(&dir.path().join("model.safetensors"), &t, Dtype::U8);
    let d = host();
    let alloc = SegmentAllocator::new(d.clone(), 2 << 20);
    let mut reg = Registry::new();
    reg.allocate(
        &[DestSpec {
            name: "mask".into(),
            dtype: Dtype::F32,
            shape: vec![16],
        }],
        &alloc,
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let e = load(
        &d,
        ckpt,
        &Rules::default(),
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("`mask`") && m.contains("U8") && m.contains("F32"),
        "{m}"
    );
}

/// A checkpoint where some tensors convert and some do not loads exactly with
/// every strategy: the direct-window strategies (and Reload's `registered`
/// replay) send the unconverted tensors through windows and must still stage
/// the conversions afterwards.
#[test]
fn mixed_dtypes_load_with_every_strategy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let a = from_f32(
        &(0..4096).map(|i| i as f32 / 7.0).collect::<Vec<_>>(),
        Dtype::F32,
    );
    let b = from_f32(
        &(0..6000).map(|i| -(i as f32) / 3.0).collect::<Vec<_>>(),
        Dtype::Bf16,
    );
    let views = vec![
        (
            "a.weight".to_string(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![64, 64], &a)
                .unwrap(),
        ),
        (
            "b.weight".to_string(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![6000], &b).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let want_a = from_f32(&to_f32(&a, Dtype::F32), Dtype::Bf16);
    let d = host();
    let rules = Rules {
        dtype: Some(Dtype::Bf16),
        ..Default::default()
    };
    let ckpt = Checkpoint::open(&path).unwrap();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 4 << 20);
    for strategy in [
        Strategy::Auto,
        Strategy::Direct,
        Strategy::Staged,
        Strategy::Read,
        Strategy::Simple,
        Strategy::Populate,
        Strategy::Hybrid,
        Strategy::Stream,
        Strategy::Registered,
    ] {
        fill_pattern(d.as_ref(), &reg);
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
        let ckpt = Checkpoint::open(&path).unwrap();
        let ex = load(&d, ckpt, &rules, &reg, &opts, &Control::default())
            .unwrap_or_else(|e| panic!("{strategy:?}: {e}"));
        assert_eq!(ex.stats.bytes, (a.len() + b.len()) as u64, "{strategy:?}");
        let x = reg.get("a.weight").unwrap();
        assert_eq!(
            read(d.as_ref(), x.ptr, x.bytes()),
            want_a,
            "{strategy:?}: a"
        );
        let x = reg.get("b.weight").unwrap();
        assert_eq!(read(d.as_ref(), x.ptr, x.bytes()), b, "{strategy:?}: b");
    }
}
