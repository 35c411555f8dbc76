//! A tag's segments lent to a layer above the pool: the one way work across
//! devices (`crate::devices`) reads a tag's layout, stages its wake and pins
//! its group mark, without reaching into the pool's state.

use std::any::Any;
use std::sync::Arc;

use super::Pool;
use crate::driver::DevicePtr;
use crate::error::Result;
use crate::segment::{Segment, SleepState};
use crate::tag::TagId;

/// A segment's committed bytes and live blocks `(offset, size)`.
pub(crate) type SegLayout = (usize, Vec<(usize, usize)>);

/// A mark a layer above pins on a tag; opaque to the pool, dropped when the
/// tag sleeps or wakes on its own (new contents: no longer one of a group).
pub(super) type TagMark = Arc<dyn Any + Send + Sync>;

/// One tag of one pool, lent to the layer above. Holds no lock: each call
/// takes the pool lock for itself.
#[derive(Clone, Copy)]
pub(crate) struct TagLease<'p> {
    pool: &'p Pool,
    tag: TagId,
}

impl Pool {
    /// Lend `tag`'s segments to the layer above (see [`TagLease`]).
    pub(crate) fn lease(&self, tag: TagId) -> TagLease<'_> {
        TagLease { pool: self, tag }
    }

    /// Drop the mark pinned on `t` (it woke or slept on its own).
    pub(super) fn drop_tag_mark(&self, t: TagId) {
        if let Some(ts) = self.lock().tags.get_mut(&t) {
            ts.mark = None;
        }
    }
}

impl TagLease<'_> {
    /// Refuse a tag the pool never saw.
    pub(crate) fn check_known(&self) -> Result<()> {
        self.pool.check_known(self.tag)
    }

    /// The pool's mapping granularity (segments are cut to it).
    pub(crate) fn granularity(&self) -> usize {
        self.pool.granularity
    }

    /// Per segment of the tag in creation order: committed bytes and live
    /// blocks `(offset, size)`. (Creation order, not address order:
    /// reservations of two devices need not come in the same address order.)
    pub(crate) fn layout(&self) -> Vec<SegLayout> {
        let st = self.pool.lock();
        let mut v: Vec<(u64, SegLayout)> = st
            .segs
            .values()
            .filter(|e| e.tag == self.tag)
            .map(|e| {
                let live = e
                    .blocks
                    .iter()
                    .filter(|(_, b)| b.live)
                    .map(|(off, b)| (off, b.size))
                    .collect();
                (e.seq, (e.seg.committed(), live))
            })
            .collect();
        v.sort_by_key(|x| x.0);
        v.into_iter().map(|(_, l)| l).collect()
    }

    /// The creation number of each segment base in `bases` (`u64::MAX` for
    /// one the pool does not hold).
    pub(crate) fn creation_order(&self, bases: &[DevicePtr]) -> Vec<u64> {
        let st = self.pool.lock();
        bases
            .iter()
            .map(|b| st.segs.get(b).map_or(u64::MAX, |e| e.seq))
            .collect()
    }

    /// Whether every segment of the tag is awake or asleep with a full host
    /// backup.
    pub(crate) fn all_awake_or_offloaded(&self) -> bool {
        self.pool.lock().segs.values().all(|e| {
            e.tag != self.tag
                || matches!(
                    e.seg.sleep_state(),
                    SleepState::Offloaded | SleepState::Awake
                )
        })
    }

    /// The mark pinned on the tag, when it is a `T`.
    pub(crate) fn mark<T: Any + Clone>(&self) -> Option<T> {
        let st = self.pool.lock();
        let m = st.tags.get(&self.tag)?.mark.as_ref()?;
        m.downcast_ref::<T>().cloned()
    }

    /// Pin `mark` on the tag (a tag the pool never saw gets none).
    pub(crate) fn set_mark<T: Any + Send + Sync>(&self, mark: T) {
        if let Some(ts) = self.pool.lock().tags.get_mut(&self.tag) {
            ts.mark = Some(Arc::new(mark));
        }
    }

    /// Drop the mark pinned on the tag.
    pub(crate) fn drop_mark(&self) {
        self.pool.drop_tag_mark(self.tag);
    }

    /// Begin a wake of the tag: waits for a sleep or wake already running;
    /// allocation in the tag is refused until [`Self::end_transition`].
    pub(crate) fn begin_wake(&self) -> Result<()> {
        self.pool.begin_transition(self.tag, false).map(|_| ())
    }

    /// End the tag's sleep or wake (see [`Pool::end_transition`]).
    pub(crate) fn end_transition(&self, keep_asleep: bool) {
        self.pool.end_transition(self.tag, keep_asleep)
    }

    /// Run `f` on every segment of the tag, under the pool lock.
    pub(crate) fn with_segments<R>(&self, f: impl FnOnce(&mut [&mut Segment]) -> R) -> R {
        f(&mut self.pool.lock().tag_segments(self.tag))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{Pool, PoolConfig};
    use crate::driver::host::{HostConfig, HostDriver};
    use crate::driver::Driver;
    use crate::sleep::Policy;
    use crate::tag;

    fn pool() -> Pool {
        let d: Arc<dyn Driver> = Arc::new(HostDriver::new(HostConfig {
            granularity: 64 << 10,
            memory_limit: 1 << 30,
        }));
        Pool::new(d, PoolConfig::default()).unwrap()
    }

    #[test]
    fn a_mark_is_kept_by_type_and_dropped_when_the_tag_sleeps_or_wakes_on_its_own() {
        let pool = pool();
        let t = tag::id("unit-lease-mark").unwrap();
        let unseen = tag::id("unit-lease-unseen").unwrap();
        pool.alloc_tagged(4096, t).unwrap();
        let lease = pool.lease(t);
        assert_eq!(lease.mark::<u64>(), None);
        lease.set_mark(7u64);
        assert_eq!(lease.mark::<u64>(), Some(7));
        assert_eq!(
            lease.mark::<i32>(),
            None,
            "a mark of another type is not read"
        );
        pool.lease(unseen).set_mark(9u64);
        assert_eq!(
            pool.lease(unseen).mark::<u64>(),
            None,
            "an unknown tag takes no mark"
        );
        assert!(pool.lease(unseen).check_known().is_err());

        pool.sleep(&[(t, Policy::Offload)]).unwrap();
        assert_eq!(lease.mark::<u64>(), None, "a sleep of its own drops it");
        assert!(lease.all_awake_or_offloaded());
        lease.set_mark(8u64);
        pool.wake(&[t]).unwrap();
        assert_eq!(lease.mark::<u64>(), None, "a wake of its own drops it");
    }

    #[test]
    fn the_layout_lists_segments_in_creation_order_with_their_live_blocks() {
        let pool = pool();
        let t = tag::id("unit-lease-layout").unwrap();
        let a = pool.alloc_segment(1 << 20, t).unwrap();
        let b = pool.alloc_segment(2 << 20, t).unwrap();
        let layout = pool.lease(t).layout();
        assert_eq!(layout.len(), 2);
        assert_eq!(layout[0].0, 1 << 20);
        assert_eq!(layout[1].0, 2 << 20);
        assert_eq!(layout[0].1, vec![(0, 1 << 20)]);
        let order = pool.lease(t).creation_order(&[b.ptr, a.ptr, 12345]);
        assert!(order[0] > order[1] && order[2] == u64::MAX, "{order:?}");
        let mut seen = 0;
        pool.lease(t).with_segments(|segs| seen = segs.len());
        assert_eq!(seen, 2);
    }
}
