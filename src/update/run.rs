//! Running an update: check, pin the tag, take its version ticket, then
//! direct or staged copies (see the failure rule in the module docs), mark
//! what was written for Reload, and move the version.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use super::cut::{cut, Copy2d, Coverage};
use super::plan::{self, KeptPlan, PlanFor, UpdatePlan};
use super::source::{Batch, Bytes, Source, SourceTensor};
use super::{check_options, Staging, UpdateOptions, UpdatePhases, UpdateResult};
use crate::driver::{DevicePtr, Driver, EventId, StreamId};
use crate::error::{Error, Result};
use crate::loader::{check_destinations, Registry};
use crate::pool::Pool;
use crate::segment::Segment;
use crate::tag;

/// Alignment of each destination's copy in the scratch.
const SCRATCH_ALIGN: u64 = 256;

/// Physical chunk of the scratch: large chunks make creating and mapping
/// 16 GiB take milliseconds (2 MiB chunks take half a second).
const SCRATCH_CHUNK: usize = 256 << 20;

/// How a failed update left the destinations.
enum Failed {
    /// Nothing written.
    Untouched(Error),
    /// Written and could not finish (also on the retry).
    Torn(String),
}

/// What the copies did.
struct Done {
    copies: u64,
    retried: bool,
    seconds: f64,
}

/// Where an update's plan comes from: kept from an earlier update, or made.
pub(super) struct Plans<'a> {
    pub plan_for: PlanFor<'a>,
    pub kept: KeptPlan<'a>,
}

pub(super) fn run(
    pool: &Pool,
    plans: &Plans<'_>,
    registry: &Registry,
    source: &mut dyn Source,
    opts: &UpdateOptions,
) -> Result<UpdateResult> {
    let called = Instant::now();
    check_options(opts)?;
    let manifest = source.manifest().to_vec();
    check_destinations(pool, registry)?;
    let up = plan::build(
        &manifest,
        plans.plan_for,
        plans.kept,
        registry,
        pool,
        opts.tag,
        opts.expected_version,
        &opts.plan,
    )?;
    let dests: Vec<(DevicePtr, usize, &str)> = up
        .written()
        .iter()
        .map(|(p, l, n)| (*p, *l, n.as_str()))
        .collect();
    let pin = pool.pin_for_load(&dests)?;
    let ticket = pool.begin_update(up.tag, opts.expected_version)?;
    let driver = pool.driver().clone();
    let stream = driver.stream_create()?;
    let staged = match opts.staging {
        Staging::Always => true,
        Staging::Auto => !source.resident(),
        Staging::Streamed => false,
    };
    // Reload keeps what the update writes in the host backup from now on;
    // done while the device copies into the destinations (the tag is pinned:
    // no sleep can start meanwhile).
    let retire = || {
        for &(ptr, len, _) in &dests {
            if let Some(seg) = pool.segment_of(ptr) {
                pool.retire_reload_range(seg.tag, ptr, len);
            }
        }
    };
    let run = Run {
        driver: &driver,
        stream,
        up: &up,
        manifest: &manifest,
        while_writing: &retire,
        retired: Cell::new(false),
        called,
        clock: Cell::new(UpdatePhases::default()),
        first_copy: Cell::new(None),
    };
    let outcome = if staged {
        run.staged(source)
    } else if opts.staging == Staging::Streamed {
        run.streamed(source)
    } else {
        run.direct(source)
    };
    let _ = run.timed(|p| &mut p.wait, || driver.stream_synchronize(stream));
    let books = Instant::now();
    let _ = driver.stream_destroy(stream);
    match outcome {
        Ok(done) => {
            run.destinations_queued();
            drop(pin);
            let version = ticket.commit();
            let mut phases = run.clock.get();
            phases.bookkeeping += books.elapsed().as_secs_f64();
            Ok(UpdateResult {
                tag: up.tag,
                version,
                bytes: up.dst_bytes(),
                destinations: up.written().len() as u64,
                copies: done.copies,
                staged,
                retried: done.retried,
                seconds: done.seconds,
                phases,
            })
        }
        Err(Failed::Untouched(e)) => Err(e),
        Err(Failed::Torn(reason)) => {
            run.destinations_queued();
            drop(pin);
            let version = ticket.base();
            ticket.tear();
            Err(Error::UpdateTorn {
                tag: tag::name_of(up.tag),
                version,
                reason,
            })
        }
    }
}

/// A source failure as the error the update returns.
fn source_error(e: Error) -> Failed {
    Failed::Untouched(match e {
        e @ Error::UpdateSource(_) => e,
        e => Error::UpdateSource(format!("{e} (no destination was written)")),
    })
}

struct Run<'a> {
    driver: &'a Arc<dyn Driver>,
    stream: StreamId,
    up: &'a UpdatePlan,
    manifest: &'a [SourceTensor],
    /// Host work to do once copies into the destinations are queued, while
    /// the device runs them.
    while_writing: &'a dyn Fn(),
    retired: Cell<bool>,
    /// When the update was called.
    called: Instant,
    /// Time spent so far, by phase ([`UpdatePhases::plan`] is set when the
    /// first copy is queued).
    clock: Cell<UpdatePhases>,
    first_copy: Cell<Option<Instant>>,
}

impl Run<'_> {
    /// Copies into the destinations are queued: run `while_writing` (once).
    fn destinations_queued(&self) {
        if !self.retired.replace(true) {
            self.timed(|p| &mut p.bookkeeping, || (self.while_writing)());
        }
    }

    /// Run `f`, adding its time to the phase `phase` picks.
    fn timed<T>(&self, phase: fn(&mut UpdatePhases) -> &mut f64, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let out = f();
        let mut p = self.clock.get();
        *phase(&mut p) += t0.elapsed().as_secs_f64();
        self.clock.set(p);
        out
    }

    /// The first copy is about to be queued: what came before was planning.
    fn start_copies(&self) -> Instant {
        if let Some(t) = self.first_copy.get() {
            return t;
        }
        let now = Instant::now();
        self.first_copy.set(Some(now));
        let mut p = self.clock.get();
        p.plan = (now - self.called).as_secs_f64();
        self.clock.set(p);
        now
    }

    /// Check a batch's pieces and record their coverage.
    fn accept(&self, batch: &Batch, cov: &mut Coverage) -> Result<()> {
        for p in &batch.pieces {
            let Some(t) = self.manifest.get(p.tensor) else {
                return Err(Error::UpdateSource(format!(
                    "batch {} names tensor #{} of a manifest of {}",
                    batch.id,
                    p.tensor,
                    self.manifest.len()
                )));
            };
            let len = t.bytes().unwrap_or(0);
            let end = p.offset.checked_add(p.len).filter(|&e| e <= len);
            let Some(end) = end else {
                return Err(Error::UpdateSource(format!(
                    "batch {}: bytes {}..+{} of `{}` run past its {len} bytes",
                    batch.id, p.offset, p.len, t.name
                )));
            };
            if p.len == 0 {
                continue;
            }
            if let Err((a, b)) = cov.add(p.tensor, p.offset, end) {
                return Err(Error::UpdateSource(format!(
                    "batch {}: bytes {}..{end} of `{}` overlap bytes {a}..{b} delivered before",
                    batch.id, p.offset, t.name
                )));
            }
        }
        Ok(())
    }

    /// Every byte of every tensor arrived.
    fn complete(&self, cov: &Coverage) -> Result<()> {
        let short: Vec<String> = self
            .manifest
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let len = t.bytes().unwrap_or(0);
                (cov.delivered(i) != len)
                    .then(|| format!("`{}` ({} of {len} bytes)", t.name, cov.delivered(i)))
            })
            .collect();
        if short.is_empty() {
            return Ok(());
        }
        Err(Error::UpdateSource(format!(
            "the source ended before delivering {} tensor(s) whole: {}",
            short.len(),
            short.join(", ")
        )))
    }

    /// The copies of `batch`'s pieces, their destinations moved by `remap`.
    fn copies_of(&self, batch: &Batch, remap: &dyn Fn(DevicePtr) -> DevicePtr) -> Vec<Copy2d> {
        let mut out = Vec::new();
        for p in &batch.pieces {
            for e in self.up.extents_of(p.tensor) {
                if e.src >= p.offset + p.len {
                    break;
                }
                let start = out.len();
                cut(e, p, &mut out);
                for c in &mut out[start..] {
                    c.dst = remap(c.dst);
                }
            }
        }
        out
    }

    /// Queue `copies` and the pad fills at `remap`ped addresses, then wait;
    /// `into_destinations`: they write the destinations themselves.
    fn write(
        &self,
        copies: &[Copy2d],
        remap: &dyn Fn(DevicePtr) -> DevicePtr,
        into_destinations: bool,
    ) -> Result<()> {
        let queued: Result<()> = self.timed(
            |p| &mut p.issue,
            || {
                self.queue(copies)?;
                for f in &self.up.plan.fills {
                    // SAFETY: fills lie in checked destinations (or their scratch).
                    unsafe {
                        self.driver
                            .memset_async(remap(f.dst), 0, f.len as usize, self.stream)
                    }?;
                }
                Ok(())
            },
        );
        if into_destinations {
            self.destinations_queued();
        }
        queued?;
        self.timed(
            |p| &mut p.wait,
            || self.driver.stream_synchronize(self.stream),
        )
    }

    /// An event recorded on the update's stream after what is queued.
    fn record(&self) -> Result<EventId> {
        let ev = self.driver.event_create()?;
        match self.driver.event_record(ev, self.stream) {
            Ok(()) => Ok(ev),
            Err(e) => {
                let _ = self.driver.event_destroy(ev);
                Err(e)
            }
        }
    }

    fn queue(&self, copies: &[Copy2d]) -> Result<()> {
        let d = &**self.driver;
        for c in copies {
            let (w, h) = (c.width as usize, c.height as usize);
            let (dp, sp) = (c.dst_pitch as usize, c.src_pitch as usize);
            // SAFETY: destinations were checked against the pool (or declared
            // the caller's own) and are pinned awake; scratch is ours; the
            // source vouches for its pieces until they are released, which
            // happens only after these copies complete.
            unsafe {
                match c.src {
                    Bytes::Device(s) => d.copy_2d_dtod_async(c.dst, dp, s, sp, w, h, self.stream),
                    Bytes::Host(s) if h == 1 => d.copy_htod_async(c.dst, s, w, self.stream),
                    Bytes::Host(s) => d.copy_2d_htod_async(c.dst, dp, s, sp, w, h, self.stream),
                }
            }?;
        }
        Ok(())
    }

    /// Collect every piece, check the coverage, then copy straight into
    /// the destinations (retried once).
    fn direct(&self, source: &mut dyn Source) -> std::result::Result<Done, Failed> {
        let mut cov = Coverage::new(self.manifest.len());
        let mut batches: Vec<Batch> = Vec::new();
        let drained = loop {
            match source.next() {
                Ok(None) => break Ok(()),
                Ok(Some(b)) => {
                    let ok = self.accept(&b, &mut cov);
                    batches.push(b);
                    if let Err(e) = ok {
                        break Err(e);
                    }
                }
                Err(e) => break Err(e),
            }
        }
        .and_then(|()| self.complete(&cov));
        let release_all = |source: &mut dyn Source| {
            for b in &batches {
                let _ = source.release(b.id);
            }
        };
        if let Err(e) = drained {
            release_all(source);
            return Err(source_error(e));
        }
        let same = |p: DevicePtr| p;
        let copies: Vec<Copy2d> = batches
            .iter()
            .flat_map(|b| self.copies_of(b, &same))
            .collect();
        let t0 = self.start_copies();
        let mut retried = false;
        if let Err(first) = self.write(&copies, &same, true) {
            retried = true;
            let _ = self.driver.stream_synchronize(self.stream);
            if let Err(again) = self.write(&copies, &same, true) {
                release_all(source);
                return Err(Failed::Torn(format!(
                    "copying into the destinations failed ({first}) and so did the retry ({again})"
                )));
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        release_all(source);
        Ok(Done {
            copies: copies.len() as u64,
            retried,
            seconds,
        })
    }

    /// Copy pieces into scratch as they arrive (one batch in flight), then
    /// move the scratch into the destinations (retried once).
    fn staged(&self, source: &mut dyn Source) -> std::result::Result<Done, Failed> {
        let written = self.up.written();
        let mut offsets = Vec::with_capacity(written.len());
        let mut total = 0u64;
        for (_, len, _) in written {
            offsets.push(total);
            total += (*len as u64).div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN;
        }
        let scratch = Segment::allocate(self.driver.clone(), total.max(1) as usize, SCRATCH_CHUNK)
            .map_err(|e| Failed::Untouched(e.with_context(" (the update's scratch)")))?;
        let base = scratch.ptr();
        let remap = |p: DevicePtr| {
            let i = written.partition_point(|d| d.0 <= p) - 1;
            base + offsets[i] + (p - written[i].0)
        };
        let t0 = self.start_copies();
        let scratch_error = |e: Error| e.with_context(" (copying into the update's scratch)");
        let mut copies = 0;
        match self.stream(source, &remap, &scratch_error, &mut copies) {
            Ok(()) => {}
            Err(e @ (Error::Driver { .. } | Error::OutOfMemory { .. })) => {
                return Err(Failed::Untouched(e))
            }
            Err(e) => return Err(source_error(e)),
        }
        let fills = self.write(&[], &remap, false);
        if let Err(e) = fills {
            return Err(Failed::Untouched(
                e.with_context(" (padding in the update's scratch)"),
            ));
        }
        let flip: Vec<Copy2d> = written
            .iter()
            .zip(&offsets)
            .map(|(&(ptr, len, _), &off)| Copy2d {
                dst: ptr,
                dst_pitch: len as u64,
                src: Bytes::Device(base + off),
                src_pitch: len as u64,
                width: len as u64,
                height: 1,
            })
            .collect();
        let mut retried = false;
        let queued = self.timed(|p| &mut p.issue, || self.queue(&flip));
        self.destinations_queued();
        let flipped = queued.and_then(|()| {
            self.timed(
                |p| &mut p.wait,
                || self.driver.stream_synchronize(self.stream),
            )
        });
        if let Err(first) = flipped {
            retried = true;
            let _ = self.driver.stream_synchronize(self.stream);
            let again = self
                .queue(&flip)
                .and_then(|()| self.driver.stream_synchronize(self.stream));
            if let Err(again) = again {
                return Err(Failed::Torn(format!(
                    "moving the staged bytes into the destinations failed ({first}) and so did the retry ({again})"
                )));
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        drop(scratch);
        Ok(Done {
            copies: copies + flip.len() as u64,
            retried,
            seconds,
        })
    }
    /// Copy each batch of `source` to its `remap`ped destinations as it
    /// arrives, one batch in flight: batch k's copies run on the device while
    /// the source produces batch k + 1 (into its other buffer); k is released
    /// once its copies have completed. Ends once every byte of every tensor
    /// arrived; `copies` counts the copies queued.
    fn stream(
        &self,
        source: &mut dyn Source,
        remap: &dyn Fn(DevicePtr) -> DevicePtr,
        copy_error: &dyn Fn(Error) -> Error,
        copies: &mut u64,
    ) -> Result<()> {
        let mut cov = Coverage::new(self.manifest.len());
        let mut inflight: Option<(u64, EventId)> = None;
        let streamed = loop {
            let b = match source.next() {
                Ok(Some(b)) => b,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            if let Err(e) = self.accept(&b, &mut cov) {
                let _ = source.release(b.id);
                break Err(e);
            }
            let cs = self.copies_of(&b, remap);
            *copies += cs.len() as u64;
            let queued = self.timed(
                |p| &mut p.issue,
                || self.queue(&cs).and_then(|()| self.record()),
            );
            let ev = match queued {
                Ok(ev) => ev,
                Err(e) => {
                    // Some of its copies may be queued: wait before handing it back.
                    let _ = self.driver.stream_synchronize(self.stream);
                    let _ = source.release(b.id);
                    break Err(copy_error(e));
                }
            };
            if let Some((id, prev)) = inflight.replace((b.id, ev)) {
                let done = self.timed(|p| &mut p.wait, || self.driver.event_synchronize(prev));
                let _ = self.driver.event_destroy(prev);
                if let Err(e) = done {
                    let _ = self.driver.stream_synchronize(self.stream);
                    let _ = source.release(id);
                    break Err(copy_error(e));
                }
                if let Err(e) = source.release(id) {
                    break Err(e);
                }
            }
        };
        let _ = self.driver.stream_synchronize(self.stream);
        if let Some((id, ev)) = inflight {
            let _ = self.driver.event_destroy(ev);
            let released = source.release(id);
            if streamed.is_ok() {
                released?;
            }
        }
        streamed.and_then(|()| self.complete(&cov))
    }

    /// Copy pieces straight into the destinations as they arrive, then the
    /// pad fills. A failure once a piece was queued leaves them partly
    /// written.
    fn streamed(&self, source: &mut dyn Source) -> std::result::Result<Done, Failed> {
        let same = |p: DevicePtr| p;
        let t0 = self.start_copies();
        let mut copies = 0;
        let copied = self.stream(source, &same, &|e| e, &mut copies);
        let written = |e: Error| Failed::Torn(format!("{e} (the destinations are partly written)"));
        match copied {
            // Nothing was queued: the destinations are as they were.
            Err(e) if copies == 0 => return Err(source_error(e)),
            Err(e) => {
                self.destinations_queued();
                return Err(written(e));
            }
            Ok(()) => self.destinations_queued(),
        }
        self.write(&[], &same, true).map_err(written)?;
        Ok(Done {
            copies,
            retried: false,
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}
