//! The executed plan: what a load wrote and from where, kept so sleep's
//! Reload policy can restore the bytes from the checkpoint instead of keeping
//! a host backup.

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::checkpoint::Checkpoint;
use super::copy::{self, clip_rows, sub_extent, Control, CopyOptions, CopyStats, Strategy};
use super::plan::{Extent, Fill, Plan};
use super::read_error::name_tensor;
use crate::driver::{DevicePtr, Driver};
use crate::error::{Error, Result};
use crate::sleep::reload::ReloadSource;

/// A finished load: the checkpoint (files kept open and mapped), the plan, and
/// the statistics of the copy.
#[derive(Debug)]
pub struct ExecutedPlan {
    ckpt: Arc<Checkpoint>,
    plan: Plan,
    copy: CopyOptions,
    /// Statistics of the load.
    pub stats: CopyStats,
    driver: Option<Arc<dyn Driver>>,
    last_replay: Mutex<Option<CopyStats>>,
    pins: Mutex<PinState>,
    /// One checksum per plan extent of the source bytes loaded, when the load
    /// asked for the content check ([`crate::loader::LoadOptions::reload_check`]).
    checksums: Option<Vec<u64>>,
}

/// The checkpoint's page cache registered with the driver for Reload: after a
/// Reload sleep the spans the plan reads are pinned in the background, so the
/// next wake DMAs straight from the page cache (no staging copy, one memory
/// pass) at the link's rate. They stay pinned until the plan is dropped (a
/// newer load superseding it, or the pool going away).
#[derive(Debug, Default)]
enum PinState {
    #[default]
    None,
    Pinning(JoinHandle<Result<Pins>>),
    Pinned(Pins),
    /// Pinning failed (e.g. the driver refused the registration): replays stage.
    Failed(String),
}

/// Registered spans (address, length) of the checkpoint's mappings.
#[derive(Debug)]
struct Pins {
    driver: Arc<dyn Driver>,
    spans: Vec<(usize, usize)>,
    /// Keeps the mappings alive as long as they are registered.
    _ckpt: Arc<Checkpoint>,
}

impl Drop for Pins {
    fn drop(&mut self) {
        for &(p, _) in &self.spans {
            // SAFETY: registered by `pin_spans`; no replay runs (the plan, which
            // serializes replays through `pins`, is being dropped or replaced).
            let _ = unsafe { self.driver.host_unregister(p as *mut u8) };
        }
    }
}

/// Register every span; on a failure unregister the ones done.
fn pin_spans(
    driver: Arc<dyn Driver>,
    ckpt: Arc<Checkpoint>,
    spans: Vec<(usize, usize)>,
) -> Result<Pins> {
    let mut pins = Pins {
        driver,
        spans: Vec::with_capacity(spans.len()),
        _ckpt: ckpt,
    };
    for (p, len) in spans {
        // SAFETY: the span lies inside a shard's read-only mapping (page-aligned,
        // clamped to its page-rounded length), which `_ckpt` keeps alive until
        // `Pins` unregisters it.
        unsafe { pins.driver.host_register(p as *mut u8, len, true)? };
        pins.spans.push((p, len));
    }
    Ok(pins)
}

impl ExecutedPlan {
    pub(crate) fn new(
        ckpt: Arc<Checkpoint>,
        plan: Plan,
        copy: CopyOptions,
        stats: CopyStats,
    ) -> Self {
        ExecutedPlan {
            ckpt,
            plan,
            copy,
            stats,
            driver: None,
            last_replay: Mutex::new(None),
            pins: Mutex::new(PinState::None),
            checksums: None,
        }
    }

    /// Keep a checksum of every extent's source bytes, read back from the
    /// files now, so each Reload wake can prove the files still hold them.
    pub(crate) fn with_checksums(mut self) -> Result<Self> {
        let sums = self
            .plan
            .extents
            .iter()
            .map(|e| {
                super::checksum::extent(
                    &self.ckpt.shards[e.shard as usize],
                    e,
                    self.driver.as_deref(),
                )
            })
            .collect::<Result<Vec<_>>>()
            .map_err(|e| name_tensor(e, &self.plan.sources))?;
        self.checksums = Some(sums);
        Ok(self)
    }

    /// True when the load kept content checksums for Reload.
    pub fn has_checksums(&self) -> bool {
        self.checksums.is_some()
    }

    /// Keep the driver the load ran on, for [`ReloadSource::reload`] (which needs
    /// an `Arc` for its conversion scratch). Set by [`crate::loader::load`].
    pub(crate) fn with_driver(mut self, d: Arc<dyn Driver>) -> Self {
        self.driver = Some(d);
        self
    }

    /// The copy options a Reload replay uses: the load's tuning, but always
    /// through the staging ring (`direct` and `simple` loads replay as `auto`),
    /// which a staged load left pinned and cached, so a wake runs at the link's
    /// rate. A replay that finds the checkpoint gone from the page cache reads
    /// it with large slots (disk-bound anyway) and pins a larger ring for them.
    pub fn replay_options(&self) -> CopyOptions {
        let strategy = match self.copy.strategy {
            Strategy::Direct | Strategy::Simple => Strategy::Auto,
            s => s,
        };
        CopyOptions {
            strategy,
            ..self.copy
        }
    }

    fn pins(&self) -> MutexGuard<'_, PinState> {
        self.pins.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The page-aligned spans of each shard's mapping that the plan reads.
    fn source_spans(&self) -> Vec<(usize, usize)> {
        const PAGE: u64 = 4096;
        let mut per_shard: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
        for e in &self.plan.extents {
            // A packed shard's extents read the frames that hold their bytes.
            let end = e.src + (e.height - 1) * e.src_pitch + e.width;
            let (lo, hi) = self
                .ckpt
                .shards
                .get(e.shard as usize)
                .and_then(|sh| sh.file_range(e.src, end))
                .unwrap_or((e.src, end));
            let lo = lo / PAGE * PAGE;
            let hi = hi.div_ceil(PAGE) * PAGE;
            let r = per_shard.entry(e.shard).or_insert((lo, hi));
            r.0 = r.0.min(lo);
            r.1 = r.1.max(hi);
        }
        per_shard
            .into_iter()
            .filter_map(|(shard, (lo, hi))| {
                let sh = self.ckpt.shards.get(shard as usize)?;
                sh.map.as_ref()?;
                let hi = hi.min(sh.len.div_ceil(PAGE) * PAGE);
                (lo < hi).then(|| (sh.ptr(lo) as usize, (hi - lo) as usize))
            })
            .collect()
    }

    /// Bytes of the checkpoint's page cache registered for replays (0 while
    /// pinning runs or when it was never started), or why pinning failed.
    pub fn pinned_source_bytes(&self) -> std::result::Result<u64, String> {
        let mut st = self.pins();
        Self::settle(&mut st, false);
        match &*st {
            PinState::Pinned(p) => Ok(p.spans.iter().map(|&(_, l)| l as u64).sum()),
            PinState::Failed(why) => Err(why.clone()),
            _ => Ok(0),
        }
    }

    /// Turn a finished (or, with `wait`, any) pinning thread into its result.
    fn settle(st: &mut PinState, wait: bool) {
        let done = match st {
            PinState::Pinning(h) => wait || h.is_finished(),
            _ => false,
        };
        if done {
            if let PinState::Pinning(h) = std::mem::take(st) {
                *st = match h.join() {
                    Ok(Ok(p)) => PinState::Pinned(p),
                    Ok(Err(e)) => PinState::Failed(e.to_string()),
                    Err(_) => PinState::Failed("pinning thread panicked".into()),
                };
            }
        }
    }

    /// Statistics of the latest Reload replay (None before the first).
    pub fn last_replay(&self) -> Option<CopyStats> {
        *self.last_replay.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The plan that was executed.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The checkpoint it read.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.ckpt
    }

    /// The extents and fills of the plan clipped to device `ranges`.
    pub fn clipped(&self, ranges: &[(DevicePtr, usize)]) -> (Vec<Extent>, Vec<Fill>) {
        let mut ex = Vec::new();
        let mut fills = Vec::new();
        for &(lo, len) in ranges {
            let hi = lo + len as u64;
            for e in &self.plan.extents {
                let (num, den, elem) = match e.convert {
                    Some((f, t)) => (f.size() as u64, t.size() as u64, t.size() as u64),
                    None => (1, 1, 1),
                };
                // Cut converted rows on destination element boundaries (outward).
                for mut seg in clip_rows(e.dst, e.dst_pitch, e.dst_width(), e.height, lo, hi) {
                    if let Some((a, b)) = seg.bytes.as_mut() {
                        *a = *a / elem * elem;
                        *b = b.div_ceil(elem) * elem;
                    }
                    ex.push(sub_extent(e, seg, num, den));
                }
            }
            for f in &self.plan.fills {
                let (a, b) = (f.dst.max(lo), (f.dst + f.len).min(hi));
                if a < b {
                    fills.push(Fill { dst: a, len: b - a });
                }
            }
        }
        ex.sort_by_key(|e| (e.shard, e.src));
        (ex, fills)
    }
}

impl ReloadSource for ExecutedPlan {
    /// Every shard's identity, size and modification time (always), then,
    /// when the load kept them, every extent's checksum, read with `pread`
    /// (a file shrunk meanwhile gives an error, never a fault).
    fn check(&self) -> Result<()> {
        self.ckpt.check_unchanged()?;
        if let Some(sums) = &self.checksums {
            for (e, &want) in self.plan.extents.iter().zip(sums) {
                let shard = &self.ckpt.shards[e.shard as usize];
                let got = super::checksum::extent(shard, e, self.driver.as_deref())
                    .map_err(|err| name_tensor(err, &self.plan.sources))?;
                if got != want {
                    return Err(Error::checkpoint(
                        &shard.path,
                        None,
                        format!(
                            "bytes {}..{} were rewritten since they were loaded (checksum {want:#018x}, now {got:#018x}), though size and mtime did not change: nothing was restored; forget the tag's reload sources, wake it, and load again",
                            e.src,
                            e.src + (e.height - 1) * e.src_pitch + e.width
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Unpin the checkpoint's page cache (the mappings go with the plan).
    /// Waits for a replay running now; a pinning still running finishes and
    /// is undone on a thread of its own.
    fn retire(&self) {
        let old = std::mem::take(&mut *self.pins());
        if let PinState::Pinning(h) = old {
            std::thread::spawn(move || drop(h.join()));
        }
    }

    fn reload(&self, driver: &dyn Driver, ranges: &[(DevicePtr, usize)]) -> Result<u64> {
        let Some(d) = self.driver.clone() else {
            return Err(Error::InvalidState(
                "executed plan has no driver (not produced by loader::load)".into(),
            ));
        };
        if !std::ptr::addr_eq(Arc::as_ptr(&d), driver as *const dyn Driver) {
            return Err(Error::InvalidArgument(
                "reload on a different driver than the one the checkpoint was loaded with".into(),
            ));
        }
        // The engine checked before mapping; checked again right before the
        // mapping is read, for callers that replay directly.
        self.ckpt.check_unchanged()?;
        let (ex, fills) = self.clipped(ranges);
        // Hold the pin state through the replay, so the registration cannot be
        // dropped under it. DMA from the pinned page cache when pinning is done;
        // stage otherwise (never wait for a pinning still running).
        let mut pins = self.pins();
        Self::settle(&mut pins, false);
        let mut opts = self.replay_options();
        if matches!(*pins, PinState::Pinned(_)) {
            opts.strategy = Strategy::Registered;
        }
        let stats = copy::execute(
            &d,
            &self.ckpt.shards,
            &ex,
            &fills,
            &opts,
            &Control::default(),
        )
        .map_err(|e| name_tensor(e, &self.plan.sources))?;
        drop(pins);
        *self.last_replay.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
        Ok(ex.iter().map(Extent::dst_bytes).sum::<u64>() + stats.filled_bytes)
    }

    fn covered_ranges(&self) -> Vec<(DevicePtr, usize)> {
        let mut v: Vec<(u64, u64)> = Vec::new();
        for e in &self.plan.extents {
            let w = e.dst_width();
            if e.dst_pitch == w {
                v.push((e.dst, w * e.height));
            } else {
                v.extend((0..e.height).map(|r| (e.dst + r * e.dst_pitch, w)));
            }
        }
        v.extend(self.plan.fills.iter().map(|f| (f.dst, f.len)));
        v.sort_unstable();
        let mut out: Vec<(DevicePtr, usize)> = Vec::new();
        for (a, len) in v {
            match out.last_mut() {
                Some((s, l)) if *s + *l as u64 >= a => {
                    *l = ((a + len).max(*s + *l as u64) - *s) as usize;
                }
                _ => out.push((a, len as usize)),
            }
        }
        out
    }

    fn pieces(&self) -> Vec<(DevicePtr, usize)> {
        // Each copy's span on the device (a strided one's rows and the gaps
        // between them: bytes of no piece drop out against the coverage).
        let extents = self.plan.extents.iter().map(|e| {
            let w = e.dst_width();
            let span = e.dst_pitch * e.height.saturating_sub(1) + w;
            (e.dst, span as usize)
        });
        let fills = self.plan.fills.iter().map(|f| (f.dst, f.len as usize));
        extents.chain(fills).filter(|&(_, l)| l > 0).collect()
    }

    fn prepare(&self) {
        let Some(d) = self.driver.clone() else {
            return;
        };
        let mut st = self.pins();
        if matches!(*st, PinState::None) {
            let spans = self.source_spans();
            let ckpt = self.ckpt.clone();
            *st = PinState::Pinning(std::thread::spawn(move || pin_spans(d, ckpt, spans)));
        }
    }

    fn wait_prepared(&self) {
        Self::settle(&mut self.pins(), true);
    }
}
