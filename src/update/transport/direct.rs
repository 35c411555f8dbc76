//! Direct IPC updates: the sender's tensors already lie in memory of its
//! pool, so nothing is copied into a ring. The sender serves the segments
//! that hold them as shares (one per tag, read-only, one handshake per
//! update) and sends one manifest: each tensor's name, dtype, shape and
//! share. The receiver attaches every share, checks the manifest against
//! what it imported, and runs the update from a resident source pointing
//! into the imported memory: the whole update is checked before any byte
//! moves, then one device-to-device copy per destination piece.
//!
//! Failure rule: an importer's mapping keeps the physical memory alive even
//! when the owner dies, so once every share is attached the update
//! completes; a sender that dies before that leaves an attach that fails,
//! and nothing is written. The sender does not return (and so must not write
//! its tensors) until every receiver said how its update ended.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bucket::{check_announced, AnnouncedTensor};
pub use super::control::DirectTensor;
use super::control::{accept, Channel, FromReceiver, FromSender};
use super::send::{SendData, SendReport, SendTensor};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::loader::registry::Destination;
use crate::loader::{Dtype, Session};
use crate::pool::Pool;
use crate::share::{AttachOptions, Attachment, LogSink, ServeOptions, Server};
use crate::tag::TagId;
use crate::update::{self, Bytes, Tensors, UpdateOptions, UpdateResult};

/// Most shares one direct update may name (a bound on what a hostile sender
/// makes a receiver attach).
pub const MAX_SHARES: usize = 64;

/// Check `tensors` and group them by the tag that holds them.
#[allow(clippy::type_complexity)]
fn plan(
    at: &Endpoint<'_>,
    tensors: &[SendTensor<'_>],
) -> Result<(Vec<(TagId, Vec<Destination>)>, Vec<DirectTensor>, u64)> {
    let sizes = tensors
        .iter()
        .map(SendTensor::checked_bytes)
        .collect::<Result<Vec<u64>>>()?;
    let announced: Vec<AnnouncedTensor> = tensors
        .iter()
        .zip(&sizes)
        .map(|(t, &bytes)| AnnouncedTensor {
            name: t.name.clone(),
            dtype: t.dtype.name().to_string(),
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            bytes,
        })
        .collect();
    check_announced(&announced)?;
    let mut shares: Vec<(TagId, Vec<Destination>)> = Vec::new();
    let mut manifest = Vec::with_capacity(tensors.len());
    let mut problems = Vec::new();
    for t in tensors {
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
        let k = match shares.iter().position(|(tag, _)| *tag == seg.tag) {
            Some(k) => k,
            None => {
                shares.push((seg.tag, Vec::new()));
                shares.len() - 1
            }
        };
        shares[k].1.push(Destination {
            name: t.name.clone(),
            ptr,
            dtype: t.dtype,
            shape: t.shape.clone(),
        });
        manifest.push(DirectTensor {
            name: t.name.clone(),
            dtype: t.dtype.name().to_string(),
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            share: k as u32,
        });
    }
    if shares.len() > MAX_SHARES {
        problems.push(format!(
            "the tensors lie in {} tags, more than the {MAX_SHARES} a direct update serves",
            shares.len()
        ));
    }
    if !problems.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "direct update over {}: {}",
            at.path.display(),
            problems.join("; ")
        )));
    }
    Ok((shares, manifest, sizes.iter().sum()))
}

/// What a direct send needs of its sender.
pub(super) struct Endpoint<'a> {
    pub pool: &'a Arc<Pool>,
    pub listener: &'a UnixListener,
    pub path: &'a Path,
    pub timeout: Duration,
    pub log: &'a LogSink,
    /// This send's number at the sender, naming its shares.
    pub serial: u64,
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
    let start = Instant::now();
    if receivers == 0 {
        return Err(Error::InvalidArgument(format!(
            "update sender {}: at least one receiver",
            at.path.display()
        )));
    }
    let (shares, manifest, bytes) = plan(&at, tensors)?;
    // Served only while this update runs; stopped (sockets removed) on return.
    let mut servers = Vec::with_capacity(shares.len());
    let mut paths = Vec::with_capacity(shares.len());
    for (k, (tag, dests)) in shares.into_iter().enumerate() {
        let mut p = at.path.as_os_str().to_owned();
        p.push(format!(".direct.{}.{k}", at.serial));
        let p = PathBuf::from(p);
        let _ = std::fs::remove_file(&p);
        servers.push(Server::start(
            at.pool.clone(),
            tag,
            dests,
            &p,
            ServeOptions {
                max_connections: receivers.max(1),
                log: at.log.clone(),
                ..ServeOptions::default()
            },
        )?);
        paths.push(p.to_string_lossy().into_owned());
    }
    let mut chs = Vec::with_capacity(receivers);
    for _ in 0..receivers {
        chs.push(accept(at.listener, at.path, at.timeout)?);
    }
    let setup_start = Instant::now();
    let msg = FromSender::Direct {
        shares: paths,
        tensors: manifest,
    };
    let result = (|| {
        for ch in chs.iter_mut() {
            ch.send(&msg)?;
        }
        for ch in chs.iter_mut() {
            expect(ch, at.path, |m| matches!(m, FromReceiver::Attached))?;
        }
        let setup = setup_start.elapsed();
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
    drop(servers);
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

/// Attach the shares of a direct update and check its manifest against
/// them: every share index named exists, every tensor is in its share with
/// the dtype, shape and size announced. Every problem in one error
/// ([`Error::UpdateSource`]); nothing is written.
fn admit(
    driver: &Arc<dyn Driver>,
    path: &Path,
    shares: &[String],
    tensors: &[DirectTensor],
    timeout: Duration,
) -> Result<(Vec<Attachment>, Tensors)> {
    let bad =
        |why: String| Error::UpdateSource(format!("direct update from {}: {why}", path.display()));
    if shares.is_empty() || shares.len() > MAX_SHARES {
        return Err(bad(format!(
            "{} shares named (1 to {MAX_SHARES} accepted)",
            shares.len()
        )));
    }
    let mut problems = Vec::new();
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
        if t.share as usize >= shares.len() {
            problems.push(format!(
                "tensor `{}` names share {} of the {} sent",
                t.name.escape_debug(),
                t.share,
                shares.len()
            ));
        }
    }
    if let Err(e) = check_announced(&announced) {
        problems.push(e.to_string());
    }
    if !problems.is_empty() {
        return Err(bad(problems.join("; ")));
    }
    let mut attached = Vec::with_capacity(shares.len());
    for s in shares {
        let a = Attachment::attach(
            driver.clone(),
            s,
            &AttachOptions {
                timeout,
                ..AttachOptions::default()
            },
        )
        .map_err(|e| bad(format!("attaching share {s}: {e}")))?;
        attached.push(a);
    }
    let mut source = Tensors::new();
    for (t, (dtype, shape, bytes)) in tensors.iter().zip(parsed) {
        let share = &attached[t.share as usize];
        let got = match share.tensor(&t.name) {
            Ok(g) => g,
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        if got.dtype != dtype || got.shape != t.shape || got.bytes as u64 != bytes {
            problems.push(format!(
                "tensor `{}`: announced {} {:?} ({bytes} bytes), its share holds {} {:?} ({} bytes)",
                t.name.escape_debug(),
                t.dtype.escape_debug(),
                t.shape,
                got.dtype,
                got.shape,
                got.bytes
            ));
            continue;
        }
        // SAFETY: the share client checked that the tensor lies inside the
        // memory it mapped, and `attached` (returned with the source) keeps
        // that mapping alive for as long as the caller holds it, sender dead
        // or not.
        if let Err(e) = unsafe { source.add(&t.name, dtype, &shape, Bytes::Device(got.ptr)) } {
            problems.push(e.to_string());
        }
    }
    if !problems.is_empty() {
        return Err(bad(problems.join("; ")));
    }
    Ok((attached, source))
}

/// Run one direct update announced on `ch`: attach, check, tell the sender
/// the shares are attached, apply, and tell it how the update ended.
#[allow(clippy::too_many_arguments)]
pub(super) fn receive(
    driver: Arc<dyn Driver>,
    mut ch: Channel,
    path: &Path,
    shares: &[String],
    tensors: &[DirectTensor],
    timeout: Duration,
    session: &Session,
    pool: &Pool,
    opts: &UpdateOptions,
) -> Result<UpdateResult> {
    let (attached, mut source) = match admit(&driver, path, shares, tensors, timeout) {
        Ok(a) => a,
        Err(e) => {
            let _ = ch.send(&FromReceiver::Failed {
                reason: e.to_string(),
            });
            return Err(e);
        }
    };
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
    drop(attached);
    r
}
