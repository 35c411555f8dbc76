//! Exact aliases among destinations (tied parameters of a PyTorch
//! `state_dict()`): one destination under two names, filled from whichever
//! name the checkpoint has; partial overlaps stay an error.

use crate::common;

use common::loader::*;
use vmmweights::loader::*;
use vmmweights::Error;

const EMBED: &str = "model.embed_tokens.weight";
const HEAD: &str = "lm_head.weight";

fn tied_shape() -> Shape {
    Shape {
        tied: true,
        ..SMALL
    }
}

/// Destinations for every tensor of `t`, plus `lm_head.weight` registered at
/// the embedding's address (as `state_dict()` lists tied weights).
fn with_tied_head(
    d: &std::sync::Arc<dyn vmmweights::Driver>,
    ckpt: &Checkpoint,
) -> (SegmentAllocator, Registry) {
    let (alloc, mut reg) = allocate_for(d, ckpt, &Rules::default(), 4 << 20);
    let e = reg.get(EMBED).unwrap().clone();
    reg.register(HEAD, e.ptr, e.dtype, &e.shape).unwrap();
    (alloc, reg)
}

#[test]
fn exact_alias_is_one_destination_filled_from_the_name_the_checkpoint_has() {
    let t = generate(&tied_shape(), Dtype::Bf16);
    assert!(!t.contains_key(HEAD), "a tied checkpoint stores one name");
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    let d = host();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (_alloc, reg) = with_tied_head(&d, &ckpt);
    assert_eq!(reg.len(), t.len(), "the alias is listed once");
    assert_eq!(reg.get(HEAD).unwrap().ptr, reg.get(EMBED).unwrap().ptr);
    assert_eq!(reg.aliases().collect::<Vec<_>>(), vec![(HEAD, EMBED)]);
    fill_pattern(d.as_ref(), &reg);
    let lo = LoadOptions::default();
    load(&d, ckpt, &Rules::default(), &reg, &lo, &Control::default()).unwrap();
    let e = reg.get(EMBED).unwrap();
    assert_eq!(read(d.as_ref(), e.ptr, e.bytes()), t[EMBED].1);
}

#[test]
fn alias_filled_from_its_own_name_when_only_that_is_in_the_checkpoint() {
    let mut t = generate(&tied_shape(), Dtype::Bf16);
    let (shape, bytes) = t.remove(EMBED).unwrap();
    t.insert(HEAD.to_owned(), (shape.clone(), bytes.clone()));
    let dir = tempfile::tempdir().unwrap();
    write_file(&dir.path().join("model.safetensors"), &t, Dtype::Bf16);
    let d = host();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    // The registry is laid out from a checkpoint that names the embedding.
    let mut reg = Registry::new();
    let alloc = SegmentAllocator::new(d.clone(), 4 << 20);
    for (n, (sh, _)) in &t {
        let name = if n == HEAD { EMBED } else { n.as_str() };
        let ptr = vmmweights::loader::DestAllocator::alloc(&alloc, bytes_of(sh)).unwrap();
        reg.register(name, ptr, Dtype::Bf16, sh).unwrap();
    }
    let e = reg.get(EMBED).unwrap().clone();
    reg.register(HEAD, e.ptr, e.dtype, &e.shape).unwrap();
    fill_pattern(d.as_ref(), &reg);
    let plan = Plan::build(&ckpt, &Rules::default(), &reg, &PlanOptions::default()).unwrap();
    assert!(plan.missing.is_empty());
    load(
        &d,
        ckpt,
        &Rules::default(),
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
    assert_eq!(read(d.as_ref(), e.ptr, e.bytes()), bytes);
}

#[test]
fn both_names_in_the_checkpoint_fill_once_and_skip_the_other() {
    let mut t = generate(&tied_shape(), Dtype::Bf16);
    let (shape, bytes) = t[EMBED].clone();
    let other: Vec<u8> = bytes.iter().map(|b| b ^ 0xFF).collect();
    t.insert(HEAD.to_owned(), (shape, other));
    let dir = tempfile::tempdir().unwrap();
    write_file(&dir.path().join("model.safetensors"), &t, Dtype::Bf16);
    let d = host();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (_alloc, mut reg) = allocate_for(&d, &ckpt, &Rules::default(), 4 << 20);
    // Registered as the caller's state_dict would: head listed, embedding an alias of it.
    let h = reg.get(HEAD).unwrap().clone();
    let mut fresh = Registry::new();
    for dst in reg.iter().filter(|x| x.name != EMBED) {
        fresh
            .register(&dst.name, dst.ptr, dst.dtype, &dst.shape)
            .unwrap();
    }
    fresh.register(EMBED, h.ptr, h.dtype, &h.shape).unwrap();
    reg = fresh;
    let plan = Plan::build(&ckpt, &Rules::default(), &reg, &PlanOptions::default()).unwrap();
    assert_eq!(plan.skipped, vec![EMBED.to_owned()], "the listed name wins");
    load(
        &d,
        ckpt,
        &Rules::default(),
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
    assert_eq!(read(d.as_ref(), h.ptr, h.bytes()), t[HEAD].1);
}

#[test]
fn partial_overlaps_and_near_aliases_are_refused_and_change_nothing() {
    let t = generate(&tied_shape(), Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_file(&dir.path().join("model.safetensors"), &t, Dtype::Bf16);
    let d = host();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (_alloc, mut reg) = allocate_for(&d, &ckpt, &Rules::default(), 4 << 20);
    let e = reg.get(EMBED).unwrap().clone();
    let n = reg.len();
    let cases: Vec<(u64, Dtype, Vec<usize>)> = vec![
        (e.ptr + 2, e.dtype, e.shape.clone()),              // shifted
        (e.ptr, e.dtype, vec![e.shape[0] / 2, e.shape[1]]), // a prefix
        (e.ptr, Dtype::F16, e.shape.clone()),               // other dtype
        (e.ptr, e.dtype, vec![e.shape[1], e.shape[0]]),     // other shape
    ];
    for (ptr, dtype, shape) in cases {
        let err = reg.register(HEAD, ptr, dtype, &shape).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("overlaps"), "{err}");
        assert_eq!(reg.len(), n);
        assert!(reg.get(HEAD).is_none());
        assert_eq!(reg.aliases().count(), 0);
    }
    // A name taken by an alias cannot be registered again.
    reg.register(HEAD, e.ptr, e.dtype, &e.shape).unwrap();
    let err = reg.register(HEAD, e.ptr, e.dtype, &e.shape).unwrap_err();
    assert!(err.to_string().contains("already registered"), "{err}");
}

fn bytes_of(shape: &[usize]) -> usize {
    shape.iter().product::<usize>() * 2
}
