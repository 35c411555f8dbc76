//! What `vmmw bench-load` adds for packed checkpoints (docs/PACKED.md): a
//! full-size bitwise check against the original (`--same-as`), and the
//! Reload wake from the checkpoint (`--reload-wake`), timed against the link.

use std::sync::Arc;
use std::time::Instant;

use vmmweights::loader::{
    load, Checkpoint, Control, LoadOptions, Plan, Registry, Rules, SegmentAllocator, Session,
};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Driver, Error, Pool, PoolConfig, Result};

/// Load `original` with `rules` into destinations of its own and compare
/// every destination of `ex` with its twin by a device hash of all its
/// bytes; returns the destinations compared, or an error naming the first
/// that differs.
pub fn same_as(
    d: &Arc<dyn Driver>,
    reg: &Registry,
    original: &std::path::Path,
    rules: &Rules,
) -> Result<usize> {
    let ckpt = Checkpoint::open(original)?;
    let specs = Plan::destinations(&ckpt, rules)?;
    let total: usize = specs.iter().map(|s| s.bytes().div_ceil(256) * 256).sum();
    let alloc = SegmentAllocator::new(d.clone(), total);
    let mut twin = Registry::new();
    twin.allocate(&specs, &alloc)?;
    load(
        d,
        ckpt,
        rules,
        &twin,
        &LoadOptions::default(),
        &Control::default(),
    )?;
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut names = Vec::new();
    for x in reg.iter() {
        let y = twin.get(&x.name).ok_or_else(|| {
            Error::InvalidState(format!(
                "same-as: the original has no destination `{}`",
                x.name
            ))
        })?;
        if x.bytes() != y.bytes() {
            return Err(Error::InvalidState(format!(
                "same-as: `{}` is {} bytes here, {} in the original",
                x.name,
                x.bytes(),
                y.bytes()
            )));
        }
        ours.push((x.ptr, x.bytes()));
        theirs.push((y.ptr, y.bytes()));
        names.push(x.name.clone());
    }
    d.synchronize()?;
    // SAFETY: every range is a loaded destination of this driver, the loads
    // have completed and nothing writes them meanwhile.
    let (a, b) = unsafe { (d.hash_ranges(&ours)?, d.hash_ranges(&theirs)?) };
    if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
        return Err(Error::InvalidState(format!(
            "same-as: destination `{}` differs from the original's load (hash {:#018x}, original {:#018x})",
            names[i], a[i], b[i]
        )));
    }
    Ok(a.len())
}

/// The Reload wake of `path`, `repeat` times: loaded into a pool under
/// `rules`, slept with Reload (the checkpoint's page cache pinned in the
/// background, waited for), woken; each wake checked by a device hash of
/// every loaded byte. Returns each wake's seconds and the bytes it placed.
pub fn reload_wake(
    d: &Arc<dyn Driver>,
    path: &std::path::Path,
    rules: &Rules,
    repeat: usize,
) -> Result<(Vec<f64>, u64)> {
    let pool = Pool::new(d.clone(), PoolConfig::default())?;
    let weights = tag::id("bench-reload-wake")?;
    let session = Session::open(path)?;
    session.set_rules(rules.clone())?;
    session.allocate(&pool, weights)?;
    session.load(&pool, None)?;
    let ranges: Vec<(u64, usize)> = session
        .destinations()
        .iter()
        .map(|x| (x.ptr, x.bytes()))
        .collect();
    let bytes: u64 = ranges.iter().map(|&(_, l)| l as u64).sum();
    // SAFETY: loaded, awake destinations; the load has completed.
    let want = unsafe { d.hash_ranges(&ranges) }?;
    let mut secs = Vec::new();
    for _ in 0..repeat.max(1) {
        pool.sleep(&[(weights, Policy::Reload)])?;
        pool.sleep_engine().wait_reload_prepared(weights);
        let t = Instant::now();
        let woke = pool.wake(&[weights])?;
        secs.push(t.elapsed().as_secs_f64());
        if woke[0].report.reloaded_bytes < bytes {
            return Err(Error::InvalidState(format!(
                "the wake reloaded {} of the {bytes} loaded bytes",
                woke[0].report.reloaded_bytes
            )));
        }
        // SAFETY: as above, after the wake.
        let got = unsafe { d.hash_ranges(&ranges) }?;
        if got != want {
            return Err(Error::InvalidState(
                "the Reload wake restored different bytes".into(),
            ));
        }
    }
    Ok((secs, bytes))
}
