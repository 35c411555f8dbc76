//! The shares a direct sender keeps served across its sends, so a receiver
//! that keeps its imports attaches once, not at every update.
//!
//! One share per tag, serving the segments that hold the tensors whole
//! (tensor `segment.K` spans segment K's committed bytes), so a later send of
//! other tensors in the same segments reuses it. Each share has a
//! generation, drawn anew whenever the memory behind it changes; what is
//! compared is the share's *footprint*: the identity, base, length, chunk
//! layout and mapping count of every segment (physical memory committed
//! again after a trim, or mapped at a wake, counts; a handle's value is no
//! identity, a driver may reuse it), and the tag's remap epoch. A send
//! whose footprint differs stops the old share and serves a new one under a
//! new generation and path; a receiver holding an import of the old one sees
//! a generation it does not have and attaches again. Shares no longer
//! needed by a send are stopped.
//!
//! The shares revoke on sleep ([`SleepPolicy::Revoke`]): a receiver holding
//! an import does not block the sender's sleep, and its import of a revoked
//! share is dropped at its next update.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::control::DirectShare;
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::loader::registry::Destination;
use crate::loader::Dtype;
use crate::pool::{remap, Pool};
use crate::share::options::DEFAULT_MAX_CONNECTIONS;
use crate::share::{LogSink, ServeOptions, Server, SleepPolicy};
use crate::tag::{self, TagId};

/// One segment as a share exports it: its identity and the physical
/// memory behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SegmentPrint {
    id: u64,
    base: DevicePtr,
    committed: usize,
    /// Offset and bytes of each chunk, and whether it is mapped.
    chunks: Vec<(usize, usize, bool)>,
    /// [`crate::segment::Segment::mappings`]: new memory behind any chunk changes it.
    mappings: u64,
}

/// What must not change for an import of a share to map the same memory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Footprint {
    remap_epoch: u64,
    segments: Vec<SegmentPrint>,
}

/// A tag's tensors of one send: name, address and bytes.
pub(super) type Group = (TagId, Vec<(String, DevicePtr, u64)>);

/// Where a tensor lies in a kept share.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placement {
    /// Index of the segment in the share.
    pub segment: u32,
    /// Offset from the segment's base.
    pub offset: u64,
}

#[derive(Debug)]
struct Kept {
    tag: TagId,
    footprint: Footprint,
    max_connections: usize,
    wire: DirectShare,
    /// Stopped when dropped.
    _server: Server,
}

/// A sender's kept shares.
#[derive(Debug)]
pub(super) struct DirectShares {
    sender: String,
    next_generation: u64,
    kept: Vec<Kept>,
}

/// An identity for this sending process, drawn at random, so a restarted
/// sender at the same path is never taken for the one before.
fn draw_identity() -> String {
    let mut b = [0u8; 16];
    let drawn = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if drawn.is_err() {
        // Without a random source: the process and the instant, still
        // different for a restarted sender.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b[..4].copy_from_slice(&std::process::id().to_le_bytes());
        b[4..].copy_from_slice(&now.to_le_bytes()[..12]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The segments of `tag` holding `tensors` (name, address and bytes), by base,
/// and where each tensor lies in them. A tensor outside the tag's committed
/// memory, or an asleep tag, is an error.
fn footprint(
    pool: &Pool,
    tag: TagId,
    tensors: &[(String, DevicePtr, u64)],
) -> Result<(Footprint, Vec<Placement>)> {
    let remap_epoch = remap::epoch(tag);
    pool.with_awake_tag_segments(tag, |segs| {
        let mut used: Vec<usize> = Vec::new();
        let mut at = Vec::with_capacity(tensors.len());
        for (name, ptr, bytes) in tensors {
            let (ptr, bytes) = (*ptr, *bytes);
            let i = segs
                .iter()
                .position(|s| {
                    ptr >= s.ptr()
                        && (ptr - s.ptr())
                            .checked_add(bytes)
                            .is_some_and(|end| end <= s.committed() as u64)
                })
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "tensor `{}` at {ptr:#x} (+{bytes}) is not inside the committed memory of tag `{}`",
                        name.escape_debug(),
                        tag::name_of(tag)
                    ))
                })?;
            if !used.contains(&i) {
                used.push(i);
            }
            at.push((i, ptr - segs[i].ptr()));
        }
        used.sort_by_key(|&i| segs[i].ptr());
        let segments = used
            .iter()
            .map(|&i| SegmentPrint {
                id: segs[i].id(),
                base: segs[i].ptr(),
                committed: segs[i].committed(),
                chunks: segs[i]
                    .chunks()
                    .iter()
                    .map(|c| (c.offset, c.size, c.handle.is_some()))
                    .collect(),
                mappings: segs[i].mappings(),
            })
            .collect();
        let placements = at
            .into_iter()
            .map(|(i, offset)| Placement {
                segment: used.iter().position(|&u| u == i).expect("listed above") as u32,
                offset,
            })
            .collect();
        Ok((
            Footprint {
                remap_epoch,
                segments,
            },
            placements,
        ))
    })
}

impl DirectShares {
    pub fn new() -> DirectShares {
        DirectShares {
            sender: draw_identity(),
            next_generation: 1,
            kept: Vec::new(),
        }
    }

    /// Shares kept now.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Serve, or keep serving, a share for each group (a tag and the
    /// tensors of this send it holds: name, address and bytes) for
    /// `receivers` receivers; stop every other. Returns each group's share
    /// as sent and where each of its tensors lies.
    pub fn serve(
        &mut self,
        pool: &Arc<Pool>,
        path: &Path,
        log: &LogSink,
        groups: &[Group],
        receivers: usize,
    ) -> Result<Vec<(DirectShare, Vec<Placement>)>> {
        // Each receiver that keeps its import holds a connection between
        // sends, also the receivers of earlier sends (engines updated in
        // turn), and one that attaches again while its old connection is
        // still counted needs one more: the share layer's bound, or twice
        // this send's receivers when that is more.
        let max_connections = DEFAULT_MAX_CONNECTIONS.max(2 * receivers.max(1));
        let mut old = std::mem::take(&mut self.kept);
        let mut out = Vec::with_capacity(groups.len());
        for (tag, tensors) in groups {
            let (print, placements) = footprint(pool, *tag, tensors)?;
            let same = old.iter().position(|k| {
                k.tag == *tag && k.footprint == print && k.max_connections >= max_connections
            });
            let kept = match same {
                Some(i) => old.swap_remove(i),
                None => {
                    // Stop the old share of this tag before serving the new one.
                    old.retain(|k| k.tag != *tag);
                    self.start(pool, path, log, *tag, print, max_connections)?
                }
            };
            out.push((kept.wire.clone(), placements));
            self.kept.push(kept);
        }
        Ok(out)
    }

    fn start(
        &mut self,
        pool: &Arc<Pool>,
        path: &Path,
        log: &LogSink,
        tag: TagId,
        footprint: Footprint,
        max_connections: usize,
    ) -> Result<Kept> {
        let generation = self.next_generation;
        self.next_generation += 1;
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".direct.{generation}"));
        let p = PathBuf::from(p);
        let _ = std::fs::remove_file(&p);
        let segments: Vec<Destination> = footprint
            .segments
            .iter()
            .enumerate()
            .map(|(k, s)| Destination {
                name: format!("segment.{k}"),
                ptr: s.base,
                dtype: Dtype::U8,
                shape: vec![s.committed],
            })
            .collect();
        let server = Server::start(
            pool.clone(),
            tag,
            segments,
            &p,
            ServeOptions {
                max_connections,
                sleep_policy: SleepPolicy::Revoke,
                log: log.clone(),
                ..ServeOptions::default()
            },
        )?;
        let wire = DirectShare {
            path: p.to_string_lossy().into_owned(),
            sender: self.sender.clone(),
            generation,
            segments: footprint
                .segments
                .iter()
                .map(|s| s.committed as u64)
                .collect(),
        };
        Ok(Kept {
            tag,
            footprint,
            max_connections,
            wire,
            _server: server,
        })
    }

    /// Stop serving every share.
    pub fn stop_all(&mut self) {
        self.kept.clear();
    }
}
