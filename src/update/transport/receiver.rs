//! The receiving side of the IPC transport kept across updates from one
//! sender ([`UpdateReceiver`]): it connects at each receive and takes the
//! update either way the sender sends ([`super::ipc`]'s ring, or
//! [`super::direct`]), keeps a direct update's imports
//! ([`super::import_cache`]), and takes a sender's offer before the first
//! update ([`UpdateReceiver::prepare`]). [`receive_ipc`] is the one-shot
//! receive that keeps nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::control::{Channel, FromReceiver, FromSender};
use super::import_cache::{CacheLimits, DirectManifest, ImportCache, ImportCounts};
use super::ipc::{connect_to_sender, kind, IpcReceiver};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::loader::Session;
use crate::pool::Pool;
use crate::update::{UpdateOptions, UpdateResult};

/// Receive one update from the sender at `path` into `session`'s
/// destinations in `pool`, whichever way it sends: through its ring (the
/// update stages what lands, [`super::receive`]) or directly out of its pool
/// memory ([`super::direct`]). Waits at most `timeout` for each message.
/// Keeps nothing: every share is attached for this update and detached
/// after it ([`UpdateReceiver`] keeps direct imports across updates).
pub fn receive_ipc(
    driver: Arc<dyn Driver>,
    path: impl AsRef<Path>,
    timeout: Duration,
    session: &Session,
    pool: &Pool,
    opts: &UpdateOptions,
) -> Result<UpdateResult> {
    UpdateReceiver::new(
        driver,
        path,
        ReceiverOptions {
            timeout,
            cache: CacheLimits {
                max_imports: 0,
                max_bytes: 0,
            },
        },
    )
    .receive(session, pool, opts)
}

/// How an [`UpdateReceiver`] waits and what it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverOptions {
    /// Longest wait for each message of the sender, and for each attach.
    pub timeout: Duration,
    /// What is kept imported between direct updates.
    pub cache: CacheLimits,
}

impl Default for ReceiverOptions {
    fn default() -> Self {
        ReceiverOptions {
            timeout: Duration::from_secs(60),
            cache: CacheLimits::default(),
        }
    }
}

/// What one receive did besides the update.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReceiveStats {
    /// True for a direct update, false for one through the ring.
    pub direct: bool,
    /// Shares attached (the ring's one, or a direct update's not kept).
    pub attached: usize,
    /// Direct shares whose kept import was reused.
    pub reused: usize,
    /// Physical chunks imported by those attaches.
    pub chunks: usize,
    /// The direct manifest was the last update's, byte for byte: it was
    /// not decoded again, its shares were still resolved, and the source
    /// admitted from it was reused when every import was (otherwise the
    /// manifest was checked again over the new imports).
    pub recognized: bool,
    /// From connecting to every share attached and the manifest checked.
    pub setup: Duration,
    /// The whole receive.
    pub total: Duration,
}

/// The receiving side of the IPC transport, kept across updates from one
/// sender: each [`UpdateReceiver::receive`] connects, takes one update
/// either way the sender sends, and returns. Direct updates' imports are
/// kept ([`super::import_cache`]), so a later update from the same sender
/// over the same memory attaches nothing: one manifest, then the copies.
///
/// The cost: the kept imports keep the sender's physical memory alive,
/// also memory it freed or put to sleep since, until this receiver drops
/// them ([`UpdateReceiver::drop_imports`], its next update, a failed
/// update, an unreachable sender, or drop). [`UpdateReceiver::kept_bytes`]
/// says how much.
#[derive(Debug)]
pub struct UpdateReceiver {
    driver: Arc<dyn Driver>,
    path: PathBuf,
    timeout: Duration,
    cache: ImportCache,
    last: Option<ReceiveStats>,
}

impl UpdateReceiver {
    /// A receiver for the sender at `path`, on `driver`'s device. Connects
    /// at each receive, not now.
    pub fn new(
        driver: Arc<dyn Driver>,
        path: impl AsRef<Path>,
        options: ReceiverOptions,
    ) -> UpdateReceiver {
        UpdateReceiver {
            driver,
            path: path.as_ref().to_path_buf(),
            timeout: options.timeout,
            cache: ImportCache::new(options.cache),
            last: None,
        }
    }

    /// The sender's control socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Receive one update into `session`'s destinations in `pool` (as
    /// [`receive_ipc`]). `pool` must be on this receiver's device: the
    /// imports are mapped there. On any failure the kept imports are
    /// dropped, and every destination keeps its last version; a pool on
    /// another device is refused before anything is touched.
    pub fn receive(
        &mut self,
        session: &Session,
        pool: &Pool,
        opts: &UpdateOptions,
    ) -> Result<UpdateResult> {
        self.same_device(pool)?;
        let start = Instant::now();
        let r = self.receive_from(session, pool, opts, start);
        if r.is_err() {
            self.cache.clear();
        }
        let (done, mut stats) = r?;
        stats.total = start.elapsed();
        self.last = Some(stats);
        Ok(done)
    }

    /// Prepare for the updates to come: connect to the sender at this
    /// receiver's path, which offers its tensors
    /// ([`super::ipc::IpcSender::offer_direct_to`]), attach every share it names, check
    /// its manifest against `session`'s destinations in `pool` as an
    /// update with `opts` would (planning it: nothing is written), and keep
    /// the imports and the manifest. The first update of those tensors
    /// after it then attaches and checks nothing, as later ones do. On any
    /// failure the sender is told why, the kept imports are dropped, and
    /// nothing is written; a sender that sends an update instead of an
    /// offer is refused. Returns what was attached and the setup's time.
    pub fn prepare(
        &mut self,
        session: &Session,
        pool: &Pool,
        opts: &UpdateOptions,
    ) -> Result<ReceiveStats> {
        self.same_device(pool)?;
        let start = Instant::now();
        let r = self.take_offer(start, &|source: &crate::update::Tensors| {
            crate::update::check(session, pool, crate::update::Source::manifest(source), opts)
        });
        if r.is_err() {
            self.cache.clear();
        }
        let mut stats = r?;
        stats.total = start.elapsed();
        self.last = Some(stats);
        Ok(stats)
    }

    /// Connect, read the sender's offer and take it (see [`Self::prepare`]).
    fn take_offer(
        &mut self,
        start: Instant,
        check: &dyn Fn(&crate::update::Tensors) -> Result<()>,
    ) -> Result<ReceiveStats> {
        let (mut ch, sender_pid) = connect_to_sender(&self.path, self.timeout)?;
        match ch.recv::<FromSender>()? {
            FromSender::Offer => {}
            other => {
                let why = format!(
                    "update sender on {}: this receiver is preparing and expected an offer, got {}",
                    self.path.display(),
                    kind(&other)
                );
                let _ = ch.send(&FromReceiver::Failed {
                    reason: why.clone(),
                });
                return Err(Error::InvalidState(why));
            }
        }
        self.take_offered(ch, sender_pid, start, check)
    }

    /// The manifest after an `Offer` on `ch`: admitted, checked, kept.
    fn take_offered(
        &mut self,
        mut ch: Channel,
        sender_pid: i32,
        start: Instant,
        check: &dyn Fn(&crate::update::Tensors) -> Result<()>,
    ) -> Result<ReceiveStats> {
        let body = ch.recv_body()?;
        let admitted = match self.cache.recall(&body) {
            Some(known) => (known.manifest, Some(known.source)),
            None => match ch.decode::<FromSender>(&body)? {
                FromSender::Direct { shares, tensors } => (
                    DirectManifest {
                        body,
                        shares,
                        tensors,
                    },
                    None,
                ),
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "update sender on {}: an offer names a direct update, not {}",
                        self.path.display(),
                        kind(&other)
                    )))
                }
            },
        };
        let recognized = admitted.1.is_some();
        let receipt = super::direct::prepare(
            self.driver.clone(),
            ch,
            &self.path,
            admitted,
            self.timeout,
            check,
            &mut self.cache,
            (start, sender_pid),
        )?;
        let ImportCounts {
            attached,
            reused,
            chunks,
        } = receipt.imports;
        Ok(ReceiveStats {
            direct: true,
            attached,
            reused,
            chunks,
            recognized,
            setup: receipt.setup,
            total: Duration::ZERO,
        })
    }

    fn same_device(&self, pool: &Pool) -> Result<()> {
        let (ours, theirs) = (&self.driver, pool.driver());
        if ours.kind() != theirs.kind() || ours.device() != theirs.device() {
            // Copies from imports another device mapped fail midway (the
            // tag would be marked torn), or on CUDA fault the context.
            return Err(Error::InvalidArgument(format!(
                "update receiver for {}: it imports on {}, the pool is on {}",
                self.path.display(),
                ours.describe(),
                theirs.describe()
            )));
        }
        Ok(())
    }

    fn receive_from(
        &mut self,
        session: &Session,
        pool: &Pool,
        opts: &UpdateOptions,
        start: Instant,
    ) -> Result<(UpdateResult, ReceiveStats)> {
        let path = &self.path;
        let (mut ch, sender_pid) = connect_to_sender(path, self.timeout)?;
        let mut body = ch.recv_body()?;
        if body == OFFER_BODY {
            // The sender offered first (its update follows on the next
            // connection): take the offer as `prepare` does, then receive.
            self.take_offered(ch, sender_pid, start, &|_| Ok(()))?;
            let path = &self.path;
            (ch, _) = connect_to_sender(path, self.timeout)?;
            body = ch.recv_body()?;
        }
        let path = &self.path;
        // The manifest of the last update again: nothing to decode or check.
        if let Some(known) = self.cache.recall(&body) {
            let (manifest, source) = (known.manifest, Some(known.source));
            return self.direct(
                ch,
                (manifest, source),
                session,
                pool,
                opts,
                (start, sender_pid),
            );
        }
        match ch.decode::<FromSender>(&body)? {
            FromSender::Ring {
                share,
                slots,
                slot_bytes,
            } => {
                // A ring is the sender's other memory: the direct imports go.
                self.cache.clear();
                let mut source = IpcReceiver::attach_ring(
                    self.driver.clone(),
                    ch,
                    path.clone(),
                    (share, slots, slot_bytes),
                    self.timeout,
                    (start, sender_pid),
                )?;
                let stats = ReceiveStats {
                    direct: false,
                    attached: 1,
                    chunks: source.ring.stats().chunks,
                    setup: source.setup_time(),
                    ..ReceiveStats::default()
                };
                Ok((super::receive(&mut source, session, pool, opts)?, stats))
            }
            FromSender::Direct { shares, tensors } => {
                let manifest = DirectManifest {
                    body,
                    shares,
                    tensors,
                };
                self.direct(
                    ch,
                    (manifest, None),
                    session,
                    pool,
                    opts,
                    (start, sender_pid),
                )
            }
            other => Err(Error::InvalidArgument(format!(
                "update sender on {}: expected the ring or a direct update first, got {}",
                path.display(),
                kind(&other)
            ))),
        }
    }

    /// Run one direct update (see [`super::direct::receive`]).
    fn direct(
        &mut self,
        ch: Channel,
        admitted: (DirectManifest, Option<crate::update::Tensors>),
        session: &Session,
        pool: &Pool,
        opts: &UpdateOptions,
        from: (Instant, i32),
    ) -> Result<(UpdateResult, ReceiveStats)> {
        let recognized = admitted.1.is_some();
        let (done, receipt) = super::direct::receive(
            self.driver.clone(),
            ch,
            &self.path,
            admitted,
            self.timeout,
            session,
            pool,
            opts,
            &mut self.cache,
            from,
        )?;
        let ImportCounts {
            attached,
            reused,
            chunks,
        } = receipt.imports;
        Ok((
            done,
            ReceiveStats {
                direct: true,
                attached,
                reused,
                chunks,
                recognized,
                setup: receipt.setup,
                total: Duration::ZERO,
            },
        ))
    }

    /// What the last successful receive (or [`Self::prepare`]) did; `None`
    /// before the first.
    pub fn last_receive(&self) -> Option<ReceiveStats> {
        self.last
    }

    /// Shares kept imported now.
    pub fn kept_imports(&self) -> usize {
        self.cache.len()
    }

    /// Bytes of the sender's memory kept mapped, and so kept alive, now.
    pub fn kept_bytes(&self) -> u64 {
        self.cache.bytes()
    }

    /// Drop every kept import: detach, and let the sender's memory go. The
    /// next update attaches again.
    pub fn drop_imports(&mut self) {
        self.cache.clear();
    }
}

/// The JSON of [`FromSender::Offer`], as it arrives.
const OFFER_BODY: &[u8] = b"\"Offer\"";
