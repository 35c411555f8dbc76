//! Packed checkpoints (docs/PACKED.md), on every backend (`common::backend`:
//! the host twin in CI, the CUDA driver with `VMMW_BACKEND=cuda`, see
//! scripts/gpu.d/26-packed.sh): pack -> unpack gives every file back bit
//! for bit (every safetensors dtype, header order, metadata and padding, a
//! folder with its index, GGUF types and alignment padding), with the CPU
//! encoder and with a driver's; a packed checkpoint loads the same bytes as
//! its original through rules, tensor-parallel slices (frames cut across
//! rows and columns), conversions and every copy strategy; a Reload wake
//! decodes from the packed file. What must fail loudly (corrupt frames,
//! hostile headers) is in `packed_integrity.rs`.

use crate::common;
use crate::loader_tp::{expected, models, tensors as tp_tensors};

use std::path::Path;
use std::sync::Arc;

use common::backend::{on_each_backend, Backend};
use common::gguf as g;
use common::loader::*;
use vmmweights::loader::pack::{pack, unpack, PackOptions};
use vmmweights::loader::*;
use vmmweights::sleep::Policy;
use vmmweights::{tag, Driver, Pool, PoolConfig};

pub(crate) const FRAME: u64 = 64 << 10;

pub(crate) fn opts(driver: Option<Arc<dyn Driver>>) -> PackOptions {
    PackOptions {
        frame_bytes: FRAME,
        threads: 2,
        driver,
        force: false,
    }
}

/// The CPU encoder and `d`'s codec.
fn encoders(d: &Arc<dyn Driver>) -> [(&'static str, PackOptions); 2] {
    [("cpu", opts(None)), ("driver", opts(Some(d.clone())))]
}

/// Bytes shaped like trained bf16 weights: small values around zero.
fn bf16_weights(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(2 * n);
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let u = ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
        let v = u * u * u * 0.2;
        out.extend(half::bf16::from_f32(v).to_bits().to_le_bytes());
    }
    out
}

fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// A safetensors file written by hand: the header lists `entries` in the
/// order given while the data is laid out in reverse, with `__metadata__`
/// and `pad` spaces after the JSON (as writers pad to 8 bytes).
pub(crate) fn write_raw_safetensors(
    path: &Path,
    entries: &[(&str, &str, Vec<u64>, Vec<u8>)],
    pad: usize,
) {
    let mut offsets = Vec::new();
    let mut at = 0u64;
    for e in entries.iter().rev() {
        offsets.push((at, at + e.3.len() as u64));
        at += e.3.len() as u64;
    }
    offsets.reverse();
    let mut h = String::from("{\"__metadata__\":{\"format\":\"pt\",\"note\":\"packed test\"}");
    for (e, (a, b)) in entries.iter().zip(&offsets) {
        h += &format!(
            ",\"{}\":{{\"dtype\":\"{}\",\"shape\":{:?},\"data_offsets\":[{a},{b}]}}",
            e.0, e.1, e.2
        );
    }
    h += "}";
    h += &" ".repeat(pad);
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h.as_bytes());
    for e in entries.iter().rev() {
        out.extend(&e.3);
    }
    std::fs::write(path, out).unwrap();
}

/// Every safetensors dtype, sizes from empty to several frames.
pub(crate) fn every_dtype() -> Vec<(&'static str, &'static str, Vec<u64>, Vec<u8>)> {
    let mut v = Vec::new();
    let dtypes = [
        ("BOOL", 1),
        ("U8", 1),
        ("I8", 1),
        ("F8_E4M3", 1),
        ("F8_E5M2", 1),
        ("I16", 2),
        ("U16", 2),
        ("F16", 2),
        ("BF16", 2),
        ("I32", 4),
        ("U32", 4),
        ("F32", 4),
        ("I64", 8),
        ("U64", 8),
        ("F64", 8),
    ];
    for (i, (name, size)) in dtypes.into_iter().enumerate() {
        // Odd element counts; the bf16 tensor spans several frames.
        let n = if name == "BF16" {
            3 * 40_000 + 7
        } else {
            1000 + 37 * i
        };
        let bytes = if name == "BF16" {
            bf16_weights(i as u64, n)
        } else if name == "BOOL" {
            noise(i as u64, n).into_iter().map(|b| b & 1).collect()
        } else {
            noise(i as u64, n * size)
        };
        v.push((
            Box::leak(format!("t.{}", name.to_lowercase()).into_boxed_str()) as &str,
            name,
            vec![n as u64],
            bytes,
        ));
    }
    v.push(("t.empty", "F32", vec![0, 4], Vec::new()));
    v
}

pub(crate) fn same_files(a: &Path, b: &Path) {
    assert_eq!(
        std::fs::read(a).unwrap(),
        std::fs::read(b).unwrap(),
        "{} and {} differ",
        a.display(),
        b.display()
    );
}

/// Load `a` (the original) and `b` (its packed copy) with `rules` into
/// destinations of their own (`b`'s first filled with `PATTERN` when
/// `fill_b`, so a byte the packed load skips shows); every destination of
/// `b` must equal `a`'s, name and bytes.
fn loads_alike(
    d: &Arc<dyn Driver>,
    a: Checkpoint,
    b: Checkpoint,
    rules: &Rules,
    pool_bytes: usize,
    fill_b: bool,
    what: &str,
) {
    let (_x, ra) = allocate_for(d, &a, rules, pool_bytes);
    let (_y, rb) = allocate_for(d, &b, rules, pool_bytes);
    if fill_b {
        fill_pattern(d.as_ref(), &rb);
    }
    for (ckpt, reg) in [(a, &ra), (b, &rb)] {
        load(
            d,
            ckpt,
            rules,
            reg,
            &LoadOptions::default(),
            &Control::default(),
        )
        .unwrap();
    }
    for (x, y) in ra.iter().zip(rb.iter()) {
        assert_eq!(x.name, y.name, "{what}");
        assert_eq!(
            read(d.as_ref(), x.ptr, x.bytes()),
            read(d.as_ref(), y.ptr, y.bytes()),
            "{what}: {}",
            x.name
        );
    }
}

#[test]
fn every_dtype_header_order_metadata_and_padding_round_trip_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("all.safetensors");
    write_raw_safetensors(&src, &every_dtype(), 5);
    let d = host();
    for (enc, o) in encoders(&d) {
        let p = dir.path().join(format!("all-{enc}.packed"));
        let r = pack(&src, &p, &o, None, None).unwrap();
        assert!(r.packed_bytes < r.original_bytes, "{enc}: {r:?}");
        let back = dir.path().join(format!("all-{enc}.safetensors"));
        unpack(&p, &back, 2, false, None, None).unwrap();
        same_files(&src, &back);
        // The packed file opens as the original: names, dtypes, shapes, offsets.
        let a = Checkpoint::open(&src).unwrap();
        let b = Checkpoint::open(&p).unwrap();
        assert!(b.is_packed() && !a.is_packed());
        assert_eq!(a.tensors, b.tensors, "{enc}");
        for name in a.tensors.keys() {
            assert_eq!(
                a.read_tensor(name).unwrap(),
                b.read_tensor(name).unwrap(),
                "{name}"
            );
        }
    }
}

#[test]
fn both_encoders_write_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.safetensors");
    write_raw_safetensors(&src, &every_dtype(), 0);
    let d = host();
    let [(_, cpu), (_, dev)] = encoders(&d);
    pack(&src, &dir.path().join("a"), &cpu, None, None).unwrap();
    pack(&src, &dir.path().join("b"), &dev, None, None).unwrap();
    same_files(&dir.path().join("a"), &dir.path().join("b"));
}

/// A GGUF file with plain and block-quantized types, metadata of every
/// type and 64-byte alignment (padding between tensors and at the end).
fn gguf_file() -> g::File {
    let mut kv = g::every_type();
    kv.push(("general.alignment".into(), g::V::U32(64)));
    let w = bf16_weights(9, 70_000);
    let f32s: Vec<u8> = noise(3, 4 * 999);
    let f16s: Vec<u8> = noise(4, 2 * 3333);
    let q8 = noise(5, 34 * 2000); // Q8_0: 34 bytes per 32 elements
    let q4 = noise(6, 18 * 500); // Q4_0: 18 bytes per 32 elements
    let i8s = noise(7, 77);
    let mut f = g::File::new(
        kv,
        &[
            ("w.bf16", &[700, 100], 30, w),
            ("w.f32", &[999], 0, f32s),
            ("w.f16", &[3333], 1, f16s),
            ("w.q8_0", &[64000], 8, q8),
            ("w.q4_0", &[16000], 2, q4),
            ("w.i8", &[77], 24, i8s),
        ],
    );
    // Trailing padding, as writers align the end of the data too.
    f.data.extend([0u8; 27]);
    f
}

#[test]
fn gguf_types_metadata_and_alignment_padding_round_trip_and_load() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    gguf_file().write(&src);
    let d = host();
    for (enc, o) in encoders(&d) {
        let p = dir.path().join(format!("m-{enc}.packed.gguf"));
        pack(&src, &p, &o, None, None).unwrap();
        let back = dir.path().join(format!("m-{enc}.gguf"));
        unpack(&p, &back, 2, false, None, None).unwrap();
        same_files(&src, &back);
        let a = Checkpoint::open(&src).unwrap();
        let b = Checkpoint::open(&p).unwrap();
        assert_eq!(a.tensors, b.tensors);
        assert_eq!(a.gguf().unwrap().metadata(), b.gguf().unwrap().metadata());
        loads_alike(&d, a, b, &Rules::default(), 8 << 20, false, enc);
    }
}

#[test]
fn a_folder_with_its_index_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("model");
    std::fs::create_dir(&src).unwrap();
    let t = generate(&SMALL, Dtype::Bf16);
    write_sharded(&src, &t, Dtype::Bf16, 3);
    let p = dir.path().join("packed");
    let r = pack(&src, &p, &opts(None), None, None).unwrap();
    assert_eq!(r.files.len(), 3);
    same_files(
        &src.join("model.safetensors.index.json"),
        &p.join("model.safetensors.index.json"),
    );
    let back = dir.path().join("back");
    unpack(&p, &back, 2, false, None, None).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let n = e.unwrap().file_name();
        same_files(&src.join(&n), &back.join(&n));
    }
    // Output that exists is refused, and packing a packed checkpoint too.
    assert!(pack(&src, &p, &opts(None), None, None).is_err());
    let e = pack(&p, &dir.path().join("again"), &opts(None), None, None).unwrap_err();
    assert!(e.to_string().contains("already packed"), "{e}");
    assert!(!dir.path().join("again").exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("vmmw-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A model large enough that its tensors span several 64 KiB frames, so
/// row and column slices start and end inside frames.
fn large(m: &crate::loader_tp::Model) -> crate::loader_tp::Model {
    let mut s = m.shape;
    s.hidden = 128;
    s.inter = if m.preset == "qwen2" { 320 } else { 256 };
    s.vocab = 512;
    s.head_dim = 16;
    crate::loader_tp::Model {
        preset: m.preset,
        shape: s,
        qkv_bias: m.qkv_bias,
    }
}

/// The reading paths the frames go through: page cache by memcpy, `pread`,
/// registered windows.
const STRATEGIES: [Strategy; 3] = [Strategy::Auto, Strategy::Read, Strategy::Direct];

#[test]
fn a_packed_checkpoint_loads_every_rank_and_strategy_as_its_original() {
    let cases: Vec<_> = models()
        .iter()
        .map(|m| {
            let m = large(m);
            let t = tp_tensors(&m);
            let dir = tempfile::tempdir().unwrap();
            let src = dir.path().join("orig");
            std::fs::create_dir(&src).unwrap();
            write_sharded(&src, &t, Dtype::Bf16, 3);
            let p = dir.path().join("packed");
            pack(&src, &p, &opts(None), None, None).unwrap();
            (m, t, dir)
        })
        .collect();
    let mut checked = 0;
    on_each_backend(
        "a_packed_checkpoint_loads_every_rank_and_strategy_as_its_original",
        |b| {
            let d = &b.driver;
            for (m, t, dir) in &cases {
                let s = &m.shape;
                for world in [1, 2, 4, 8] {
                    for rank in 0..world {
                        let rules =
                            Rules::preset(m.preset, Some(Tp { rank, world }), s.head_dim).unwrap();
                        let ckpt = Checkpoint::open(dir.path().join("packed")).unwrap();
                        let (_a, reg) = allocate_for(d, &ckpt, &rules, 16 << 20);
                        for strategy in STRATEGIES {
                            fill_pattern(d.as_ref(), &reg);
                            let o = LoadOptions {
                                copy: CopyOptions {
                                    strategy,
                                    threads: 2,
                                    window_bytes: 8192,
                                    slot_bytes: 16384,
                                    ..Default::default()
                                },
                                ..Default::default()
                            };
                            let ckpt = Checkpoint::open(dir.path().join("packed")).unwrap();
                            let what = format!(
                                "{} {} rank {rank}/{world} {strategy:?}",
                                b.kind(),
                                m.preset
                            );
                            let ex =
                                load(d, ckpt, &rules, &reg, &o, &Control::default()).expect(&what);
                            assert!(ex.stats.frames > 0 && ex.stats.packed_bytes > 0, "{what}");
                            for x in reg.iter() {
                                let want = expected(t, s, &x.name, rank, world);
                                assert!(
                                    read(d.as_ref(), x.ptr, x.bytes()) == want,
                                    "{what}: {} differs",
                                    x.name
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        },
    );
    assert!(checked > 3 * 6 * 3 * 4, "{checked}");
}

#[test]
fn conversions_and_a_driver_packed_file_load_as_the_original() {
    let m = large(&models()[2]);
    let t = tp_tensors(&m);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("orig");
    std::fs::create_dir(&src).unwrap();
    write_sharded(&src, &t, Dtype::Bf16, 2);
    on_each_backend(
        "conversions_and_a_driver_packed_file_load_as_the_original",
        |b| {
            let d = &b.driver;
            // Packed with this backend's own codec (the GPU's kernels on
            // cuda): the same files as the reference encoder writes.
            let p = dir.path().join(format!("packed-{}", b.kind()));
            pack(&src, &p, &opts(Some(d.clone())), None, None).unwrap();
            let cpu = dir.path().join(format!("packed-cpu-{}", b.kind()));
            pack(&src, &cpu, &opts(None), None, None).unwrap();
            for f in std::fs::read_dir(&src).unwrap() {
                let n = f.unwrap().file_name();
                same_files(&p.join(&n), &cpu.join(&n));
            }
            for world in [1, 4] {
                for rank in [0, world - 1] {
                    let mut rules =
                        Rules::preset(m.preset, Some(Tp { rank, world }), m.shape.head_dim)
                            .unwrap();
                    rules.dtype = Some(Dtype::F32);
                    let a = Checkpoint::open(&src).unwrap();
                    let bck = Checkpoint::open(&p).unwrap();
                    let what = format!("{} rank {rank}/{world} (converted to F32)", b.kind());
                    loads_alike(d, a, bck, &rules, 32 << 20, true, &what);
                }
            }
        },
    );
}

#[test]
fn a_reload_wake_decodes_from_the_packed_file() {
    let m = large(&models()[0]);
    let t = tp_tensors(&m);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("orig");
    std::fs::create_dir(&src).unwrap();
    write_sharded(&src, &t, Dtype::Bf16, 2);
    let p = dir.path().join("packed");
    pack(&src, &p, &opts(None), None, None).unwrap();
    on_each_backend(
        "a_reload_wake_decodes_from_the_packed_file",
        |b: &Backend| {
            let d = &b.driver;
            let pool = Pool::new(d.clone(), PoolConfig::default()).unwrap();
            let weights = tag::id(&format!("packed-reload-{}", b.kind())).unwrap();
            let rules =
                Rules::preset(m.preset, Some(Tp { rank: 1, world: 2 }), m.shape.head_dim).unwrap();
            let ckpt = Checkpoint::open(&p).unwrap();
            let mut reg = Registry::new();
            allocate_in_pool(
                &mut reg,
                &Plan::destinations(&ckpt, &rules).unwrap(),
                &pool,
                weights,
            )
            .unwrap();
            let plan = load_into_pool(
                &pool,
                ckpt,
                &rules,
                &reg,
                &LoadOptions::default(),
                &Control::default(),
            )
            .unwrap();
            let before: Vec<Vec<u8>> = reg
                .iter()
                .map(|x| read(d.as_ref(), x.ptr, x.bytes()))
                .collect();
            for (x, want) in reg.iter().zip(&before) {
                assert_eq!(*want, expected(&t, &m.shape, &x.name, 1, 2), "{}", x.name);
            }
            pool.sleep(&[(weights, Policy::Reload)]).unwrap();
            pool.wake(&[weights]).unwrap();
            for (x, want) in reg.iter().zip(&before) {
                assert_eq!(
                    read(d.as_ref(), x.ptr, x.bytes()),
                    *want,
                    "{} after wake",
                    x.name
                );
            }
            let replay = plan.last_replay().expect("the wake replayed the plan");
            assert!(replay.frames > 0, "{replay:?}");
            drop(plan);
            drop(reg);
        },
    );
}

#[test]
fn a_folder_of_packed_and_plain_shards_loads_as_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("orig");
    std::fs::create_dir(&src).unwrap();
    let t = generate(&SMALL, Dtype::Bf16);
    write_sharded(&src, &t, Dtype::Bf16, 3);
    let p = dir.path().join("packed");
    pack(&src, &p, &opts(None), None, None).unwrap();
    // The second shard back as it was: one execution reads both kinds.
    let second = "model-00002-of-00003.safetensors";
    std::fs::copy(src.join(second), p.join(second)).unwrap();
    let d = host();
    let rules = Rules::preset("llama", None, SMALL.head_dim).unwrap();
    let a = Checkpoint::open(&src).unwrap();
    let b = Checkpoint::open(&p).unwrap();
    assert!(b.shards[1].packed.is_none() && b.shards[0].packed.is_some());
    loads_alike(&d, a, b, &rules, 8 << 20, false, "mixed shards");
}
