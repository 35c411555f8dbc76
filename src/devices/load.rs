//! One load that fills destinations on several devices of one host.
//!
//! Two modes:
//! - [`MultiMode::Replicas`]: every device gets all of the checkpoint (same
//!   rules, destinations of the same names and shapes). The destinations are
//!   cut into one share per device, contiguous in file order and about equal
//!   in bytes; each device loads its own share from host memory over its own
//!   link, then pulls every other share from the device that loaded it (peer
//!   copies, over NVLink on a GPU host). Host memory is read once in all.
//! - [`MultiMode::Ranks`]: each device has its own rules (tensor-parallel
//!   ranks: `tp_rank`/`tp_world` presets) and loads its own plan from host
//!   memory, all devices at once. A rank reads only its slices, so no byte is
//!   read twice unless ranks share it (replicated norms or kv heads).
//!
//! Every check (plans, matching destinations, peer paths and grants) happens
//! before any byte is written: such an error leaves every destination untouched.
//!
//! A device failing midway: the copy of one destination is cut into many
//! transfers, so a failure can stop one halfway. The load repairs it before
//! returning, so that on success every destination is fully written:
//! - Replicas: the failed device's share is loaded again from host memory by
//!   a healthy device, and the failed device pulls it over the peer link like
//!   any other share (its half-written destinations are overwritten whole).
//! - Ranks: the failed rank's plan is run once more on its device (a transient
//!   link error); a rank holds the only copy of its slices, so no peer can stand in.
//!
//! A failed pull is retried once from the same device.
//!
//! When the repair fails too (the device is lost to both its host link and
//! its peers) the load returns the error naming that device, and only that
//! device's destinations may be partly written: every destination on every
//! other device is fully written. [`MultiStats::recovered`] lists the devices
//! whose work was redone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::threads::on_threads;
use crate::driver::{DevicePtr, Driver, StreamId};
use crate::error::{Error, Result};
use crate::loader::copy::{self, Control, CopyStats};
use crate::loader::{Checkpoint, ExecutedPlan, Extent, Fill, LoadOptions, Plan, Registry, Rules};

/// How a multi-device load divides the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MultiMode {
    /// Every device gets all of it; shares are exchanged over peer copies.
    Replicas,
    /// Each device gets its own plan (tensor-parallel ranks).
    Ranks,
}

/// One device's part of a multi-device load.
#[derive(Debug, Clone, Copy)]
pub struct DeviceLoad<'a> {
    /// The device's driver.
    pub driver: &'a Arc<dyn Driver>,
    /// Its mapping rules (a rank's, or the same for every replica).
    pub rules: &'a Rules,
    /// Its destinations, in its memory.
    pub registry: &'a Registry,
}

/// What a multi-device load did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MultiStats {
    /// Devices, in the order given.
    pub devices: Vec<i32>,
    /// Host-to-device statistics per device (its share, or its rank's plan).
    pub per_device: Vec<CopyStats>,
    /// Source bytes read from host memory, over all devices.
    pub host_bytes: u64,
    /// Bytes moved between devices over peer copies.
    pub peer_bytes: u64,
    /// Device bytes written on all devices together (copies, fills, peer copies).
    pub delivered_bytes: u64,
    /// Seconds of the host phase (all devices at once).
    pub host_seconds: f64,
    /// Seconds of the peer exchange.
    pub peer_seconds: f64,
    /// Wall seconds of the whole load.
    pub seconds: f64,
    /// Devices whose share or plan failed and was redone.
    pub recovered: Vec<i32>,
}

impl MultiStats {
    /// Delivered bytes per second over all devices, in GB/s (10^9).
    pub fn aggregate_gbps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.delivered_bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

/// The result of a multi-device load: one executed plan per device (each can
/// replay its device's whole plan for sleep's Reload policy) and the figures.
#[derive(Debug)]
pub struct MultiLoaded {
    /// Per device, in the order given.
    pub plans: Vec<Arc<ExecutedPlan>>,
    /// What the load did.
    pub stats: MultiStats,
}

/// One destination of a replica load: its index in file order and bytes.
#[derive(Debug, Clone)]
struct Dest {
    name: String,
    bytes: usize,
}

/// Fill `devices`' destinations from `ckpt` (see the module docs).
pub fn load_multi(
    ckpt: Checkpoint,
    devices: &[DeviceLoad<'_>],
    mode: MultiMode,
    opts: &LoadOptions,
    ctl: &Control<'_>,
) -> Result<MultiLoaded> {
    let t0 = Instant::now();
    check_devices(devices)?;
    // Every device's plan at once (rule matching per tensor is the cost).
    let plans = on_threads(devices.len(), "a device's plan thread", |k| {
        let d = &devices[k];
        Plan::build(&ckpt, d.rules, d.registry, &opts.plan).map_err(|e| match e {
            Error::Plan(m) => Error::Plan(format!("device {}: {m}", d.driver.device())),
            e => e,
        })
    })
    .into_iter()
    .collect::<Result<Vec<Plan>>>()?;
    let ckpt = Arc::new(ckpt);
    let mut per_device_opts = *opts;
    per_device_opts.copy.threads = threads_per_device(opts, devices.len());
    let mut stats = MultiStats {
        devices: devices.iter().map(|d| d.driver.device()).collect(),
        ..Default::default()
    };
    match mode {
        MultiMode::Replicas => replicas(&ckpt, devices, &plans, &per_device_opts, ctl, &mut stats)?,
        MultiMode::Ranks => ranks(&ckpt, devices, &plans, &per_device_opts, ctl, &mut stats)?,
    }
    stats.seconds = t0.elapsed().as_secs_f64();
    if let Some(p) = ctl.progress {
        p(stats.host_bytes, stats.host_bytes);
    }
    let plans = plans
        .into_iter()
        .zip(devices)
        .zip(&stats.per_device)
        .map(|((plan, d), s)| {
            Arc::new(
                ExecutedPlan::new(ckpt.clone(), plan, opts.copy, *s).with_driver(d.driver.clone()),
            )
        })
        .collect();
    Ok(MultiLoaded { plans, stats })
}

pub(super) fn check_devices(devices: &[DeviceLoad<'_>]) -> Result<()> {
    if devices.is_empty() {
        return Err(Error::InvalidArgument(
            "a multi-device load needs at least one device".into(),
        ));
    }
    let kind = devices[0].driver.kind();
    for (i, d) in devices.iter().enumerate() {
        let dev = d.driver.device();
        if d.driver.kind() != kind {
            return Err(Error::InvalidArgument(format!(
                "device {dev} is on the {} backend, device {} on {}: one backend for all",
                d.driver.kind(),
                devices[0].driver.device(),
                kind
            )));
        }
        if devices[..i].iter().any(|o| o.driver.device() == dev) {
            return Err(Error::InvalidArgument(format!(
                "device {dev} is listed twice in a multi-device load"
            )));
        }
    }
    Ok(())
}

/// Worker threads each device's copy engine gets: the caller's count per
/// device when set, else the CPUs shared out (each device needs its own
/// workers to keep its link busy).
fn threads_per_device(opts: &LoadOptions, n: usize) -> usize {
    if opts.copy.threads > 0 {
        return opts.copy.threads;
    }
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(4);
    (cpus / n.max(1)).clamp(1, 16)
}

fn is_cancel(e: &Error) -> bool {
    matches!(e, Error::Cancelled { .. })
}

fn ranks(
    ckpt: &Checkpoint,
    devices: &[DeviceLoad<'_>],
    plans: &[Plan],
    opts: &LoadOptions,
    ctl: &Control<'_>,
    stats: &mut MultiStats,
) -> Result<()> {
    let cancel = ctl.cancel;
    let run = |k: usize| {
        let c = Control {
            progress: None,
            cancel,
        };
        copy::execute(
            devices[k].driver,
            &ckpt.shards,
            &plans[k].extents,
            &plans[k].fills,
            &opts.copy,
            &c,
        )
    };
    let t = Instant::now();
    let mut results = on_threads(devices.len(), "a device's load thread", run);
    for k in 0..devices.len() {
        match &results[k] {
            Err(e) if !is_cancel(e) => {
                // A rank holds the only copy of its slices: redo them on its device once.
                stats.recovered.push(devices[k].driver.device());
                results[k] = run(k).map_err(|e| lost(devices[k].driver.device(), e));
            }
            _ => {}
        }
    }
    for r in results {
        let s = r?;
        stats.host_bytes += s.bytes;
        stats.per_device.push(s);
    }
    stats.delivered_bytes = plans.iter().map(Plan::dst_bytes).sum();
    stats.host_seconds = t.elapsed().as_secs_f64();
    Ok(())
}

/// The error of a device that failed again when its work was redone: the
/// driver's error (status kept) with what that means for the destinations.
fn lost(device: i32, e: Error) -> Error {
    e.with_context(&format!(
        " (device {device}, in a multi-device load, failed again when its work was redone: \
         its destinations may be partly written; every other device's are complete)"
    ))
}

/// The share of each destination: destinations in file order of their first
/// extent, cut into `n` contiguous runs of about equal bytes.
fn cut_shares(plan: &Plan, registry: &Registry, n: usize) -> (Vec<Dest>, Vec<usize>) {
    let index = DestIndex::new(registry);
    let mut first: HashMap<usize, (u32, u64)> = HashMap::new();
    for e in &plan.extents {
        if let Some(i) = index.find(e.dst) {
            let key = (e.shard, e.src);
            first
                .entry(i)
                .and_modify(|k| *k = (*k).min(key))
                .or_insert(key);
        }
    }
    for f in &plan.fills {
        if let Some(i) = index.find(f.dst) {
            first.entry(i).or_insert((u32::MAX, 0));
        }
    }
    let mut order: Vec<usize> = first.keys().copied().collect();
    order.sort_by_key(|i| (first[i], *i));
    let dests: Vec<Dest> = order
        .iter()
        .map(|&i| Dest {
            name: index.names[i].clone(),
            bytes: index.ranges[i].1 as usize - index.ranges[i].0 as usize,
        })
        .collect();
    let total: usize = dests.iter().map(|d| d.bytes).sum();
    let mut share = Vec::with_capacity(dests.len());
    let mut done = 0usize;
    for d in &dests {
        // The share whose byte range holds this destination's middle.
        let mid = done + d.bytes / 2;
        let s = (mid * n).checked_div(total).unwrap_or(0).min(n - 1);
        share.push(s);
        done += d.bytes;
    }
    (dests, share)
}

/// Destinations of one registry by address, for finding which one an extent writes.
struct DestIndex {
    /// (start, end) sorted by start.
    ranges: Vec<(DevicePtr, DevicePtr)>,
    names: Vec<String>,
}

impl DestIndex {
    fn new(registry: &Registry) -> DestIndex {
        let mut v: Vec<(DevicePtr, DevicePtr, String)> = registry
            .iter()
            .map(|d| (d.ptr, d.ptr + d.bytes() as u64, d.name.clone()))
            .collect();
        v.sort();
        DestIndex {
            ranges: v.iter().map(|x| (x.0, x.1)).collect(),
            names: v.into_iter().map(|x| x.2).collect(),
        }
    }

    fn find(&self, ptr: DevicePtr) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.0 <= ptr);
        (i > 0 && ptr < self.ranges[i - 1].1).then(|| i - 1)
    }
}

/// The extents and fills of `plan` that write destinations of `names`.
fn share_work(plan: &Plan, registry: &Registry, names: &[&str]) -> (Vec<Extent>, Vec<Fill>) {
    let index = DestIndex::new(registry);
    let wanted: std::collections::HashSet<usize> = names
        .iter()
        .filter_map(|n| index.names.iter().position(|m| m == n))
        .collect();
    let keep = |p: DevicePtr| index.find(p).is_some_and(|i| wanted.contains(&i));
    (
        plan.extents
            .iter()
            .copied()
            .filter(|e| keep(e.dst))
            .collect(),
        plan.fills.iter().copied().filter(|f| keep(f.dst)).collect(),
    )
}

fn check_replicas(devices: &[DeviceLoad<'_>], dests: &[Dest]) -> Result<()> {
    let first = &devices[0];
    for d in &devices[1..] {
        if d.rules != first.rules {
            return Err(Error::InvalidArgument(format!(
                "replicas need the same rules on every device; device {} has rules different \
                 from device {} (use MultiMode::Ranks for tensor-parallel ranks)",
                d.driver.device(),
                first.driver.device()
            )));
        }
        for want in dests {
            let a = first.registry.get(&want.name);
            let b = d.registry.get(&want.name);
            let same =
                matches!((a, b), (Some(a), Some(b)) if a.dtype == b.dtype && a.shape == b.shape);
            if !same {
                return Err(Error::InvalidArgument(format!(
                    "replica destination `{}` differs between device {} and device {} \
                     (missing there, or another dtype or shape)",
                    want.name,
                    first.driver.device(),
                    d.driver.device()
                )));
            }
        }
    }
    // Every device pulls every share it does not load: each must be able to
    // read every other device's destinations before any byte moves.
    for owner in devices {
        for reader in devices {
            let (o, r) = (owner.driver.device(), reader.driver.device());
            if o == r {
                continue;
            }
            if !owner.driver.can_access_peer(r)? {
                return Err(Error::InvalidArgument(format!(
                    "device {r} cannot reach device {o} (cuDeviceCanAccessPeer is 0): \
                     replicas fan out over peer copies; load each device on its own instead"
                )));
            }
            for want in dests {
                let dst = owner.registry.get(&want.name).expect("checked above");
                if !owner.driver.peer_readable(dst.ptr, want.bytes, r)? {
                    return Err(Error::InvalidState(format!(
                        "device {r} may not read destination `{}` on device {o}: grant it \
                         peer access first (Pool::set_peer_access, vmmw_pool_set_peer_access)",
                        want.name
                    )));
                }
            }
        }
    }
    Ok(())
}

fn replicas(
    ckpt: &Checkpoint,
    devices: &[DeviceLoad<'_>],
    plans: &[Plan],
    opts: &LoadOptions,
    ctl: &Control<'_>,
    stats: &mut MultiStats,
) -> Result<()> {
    let n = devices.len();
    let (dests, share_of) = cut_shares(&plans[0], devices[0].registry, n);
    check_replicas(devices, &dests)?;
    let names_of = |s: usize| -> Vec<&str> {
        dests
            .iter()
            .zip(&share_of)
            .filter(|(_, &x)| x == s)
            .map(|(d, _)| d.name.as_str())
            .collect()
    };
    let cancel = ctl.cancel;
    // Device `k` loads share `s` from host memory.
    let host_load = |k: usize, s: usize| {
        let (extents, fills) = share_work(&plans[k], devices[k].registry, &names_of(s));
        let c = Control {
            progress: None,
            cancel,
        };
        copy::execute(
            devices[k].driver,
            &ckpt.shards,
            &extents,
            &fills,
            &opts.copy,
            &c,
        )
    };

    // Phase 1: every device loads its own share at once.
    let t = Instant::now();
    let results = on_threads(n, "a device's load thread", |k| host_load(k, k));
    // holder[s] = the device that has share s fully written.
    let mut holder: Vec<Option<usize>> = vec![None; n];
    let mut per_device = vec![CopyStats::default(); n];
    let mut failed = Vec::new();
    for (k, r) in results.into_iter().enumerate() {
        match r {
            Ok(s) => {
                holder[k] = Some(k);
                per_device[k] = s;
            }
            Err(e) if is_cancel(&e) => return Err(e),
            Err(e) => failed.push((k, e)),
        }
    }
    // Repair: a healthy device loads each failed device's share again.
    let healthy: Vec<usize> = (0..n).filter(|&k| holder[k].is_some()).collect();
    for (i, (k, e)) in failed.into_iter().enumerate() {
        let Some(&h) = healthy.get(i % healthy.len().max(1)) else {
            return Err(e);
        };
        stats.recovered.push(devices[k].driver.device());
        let s = host_load(h, k).map_err(|e2| lost(devices[h].driver.device(), e2))?;
        per_device[h].bytes += s.bytes;
        holder[k] = Some(h);
    }
    stats.host_seconds = t.elapsed().as_secs_f64();
    stats.host_bytes = per_device.iter().map(|s| s.bytes).sum();
    stats.per_device = per_device;

    // Phase 2: every device pulls each share it does not hold.
    let t = Instant::now();
    let holder: Vec<usize> = holder
        .into_iter()
        .map(|h| h.expect("every share held"))
        .collect();
    let pulls = |k: usize| -> Result<u64> {
        let d = devices[k].driver.as_ref();
        let mut moved = 0u64;
        let streams = [d.stream_create()?, d.stream_create()?];
        let r = (|| {
            let mut i = 0usize;
            for (s, &h) in holder.iter().enumerate() {
                if h == k {
                    continue;
                }
                for name in names_of(s) {
                    moved += pull(devices, k, h, name, streams[i % 2])?;
                    i += 1;
                }
            }
            for st in streams {
                d.stream_synchronize(st)?;
            }
            Ok(moved)
        })();
        for st in streams {
            let _ = d.stream_destroy(st);
        }
        r
    };
    let results = on_threads(n, "a device's peer-copy thread", pulls);
    for (k, r) in results.into_iter().enumerate() {
        match r {
            Ok(b) => stats.peer_bytes += b,
            Err(e) => return Err(lost(devices[k].driver.device(), e)),
        }
    }
    stats.peer_seconds = t.elapsed().as_secs_f64();
    stats.delivered_bytes = plans[0].dst_bytes() * n as u64;
    Ok(())
}

/// Device `k` pulls destination `name` from device `h`, trying once more on
/// a failure (a transient peer-link error).
fn pull(
    devices: &[DeviceLoad<'_>],
    k: usize,
    h: usize,
    name: &str,
    stream: StreamId,
) -> Result<u64> {
    let dst = devices[k].registry.get(name).expect("checked replica");
    let src = devices[h].registry.get(name).expect("checked replica");
    let len = dst.bytes();
    let copy = || {
        // SAFETY: both are registered destinations of equal size (checked), in
        // mapped memory of their devices, readable by device k (checked before
        // any copy); the registries outlive the load, which synchronizes the
        // stream before returning.
        unsafe {
            devices[k].driver.copy_peer_async(
                dst.ptr,
                src.ptr,
                devices[h].driver.device(),
                len,
                stream,
            )
        }
    };
    copy().or_else(|_| copy())?;
    Ok(len as u64)
}
