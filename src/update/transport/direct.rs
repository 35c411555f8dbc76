//! Direct IPC updates: the sender's tensors already lie in memory of its
//! pool, so nothing is copied into a ring. The sender serves the segments
//! that hold them as shares (one per tag, read-only, kept across sends while
//! the memory behind them is the same: `direct_shares`) and sends
//! one manifest: each tensor's name, dtype, shape, share, segment and
//! offset. The receiver attaches every share it does not hold an import of
//! the same generation of ([`super::import_cache`]), checks the manifest
//! against what it imported, and runs the update from a resident source
//! pointing into the imported memory: the whole update is checked before
//! any byte moves, then one device-to-device copy per destination piece.
//!
//! Failure rule: an importer's mapping keeps the physical memory alive even
//! when the owner dies, so once every share is attached the update
//! completes; a sender that dies before that leaves an attach that fails,
//! and nothing is written. The sender does not return (and so must not write
//! its tensors) until every receiver said how its update ended.

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bucket::{check_announced, AnnouncedTensor};
use super::control::{accept, Channel, FromReceiver, FromSender};
pub use super::control::{DirectShare, DirectTensor};
use super::direct_shares::{DirectShares, Group};
use super::import_cache::{Admitted, DirectManifest, ImportCache, ImportCounts};
use super::send::{SendData, SendReport, SendTensor};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::loader::{Dtype, Session};
use crate::pool::Pool;
use crate::share::manifest::printable;
use crate::share::LogSink;
use crate::update::{self, Bytes, Tensors, UpdateOptions, UpdateResult};

pub use super::control::MAX_SHARES;

/// Check `tensors` and group them by the tag that holds them. Returns the
/// groups, each tensor's group and place in it, and the bytes sent.
#[allow(clippy::type_complexity)]
fn plan(
    at: &Endpoint<'_>,
    tensors: &[SendTensor<'_>],
) -> Result<(Vec<Group>, Vec<(usize, usize)>, u64)> {
    let (_, sizes) = super::send::announce(tensors)?;
    let mut groups: Vec<Group> = Vec::new();
    let mut places = Vec::with_capacity(tensors.len());
    let mut problems = Vec::new();
    for (t, &bytes) in tensors.iter().zip(&sizes) {
        let SendData::Device(ptr) = t.data else {
            problems.push(format!(
                "tensor `{}` lies in host memory (a direct update sends pool memory)",
                t.name.escape_debug()
            ));
            continue;
        };
        let Some(seg) = at.pool.segment_of(ptr) else {
            problems.push(format!(
                "tensor `{}` at {ptr:#x} is not in this sender's pool",
                t.name.escape_debug()
            ));
            continue;
        };
        let k = match groups.iter().position(|(tag, _)| *tag == seg.tag) {
            Some(k) => k,
            None => {
                groups.push((seg.tag, Vec::new()));
                groups.len() - 1
            }
        };
        places.push((k, groups[k].1.len()));
        groups[k].1.push((t.name.clone(), ptr, bytes));
    }
    if groups.len() > MAX_SHARES {
        problems.push(format!(
            "the tensors lie in {} tags, more than the {MAX_SHARES} a direct update serves",
            groups.len()
        ));
    }
    if !problems.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "direct update over {}: {}",
            at.path.display(),
            problems.join("; ")
        )));
    }
    Ok((groups, places, sizes.iter().sum()))
}

/// The last manifest a direct sender encoded, sent again as it is when a
/// later send announces the same (the same tensors in the same kept
/// shares, as an RL loop sends): no second encoding.
#[derive(Debug, Default)]
pub(super) struct LastAnnounced {
    message: Option<FromSender>,
    frame: Vec<u8>,
}

impl LastAnnounced {
    /// `msg` as it goes on the wire.
    fn frame(&mut self, msg: FromSender) -> Result<&[u8]> {
        if self.message.as_ref() != Some(&msg) {
            self.frame = Channel::encode(&msg)?;
            self.message = Some(msg);
        }
        Ok(&self.frame)
    }
}

/// What a direct send needs of its sender.
pub(super) struct Endpoint<'a> {
    pub pool: &'a Arc<Pool>,
    pub listener: &'a UnixListener,
    pub path: &'a Path,
    pub timeout: Duration,
    pub log: &'a LogSink,
    /// The shares kept from earlier sends.
    pub shares: &'a mut DirectShares,
    /// The manifest encoded for the last send.
    pub announced: &'a mut LastAnnounced,
}

/// Wait for `receivers` receivers (the ranks of one engine, each keeping
/// its slices) and send them `tensors`, which must lie in device memory
/// of this sender's pool. Returns once every receiver committed; the
/// tensors must not be written before then. On any failure each
/// receiver is told to abort and keeps its last version.
pub(super) fn send(
    at: Endpoint<'_>,
    tensors: &[SendTensor<'_>],
    receivers: usize,
) -> Result<SendReport> {
    exchange(at, tensors, receivers, false)
}

/// Offer `tensors` to `receivers` receivers ahead of any update: the same
/// shares and manifest a send of them serves, announced as an offer. Each
/// receiver attaches the shares and checks the manifest against its
/// destinations, keeps both for the updates that follow, and writes
/// nothing; returns once every receiver attached (its `version` is 0). A
/// later send of the same tensors in the same memory is then, for those
/// receivers, one manifest they recognize and the copies.
pub(super) fn offer(
    at: Endpoint<'_>,
    tensors: &[SendTensor<'_>],
    receivers: usize,
) -> Result<SendReport> {
    exchange(at, tensors, receivers, true)
}

/// A send (`offer` false: receivers apply the update and commit) or an
/// offer (receivers attach and keep, nothing more).
fn exchange(
    at: Endpoint<'_>,
    tensors: &[SendTensor<'_>],
    receivers: usize,
    offer: bool,
) -> Result<SendReport> {
    let start = Instant::now();
    super::send::check_receivers(at.path, receivers)?;
    let (groups, places, bytes) = plan(&at, tensors)?;
    // Kept served after this send, while the memory behind them is the same.
    let served = at
        .shares
        .serve(at.pool, at.path, at.log, &groups, receivers)?;
    let manifest: Vec<DirectTensor> = tensors
        .iter()
        .zip(places)
        .map(|(t, (k, j))| {
            let p = served[k].1[j];
            DirectTensor {
                name: t.name.clone(),
                dtype: t.dtype.name().to_string(),
                shape: t.shape.iter().map(|&d| d as u64).collect(),
                share: k as u32,
                segment: p.segment,
                offset: p.offset,
            }
        })
        .collect();
    let shares: Vec<DirectShare> = served.into_iter().map(|(s, _)| s).collect();
    // Encoded before the wait: a receiver that connects is answered at once.
    let msg = at.announced.frame(FromSender::Direct {
        shares,
        tensors: manifest,
    })?;
    let mut chs = Vec::with_capacity(receivers);
    for _ in 0..receivers {
        chs.push(accept(at.listener, at.path, at.timeout)?);
    }
    let setup_start = Instant::now();
    let result = (|| {
        for ch in chs.iter_mut() {
            if offer {
                ch.send(&FromSender::Offer)?;
            }
            ch.send_encoded(msg)?;
        }
        for ch in chs.iter_mut() {
            expect(ch, at.path, |m| matches!(m, FromReceiver::Attached))?;
        }
        let setup = setup_start.elapsed();
        if offer {
            return Ok((0, setup));
        }
        let mut version = 0;
        for ch in chs.iter_mut() {
            match ch.recv::<FromReceiver>()? {
                FromReceiver::Committed { version: v } => version = version.max(v),
                FromReceiver::Failed { reason } => return Err(refused(at.path, reason)),
                other => return Err(unexpected(at.path, &other)),
            }
        }
        Ok((version, setup))
    })();
    let (version, setup) = match result {
        Ok(v) => v,
        Err(e) => {
            let abort = FromSender::Abort {
                reason: e.to_string(),
            };
            for ch in chs.iter_mut() {
                let _ = ch.send(&abort);
            }
            return Err(e);
        }
    };
    Ok(SendReport {
        version,
        buckets: 0,
        bytes,
        setup,
        total: start.elapsed(),
    })
}

fn expect(ch: &mut Channel, path: &Path, ok: impl Fn(&FromReceiver) -> bool) -> Result<()> {
    match ch.recv::<FromReceiver>()? {
        m if ok(&m) => Ok(()),
        FromReceiver::Failed { reason } => Err(refused(path, reason)),
        other => Err(unexpected(path, &other)),
    }
}

fn refused(path: &Path, reason: String) -> Error {
    Error::InvalidState(format!(
        "direct update over {}: the receiver refused it: {reason}",
        path.display()
    ))
}

fn unexpected(path: &Path, msg: &FromReceiver) -> Error {
    Error::InvalidState(format!(
        "direct update over {}: the receiver sent {msg:?} out of turn",
        path.display()
    ))
}

/// Each tensor's dtype, shape and bytes, as this machine holds them.
type Parsed = Vec<(Dtype, Vec<usize>, u64)>;

/// Check a direct update's manifest on its own: the share count, no share
/// named twice, every tensor's dtype and shape, every share index and
/// segment named exists (per the sender's claim; [`source_of`] checks the
/// imports). Every problem in one error ([`Error::UpdateSource`]).
fn check_manifest(path: &Path, shares: &[DirectShare], tensors: &[DirectTensor]) -> Result<Parsed> {
    let bad =
        |why: String| Error::UpdateSource(format!("direct update from {}: {why}", path.display()));
    if shares.is_empty() || shares.len() > MAX_SHARES {
        return Err(bad(format!(
            "{} shares named (1 to {MAX_SHARES} accepted)",
            shares.len()
        )));
    }
    let mut problems = Vec::new();
    for (k, s) in shares.iter().enumerate() {
        if shares[..k].iter().any(|o| o.path == s.path) {
            problems.push(format!("share {} named twice", printable(&s.path)));
        }
    }
    let mut parsed = Vec::with_capacity(tensors.len());
    let mut announced = Vec::with_capacity(tensors.len());
    for t in tensors {
        let dtype = Dtype::parse(&t.dtype);
        let bytes = dtype.and_then(|d| {
            t.shape
                .iter()
                .try_fold(d.size() as u64, |acc, &n| acc.checked_mul(n))
        });
        let shape: Option<Vec<usize>> = t.shape.iter().map(|&d| usize::try_from(d).ok()).collect();
        match (dtype, bytes, shape) {
            (Some(d), Some(b), Some(s)) => parsed.push((d, s, b)),
            _ => problems.push(format!(
                "tensor `{}`: dtype `{}` of shape {:?} is not a tensor this machine holds",
                t.name.escape_debug(),
                t.dtype.escape_debug(),
                t.shape
            )),
        }
        announced.push(AnnouncedTensor {
            name: t.name.clone(),
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
            bytes: bytes.unwrap_or(0),
        });
        match shares.get(t.share as usize) {
            None => problems.push(format!(
                "tensor `{}` names share {} of the {} sent",
                t.name.escape_debug(),
                t.share,
                shares.len()
            )),
            Some(s) if t.segment as usize >= s.segments.len() => problems.push(format!(
                "tensor `{}` names segment {} of share {}, which has {}",
                t.name.escape_debug(),
                t.segment,
                t.share,
                s.segments.len()
            )),
            Some(_) => {}
        }
    }
    if let Err(e) = check_announced(&announced) {
        problems.push(e.to_string());
    }
    if !problems.is_empty() {
        return Err(bad(problems.join("; ")));
    }
    Ok(parsed)
}

/// The update's source: each tensor of a checked manifest at its place in
/// the segments imported, refused (every problem in one error) when it
/// runs past its segment as imported.
fn source_of(
    path: &Path,
    imports: &[super::import_cache::Import],
    tensors: &[DirectTensor],
    parsed: Parsed,
) -> Result<Tensors> {
    let mut problems = Vec::new();
    let mut source = Tensors::new();
    for (t, (dtype, shape, bytes)) in tensors.iter().zip(parsed) {
        // Both indexes were checked against the claim, which the import matches.
        let (base, len) = imports[t.share as usize].segments[t.segment as usize];
        let inside = t.offset.checked_add(bytes).is_some_and(|end| end <= len);
        if !inside {
            problems.push(format!(
                "tensor `{}`: {bytes} bytes at offset {} run past segment {} of share {} \
                 ({len} bytes imported)",
                t.name.escape_debug(),
                t.offset,
                t.segment,
                t.share
            ));
            continue;
        }
        // SAFETY: the tensor lies inside a segment of an import (checked
        // just above against the bytes the share client mapped), and the
        // imports, kept with the source (in the cache or by the caller),
        // keep that mapping alive for as long as the source is used,
        // sender dead or not.
        if let Err(e) =
            unsafe { source.add(&t.name, dtype, &shape, Bytes::Device(base + t.offset)) }
        {
            problems.push(e.to_string());
        }
    }
    if !problems.is_empty() {
        return Err(Error::UpdateSource(format!(
            "direct update from {}: {}",
            path.display(),
            problems.join("; ")
        )));
    }
    Ok(source)
}

/// Admit a direct update: check its manifest (unless it is the one
/// `known` was admitted from), resolve its shares through `cache`
/// (reusing imports of the same generation, attaching the others; each
/// served by the process `sender_pid`, the sender's), and build its source
/// over the imports: `known`'s when every import was reused. Nothing is
/// written.
fn admit(
    driver: &Arc<dyn Driver>,
    path: &Path,
    manifest: &DirectManifest,
    known: Option<Tensors>,
    timeout: Duration,
    cache: &mut ImportCache,
    sender_pid: i32,
) -> Result<(Vec<super::import_cache::Import>, Tensors, ImportCounts)> {
    let (shares, tensors) = (&manifest.shares, &manifest.tensors);
    let parsed = match known {
        Some(_) => None,
        None => Some(check_manifest(path, shares, tensors)?),
    };
    let (imports, counts) = cache
        .resolve(driver, shares, timeout, sender_pid)
        .map_err(|e| Error::UpdateSource(format!("direct update from {}: {e}", path.display())))?;
    let source = match (known, parsed) {
        // The same imports as when `known` was built: its addresses hold.
        (Some(source), _) if counts.attached == 0 => source,
        (_, Some(parsed)) => source_of(path, &imports, tensors, parsed)?,
        (_, None) => source_of(
            path,
            &imports,
            tensors,
            check_manifest(path, shares, tensors)?,
        )?,
    };
    Ok((imports, source, counts))
}

/// What receiving one direct update did besides the update.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DirectReceipt {
    /// Shares attached and reused.
    pub imports: ImportCounts,
    /// From the start of the receive to every share imported and checked.
    pub setup: Duration,
}

/// Take a direct manifest offered on `ch` ahead of any update (after the
/// sender's `Offer`): admit it as an update would (reusing what `cache`
/// holds, attaching the rest), run `check` on the source it makes (the
/// receiver's plan against its destinations: nothing is written), answer
/// `Attached`, and keep the imports and the manifest with its source in
/// `cache`, so the next update of that manifest attaches and checks
/// nothing. On any failure the sender is told why and the cache emptied.
#[allow(clippy::too_many_arguments)]
pub(super) fn prepare(
    driver: Arc<dyn Driver>,
    mut ch: Channel,
    path: &Path,
    (manifest, known): (DirectManifest, Option<Tensors>),
    timeout: Duration,
    check: &dyn Fn(&Tensors) -> Result<()>,
    cache: &mut ImportCache,
    (start, sender_pid): (Instant, i32),
) -> Result<DirectReceipt> {
    let admitted = admit(&driver, path, &manifest, known, timeout, cache, sender_pid)
        .and_then(|(imports, source, counts)| check(&source).map(|()| (imports, source, counts)));
    let (imports, source, counts) = match admitted {
        Ok(a) => a,
        Err(e) => {
            cache.clear();
            let _ = ch.send(&FromReceiver::Failed {
                reason: e.to_string(),
            });
            return Err(e);
        }
    };
    let setup = start.elapsed();
    if let Err(e) = ch.send(&FromReceiver::Attached) {
        cache.clear();
        return Err(e);
    }
    if cache.keep(imports) {
        cache.remember(Admitted { manifest, source });
    }
    Ok(DirectReceipt {
        imports: counts,
        setup,
    })
}

/// Run one direct update announced on `ch`: admit it (`known`: the
/// source the cache remembered for this very manifest), tell the sender
/// the shares are attached, apply, and tell it how the update ended. The
/// imports used are kept in `cache` (within its limits) when the update
/// committed, and with them the manifest and its source when all were
/// kept; on any failure the cache is emptied. `start` is when the receive
/// began (for the setup time); `sender_pid` is the process on the control
/// socket, which must serve every share.
#[allow(clippy::too_many_arguments)]
pub(super) fn receive(
    driver: Arc<dyn Driver>,
    mut ch: Channel,
    path: &Path,
    (manifest, known): (DirectManifest, Option<Tensors>),
    timeout: Duration,
    session: &Session,
    pool: &Pool,
    opts: &UpdateOptions,
    cache: &mut ImportCache,
    (start, sender_pid): (Instant, i32),
) -> Result<(UpdateResult, DirectReceipt)> {
    let admitted = admit(&driver, path, &manifest, known, timeout, cache, sender_pid);
    let (imports, mut source, counts) = match admitted {
        Ok(a) => a,
        Err(e) => {
            cache.clear();
            let _ = ch.send(&FromReceiver::Failed {
                reason: e.to_string(),
            });
            return Err(e);
        }
    };
    let setup = start.elapsed();
    // The sender may be gone by now: its memory stays mapped, so the update goes on.
    let _ = ch.send(&FromReceiver::Attached);
    let r = update::update(session, pool, &mut source, opts);
    let _ = ch.send(&match &r {
        Ok(done) => FromReceiver::Committed {
            version: done.version,
        },
        Err(e) => FromReceiver::Failed {
            reason: e.to_string(),
        },
    });
    match r {
        Ok(done) => {
            if cache.keep(imports) {
                cache.remember(Admitted { manifest, source });
            }
            Ok((
                done,
                DirectReceipt {
                    imports: counts,
                    setup,
                },
            ))
        }
        Err(e) => {
            drop(source);
            drop(imports);
            cache.clear();
            Err(e)
        }
    }
}
