//! What a pool reports of itself: the memory report per tag and in total,
//! and the timeline of named snapshots.

use std::collections::BTreeMap;

use super::Pool;
use crate::report::{Boundary, Report, TagUsage, Timeline};
use crate::segment::SleepState;
use crate::tag::{self, TagId};

impl Pool {
    /// The memory report now: per tag and in total.
    pub fn report(&self) -> Report {
        let mut usage: BTreeMap<TagId, TagUsage> = BTreeMap::new();
        let unreleased = {
            let st = self.lock();
            for e in st.segs.values() {
                let u = usage
                    .entry(e.tag)
                    .or_insert_with(|| TagUsage::new(&tag::name_of(e.tag)));
                u.live_bytes += e.live_bytes as u64;
                u.live_blocks += e.live_blocks as u64;
                u.reserved_bytes += e.seg.reserved() as u64;
                u.tracked_bytes += e.seg.mapped_bytes() as u64;
                u.segments += 1;
                // A segment a failed sleep left partly mapped counts its
                // mapped chunks as awake: never asleep while memory is there.
                let (committed, mapped) = (e.seg.committed() as u64, e.seg.mapped_bytes() as u64);
                match e.seg.sleep_state() {
                    SleepState::Awake => u.add_sleep_state(SleepState::Awake, committed),
                    s => {
                        u.add_sleep_state(s, committed.saturating_sub(mapped));
                        u.add_sleep_state(SleepState::Awake, mapped.min(committed));
                    }
                }
            }
            // Backup bytes straight from the sleep engine (pool lock, then
            // engine lock: the allowed order), so frees and trims show at once.
            let backups = self.sleep.backup_bytes_by_tag();
            let raw = self.sleep.backup_raw_bytes_by_tag();
            for (&t, ts) in &st.tags {
                let backup = backups.get(&t).copied().unwrap_or(0);
                if ts.asleep || backup > 0 {
                    let u = usage
                        .entry(t)
                        .or_insert_with(|| TagUsage::new(&tag::name_of(t)));
                    u.asleep = ts.asleep;
                    u.host_backup_bytes = backup;
                    u.host_backup_raw_bytes = raw.get(&t).copied().unwrap_or(0);
                }
            }
            Self::unreleased_locked(&st)
        };
        let mem = self.driver.mem_info().ok();
        let mut r = Report::new(
            self.driver.kind(),
            self.driver.describe(),
            self.device(),
            usage.into_values().collect(),
            mem,
        );
        r.leaked_bytes = unreleased.bytes;
        r.leaked_segments = unreleased.segments;
        r.leaked_reserved_bytes = unreleased.reserved_bytes;
        r
    }

    /// Take a report and record it in the timeline as boundary `name`. The
    /// timeline keeps the last [`TIMELINE_CAP`](crate::report::TIMELINE_CAP)
    /// boundaries (older ones are dropped and counted). A name longer than
    /// [`MAX_SNAPSHOT_NAME`](crate::report::MAX_SNAPSHOT_NAME) bytes is cut
    /// there (the C call refuses it instead).
    pub fn snapshot(&self, name: &str) -> Report {
        let report = self.report();
        let at_s = self.created.elapsed().as_secs_f64();
        let mut cut = name.len().min(crate::report::MAX_SNAPSHOT_NAME);
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut st = self.lock();
        if st.timeline.len() >= crate::report::TIMELINE_CAP {
            st.timeline.pop_front();
            st.timeline_dropped += 1;
        }
        st.timeline.push_back(Boundary {
            name: name[..cut].to_owned(),
            at_s,
            report: report.clone(),
        });
        report
    }

    /// The snapshots kept, oldest first, and how many were dropped.
    pub fn timeline(&self) -> Timeline {
        let st = self.lock();
        Timeline {
            boundaries: st.timeline.iter().cloned().collect(),
            dropped: st.timeline_dropped,
        }
    }

    /// Forget every snapshot (and the dropped count). Returns how many were kept.
    pub fn clear_timeline(&self) -> usize {
        let mut st = self.lock();
        st.timeline_dropped = 0;
        std::mem::take(&mut st.timeline).len()
    }
}
