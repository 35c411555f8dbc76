//! A process's pools as one controlled object: every device the process
//! allocated on, slept and woken together.
//!
//! Sleep synchronizes every device first (through a [`DeviceSync`]: the
//! interposer's is the CUDA runtime's own `cudaDeviceSynchronize`, so work the
//! process queued on its own streams is done), then sleeps each device's
//! tags, the devices at once. Wake checks every device's room first (and
//! waits for it when asked, `room.rs`), wakes tag by tag, and when any tag
//! fails puts every tag it woke back to sleep with the policy it slept with:
//! the process stays asleep as a whole, every backup intact, and the answer
//! says why. One sleep or wake runs at a time; a second is refused at once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::protocol::{
    refusal, CycleAnswer, DeviceStatus, Phase, StatusAnswer, TagCycleAnswer, TagStatus, WirePolicy,
};
use super::room::{wait_for_room, wake_tag, Need};
use super::target::Controlled;
use crate::devices::threads::on_threads;
use crate::error::{Error, Result};
use crate::pool::{Pool, TagCycle};
use crate::sleep::Policy;
use crate::tag::{self, TagId};

/// Waits for the work a process queued on its devices.
pub trait DeviceSync: Send + Sync {
    /// Synchronize each of `devices` (all of them, in order); an error names
    /// the device and the call that failed.
    fn synchronize(&self, devices: &[i32]) -> Result<()>;
}

/// Where the pools come from (read at each request: devices appear as the
/// process first allocates on them).
pub type PoolSource = Box<dyn Fn() -> Vec<Arc<Pool>> + Send + Sync>;

/// The pools of a process, controlled as one. See the module docs.
pub struct ProcessPools {
    source: PoolSource,
    sync: Option<Box<dyn DeviceSync>>,
    busy: Mutex<Option<(Phase, Instant)>>,
    last: Mutex<Option<Value>>,
    slept_with: Mutex<HashMap<(i32, TagId), Policy>>,
}

impl std::fmt::Debug for ProcessPools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessPools").finish_non_exhaustive()
    }
}

/// Marks a sleep or wake running; clears the mark when dropped.
struct Running<'a>(&'a Mutex<Option<(Phase, Instant)>>);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// One device's share of a sleep or wake.
struct Step {
    pool: Arc<Pool>,
    tags: Vec<TagId>,
}

impl ProcessPools {
    /// The pools `source` gives, synchronized by `sync` before each sleep
    /// (`None`: by each pool's own driver, `cuCtxSynchronize` on CUDA).
    pub fn new(source: PoolSource, sync: Option<Box<dyn DeviceSync>>) -> ProcessPools {
        ProcessPools {
            source,
            sync,
            busy: Mutex::new(None),
            last: Mutex::new(None),
            slept_with: Mutex::new(HashMap::new()),
        }
    }

    /// The process-wide pools of `pool::registry` (`vmmw_pool_default`, the
    /// PyTorch allocator, the interposer's allocations).
    pub fn registry(sync: Option<Box<dyn DeviceSync>>) -> ProcessPools {
        ProcessPools::new(Box::new(crate::pool::registry::all_pools), sync)
    }

    fn pools(&self) -> Vec<Arc<Pool>> {
        let mut v = (self.source)();
        v.sort_by_key(|p| p.device());
        v
    }

    fn begin(&self, phase: Phase) -> Result<Running<'_>> {
        let mut b = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((running, since)) = *b {
            return Err(Error::InvalidState(format!(
                "a {} is running (for {:.3} s): ask again once it has answered",
                match running {
                    Phase::Waking => "wake",
                    _ => "sleep",
                },
                since.elapsed().as_secs_f64()
            )));
        }
        *b = Some((phase, Instant::now()));
        Ok(Running(&self.busy))
    }

    /// Where the process stands, read from the pools.
    pub fn phase(&self) -> Phase {
        if let Some((p, _)) = *self.busy.lock().unwrap_or_else(|p| p.into_inner()) {
            return p;
        }
        let any_asleep = self
            .pools()
            .iter()
            .any(|p| p.report().tags.iter().any(|t| t.asleep));
        if any_asleep {
            Phase::Asleep
        } else {
            Phase::Awake
        }
    }

    /// The last sleep or wake answer (or refusal).
    pub fn last(&self) -> Option<Value> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn remember(&self, r: &Result<CycleAnswer>) {
        let v = match r {
            Ok(a) => serde_json::to_value(a).unwrap_or(Value::Null),
            Err(e) => refusal(e),
        };
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
    }

    fn synchronize(&self, pools: &[Arc<Pool>]) -> Result<Vec<i32>> {
        let devices: Vec<i32> = pools.iter().map(|p| p.device()).collect();
        match &self.sync {
            Some(s) => s.synchronize(&devices)?,
            None => {
                for p in pools {
                    p.driver().synchronize().map_err(|e| {
                        e.with_context(&format!(" (synchronizing device {})", p.device()))
                    })?;
                }
            }
        }
        Ok(devices)
    }

    /// Which tags of each pool a request acts on: `names` (each must be
    /// known to some pool), else every tag `all` picks from a pool's report.
    fn steps(
        &self,
        pools: &[Arc<Pool>],
        names: Option<&[String]>,
        keep: impl Fn(&crate::report::TagUsage) -> bool,
    ) -> Result<Vec<Step>> {
        let reports: Vec<_> = pools.iter().map(|p| p.report()).collect();
        if let Some(names) = names {
            for n in names {
                if !reports.iter().any(|r| r.tags.iter().any(|t| &t.tag == n)) {
                    let mut known: Vec<String> = reports
                        .iter()
                        .flat_map(|r| r.tags.iter().map(|t| t.tag.clone()))
                        .collect();
                    known.sort();
                    known.dedup();
                    return Err(Error::UnknownTag(format!(
                        "`{}`: it holds no memory in this process (its tags: [{}]); nothing was changed",
                        n.escape_debug(),
                        known.join(", ")
                    )));
                }
            }
        }
        let mut steps = Vec::new();
        for (pool, report) in pools.iter().zip(&reports) {
            let tags: Vec<TagId> = report
                .tags
                .iter()
                .filter(|t| names.is_none_or(|ns| ns.iter().any(|n| n == &t.tag)))
                .filter(|t| keep(t))
                .filter_map(|t| tag::lookup(&t.tag))
                .collect();
            if !tags.is_empty() {
                steps.push(Step {
                    pool: pool.clone(),
                    tags,
                });
            }
        }
        Ok(steps)
    }

    fn run_sleep(&self, policy: WirePolicy, names: Option<&[String]>) -> Result<CycleAnswer> {
        let start = Instant::now();
        let pools = self.pools();
        let steps = self.steps(&pools, names, |_| true)?;
        if steps.is_empty() {
            return Err(Error::InvalidState(
                "no allocations yet (or every one freed): there is nothing to put to sleep".into(),
            ));
        }
        let t = Instant::now();
        let synced = self.synchronize(&pools).map_err(|e| {
            e.with_context("; nothing was put to sleep (the device may hold a fault of the process's own work)")
        })?;
        let sync_seconds = t.elapsed().as_secs_f64();
        let p = policy.policy();
        let results = on_threads(steps.len(), "sleep of one device", |k| {
            let items: Vec<(TagId, Policy)> = steps[k].tags.iter().map(|&t| (t, p)).collect();
            steps[k].pool.sleep(&items)
        });
        let mut tags = Vec::new();
        let mut failure = None;
        {
            let mut slept = self.slept_with.lock().unwrap_or_else(|p| p.into_inner());
            for (step, r) in steps.iter().zip(results) {
                match r {
                    Ok(cycles) => {
                        for c in &cycles {
                            slept.insert((step.pool.device(), c.tag), p);
                        }
                        tags.extend(cycles.iter().map(|c| cycle_answer(step.pool.device(), c)));
                    }
                    Err(e) if failure.is_none() => failure = Some((step.pool.device(), e)),
                    Err(_) => {}
                }
            }
        }
        if let Some((device, e)) = failure {
            let asleep = self.asleep_names(&pools);
            return Err(e.with_context(&format!(
                " (sleep of device {device}); asleep now: [{}]; sleep again to finish, or wake",
                asleep.join(", ")
            )));
        }
        Ok(CycleAnswer {
            ok: true,
            op: "sleep".into(),
            policy: Some(policy),
            seconds: start.elapsed().as_secs_f64(),
            sync_seconds,
            wait_seconds: 0.0,
            synced_devices: synced,
            bytes: tags.iter().map(|t| t.bytes).sum(),
            backup_bytes: tags.iter().map(|t| t.copied_bytes).sum(),
            tags,
        })
    }

    fn asleep_names(&self, pools: &[Arc<Pool>]) -> Vec<String> {
        pools
            .iter()
            .flat_map(|p| {
                let d = p.device();
                p.report()
                    .tags
                    .into_iter()
                    .filter(|t| t.asleep)
                    .map(move |t| format!("device {d} `{}`", t.tag))
            })
            .collect()
    }

    fn run_wake(&self, names: Option<&[String]>, wait: Option<Duration>) -> Result<CycleAnswer> {
        let start = Instant::now();
        let pools = self.pools();
        let steps = self.steps(&pools, names, |t| t.asleep)?;
        // Tags whose every byte was discarded: the only ones a failed wake may
        // put back to sleep with Discard. The policy remembered for a tag can
        // be stale (a later sleep of an asleep tag leaves it as it was; a
        // failed sleep answers for no tag), so it never decides alone.
        let mut all_discarded: HashSet<(i32, TagId)> = HashSet::new();
        let needs: Vec<Need> = steps
            .iter()
            .map(|s| {
                let report = s.pool.report();
                let names: Vec<String> = s.tags.iter().map(|&t| tag::name_of(t)).collect();
                for t in report.tags.iter().filter(|t| names.contains(&t.tag)) {
                    if t.awake_bytes + t.offloaded_bytes + t.reloadable_bytes == 0 {
                        if let Some(id) = tag::lookup(&t.tag) {
                            all_discarded.insert((s.pool.device(), id));
                        }
                    }
                }
                let bytes = report
                    .tags
                    .iter()
                    .filter(|t| names.contains(&t.tag))
                    .map(|t| t.offloaded_bytes + t.discarded_bytes + t.reloadable_bytes)
                    .sum();
                Need {
                    pool: s.pool.clone(),
                    bytes,
                    tags: names.iter().map(|n| format!("`{n}`")).collect(),
                }
            })
            .collect();
        // A wake that waits maps chunk by chunk as room appears (each tag's
        // own wait, `wake_tag`); one that does not is refused before any tag
        // wakes when a device is short.
        let waited = match wait {
            Some(w) if !w.is_zero() => Duration::ZERO,
            _ => wait_for_room(&needs, None)?,
        };
        // One wait for the whole wake: each tag waits only what is left of it.
        let deadline = wait.map(|w| start + w);
        let results = on_threads(steps.len(), "wake of one device", |k| {
            let mut woken = Vec::new();
            for &t in &steps[k].tags {
                let wait_left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                match wake_tag(&steps[k].pool, t, wait_left) {
                    Ok(c) => woken.extend(c),
                    Err(e) => return Ok((woken, Some(e))),
                }
            }
            Ok((woken, None))
        });
        let mut tags = Vec::new();
        let mut woken_by_step = Vec::new();
        let mut failure = None;
        for (step, r) in steps.iter().zip(results) {
            let (woken, err) = r.unwrap_or_else(|e| (Vec::new(), Some(e)));
            if let (Some(e), None) = (err, &failure) {
                failure = Some((step.pool.device(), e));
            }
            tags.extend(woken.iter().map(|c| cycle_answer(step.pool.device(), c)));
            woken_by_step.push(woken);
        }
        if let Some((device, e)) = failure {
            let back = self.sleep_again(&steps, &woken_by_step, &all_discarded);
            return Err(e.with_context(&format!(" (wake of device {device}); {back}")));
        }
        Ok(CycleAnswer {
            ok: true,
            op: "wake".into(),
            policy: None,
            seconds: start.elapsed().as_secs_f64(),
            sync_seconds: 0.0,
            // The room checked first, or the waits of each tag's wake.
            wait_seconds: waited.as_secs_f64()
                + woken_by_step
                    .iter()
                    .flatten()
                    .map(|c| c.report.waited_seconds)
                    .sum::<f64>(),
            synced_devices: Vec::new(),
            bytes: tags.iter().map(|t| t.bytes).sum(),
            backup_bytes: tags.iter().map(|t| t.copied_bytes).sum(),
            tags,
        })
    }

    /// After a failed wake: sleep every tag this wake woke, with the policy
    /// it slept with; Discard only for a tag in `all_discarded` (nothing
    /// else held a byte), Offload for any other. Says what happened, for
    /// the refusal.
    fn sleep_again(
        &self,
        steps: &[Step],
        woken: &[Vec<TagCycle>],
        all_discarded: &HashSet<(i32, TagId)>,
    ) -> String {
        let slept = self
            .slept_with
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut failed = Vec::new();
        let mut count = 0;
        for (step, cycles) in steps.iter().zip(woken) {
            let d = step.pool.device();
            let items: Vec<(TagId, Policy)> = cycles
                .iter()
                .map(|c| {
                    let p = match slept.get(&(d, c.tag)).copied() {
                        Some(Policy::Discard) if !all_discarded.contains(&(d, c.tag)) => {
                            Policy::Offload
                        }
                        Some(p) => p,
                        None => Policy::Offload,
                    };
                    (c.tag, p)
                })
                .collect();
            if items.is_empty() {
                continue;
            }
            count += items.len();
            if let Err(e) = step.pool.sleep(&items) {
                failed.push(format!("device {d}: {e}"));
            }
        }
        if failed.is_empty() {
            format!(
                "every tag stays asleep with its backup ({count} woken before the failure were put back to sleep)"
            )
        } else {
            format!(
                "putting the {count} tags woken before the failure back to sleep failed too ({}); \
                 status shows which are awake",
                failed.join("; ")
            )
        }
    }

    fn run_status(&self) -> Result<StatusAnswer> {
        let pools = self.pools();
        let mut tags = Vec::new();
        let mut devices = Vec::new();
        let mut host_backup_bytes = 0;
        for p in &pools {
            let d = p.device();
            let r = p.report();
            let mem = p.driver().mem_info()?;
            devices.push(DeviceStatus {
                device: d,
                free: mem.free,
                total: mem.total,
                ours: r.total.tracked_bytes,
                cached: p.cached_bytes(),
            });
            host_backup_bytes += r.total.host_backup_bytes;
            tags.extend(r.tags.into_iter().map(|t| TagStatus {
                device: d,
                tag: t.tag,
                asleep: t.asleep,
                live_bytes: t.live_bytes,
                tracked_bytes: t.tracked_bytes,
                backup_bytes: t.host_backup_bytes,
            }));
        }
        let mut extra = Map::new();
        if tags.is_empty() {
            extra.insert("note".into(), Value::from("no allocations yet"));
        }
        Ok(StatusAnswer {
            ok: true,
            pid: std::process::id(),
            state: self.phase(),
            tags,
            devices,
            host_backup_bytes,
            last: self.last(),
            extra,
        })
    }
}

fn cycle_answer(device: i32, c: &TagCycle) -> TagCycleAnswer {
    TagCycleAnswer {
        device,
        tag: c.name.clone(),
        bytes: c.report.physical_bytes,
        copied_bytes: c.report.copied_bytes,
        seconds: c.report.seconds,
    }
}

impl Controlled for ProcessPools {
    fn status(&self) -> Result<StatusAnswer> {
        self.run_status()
    }

    fn sleep(&self, policy: WirePolicy, tags: Option<&[String]>) -> Result<CycleAnswer> {
        // Refused while another runs, without touching the last answer.
        let _running = self.begin(Phase::Sleeping)?;
        let r = self.run_sleep(policy, tags);
        self.remember(&r);
        r
    }

    fn wake(&self, tags: Option<&[String]>, wait: Option<Duration>) -> Result<CycleAnswer> {
        let _running = self.begin(Phase::Waking)?;
        let r = self.run_wake(tags, wait);
        self.remember(&r);
        r
    }
}
