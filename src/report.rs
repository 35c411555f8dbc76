//! The memory report: per tag and in total, four quantities kept apart.
//!
//! - **live bytes**: blocks callers hold (freed blocks stop counting at once);
//! - **reserved bytes**: virtual address space of the pool's segments;
//! - **tracked bytes**: the part of that physically backed now;
//! - **device used bytes**: the whole device's used memory (`total - free` as
//!   the driver reports it: every process and allocator, not only this pool).
//!
//! Sleep adds: committed bytes per sleep state, and host backup bytes (the
//! sleep layer records those). Snapshots at named boundaries form a
//! [`Timeline`]. Both print as tables ([`std::fmt::Display`]) and as JSON.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::driver::{BackendKind, MemInfo};
use crate::segment::SleepState;

/// The quantities of one tag, or of all tags together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagUsage {
    /// The tag's name ("total" for the sum).
    pub tag: String,
    /// Bytes of blocks held by callers.
    pub live_bytes: u64,
    /// Number of blocks held by callers.
    pub live_blocks: u64,
    /// Bytes of VA reserved by the pool's segments.
    pub reserved_bytes: u64,
    /// Bytes physically backed now.
    pub tracked_bytes: u64,
    /// Number of segments.
    pub segments: u64,
    /// Committed bytes of segments that are awake.
    pub awake_bytes: u64,
    /// Committed bytes of segments asleep with a host backup.
    pub offloaded_bytes: u64,
    /// Committed bytes of segments asleep with their contents dropped.
    pub discarded_bytes: u64,
    /// Committed bytes of segments asleep, to be reloaded from their checkpoint.
    pub reloadable_bytes: u64,
    /// Bytes of host memory holding backups for this tag (set by the sleep layer).
    pub host_backup_bytes: u64,
    /// Raw bytes those backups restore: more than `host_backup_bytes` when
    /// the tag slept with OffloadCompressed (their ratio is the compression).
    #[serde(default)]
    pub host_backup_raw_bytes: u64,
    /// Whether the tag is asleep (for the total: whether any tag is).
    pub asleep: bool,
}

impl TagUsage {
    /// Zeroes, named `tag`.
    pub fn new(tag: &str) -> TagUsage {
        TagUsage {
            tag: tag.to_owned(),
            ..TagUsage::default()
        }
    }

    /// Count `bytes` committed bytes under `state`.
    pub fn add_sleep_state(&mut self, state: SleepState, bytes: u64) {
        match state {
            SleepState::Awake => self.awake_bytes += bytes,
            SleepState::Offloaded => self.offloaded_bytes += bytes,
            SleepState::Discarded => self.discarded_bytes += bytes,
            SleepState::Reloadable => self.reloadable_bytes += bytes,
        }
    }

    fn add(&mut self, o: &TagUsage) {
        self.live_bytes += o.live_bytes;
        self.live_blocks += o.live_blocks;
        self.reserved_bytes += o.reserved_bytes;
        self.tracked_bytes += o.tracked_bytes;
        self.segments += o.segments;
        self.awake_bytes += o.awake_bytes;
        self.offloaded_bytes += o.offloaded_bytes;
        self.discarded_bytes += o.discarded_bytes;
        self.reloadable_bytes += o.reloadable_bytes;
        self.host_backup_bytes += o.host_backup_bytes;
        self.host_backup_raw_bytes += o.host_backup_raw_bytes;
        self.asleep |= o.asleep;
    }

    /// ", compressed to 70.1% of 2.0 GiB" when the backup holds fewer bytes
    /// than it restores; empty otherwise.
    pub fn compression_note(&self) -> String {
        if self.host_backup_raw_bytes > self.host_backup_bytes {
            format!(
                ", backup compressed to {:.1}% of {}",
                100.0 * self.host_backup_bytes as f64 / self.host_backup_raw_bytes as f64,
                human_bytes(self.host_backup_raw_bytes)
            )
        } else {
            String::new()
        }
    }

    fn asleep_bytes(&self) -> u64 {
        self.offloaded_bytes + self.discarded_bytes + self.reloadable_bytes
    }
}

/// A pool's memory at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The backend's kind: "cuda" or "host" (as the command line's JSON says it).
    pub backend: String,
    /// The device, in words (as the command line's JSON says it).
    pub device: String,
    /// The device's ordinal.
    pub ordinal: i32,
    /// One entry per tag that has segments, is asleep or has a host backup, by tag id.
    pub tags: Vec<TagUsage>,
    /// The sum over `tags`.
    pub total: TagUsage,
    /// The device's used memory (`total - free`, every process), when the driver could tell.
    pub device_used_bytes: Option<u64>,
    /// The device's total memory, when the driver could tell.
    pub device_total_bytes: Option<u64>,
    /// Physical bytes of freed memory the driver has not taken back (it
    /// refused to synchronize, unmap or release): not in any tag's figures,
    /// retried by every later free and trim. 0 in a healthy pool. Rust and
    /// JSON only (the C report struct's layout is frozen).
    #[serde(default)]
    pub leaked_bytes: u64,
    /// Freed segments still waiting to be given back.
    #[serde(default)]
    pub leaked_segments: u64,
    /// VA those segments keep reserved (never handed out again meanwhile).
    #[serde(default)]
    pub leaked_reserved_bytes: u64,
}

impl Report {
    /// Build a report of the device `device` (in words, ordinal `ordinal`) of
    /// backend kind `backend`; `total` is summed from `tags`.
    pub fn new(
        backend: BackendKind,
        device: String,
        ordinal: i32,
        tags: Vec<TagUsage>,
        mem: Option<MemInfo>,
    ) -> Report {
        let mut total = TagUsage::new("total");
        for t in &tags {
            total.add(t);
        }
        Report {
            backend: backend.to_string(),
            device,
            ordinal,
            tags,
            total,
            device_used_bytes: mem.map(|m| m.total.saturating_sub(m.free)),
            device_total_bytes: mem.map(|m| m.total),
            leaked_bytes: 0,
            leaked_segments: 0,
            leaked_reserved_bytes: 0,
        }
    }

    /// The entry of tag `name`, if it has one.
    pub fn tag(&self, name: &str) -> Option<&TagUsage> {
        self.tags.iter().find(|t| t.tag == name)
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }
}

/// Bytes as "12.50 MiB" (binary units), exact below 1 KiB.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if b >= size {
            return format!("{:.2} {name}", b as f64 / size as f64);
        }
    }
    format!("{b} B")
}

fn usage_row(f: &mut fmt::Formatter<'_>, u: &TagUsage) -> fmt::Result {
    let sleep = if u.asleep || u.asleep_bytes() > 0 {
        format!(
            "asleep: {} offloaded, {} discarded, {} reloadable",
            human_bytes(u.offloaded_bytes),
            human_bytes(u.discarded_bytes),
            human_bytes(u.reloadable_bytes)
        )
    } else {
        "awake".to_owned()
    };
    writeln!(
        f,
        "{:<16} {:>12} {:>7} {:>12} {:>12} {:>8} {:>12}  {}",
        u.tag,
        human_bytes(u.live_bytes),
        u.live_blocks,
        human_bytes(u.reserved_bytes),
        human_bytes(u.tracked_bytes),
        u.segments,
        human_bytes(u.host_backup_bytes),
        sleep + &u.compression_note()
    )
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "memory report: {} device {}, {}",
            self.backend, self.ordinal, self.device
        )?;
        writeln!(
            f,
            "{:<16} {:>12} {:>7} {:>12} {:>12} {:>8} {:>12}  state",
            "tag", "live", "blocks", "reserved", "tracked", "segments", "host backup"
        )?;
        for t in &self.tags {
            usage_row(f, t)?;
        }
        usage_row(f, &self.total)?;
        match (self.device_used_bytes, self.device_total_bytes) {
            (Some(used), Some(total)) => writeln!(
                f,
                "device used: {} of {} (whole device, every process and allocator)",
                human_bytes(used),
                human_bytes(total)
            ),
            _ => writeln!(f, "device used: unknown (the driver did not report it)"),
        }
    }
}

/// One named boundary of a timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Boundary {
    /// The name given to `snapshot`.
    pub name: String,
    /// Seconds since the pool was created.
    pub at_s: f64,
    /// The report at that moment.
    pub report: Report,
}

/// Most boundaries a pool's timeline keeps; older ones are dropped (and counted).
pub const TIMELINE_CAP: usize = 1024;

/// Longest snapshot name, in bytes.
pub const MAX_SNAPSHOT_NAME: usize = 256;

/// Refuse a snapshot name over [`MAX_SNAPSHOT_NAME`] bytes.
pub fn check_snapshot_name(name: &str) -> crate::error::Result<()> {
    if name.len() > MAX_SNAPSHOT_NAME {
        return Err(crate::error::Error::InvalidArgument(format!(
            "snapshot name of {} bytes is over the limit of {MAX_SNAPSHOT_NAME}",
            name.len()
        )));
    }
    Ok(())
}

/// Snapshots at named boundaries, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// The boundaries kept (the last [`TIMELINE_CAP`]).
    pub boundaries: Vec<Boundary>,
    /// Older boundaries dropped to stay under the cap.
    pub dropped: u64,
}

impl Timeline {
    /// The timeline as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a timeline always serializes")
    }
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Wide enough for the longest boundary name and the indented tags.
        let w = self
            .boundaries
            .iter()
            .flat_map(|b| {
                std::iter::once(b.name.chars().count())
                    .chain(b.report.tags.iter().map(|u| u.tag.chars().count() + 2))
            })
            .max()
            .unwrap_or(0)
            .max(24);
        writeln!(
            f,
            "{:<w$} {:>9} {:>12} {:>12} {:>12} {:>12} {:>12}",
            "boundary", "t (s)", "live", "reserved", "tracked", "host backup", "device used"
        )?;
        for b in &self.boundaries {
            let t = &b.report.total;
            writeln!(
                f,
                "{:<w$} {:>9.3} {:>12} {:>12} {:>12} {:>12} {:>12}",
                b.name,
                b.at_s,
                human_bytes(t.live_bytes),
                human_bytes(t.reserved_bytes),
                human_bytes(t.tracked_bytes),
                human_bytes(t.host_backup_bytes),
                b.report
                    .device_used_bytes
                    .map_or_else(|| "unknown".to_owned(), human_bytes)
            )?;
            for u in &b.report.tags {
                writeln!(
                    f,
                    "  {:<w2$} {:>9} {:>12} {:>12} {:>12} {:>12}{}",
                    u.tag,
                    "",
                    human_bytes(u.live_bytes),
                    human_bytes(u.reserved_bytes),
                    human_bytes(u.tracked_bytes),
                    human_bytes(u.host_backup_bytes),
                    u.compression_note(),
                    w2 = w - 2,
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_sums_tags_and_device_used_is_total_minus_free() {
        let mut a = TagUsage::new("weights");
        a.live_bytes = 10;
        a.tracked_bytes = 20;
        a.add_sleep_state(SleepState::Offloaded, 20);
        let mut b = TagUsage::new("kv_cache");
        b.live_bytes = 5;
        b.reserved_bytes = 7;
        let r = Report::new(
            BackendKind::Host,
            "host (simulated)".into(),
            3,
            vec![a, b],
            Some(MemInfo {
                free: 30,
                total: 100,
            }),
        );
        assert_eq!(r.total.live_bytes, 15);
        assert_eq!(r.total.tracked_bytes, 20);
        assert_eq!(r.total.offloaded_bytes, 20);
        assert_eq!(r.device_used_bytes, Some(70));
        let text = r.to_string();
        assert!(
            text.contains("weights") && text.contains("kv_cache"),
            "{text}"
        );
        assert!(text.contains("offloaded"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["total"]["live_bytes"], 15);
        assert_eq!(json["device_used_bytes"], 70);
        // One vocabulary with the command line's JSON: backend = kind, device = words.
        assert_eq!(json["backend"], "host");
        assert_eq!(json["device"], "host (simulated)");
        assert_eq!(json["ordinal"], 3);
        assert!(
            text.starts_with("memory report: host device 3, host (simulated)"),
            "{text}"
        );
    }

    #[test]
    fn timeline_columns_stay_aligned_with_long_names() {
        let report = |tag: &str| {
            Report::new(
                BackendKind::Host,
                "host".into(),
                0,
                vec![TagUsage::new(tag)],
                None,
            )
        };
        let tl = Timeline {
            boundaries: vec![
                Boundary {
                    name: "short".into(),
                    at_s: 0.5,
                    report: report("weights"),
                },
                Boundary {
                    name: "asleep (weights offloaded, cache discarded)".into(),
                    at_s: 12.25,
                    report: report("a_tag_name_longer_than_the_column"),
                },
            ],
            dropped: 0,
        };
        let text = tl.to_string();
        let lines: Vec<&str> = text.lines().collect();
        // Header and boundary rows share one layout; tag rows another.
        let col = |l: &str| l.find(" B").unwrap_or(0);
        assert_eq!(lines[0].len(), lines[1].len(), "{text}");
        assert_eq!(lines[0].len(), lines[3].len(), "{text}");
        assert_eq!(col(lines[1]), col(lines[3]), "{text}");
        assert_eq!(lines[2].len(), lines[4].len(), "{text}");
    }

    #[test]
    fn human_bytes_picks_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.00 MiB");
        assert_eq!(human_bytes(5 << 30), "5.00 GiB");
    }
}
