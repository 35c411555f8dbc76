//! The wake of replicas from a compressed backup (the holder slept with
//! [`Policy::OffloadCompressed`](crate::sleep::Policy::OffloadCompressed)):
//! the holder's frames are shared among the members, each member's device
//! copies its frames from the pinned backup and decodes them into its own
//! memory (all devices at once, each with its own codec ring), then every
//! device pulls the decoded ranges it lacks from the member that decoded them
//! over peer copies. A device that cannot read a member's memory decodes that
//! member's frames itself instead. Frames are independent, so the share is
//! cut by encoded bytes: each link carries about 1/N of the backup.
//!
//! A holder segment whose backup holds raw bytes (a sleep of the holder that
//! stopped midway and was finished with another policy) is shared the same
//! way as spans to copy. Every verdict of every device is read before this
//! returns; the caller commits or aborts the members' staged wakes.

use std::sync::Arc;
use std::time::Instant;

use super::stream_copies::{copy_spans, with_streams};
use super::threads::on_threads;
use crate::driver::{DevicePtr, Driver};
use crate::error::{Error, Result};
use crate::sleep::{BackupFrame, HostSpan, SleepEngine, StagedWake};
use crate::tag::TagId;

/// How one unit of the holder's backup is held.
#[derive(Debug)]
enum Held {
    /// A codec frame: copied and decoded.
    Frame(BackupFrame),
    /// Raw bytes: copied.
    Span(HostSpan),
}

/// One unit of the holder's backup: segment `seg` (an index into the
/// creation order), bytes `[offset, offset + raw_len)`, `host_len` bytes in
/// host memory.
#[derive(Debug)]
struct Unit {
    seg: usize,
    offset: usize,
    raw_len: usize,
    host_len: usize,
    held: Held,
}

/// The members of a wake, by index: their drivers, engines, tags, segment
/// bases (in creation order, the i-th of each holding the same bytes) and
/// which member's memory each may read.
pub(super) struct Members<'a> {
    pub drivers: Vec<Arc<dyn Driver>>,
    pub engines: Vec<&'a SleepEngine>,
    pub tags: Vec<TagId>,
    pub dsts: Vec<Vec<DevicePtr>>,
    /// `peer[k][j]`: device k may read device j's memory of the tag.
    pub peer: Vec<Vec<bool>>,
    /// Largest copy on one stream.
    pub piece: usize,
}

/// What the wake moved.
#[derive(Debug, Default)]
pub(super) struct Moved {
    /// Backup bytes read from host memory (encoded bytes for frames).
    pub host_bytes: u64,
    /// Raw bytes the devices decoded from frames, all together.
    pub decoded_bytes: u64,
    /// Bytes pulled between devices.
    pub peer_bytes: u64,
    pub host_seconds: f64,
    pub peer_seconds: f64,
}

/// A failure on member `device`, during `step`.
pub(super) struct Failed {
    pub device: usize,
    pub step: &'static str,
    pub error: Error,
}

/// True when any of the holder's segments `segs` (staged indices) is asleep
/// with a compressed backup.
pub(super) fn any_compressed(holder: &StagedWake<'_>, segs: &[usize]) -> bool {
    segs.iter().any(|&i| holder.backup_is_compressed(i))
}

/// Device bytes each of `engines` may map for its codec scratch in this wake:
/// room for every frame of the holder's backup (with peer copies off, or no
/// peer in reach, a device decodes them all); none for a raw backup.
pub(super) fn scratch_bytes(
    holder: &StagedWake<'_>,
    segs: &[usize],
    engines: &[&SleepEngine],
) -> Result<Vec<u64>> {
    let (mut largest, mut frames) = (0usize, 0usize);
    for &i in segs {
        if holder.backup_is_compressed(i) {
            for f in holder.backup_frames(i)? {
                largest = largest.max(f.raw_len);
                frames += 1;
            }
        }
    }
    Ok(engines
        .iter()
        .map(|e| e.decode_scratch_bytes(largest, frames))
        .collect())
}

/// The holder's backup as units: `segs[i]` is the staged index of the
/// segment at creation-order index i, `sizes[i]` its committed bytes.
fn units(
    holder: &StagedWake<'_>,
    segs: &[usize],
    sizes: &[usize],
    piece: usize,
) -> Result<Vec<Unit>> {
    let mut out = Vec::new();
    for (seg, (&i, &size)) in segs.iter().zip(sizes).enumerate() {
        if holder.backup_is_compressed(i) {
            out.extend(holder.backup_frames(i)?.into_iter().map(|f| Unit {
                seg,
                offset: f.offset,
                raw_len: f.raw_len,
                host_len: f.len,
                held: Held::Frame(f),
            }));
        } else {
            out.extend(
                holder
                    .backup_spans(i, 0, size, piece)?
                    .into_iter()
                    .map(|s| Unit {
                        seg,
                        offset: s.offset,
                        raw_len: s.len,
                        host_len: s.len,
                        held: Held::Span(s),
                    }),
            );
        }
    }
    Ok(out)
}

/// The member each unit goes to first: `n` contiguous runs of units of
/// about equal host bytes (a unit goes where its middle byte falls).
fn owners(host_lens: &[usize], n: usize) -> Vec<usize> {
    let total: u128 = host_lens.iter().map(|&l| l as u128).sum();
    let mut before = 0u128;
    host_lens
        .iter()
        .map(|&l| {
            let mid = 2 * before + l as u128;
            before += l as u128;
            if total == 0 {
                0
            } else {
                ((mid * n as u128 / (2 * total)) as usize).min(n - 1)
            }
        })
        .collect()
}

/// Restore every member from the holder's backup, as the module docs say.
/// `holder_segs[i]` is the holder's staged index of creation-order segment
/// i, `sizes[i]` its committed bytes. Every member's memory is mapped.
pub(super) fn restore(
    m: &Members<'_>,
    holder: &StagedWake<'_>,
    holder_segs: &[usize],
    sizes: &[usize],
    holder_index: usize,
) -> std::result::Result<Moved, Failed> {
    let n = m.drivers.len();
    let on_holder = |error| Failed {
        device: holder_index,
        step: "listing its backup's frames",
        error,
    };
    let units = units(holder, holder_segs, sizes, m.piece).map_err(on_holder)?;
    let owner = owners(&units.iter().map(|u| u.host_len).collect::<Vec<_>>(), n);
    let mut moved = Moved::default();

    // Phase 1: device k copies and decodes its units, and those of every
    // member whose memory it cannot read, all devices at once.
    let t = Instant::now();
    let results = on_threads(n, "a device's wake thread", |k| {
        let d = m.drivers[k].as_ref();
        let mine = (0..units.len()).filter(|&u| owner[u] == k || !m.peer[k][owner[u]]);
        let mut spans: Vec<(usize, HostSpan)> = Vec::new();
        let mut frames: Vec<(DevicePtr, &BackupFrame)> = Vec::new();
        for u in mine.map(|u| &units[u]) {
            match &u.held {
                Held::Span(s) => spans.push((u.seg, *s)),
                Held::Frame(f) => frames.push((m.dsts[k][u.seg], f)),
            }
        }
        // SAFETY: every member's memory is mapped and in its staged wake;
        // the spans and frames lie in the holder's backup, busy (kept and
        // unchanged) for this wake; the copies are waited for.
        let mut host = with_streams(d, |st| unsafe { copy_spans(d, &m.dsts[k], &spans, st) })?;
        // SAFETY: as above; this member's engine is in its staged wake.
        host += unsafe { m.engines[k].decode_frames(m.tags[k], &frames) }?;
        let decoded: usize = frames.iter().map(|f| f.1.raw_len).sum();
        Ok((host, decoded as u64))
    });
    for (k, r) in results.into_iter().enumerate() {
        let (host, decoded) = r.map_err(|error| Failed {
            device: k,
            step: "copying and decoding its frames of the backup",
            error,
        })?;
        moved.host_bytes += host;
        moved.decoded_bytes += decoded;
    }
    moved.host_seconds = t.elapsed().as_secs_f64();

    // Phase 2: device k pulls the units the others restored, where it can
    // read their memory.
    let t = Instant::now();
    let results = on_threads(n, "a device's wake thread", |k| {
        let d = m.drivers[k].as_ref();
        with_streams(d, |st| {
            let (mut bytes, mut i) = (0u64, 0usize);
            for (u, unit) in units.iter().enumerate() {
                let j = owner[u];
                if j == k || !m.peer[k][j] {
                    continue;
                }
                let mut at = 0usize;
                while at < unit.raw_len {
                    let len = m.piece.min(unit.raw_len - at);
                    let off = (unit.offset + at) as u64;
                    // SAFETY: both segments are mapped and of equal committed
                    // size; device k may read device j's (checked by the
                    // caller); device j restored these bytes in phase 1; the
                    // streams are synchronized before return.
                    unsafe {
                        d.copy_peer_async(
                            m.dsts[k][unit.seg] + off,
                            m.dsts[j][unit.seg] + off,
                            m.drivers[j].device(),
                            len,
                            st[i % 2],
                        )?
                    };
                    i += 1;
                    at += len;
                    bytes += len as u64;
                }
            }
            Ok(bytes)
        })
    });
    for (k, r) in results.into_iter().enumerate() {
        moved.peer_bytes += r.map_err(|error| Failed {
            device: k,
            step: "pulling decoded ranges from its peers",
            error,
        })?;
    }
    moved.peer_seconds = t.elapsed().as_secs_f64();
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::owners;

    #[test]
    fn owners_are_contiguous_and_balanced_by_host_bytes() {
        let lens = [100, 70, 70, 100, 30, 70, 100, 64, 90, 5];
        for n in 1..=4 {
            let o = owners(&lens, n);
            assert!(o.windows(2).all(|w| w[0] <= w[1]), "n={n}: {o:?}");
            assert!(o.iter().all(|&k| k < n));
            let total: usize = lens.iter().sum();
            for k in 0..n {
                let mine: usize = (0..lens.len())
                    .filter(|&u| o[u] == k)
                    .map(|u| lens[u])
                    .sum();
                assert!(
                    mine.abs_diff(total / n) <= 100,
                    "n={n}: member {k} has {mine} of {total}"
                );
            }
        }
        assert_eq!(owners(&[0, 0], 3), vec![0, 0]);
        assert!(owners(&[], 2).is_empty());
    }
}
