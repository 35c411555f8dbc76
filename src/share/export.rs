//! The owner's side of one attach: the manifest and one file descriptor per
//! physical chunk behind the shared tensors, taken under the pool lock so the
//! tag cannot sleep or shrink meanwhile.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use super::manifest::{Manifest, SharedTensor, FORMAT};
use super::memfd;
use crate::driver::{BackendKind, DevicePtr};
use crate::error::{Error, Result};
use crate::loader::registry::Destination;
use crate::pool::Pool;
use crate::tag::{self, TagId};

/// A manifest and its descriptors, in chunk order.
#[derive(Debug)]
pub struct Export {
    /// What the importer needs to rebuild the tensors.
    pub manifest: Manifest,
    /// One descriptor per `manifest.chunks` entry; closed when dropped.
    pub fds: Vec<OwnedFd>,
}

/// Export the chunks of `tag`'s segments that hold `tensors`. When the share
/// is read-only (`!writable`) on the host backend, each descriptor is a
/// read-only reopen of its memfd, sealed against new writers. Fails when a
/// tensor lies outside the tag's committed memory, when the tag is asleep
/// (a chunk unmapped), or when the driver cannot export.
pub fn export(
    pool: &Pool,
    tag: TagId,
    tensors: &[Destination],
    version: u64,
    writable: bool,
) -> Result<Export> {
    let driver = pool.driver().clone();
    // On the host backend a read-only share hands out sealed, read-only
    // descriptors (`memfd`); CUDA handles carry no access of their own.
    let read_only_fds = !writable && driver.kind() == BackendKind::Host;
    let tag_name = tag::name_of(tag);
    pool.with_awake_tag_segments(tag, |segs| {
        // Segments by base, with their committed length.
        let bases: BTreeMap<DevicePtr, usize> = segs
            .iter()
            .enumerate()
            .map(|(i, s)| (s.ptr(), i))
            .collect();
        // Which segment each tensor lies in, and the segments used, by base.
        let mut used: BTreeMap<DevicePtr, usize> = BTreeMap::new();
        let mut placed = Vec::with_capacity(tensors.len());
        for t in tensors {
            let bytes = t.bytes() as u64;
            let seg = bases
                .range(..=t.ptr)
                .next_back()
                .map(|(_, &i)| &segs[i])
                .filter(|s| t.ptr + bytes <= s.ptr() + s.committed() as u64)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "tensor `{}` at {:#x} (+{bytes}) is not inside the committed memory of tag `{tag_name}`",
                        super::manifest::printable(&t.name), t.ptr
                    ))
                })?;
            used.insert(seg.ptr(), bases[&seg.ptr()]);
            placed.push((t, seg.ptr()));
        }
        let mut chunks = Vec::new();
        let mut fds = Vec::new();
        let mut flat_base: BTreeMap<DevicePtr, u64> = BTreeMap::new();
        let mut flat = 0u64;
        for (&base, &i) in &used {
            let seg = &segs[i];
            flat_base.insert(base, flat);
            let mut expect = 0usize;
            for c in seg.chunks() {
                if c.offset != expect {
                    return Err(Error::InvalidState(format!(
                        "segment {base:#x} of tag `{tag_name}` has a gap at offset {expect}"
                    )));
                }
                let h = c.handle.ok_or_else(|| {
                    Error::InvalidState(format!(
                        "tag `{tag_name}` is asleep (segment {base:#x} has unmapped chunks); wake it before sharing"
                    ))
                })?;
                let fd = driver.export_fd(h)?;
                fds.push(if read_only_fds {
                    memfd::read_only(&fd).map_err(|e| {
                        Error::InvalidState(format!(
                            "tag `{tag_name}`: cannot seal a chunk of segment {base:#x} and reopen it read-only: {e}"
                        ))
                    })?
                } else {
                    fd
                });
                chunks.push(c.size as u64);
                expect += c.size;
                flat += c.size as u64;
            }
        }
        let shared = placed
            .into_iter()
            .map(|(t, base)| SharedTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.iter().map(|&d| d as u64).collect(),
                offset: flat_base[&base] + (t.ptr - base),
            })
            .collect();
        Ok(Export {
            manifest: Manifest {
                format: FORMAT,
                version,
                backend: driver.kind(),
                tag: tag_name.clone(),
                owner_pid: std::process::id(),
                writable,
                chunks,
                tensors: shared,
            },
            fds,
        })
    })
}
