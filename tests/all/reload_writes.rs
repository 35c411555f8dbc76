//! Reload never reverts a write: bytes changed after a load (weights updated
//! in place, a block reused by a caching allocator without our free, ranges
//! marked written) come back from a Reload sleep and wake as they were
//! written, not as the checkpoint holds them. Runs on the backend
//! `VMMW_BACKEND` selects (host in CI, cuda on the GPU machine).

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::loader::*;
use proptest::prelude::*;
use vmmweights::driver::fault::FaultOp;
use vmmweights::driver::sync_copy::copy_to_device;
use vmmweights::driver::testing::Testing;
use vmmweights::loader::*;
use vmmweights::sleep::Policy;
use vmmweights::{tag, BackendChoice, DevicePtr, Driver, Error, Pool, PoolConfig};

struct Setup {
    _dir: tempfile::TempDir,
    d: Arc<dyn Driver>,
    pool: Pool,
    tag: tag::TagId,
    reg: Registry,
    rules: Rules,
    /// A buffer of the tag the loader never writes (a model's own state).
    extra: DevicePtr,
}

const EXTRA: usize = 96 << 10;

fn setup(name: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let tensors = generate(&SMALL, Dtype::Bf16);
    write_sharded(dir.path(), &tensors, Dtype::Bf16, 2);
    let choice = BackendChoice::from_env().unwrap();
    let d = vmmweights::driver::open(choice, 0).unwrap().driver;
    let pool = Pool::new(d.clone(), PoolConfig::default()).unwrap();
    let t = tag::id(name).unwrap();
    let rules = Rules::preset("llama", None, SMALL.head_dim).unwrap();
    let mut reg = Registry::new();
    let extra = {
        let _scope = tag::scope(t).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        reg.allocate(&Plan::destinations(&ckpt, &rules).unwrap(), &pool)
            .unwrap();
        pool.alloc(EXTRA).unwrap().ptr
    };
    write(d.as_ref(), extra, &vec![0x3C; EXTRA]);
    let s = Setup {
        _dir: dir,
        d,
        pool,
        tag: t,
        reg,
        rules,
        extra,
    };
    s.load(s._dir.path());
    s
}

impl Setup {
    fn load(&self, path: &Path) {
        let ckpt = Checkpoint::open(path).unwrap();
        load_into_pool(
            &self.pool,
            ckpt,
            &self.rules,
            &self.reg,
            &LoadOptions::default(),
            &Control::default(),
        )
        .unwrap();
    }

    fn dest(&self, name: &str) -> (DevicePtr, usize) {
        let x = self.reg.get(name).unwrap();
        (x.ptr, x.bytes())
    }

    /// Every byte the tag's user can see: each destination and the extra buffer.
    fn snapshot(&self) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = self
            .reg
            .iter()
            .map(|x| read(self.d.as_ref(), x.ptr, x.bytes()))
            .collect();
        v.push(read(self.d.as_ref(), self.extra, EXTRA));
        v
    }

    /// Reload sleep then wake; the sleep's report.
    fn cycle(&self) -> vmmweights::sleep::CycleReport {
        let slept = self.pool.sleep(&[(self.tag, Policy::Reload)]).unwrap();
        assert_eq!(
            self.pool
                .report()
                .tag(&tag::name_of(self.tag))
                .unwrap()
                .tracked_bytes,
            0,
            "asleep: no device memory"
        );
        self.pool.wake(&[self.tag]).unwrap();
        slept[0].report.clone()
    }
}

fn write(d: &dyn Driver, ptr: DevicePtr, bytes: &[u8]) {
    // SAFETY: callers pass a range inside one live, awake block.
    unsafe { copy_to_device(d, ptr, bytes) }.unwrap();
}

#[test]
fn weights_updated_in_place_survive_a_reload_wake() {
    let s = setup("reload-writes-update");
    let loaded = s.snapshot();
    // An RL step: one tensor rewritten whole, one in part.
    let (q, qn) = s.dest("model.layers.0.self_attn.qkv_proj.weight");
    write(s.d.as_ref(), q, &vec![0x11; qn]);
    let (o, on) = s.dest("model.layers.1.self_attn.o_proj.weight");
    write(s.d.as_ref(), o + 100, &vec![0x22; on / 3]);
    let updated = s.snapshot();
    assert_ne!(updated, loaded);

    let r = s.cycle();
    assert!(
        r.changed_bytes >= qn as u64,
        "the rewritten tensor is kept in the backup: {r:?}"
    );
    assert_eq!(s.snapshot(), updated, "the wake restores the update");
    // The next cycle still restores the update (it stays in the backup).
    let r = s.cycle();
    assert_eq!(r.changed_bytes, 0, "nothing changed since the last sleep");
    assert_eq!(s.snapshot(), updated);
}

#[test]
fn a_block_reused_without_our_free_keeps_its_new_bytes() {
    // PyTorch's caching allocator hands a freed tensor's block to the next
    // tensor without telling us: to the pool it is the same live block, now
    // holding someone else's bytes.
    let s = setup("reload-writes-reuse");
    let (e, en) = s.dest("model.embed_tokens.weight");
    let fresh: Vec<u8> = (0..en).map(|i| (i * 7 % 253) as u8).collect();
    write(s.d.as_ref(), e, &fresh);
    let before = s.snapshot();
    s.cycle();
    assert_eq!(read(s.d.as_ref(), e, en), fresh);
    assert_eq!(s.snapshot(), before);
}

#[test]
fn a_block_freed_and_allocated_again_keeps_its_new_owner_bytes() {
    let s = setup("reload-writes-realloc");
    let (p, n) = s.dest("model.layers.1.mlp.down_proj.weight");
    s.pool.free(p).unwrap();
    let again = {
        let _scope = tag::scope(s.tag).unwrap();
        s.pool.alloc(n).unwrap()
    };
    write(s.d.as_ref(), again.ptr, &vec![0x55; n]);
    s.cycle();
    assert_eq!(read(s.d.as_ref(), again.ptr, n), vec![0x55; n]);
}

#[test]
fn marked_writes_are_kept_and_bad_marks_are_refused() {
    let s = setup("reload-writes-mark");
    let (g, gn) = s.dest("model.layers.0.mlp.gate_up_proj.weight");
    s.pool.mark_written(g, gn).unwrap();
    write(s.d.as_ref(), g, &vec![0x66; gn]);
    let before = s.snapshot();
    let r = s.cycle();
    assert_eq!(r.changed_bytes, 0, "marked bytes are no longer a source's");
    assert_eq!(s.snapshot(), before);
    assert!(!s
        .pool
        .reload_coverage(s.tag)
        .iter()
        .any(|&(a, l)| a < g + gn as u64 && g < a + l as u64));

    let e = s.pool.mark_written(0x10, 8).unwrap_err();
    assert!(matches!(e, Error::UnknownPointer { .. }), "{e}");
    let e = s.pool.mark_written(g, gn + 1 + (2 << 20)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    s.pool.sleep(&[(s.tag, Policy::Reload)]).unwrap();
    let e = s.pool.mark_written(g, gn).unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e}");
    s.pool.wake(&[s.tag]).unwrap();
    assert_eq!(s.snapshot(), before);
}

#[test]
fn a_new_load_makes_its_checkpoint_the_source_again() {
    let s = setup("reload-writes-reload");
    let (q, qn) = s.dest("model.layers.0.self_attn.qkv_proj.weight");
    write(s.d.as_ref(), q, &vec![0x11; qn]);
    s.cycle();
    // A new checkpoint (every value changed) loaded into the same tensors.
    let dir = tempfile::tempdir().unwrap();
    let mut tensors = generate(&SMALL, Dtype::Bf16);
    for (_, (_, b)) in tensors.iter_mut() {
        b.iter_mut().for_each(|x| *x = x.wrapping_add(1));
    }
    write_sharded(dir.path(), &tensors, Dtype::Bf16, 1);
    s.load(dir.path());
    let loaded = s.snapshot();
    let r = s.cycle();
    assert_eq!(r.changed_bytes, 0, "{r:?}");
    assert_eq!(s.snapshot(), loaded);
    let slept = s.pool.sleep(&[(s.tag, Policy::Reload)]).unwrap();
    let woke = s.pool.wake(&[s.tag]).unwrap();
    assert_eq!(slept[0].report.changed_bytes, 0);
    assert!(
        woke[0].report.reloaded_bytes >= qn as u64,
        "the rewritten tensor is the new checkpoint's again: {:?}",
        woke[0].report
    );
}

#[test]
fn a_failed_hash_fails_the_sleep_and_changes_nothing() {
    let s = setup("reload-writes-fault");
    let (q, qn) = s.dest("model.layers.0.self_attn.qkv_proj.weight");
    write(s.d.as_ref(), q, &vec![0x11; qn]);
    let before = s.snapshot();
    let coverage = s.pool.reload_coverage(s.tag);
    s.d.faults().unwrap().fail_nth(FaultOp::Hash, 1);
    let e = s.pool.sleep(&[(s.tag, Policy::Reload)]).unwrap_err();
    assert!(e.to_string().contains("hash"), "{e}");
    assert!(s.pool.asleep_tags().is_empty(), "nothing went to sleep");
    assert_eq!(s.pool.reload_coverage(s.tag), coverage);
    assert_eq!(s.snapshot(), before);
    s.cycle();
    assert_eq!(s.snapshot(), before);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random writes into loaded and unloaded bytes of the tag, then a Reload
    /// sleep and wake: every byte is as it was before the sleep.
    #[test]
    fn random_writes_survive_reload(writes in prop::collection::vec((0usize..1000, 0usize..1000, 1usize..20_000, any::<u8>()), 0..12)) {
        static SETUP: std::sync::OnceLock<std::sync::Mutex<Setup>> = std::sync::OnceLock::new();
        let s = SETUP
            .get_or_init(|| std::sync::Mutex::new(setup("reload-writes-random")))
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Each case starts from a fresh load.
        s.load(s._dir.path());
        let mut targets: Vec<(DevicePtr, usize)> =
            s.reg.iter().map(|x| (x.ptr, x.bytes())).collect();
        targets.push((s.extra, EXTRA));
        for (which, at, len, byte) in writes {
            let (p, n) = targets[which % targets.len()];
            let off = at * n / 1000;
            let len = len.min(n - off);
            write(s.d.as_ref(), p + off as u64, &vec![byte; len]);
        }
        let before = s.snapshot();
        s.cycle();
        prop_assert!(s.snapshot() == before);
    }
}

#[test]
fn device_hashes_equal_the_reference() {
    // On cuda this runs the kernel; a disagreement with the host reference
    // would make every Reload sleep keep (or, worse, trust) the wrong bytes.
    use vmmweights::driver::hash;
    let s = setup("reload-writes-hash");
    let n = 2 * hash::TILE_BYTES + 4096;
    let p = {
        let _scope = tag::scope(s.tag).unwrap();
        s.pool.alloc(n).unwrap().ptr
    };
    let bytes: Vec<u8> = (0..n)
        .map(|i| (hash::mix(i as u64, 9) >> 29) as u8)
        .collect();
    write(s.d.as_ref(), p, &bytes);
    let mut ranges = vec![(p, n), (p, 0), (p + 1, 7), (p + 3, n - 3), (p + 8, 9)];
    ranges.push((p + 5, hash::TILE_BYTES + 11)); // unaligned, over a tile edge
    for len in [1usize, 8, 15, 16, 17, 4095, 4096, 65_537, hash::TILE_BYTES] {
        ranges.push((p + (n - len) as u64, len));
    }
    // SAFETY: every range lies in one live, awake block; the write above is synchronous.
    let got = unsafe { s.d.hash_ranges(&ranges) }.unwrap();
    for (&(a, l), g) in ranges.iter().zip(got) {
        let off = (a - p) as usize;
        assert_eq!(
            g,
            hash::hash(&bytes[off..off + l]),
            "range +{off} of {l} bytes"
        );
    }
    // SAFETY: as above; no range at all is an empty answer.
    assert!(unsafe { s.d.hash_ranges(&[]) }.unwrap().is_empty());
}
