//! Every bad input gets a clear error naming the file and tensor, and the
//! destinations are untouched (filled with a pattern first, checked after).

use crate::common;

use std::path::Path;

use common::loader::*;
use vmmweights::loader::*;
use vmmweights::{Error, Status};

/// A raw safetensors file from a header and data.
fn raw(path: &Path, header: &str, data: &[u8]) {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    std::fs::write(path, b).unwrap();
}

struct Fixture {
    dir: tempfile::TempDir,
    d: std::sync::Arc<dyn vmmweights::Driver>,
    reg: Registry,
    _alloc: SegmentAllocator,
}

/// A good sharded checkpoint and destinations for it, filled with the pattern.
fn fixture() -> Fixture {
    let t = generate(&SMALL, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    let d = host();
    let alloc = SegmentAllocator::new(d.clone(), 4 << 20);
    let mut reg = Registry::new();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    reg.allocate(
        &Plan::destinations(&ckpt, &Rules::default()).unwrap(),
        &alloc,
    )
    .unwrap();
    fill_pattern(d.as_ref(), &reg);
    Fixture {
        dir,
        d,
        reg,
        _alloc: alloc,
    }
}

fn try_load(f: &Fixture, path: &Path, reg: &Registry, opts: PlanOptions) -> Result<(), Error> {
    let ckpt = Checkpoint::open(path)?;
    let o = LoadOptions {
        plan: opts,
        ..Default::default()
    };
    load(&f.d, ckpt, &Rules::default(), reg, &o, &Control::default()).map(|_| ())
}

fn shard1(f: &Fixture) -> std::path::PathBuf {
    f.dir.path().join("model-00001-of-00002.safetensors")
}

/// Load must fail with `status`, the message must contain every needle, and
/// nothing may have been written.
fn expect_err(f: &Fixture, reg: &Registry, opts: PlanOptions, status: Status, needles: &[&str]) {
    let e = try_load(f, f.dir.path(), reg, opts).unwrap_err();
    let m = e.to_string();
    assert_eq!(e.status(), status, "{m}");
    for n in needles {
        assert!(m.contains(n), "`{n}` not in: {m}");
    }
    assert!(
        untouched(f.d.as_ref(), &f.reg),
        "destinations were written: {m}"
    );
}

#[test]
fn truncated_file() {
    let f = fixture();
    let p = shard1(&f);
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    expect_err(
        &f,
        &f.reg,
        PlanOptions::default(),
        Status::CheckpointInvalid,
        &["model-00001-of-00002", "out of range", "tensor `"],
    );
}

#[test]
fn corrupt_header_json() {
    let f = fixture();
    let p = shard1(&f);
    let mut b = std::fs::read(&p).unwrap();
    b[8] = b'x';
    std::fs::write(&p, b).unwrap();
    expect_err(
        &f,
        &f.reg,
        PlanOptions::default(),
        Status::CheckpointInvalid,
        &["model-00001-of-00002", "header JSON is invalid"],
    );
}

#[test]
fn header_length_past_the_end() {
    let f = fixture();
    let p = shard1(&f);
    let mut b = std::fs::read(&p).unwrap();
    let n = b.len() as u64;
    b[..8].copy_from_slice(&n.to_le_bytes());
    std::fs::write(&p, b).unwrap();
    expect_err(
        &f,
        &f.reg,
        PlanOptions::default(),
        Status::CheckpointInvalid,
        &["model-00001-of-00002", "header length"],
    );
}

#[test]
fn overlapping_and_out_of_range_offsets_and_unknown_dtype() {
    let f = fixture();
    let p = shard1(&f);
    let cases = [
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            "overlaps tensor `a`",
            "b",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}}"#,
            "out of range",
            "a",
        ),
        (
            r#"{"a":{"dtype":"Q9_K","shape":[4],"data_offsets":[0,16]}}"#,
            "unknown dtype `Q9_K`",
            "a",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}"#,
            "needs 12 bytes",
            "a",
        ),
    ];
    for (header, why, tensor) in cases {
        raw(&p, header, &[0u8; 16]);
        let e = Checkpoint::open(&p).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains(why)
                && m.contains(&format!("tensor `{tensor}`"))
                && m.contains("model-00001"),
            "{m}"
        );
        expect_err(
            &f,
            &f.reg,
            PlanOptions::default(),
            Status::CheckpointInvalid,
            &[why],
        );
    }
}

#[test]
fn shape_mismatch_missing_and_unexpected_are_listed_together() {
    let f = fixture();
    let mut reg = Registry::new();
    let mut n = 0;
    for x in f.reg.iter() {
        n += 1;
        match x.name.as_str() {
            "model.norm.weight" => reg
                .register(&x.name, x.ptr, x.dtype, &[x.shape[0] + 1])
                .unwrap(),
            "model.layers.0.mlp.up_proj.weight" => {} // unexpected in the checkpoint
            _ => reg.register(&x.name, x.ptr, x.dtype, &x.shape).unwrap(),
        }
    }
    assert!(n > 10);
    let extra = f.reg.get("model.layers.1.mlp.up_proj.weight").unwrap();
    // A destination nobody fills: reuse memory of a real destination range.
    reg.register(
        "model.layers.9.extra.weight",
        extra.ptr + 2,
        Dtype::Bf16,
        &[0],
    )
    .unwrap();
    expect_err(
        &f,
        &reg,
        PlanOptions::default(),
        Status::PlanMismatch,
        &[
            "missing (1",
            "model.layers.9.extra.weight",
            "unexpected (1",
            "model.layers.0.mlp.up_proj.weight",
            "`model.norm.weight`: destination shape [65], sources give [64]",
        ],
    );
    // Allowing missing and unexpected leaves only the shape mismatch.
    let e = try_load(
        &f,
        f.dir.path(),
        &reg,
        PlanOptions {
            allow_missing: true,
            allow_unexpected: true,
        },
    )
    .unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("model.norm.weight") && !m.contains("missing") && !m.contains("unexpected"),
        "{m}"
    );
    assert!(untouched(f.d.as_ref(), &f.reg));
}

#[test]
fn allowed_missing_and_unexpected_load_the_rest() {
    let f = fixture();
    let mut reg = Registry::new();
    for x in f.reg.iter().filter(|x| x.name != "model.norm.weight") {
        reg.register(&x.name, x.ptr, x.dtype, &x.shape).unwrap();
    }
    let norm = f.reg.get("model.norm.weight").unwrap().clone();
    // Unexpected: model.norm.weight (no destination); missing: a destination in its memory.
    reg.register("nobody.fills.this", norm.ptr, Dtype::Bf16, &norm.shape)
        .unwrap();
    let e = try_load(&f, f.dir.path(), &reg, PlanOptions::default()).unwrap_err();
    assert_eq!(e.status(), Status::PlanMismatch);
    try_load(
        &f,
        f.dir.path(),
        &reg,
        PlanOptions {
            allow_missing: true,
            allow_unexpected: true,
        },
    )
    .unwrap();
    let got = read(f.d.as_ref(), norm.ptr, norm.bytes());
    assert!(
        got.iter().all(|&b| b == PATTERN),
        "skipped destination left untouched"
    );
    let emb = f.reg.get("model.embed_tokens.weight").unwrap();
    assert!(read(f.d.as_ref(), emb.ptr, emb.bytes())
        .iter()
        .any(|&b| b != PATTERN));
}

#[test]
fn index_naming_a_missing_shard_or_a_path_outside_the_folder() {
    let f = fixture();
    let idx = f.dir.path().join("model.safetensors.index.json");
    let good = std::fs::read_to_string(&idx).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::copy(shard1(&f), outside.path().join("evil.safetensors")).unwrap();
    let abs = outside
        .path()
        .join("evil.safetensors")
        .display()
        .to_string();
    for (name, why) in [
        ("model-00009-of-00009.safetensors", "does not exist"),
        (
            "../evil.safetensors",
            "relative path inside the checkpoint folder",
        ),
        (abs.as_str(), "relative path inside the checkpoint folder"),
    ] {
        let bad = good.replacen("model-00001-of-00002.safetensors", name, 1);
        std::fs::write(&idx, bad).unwrap();
        expect_err(
            &f,
            &f.reg,
            PlanOptions::default(),
            Status::CheckpointInvalid,
            &[why, "model.safetensors.index.json", name],
        );
    }
    // The index and a shard disagree about a tensor.
    let bad = good.replacen(
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        1,
    );
    std::fs::write(&idx, bad).unwrap();
    expect_err(
        &f,
        &f.reg,
        PlanOptions::default(),
        Status::CheckpointInvalid,
        &["tensor `"],
    );
}
