//! One execution: zero fills, split the extents between direct windows and
//! staging jobs, run the workers, and gather their errors and stats.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::direct::direct_worker;
use super::jobs::{hybrid_split, make_jobs, make_windows, Window};
use super::options::{Control, CopyOptions, CopyStats, Strategy};
use super::scratch_release;
use super::shared::Shared;
use super::staged::{ns, Scratch, SlotFill, Stage};
use super::PAGE;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::loader::checkpoint::Shard;
use crate::loader::copy::geometry::{self, CachedFill, Geometry};
use crate::loader::copy::staging::{acquire_ring, resident_share, return_ring};
use crate::loader::plan::{Extent, Fill};
use crate::segment::Segment;

/// Copy `extents` and zero `fills` into device memory. Synchronous: every copy
/// has completed when it returns.
pub fn execute(
    driver: &Arc<dyn Driver>,
    shards: &[Shard],
    extents: &[Extent],
    fills: &[Fill],
    opts: &CopyOptions,
    ctl: &Control<'_>,
) -> Result<CopyStats> {
    opts.validate()?;
    let t0 = Instant::now();
    let total: u64 = extents.iter().map(Extent::src_bytes).sum();
    let threads = opts.thread_count();
    let mut stats = CopyStats {
        threads,
        ..Default::default()
    };
    if ctl.cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
        return Err(Error::Cancelled { done: 0, total });
    }
    for e in extents {
        let s = &shards[e.shard as usize];
        if s.map.is_none() || e.src + (e.height - 1) * e.src_pitch + e.width > s.len {
            return Err(Error::checkpoint(
                &s.path,
                None,
                format!(
                    "copy extent at byte {} runs past the end of the file ({} bytes)",
                    e.src, s.len
                ),
            ));
        }
    }

    let d: &dyn Driver = driver.as_ref();
    let stream = d.stream_create()?;
    let r = (|| {
        for f in fills {
            // SAFETY: fills come from a validated plan: inside registered destinations.
            unsafe { d.memset_async(f.dst, 0, f.len as usize, stream) }?;
            stats.filled_bytes += f.len;
        }
        Ok::<(), Error>(())
    })();
    let r = r.and_then(|_| d.stream_synchronize(stream));
    let _ = d.stream_destroy(stream);
    r?;

    stats.fill_zero_seconds = t0.elapsed().as_secs_f64();

    // Partition: conversions always stage; the rest by strategy.
    let (mut direct, mut staged): (Vec<Extent>, Vec<Extent>) = match opts.strategy {
        Strategy::Direct | Strategy::Simple | Strategy::Registered => {
            extents.iter().partition(|e| e.convert.is_none())
        }
        Strategy::Hybrid => hybrid_split(extents, opts.direct_percent),
        _ => (Vec::new(), extents.to_vec()),
    };
    direct.sort_by_key(|e| (e.shard, e.src));
    let windows = make_windows(shards, &direct, opts.window_bytes.max(PAGE as usize) as u64);
    staged.sort_by_key(|e| (e.shard, e.src));
    // Hybrid runs both paths at once, a quarter of the threads on windows;
    // the other strategies run their windows first, then stage the rest
    // (conversions) on every thread.
    let hybrid = opts.strategy == Strategy::Hybrid && !windows.is_empty();
    let n_direct = if hybrid {
        (threads / 4).max(1).min(windows.len())
    } else {
        threads.min(windows.len())
    };
    // Before the cap at the number of jobs, which depends on the slot size
    // chosen for them.
    // Direct workers that run alongside the staging ones.
    let concurrent_direct = if hybrid { n_direct } else { 0 };
    let staging_workers = if hybrid {
        threads.saturating_sub(n_direct).max(1)
    } else {
        threads
    };
    // Counted while this execution runs, so concurrent loads share the cache.
    // Cold loads read into large slots and leave the cache alone.
    let cold = !staged.is_empty() && reads_cold(opts, shards, &staged);
    let (_active, others) = if staged.is_empty() || cold {
        (None, 0)
    } else {
        let (guard, others) = geometry::ActiveWorkers::enter(staging_workers);
        (Some(guard), others)
    };
    let geom = staging_geometry(opts, cold, staging_workers, others);
    let slot_bytes = (geom.slot_bytes.max(PAGE as usize) as u64).div_ceil(PAGE) * PAGE;
    let jobs = make_jobs(&staged, slot_bytes);

    let shared = Shared::default();
    let register = !matches!(opts.strategy, Strategy::Simple | Strategy::Registered);
    let direct_bytes: u64 = windows.iter().map(Window::bytes).sum();
    let next = AtomicUsize::new(0);
    let n_staged = staging_workers.min(jobs.len());
    let direct_only = |w: usize| direct_worker(d, shards, &windows, &next, &shared, register, w);
    if !hybrid {
        let td = Instant::now();
        run_workers(n_direct, &shared, ctl, total, &direct_only);
        stats.direct_seconds = td.elapsed().as_secs_f64();
    }
    stats.direct_bytes = direct_bytes;
    let staging = hybrid || !shared.stop.load(Ordering::SeqCst);
    if staging && !jobs.is_empty() && n_staged > 0 {
        let fill = match opts.strategy {
            Strategy::Read => SlotFill::Pread,
            Strategy::Hybrid => SlotFill::ByResidency,
            Strategy::Populate => SlotFill::Populate,
            Strategy::Stream => SlotFill::Stream,
            Strategy::Staged | Strategy::Simple | Strategy::Direct | Strategy::Registered => {
                SlotFill::Memcpy
            }
            Strategy::Auto => SlotFill::ByResidency,
        };
        let cached = match geom.fill {
            CachedFill::CacheResident => SlotFill::Memcpy,
            CachedFill::Streaming => SlotFill::Stream,
        };
        let depth = geom.depth;
        stats.slot_bytes = slot_bytes;
        stats.depth = depth;
        stats.cache_resident = match fill {
            SlotFill::ByResidency => cached == SlotFill::Memcpy,
            f => f == SlotFill::Memcpy && geom.fill == CachedFill::CacheResident,
        };
        let tr = Instant::now();
        let ring_len = n_staged * depth * slot_bytes as usize;
        let (ring, reused) = acquire_ring(driver, ring_len)?;
        stats.ring_seconds = tr.elapsed().as_secs_f64();
        stats.ring_reused = reused;
        stats.ring_bytes = ring.len() as u64;
        let needs_scratch = jobs
            .iter()
            .any(|j| j.pieces.iter().any(|p| p.convert.is_some()));
        let scratch_seg = if needs_scratch {
            scratch_release::retry(driver);
            Some(Segment::allocate(
                driver.clone(),
                2 * slot_bytes as usize,
                0,
            )?)
        } else {
            None
        };
        let mut scratch_events = Vec::new();
        let setup = (|| -> Result<Option<Mutex<Scratch>>> {
            let Some(seg) = scratch_seg.as_ref() else {
                return Ok(None);
            };
            for _ in 0..2 {
                scratch_events.push(d.event_create()?);
            }
            Ok(Some(Mutex::new(Scratch {
                bufs: [
                    (seg.ptr(), scratch_events[0], false),
                    (seg.ptr() + slot_bytes, scratch_events[1], false),
                ],
                turn: 0,
            })))
        })();
        let scratch = match setup {
            Ok(s) => s,
            Err(e) => {
                for ev in scratch_events {
                    let _ = d.event_destroy(ev);
                }
                return_ring(ring);
                return Err(e);
            }
        };
        let stage = Stage {
            d,
            shards,
            jobs: &jobs,
            next: AtomicUsize::new(0),
            sh: &shared,
            ring: ring.ptr(),
            slot_bytes: slot_bytes as usize,
            depth,
            fill,
            cached,
            scratch,
            staged: AtomicU64::new(0),
            read: AtomicU64::new(0),
            streamed: AtomicU64::new(0),
            fill_ns: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            issue_ns: AtomicU64::new(0),
        };
        let td = Instant::now();
        let direct_secs = AtomicU64::new(0);
        run_workers(concurrent_direct + n_staged, &shared, ctl, total, &|w| {
            if w < concurrent_direct {
                let r = direct_only(w);
                direct_secs.store(ns(td), Ordering::Relaxed);
                r
            } else {
                stage.worker(w - concurrent_direct)
            }
        });
        if hybrid {
            stats.direct_seconds = direct_secs.load(Ordering::Relaxed) as f64 / 1e9;
        }
        // Every worker synchronized its slots (and the scratch events ride on
        // their streams), so the ring and scratch are idle now; except after a
        // panic, which skipped that wait: then wait for the device, and if even
        // that fails, never free or reuse them (a leak, not a device reading
        // memory that was handed out again).
        let idle = !shared.panicked() || d.synchronize().is_ok();
        for ev in scratch_events {
            let _ = d.event_destroy(ev);
        }
        if idle {
            if let Some(seg) = scratch_seg {
                scratch_release::give_back(seg);
            }
            return_ring(ring);
        } else {
            std::mem::forget(scratch_seg);
            std::mem::forget(ring);
        }
        stats.staged_bytes = stage.staged.load(Ordering::SeqCst);
        stats.read_bytes = stage.read.load(Ordering::SeqCst);
        stats.streamed_bytes = stage.streamed.load(Ordering::SeqCst);
        stats.slot_fill_seconds = stage.fill_ns.load(Ordering::Relaxed) as f64 / 1e9;
        stats.wait_seconds = stage.wait_ns.load(Ordering::Relaxed) as f64 / 1e9;
        stats.issue_seconds = stage.issue_ns.load(Ordering::Relaxed) as f64 / 1e9;
    } else if hybrid {
        run_workers(n_direct, &shared, ctl, total, &direct_only);
    }
    let done = shared.done.load(Ordering::SeqCst);
    if let Some(e) = shared.take_error() {
        return Err(e);
    }
    if shared.stop.load(Ordering::SeqCst) || done < total {
        return Err(Error::Cancelled { done, total });
    }
    if let Some(p) = ctl.progress {
        p(total, total);
    }
    stats.bytes = total;
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(stats)
}

/// Run `work` on `n` threads; poll progress and cancellation on the calling
/// thread until they finish. A worker's error stops the others.
fn run_workers(
    n: usize,
    shared: &Shared,
    ctl: &Control<'_>,
    total: u64,
    work: &(dyn Fn(usize) -> Result<()> + Sync),
) {
    if n == 0 {
        return;
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|w| {
                s.spawn(move || {
                    if let Err(e) = work(w) {
                        shared.fail(e);
                    }
                })
            })
            .collect();
        let mut last = u64::MAX;
        while !handles.iter().all(|h| h.is_finished()) {
            if ctl.cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
                shared.stop.store(true, Ordering::SeqCst);
            }
            let done = shared.done.load(Ordering::Relaxed);
            if done != last {
                if let Some(p) = ctl.progress {
                    p(done, total);
                }
                last = done;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        for h in handles {
            if let Err(p) = h.join() {
                shared.fail_panicked(Error::Panic(crate::error::panic_message(p.as_ref())));
            }
        }
    });
}

/// Slot size, depth and page-cached fill for `workers` staging workers while
/// `others` of other executions run: [`geometry::with_overrides`] for this
/// execution's share of the CPU's last-level cache and the caller's
/// explicit slot size or depth, except that `read`, and `auto`/`hybrid` on a
/// checkpoint mostly not in the page cache, keep large slots: those slots are
/// filled by `pread`, and large reads keep the disk busy.
fn staging_geometry(opts: &CopyOptions, cold: bool, workers: usize, others: usize) -> Geometry {
    let nonzero = |v: usize| (v != 0).then_some(v);
    let (slot, depth) = (nonzero(opts.slot_bytes), nonzero(opts.depth));
    let llc = if cold {
        None
    } else {
        geometry::cache_share(geometry::last_level_caches(), workers, others)
    };
    geometry::with_overrides(llc, workers, slot, depth)
}

/// Whether the staged slots will be filled by `pread` from disk: always for
/// `read`; for `auto`/`hybrid` when most of the sampled source bytes are not
/// in the page cache.
fn reads_cold(opts: &CopyOptions, shards: &[Shard], staged: &[Extent]) -> bool {
    match opts.strategy {
        Strategy::Read => true,
        Strategy::Auto | Strategy::Hybrid => resident_share(shards, staged) < 0.5,
        _ => false,
    }
}
