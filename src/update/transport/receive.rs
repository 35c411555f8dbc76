//! The receiving side of every transport, and how it feeds an update: a
//! [`BucketSource`] delivers checked buckets in order; [`TransportSource`]
//! turns them into the update's [`Source`] (one batch per bucket, released
//! to the transport once the update's copies out of it completed); [`receive`]
//! runs one update from a transport and tells the sender how it ended.

use super::bucket::{check_announced, AnnouncedTensor, BucketManifest, Coverage};
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::loader::{Dtype, Session};
use crate::pool::Pool;
use crate::update::{self, Batch, Bytes, Piece, Source, SourceTensor, UpdateOptions, UpdateResult};

/// The receiving end of a transport.
pub trait BucketSource {
    /// Wait for the update to begin: its tensors in the order the buckets
    /// carry them.
    fn begin(&mut self) -> Result<Vec<AnnouncedTensor>>;
    /// Bytes of the largest bucket this source can hold (its ring's slot).
    fn slot_bytes(&self) -> u64;
    /// Wait for the next bucket; `None` once the sender said it sent every
    /// one. The bucket's bytes lie at the address returned, on the
    /// receiver's device, until it is released.
    fn next(&mut self) -> Result<Option<(BucketManifest, DevicePtr)>>;
    /// Bucket `seq` was applied (its copies completed): its slot may be reused.
    fn release(&mut self, seq: u64) -> Result<()>;
    /// Tell the sender how the update ended: the version committed, or why not.
    fn finish(&mut self, outcome: std::result::Result<u64, String>);
    /// After [`BucketSource::begin`], before the first bucket: this rank's
    /// `verdict` on the update (every check it makes before a byte moves).
    /// A transport whose ranks move in step (a collective) exchanges the
    /// verdicts, so a refusal on any rank fails every rank here, before
    /// any bucket; others return the verdict as it is.
    fn agree(&mut self, verdict: Result<()>) -> Result<()> {
        verdict
    }
    /// Whether [`BucketSource::agree`] exchanges verdicts now, so the
    /// update's checks must run before the first bucket to feed it (the
    /// update runs them again, cheaply, from the plan it keeps).
    fn agrees(&self) -> bool {
        false
    }
}

fn source_error(e: Error) -> Error {
    match e {
        Error::UpdateSource(_) => e,
        other => Error::UpdateSource(other.to_string()),
    }
}

/// A transport as an update's [`Source`]: the announced tensors are its
/// manifest, each bucket a batch. Every manifest is checked
/// ([`Coverage::admit`]) before its pieces are handed over, and an update
/// that ends with a tensor short is refused; transport failures become
/// [`Error::UpdateSource`], so no destination is written.
pub struct TransportSource<'a> {
    source: &'a mut dyn BucketSource,
    manifest: Vec<SourceTensor>,
    coverage: Coverage,
}

impl<'a> TransportSource<'a> {
    /// Wait for the sender's announced tensors and check them.
    pub fn begin(source: &'a mut dyn BucketSource) -> Result<TransportSource<'a>> {
        let tensors = source.begin().map_err(source_error)?;
        check_announced(&tensors).map_err(source_error)?;
        let mut manifest = Vec::with_capacity(tensors.len());
        for t in &tensors {
            let dtype = Dtype::parse(&t.dtype).ok_or_else(|| {
                Error::UpdateSource(format!(
                    "the sender announced tensor `{}` of unknown dtype `{}`",
                    t.name.escape_debug(),
                    t.dtype.escape_debug()
                ))
            })?;
            let shape = t
                .shape
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<std::result::Result<Vec<usize>, _>>()
                .map_err(|_| {
                    Error::UpdateSource(format!(
                        "tensor `{}`: shape {:?} does not fit this machine",
                        t.name.escape_debug(),
                        t.shape
                    ))
                })?;
            manifest.push(SourceTensor {
                name: t.name.clone(),
                dtype,
                shape,
            });
        }
        let coverage = Coverage::new(
            tensors.iter().map(|t| t.bytes).collect(),
            source.slot_bytes(),
        );
        Ok(TransportSource {
            source,
            manifest,
            coverage,
        })
    }

    /// Tell the sender how the update ended.
    pub fn finish(self, outcome: std::result::Result<u64, String>) {
        self.source.finish(outcome);
    }
}

// SAFETY: every piece lies inside a bucket the transport landed in this
// process's device memory (its manifest checked against the ring's slot),
// which the transport does not reuse until the bucket is released.
unsafe impl Source for TransportSource<'_> {
    fn manifest(&self) -> &[SourceTensor] {
        &self.manifest
    }

    fn next(&mut self) -> Result<Option<Batch>> {
        let Some((m, src)) = self.source.next().map_err(source_error)? else {
            self.coverage.finish().map_err(source_error)?;
            return Ok(None);
        };
        self.coverage.admit(&m).map_err(source_error)?;
        let pieces = m
            .entries
            .iter()
            .map(|e| Piece {
                tensor: e.tensor as usize,
                offset: e.offset,
                len: e.len,
                at: Bytes::Device(src + e.at),
            })
            .collect();
        Ok(Some(Batch { id: m.seq, pieces }))
    }

    fn release(&mut self, id: u64) -> Result<()> {
        self.source.release(id).map_err(source_error)
    }
}

/// Run one update of `session`'s destinations in `pool` from `source`,
/// through the session's rules (each tensor-parallel rank keeps its slices),
/// and tell the sender how it ended. On any failure every destination keeps
/// its last whole version.
pub fn receive(
    source: &mut dyn BucketSource,
    session: &Session,
    pool: &Pool,
    opts: &UpdateOptions,
) -> Result<UpdateResult> {
    let mut src = match TransportSource::begin(source) {
        Ok(s) => s,
        Err(e) => {
            // Told to the other ranks too, then to the sender.
            let why = e.to_string();
            let e = source
                .agree(Err(e))
                .err()
                .unwrap_or(Error::UpdateSource(why));
            source.finish(Err(e.to_string()));
            return Err(e);
        }
    };
    // Every check before any bucket moves, agreed with the other ranks.
    let verdict = if src.source.agrees() {
        update::check(session, pool, &src.manifest, opts)
    } else {
        Ok(())
    };
    if let Err(e) = src.source.agree(verdict) {
        src.finish(Err(e.to_string()));
        return Err(e);
    }
    let r = update::update(session, pool, &mut src, opts);
    src.finish(match &r {
        Ok(done) => Ok(done.version),
        Err(e) => Err(e.to_string()),
    });
    r
}

/// Read every bucket of `source` and release it, applying nothing (the root
/// of a broadcast that only sends). Returns the buckets passed.
pub fn drain(source: &mut dyn BucketSource) -> Result<u64> {
    let tensors = source.begin()?;
    let checked = check_announced(&tensors);
    source.agree(checked)?;
    let mut coverage = Coverage::new(
        tensors.iter().map(|t| t.bytes).collect(),
        source.slot_bytes(),
    );
    while let Some((m, _)) = source.next()? {
        coverage.admit(&m)?;
        source.release(m.seq)?;
    }
    coverage.finish()?;
    source.finish(Ok(0));
    Ok(coverage.buckets())
}
