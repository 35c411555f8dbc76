//! The wake of one tag, in phases: take the snapshot, check free memory and
//! the reload sources, map and restore with no lock held, undo the mapping
//! on a failure, install the new chunks, finish. The last three are shared
//! with the wake in steps (`staged.rs`).

use std::cell::RefCell;
use std::time::Instant;

use super::compressed::CodecScratch;
use super::options::CycleReport;
use super::plan::{self, SegTodo, Transition};
use super::room::Room;
use super::sleep::Lane;
use super::sources::Replay;
use super::{SleepEngine, TagSegments};
use crate::driver::{DevicePtr, Driver, PhysHandle, StreamId};
use crate::error::{Error, Result};
use crate::segment::{unmap_release_at, Segment, SleepState};
use crate::sleep::ranges;
use crate::tag::TagId;

/// A chunk mapped by a wake and not yet installed in its segment:
/// `(snapshot index, chunk index, handle)`.
pub(super) type Made = (usize, usize, PhysHandle);

impl SleepEngine {
    /// Wake the asleep segments among `segs` (all of tag `tag`). See [`Self::wake_tag`].
    pub fn wake(&self, tag: TagId, segs: &mut [&mut Segment]) -> Result<CycleReport> {
        let cell = RefCell::new(segs);
        self.wake_tag(tag, &|f| f(&mut cell.borrow_mut()))
    }

    /// Wake `tag`'s asleep segments. Transactional: free memory is checked
    /// and every reload source is
    /// [checked](crate::sleep::reload::ReloadSource::check) before anything
    /// is mapped; on any later failure every chunk mapped by this call is
    /// unmapped again (once the device is known idle; if even that
    /// synchronize fails they stay mapped and the segment stays asleep) and the
    /// segments stay asleep with their backups; the error is returned.
    ///
    /// Each segment gets back its backed-up bytes, then the bytes its tag's
    /// reload sources cover; bytes of a Discard sleep come back undefined.
    /// Chunks a failed sleep left mapped keep what they hold.
    pub fn wake_tag(&self, tag: TagId, segs: TagSegments<'_>) -> Result<CycleReport> {
        let _one = self.one_transition();
        self.wake_in(tag, segs, Lane::default(), &Room::none())
    }

    /// [`Self::wake_tag`], except that instead of refusing at once when the
    /// device's free memory is short, each physical chunk is created when the
    /// device has room, waiting up to `wait` for memory being released
    /// (another process putting its model to sleep, another pool trimming),
    /// polling the driver's free memory. At the deadline the wake fails as
    /// any wake does: every chunk it mapped is unmapped again, the tag stays
    /// asleep with its backup intact, and the error
    /// ([`Error::OutOfMemory`]) names the tag, the bytes needed and free.
    /// A zero `wait` is [`Self::wake_tag`].
    pub fn wake_tag_waiting(
        &self,
        tag: TagId,
        segs: TagSegments<'_>,
        wait: std::time::Duration,
    ) -> Result<CycleReport> {
        let _one = self.one_transition();
        self.wake_in(tag, segs, Lane::default(), &Room::new(wait, None))
    }

    /// [`Self::wake_tag`] within a transition the caller holds, on `lane`,
    /// creating chunks as `room` allows.
    pub(super) fn wake_in(
        &self,
        tag: TagId,
        segs: TagSegments<'_>,
        lane: Lane<'_>,
        room: &Room<'_>,
    ) -> Result<CycleReport> {
        let t0 = Instant::now();
        // The room may have waited for the tags of a swap woken before this.
        let waited_before = room.waited();
        let coalesce = self.lock().options.wake_coalesce_bytes;
        let todo = plan::snapshot(segs, Transition::Wake { coalesce });
        let mut report = CycleReport::default();
        if todo.is_empty() {
            report.seconds = t0.elapsed().as_secs_f64();
            return Ok(report);
        }
        self.check_free_memory(tag, &todo, room.waits())?;
        // What each source restores here, checked before any byte is touched.
        let reloadable: Vec<(DevicePtr, usize)> = todo
            .iter()
            .filter(|t| t.state == SleepState::Reloadable)
            .map(|t| (t.ptr, t.committed))
            .collect();
        let sources = self.replays(tag, &reloadable);
        for (src, _) in &sources {
            src.check()?;
        }
        let streams = {
            let mut s = self.lock();
            let streams = self.lane_streams(&mut s, lane.second)?;
            s.busy.extend(todo.iter().map(|t| t.ptr));
            streams
        };
        let mut made: Vec<Made> = Vec::new();
        let restored = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            room.let_sleep_start(
                self.driver.as_ref(),
                todo.iter().map(SegTodo::unmapped_bytes).sum(),
            )
            .and_then(|()| {
                self.restore(tag, &todo, &sources, &streams, room, &mut made, &mut report)
            })
        }));
        let result = match restored {
            Ok(r) => r,
            Err(p) => {
                // A panic midway (a bug, or a caller's reload source) undoes
                // the mapping as a failure does: chunks left mapped and not
                // installed would refuse every later wake of the tag.
                if !self.undo_mapped(&todo, &streams, &mut made) {
                    install(segs, &todo, &made, false);
                }
                self.finish_wake(&todo, false);
                std::panic::resume_unwind(p)
            }
        };
        let installed = match result {
            Ok(()) => true,
            Err(_) => !self.undo_mapped(&todo, &streams, &mut made),
        };
        if installed {
            install(segs, &todo, &made, result.is_ok());
        }
        self.finish_wake(&todo, result.is_ok());
        result?;
        report.segments = todo.len();
        report.waited_seconds = room.waited().saturating_sub(waited_before).as_secs_f64();
        report.seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Compare the bytes the segments need mapped with the device's free
    /// memory (with `waits`, its total: memory may be freed meanwhile),
    /// before anything is mapped.
    fn check_free_memory(&self, tag: TagId, todo: &[SegTodo], waits: bool) -> Result<()> {
        let needed: u64 = todo.iter().map(SegTodo::unmapped_bytes).sum();
        let info = self.driver.mem_info()?;
        let free = info.free;
        if waits && needed > info.total {
            return Err(Error::OutOfMemory {
                what: format!(
                    "wake of tag {tag} ({} segments; more than the device's {} bytes in all, so no wait can make room)",
                    todo.len(),
                    info.total
                ),
                requested: needed,
                free,
            });
        }
        if !waits && needed > free {
            return Err(Error::OutOfMemory {
                what: format!("wake of tag {tag} ({} segments)", todo.len()),
                requested: needed,
                free,
            });
        }
        Ok(())
    }

    /// Map every unmapped chunk of `todo` (each as `room` has space for
    /// it), copy the backups into them, fill discarded memory when asked,
    /// then run the reload sources. No segment is touched: the handles made
    /// are listed in `made` for the caller to install or undo.
    #[allow(clippy::too_many_arguments)]
    fn restore(
        &self,
        tag: TagId,
        todo: &[SegTodo],
        sources: &[Replay],
        streams: &[StreamId],
        room: &Room<'_>,
        made: &mut Vec<Made>,
        report: &mut CycleReport,
    ) -> Result<()> {
        let (piece, fill) = {
            let s = self.lock();
            (
                s.options.copy_piece_bytes.max(1 << 20),
                s.options.debug_fill_discarded,
            )
        };
        let needed: u64 = todo.iter().map(SegTodo::unmapped_bytes).sum();
        let what = || format!("wake of tag {tag} ({} segments)", todo.len());
        let driver = self.driver.as_ref();
        let map = |t: &SegTodo, va: DevicePtr, size: usize| {
            room.map(driver, va, size, &t.peers, t.flags, &what, needed)
        };
        let mut next_stream = 0usize;
        let compressed = |t: &SegTodo| {
            t.state == SleepState::Offloaded
                && self
                    .lock()
                    .backups
                    .get(&t.ptr)
                    .is_some_and(|b| b.is_compressed())
        };
        let mut decoded = Vec::new();
        let any = todo.iter().any(compressed);
        if any {
            self.release_stale_scratch();
        }
        let mut guard = self.guard_scratch(if any {
            // Buffers for the largest frame to restore, a status word per frame.
            let (largest, frames) = {
                let s = self.lock();
                todo.iter()
                    .filter_map(|t| s.backups.get(&t.ptr))
                    .flat_map(|b| &b.frames)
                    .fold((0, 0), |(m, n), f| (m.max(f.raw_len), n + 1))
            };
            let ring = self.lock().options.codec_ring;
            let bytes = CodecScratch::wake_bytes(&self.driver, largest, ring, frames) as u64;
            Some(
                room.with_room(driver, bytes, &what, needed + bytes, &mut || {
                    CodecScratch::for_wake(&self.driver, largest, ring, frames)
                })?,
            )
        } else {
            None
        });
        let codec = &mut guard.sc;
        for t in todo {
            if t.state == SleepState::Offloaded
                && t.committed > 0
                && !self.lock().backups.contains_key(&t.ptr)
            {
                return Err(Error::InvalidState(format!(
                    "segment at {:#x} is offloaded but has no backup",
                    t.ptr
                )));
            }
        }
        if let Some(sc) = codec.as_mut() {
            // The compressed segments first, their frames in one pipeline:
            // chunks are mapped as the decodes reach them, so mapping
            // overlaps the copies of the frames before.
            let coded: Vec<usize> = (0..todo.len()).filter(|&i| compressed(&todo[i])).collect();
            let ptrs: Vec<DevicePtr> = coded.iter().map(|&i| todo[i].ptr).collect();
            let mut next = vec![0usize; todo.len()];
            let mut mapped = 0u64;
            let mut map_upto = |i: usize, end: usize| -> Result<()> {
                let t = &todo[i];
                while next[i] < t.chunks.len() && t.chunks[next[i]].offset < end {
                    let chunk = t.chunks[next[i]];
                    if chunk.handle.is_none() {
                        let va = t.ptr + chunk.offset as u64;
                        let h = map(t, va, chunk.size)?;
                        made.push((i, next[i], h));
                        mapped += chunk.size as u64;
                    }
                    next[i] += 1;
                }
                Ok(())
            };
            let copied =
                self.restore_compressed(&ptrs, sc, streams, &mut decoded, &mut |p, end| {
                    map_upto(coded[p], end)
                });
            // Chunks past the last frame (none when the frames cover the
            // segment) are mapped too.
            let rest = copied.and_then(|c| {
                coded
                    .iter()
                    .try_for_each(|&i| map_upto(i, usize::MAX))
                    .map(|()| c)
            });
            report.physical_bytes += mapped;
            report.copied_bytes += rest?;
            let s = self.lock();
            report.raw_bytes += ptrs
                .iter()
                .map(|p| s.backups[p].raw_len() as u64)
                .sum::<u64>();
        }
        for (i, t) in todo.iter().enumerate() {
            if codec.is_some() && compressed(t) {
                continue;
            }
            for (c, chunk) in t.chunks.iter().enumerate() {
                let va = t.ptr + chunk.offset as u64;
                let mapped = chunk.handle.is_some();
                if !mapped {
                    let h = map(t, va, chunk.size)?;
                    made.push((i, c, h));
                    report.physical_bytes += chunk.size as u64;
                }
                // A chunk still mapped holds the bytes only where a sleep
                // stopped before copying them (the backup's stale ranges,
                // `release.rs`); elsewhere the backup holds them, and the
                // chunk may hold anything (a failed wake that could not
                // unmap left it), so the backup is restored over it.
                let spans = {
                    let s = self.lock();
                    s.backups
                        .get(&t.ptr)
                        .filter(|b| t.state != SleepState::Discarded && !b.is_compressed())
                        .map(|b| {
                            let mut fresh = vec![(chunk.offset as DevicePtr, chunk.size)];
                            if mapped {
                                for &(o, l) in &b.stale {
                                    fresh = ranges::subtract(&fresh, o as DevicePtr, l);
                                }
                            }
                            fresh
                                .iter()
                                .flat_map(|&(o, l)| b.spans(&s.arena, o as usize, l, piece))
                                .collect::<Vec<_>>()
                        })
                        .unwrap_or_default()
                };
                for (at, host, n) in spans {
                    let st = streams[next_stream % streams.len()];
                    next_stream += 1;
                    // SAFETY: the chunk was mapped just now; `host`
                    // points into the segment's backup with `n` bytes left,
                    // kept (busy) until the streams are synchronized below.
                    unsafe {
                        self.driver
                            .copy_htod_async(t.ptr + at as u64, host, n, st)?
                    };
                    report.copied_bytes += n as u64;
                }
                if let (SleepState::Discarded, Some(byte), false) = (t.state, fill, mapped) {
                    let st = streams[next_stream % streams.len()];
                    next_stream += 1;
                    // SAFETY: the chunk is mapped with access granted.
                    unsafe { self.driver.memset_async(va, byte, chunk.size, st)? };
                }
            }
        }
        if let Some(sc) = &codec {
            self.check_decoded(sc, streams, &decoded)?;
        }
        for &st in streams {
            self.driver.stream_synchronize(st)?;
        }
        for (src, parts) in sources {
            report.reloaded_bytes += src.reload(self.driver.as_ref(), parts)?;
        }
        Ok(())
    }

    /// After a failed restore, unmap what it mapped. Returns false (nothing
    /// unmapped) when the device could not be shown idle.
    fn undo_mapped(&self, todo: &[SegTodo], streams: &[StreamId], made: &mut Vec<Made>) -> bool {
        // Copies may still target chunks about to be unmapped: unmap
        // only once the device is known idle.
        let mut idle = true;
        for &st in streams {
            idle &= self.driver.stream_synchronize(st).is_ok();
        }
        idle &= self.driver.synchronize().is_ok();
        if idle {
            unmap_made(self.driver.as_ref(), todo, made);
        }
        idle
    }

    /// The segments of a wake are free for other transitions again; after a
    /// wake that `woke` them, drop their backups and unpin what holds nothing
    /// when the options say so.
    pub(super) fn finish_wake(&self, todo: &[SegTodo], woke: bool) {
        let mut s = self.lock();
        for t in todo {
            s.busy.remove(&t.ptr);
            if woke && s.options.free_backup_after_wake {
                s.free_backup(t.ptr);
            }
        }
        if woke && s.options.release_pinned_after_wake {
            s.arena.release_unused();
        }
    }
}

/// Unmap and release every chunk of `made`, last mapped first, and forget
/// them. The device is idle: no copy targets them.
pub(super) fn unmap_made(driver: &dyn Driver, todo: &[SegTodo], made: &mut Vec<Made>) {
    for &(i, c, h) in made.iter().rev() {
        let (t, ch) = (&todo[i], todo[i].chunks[c]);
        let _ = unmap_release_at(driver, t.ptr + ch.offset as u64, ch.size, h);
    }
    made.clear();
}

/// Install the chunks of `made` in their segments under one call of `segs`;
/// when `awake`, a segment fully mapped again is awake.
pub(super) fn install(segs: TagSegments<'_>, todo: &[SegTodo], made: &[Made], awake: bool) {
    let mut ok = true;
    segs(&mut |ss| {
        for (i, t) in todo.iter().enumerate() {
            let Some(seg) = ss.iter_mut().find(|s| s.ptr() == t.ptr) else {
                continue;
            };
            for &(_, c, h) in made.iter().filter(|m| m.0 == i) {
                ok &= seg.install_handle(c, h).is_ok();
            }
            if awake && seg.is_fully_mapped() {
                seg.set_sleep_state(SleepState::Awake);
            }
        }
    });
    debug_assert!(ok, "the chunks of a segment in transition do not change");
}
