//! Hostile checkpoints and rules:
//! each is refused with an error naming the file and, where there is one, the
//! tensor, and nothing is written (destinations hold a pattern before and
//! after). Symlinked shards in the Hugging Face cache layout keep loading.

use crate::common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::loader::*;
use vmmweights::loader::*;
use vmmweights::{Driver, Error, Status};

/// A raw safetensors file from a header length, header bytes and data.
fn raw_with_len(path: &Path, len: u64, header: &[u8], data: &[u8]) {
    let mut b = len.to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.extend_from_slice(data);
    std::fs::write(path, b).unwrap();
}

fn raw(path: &Path, header: &str, data: &[u8]) {
    raw_with_len(path, header.len() as u64, header.as_bytes(), data);
}

/// A good single-file checkpoint `w` (F32 [2, 3]) and a destination for it
/// holding the pattern.
struct Fixture {
    dir: tempfile::TempDir,
    d: Arc<dyn Driver>,
    reg: Registry,
    _alloc: SegmentAllocator,
}

const GOOD: &str = r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#;

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    raw(&dir.path().join("model.safetensors"), GOOD, &[7u8; 24]);
    let d = host();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (alloc, reg) = allocate_for(&d, &ckpt, &Rules::default(), 2 << 20);
    fill_pattern(d.as_ref(), &reg);
    Fixture {
        dir,
        d,
        reg,
        _alloc: alloc,
    }
}

impl Fixture {
    fn file(&self) -> PathBuf {
        self.dir.path().join("model.safetensors")
    }

    fn load(&self, path: &Path, rules: &Rules) -> Result<(), Error> {
        let ckpt = Checkpoint::open(path)?;
        load(
            &self.d,
            ckpt,
            rules,
            &self.reg,
            &LoadOptions::default(),
            &Control::default(),
        )
        .map(|_| ())
    }

    /// Loading `path` fails with `status`, the message holds every needle,
    /// and the destination still holds the pattern.
    fn refused(&self, path: &Path, status: Status, needles: &[&str]) -> String {
        let e = self.load(path, &Rules::default()).unwrap_err();
        let m = e.to_string();
        assert_eq!(e.status(), status, "{m}");
        for n in needles {
            assert!(m.contains(n), "`{n}` not in: {m}");
        }
        assert!(untouched(self.d.as_ref(), &self.reg), "written: {m}");
        m
    }

    /// Write `header` over the checkpoint and expect a refusal naming the file.
    fn header_refused(&self, header: &str, data: &[u8], needles: &[&str]) -> String {
        raw(&self.file(), header, data);
        let mut n = vec!["model.safetensors"];
        n.extend_from_slice(needles);
        self.refused(&self.file(), Status::CheckpointInvalid, &n)
    }
}

#[test]
fn header_length_near_u64_max_or_past_the_end() {
    let f = fixture();
    for len in [u64::MAX, u64::MAX - 7, 1 << 40, GOOD.len() as u64 + 100] {
        raw_with_len(&f.file(), len, GOOD.as_bytes(), &[0u8; 24]);
        f.refused(
            &f.file(),
            Status::CheckpointInvalid,
            &["model.safetensors", "header length"],
        );
    }
    // Shorter than the 8-byte length itself.
    std::fs::write(f.file(), [1u8, 2, 3]).unwrap();
    f.refused(&f.file(), Status::CheckpointInvalid, &["too short"]);
}

#[test]
fn offsets_past_the_end_reversed_or_overlapping() {
    let f = fixture();
    f.header_refused(
        r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24000]}}"#,
        &[0; 24],
        &["tensor `w`", "out of range"],
    );
    f.header_refused(
        r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[24,0]}}"#,
        &[0; 24],
        &["tensor `w`", "out of range"],
    );
    f.header_refused(
        r#"{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}}"#,
        &[0; 32],
        &["overlaps tensor"],
    );
    // A gap between tensors (out of order with the data layout) is refused by
    // the format checks.
    f.header_refused(
        r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}}"#,
        &[0; 32],
        &["format checks"],
    );
}

#[test]
fn shapes_whose_byte_size_overflows() {
    let f = fixture();
    let big = 1u64 << 62;
    f.header_refused(
        &format!(r#"{{"w":{{"dtype":"F32","shape":[{big},{big}],"data_offsets":[0,24]}}}}"#),
        &[0; 24],
        &["tensor `w`", "too many"],
    );
    f.header_refused(
        &format!(r#"{{"w":{{"dtype":"F64","shape":[{big},4],"data_offsets":[0,24]}}}}"#),
        &[0; 24],
        &["tensor `w`", "too many"],
    );
    let dims = vec!["1"; 100].join(",");
    f.header_refused(
        &format!(r#"{{"w":{{"dtype":"F32","shape":[{dims},6],"data_offsets":[0,24]}}}}"#),
        &[0; 24],
        &["tensor `w`", "dimensions"],
    );
}

#[test]
fn duplicate_names_are_refused() {
    let f = fixture();
    f.header_refused(
        r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#,
        &[0; 24],
        &["`w` appears twice"],
    );
}

#[test]
fn deeply_nested_or_huge_json() {
    let f = fixture();
    let deep = format!(
        r#"{{"__metadata__":{}1{},"w":{{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    f.header_refused(&deep, &[0; 24], &["header JSON is invalid"]);
    // A header over the 100 MB cap, declared but not present, and present.
    raw_with_len(&f.file(), 200_000_000, b"{}", &[]);
    f.refused(&f.file(), Status::CheckpointInvalid, &["limit"]);
    let huge = format!(
        r#"{{"__metadata__":{{"pad":"{}"}}}}"#,
        "x".repeat(100_000_001)
    );
    raw(&f.file(), &huge, &[]);
    f.refused(&f.file(), Status::CheckpointInvalid, &["limit"]);
}

#[test]
fn non_utf8_and_control_character_names() {
    let f = fixture();
    let mut h = br#"{"w"#.to_vec();
    h.push(0xff);
    h.extend_from_slice(br#"":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#);
    raw_with_len(&f.file(), h.len() as u64, &h, &[0; 24]);
    f.refused(&f.file(), Status::CheckpointInvalid, &["not UTF-8"]);
    // A name with a newline and an escape sequence: printed escaped, so the
    // message stays one line and cannot forge output.
    let m = f.header_refused(
        r#"{"w\n\u001b[31mFAKE":{"dtype":"Q9","shape":[2,3],"data_offsets":[0,24]}}"#,
        &[0; 24],
        &["unknown dtype", r"w\n\u{1b}[31mFAKE"],
    );
    assert!(!m.contains('\n') && !m.contains('\u{1b}'), "{m:?}");
}

#[test]
fn an_index_naming_a_tensor_twice_is_refused() {
    let f = fixture();
    std::fs::write(
        f.dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"w": "model.safetensors", "w": "other.safetensors"}}"#,
    )
    .unwrap();
    f.refused(
        f.dir.path(),
        Status::CheckpointInvalid,
        &["model.safetensors.index.json", "`w` appears twice"],
    );
}

#[test]
fn index_with_escaping_or_missing_shards() {
    let f = fixture();
    let idx = f.dir.path().join("model.safetensors.index.json");
    for (shard, why) in [
        ("../model.safetensors", "relative path inside"),
        ("/etc/passwd", "relative path inside"),
        ("sub/../../x.safetensors", "relative path inside"),
        ("missing.safetensors", "does not exist"),
    ] {
        std::fs::write(
            &idx,
            serde_json::json!({"weight_map": {"w": shard}}).to_string(),
        )
        .unwrap();
        f.refused(
            f.dir.path(),
            Status::CheckpointInvalid,
            &["model.safetensors.index.json", why],
        );
    }
}

#[test]
fn fifo_shard_and_index_are_refused_without_hanging() {
    let f = fixture();
    let fifo = f.dir.path().join("pipe.safetensors");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    f.refused(
        &fifo,
        Status::CheckpointInvalid,
        &["pipe.safetensors", "FIFO"],
    );
    // The index itself a FIFO, then /dev/zero through a symlink: refused, not read forever.
    let sub = f.dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let idx = sub.join("model.safetensors.index.json");
    let c = std::ffi::CString::new(idx.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    f.refused(&sub, Status::CheckpointInvalid, &["index.json", "FIFO"]);
    std::fs::remove_file(&idx).unwrap();
    symlink("/dev/zero", &idx).unwrap();
    f.refused(&sub, Status::CheckpointInvalid, &["index.json", "device"]);
    // A shard named by the index that is a device.
    std::fs::remove_file(&idx).unwrap();
    symlink("/dev/zero", sub.join("zero.safetensors")).unwrap();
    std::fs::write(
        &idx,
        serde_json::json!({"weight_map": {"w": "zero.safetensors"}}).to_string(),
    )
    .unwrap();
    f.refused(
        &sub,
        Status::CheckpointInvalid,
        &["zero.safetensors", "device"],
    );
    // An oversized index.
    std::fs::write(
        &idx,
        vec![b' '; (vmmweights::loader::checkpoint::MAX_INDEX + 1) as usize],
    )
    .unwrap();
    f.refused(&sub, Status::CheckpointInvalid, &["index", "limit"]);
}

#[test]
fn a_file_that_shrinks_or_changes_after_open_is_refused_before_any_write() {
    let f = fixture();
    let ckpt = Checkpoint::open(f.file()).unwrap();
    // Same size, new bytes and a new modification time.
    std::thread::sleep(std::time::Duration::from_millis(20));
    raw(&f.file(), GOOD, &[9u8; 24]);
    let e = load(
        &f.d,
        ckpt,
        &Rules::default(),
        &f.reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap_err();
    assert_eq!(e.status(), Status::CheckpointInvalid, "{e}");
    assert!(e.to_string().contains("changed since it was opened"), "{e}");
    assert!(untouched(f.d.as_ref(), &f.reg));

    let ckpt = Checkpoint::open(f.file()).unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(f.file())
        .unwrap();
    file.set_len(20).unwrap();
    let e = load(
        &f.d,
        ckpt,
        &Rules::default(),
        &f.reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("changed since it was opened"), "{e}");
    assert!(untouched(f.d.as_ref(), &f.reg));
}

#[test]
fn symlinked_shards_in_the_hugging_face_cache_layout_load() {
    // blobs/<hash> hold the bytes; snapshots/<rev>/ holds symlinks to them.
    let t = generate(&SMALL, Dtype::Bf16);
    let root = tempfile::tempdir().unwrap();
    let real = root.path().join("real");
    std::fs::create_dir(&real).unwrap();
    write_sharded(&real, &t, Dtype::Bf16, 2);
    let blobs = root.path().join("blobs");
    let snap = root.path().join("snapshots").join("abc123");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    for (i, e) in std::fs::read_dir(&real).unwrap().enumerate() {
        let e = e.unwrap();
        let blob = blobs.join(format!("blob{i}"));
        std::fs::rename(e.path(), &blob).unwrap();
        symlink(
            Path::new("../..").join("blobs").join(format!("blob{i}")),
            snap.join(e.file_name()),
        )
        .unwrap();
    }
    let d = host();
    let ckpt = Checkpoint::open(&snap).unwrap();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &Rules::default(), 4 << 20);
    load(
        &d,
        ckpt,
        &Rules::default(),
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
    for (name, (_, bytes)) in &t {
        let dst = reg.get(name).unwrap();
        assert_eq!(&read(d.as_ref(), dst.ptr, dst.bytes()), bytes, "{name}");
    }
}

#[test]
fn a_pad_rule_whose_size_overflows_is_refused() {
    let f = fixture();
    for rules in [
        r#"{"rules":[{"match":"w","pad":{"dim":1,"to":4611686018427387904}}]}"#,
        r#"{"rules":[{"match":"w","pad":{"dim":1,"multiple_of":18446744073709551615}}]}"#,
        r#"{"rules":[{"match":"w","fuse":{"dim":0,"offset":18446744073709551615}}]}"#,
    ] {
        let rules = Rules::from_json(rules).unwrap();
        let ckpt = Checkpoint::open(f.file()).unwrap();
        let e = Plan::destinations(&ckpt, &rules).unwrap_err();
        assert_eq!(e.status(), Status::PlanMismatch, "{e}");
        assert!(e.to_string().contains("overflow"), "{e}");
        let e = f.load(&f.file(), &rules).unwrap_err();
        assert_eq!(e.status(), Status::PlanMismatch, "{e}");
        assert!(untouched(f.d.as_ref(), &f.reg));
    }
}

#[test]
fn destinations_whose_byte_size_overflows_are_refused_at_register() {
    let mut reg = Registry::new();
    let big = 1usize << 62;
    let e = reg
        .register("w", 0x1000, Dtype::F32, &[big, big])
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.to_string().contains("overflows"), "{e}");
    // Fits in usize but runs past the end of the address space.
    let e = reg
        .register("w", u64::MAX - 10, Dtype::F32, &[4])
        .unwrap_err();
    assert!(e.to_string().contains("address space"), "{e}");
    assert!(reg.is_empty(), "nothing registered");
    reg.register("w", 0x1000, Dtype::F32, &[4]).unwrap();
}

#[test]
fn plans_that_cut_too_finely_are_refused_before_allocating_them() {
    let dir = tempfile::tempdir().unwrap();
    // 2^25 blocks of 2x2 bytes, sharded on the last dim over 2 ranks: 2^25
    // two-row copies, over the plan's limit. The data is a hole in a sparse file.
    let rows = 1u64 << 25;
    let p = dir.path().join("rows.safetensors");
    let h = format!(
        r#"{{"w":{{"dtype":"U8","shape":[{rows},2,2],"data_offsets":[0,{}]}}}}"#,
        rows * 4
    );
    raw(&p, &h, &[]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(8 + h.len() as u64 + rows * 4)
        .unwrap();
    let rules = Rules::from_json(
        r#"{"tp":{"rank":0,"world":2},"rules":[{"match":"w","shard":{"dim":2}}]}"#,
    )
    .unwrap();
    let ckpt = Checkpoint::open(&p).unwrap();
    let mut reg = Registry::new();
    reg.register("w", 0x10000, Dtype::U8, &[rows as usize, 2, 1])
        .unwrap();
    let t0 = std::time::Instant::now();
    let e = Plan::build(&ckpt, &rules, &reg, &PlanOptions::default()).unwrap_err();
    assert_eq!(e.status(), Status::PlanMismatch, "{e}");
    assert!(e.to_string().contains("limit"), "{e}");
    assert!(
        t0.elapsed().as_secs() < 5,
        "refused before building the copies"
    );

    // A zero-sized source padded into a huge destination: one fill, at once.
    let z = dir.path().join("zero.safetensors");
    raw(
        &z,
        r#"{"w":{"dtype":"U8","shape":[1099511627776,0],"data_offsets":[0,0]}}"#,
        &[],
    );
    let rules = Rules::from_json(r#"{"rules":[{"match":"w","pad":{"dim":1,"to":1}}]}"#).unwrap();
    let ckpt = Checkpoint::open(&z).unwrap();
    let mut reg = Registry::new();
    reg.register("w", 0x10000, Dtype::U8, &[1 << 40, 1])
        .unwrap();
    let plan = Plan::build(&ckpt, &rules, &reg, &PlanOptions::default()).unwrap();
    assert_eq!(plan.fills.len(), 1);
    assert_eq!(plan.fills[0].len, 1 << 40);
}

#[test]
fn load_into_pool_refuses_destinations_outside_one_live_block() {
    let f = fixture();
    let pool = vmmweights::Pool::new(host(), vmmweights::pool::PoolConfig::default()).unwrap();
    let t = vmmweights::tag::id("test-hostile-dest").unwrap();
    let blk = pool.alloc_tagged(4096, t).unwrap().ptr;
    let nbr = pool.alloc_tagged(4096, t).unwrap().ptr;
    let sentinel = vec![0x5au8; 4096];
    // SAFETY: nothing sleeps or frees the block meanwhile.
    unsafe { pool.write(nbr, &sentinel) }.unwrap();
    let load_with = |reg: &Registry, rules: &Rules| {
        let ckpt = Checkpoint::open(f.file()).unwrap();
        load_into_pool(
            &pool,
            ckpt,
            rules,
            reg,
            &LoadOptions::default(),
            &Control::default(),
        )
    };
    // 8196 bytes registered over a 4 KiB block: refused, the neighbour intact.
    let pad = Rules::from_json(r#"{"rules":[{"match":"w","pad":{"dim":0,"to":683}}]}"#).unwrap();
    let mut reg = Registry::new();
    reg.register("w", blk, Dtype::F32, &[683, 3]).unwrap();
    let e = load_with(&reg, &pad).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(
        e.to_string().contains("runs past the end of its block"),
        "{e}"
    );
    let mut back = vec![0u8; 4096];
    // SAFETY: as above.
    unsafe { pool.read(nbr, &mut back) }.unwrap();
    assert_eq!(back, sentinel);
    // Memory of another allocator (here: the fixture's segment) is refused
    // unless declared the caller's own.
    let theirs = f.reg.get("w").unwrap().clone();
    let mut reg = Registry::new();
    reg.register("w", theirs.ptr, Dtype::F32, &[2, 3]).unwrap();
    let e = load_with(&reg, &Rules::default()).unwrap_err();
    assert_eq!(e.status(), Status::UnknownPointer, "{e}");
    assert!(untouched(f.d.as_ref(), &f.reg));
    reg.declare_foreign(theirs.ptr, 24).unwrap();
    // The fixture's driver is another host driver: its memory is mapped in
    // this process, so the pool's driver can copy into it.
    load_with(&reg, &Rules::default()).unwrap();
    assert_eq!(read(f.d.as_ref(), theirs.ptr, 24), vec![7u8; 24]);
    pool.free(blk).unwrap();
    pool.free(nbr).unwrap();
}
