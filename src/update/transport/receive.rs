//! The receiver's loop, the same for every transport: announced tensors
//! first, then each bucket in order, checked, applied and released; on any
//! failure the sink aborts and the sender is told why.

use super::bucket::{check_announced, AnnouncedTensor, BucketManifest, Coverage};
use crate::driver::DevicePtr;
use crate::error::Result;

/// A bucket that has landed in this process's memory.
#[derive(Debug, Clone, Copy)]
pub struct Landed<'a> {
    /// Which pieces it holds (already checked against the ring and the
    /// announced tensors).
    pub manifest: &'a BucketManifest,
    /// Address of its first byte on the receiver's device.
    pub src: DevicePtr,
}

/// The receiving end of a transport.
pub trait BucketSource {
    /// Wait for the update to begin: its tensors in the order the buckets
    /// carry them.
    fn begin(&mut self) -> Result<Vec<AnnouncedTensor>>;
    /// Bytes of the largest bucket this source can hold (its ring's slot).
    fn slot_bytes(&self) -> u64;
    /// Wait for the next bucket; `None` once the sender said it sent every one.
    fn next(&mut self) -> Result<Option<(BucketManifest, DevicePtr)>>;
    /// Bucket `seq` was applied (its copies completed): its slot may be reused.
    fn release(&mut self, seq: u64) -> Result<()>;
    /// Tell the sender how the update ended: the version committed, or why not.
    fn finish(&mut self, outcome: std::result::Result<u64, String>);
}

/// What the receiver does with the buckets: the core's update entry.
pub trait BucketSink {
    /// Check the announced tensors against the destinations before any byte
    /// moves; every problem in one error.
    fn begin(&mut self, tensors: &[AnnouncedTensor]) -> Result<()>;
    /// Apply one landed bucket. When this returns, the bucket's memory may be
    /// reused (its copies completed or were staged).
    fn apply(&mut self, bucket: Landed<'_>) -> Result<()>;
    /// Every bucket arrived: make the update visible; returns the new version.
    fn commit(&mut self) -> Result<u64>;
    /// The update failed: leave every destination at its last whole version.
    fn abort(&mut self);
}

/// Drive `source` into `sink` until the update is committed or fails.
/// Returns the version committed.
pub fn receive(source: &mut dyn BucketSource, sink: &mut dyn BucketSink) -> Result<u64> {
    let result = run(source, sink);
    match &result {
        Ok(v) => source.finish(Ok(*v)),
        Err(e) => {
            sink.abort();
            source.finish(Err(e.to_string()));
        }
    }
    result
}

fn run(source: &mut dyn BucketSource, sink: &mut dyn BucketSink) -> Result<u64> {
    let tensors = source.begin()?;
    check_announced(&tensors)?;
    sink.begin(&tensors)?;
    let mut coverage = Coverage::new(
        tensors.iter().map(|t| t.bytes).collect(),
        source.slot_bytes(),
    );
    while let Some((manifest, src)) = source.next()? {
        coverage.admit(&manifest)?;
        sink.apply(Landed {
            manifest: &manifest,
            src,
        })?;
        source.release(manifest.seq)?;
    }
    coverage.finish()?;
    sink.commit()
}
