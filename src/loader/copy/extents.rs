//! Clipping extents to byte ranges: the rows of a 2D region that fall in
//! `[lo, hi)`, and the sub-extents that copy just those.

use crate::loader::plan::Extent;

/// The part of `e` whose source bytes lie in `[lo, hi)`, as up to three
/// extents (partial first row, whole rows, partial last row). Byte-exact cuts:
/// only for extents without conversion.
pub(crate) fn clip_src(e: &Extent, lo: u64, hi: u64, out: &mut Vec<Extent>) {
    for seg in clip_rows(e.src, e.src_pitch, e.width, e.height, lo, hi) {
        out.push(sub_extent(e, seg, 1, 1));
    }
}

/// A run of rows `[r0, r1)` of a 2D region, or one row's bytes `[a, b)` (then `r1 == r0 + 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowSeg {
    pub r0: u64,
    pub r1: u64,
    pub bytes: Option<(u64, u64)>,
}

/// The rows of a region (`height` rows of `width` bytes, `pitch` apart from
/// `start`) that intersect `[lo, hi)`: whole rows as runs, cut rows as byte ranges.
pub(crate) fn clip_rows(
    start: u64,
    pitch: u64,
    width: u64,
    height: u64,
    lo: u64,
    hi: u64,
) -> Vec<RowSeg> {
    let mut out = Vec::new();
    let (p, w) = (pitch.max(width), width);
    if w == 0 || height == 0 || hi <= start || lo >= hi {
        return out;
    }
    let r_lo = if lo < start + w {
        0
    } else {
        (lo - start - w) / p + 1
    };
    let r_hi = (hi - start).div_ceil(p).min(height);
    let mut r = r_lo;
    while r < r_hi {
        let s = start + r * p;
        if s >= lo && s + w <= hi {
            let last = ((hi - w - start) / p + 1).min(r_hi);
            out.push(RowSeg {
                r0: r,
                r1: last,
                bytes: None,
            });
            r = last;
        } else {
            let a = s.max(lo);
            let b = (s + w).min(hi);
            if a < b {
                out.push(RowSeg {
                    r0: r,
                    r1: r + 1,
                    bytes: Some((a - s, b - s)),
                });
            }
            r += 1;
        }
    }
    out
}

/// The sub-extent of `e` for a row segment; byte offsets are in units where
/// `num/den` converts them to source bytes (1/1 for source-side cuts).
pub(crate) fn sub_extent(e: &Extent, seg: RowSeg, num: u64, den: u64) -> Extent {
    match seg.bytes {
        None => {
            let mut x = Extent {
                src: e.src + seg.r0 * e.src_pitch,
                dst: e.dst + seg.r0 * e.dst_pitch,
                height: seg.r1 - seg.r0,
                ..*e
            };
            if x.height == 1 {
                x.src_pitch = x.width;
                x.dst_pitch = x.dst_width();
            }
            x
        }
        Some((a, b)) => {
            let (sa, sb) = (a * num / den, b * num / den);
            let mut x = Extent {
                src: e.src + seg.r0 * e.src_pitch + sa,
                width: sb - sa,
                height: 1,
                ..*e
            };
            let dst_a = match e.convert {
                Some((f, t)) => sa / f.size() as u64 * t.size() as u64,
                None => sa,
            };
            x.dst = e.dst + seg.r0 * e.dst_pitch + dst_a;
            x.src_pitch = x.width;
            x.dst_pitch = x.dst_width();
            x
        }
    }
}
