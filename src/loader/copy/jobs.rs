//! Cutting extents into work: page-aligned registered windows for the direct
//! path, slot-sized jobs for staging, and Hybrid's split between the two.

use super::extents::clip_src;
use super::{page_down, PAGE};
use crate::loader::checkpoint::Shard;
use crate::loader::plan::Extent;

/// A registered-window job: the part of the file `[lo, hi)` and the copies from it.
#[derive(Debug)]
pub(super) struct Window {
    pub(super) shard: usize,
    pub(super) lo: u64,
    pub(super) hi: u64,
    pub(super) pieces: Vec<Extent>,
}

impl Window {
    pub(super) fn bytes(&self) -> u64 {
        self.pieces.iter().map(Extent::src_bytes).sum()
    }
}

/// A staging job: pieces whose source bytes fit one slot together.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) pieces: Vec<Extent>,
    pub(super) bytes: u64,
}

/// Cut the (sorted, non-converting) extents into page-aligned, disjoint
/// windows of at most `wbytes` over the bytes they read.
pub(super) fn make_windows(shards: &[Shard], extents: &[Extent], wbytes: u64) -> Vec<Window> {
    let wbytes = wbytes.div_ceil(PAGE) * PAGE;
    // Merged page-aligned spans per shard.
    let mut spans: Vec<(usize, u64, u64)> = Vec::new();
    for e in extents {
        let shard = e.shard as usize;
        let lo = page_down(e.src);
        let end = e.src + (e.height - 1) * e.src_pitch + e.width;
        let hi = end.div_ceil(PAGE) * PAGE;
        match spans.last_mut() {
            Some((s, a, b)) if *s == shard && lo <= *b + (1 << 20) => {
                *a = (*a).min(lo);
                *b = (*b).max(hi);
            }
            _ => spans.push((shard, lo, hi)),
        }
    }
    let mut windows = Vec::new();
    let mut first = 0usize;
    for (shard, a, b) in spans {
        let cap = shards[shard].len.div_ceil(PAGE) * PAGE;
        let b = b.min(cap);
        let mut lo = a;
        while lo < b {
            let hi = (lo + wbytes).min(b);
            let mut pieces = Vec::new();
            // Extents are sorted by start; skip those that end before this window.
            while first < extents.len() && {
                let e = &extents[first];
                (e.shard as usize) < shard
                    || (e.shard as usize == shard
                        && e.src + (e.height - 1) * e.src_pitch + e.width <= lo
                        && e.height == 1)
            } {
                first += 1;
            }
            for e in &extents[first..] {
                if e.shard as usize != shard || e.src >= hi {
                    break;
                }
                clip_src(e, lo, hi, &mut pieces);
            }
            if !pieces.is_empty() {
                windows.push(Window {
                    shard,
                    lo,
                    hi,
                    pieces,
                });
            }
            lo = hi;
        }
    }
    windows
}

/// Split extents into pieces of at most `slot` source bytes (row groups, or
/// 4 KiB-multiple chunks of one row: element-aligned for every dtype) and pack
/// them, in file order, into jobs of one shard each.
pub(super) fn make_jobs(extents: &[Extent], slot: u64) -> Vec<Job> {
    let chunk = (slot / PAGE).max(1) * PAGE;
    let mut pieces = Vec::new();
    for e in extents {
        if e.width <= slot {
            let per = (slot / e.width.max(1)).max(1);
            let mut r = 0;
            while r < e.height {
                let n = per.min(e.height - r);
                pieces.push(Extent {
                    src: e.src + r * e.src_pitch,
                    dst: e.dst + r * e.dst_pitch,
                    height: n,
                    ..*e
                });
                r += n;
            }
        } else {
            for r in 0..e.height {
                let mut off = 0;
                while off < e.width {
                    let n = chunk.min(e.width - off);
                    let dst_off = match e.convert {
                        Some((f, t)) => off / f.size() as u64 * t.size() as u64,
                        None => off,
                    };
                    let mut p = Extent {
                        src: e.src + r * e.src_pitch + off,
                        dst: e.dst + r * e.dst_pitch + dst_off,
                        width: n,
                        height: 1,
                        ..*e
                    };
                    p.src_pitch = n;
                    p.dst_pitch = p.dst_width();
                    pieces.push(p);
                    off += n;
                }
            }
        }
    }
    let mut jobs: Vec<Job> = Vec::new();
    for p in pieces {
        let b = p.src_bytes();
        match jobs.last_mut() {
            // A job reads one shard (its fill reads one file).
            Some(j) if j.bytes + b <= slot && j.pieces[0].shard == p.shard => {
                j.bytes += b;
                j.pieces.push(p);
            }
            _ => jobs.push(Job {
                pieces: vec![p],
                bytes: b,
            }),
        }
    }
    jobs
}

/// Hybrid's split: every extent without conversion is a candidate for direct;
/// whole extents go there, in file order spread evenly, until `percent` of the bytes.
pub(super) fn hybrid_split(extents: &[Extent], percent: u8) -> (Vec<Extent>, Vec<Extent>) {
    let total: u64 = extents.iter().map(Extent::src_bytes).sum();
    let goal = total / 100 * percent.min(100) as u64;
    let (mut direct, mut staged) = (Vec::new(), Vec::new());
    let (mut seen, mut sent) = (0u64, 0u64);
    for e in extents {
        seen += e.src_bytes();
        // Keep the direct share proportional to the bytes seen so far.
        if e.convert.is_none() && sent < goal && sent * 100 < seen * percent as u64 {
            sent += e.src_bytes();
            direct.push(*e);
        } else {
            staged.push(*e);
        }
    }
    (direct, staged)
}
