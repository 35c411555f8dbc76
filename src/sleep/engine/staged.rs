//! A wake in steps, for callers that fill the memory themselves (the wake of
//! replicas from one host backup, `devices::replicas`): map every unmapped chunk
//! of a tag's asleep segments, let the caller copy (raw backups as host spans,
//! [`StagedWake::backup_spans`]) or decode (compressed backups as frames,
//! [`StagedWake::backup_frames`], decoded on any member's engine), then either
//! commit (the segments are awake) or abort (every chunk mapped here is
//! unmapped again, the segments stay asleep, their backups intact).
//!
//! The engine's transition lock is held from [`SleepEngine::stage_wake`]
//! until commit or abort, and the segments' backups are marked busy, so no
//! other sleep or wake of this engine runs and no backup is freed meanwhile.

use std::sync::MutexGuard;

use super::lent_frames::BackupFrame;
use super::options::CycleReport;
use super::plan::{self, SegTodo, Transition};
use super::wake::{self, Made};
use super::{SleepEngine, TagSegments};
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::segment::{map_new_at, SleepState};
use crate::tag::TagId;

/// A run of backup bytes: `len` bytes at host address `host` hold segment
/// bytes from offset `offset`. Plain data, so copy threads can take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSpan {
    /// Offset in the segment.
    pub offset: usize,
    /// Host address of the bytes (pinned backup memory).
    pub host: usize,
    /// Bytes.
    pub len: usize,
}

/// A wake of one tag between its mapping and its commit or abort. Dropping it
/// without either aborts it (best effort).
#[derive(Debug)]
pub struct StagedWake<'a> {
    engine: &'a SleepEngine,
    _one: MutexGuard<'a, ()>,
    tag: TagId,
    todo: Vec<SegTodo>,
    /// Chunks mapped here, not yet installed.
    made: Vec<Made>,
    report: CycleReport,
    finished: bool,
}

impl SleepEngine {
    /// Begin a wake of `tag` in steps: its asleep segments (in `segs`' order,
    /// that is by base address) are taken in; nothing is mapped yet.
    pub fn stage_wake<'a>(&'a self, tag: TagId, segs: TagSegments<'_>) -> StagedWake<'a> {
        let one = self.one_transition();
        let coalesce = self.lock().options.wake_coalesce_bytes;
        let todo = plan::snapshot(segs, Transition::Wake { coalesce });
        self.lock().busy.extend(todo.iter().map(|t| t.ptr));
        StagedWake {
            engine: self,
            _one: one,
            tag,
            todo,
            made: Vec::new(),
            report: CycleReport::default(),
            finished: false,
        }
    }
}

impl StagedWake<'_> {
    /// The tag being woken.
    pub fn tag(&self) -> TagId {
        self.tag
    }

    /// The asleep segments: `(base, committed bytes, state)`, by base address.
    pub fn segments(&self) -> Vec<(DevicePtr, usize, SleepState)> {
        self.todo
            .iter()
            .map(|t| (t.ptr, t.committed, t.state))
            .collect()
    }

    /// Bytes of physical memory [`Self::map`] will create.
    pub fn unmapped_bytes(&self) -> u64 {
        self.todo.iter().map(SegTodo::unmapped_bytes).sum()
    }

    /// Map every unmapped chunk (peer grants set again on each). On an error
    /// the chunks mapped so far stay listed for [`Self::abort`].
    pub fn map(&mut self) -> Result<()> {
        let driver = self.engine.driver.clone();
        for (i, t) in self.todo.iter().enumerate() {
            for (c, chunk) in t.chunks.iter().enumerate() {
                if chunk.handle.is_some() || self.made.iter().any(|m| m.0 == i && m.1 == c) {
                    continue;
                }
                let va = t.ptr + chunk.offset as u64;
                let h = map_new_at(driver.as_ref(), va, chunk.size, &t.peers, t.flags)?;
                self.made.push((i, c, h));
                self.report.physical_bytes += chunk.size as u64;
            }
        }
        Ok(())
    }

    /// The backup bytes of segment `i` (an index into [`Self::segments`])
    /// over `[offset, offset+len)`, in spans of at most `max` bytes. An error
    /// when the segment was not offloaded or its backup does not hold every
    /// byte of the range.
    pub fn backup_spans(
        &self,
        i: usize,
        offset: usize,
        len: usize,
        max: usize,
    ) -> Result<Vec<HostSpan>> {
        let t = &self.todo[i];
        let s = self.engine.lock();
        let b = s
            .backups
            .get(&t.ptr)
            .filter(|_| t.state == SleepState::Offloaded)
            .ok_or_else(|| {
                Error::InvalidState(format!(
                    "segment at {:#x} (tag {}) is asleep as {:?}, without a full host backup",
                    t.ptr, self.tag, t.state
                ))
            })?;
        b.check_fresh(t.ptr, offset, len, &crate::tag::name_of(self.tag))?;
        if b.is_compressed() {
            return Err(Error::Unsupported(format!(
                "segment at {:#x} (tag {}) is asleep with a compressed backup \
                 (OffloadCompressed): its bytes are frames to decode \
                 (backup_frames), not spans to copy",
                t.ptr, self.tag
            )));
        }
        let spans: Vec<HostSpan> = b
            .spans(&s.arena, offset, len, max.max(1))
            .into_iter()
            .map(|(at, host, n)| HostSpan {
                offset: at,
                host: host as usize,
                len: n,
            })
            .collect();
        let held: usize = spans.iter().map(|s| s.len).sum();
        if held != len {
            return Err(Error::InvalidState(format!(
                "the backup of segment {:#x} holds {held} of the {len} bytes at offset {offset}",
                t.ptr
            )));
        }
        Ok(spans)
    }

    /// True when segment `i` (an index into [`Self::segments`]) is asleep
    /// with a compressed backup (OffloadCompressed): its bytes come back
    /// through [`Self::backup_frames`].
    pub fn backup_is_compressed(&self, i: usize) -> bool {
        let t = &self.todo[i];
        t.state == SleepState::Offloaded
            && self
                .engine
                .lock()
                .backups
                .get(&t.ptr)
                .is_some_and(|b| b.is_compressed())
    }

    /// The frames of segment `i`'s compressed backup, in segment order, each
    /// with its encoded bytes' host runs: any engine of the same backend can
    /// decode them into its own memory while this wake holds the backup
    /// (`SleepEngine::decode_frames`). An error when the segment is not
    /// asleep with a compressed backup, or its frames do not cover the
    /// segment's committed bytes.
    pub fn backup_frames(&self, i: usize) -> Result<Vec<BackupFrame>> {
        let t = &self.todo[i];
        let s = self.engine.lock();
        let b = s
            .backups
            .get(&t.ptr)
            .filter(|b| t.state == SleepState::Offloaded && b.is_compressed())
            .ok_or_else(|| {
                Error::InvalidState(format!(
                    "segment at {:#x} (tag {}) is asleep as {:?}, without a compressed host backup",
                    t.ptr, self.tag, t.state
                ))
            })?;
        let mut end = 0usize;
        let mut out = Vec::with_capacity(b.frames.len());
        for (index, f) in b.frames.iter().enumerate() {
            if f.offset != end {
                break;
            }
            end += f.raw_len;
            out.push(BackupFrame {
                index,
                offset: f.offset,
                raw_len: f.raw_len,
                len: f.len,
                runs: b
                    .byte_runs(&s.arena, f.at, f.len)
                    .into_iter()
                    .map(|(host, n, _)| (host as usize, n))
                    .collect(),
            });
        }
        if end != t.committed || out.len() != b.frames.len() {
            return Err(Error::InvalidState(format!(
                "the compressed backup of segment {:#x} (tag {}) holds frames over {end} of its \
                 {} bytes, not one after another from offset 0",
                t.ptr, self.tag, t.committed
            )));
        }
        Ok(out)
    }

    /// Every chunk is mapped and filled: install the handles and mark the
    /// segments awake. The caller has waited for its copies.
    pub fn commit(mut self, segs: TagSegments<'_>) -> CycleReport {
        self.install(segs, true);
        self.release_busy(true);
        self.finished = true;
        let mut r = std::mem::take(&mut self.report);
        r.segments = self.todo.len();
        r
    }

    /// Undo the mapping: once the device is idle, every chunk mapped here is
    /// unmapped and released, and the segments stay asleep with their
    /// backups. When the device refuses to synchronize, the chunks stay mapped
    /// (installed, counted as tracked) and the segments still asleep.
    pub fn abort(mut self, segs: TagSegments<'_>) {
        if !self.unmap_made() {
            self.install(segs, false);
        }
        self.release_busy(false);
        self.finished = true;
    }

    /// Unmap what this wake mapped once the device is idle; false (nothing
    /// unmapped) when it refused to synchronize.
    fn unmap_made(&mut self) -> bool {
        let driver = self.engine.driver.clone();
        if driver.synchronize().is_err() {
            return false;
        }
        wake::unmap_made(driver.as_ref(), &self.todo, &mut self.made);
        true
    }

    fn install(&mut self, segs: TagSegments<'_>, awake: bool) {
        let made = std::mem::take(&mut self.made);
        wake::install(segs, &self.todo, &made, awake);
    }

    fn release_busy(&mut self, woke: bool) {
        self.engine.finish_wake(&self.todo, woke);
    }
}

impl Drop for StagedWake<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // No segment access here: a device that refuses to synchronize
            // keeps the chunks mapped and their handles leak.
            self.unmap_made();
            self.release_busy(false);
        }
    }
}
