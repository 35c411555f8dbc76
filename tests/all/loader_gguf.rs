//! GGUF checkpoints on every backend: files written byte by byte here (the
//! Python tests compare against the `gguf` package's own writer and reader).
//! Good files load their raw bytes in place, metadata of every type reads
//! back, splits open as one checkpoint, rules work where exact on quantized
//! tensors and refuse the rest before any I/O, Reload and sleep/wake restore
//! GGUF-loaded memory, and every hostile header is refused with an error
//! naming the file (and tensor or key) while nothing is written.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::backend::{on_each_backend, Backend};
use common::gguf::{every_type, pattern, File, V};
use common::loader::*;
use vmmweights::loader::gguf::{GgmlType, Value};
use vmmweights::loader::*;
use vmmweights::sleep::Policy;
use vmmweights::{tag, Driver, Error, Pool, PoolConfig, Status};

const F32: u32 = 0;
const Q8_0: u32 = 8;
const Q4_K: u32 = 12;

/// A model of three tensors: F32 [ne 8, 2], Q8_0 [ne 64, 4], Q4_K [ne 256, 2].
fn model(kv: Vec<(String, V)>) -> File {
    File::new(
        kv,
        &[
            ("norm.weight", &[8, 2], F32, pattern(1, 8 * 2 * 4)),
            (
                "blk.0.attn_q.weight",
                &[64, 4],
                Q8_0,
                pattern(2, 2 * 4 * 34),
            ),
            ("blk.0.ffn_up.weight", &[256, 2], Q4_K, pattern(3, 2 * 144)),
        ],
    )
}

fn load_all(
    d: &Arc<dyn Driver>,
    path: &Path,
    rules: &Rules,
) -> Result<(Registry, SegmentAllocator), Error> {
    let ckpt = Checkpoint::open(path)?;
    let alloc = SegmentAllocator::new(d.clone(), 2 << 20);
    let mut reg = Registry::new();
    reg.allocate(&Plan::destinations(&ckpt, rules)?, &alloc)?;
    load(
        d,
        ckpt,
        rules,
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )?;
    Ok((reg, alloc))
}

#[test]
fn tensors_load_as_raw_bytes_with_shapes_reversed_and_every_metadata_type() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.bin");
    let f = model(every_type());
    f.write(&path);
    let ckpt = Checkpoint::open(&path).unwrap();
    let g = ckpt.gguf().expect("picked as GGUF by its magic bytes");
    let m = g.metadata();
    assert_eq!(g.files[0].version, 3);
    assert_eq!(g.files[0].alignment, 32);
    assert_eq!(m.len(), every_type().len());
    assert_eq!(m.get("t.u8"), Some(&Value::U8(200)));
    assert_eq!(m.get("t.i64"), Some(&Value::I64(i64::MIN)));
    assert_eq!(m.get("t.f64"), Some(&Value::F64(-2.25)));
    assert_eq!(m.get("t.bool"), Some(&Value::Bool(true)));
    let Some(Value::Array(nested)) = m.get("t.nested") else {
        panic!("nested array")
    };
    assert_eq!(nested.len(), 2);
    let Some(Value::Array(inner)) = nested.get(1) else {
        panic!("inner array")
    };
    assert_eq!(inner.get(0), Some(Value::String("x".into())));
    let q = ckpt.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.dtype, Dtype::Ggml(GgmlType::Q8_0));
    assert_eq!(q.shape, vec![4, 64], "row-major: ne reversed");
    assert_eq!(q.ggml_ne(), vec![64, 4]);
    assert_eq!(ckpt.tensor("norm.weight").unwrap().dtype, Dtype::F32);
    let file = f.bytes();
    on_each_backend(
        "tensors_load_as_raw_bytes_with_shapes_reversed_and_every_metadata_type",
        |b: &Backend| {
            let (reg, _a) = load_all(&b.driver, &path, &Rules::default()).unwrap();
            let ckpt = Checkpoint::open(&path).unwrap();
            for dst in reg.iter() {
                let t = ckpt.tensor(&dst.name).unwrap();
                let want = &file[t.offset as usize..(t.offset + t.len) as usize];
                assert_eq!(dst.bytes() as u64, t.len);
                assert_eq!(
                    read(b.driver.as_ref(), dst.ptr, dst.bytes()),
                    want,
                    "{}",
                    dst.name
                );
            }
        },
    );
}

#[test]
fn rename_skip_and_tie_work_and_row_slices_cut_whole_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let f = model(vec![]);
    f.write(&path);
    let file = f.bytes();
    let ckpt = Checkpoint::open(&path).unwrap();
    let q = ckpt.tensor("blk.0.attn_q.weight").unwrap().clone();
    let up = ckpt.tensor("blk.0.ffn_up.weight").unwrap().clone();
    let qbytes = &file[q.offset as usize..(q.offset + q.len) as usize];
    let upbytes = &file[up.offset as usize..(up.offset + up.len) as usize];
    on_each_backend(
        "rename_skip_and_tie_work_and_row_slices_cut_whole_blocks",
        |b| {
            let d = &b.driver;
            // Rename, skip, tie.
            let rules = Rules::from_json(
                r#"{"ties":[{"to":"output.weight","from":"blk.0.attn_q.weight"}],
                "rules":[{"match":"norm\\.weight","skip":true},
                         {"match":"blk\\.0\\.(.*)","to":"layer0.$1"}]}"#,
            )
            .unwrap();
            let (reg, _a) = load_all(d, &path, &rules).unwrap();
            let names: Vec<&str> = reg.iter().map(|x| x.name.as_str()).collect();
            assert!(!names.contains(&"norm.weight"), "{names:?}");
            let get = |n: &str| reg.iter().find(|x| x.name == n).unwrap().clone();
            assert_eq!(
                read(d.as_ref(), get("layer0.attn_q.weight").ptr, qbytes.len()),
                qbytes
            );
            assert_eq!(
                read(d.as_ref(), get("output.weight").ptr, qbytes.len()),
                qbytes
            );
            // Rows of 64 elements (two Q8_0 blocks, 68 bytes): each rank of two gets 2 rows.
            for rank in 0..2 {
                let rules = Rules::from_json(&format!(
                r#"{{"tp":{{"rank":{rank},"world":2}},"rules":[{{"match":".*","shard":{{"dim":0}}}}]}}"#
            ))
            .unwrap();
                let (reg, _a) = load_all(d, &path, &rules).unwrap();
                let dq = reg.iter().find(|x| x.name == q.name).unwrap();
                assert_eq!(dq.shape, vec![2, 64]);
                assert_eq!(
                    read(d.as_ref(), dq.ptr, 2 * 68),
                    &qbytes[rank * 136..(rank + 1) * 136]
                );
            }
            // Columns: 64 elements over 2 ranks is one block each: exact.
            let rules = Rules::from_json(
            r#"{"tp":{"rank":1,"world":2},"rules":[{"match":"blk\\.0\\.attn_q\\.weight","shard":{"dim":1}},{"match":".*","skip":true}]}"#,
        )
        .unwrap();
            let (reg, _a) = load_all(d, &path, &rules).unwrap();
            let dq = reg.iter().next().unwrap();
            assert_eq!(dq.shape, vec![4, 32]);
            let want: Vec<u8> = (0..4)
                .flat_map(|r| qbytes[r * 68 + 34..r * 68 + 68].to_vec())
                .collect();
            assert_eq!(read(d.as_ref(), dq.ptr, want.len()), want);
            assert_eq!(upbytes.len(), 288);
        },
    );
}

/// A plan error before any allocation or I/O, whose message holds `needles`.
fn plan_refused(path: &Path, rules: &str, needles: &[&str]) {
    let ckpt = Checkpoint::open(path).unwrap();
    let rules = Rules::from_json(rules).unwrap();
    let e = Plan::destinations(&ckpt, &rules).unwrap_err();
    let m = e.to_string();
    assert_eq!(e.status(), Status::PlanMismatch, "{m}");
    for n in needles {
        assert!(m.contains(n), "`{n}` not in: {m}");
    }
}

#[test]
fn inexact_rules_on_quantized_tensors_are_refused_before_any_io() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    model(vec![]).write(&path);
    // 64 elements over 4 ranks: 16, half a Q8_0 block.
    plan_refused(
        &path,
        r#"{"tp":{"rank":0,"world":4},"rules":[{"match":".*","shard":{"dim":1}}]}"#,
        &["blk.0.attn_q.weight", "Q8_0", "whole blocks of 32"],
    );
    plan_refused(
        &path,
        r#"{"rules":[{"match":"blk\\.0\\.(attn_q|ffn_up)\\.weight","to":"fused","fuse":{"dim":0,"index":0}}]}"#,
        &["not fused or padded"],
    );
    plan_refused(&path, r#"{"dtype":"F16"}"#, &["never converted", "Q8_0"]);
    // A registered destination of another dtype is refused by the plan too.
    let ckpt = Checkpoint::open(&path).unwrap();
    let d = host();
    let alloc = SegmentAllocator::new(d.clone(), 2 << 20);
    let mut reg = Registry::new();
    let specs: Vec<DestSpec> = Plan::destinations(&ckpt, &Rules::default())
        .unwrap()
        .into_iter()
        .map(|mut s| {
            if s.dtype.is_quantized() {
                s.dtype = Dtype::F16;
            }
            s
        })
        .collect();
    reg.allocate(&specs, &alloc).unwrap();
    fill_pattern(d.as_ref(), &reg);
    let e = load(
        &d,
        ckpt,
        &Rules::default(),
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("never converted"), "{e}");
    assert!(untouched(d.as_ref(), &reg));
}

#[test]
fn split_files_open_as_one_checkpoint_from_any_part() {
    let dir = tempfile::tempdir().unwrap();
    let split = |no: u16, extra: Vec<(String, V)>| {
        let mut kv = vec![
            ("split.no".to_string(), V::U16(no)),
            ("split.count".to_string(), V::U16(2)),
            ("split.tensors.count".to_string(), V::I32(2)),
        ];
        kv.extend(extra);
        kv
    };
    let a = File::new(
        split(0, every_type()),
        &[("a", &[32], Q8_0, pattern(4, 34))],
    );
    let b = File::new(split(1, vec![]), &[("b", &[4], F32, pattern(5, 16))]);
    let p1 = dir.path().join("m-00001-of-00002.gguf");
    let p2 = dir.path().join("m-00002-of-00002.gguf");
    a.write(&p1);
    b.write(&p2);
    for p in [&p1, &p2] {
        let c = Checkpoint::open(p).unwrap();
        assert_eq!(c.shards.len(), 2);
        assert_eq!(c.tensors.len(), 2);
        assert_eq!(c.tensor("b").unwrap().shard, 1);
        assert!(c.gguf().unwrap().metadata().get("t.u8").is_some());
    }
    on_each_backend("split_files_open_as_one_checkpoint_from_any_part", |bk| {
        let (reg, _a) = load_all(&bk.driver, &p1, &Rules::default()).unwrap();
        let get = |n: &str| reg.iter().find(|x| x.name == n).unwrap().ptr;
        assert_eq!(read(bk.driver.as_ref(), get("a"), 34), pattern(4, 34));
        assert_eq!(read(bk.driver.as_ref(), get("b"), 16), pattern(5, 16));
    });
    // A part whose keys disagree with its name, a wrong total, a missing part.
    let mut wrong = b.clone();
    wrong.kv[0].1 = V::U16(0);
    wrong.write(&p2);
    let m = Checkpoint::open(&p1).unwrap_err().to_string();
    assert!(
        m.contains("m-00002-of-00002.gguf") && m.contains("named part 2 of 2"),
        "{m}"
    );
    b.write(&p2);
    let mut total = a.clone();
    total.kv[2].1 = V::I32(3);
    total.write(&p1);
    let m = Checkpoint::open(&p1).unwrap_err().to_string();
    assert!(m.contains("split.tensors.count"), "{m}");
    a.write(&p1);
    std::fs::remove_file(&p2).unwrap();
    let m = Checkpoint::open(&p1).unwrap_err().to_string();
    assert!(m.contains("part of the split is missing"), "{m}");
    let renamed = dir.path().join("other.gguf");
    std::fs::rename(&p1, &renamed).unwrap();
    let m = Checkpoint::open(&renamed).unwrap_err().to_string();
    assert!(m.contains("does not end in `-00001-of-00002.gguf`"), "{m}");
}

#[test]
fn reload_and_offload_sleep_wake_restore_gguf_loaded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    model(every_type()).write(&path);
    on_each_backend(
        "reload_and_offload_sleep_wake_restore_gguf_loaded_memory",
        |b| {
            let d = b.driver.clone();
            let pool = Pool::new(d.clone(), PoolConfig::default()).unwrap();
            let weights = tag::id("test-gguf-weights").unwrap();
            let ckpt = Checkpoint::open(&path).unwrap();
            let rules = Rules::default();
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
            let before: Vec<(u64, Vec<u8>)> = reg
                .iter()
                .map(|x| (x.ptr, read(d.as_ref(), x.ptr, x.bytes())))
                .collect();
            let loaded: u64 = reg.iter().map(|x| x.bytes() as u64).sum();
            for policy in [Policy::Reload, Policy::Offload, Policy::Reload] {
                pool.sleep(&[(weights, policy)]).unwrap();
                let woke = pool.wake(&[weights]).unwrap();
                if policy == Policy::Reload {
                    assert!(
                        woke[0].report.reloaded_bytes >= loaded,
                        "{:?}",
                        woke[0].report
                    );
                }
                for (ptr, bytes) in &before {
                    assert_eq!(&read(d.as_ref(), *ptr, bytes.len()), bytes, "{policy:?}");
                }
            }
            assert!(plan.checkpoint().gguf().is_some());
            // The file rewritten (same size, new bytes and time): Reload refuses to replay it.
            pool.sleep(&[(weights, Policy::Reload)]).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            let mut f = model(every_type());
            f.data = f.data.iter().map(|x| x ^ 0xff).collect();
            f.write(&path);
            assert!(pool.wake(&[weights]).is_err());
            model(every_type()).write(&path);
            drop(pool);
        },
    );
}

// ---------------------------------------------------------------- hostile

/// `f` written as a file is refused by `Checkpoint::open` with
/// `CheckpointInvalid`, naming the file and every needle, and a load from it
/// into a registry of good destinations writes nothing.
fn hostile(what: &str, bytes: &[u8], needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.gguf");
    model(vec![]).write(&good);
    let path = dir.path().join("hostile.gguf");
    std::fs::write(&path, bytes).unwrap();
    on_each_backend(
        "hostile_gguf_headers_are_refused_and_nothing_is_written",
        |b| {
            let d = &b.driver;
            let ckpt = Checkpoint::open(&good).unwrap();
            let (_alloc, reg) = allocate_for(d, &ckpt, &Rules::default(), 2 << 20);
            fill_pattern(d.as_ref(), &reg);
            let e = Checkpoint::open(&path)
                .and_then(|c| {
                    load(
                        d,
                        c,
                        &Rules::default(),
                        &reg,
                        &LoadOptions::default(),
                        &Control::default(),
                    )
                })
                .err()
                .unwrap_or_else(|| panic!("{what}: accepted"));
            let m = e.to_string();
            assert_eq!(e.status(), Status::CheckpointInvalid, "{what}: {m}");
            assert!(m.contains("hostile.gguf"), "{what}: {m}");
            for n in needles {
                assert!(m.contains(n), "{what}: `{n}` not in: {m}");
            }
            assert!(untouched(d.as_ref(), &reg), "{what}: destinations written");
        },
    );
}

#[test]
fn hostile_gguf_headers_are_refused_and_nothing_is_written() {
    let good = model(every_type());
    let bytes = good.bytes();
    let ds = good.data_start();
    let with = |edit: &dyn Fn(&mut File)| {
        let mut f = good.clone();
        edit(&mut f);
        f.bytes()
    };
    hostile(
        "truncated data",
        &bytes[..bytes.len() - 1],
        &["blk.0.ffn_up.weight", "past the end"],
    );
    hostile("truncated header", &bytes[..ds / 2], &["truncated"]);
    hostile("only magic", b"GGUF", &["version"]);
    hostile(
        "offset past the end",
        &with(&|f| f.tensors[0].offset = 1 << 40),
        &["norm.weight", "past the end"],
    );
    hostile(
        "offset + size overflows",
        &with(&|f| f.tensors[0].offset = u64::MAX - 31),
        &["norm.weight", "past the end"],
    );
    hostile(
        "overlapping tensors",
        &with(&|f| f.tensors[2].offset = f.tensors[1].offset + 32),
        &["overlaps tensor"],
    );
    hostile(
        "misaligned offset",
        &with(&|f| f.tensors[1].offset += 4),
        &["blk.0.attn_q.weight", "not a multiple of the alignment 32"],
    );
    hostile(
        "huge tensor count",
        &with(&|f| f.n_tensors = Some(u64::MAX)),
        &["tensor count"],
    );
    hostile(
        "tensor count under the limit but over what the header can hold",
        &with(&|f| f.n_tensors = Some(1 << 19)),
        &["tensor count is 524288", "bytes are left"],
    );
    hostile(
        "huge key count",
        &with(&|f| f.n_kv = Some(1 << 40)),
        &["metadata key count"],
    );
    hostile(
        "huge string length",
        &with(&|f| f.kv[0].1 = V::Raw(8, (1u64 << 50).to_le_bytes().to_vec())),
        &["general.architecture", "string length"],
    );
    hostile(
        "huge array length",
        &with(&|f| {
            let mut raw = 10u32.to_le_bytes().to_vec();
            raw.extend((u64::MAX / 4).to_le_bytes());
            f.kv[1].1 = V::Raw(9, raw)
        }),
        &["t.u8", "array length"],
    );
    hostile(
        "arrays nested too deep",
        &with(&|f| {
            let mut v = V::Arr(4, vec![]);
            for _ in 0..20 {
                v = V::Arr(9, vec![v]);
            }
            f.kv[1].1 = v
        }),
        &["t.u8", "nested deeper"],
    );
    hostile(
        "unknown value type",
        &with(&|f| f.kv[1].1 = V::Raw(13, vec![0])),
        &["t.u8", "unknown value type 13"],
    );
    hostile(
        "bool not 0 or 1",
        &with(&|f| f.kv[8].1 = V::Raw(7, vec![2])),
        &["t.bool", "must be 0 or 1"],
    );
    hostile(
        "string not UTF-8",
        &with(&|f| {
            let mut raw = 2u64.to_le_bytes().to_vec();
            raw.extend([0xff, 0xfe]);
            f.kv[0].1 = V::Raw(8, raw)
        }),
        &["general.architecture", "not UTF-8"],
    );
    hostile(
        "duplicate key",
        &with(&|f| f.kv[2].0 = "t.u8".into()),
        &["`t.u8` appears twice"],
    );
    hostile(
        "duplicate tensor",
        &with(&|f| f.tensors[1].name = "norm.weight".into()),
        &["norm.weight", "appears twice"],
    );
    hostile(
        "unknown ggml type",
        &with(&|f| f.tensors[0].ty = 99),
        &["norm.weight", "unknown ggml type 99"],
    );
    hostile(
        "removed ggml type",
        &with(&|f| f.tensors[0].ty = 31),
        &["Q4_0_4_4", "removed"],
    );
    hostile(
        "quantized row not whole blocks",
        &with(&|f| f.tensors[1].ne = vec![48, 4]),
        &["blk.0.attn_q.weight", "whole number of Q8_0 blocks"],
    );
    hostile(
        "too many dims",
        &with(&|f| f.tensors[0].ne = vec![1; 5]),
        &["norm.weight", "5 dimensions"],
    );
    hostile(
        "dims overflow",
        &with(&|f| f.tensors[0].ne = vec![1 << 62, 1 << 62]),
        &["norm.weight", "overflows"],
    );
    hostile("version 1", &with(&|f| f.version = 1), &["version 1"]);
    hostile(
        "version 4",
        &with(&|f| f.version = 4),
        &["unknown GGUF version 4"],
    );
    hostile(
        "big-endian",
        &with(&|f| f.version = 3u32.swap_bytes()),
        &["big-endian"],
    );
    hostile(
        "alignment not a power of two",
        &with(&|f| f.kv.push(("general.alignment".into(), V::U32(48)))),
        &["general.alignment", "not a power of two"],
    );
    hostile(
        "alignment of the wrong type",
        &with(&|f| f.kv.push(("general.alignment".into(), V::U64(32)))),
        &["general.alignment", "uint32"],
    );
    hostile(
        "tensor name too long",
        &with(&|f| f.tensors[0].name = "n".repeat(5000)),
        &["string length 5000"],
    );
}

#[test]
fn a_safetensors_header_cannot_claim_a_ggml_type() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("q.safetensors");
    let h = r#"{"w":{"dtype":"Q8_0","shape":[1,32],"data_offsets":[0,34]}}"#;
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend(h.as_bytes());
    b.extend([0u8; 34]);
    std::fs::write(&p, b).unwrap();
    let m = Checkpoint::open(&p).unwrap_err().to_string();
    assert!(m.contains("unknown dtype `Q8_0`"), "{m}");
}
