//! Tensor-parallel slicing and fusing, on every backend (`common::backend`:
//! the host twin in CI, the CUDA driver with `VMMW_BACKEND=cuda`, see
//! scripts/gpu.d/35-tp.sh): for the llama, qwen2 and qwen3 presets, worlds
//! 1, 2, 4 and 8 and every copy strategy, every rank's destinations hold
//! exactly the slices of the full tensors, computed here independently
//! (column-parallel rows, row-parallel columns, kv heads cut or replicated
//! when the world exceeds them, q/k/v and gate/up fused), through the Rust
//! API and through the C API.

use crate::common;

use std::ffi::{c_char, CStr, CString};
use std::path::Path;
use std::ptr;

use common::backend::{on_each_backend, Backend};
use common::loader::*;
use vmmweights::ffi::destinations::*;
use vmmweights::ffi::device::{VMMW_BACKEND_CUDA, VMMW_BACKEND_HOST};
use vmmweights::ffi::error::{vmmw_error_free, vmmw_error_message, vmmw_error_t};
use vmmweights::ffi::loader::*;
use vmmweights::ffi::pool::{
    vmmw_pool_free, vmmw_pool_new, vmmw_pool_options_t, vmmw_pool_read, vmmw_pool_t,
    vmmw_pool_write,
};
use vmmweights::loader::*;
use vmmweights::BackendKind;

/// The element size of every generated checkpoint (bf16).
const E: usize = 2;

/// Every copy strategy of the engine.
const STRATEGIES: [Strategy; 9] = [
    Strategy::Auto,
    Strategy::Direct,
    Strategy::Staged,
    Strategy::Read,
    Strategy::Simple,
    Strategy::Populate,
    Strategy::Hybrid,
    Strategy::Stream,
    Strategy::Registered,
];

/// The strategies the C API names (`VMMW_COPY_*`).
const C_STRATEGIES: [(vmmw_copy_strategy_t, &str); 5] = [
    (VMMW_COPY_AUTO, "auto"),
    (VMMW_COPY_DIRECT, "direct"),
    (VMMW_COPY_STAGED, "staged"),
    (VMMW_COPY_READ, "read"),
    (VMMW_COPY_SIMPLE, "simple"),
];

const WORLDS: [usize; 4] = [1, 2, 4, 8];

/// One generated model per preset, each shaped like its family: Llama
/// (8 heads, 4 kv heads: cut up to world 4, replicated at 8), Qwen2 (q/k/v
/// biases, tied embeddings, 2 kv heads: replicated from world 4) and Qwen3
/// (q/k norms, 16 heads, 8 kv heads: cut at every world).
pub struct Model {
    pub preset: &'static str,
    pub shape: Shape,
    pub qkv_bias: bool,
}

pub fn models() -> [Model; 3] {
    [
        Model {
            preset: "llama",
            shape: Shape {
                layers: 2,
                hidden: 64,
                inter: 96,
                vocab: 128,
                heads: 8,
                kv_heads: 4,
                head_dim: 8,
                tied: false,
                qk_norm: false,
            },
            qkv_bias: false,
        },
        Model {
            preset: "qwen2",
            shape: Shape {
                layers: 2,
                hidden: 64,
                inter: 160,
                vocab: 136,
                heads: 8,
                kv_heads: 2,
                head_dim: 8,
                tied: true,
                qk_norm: false,
            },
            qkv_bias: true,
        },
        Model {
            preset: "qwen3",
            shape: Shape {
                layers: 2,
                hidden: 64,
                inter: 96,
                vocab: 128,
                heads: 16,
                kv_heads: 8,
                head_dim: 8,
                tied: false,
                qk_norm: true,
            },
            qkv_bias: false,
        },
    ]
}

/// The model's tensors (bf16), with q/k/v biases where the family has them.
pub fn tensors(m: &Model) -> Tensors {
    let mut t = generate(&m.shape, Dtype::Bf16);
    if m.qkv_bias {
        let s = &m.shape;
        for l in 0..s.layers {
            for (k, (p, heads)) in [("q", s.heads), ("k", s.kv_heads), ("v", s.kv_heads)]
                .into_iter()
                .enumerate()
            {
                let n = heads * s.head_dim;
                let seed = 1000 + (l * 3 + k) as u64;
                t.insert(
                    format!("model.layers.{l}.self_attn.{p}_proj.bias"),
                    (vec![n], values(seed, n, Dtype::Bf16)),
                );
            }
        }
    }
    t
}

/// The model written as three shards (fused parts come from different files).
fn checkpoint(m: &Model) -> (tempfile::TempDir, Tensors) {
    let t = tensors(m);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 3);
    (dir, t)
}

/// What rank `rank` of `world` must hold in destination `name`, sliced here
/// from the full tensors.
pub fn expected(t: &Tensors, s: &Shape, name: &str, rank: usize, world: usize) -> Vec<u8> {
    let e = E;
    // A tied lm_head is fed from the embeddings.
    let get = |n: &str| match t.get(n) {
        Some(x) => x,
        None if n == "lm_head.weight" => &t["model.embed_tokens.weight"],
        None => panic!("no tensor {n} in the checkpoint"),
    };
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
    for kind in ["weight", "bias"] {
        if let Some(l) = name.strip_suffix(&format!(".self_attn.qkv_proj.{kind}")) {
            let mut v = split0(&format!("{l}.self_attn.q_proj.{kind}"));
            v.extend(kv(&format!("{l}.self_attn.k_proj.{kind}")));
            v.extend(kv(&format!("{l}.self_attn.v_proj.{kind}")));
            return v;
        }
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

/// Small windows and slots, so every strategy runs several of each.
fn copy_options(strategy: Strategy) -> CopyOptions {
    CopyOptions {
        strategy,
        threads: 2,
        window_bytes: 8192,
        slot_bytes: 4096,
        ..Default::default()
    }
}

/// Every (model, world, rank) through the Rust API, every strategy, on `b`.
fn rust_api_case(b: &Backend, m: &Model, dir: &Path, t: &Tensors) -> usize {
    let d = &b.driver;
    let s = &m.shape;
    let mut checked = 0;
    for world in WORLDS {
        for rank in 0..world {
            let rules = Rules::preset(m.preset, Some(Tp { rank, world }), s.head_dim).unwrap();
            let ckpt = Checkpoint::open(dir).unwrap();
            let specs = Plan::destinations(&ckpt, &rules).unwrap();
            // Fused destinations exist and unfused q/k/v/gate/up do not.
            assert!(specs
                .iter()
                .any(|x| x.name == "model.layers.1.self_attn.qkv_proj.weight"));
            assert!(specs
                .iter()
                .any(|x| x.name == "model.layers.1.mlp.gate_up_proj.weight"));
            assert!(!specs
                .iter()
                .any(|x| x.name.contains("k_proj") || x.name.contains("gate_proj.")));
            let alloc = SegmentAllocator::new(d.clone(), 4 << 20);
            let mut reg = Registry::new();
            reg.allocate(&specs, &alloc).unwrap();
            for strategy in STRATEGIES {
                let what = format!(
                    "{} {}: rank {rank} of {world}, {strategy:?}",
                    b.kind(),
                    m.preset
                );
                // Refilled before each strategy: each load must write every byte itself.
                fill_pattern(d.as_ref(), &reg);
                let opts = LoadOptions {
                    copy: copy_options(strategy),
                    ..Default::default()
                };
                let ckpt = Checkpoint::open(dir).unwrap();
                load(d, ckpt, &rules, &reg, &opts, &Control::default()).expect(&what);
                for x in reg.iter() {
                    let want = expected(t, s, &x.name, rank, world);
                    assert_eq!(want.len(), x.bytes(), "{what}: {} size", x.name);
                    assert!(
                        read(d.as_ref(), x.ptr, x.bytes()) == want,
                        "{what}: {} differs from the slice of the full tensors",
                        x.name
                    );
                    checked += 1;
                }
            }
        }
    }
    checked
}

#[test]
fn every_preset_world_and_strategy_gives_exact_slices_through_the_rust_api() {
    let mut checked = 0;
    let cases: Vec<_> = models()
        .into_iter()
        .map(|m| {
            let (dir, t) = checkpoint(&m);
            (m, dir, t)
        })
        .collect();
    on_each_backend(
        "every_preset_world_and_strategy_gives_exact_slices_through_the_rust_api",
        |b| {
            for (m, dir, t) in &cases {
                checked += rust_api_case(b, m, dir.path(), t);
            }
        },
    );
    // 3 presets, 15 ranks, 9 strategies, at least the 2 layers' fused tensors each.
    assert!(checked > 3 * 15 * 9 * 4, "{checked} destinations checked");
}

// ---------------------------------------------------------------- C API

/// A failed C call: its status and message.
fn c_check(what: &str, rc: i32, err: *mut vmmw_error_t) {
    if rc == 0 {
        return;
    }
    let msg = if err.is_null() {
        String::new()
    } else {
        // SAFETY: a live error from the call; freed once, here.
        unsafe {
            let m = CStr::from_ptr(vmmw_error_message(err))
                .to_string_lossy()
                .into_owned();
            vmmw_error_free(err);
            m
        }
    };
    panic!("{what}: status {rc}: {msg}");
}

/// Run one C call with an error out-parameter and panic with its message on failure.
macro_rules! c {
    ($what:expr, |$err:ident| $call:expr) => {{
        let mut $err: *mut vmmw_error_t = ptr::null_mut();
        // SAFETY: every pointer passed is valid for the call (see each call site).
        let rc = unsafe { $call };
        c_check(&$what, rc, $err);
    }};
}

/// Every destination the loader holds: (name, address, bytes).
fn c_destinations(loader: *mut vmmw_loader_t) -> Vec<(String, u64, usize)> {
    let mut n = 0usize;
    c!("destination_count", |err| vmmw_loader_destination_count(
        loader, &mut n, &mut err
    ));
    (0..n)
        .map(|i| {
            let mut buf = [0 as c_char; 256];
            c!("destination_name", |err| vmmw_loader_destination_name(
                loader,
                i,
                buf.as_mut_ptr(),
                buf.len(),
                ptr::null_mut(),
                &mut err
            ));
            // SAFETY: the call NUL-terminated the name inside `buf`.
            let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
            let mut dst = std::mem::MaybeUninit::<vmmw_destination_t>::uninit();
            c!("destination", |err| vmmw_loader_destination(
                loader,
                name.as_ptr(),
                dst.as_mut_ptr(),
                &mut err
            ));
            // SAFETY: written by the successful call above.
            let dst = unsafe { dst.assume_init() };
            (
                name.to_string_lossy().into_owned(),
                dst.ptr,
                dst.bytes as usize,
            )
        })
        .collect()
}

/// Every (model, world, rank) through the C API, every `VMMW_COPY_*`
/// strategy, into a pool of `b`'s backend.
fn c_api_case(b: &Backend, m: &Model, dir: &Path, t: &Tensors) -> usize {
    let s = &m.shape;
    let options = vmmw_pool_options_t {
        size: std::mem::size_of::<vmmw_pool_options_t>(),
        device_handle: ptr::null(),
        backend: match b.kind() {
            BackendKind::Host => VMMW_BACKEND_HOST,
            BackendKind::Cuda => VMMW_BACKEND_CUDA,
        },
        device: 0,
        align: 0,
        small_request_max: 0,
        small_segment_bytes: 0,
        large_segment_bytes: 0,
        chunk_bytes: 0,
    };
    let mut pool: *mut vmmw_pool_t = ptr::null_mut();
    c!("pool_new", |err| vmmw_pool_new(
        &options, &mut pool, &mut err
    ));
    let path = CString::new(dir.to_str().unwrap()).unwrap();
    let family = CString::new(m.preset).unwrap();
    let tag = vmmweights::tag::id("test-loader-tp-c").unwrap();
    let mut checked = 0;
    for world in WORLDS {
        for rank in 0..world {
            let mut loader: *mut vmmw_loader_t = ptr::null_mut();
            c!("loader_open", |err| vmmw_loader_open(
                path.as_ptr(),
                &mut loader,
                &mut err
            ));
            c!("set_rules_preset", |err| vmmw_loader_set_rules_preset(
                loader,
                family.as_ptr(),
                rank as u32,
                world as u32,
                s.head_dim as u32,
                &mut err
            ));
            c!("loader_allocate", |err| vmmw_loader_allocate(
                loader, pool, tag.0, &mut err
            ));
            let dests = c_destinations(loader);
            for (strategy, sname) in C_STRATEGIES {
                let what = format!(
                    "C API, {} {}: rank {rank} of {world}, {sname}",
                    b.kind(),
                    m.preset
                );
                for (_, p, n) in &dests {
                    let pat = vec![PATTERN; *n];
                    c!(what, |err| vmmw_pool_write(
                        pool,
                        *p,
                        pat.as_ptr().cast(),
                        *n,
                        &mut err
                    ));
                }
                let opts = vmmw_load_options_t {
                    size: std::mem::size_of::<vmmw_load_options_t>(),
                    allow_missing: 0,
                    allow_unexpected: 0,
                    strategy,
                    threads: 2,
                    window_bytes: 8192,
                    slot_bytes: 4096,
                };
                c!(what, |err| vmmw_loader_set_options(loader, &opts, &mut err));
                c!(what, |err| vmmw_loader_load(
                    loader,
                    pool,
                    None,
                    ptr::null_mut(),
                    &mut err
                ));
                for (name, p, n) in &dests {
                    let want = expected(t, s, name, rank, world);
                    assert_eq!(want.len(), *n, "{what}: {name} size");
                    let mut got = vec![0u8; *n];
                    c!(what, |err| vmmw_pool_read(
                        pool,
                        *p,
                        got.as_mut_ptr().cast(),
                        *n,
                        &mut err
                    ));
                    assert!(
                        got == want,
                        "{what}: {name} differs from the slice of the full tensors"
                    );
                    checked += 1;
                }
            }
            // SAFETY: a live loader, freed once; its blocks stay the pool's.
            unsafe { vmmw_loader_free(loader) };
        }
    }
    // SAFETY: a live pool, freed once, with every loader using it gone.
    unsafe { vmmw_pool_free(pool) };
    checked
}

#[test]
fn every_preset_world_and_c_strategy_gives_exact_slices_through_the_c_api() {
    let mut checked = 0;
    let cases: Vec<_> = models()
        .into_iter()
        .map(|m| {
            let (dir, t) = checkpoint(&m);
            (m, dir, t)
        })
        .collect();
    on_each_backend(
        "every_preset_world_and_c_strategy_gives_exact_slices_through_the_c_api",
        |b| {
            for (m, dir, t) in &cases {
                checked += c_api_case(b, m, dir.path(), t);
            }
        },
    );
    assert!(checked > 3 * 15 * 5 * 4, "{checked} destinations checked");
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
