//! The executed plan: what a load wrote and from where, kept so sleep's
//! Reload policy can restore the bytes from the checkpoint instead of keeping
//! a host backup.

use std::sync::{Arc, Mutex};

use super::checkpoint::Checkpoint;
use super::copy::{self, clip_rows, sub_extent, Control, CopyOptions, CopyStats, Strategy};
use super::plan::{Extent, Fill, Plan};
use crate::driver::{DevicePtr, Driver};
use crate::error::{Error, Result};
use crate::reload::ReloadSource;

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
        }
    }

    /// Keep the driver the load ran on, for [`ReloadSource::reload`] (which needs
    /// an `Arc` for its conversion scratch). Set by [`crate::loader::load`].
    pub(crate) fn with_driver(mut self, d: Arc<dyn Driver>) -> Self {
        self.driver = Some(d);
        self
    }

    /// The copy options a Reload replay uses: the load's tuning, but always
    /// through the staging ring (`direct` and `simple` loads replay as `auto`),
    /// which the load left pinned and cached, so a wake runs at the link's rate.
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
        let (ex, fills) = self.clipped(ranges);
        let stats = copy::execute(
            &d,
            &self.ckpt.shards,
            &ex,
            &fills,
            &self.replay_options(),
            &Control::default(),
        )?;
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
}
