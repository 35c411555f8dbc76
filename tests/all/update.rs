//! Updates on every backend (`common::backend`: the host twin in CI, CUDA
//! on the GPU machine): a generated Llama-shaped checkpoint is loaded through
//! the llama preset (q/k/v and gate/up fused), then updated from a trainer's
//! tensors holding other values. The reference for every destination is a
//! load of those values written as a checkpoint, through the same rules.
//!
//! Sources: whole device tensors (direct), host tensors, the same staged,
//! buckets cut at odd byte offsets (staged, one batch in flight), and
//! sources that fail or end midway. Validation lists every problem and
//! writes nothing; device faults roll forward or mark the tag torn; a Reload
//! sleep after an update brings the update back.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::backend::{on_each_backend, Backend};
use common::loader::*;
use vmmweights::driver::fault::FaultOp;
use vmmweights::driver::sync_copy::copy_to_device;
use vmmweights::loader::{Dtype, Session};
use vmmweights::share::{AttachOptions, Attachment, ServeOptions, Server};
use vmmweights::sleep::Policy;
use vmmweights::update::{
    self, Batch, Bytes, Piece, Source, SourceTensor, Staging, Tensors as Src, UpdateOptions,
};
use vmmweights::{tag, Driver, Error, Pool, PoolConfig, Segment, Status};

/// A loaded model and the trainer's new values for it.
pub struct Setup {
    /// Holds the checkpoints while the session may reopen them.
    pub _dir: tempfile::TempDir,
    pub driver: Arc<dyn Driver>,
    pub pool: Arc<Pool>,
    pub tag: tag::TagId,
    pub session: Session,
    /// The trainer's tensors (other values than the checkpoint's).
    pub new: Tensors,
    /// Every destination as the new values load into it: name -> bytes.
    pub want: BTreeMap<String, Vec<u8>>,
}

/// Bytes of every destination of `s`.
pub fn snapshot(d: &dyn Driver, s: &Session) -> BTreeMap<String, Vec<u8>> {
    s.destinations()
        .into_iter()
        .map(|x| (x.name.clone(), read(d, x.ptr, x.bytes())))
        .collect()
}

/// Tensors of `shape` with values from `seed` on.
pub fn trainer_values(shape: &Shape, seed: u64) -> Tensors {
    tensor_shapes(shape)
        .into_iter()
        .enumerate()
        .map(|(i, (n, sh))| {
            let numel = sh.iter().product();
            (n, (sh, values(seed + i as u64, numel, Dtype::Bf16)))
        })
        .collect()
}

/// Load `shape`'s checkpoint under `tag_name` with `preset` rules (and `tp`),
/// and compute what `new` values give through the same rules.
pub fn setup(
    b: &Backend,
    tag_name: &str,
    shape: &Shape,
    preset: &str,
    tp: Option<vmmweights::loader::Tp>,
) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    write_file(
        &dir.path().join("model.safetensors"),
        &generate(shape, Dtype::Bf16),
        Dtype::Bf16,
    );
    let new = trainer_values(shape, 1000);
    let new_dir = dir.path().join("new");
    std::fs::create_dir(&new_dir).unwrap();
    write_file(&new_dir.join("model.safetensors"), &new, Dtype::Bf16);
    let pool = Arc::new(Pool::new(b.driver.clone(), PoolConfig::default()).unwrap());
    let t = tag::id(tag_name).unwrap();
    let session = Session::open(dir.path()).unwrap();
    session.set_preset(preset, tp, shape.head_dim).unwrap();
    session.allocate(&pool, t).unwrap();
    session.load(&pool, None).unwrap();
    // The reference: the new values loaded through the same rules.
    let reference = Session::open(&new_dir).unwrap();
    reference.set_preset(preset, tp, shape.head_dim).unwrap();
    let ref_tag = tag::id(&format!("{tag_name}-reference")).unwrap();
    reference.allocate(&pool, ref_tag).unwrap();
    reference.load(&pool, None).unwrap();
    let want = snapshot(b.driver.as_ref(), &reference);
    assert_ne!(
        want,
        snapshot(b.driver.as_ref(), &session),
        "the new values differ"
    );
    Setup {
        _dir: dir,
        driver: b.driver.clone(),
        pool,
        tag: t,
        session,
        new,
        want,
    }
}

/// The trainer's tensors in device memory of `d` (kept alive by the segment).
pub fn on_device(d: &Arc<dyn Driver>, new: &Tensors) -> (Segment, Src) {
    let total: usize = new.values().map(|(_, v)| v.len().div_ceil(256) * 256).sum();
    let seg = Segment::allocate(d.clone(), total, 0).unwrap();
    let mut src = Src::new();
    let mut at = seg.ptr();
    for (name, (shape, bytes)) in new {
        // SAFETY: `at` lies in the segment, mapped, with room for `bytes`.
        unsafe { copy_to_device(d.as_ref(), at, bytes) }.unwrap();
        // SAFETY: the segment outlives every update made from `src`.
        unsafe { src.add(name, Dtype::Bf16, shape, Bytes::Device(at)) }.unwrap();
        at += (bytes.len().div_ceil(256) * 256) as u64;
    }
    (seg, src)
}

/// The trainer's tensors in host memory (`new` must outlive the source).
pub fn on_host(new: &Tensors) -> Src {
    let mut src = Src::new();
    for (name, (shape, bytes)) in new {
        // SAFETY: `new` outlives every update made from `src`.
        unsafe { src.add(name, Dtype::Bf16, shape, Bytes::Host(bytes.as_ptr())) }.unwrap();
    }
    src
}

/// A source that delivers `new` (in host memory) in buckets of `bucket`
/// bytes, cutting tensors anywhere, and fails (or stops) after `fail_after`
/// buckets when set.
pub struct Buckets {
    manifest: Vec<SourceTensor>,
    /// The whole stream: every tensor's bytes back to back.
    stream: Vec<u8>,
    starts: Vec<u64>,
    bucket: usize,
    next: usize,
    pub fail_after: Option<usize>,
    pub end_early: bool,
    pub released: Vec<u64>,
    unreleased: usize,
    pub most_unreleased: usize,
    /// Calls of `next` made while a batch handed out was not yet released
    /// (the update reads one buffer while the source fills the other).
    pub asked_while_reading: usize,
}

impl Buckets {
    pub fn new(new: &Tensors, bucket: usize) -> Buckets {
        let (mut manifest, mut stream, mut starts) = (Vec::new(), Vec::new(), Vec::new());
        for (name, (shape, bytes)) in new {
            manifest.push(SourceTensor {
                name: name.clone(),
                dtype: Dtype::Bf16,
                shape: shape.clone(),
            });
            starts.push(stream.len() as u64);
            stream.extend_from_slice(bytes);
        }
        Buckets {
            manifest,
            stream,
            starts,
            bucket,
            next: 0,
            fail_after: None,
            end_early: false,
            released: Vec::new(),
            unreleased: 0,
            most_unreleased: 0,
            asked_while_reading: 0,
        }
    }
}

// SAFETY: every piece points into `stream`, which lives as long as the
// source and is never written after construction.
unsafe impl Source for Buckets {
    fn manifest(&self) -> &[SourceTensor] {
        &self.manifest
    }

    fn next(&mut self) -> vmmweights::Result<Option<Batch>> {
        if self.unreleased > 0 {
            self.asked_while_reading += 1;
        }
        let k = self.next;
        if Some(k) == self.fail_after {
            if self.end_early {
                return Ok(None);
            }
            return Err(Error::UpdateSource(format!("sender gone after bucket {k}")));
        }
        let (a, b) = (
            k * self.bucket,
            ((k + 1) * self.bucket).min(self.stream.len()),
        );
        if a >= self.stream.len() {
            return Ok(None);
        }
        self.next += 1;
        let mut pieces = Vec::new();
        for (i, &s) in self.starts.iter().enumerate() {
            let e = s + self.manifest[i].bytes().unwrap();
            let (lo, hi) = ((a as u64).max(s), (b as u64).min(e));
            if lo < hi {
                pieces.push(Piece {
                    tensor: i,
                    offset: lo - s,
                    len: hi - lo,
                    at: Bytes::Host(self.stream[lo as usize..].as_ptr()),
                });
            }
        }
        self.unreleased += 1;
        self.most_unreleased = self.most_unreleased.max(self.unreleased);
        Ok(Some(Batch {
            id: k as u64,
            pieces,
        }))
    }

    fn release(&mut self, id: u64) -> vmmweights::Result<()> {
        self.unreleased -= 1;
        self.released.push(id);
        Ok(())
    }
}

fn opts(from: u64) -> UpdateOptions {
    UpdateOptions::from_version(from)
}

fn check_all_new(s: &Setup) {
    let got = snapshot(s.driver.as_ref(), &s.session);
    for (name, want) in &s.want {
        assert!(
            got[name] == *want,
            "destination `{name}` differs from the reference"
        );
    }
}

fn unique(name: &str, b: &Backend) -> String {
    format!("update-{name}-{}", b.kind())
}

#[test]
fn updates_from_device_tensors_are_bitwise_and_move_the_version() {
    on_each_backend("updates_from_device_tensors", |b| {
        let s = setup(b, &unique("device", b), &SMALL, "llama", None);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let (_seg, mut src) = on_device(&s.driver, &s.new);
        let r = update::update(&s.session, &s.pool, &mut src, &opts(v0)).unwrap();
        assert_eq!(r.version, v0 + 1);
        assert_eq!(r.tag, s.tag);
        assert!(!r.staged && !r.retried);
        assert_eq!(r.destinations as usize, s.session.destination_count());
        assert_eq!(s.pool.tag_version(s.tag).unwrap(), v0 + 1);
        check_all_new(&s);
        // The same update again is from a version the tag left.
        let e = update::update(&s.session, &s.pool, &mut src, &opts(v0)).unwrap_err();
        assert_eq!(e.status(), Status::VersionMismatch, "{e}");
    });
}

#[test]
fn updates_from_host_tensors_direct_and_staged() {
    on_each_backend("updates_from_host_tensors", |b| {
        let s = setup(b, &unique("host", b), &SMALL, "llama", None);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let r = update::update(&s.session, &s.pool, &mut on_host(&s.new), &opts(v0)).unwrap();
        assert!(!r.staged);
        check_all_new(&s);
        // Staged, from device tensors.
        let (_seg, mut src) = on_device(&s.driver, &s.new);
        let mut o = opts(v0 + 1);
        o.staging = Staging::Always;
        let r = update::update(&s.session, &s.pool, &mut src, &o).unwrap();
        assert!(r.staged);
        assert_eq!(r.version, v0 + 2);
        check_all_new(&s);
    });
}

#[test]
fn buckets_cut_anywhere_are_staged_with_one_batch_in_flight() {
    on_each_backend("buckets_cut_anywhere", |b| {
        let s = setup(b, &unique("buckets", b), &SMALL, "llama", None);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let mut src = Buckets::new(&s.new, 4093);
        let r = update::update(&s.session, &s.pool, &mut src, &opts(v0)).unwrap();
        assert!(r.staged);
        check_all_new(&s);
        assert!(src.most_unreleased <= 2, "{}", src.most_unreleased);
        assert!(
            src.asked_while_reading + 1 >= src.released.len(),
            "each next batch is asked for while the previous one is read"
        );
        let mut ids = src.released.clone();
        ids.sort();
        assert_eq!(ids, (0..src.released.len() as u64).collect::<Vec<_>>());
    });
}

#[test]
fn a_source_failing_or_ending_midway_writes_nothing() {
    on_each_backend("a_source_failing_midway", |b| {
        let s = setup(b, &unique("midway", b), &SMALL, "llama", None);
        let before = snapshot(s.driver.as_ref(), &s.session);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        for end_early in [false, true] {
            let mut src = Buckets::new(&s.new, 3000);
            src.fail_after = Some(5);
            src.end_early = end_early;
            let e = update::update(&s.session, &s.pool, &mut src, &opts(v0)).unwrap_err();
            assert_eq!(e.status(), Status::UpdateSource, "{e}");
            let msg = e.to_string();
            if end_early {
                assert!(msg.contains("ended before delivering"), "{msg}");
            } else {
                assert!(msg.contains("sender gone after bucket 5"), "{msg}");
            }
            assert_eq!(src.released.len(), 5, "every batch handed out is released");
            assert_eq!(snapshot(s.driver.as_ref(), &s.session), before);
            assert_eq!(s.pool.tag_version(s.tag).unwrap(), v0);
        }
        // And the tag still takes a whole update afterwards.
        let mut src = Buckets::new(&s.new, 3000);
        update::update(&s.session, &s.pool, &mut src, &opts(v0)).unwrap();
        check_all_new(&s);
    });
}

#[test]
fn every_problem_is_listed_and_nothing_written() {
    on_each_backend("every_problem_is_listed", |b| {
        let s = setup(b, &unique("problems", b), &SMALL, "llama", None);
        let before = snapshot(s.driver.as_ref(), &s.session);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let mut bad = s.new.clone();
        bad.remove("model.norm.weight"); // missing
        bad.insert("model.extra.weight".into(), (vec![4], vec![0; 8])); // unknown
        let (sh, bytes) = bad.get_mut("lm_head.weight").unwrap();
        sh[0] -= 1; // mis-shaped
        bytes.truncate(sh.iter().product::<usize>() * 2);
        let mut src = on_host(&bad);
        // SAFETY: a static host buffer of 4 bytes.
        unsafe {
            src.add(
                "model.layers.0.input_layernorm.weight.f32",
                Dtype::F32,
                &[1],
                Bytes::Host([0u8; 4].as_ptr()),
            )
        }
        .unwrap();
        let e = update::update(&s.session, &s.pool, &mut src, &opts(v0 + 7)).unwrap_err();
        assert_eq!(e.status(), Status::PlanMismatch, "{e}");
        let msg = e.to_string();
        for needle in [
            "model.norm.weight",
            "model.extra.weight",
            "lm_head.weight",
            "input_layernorm.weight.f32",
            &format!("at version {v0}, the update expects {}", v0 + 7),
            "nothing written",
        ] {
            assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
        }
        assert_eq!(snapshot(s.driver.as_ref(), &s.session), before);
        assert_eq!(s.pool.tag_version(s.tag).unwrap(), v0);
        // A dtype that would need a conversion.
        let mut conv = Src::new();
        let f32s: Vec<(String, Vec<usize>, Vec<u8>)> = s
            .new
            .iter()
            .map(|(n, (sh, _))| {
                (
                    n.clone(),
                    sh.clone(),
                    vec![0u8; sh.iter().product::<usize>() * 4],
                )
            })
            .collect();
        for (n, sh, v) in &f32s {
            // SAFETY: `f32s` outlives the update.
            unsafe { conv.add(n, Dtype::F32, sh, Bytes::Host(v.as_ptr())) }.unwrap();
        }
        let e = update::update(&s.session, &s.pool, &mut conv, &opts(v0)).unwrap_err();
        assert!(e.to_string().contains("copies bytes as they are"), "{e}");
        assert_eq!(snapshot(s.driver.as_ref(), &s.session), before);
        // Versioning a tag the destinations do not lie in.
        let mut o = opts(v0);
        o.tag = Some(tag::id("update-some-other-tag").unwrap());
        let e = update::update(&s.session, &s.pool, &mut on_host(&s.new), &o).unwrap_err();
        assert!(e.to_string().contains("lie in other tags"), "{e}");
        assert_eq!(snapshot(s.driver.as_ref(), &s.session), before);
        // Version 0 does not exist.
        let e = update::update(&s.session, &s.pool, &mut on_host(&s.new), &opts(0)).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
    });
}

#[test]
fn a_partial_update_with_allow_missing_keeps_the_rest() {
    on_each_backend("a_partial_update", |b| {
        let s = setup(b, &unique("partial", b), &SMALL, "llama", None);
        let before = snapshot(s.driver.as_ref(), &s.session);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let part: Tensors = s
            .new
            .iter()
            .filter(|(n, _)| n.starts_with("model.layers.1."))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        let mut o = opts(v0);
        o.plan.allow_missing = true;
        update::update(&s.session, &s.pool, &mut on_host(&part), &o).unwrap();
        let got = snapshot(s.driver.as_ref(), &s.session);
        for (name, bytes) in &got {
            let want = if name.starts_with("model.layers.1.") {
                &s.want[name]
            } else {
                &before[name]
            };
            assert!(bytes == want, "`{name}`");
        }
    });
}

#[test]
fn device_faults_roll_forward_or_mark_the_tag_torn() {
    // Fault injection is the host backend's.
    on_each_backend("device_faults_roll_forward", |b| {
        let Some(h) = b.host() else { return };
        let s = setup(b, &unique("faults", b), &SMALL, "llama", None);
        let (_seg, mut src) = on_device(&s.driver, &s.new);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        // A copy fails midway: the retry finishes the whole update.
        h.fail_nth(FaultOp::CopyDtod, 9);
        let r = update::update(&s.session, &s.pool, &mut src, &opts(v0)).unwrap();
        assert!(r.retried);
        assert_eq!(r.version, v0 + 1);
        check_all_new(&s);
        // Staged: a failure while filling the scratch leaves the destinations as they were.
        let (_seg2, mut back) = on_device(&s.driver, &generate(&SMALL, Dtype::Bf16));
        let before = snapshot(s.driver.as_ref(), &s.session);
        let mut o = opts(v0 + 1);
        o.staging = Staging::Always;
        h.fail_nth(FaultOp::CopyDtod, 5);
        let e = update::update(&s.session, &s.pool, &mut back, &o).unwrap_err();
        assert_eq!(e.status(), Status::DriverError, "{e}");
        assert_eq!(snapshot(s.driver.as_ref(), &s.session), before);
        assert_eq!(s.pool.tag_version(s.tag).unwrap(), v0 + 1);
        h.clear_faults();
        // A device that fails every copy: torn, reported, version kept.
        h.fail_always(FaultOp::CopyDtod);
        let e = update::update(&s.session, &s.pool, &mut back, &opts(v0 + 1)).unwrap_err();
        h.clear_faults();
        assert_eq!(e.status(), Status::UpdateTorn, "{e}");
        assert!(s.pool.tag_torn(s.tag).unwrap());
        assert_eq!(s.pool.tag_version(s.tag).unwrap(), v0 + 1);
        // A whole update repairs it.
        update::update(&s.session, &s.pool, &mut src, &opts(v0 + 1)).unwrap();
        assert!(!s.pool.tag_torn(s.tag).unwrap());
        check_all_new(&s);
    });
}

#[test]
fn reload_after_an_update_brings_the_update_back() {
    on_each_backend("reload_after_an_update", |b| {
        let s = setup(b, &unique("reload", b), &SMALL, "llama", None);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let (_seg, mut src) = on_device(&s.driver, &s.new);
        update::update(&s.session, &s.pool, &mut src, &opts(v0)).unwrap();
        let cycle = s.pool.sleep(&[(s.tag, Policy::Reload)]).unwrap();
        // The update named what it wrote: nothing was left for the hashes to find.
        assert_eq!(cycle[0].report.changed_bytes, 0);
        assert!(cycle[0].report.copied_bytes >= s.want.values().map(|v| v.len() as u64).sum());
        s.pool.wake(&[s.tag]).unwrap();
        check_all_new(&s);
        assert_eq!(s.pool.tag_version(s.tag).unwrap(), v0 + 1);
    });
}

#[test]
fn one_update_of_a_tag_at_a_time_and_no_sleep_during_it() {
    on_each_backend("one_update_at_a_time", |b| {
        let s = setup(b, &unique("busy", b), &SMALL, "llama", None);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let ticket = s.pool.begin_update(s.tag, v0).unwrap();
        let e = update::update(&s.session, &s.pool, &mut on_host(&s.new), &opts(v0)).unwrap_err();
        assert_eq!(e.status(), Status::InvalidState, "{e}");
        drop(ticket);
        update::update(&s.session, &s.pool, &mut on_host(&s.new), &opts(v0)).unwrap();
        // An asleep tag is refused before anything moves.
        s.pool.sleep(&[(s.tag, Policy::Offload)]).unwrap();
        let e =
            update::update(&s.session, &s.pool, &mut on_host(&s.new), &opts(v0 + 1)).unwrap_err();
        assert_eq!(e.status(), Status::InvalidState, "{e}");
        s.pool.wake(&[s.tag]).unwrap();
        check_all_new(&s);
    });
}

#[test]
fn importers_see_the_version_an_update_produces() {
    on_each_backend("importers_see_the_version", |b| {
        if !b.driver.shareable() {
            common::backend::skip("importers_see_the_version", "memory not created shareable");
            return;
        }
        let s = setup(b, &unique("importer", b), &SMALL, "llama", None);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.sock");
        let server = Server::start(
            s.pool.clone(),
            s.tag,
            s.session.destinations(),
            &path,
            ServeOptions::default(),
        )
        .unwrap();
        let att = Attachment::attach(b.driver.clone(), &path, &AttachOptions::default()).unwrap();
        assert_eq!(att.version().unwrap(), v0);
        let (_seg, mut src) = on_device(&s.driver, &s.new);
        let r = update::update(&s.session, &s.pool, &mut src, &opts(v0)).unwrap();
        assert_eq!(server.version(), r.version);
        // The notice travels over the socket.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while att.version().unwrap() != r.version {
            assert!(
                std::time::Instant::now() < deadline,
                "the importer never saw the update"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // What the importer reads is the update.
        let name = "model.layers.0.self_attn.qkv_proj.weight";
        let t = att.tensor(name).unwrap();
        let mut got = vec![0u8; s.want[name].len()];
        att.read(t.ptr, &mut got).unwrap();
        assert!(got == s.want[name]);
        // A publish moves the same number.
        assert_eq!(server.publish().unwrap(), r.version + 1);
        assert_eq!(s.pool.tag_version(s.tag).unwrap(), r.version + 1);
        drop(att);
        drop(server);
    });
}

#[test]
fn a_version_ticket_moves_the_version_once_and_only_from_its_base() {
    let pool = Pool::new(host(), PoolConfig::default()).unwrap();
    let t = tag::id("update-ticket").unwrap();
    assert_eq!(pool.tag_version(t).unwrap(), 1);
    let ticket = pool.begin_update(t, 1).unwrap();
    assert_eq!((ticket.tag(), ticket.base()), (t, 1));
    assert!(matches!(
        pool.begin_update(t, 1),
        Err(Error::InvalidState(_))
    ));
    assert!(matches!(pool.publish(t), Err(Error::InvalidState(_))));
    assert_eq!(ticket.commit(), 2);
    let e = pool.begin_update(t, 1).unwrap_err();
    assert!(
        matches!(
            e,
            Error::VersionMismatch {
                current: 2,
                expected: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("update-ticket"), "{e}");
    drop(pool.begin_update(t, 2).unwrap());
    assert_eq!(pool.tag_version(t).unwrap(), 2);
    pool.begin_update(t, 2).unwrap().tear();
    assert!(pool.tag_torn(t).unwrap());
    assert_eq!(pool.tag_version(t).unwrap(), 2);
    assert_eq!(pool.publish(t).unwrap(), 3);
    // Another pool (another device) versions its own.
    let other = Pool::new(host(), PoolConfig::default()).unwrap();
    assert_eq!(other.tag_version(t).unwrap(), 1);
    assert!(pool.tag_version(tag::TagId(u32::MAX)).is_err());
}

#[test]
fn the_kept_plan_follows_the_sessions_rules_and_destinations() {
    on_each_backend("the_kept_plan_follows", |b| {
        let s = setup(b, &unique("kept-plan", b), &SMALL, "llama", None);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let mut src = on_host(&s.new);
        update::update(&s.session, &s.pool, &mut src, &opts(v0)).unwrap();
        // A destination registered since: the next update must plan again and miss it.
        let extra = s.pool.alloc_tagged(64, s.tag).unwrap();
        s.session
            .register("model.extra.weight", extra.ptr, Dtype::Bf16, &[32])
            .unwrap();
        let e = update::update(&s.session, &s.pool, &mut src, &opts(v0 + 1)).unwrap_err();
        assert!(e.to_string().contains("model.extra.weight"), "{e}");
        // Rules that skip a tensor: planned again, that tensor now unexpected nowhere.
        let mut rules = s.session.rules();
        rules.rules.insert(
            0,
            vmmweights::loader::Rule {
                pattern: r"model\.norm\.weight".into(),
                skip: true,
                to: None,
                fuse: None,
                shard: None,
                pad: None,
            },
        );
        s.session.set_rules(rules).unwrap();
        let mut o = opts(v0 + 1);
        o.plan.allow_missing = true;
        let r = update::update(&s.session, &s.pool, &mut src, &o).unwrap();
        assert_eq!(r.destinations as usize, s.session.destination_count() - 2);
    });
}

/// A source that hands over whatever pieces it was given, and on its first
/// `next` runs `during` (to try a sleep while the update holds the tag).
struct Hostile<'a> {
    manifest: Vec<SourceTensor>,
    batches: Vec<Batch>,
    during: Option<Box<dyn FnMut() + 'a>>,
    released: usize,
}

// SAFETY: every piece points into `DATA`, a static buffer, or is refused
// by the update before any copy (the point of these tests).
unsafe impl Source for Hostile<'_> {
    fn manifest(&self) -> &[SourceTensor] {
        &self.manifest
    }

    fn next(&mut self) -> vmmweights::Result<Option<Batch>> {
        if let Some(mut f) = self.during.take() {
            f();
        }
        Ok(if self.batches.is_empty() {
            None
        } else {
            Some(self.batches.remove(0))
        })
    }

    fn release(&mut self, _id: u64) -> vmmweights::Result<()> {
        self.released += 1;
        Ok(())
    }
}

static DATA: [u8; 1 << 16] = [0x5A; 1 << 16];

#[test]
fn hostile_pieces_are_refused_and_write_nothing() {
    on_each_backend("hostile_pieces_are_refused", |b| {
        let s = setup(b, &unique("hostile", b), &SMALL, "llama", None);
        let before = snapshot(s.driver.as_ref(), &s.session);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let manifest: Vec<SourceTensor> = s
            .new
            .iter()
            .map(|(n, (sh, _))| SourceTensor {
                name: n.clone(),
                dtype: Dtype::Bf16,
                shape: sh.clone(),
            })
            .collect();
        let norm = manifest
            .iter()
            .position(|t| t.name == "model.norm.weight")
            .unwrap();
        let at = Bytes::Host(DATA.as_ptr());
        let piece = |tensor, offset, len| Piece {
            tensor,
            offset,
            len,
            at,
        };
        for (what, pieces, needle) in [
            (
                "a tensor the manifest lacks",
                vec![piece(9999, 0, 4)],
                "names tensor #9999",
            ),
            (
                "past the tensor's end",
                vec![piece(norm, 100, 1000)],
                "run past",
            ),
            (
                "an offset that overflows",
                vec![piece(norm, u64::MAX - 1, 4)],
                "run past",
            ),
            (
                "a byte twice",
                vec![piece(norm, 0, 64), piece(norm, 32, 64)],
                "overlap",
            ),
            ("short", vec![piece(norm, 0, 64)], "ended before delivering"),
        ] {
            for staged in [false, true] {
                let mut src = Hostile {
                    manifest: manifest.clone(),
                    batches: vec![Batch {
                        id: 7,
                        pieces: pieces.clone(),
                    }],
                    during: None,
                    released: 0,
                };
                let mut o = opts(v0);
                if staged {
                    o.staging = Staging::Always;
                }
                let e = update::update(&s.session, &s.pool, &mut src, &o).unwrap_err();
                assert_eq!(e.status(), Status::UpdateSource, "{what}: {e}");
                assert!(e.to_string().contains(needle), "{what}: {e}");
                assert_eq!(src.released, 1, "{what}: the batch handed out is released");
                assert_eq!(snapshot(s.driver.as_ref(), &s.session), before, "{what}");
                assert_eq!(s.pool.tag_version(s.tag).unwrap(), v0);
            }
        }
        // A sleep of the tag while the update holds it is refused.
        let mut slept = None;
        let mut src = Hostile {
            manifest: manifest.clone(),
            batches: vec![],
            during: Some(Box::new(|| {
                slept = Some(s.pool.sleep(&[(s.tag, Policy::Offload)]).map(|_| ()));
            })),
            released: 0,
        };
        let e = update::update(&s.session, &s.pool, &mut src, &opts(v0)).unwrap_err();
        assert_eq!(e.status(), Status::UpdateSource, "{e}");
        drop(src);
        let slept = slept.expect("the source ran").unwrap_err();
        assert_eq!(slept.status(), Status::LoadInProgress, "{slept}");
        assert!(!s.pool.is_tag_asleep(s.tag));
    });
}

#[test]
fn concurrent_updates_of_one_tag_let_one_through() {
    on_each_backend("concurrent_updates_of_one_tag", |b| {
        let s = setup(b, &unique("concurrent", b), &SMALL, "llama", None);
        let v0 = s.pool.tag_version(s.tag).unwrap();
        let outcomes: Vec<vmmweights::Result<u64>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    sc.spawn(|| {
                        let mut src = on_host(&s.new);
                        update::update(&s.session, &s.pool, &mut src, &opts(v0)).map(|r| r.version)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<_> = outcomes.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(won, vec![&(v0 + 1)], "exactly one update moves the version");
        for e in outcomes.iter().filter_map(|r| r.as_ref().err()) {
            assert!(
                matches!(e.status(), Status::VersionMismatch | Status::InvalidState),
                "{e}"
            );
        }
        check_all_new(&s);
    });
}

#[test]
fn an_update_without_a_session_versions_the_tag_it_names() {
    // Destinations of the caller's own (outside any pool, declared), rules
    // and registry given directly: the tag to version must be named.
    on_each_backend("an_update_without_a_session", |b| {
        let s = setup(b, &unique("no-session", b), &SMALL, "llama", None);
        let rules = s.session.rules();
        let ckpt = vmmweights::loader::Checkpoint::open(s._dir.path()).unwrap();
        let specs = vmmweights::loader::Plan::destinations(&ckpt, &rules).unwrap();
        let total: usize = specs.iter().map(|x| x.bytes().div_ceil(256) * 256).sum();
        let seg = Segment::allocate(b.driver.clone(), total, 0).unwrap();
        let mut reg = vmmweights::loader::Registry::new();
        reg.declare_foreign(seg.ptr(), seg.reserved() as u64)
            .unwrap();
        let mut at = seg.ptr();
        for x in &specs {
            reg.register(&x.name, at, x.dtype, &x.shape).unwrap();
            at += (x.bytes().div_ceil(256) * 256) as u64;
        }
        let t = tag::id(&unique("no-session-version", b)).unwrap();
        let mut src = on_host(&s.new);
        let e = update::update_registry(&s.pool, &rules, &reg, &mut src, &opts(1)).unwrap_err();
        assert!(e.to_string().contains("outside the pool"), "{e}");
        let mut o = opts(s.pool.tag_version(t).unwrap());
        o.tag = Some(t);
        let r = update::update_registry(&s.pool, &rules, &reg, &mut src, &o).unwrap();
        assert_eq!((r.tag, r.version), (t, 2));
        for d in reg.iter() {
            assert!(
                read(s.driver.as_ref(), d.ptr, d.bytes()) == s.want[&d.name],
                "`{}`",
                d.name
            );
        }
    });
}
