//! Cutting a plan's copies by the byte ranges a source delivers: the rows of
//! one [`Extent`] that a [`Piece`] holds, as at most three copies (a partial
//! first row, the whole rows between as one 2D copy, a partial last row).

use super::source::{Bytes, Piece};
use crate::driver::DevicePtr;
use crate::loader::Extent;

/// One copy: `height` rows of `width` bytes, `src_pitch` apart at `src` and
/// `dst_pitch` apart at `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy2d {
    /// Destination of the first row.
    pub dst: DevicePtr,
    /// Bytes between destination rows.
    pub dst_pitch: u64,
    /// Source of the first row.
    pub src: Bytes,
    /// Bytes between source rows.
    pub src_pitch: u64,
    /// Bytes per row.
    pub width: u64,
    /// Rows.
    pub height: u64,
}

fn offset(at: Bytes, by: u64) -> Bytes {
    match at {
        Bytes::Device(p) => Bytes::Device(p + by),
        Bytes::Host(p) => Bytes::Host(p.wrapping_add(by as usize)),
    }
}

/// The copies moving the bytes of `e` (whose `src` is an offset in the
/// piece's tensor) that `piece` holds.
pub fn cut(e: &Extent, piece: &Piece, out: &mut Vec<Copy2d>) {
    let (a, b) = (piece.offset, piece.offset + piece.len);
    let (s0, p, w, h) = (e.src, e.src_pitch.max(1), e.width, e.height);
    if w == 0 || h == 0 || b <= s0 {
        return;
    }
    // Rows r with s0 + r*p < b and s0 + r*p + w > a.
    let first = if a < s0 + w { 0 } else { (a - s0 - w) / p + 1 };
    let end = h.min((b - s0).div_ceil(p));
    if first >= end {
        return;
    }
    let src_of = |x: u64| offset(piece.at, x - a);
    let row = |r: u64| (s0 + r * p, e.dst + r * e.dst_pitch);
    let mut push_part = |r: u64| {
        let (rs, rd) = row(r);
        let (lo, hi) = (rs.max(a), (rs + w).min(b));
        if lo < hi {
            out.push(Copy2d {
                dst: rd + (lo - rs),
                dst_pitch: hi - lo,
                src: src_of(lo),
                src_pitch: hi - lo,
                width: hi - lo,
                height: 1,
            });
        }
    };
    let whole = |r: u64| {
        let (rs, _) = row(r);
        rs >= a && rs + w <= b
    };
    let (mut lo, mut hi) = (first, end);
    if !whole(lo) {
        push_part(lo);
        lo += 1;
    }
    if hi > lo && !whole(hi - 1) {
        hi -= 1;
        push_part(hi);
    }
    if hi > lo {
        let (rs, rd) = row(lo);
        out.push(Copy2d {
            dst: rd,
            dst_pitch: e.dst_pitch,
            src: src_of(rs),
            src_pitch: p,
            width: w,
            height: hi - lo,
        });
    }
}

/// Byte ranges of each tensor delivered so far: refuses a range delivered
/// twice; complete when every tensor is wholly covered.
#[derive(Debug, Clone, Default)]
pub struct Coverage {
    /// Per tensor: delivered ranges, sorted, not overlapping.
    got: Vec<Vec<(u64, u64)>>,
    done: Vec<u64>,
}

impl Coverage {
    /// Nothing delivered of `n` tensors.
    pub fn new(n: usize) -> Coverage {
        Coverage {
            got: vec![Vec::new(); n],
            done: vec![0; n],
        }
    }

    /// Record `[a, b)` of tensor `t`; Err with the range it overlaps.
    pub fn add(&mut self, t: usize, a: u64, b: u64) -> std::result::Result<(), (u64, u64)> {
        let v = &mut self.got[t];
        let i = v.partition_point(|&(s, _)| s < a);
        if i > 0 && v[i - 1].1 > a {
            return Err(v[i - 1]);
        }
        if i < v.len() && v[i].0 < b {
            return Err(v[i]);
        }
        v.insert(i, (a, b));
        self.done[t] += b - a;
        Ok(())
    }

    /// Bytes delivered of tensor `t`.
    pub fn delivered(&self, t: usize) -> u64 {
        self.done[t]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(src: u64, src_pitch: u64, width: u64, height: u64) -> Extent {
        Extent {
            shard: 0,
            src,
            src_pitch,
            width,
            height,
            dst: 10_000,
            dst_pitch: 100,
            convert: None,
            source: 0,
        }
    }

    /// Apply the cuts of every piece to byte arrays and compare with the
    /// whole extent copied at once.
    fn check(e: Extent, cuts: &[u64]) {
        let tensor: Vec<u8> = (0..2000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut want = vec![0u8; 20_000];
        for r in 0..e.height {
            let s = (e.src + r * e.src_pitch) as usize;
            let d = (e.dst + r * e.dst_pitch) as usize;
            want[d..d + e.width as usize].copy_from_slice(&tensor[s..s + e.width as usize]);
        }
        let mut got = vec![0u8; 20_000];
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(tensor.len() as u64);
        for w in bounds.windows(2) {
            let piece = Piece {
                tensor: 0,
                offset: w[0],
                len: w[1] - w[0],
                at: Bytes::Device(1_000_000 + w[0]),
            };
            let mut out = Vec::new();
            cut(&e, &piece, &mut out);
            assert!(out.len() <= 3);
            for c in out {
                let Bytes::Device(s) = c.src else { panic!() };
                let s = (s - 1_000_000) as usize;
                for r in 0..c.height as usize {
                    let (so, d) = (
                        s + r * c.src_pitch as usize,
                        c.dst as usize + r * c.dst_pitch as usize,
                    );
                    assert!(so >= w[0] as usize && so + (c.width as usize) <= w[1] as usize);
                    got[d..d + c.width as usize]
                        .copy_from_slice(&tensor[so..so + c.width as usize]);
                }
            }
        }
        assert_eq!(got, want, "{e:?} cut at {cuts:?}");
    }

    #[test]
    fn pieces_cut_anywhere_rebuild_the_extent() {
        for e in [
            ext(0, 64, 64, 10),
            ext(32, 64, 16, 20),
            ext(100, 100, 100, 1),
            ext(7, 50, 13, 30),
        ] {
            for cuts in [
                vec![],
                vec![1],
                vec![40],
                vec![64, 128],
                vec![33, 90, 91, 500, 1499],
            ] {
                check(e, &cuts);
            }
            for step in [1u64, 17, 64, 333] {
                let cuts: Vec<u64> = (1..).map(|k| k * step).take_while(|&x| x < 2000).collect();
                check(e, &cuts);
            }
        }
    }

    #[test]
    fn coverage_refuses_overlap_and_counts_bytes() {
        let mut c = Coverage::new(2);
        c.add(0, 10, 20).unwrap();
        c.add(0, 0, 10).unwrap();
        assert_eq!(c.add(0, 15, 30), Err((10, 20)));
        assert_eq!(c.add(0, 5, 6), Err((0, 10)));
        c.add(0, 20, 30).unwrap();
        assert_eq!(c.delivered(0), 30);
        assert_eq!(c.delivered(1), 0);
    }
}
