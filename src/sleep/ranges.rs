//! Sets of device byte ranges: sorted, disjoint, merged `(start, len)` lists,
//! for what a reload source still covers and what a Reload sleep must back up.

use crate::driver::DevicePtr;

/// Sorted, merged, non-empty ranges from any list of `(start, len)`.
pub fn normalize(mut v: Vec<(DevicePtr, usize)>) -> Vec<(DevicePtr, usize)> {
    v.retain(|&(_, l)| l > 0);
    v.sort_unstable();
    let mut out: Vec<(DevicePtr, usize)> = Vec::with_capacity(v.len());
    for (a, l) in v {
        match out.last_mut() {
            Some((s, n)) if *s + *n as u64 >= a => {
                *n = ((a + l as u64).max(*s + *n as u64) - *s) as usize;
            }
            _ => out.push((a, l)),
        }
    }
    out
}

/// `set` without the bytes of `[lo, lo+len)`. `set` is normalized; so is the result.
pub fn subtract(set: &[(DevicePtr, usize)], lo: DevicePtr, len: usize) -> Vec<(DevicePtr, usize)> {
    let hi = lo + len as u64;
    let mut out = Vec::with_capacity(set.len() + 1);
    for &(a, l) in set {
        let b = a + l as u64;
        if b <= lo || a >= hi {
            out.push((a, l));
            continue;
        }
        if a < lo {
            out.push((a, (lo - a) as usize));
        }
        if b > hi {
            out.push((hi, (b - hi) as usize));
        }
    }
    out
}

/// The bytes of `set` inside `[lo, lo+len)`. `set` is normalized; so is the result.
pub fn intersect(set: &[(DevicePtr, usize)], lo: DevicePtr, len: usize) -> Vec<(DevicePtr, usize)> {
    let hi = lo + len as u64;
    set.iter()
        .filter_map(|&(a, l)| {
            let (s, e) = (a.max(lo), (a + l as u64).min(hi));
            (s < e).then(|| (s, (e - s) as usize))
        })
        .collect()
}

/// Total bytes of a normalized set.
pub fn total(set: &[(DevicePtr, usize)]) -> u64 {
    set.iter().map(|&(_, l)| l as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_merges_overlaps_and_neighbours() {
        let v = normalize(vec![(10, 5), (0, 4), (4, 2), (12, 10), (40, 0)]);
        assert_eq!(v, vec![(0, 6), (10, 12)]);
    }

    #[test]
    fn subtract_cuts_inside_and_at_edges() {
        let s = vec![(0, 100), (200, 50)];
        assert_eq!(subtract(&s, 10, 20), vec![(0, 10), (30, 70), (200, 50)]);
        assert_eq!(subtract(&s, 90, 120), vec![(0, 90), (210, 40)]);
        assert_eq!(subtract(&s, 0, 1000), vec![]);
    }

    #[test]
    fn intersect_clips() {
        let s = vec![(0, 100), (200, 50)];
        assert_eq!(intersect(&s, 50, 200), vec![(50, 50), (200, 50)]);
        assert_eq!(intersect(&s, 100, 100), vec![]);
        assert_eq!(total(&s), 150);
    }
}
