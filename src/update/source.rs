//! What an update reads: a [`Source`] of named tensors, delivered as byte
//! ranges ([`Piece`]s) in [`Batch`]es.
//!
//! A source first states every tensor it brings (its manifest: name, dtype,
//! shape), so the update can check the whole of it against the destinations
//! before any byte moves. Then it hands over batches until it has delivered
//! every byte of every tensor exactly once, in any order and cut anywhere:
//! whole tensors of this process in one batch ([`Tensors`]), or buckets
//! arriving from another process or over the network, each a contiguous
//! byte range holding several tensors or a part of one, as the pieces it
//! cuts into.

use std::collections::HashSet;

use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::loader::registry::byte_size;
use crate::loader::Dtype;

/// One tensor a source brings, as the checkpoint names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTensor {
    /// The checkpoint name (the mapping rules apply to it as in a load).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major, contiguous).
    pub shape: Vec<usize>,
}

impl SourceTensor {
    /// Bytes of the tensor; None when the size overflows.
    pub fn bytes(&self) -> Option<u64> {
        byte_size(&self.shape, self.dtype).map(|b| b as u64)
    }
}

/// Where a piece's bytes lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bytes {
    /// Memory the destinations' device can read: its own memory from any
    /// allocator (a trainer's tensors, a bucket buffer, imported memory).
    Device(DevicePtr),
    /// Host memory of this process (pageable or pinned).
    Host(*const u8),
}

/// A contiguous run of one tensor's bytes: `[offset, offset + len)` of
/// manifest entry `tensor`, lying at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Index into the source's manifest.
    pub tensor: usize,
    /// Byte offset in the tensor.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Address of the piece's first byte.
    pub at: Bytes,
}

/// Pieces delivered together; their memory stays valid until the update
/// calls [`Source::release`] with `id`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// The source's own number for the batch (a ring slot, a bucket index).
    pub id: u64,
    /// The pieces.
    pub pieces: Vec<Piece>,
}

/// A source of named tensors for an update.
///
/// The update calls [`Source::manifest`] once, then [`Source::next`] until it
/// returns `None`, and [`Source::release`] for each batch once every copy out
/// of it has completed. It keeps at most two batches unreleased at a time
/// (the one being copied and the next one arriving), so a source with a ring
/// of two buffers can fill one while the other is read.
///
/// An error from `next` or `release` aborts the update with every
/// destination holding its previous bytes (see the module docs of
/// [`crate::update`]); raise [`Error::UpdateSource`] with what failed (a
/// sender gone, a short bucket, a transport error).
///
/// # Safety
/// Implementers vouch that every [`Piece`] returned by `next` describes
/// memory readable as stated by [`Piece::at`] for `len` bytes, not written
/// by anyone until the update releases its batch, and (for
/// [`Bytes::Device`]) readable by the destinations' device.
pub unsafe trait Source {
    /// Every tensor this source brings, in the order pieces refer to them.
    fn manifest(&self) -> &[SourceTensor];

    /// True when every byte is already in place and stays valid for the
    /// whole update, so nothing can go missing midway: tensors of this
    /// process. The update then writes destinations directly; otherwise it
    /// stages (see [`crate::update`]).
    fn resident(&self) -> bool {
        false
    }

    /// The next batch of pieces, or `None` once every byte was delivered.
    fn next(&mut self) -> Result<Option<Batch>>;

    /// Every copy out of batch `id` has completed: its memory may be reused.
    fn release(&mut self, id: u64) -> Result<()>;
}

/// Whole tensors in memory of this process (a trainer's state dict): one
/// batch holding every tensor, resident for the whole update. Each update
/// reads the whole set, so one set serves several updates.
#[derive(Debug, Clone, Default)]
pub struct Tensors {
    manifest: Vec<SourceTensor>,
    at: Vec<Bytes>,
    /// The names given, for the duplicate check (a state dict has hundreds).
    names: HashSet<String>,
    delivered: bool,
}

impl Tensors {
    /// An empty set.
    pub fn new() -> Tensors {
        Tensors::default()
    }

    /// Add tensor `name` of `dtype` and `shape` lying contiguously at `at`.
    /// Refuses an empty or duplicate name, a NULL address and a shape whose
    /// byte size overflows or runs past the end of the address space.
    ///
    /// # Safety
    /// `at` holds the tensor's bytes (as [`Source`] requires of every piece)
    /// from now until the update that reads this set has returned.
    pub unsafe fn add(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: &[usize],
        at: Bytes,
    ) -> Result<()> {
        if name.is_empty() {
            return Err(Error::InvalidArgument(
                "update source tensor name must not be empty".into(),
            ));
        }
        if self.names.contains(name) {
            return Err(Error::InvalidArgument(format!(
                "update source tensor `{name}` is given twice"
            )));
        }
        let base = match at {
            Bytes::Device(p) => p,
            Bytes::Host(p) => p as u64,
        };
        if base == 0 {
            return Err(Error::InvalidArgument(format!(
                "update source tensor `{name}` has a NULL address"
            )));
        }
        let t = SourceTensor {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
        };
        if t.bytes().and_then(|b| base.checked_add(b)).is_none() {
            return Err(Error::InvalidArgument(format!(
                "update source tensor `{name}`: shape {shape:?} of {dtype} at {base:#x} does not fit in the address space"
            )));
        }
        self.names.insert(t.name.clone());
        self.manifest.push(t);
        self.at.push(at);
        Ok(())
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.manifest.len()
    }

    /// True when no tensor was added.
    pub fn is_empty(&self) -> bool {
        self.manifest.is_empty()
    }
}

// SAFETY: every address was vouched for by the caller of the unsafe `add`.
unsafe impl Source for Tensors {
    fn manifest(&self) -> &[SourceTensor] {
        &self.manifest
    }

    fn resident(&self) -> bool {
        true
    }

    fn next(&mut self) -> Result<Option<Batch>> {
        if self.delivered {
            return Ok(None);
        }
        self.delivered = true;
        let pieces = self
            .manifest
            .iter()
            .zip(&self.at)
            .enumerate()
            .filter_map(|(i, (t, &at))| {
                let len = t.bytes()?;
                (len > 0).then_some(Piece {
                    tensor: i,
                    offset: 0,
                    len,
                    at,
                })
            })
            .collect();
        Ok(Some(Batch { id: 0, pieces }))
    }

    fn release(&mut self, _id: u64) -> Result<()> {
        // Every update releases what it was handed, also when it fails:
        // the next update reads the whole set again.
        self.delivered = false;
        Ok(())
    }
}
