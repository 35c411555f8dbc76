//! A receiver's imports of a direct sender's shares, kept across updates so
//! the second and later updates from the same sender attach nothing.
//!
//! Every share must be served by the sender itself: the process on the
//! control socket (its pid as the kernel reports it), so a sender cannot
//! make the receiver copy another process's memory it can reach.
//!
//! An import is reused only when the sender names the same share (path),
//! the same sending process and the same generation (the sender draws a new
//! one whenever the memory behind the share changes), the share is still
//! served (its owner connected, not revoked by a sleep), and the segments
//! the sender claims are exactly those the import maps. A new generation or
//! sender at a known path, an owner gone or a revoked share attaches again;
//! a claim that contradicts the import of the same generation is refused.
//! Whatever is reused, every tensor is still checked against the imported
//! segments before any byte moves.
//!
//! The cache also remembers the last committed update's manifest, byte for
//! byte, and the source admitted from it (`Admitted`): a sender that sends
//! the same manifest again (the same tensors in the same memory, as an RL
//! loop does) is not decoded or checked again. Its shares are still
//! resolved as above, and the source is reused only when every import it
//! points into was reused.
//!
//! Cost: an import keeps the sender's physical memory alive, also memory
//! the sender freed or put to sleep since, until the import is dropped.
//! The cache holds only the imports the last update used, within
//! [`CacheLimits`], and is emptied on any failed update, when the sender
//! cannot be reached, and on request.

use std::sync::Arc;
use std::time::Duration;

use super::control::{DirectShare, DirectTensor, MAX_SHARES};
use crate::driver::{DevicePtr, Driver};
use crate::error::{Error, Result};
use crate::loader::Dtype;
use crate::share::manifest::printable;
use crate::share::{AttachOptions, Attachment};
use crate::update::Tensors;

/// How much a receiver keeps imported between updates. Imports past either
/// bound are dropped after the update that used them (the update itself
/// is never refused for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Most shares kept imported (0 keeps none: every update attaches).
    pub max_imports: usize,
    /// Most bytes of the sender's memory kept mapped.
    pub max_bytes: u64,
}

impl Default for CacheLimits {
    /// As many shares as one update may name, whatever their size.
    fn default() -> Self {
        CacheLimits {
            max_imports: MAX_SHARES,
            max_bytes: u64::MAX,
        }
    }
}

/// One imported share and its segments in this process.
#[derive(Debug)]
pub(super) struct Import {
    pub share: DirectShare,
    attachment: Attachment,
    /// Address and bytes of each segment, in share order.
    pub segments: Vec<(DevicePtr, u64)>,
}

impl Import {
    fn bytes(&self) -> u64 {
        self.attachment.range().1 as u64
    }

    /// Still served as imported: its owner connected and not revoked.
    fn live(&self) -> bool {
        self.attachment.check().is_ok() && self.attachment.owner_connected()
    }
}

/// Refuse `attachment` unless the process `sender_pid` (the sender on the
/// control socket) serves it.
pub(super) fn served_by_sender(attachment: &Attachment, sender_pid: i32) -> Result<()> {
    if attachment.owner_pid() != sender_pid {
        return Err(Error::UpdateSource(format!(
            "share {} is served by process {}, not by the sender (process {sender_pid})",
            printable(&attachment.path().to_string_lossy()),
            attachment.owner_pid()
        )));
    }
    Ok(())
}

/// Attach `share`, check that the sender serves it, and find its claimed
/// segments in what it maps.
fn attach(
    driver: &Arc<dyn Driver>,
    share: &DirectShare,
    timeout: Duration,
    sender_pid: i32,
) -> Result<Import> {
    let attachment = Attachment::attach(
        driver.clone(),
        &share.path,
        &AttachOptions {
            timeout,
            ..AttachOptions::default()
        },
    )
    .map_err(|e| Error::UpdateSource(format!("attaching share {}: {e}", printable(&share.path))))?;
    served_by_sender(&attachment, sender_pid)?;
    let held: Vec<(String, u64)> = attachment
        .manifest()
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.shape.iter().product()))
        .collect();
    let mut segments = Vec::with_capacity(share.segments.len());
    for (k, &bytes) in share.segments.iter().enumerate() {
        let t = attachment.tensor(&format!("segment.{k}")).ok();
        match t {
            Some(t) if t.dtype == Dtype::U8 && t.bytes as u64 == bytes => {
                segments.push((t.ptr, bytes))
            }
            _ => break,
        }
    }
    if segments.len() != share.segments.len() || held.len() != share.segments.len() {
        return Err(Error::UpdateSource(format!(
            "share {} (generation {}): the sender claims segments of {:?} bytes, the share \
             serves {:?}",
            printable(&share.path),
            share.generation,
            share.segments,
            held.iter()
                .map(|(n, b)| format!("{} ({b} bytes)", printable(n)))
                .collect::<Vec<_>>()
        )));
    }
    Ok(Import {
        share: share.clone(),
        attachment,
        segments,
    })
}

/// What resolving one update's shares did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportCounts {
    /// Shares attached for the update.
    pub attached: usize,
    /// Shares whose kept import was reused.
    pub reused: usize,
    /// Physical chunks imported by those attaches.
    pub chunks: usize,
}

/// A direct update's manifest: the message as received, and decoded.
#[derive(Debug)]
pub(super) struct DirectManifest {
    /// The message's JSON, as the sender sent it.
    pub body: Vec<u8>,
    /// Its shares.
    pub shares: Vec<DirectShare>,
    /// Its tensors.
    pub tensors: Vec<DirectTensor>,
}

/// A manifest that passed every check, and the source built from it over
/// the imports of its shares.
#[derive(Debug)]
pub(super) struct Admitted {
    pub manifest: DirectManifest,
    /// Points into the imports of `manifest.shares`, as resolved when it
    /// was built.
    pub source: Tensors,
}

/// The imports kept between updates.
#[derive(Debug, Default)]
pub struct ImportCache {
    limits: CacheLimits,
    kept: Vec<Import>,
    /// The last committed update's manifest, whose source points into
    /// exactly the imports in `kept`.
    admitted: Option<Admitted>,
}

impl ImportCache {
    /// An empty cache bounded by `limits`.
    pub fn new(limits: CacheLimits) -> ImportCache {
        ImportCache {
            limits,
            kept: Vec::new(),
            admitted: None,
        }
    }

    /// Shares kept imported.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// True when nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// Bytes of the sender's memory kept mapped (and so kept alive).
    pub fn bytes(&self) -> u64 {
        self.kept.iter().map(Import::bytes).sum()
    }

    /// The bounds.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    /// Drop every import: detach, and let the sender's memory go.
    pub fn clear(&mut self) {
        self.admitted = None;
        self.kept.clear();
    }

    /// The manifest remembered, taken out of the cache, when `body` is the
    /// same message byte for byte. Its source may be used only when
    /// [`ImportCache::resolve`] of its shares reuses every import.
    pub(super) fn recall(&mut self, body: &[u8]) -> Option<Admitted> {
        match &self.admitted {
            Some(a) if a.manifest.body == body => self.admitted.take(),
            _ => None,
        }
    }

    /// Remember `admitted`, the update whose imports [`ImportCache::keep`]
    /// just kept, all of them.
    pub(super) fn remember(&mut self, admitted: Admitted) {
        self.admitted = Some(admitted);
    }

    /// The imports of `shares`, in order: each kept one still valid for its
    /// claim taken out of the cache, every other attached; every one served
    /// by the process `sender_pid`. A kept import of the same generation
    /// whose segments differ from the claim, or a share another process
    /// serves, is refused ([`Error::UpdateSource`]). Imports not named stay
    /// in the cache until [`ImportCache::keep`].
    pub(super) fn resolve(
        &mut self,
        driver: &Arc<dyn Driver>,
        shares: &[DirectShare],
        timeout: Duration,
        sender_pid: i32,
    ) -> Result<(Vec<Import>, ImportCounts)> {
        let mut out = Vec::with_capacity(shares.len());
        let mut counts = ImportCounts::default();
        for s in shares {
            let known = self.kept.iter().position(|k| k.share.path == s.path);
            let same = known.map(|i| self.kept.swap_remove(i)).filter(|k| {
                k.share.sender == s.sender
                    && k.share.generation == s.generation
                    && k.attachment.owner_pid() == sender_pid
                    && k.live()
            });
            match same {
                Some(k) if k.share.segments != s.segments => {
                    return Err(Error::UpdateSource(format!(
                        "share {} (generation {}): the sender claims segments of {:?} bytes, \
                         the import of that generation maps {:?}",
                        printable(&s.path),
                        s.generation,
                        s.segments,
                        k.share.segments
                    )));
                }
                Some(k) => {
                    counts.reused += 1;
                    out.push(k);
                }
                None => {
                    let i = attach(driver, s, timeout, sender_pid)?;
                    counts.attached += 1;
                    counts.chunks += i.attachment.stats().chunks;
                    out.push(i);
                }
            }
        }
        Ok((out, counts))
    }

    /// Keep `imports` (those of the update just run) within the limits, in
    /// order; drop every other import and the manifest remembered. True
    /// when every one was kept.
    pub(super) fn keep(&mut self, imports: Vec<Import>) -> bool {
        self.admitted = None;
        self.kept.clear();
        let offered = imports.len();
        let mut bytes = 0u64;
        for i in imports {
            let b = i.bytes();
            if self.kept.len() < self.limits.max_imports
                && bytes
                    .checked_add(b)
                    .is_some_and(|t| t <= self.limits.max_bytes)
            {
                bytes += b;
                self.kept.push(i);
            }
        }
        self.kept.len() == offered
    }
}
