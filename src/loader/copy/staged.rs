//! The staging path's worker: fills its slots of the pinned ring from the file
//! (memcpy, streaming stores or pread), queues their transfers, and routes
//! conversions through the shared device scratch buffers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::issue::issue;
use super::jobs::Job;
use super::page_down;
use super::shared::Shared;
use crate::driver::{DevicePtr, Driver, EventId, StreamId};
use crate::error::Result;
use crate::loader::checkpoint::Shard;
use crate::loader::copy::slot_copy::{cached_copy, stream_copy};
use crate::loader::copy::staging::resident_fraction;
use crate::loader::read_error::{check_read, read_failed};

/// How a staging worker fills a slot from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotFill {
    /// Plain stores from the mapping ([`cached_copy`]; faults page-cache pages
    /// in one by one).
    Memcpy,
    /// `madvise(MADV_POPULATE_READ)` on the job's pages, then memcpy.
    Populate,
    /// `pread` into the slot: no user page tables touched.
    Pread,
    /// Copy from the mapping with streaming stores ([`stream_copy`]).
    Stream,
    /// `Stage::cached` when the job's pages are resident (`mincore`), pread when not.
    ByResidency,
}

/// `MADV_POPULATE_READ` (Linux 5.14); older kernels answer EINVAL, harmlessly.
const MADV_POPULATE_READ: libc::c_int = 22;

/// Everything the staging workers share for one execution.
pub(super) struct Stage<'a> {
    pub(super) d: &'a dyn Driver,
    pub(super) shards: &'a [Shard],
    pub(super) jobs: &'a [Job],
    pub(super) next: AtomicUsize,
    pub(super) sh: &'a Shared,
    pub(super) ring: *mut u8,
    pub(super) slot_bytes: usize,
    pub(super) depth: usize,
    pub(super) fill: SlotFill,
    /// What `ByResidency` uses for resident slots: `Memcpy` when the slots in
    /// use fit in the CPU cache, else `Stream` (see [`geometry`](crate::loader::copy::geometry)).
    pub(super) cached: SlotFill,
    pub(super) scratch: Option<Mutex<Scratch>>,
    pub(super) staged: AtomicU64,
    pub(super) read: AtomicU64,
    /// Bytes filled with streaming stores (part of `staged`).
    pub(super) streamed: AtomicU64,
    /// Nanoseconds, summed over workers.
    pub(super) fill_ns: AtomicU64,
    pub(super) wait_ns: AtomicU64,
    pub(super) issue_ns: AtomicU64,
}

// SAFETY: `ring` is a pinned buffer that outlives the execution; each worker
// uses only its own slots of it.
unsafe impl Sync for Stage<'_> {}

/// Two slot-sized device buffers shared by all workers, for conversions: source
/// bytes land here, a kernel writes the destination. Each buffer's event
/// guards its reuse (recorded on whichever worker's stream used it last).
pub(super) struct Scratch {
    pub(super) bufs: [(DevicePtr, EventId, bool); 2],
    pub(super) turn: usize,
}

struct Slot {
    host: *mut u8,
    event: EventId,
    inflight: Option<u64>,
}

pub(super) fn ns(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

impl Stage<'_> {
    pub(super) fn worker(&self, w: usize) -> Result<()> {
        let d = self.d;
        let t_setup = Instant::now();
        let stream = d.stream_create()?;
        let mut slots: Vec<Slot> = Vec::new();
        let r = (|| -> Result<()> {
            for k in 0..self.depth {
                slots.push(Slot {
                    // SAFETY: the ring holds `workers * depth` slots of `slot_bytes`.
                    host: unsafe { self.ring.add((w * self.depth + k) * self.slot_bytes) },
                    event: d.event_create()?,
                    inflight: None,
                });
            }
            self.wait_ns.fetch_add(ns(t_setup), Ordering::Relaxed);
            let mut k = 0usize;
            loop {
                if self.sh.stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
                let i = self.next.fetch_add(1, Ordering::SeqCst);
                let Some(job) = self.jobs.get(i) else {
                    return Ok(());
                };
                let slot = &mut slots[k % self.depth];
                k += 1;
                if let Some(b) = slot.inflight.take() {
                    let t = Instant::now();
                    d.event_synchronize(slot.event)?;
                    self.wait_ns.fetch_add(ns(t), Ordering::Relaxed);
                    self.sh.done.fetch_add(b, Ordering::SeqCst);
                }
                let t = Instant::now();
                let used = self.fill_slot(job, slot.host)?;
                self.fill_ns.fetch_add(ns(t), Ordering::Relaxed);
                let t = Instant::now();
                self.issue_job(job, slot.host, stream)?;
                d.event_record(slot.event, stream)?;
                self.issue_ns.fetch_add(ns(t), Ordering::Relaxed);
                slot.inflight = Some(job.bytes);
                let c = if used == SlotFill::Pread {
                    &self.read
                } else {
                    &self.staged
                };
                c.fetch_add(job.bytes, Ordering::Relaxed);
                if used == SlotFill::Stream {
                    self.streamed.fetch_add(job.bytes, Ordering::Relaxed);
                }
            }
        })();
        let mut first = r.err();
        let t_drain = Instant::now();
        for s in &mut slots {
            if let Some(b) = s.inflight.take() {
                match d.event_synchronize(s.event) {
                    Ok(()) => {
                        self.sh.done.fetch_add(b, Ordering::SeqCst);
                    }
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            let _ = d.event_destroy(s.event);
        }
        if let Err(e) = d.stream_synchronize(stream) {
            first.get_or_insert(e);
        }
        let _ = d.stream_destroy(stream);
        self.wait_ns.fetch_add(ns(t_drain), Ordering::Relaxed);
        first.map_or(Ok(()), Err)
    }

    /// Copy the job's source rows into the slot, packed in piece order.
    /// Returns the fill it used (never `ByResidency`).
    fn fill_slot(&self, job: &Job, host: *mut u8) -> Result<SlotFill> {
        let first = &job.pieces[0];
        let shard = &self.shards[first.shard as usize];
        // Pieces are sorted by source offset within one shard.
        let (a, b) = job.pieces.iter().fold((u64::MAX, 0), |(a, b), p| {
            (
                a.min(p.src),
                b.max(p.src + (p.height - 1) * p.src_pitch + p.width),
            )
        });
        let fill = match self.fill {
            SlotFill::ByResidency => {
                if resident_fraction(shard.ptr(a), (b - a) as usize) >= 0.95 {
                    self.cached
                } else {
                    SlotFill::Pread
                }
            }
            f => f,
        };
        if fill == SlotFill::Populate {
            let lo = page_down(a);
            // SAFETY: advice on pages of the shard's live read-only mapping
            // (extents were checked against the file length); it only faults
            // them in. Failure (old kernel) just leaves memcpy to fault them.
            unsafe {
                libc::madvise(
                    shard.ptr(lo) as *mut libc::c_void,
                    (b - lo) as usize,
                    MADV_POPULATE_READ,
                )
            };
        }
        // Source runs (file offset, slot offset, length), merged when adjacent
        // on both sides, so contiguous tensors take one read.
        // Each run also keeps the plan source of its first piece, for errors.
        let mut runs: Vec<(u64, u64, u64, u32)> = Vec::new();
        let mut off = 0u64;
        for p in &job.pieces {
            for r in 0..p.height {
                let (src, dst) = (p.src + r * p.src_pitch, off + r * p.width);
                match runs.last_mut() {
                    Some((s, o, n, _)) if *s + *n == src && *o + *n == dst => *n += p.width,
                    _ => runs.push((src, dst, p.width, p.source)),
                }
            }
            off += p.src_bytes();
        }
        for (src, dst, n, source) in runs {
            check_read(self.d, &shard.path, source, src, n)?;
            // SAFETY: the slot has `slot_bytes >= job.bytes` bytes and its previous
            // copies completed (event synchronized by the caller).
            let dst = unsafe { host.add(dst as usize) };
            if fill == SlotFill::Pread {
                // SAFETY: `dst` is valid for `n` writable bytes (above).
                let buf = unsafe { std::slice::from_raw_parts_mut(dst, n as usize) };
                use std::os::unix::fs::FileExt;
                shard
                    .file
                    .read_exact_at(buf, src)
                    .map_err(|e| read_failed(&shard.path, source, src, n, e))?;
            } else if fill == SlotFill::Stream {
                // SAFETY: the source run lies inside the mapping (checked in
                // `execute`); `dst` as above; a slot never overlaps the mapping.
                unsafe { stream_copy(dst, shard.ptr(src), n as usize) };
            } else {
                // SAFETY: as above.
                unsafe { cached_copy(dst, shard.ptr(src), n as usize) };
            }
        }
        Ok(fill)
    }

    /// Queue the job's transfers from the slot: contiguous runs of plain pieces
    /// as one copy, strided pieces as 2D copies, conversions through scratch.
    fn issue_job(&self, job: &Job, host: *mut u8, stream: StreamId) -> Result<()> {
        let d = self.d;
        // (dst, slot offset, len) of the current contiguous run.
        let mut run: Option<(DevicePtr, u64, u64)> = None;
        let flush = |run: &mut Option<(DevicePtr, u64, u64)>| -> Result<()> {
            if let Some((dst, o, n)) = run.take() {
                // SAFETY: the slot stays untouched until the slot's event completes;
                // the destination bytes are validated plan extents.
                unsafe { d.copy_htod_async(dst, host.add(o as usize), n as usize, stream) }?;
            }
            Ok(())
        };
        let mut off = 0u64;
        let mut converts = false;
        for p in &job.pieces {
            let n = p.src_bytes();
            if p.convert.is_some() {
                converts = true;
            } else if p.height == 1 || p.dst_pitch == p.width {
                match run.as_mut() {
                    Some((dst, o, len)) if *dst + *len == p.dst && *o + *len == off => *len += n,
                    _ => {
                        flush(&mut run)?;
                        run = Some((p.dst, off, n));
                    }
                }
            } else {
                flush(&mut run)?;
                // SAFETY: as above.
                unsafe { issue(d, p, host.add(off as usize), p.width, stream) }?;
            }
            off += n;
        }
        flush(&mut run)?;
        if converts {
            self.issue_conversions(job, host, stream)?;
        }
        Ok(())
    }

    fn issue_conversions(&self, job: &Job, host: *mut u8, stream: StreamId) -> Result<()> {
        let d = self.d;
        let scratch = self
            .scratch
            .as_ref()
            .expect("scratch exists when a job converts");
        let mut g = scratch.lock().unwrap_or_else(|p| p.into_inner());
        let k = g.turn % 2;
        g.turn += 1;
        let (base, ev, used) = g.bufs[k];
        if used {
            let t = Instant::now();
            d.event_synchronize(ev)?;
            self.wait_ns.fetch_add(ns(t), Ordering::Relaxed);
        }
        let mut off = 0u64;
        for p in &job.pieces {
            if let Some((from, to)) = p.convert {
                let tmp = base + off;
                // SAFETY: scratch has `slot_bytes >= job.bytes`; the slot as in `issue_job`.
                unsafe {
                    d.copy_htod_async(tmp, host.add(off as usize), p.src_bytes() as usize, stream)
                }?;
                let per_row = (p.width / from.size() as u64) as usize;
                if p.height == 1 || p.dst_pitch == p.dst_width() {
                    // SAFETY: destination rows are a validated extent, contiguous here.
                    unsafe {
                        d.convert_async(p.dst, to, tmp, from, per_row * p.height as usize, stream)
                    }?;
                } else {
                    for r in 0..p.height {
                        // SAFETY: one destination row of a validated extent.
                        unsafe {
                            d.convert_async(
                                p.dst + r * p.dst_pitch,
                                to,
                                tmp + r * p.width,
                                from,
                                per_row,
                                stream,
                            )
                        }?;
                    }
                }
            }
            off += p.src_bytes();
        }
        d.event_record(ev, stream)?;
        g.bufs[k].2 = true;
        Ok(())
    }
}
