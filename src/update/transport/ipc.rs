//! The IPC transport: another process on the same host sends an update
//! through a ring of device buffers it exports once, or, when its tensors
//! lie in its pool, directly out of them ([`super::direct`]). The first
//! message on the control socket says which; [`super::receiver::receive_ipc`] takes either.
//!
//! For the ring, the sender ([`IpcSender`]) allocates `slots` buffers of
//! `slot_bytes` in its pool under a tag of its own at its first ring send and
//! serves them as a share ([`crate::share::Server`]) next to its control
//! socket. A receiver
//! ([`IpcReceiver`]) connects to the control socket, attaches the ring (one
//! share handshake: every slot's descriptors at once) and then reads one
//! control message per bucket. Bucket k goes in slot k mod `slots`; the
//! sender writes a slot again only after the receiver said it applied the
//! bucket that was there, so with two slots the receiver applies bucket k
//! while bucket k+1 lands.
//!
//! The receiver trusts nothing the sender says: the share's manifest is
//! validated by the share client, every bucket manifest by
//! [`super::bucket::Coverage`] (in order, inside its slot, only announced
//! tensors), and a slot other than the bucket's place in the ring is refused.
//! A sender that dies mid-update closes its control socket; the receiver's
//! next read fails, naming the bucket it waited for, and the sink aborts.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bucket::{plan_buckets, AnnouncedTensor, BucketManifest};
use super::control::{Channel, FromReceiver, FromSender};
use super::direct::LastAnnounced;
use super::direct_shares::DirectShares;
use super::receive::BucketSource;
pub use super::send::{SendData, SendReport, SendTensor};
use super::{DEFAULT_BUCKET_BYTES, DEFAULT_SLOTS};
use crate::driver::{DevicePtr, Driver, StreamId};
use crate::error::{Error, Result};
use crate::loader::dtype::Dtype;
use crate::loader::registry::Destination;
use crate::pool::Pool;
use crate::share::{wire, AttachOptions, Attachment, LogSink, ServeOptions, Server};
use crate::tag;

/// Most slots a ring may have (a bound on what a hostile sender makes a receiver map).
pub const MAX_SLOTS: u32 = 64;

/// How a sender's ring is shaped and how long it waits.
#[derive(Debug, Clone)]
pub struct SenderOptions {
    /// Slots in the ring (at least 1; 2 double-buffers).
    pub slots: usize,
    /// Bytes of each slot: the largest bucket.
    pub slot_bytes: usize,
    /// Longest wait for a receiver to connect, and for each of its answers.
    pub timeout: Duration,
    /// Where the ring's share writes its audit lines (every attach and detach).
    pub log: LogSink,
}

impl Default for SenderOptions {
    fn default() -> Self {
        SenderOptions {
            slots: DEFAULT_SLOTS,
            slot_bytes: DEFAULT_BUCKET_BYTES,
            timeout: Duration::from_secs(60),
            log: LogSink::default(),
        }
    }
}

/// The sending side: a ring exported once, a control socket receivers connect to.
#[derive(Debug)]
pub struct IpcSender {
    pool: Arc<Pool>,
    ring: Option<Ring>,
    listener: UnixListener,
    path: PathBuf,
    options: SenderOptions,
    /// The direct sends' shares, kept served across sends.
    direct: DirectShares,
    /// The direct sends' last manifest, encoded.
    announced: LastAnnounced,
}

fn ring_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".ring");
    PathBuf::from(p)
}

fn slot_name(i: usize) -> String {
    format!("slot.{i}")
}

/// The ring: `slots` buffers in the sender's pool under a tag of its own,
/// served as one share at `path` + `.ring`.
#[derive(Debug)]
struct Ring {
    slots: Vec<Destination>,
    server: Server,
    stream: StreamId,
}

impl Ring {
    fn start(pool: &Arc<Pool>, path: &Path, options: &SenderOptions) -> Result<Ring> {
        static RINGS: AtomicU64 = AtomicU64::new(0);
        let tag = tag::id(&format!(
            "vmmw.update.ring.{}.{}",
            std::process::id(),
            RINGS.fetch_add(1, Ordering::Relaxed)
        ))?;
        let mut slots = Vec::with_capacity(options.slots);
        let free_all = |slots: &[Destination]| {
            for s in slots {
                let _ = pool.free(s.ptr);
            }
        };
        for i in 0..options.slots {
            match pool.alloc_tagged(options.slot_bytes, tag) {
                Ok(b) => slots.push(Destination {
                    name: slot_name(i),
                    ptr: b.ptr,
                    dtype: Dtype::U8,
                    shape: vec![options.slot_bytes],
                }),
                Err(e) => {
                    free_all(&slots);
                    return Err(e);
                }
            }
        }
        let started = (|| {
            let stream = pool.driver().stream_create()?;
            match Server::start(
                pool.clone(),
                tag,
                slots.clone(),
                ring_path(path),
                ServeOptions {
                    log: options.log.clone(),
                    ..ServeOptions::default()
                },
            ) {
                Ok(server) => Ok((stream, server)),
                Err(e) => {
                    let _ = pool.driver().stream_destroy(stream);
                    Err(e)
                }
            }
        })();
        match started {
            Ok((stream, server)) => Ok(Ring {
                slots,
                server,
                stream,
            }),
            Err(e) => {
                free_all(&slots);
                Err(e)
            }
        }
    }

    fn stop(&mut self, pool: &Pool) {
        self.server.stop();
        let _ = pool.driver().stream_destroy(self.stream);
        for s in &self.slots {
            let _ = pool.free(s.ptr);
        }
    }
}

impl IpcSender {
    /// Listen for receivers at `path` (which must not exist). The ring is
    /// allocated in `pool` and served (at `path` + `.ring`) at the first
    /// ring send and kept for the sender's life; a sender that only sends
    /// directly never allocates it.
    pub fn bind(pool: Arc<Pool>, path: impl AsRef<Path>, options: SenderOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if options.slots == 0 || options.slots > MAX_SLOTS as usize {
            return Err(Error::InvalidArgument(format!(
                "update sender {}: {} slots asked, 1 to {MAX_SLOTS} accepted",
                path.display(),
                options.slots
            )));
        }
        if options.slot_bytes == 0 {
            return Err(Error::InvalidArgument(format!(
                "update sender {}: slot size must be at least 1 byte",
                path.display()
            )));
        }
        let listener = UnixListener::bind(&path).map_err(|e| Error::io(&path, e))?;
        Ok(IpcSender {
            pool,
            ring: None,
            listener,
            path,
            options,
            direct: DirectShares::new(),
            announced: LastAnnounced::default(),
        })
    }

    /// The ring, allocated and served at its first use and kept for the
    /// sender's life.
    fn ring(&mut self) -> Result<&Ring> {
        if self.ring.is_none() {
            self.ring = Some(Ring::start(&self.pool, &self.path, &self.options)?);
        }
        Ok(self.ring.as_ref().expect("just set"))
    }

    /// The control socket's path, which receivers connect to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Wait for one receiver and send it `tensors`: [`IpcSender::send_to`] with one.
    pub fn send(&mut self, tensors: &[SendTensor<'_>]) -> Result<SendReport> {
        self.send_to(tensors, 1)
    }

    /// Wait for `receivers` receivers (the ranks of one engine, each keeping
    /// its slices) and send them `tensors` in buckets of the slot size; a slot
    /// is written again once every receiver applied its bucket. Returns once
    /// every receiver committed; on any failure each is told to abort and
    /// keeps its last version.
    pub fn send_to(&mut self, tensors: &[SendTensor<'_>], receivers: usize) -> Result<SendReport> {
        let start = Instant::now();
        super::send::check_receivers(&self.path, receivers)?;
        // Every check before a receiver is involved.
        let (announced, sizes) = super::send::announce(tensors)?;
        let buckets = plan_buckets(&sizes, self.options.slot_bytes as u64)?;
        self.ring()?;
        let ring = self.ring.as_ref().expect("started above");
        let mut chs = Vec::with_capacity(receivers);
        for _ in 0..receivers {
            chs.push(self.accept()?);
        }
        let setup_start = Instant::now();
        let announce = FromSender::Ring {
            share: ring_path(&self.path).to_string_lossy().into_owned(),
            slots: ring.slots.len() as u32,
            slot_bytes: self.options.slot_bytes as u64,
        };
        let result = (|| {
            for ch in chs.iter_mut() {
                ch.send(&announce)?;
            }
            for ch in chs.iter_mut() {
                match ch.recv::<FromReceiver>()? {
                    FromReceiver::Attached => {}
                    FromReceiver::Failed { reason } => return Err(refused(&self.path, reason)),
                    other => return Err(unexpected(&self.path, &other)),
                }
            }
            let setup = setup_start.elapsed();
            self.stream_buckets(ring, &mut chs, tensors, announced, &buckets)
                .map(|v| (v, setup))
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
            buckets: buckets.len() as u64,
            bytes: sizes.iter().sum(),
            setup,
            total: start.elapsed(),
        })
    }

    /// Wait for `receivers` receivers and send them `tensors` directly out of
    /// this sender's pool memory, without the ring (see
    /// [`super::direct`]): every tensor must lie in device memory of the
    /// pool. Returns once every receiver committed; the tensors must not be
    /// written before then. The shares stay served after the send while
    /// the memory behind them is the same (a receiver that keeps its
    /// imports attaches nothing at the next send), until the sender is
    /// dropped or [`IpcSender::stop_direct_shares`].
    pub fn send_direct_to(
        &mut self,
        tensors: &[SendTensor<'_>],
        receivers: usize,
    ) -> Result<SendReport> {
        super::direct::send(self.direct_endpoint(), tensors, receivers)
    }

    /// Wait for `receivers` receivers that prepare ([`super::receiver::UpdateReceiver::prepare`])
    /// and offer them `tensors` ahead of any update (see
    /// [`super::direct`]): the shares and manifest a direct send of them
    /// serves, which each receiver attaches, checks against its
    /// destinations and keeps, writing nothing. Returns once every receiver
    /// attached (`version` 0). A later direct send of the same tensors in
    /// the same memory is then one manifest those receivers recognize and
    /// the copies: the first update runs as fast as the later ones.
    pub fn offer_direct_to(
        &mut self,
        tensors: &[SendTensor<'_>],
        receivers: usize,
    ) -> Result<SendReport> {
        super::direct::offer(self.direct_endpoint(), tensors, receivers)
    }

    /// What a direct send or offer works on: this sender's socket, pool and
    /// the shares and manifest kept from earlier sends.
    fn direct_endpoint(&mut self) -> super::direct::Endpoint<'_> {
        super::direct::Endpoint {
            pool: &self.pool,
            listener: &self.listener,
            path: &self.path,
            timeout: self.options.timeout,
            log: &self.options.log,
            shares: &mut self.direct,
            announced: &mut self.announced,
        }
    }

    /// Shares the direct sends keep served now.
    pub fn direct_shares(&self) -> usize {
        self.direct.len()
    }

    /// Stop serving the direct sends' shares. Receivers keep what they
    /// imported (and with it the memory) until their next update or until
    /// they drop their imports; the next direct send serves anew.
    pub fn stop_direct_shares(&mut self) {
        self.direct.stop_all();
    }

    fn accept(&self) -> Result<Channel> {
        super::control::accept(&self.listener, &self.path, self.options.timeout)
    }

    fn stream_buckets(
        &self,
        ring: &Ring,
        chs: &mut [Channel],
        tensors: &[SendTensor<'_>],
        announced: Vec<AnnouncedTensor>,
        buckets: &[BucketManifest],
    ) -> Result<u64> {
        let n = ring.slots.len() as u64;
        let begin = FromSender::Begin {
            tensors: announced,
            buckets: buckets.len() as u64,
        };
        for ch in chs.iter_mut() {
            ch.send(&begin)?;
        }
        let mut applied = 0u64;
        for b in buckets {
            // The slot is free once every receiver applied the bucket written there before.
            while applied + n <= b.seq {
                self.expect_applied(chs, applied)?;
                applied += 1;
            }
            let slot = (b.seq % n) as usize;
            self.fill(ring, slot, tensors, b)?;
            let msg = FromSender::Bucket {
                slot: slot as u32,
                manifest: b.clone(),
            };
            for ch in chs.iter_mut() {
                ch.send(&msg)?;
            }
        }
        for ch in chs.iter_mut() {
            ch.send(&FromSender::End)?;
        }
        while applied < buckets.len() as u64 {
            self.expect_applied(chs, applied)?;
            applied += 1;
        }
        let mut version = 0;
        for ch in chs.iter_mut() {
            match ch.recv::<FromReceiver>()? {
                FromReceiver::Committed { version: v } => version = version.max(v),
                FromReceiver::Failed { reason } => return Err(refused(&self.path, reason)),
                other => return Err(unexpected(&self.path, &other)),
            }
        }
        Ok(version)
    }

    fn expect_applied(&self, chs: &mut [Channel], seq: u64) -> Result<()> {
        for ch in chs.iter_mut() {
            match ch.recv::<FromReceiver>()? {
                FromReceiver::Applied { seq: s } if s == seq => {}
                FromReceiver::Failed { reason } => return Err(refused(&self.path, reason)),
                other => return Err(unexpected(&self.path, &other)),
            }
        }
        Ok(())
    }

    /// Copy the pieces of bucket `b` into ring slot `slot` and wait until
    /// they are visible to the receiver.
    fn fill(
        &self,
        ring: &Ring,
        slot: usize,
        tensors: &[SendTensor<'_>],
        b: &BucketManifest,
    ) -> Result<()> {
        let driver = self.pool.driver();
        let base = ring.slots[slot].ptr;
        for e in &b.entries {
            let t = &tensors[e.tensor as usize];
            let dst = base + e.at;
            match t.data {
                SendData::Host(h) => {
                    let src = &h[e.offset as usize..(e.offset + e.len) as usize];
                    // SAFETY: `src` is borrowed for the whole send and the stream is
                    // synchronized below, before this function returns; the slot is
                    // this sender's own pool memory of `slot_bytes` >= `at + len`
                    // (the plan cuts buckets at the slot size).
                    unsafe {
                        driver.copy_htod_async(dst, src.as_ptr(), src.len(), ring.stream)?;
                    }
                }
                SendData::Device(p) => {
                    // SAFETY: the caller vouches the tensor's bytes lie at `p` on this
                    // device for the whole send; the copy completes before return.
                    unsafe {
                        driver.copy_peer_async(
                            dst,
                            p + e.offset,
                            driver.device(),
                            e.len as usize,
                            ring.stream,
                        )?;
                    }
                }
            }
        }
        driver.stream_synchronize(ring.stream)
    }
}

impl Drop for IpcSender {
    fn drop(&mut self) {
        self.direct.stop_all();
        if let Some(mut ring) = self.ring.take() {
            ring.stop(&self.pool);
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn refused(path: &Path, reason: String) -> Error {
    Error::InvalidState(format!(
        "update over {}: the receiver refused it: {reason}",
        path.display()
    ))
}

fn unexpected(path: &Path, msg: &FromReceiver) -> Error {
    Error::InvalidState(format!(
        "update over {}: the receiver sent {msg:?} out of turn",
        path.display()
    ))
}

/// Connect to the sender's control socket at `path`; the channel, and the
/// sender's process id: the shares it names must be its own, the memory of
/// the process on this socket, not any other the receiver could attach.
pub(super) fn connect_to_sender(path: &Path, timeout: Duration) -> Result<(Channel, i32)> {
    let sock = UnixStream::connect(path).map_err(|e| Error::io(path, e))?;
    let sender_pid = wire::peer_cred(&sock).map_err(|e| Error::io(path, e))?.pid;
    let ch = Channel::new(
        sock,
        format!("update sender on {}", path.display()),
        timeout,
    )?;
    Ok((ch, sender_pid))
}

/// The receiving side: connected to a sender, its ring attached.
#[derive(Debug)]
pub struct IpcReceiver {
    ch: Channel,
    path: PathBuf,
    pub(super) ring: Attachment,
    slots: Vec<DevicePtr>,
    slot_bytes: u64,
    announced: u64,
    received: u64,
    setup: Duration,
}

impl IpcReceiver {
    /// Connect to the sender at `path` and attach its ring on `driver`'s device.
    pub fn connect(
        driver: Arc<dyn Driver>,
        path: impl AsRef<Path>,
        timeout: Duration,
    ) -> Result<Self> {
        let start = Instant::now();
        let path = path.as_ref().to_path_buf();
        let (mut ch, sender_pid) = connect_to_sender(&path, timeout)?;
        match ch.recv::<FromSender>()? {
            FromSender::Ring {
                share,
                slots,
                slot_bytes,
            } => IpcReceiver::attach_ring(
                driver,
                ch,
                path,
                (share, slots, slot_bytes),
                timeout,
                (start, sender_pid),
            ),
            other => Err(Error::InvalidArgument(format!(
                "update sender on {}: expected the ring first, got {}",
                path.display(),
                kind(&other)
            ))),
        }
    }

    /// Attach the ring a sender announced (`share`, `slots`, `slot_bytes`)
    /// on a control channel already read up to that announcement; the
    /// process `sender_pid` (the sender's) must serve it.
    pub(super) fn attach_ring(
        driver: Arc<dyn Driver>,
        mut ch: Channel,
        path: PathBuf,
        (share, slots, slot_bytes): (String, u32, u64),
        timeout: Duration,
        (start, sender_pid): (Instant, i32),
    ) -> Result<Self> {
        let bad = |why: String| {
            Error::InvalidArgument(format!("update sender on {}: {why}", path.display()))
        };
        if slots == 0 || slots > MAX_SLOTS || slot_bytes == 0 {
            return Err(bad(format!(
                "ring of {slots} slots of {slot_bytes} bytes (1 to {MAX_SLOTS} slots of at least 1 byte accepted)"
            )));
        }
        let ring = match Attachment::attach(
            driver,
            &share,
            &AttachOptions {
                timeout,
                ..AttachOptions::default()
            },
        )
        .and_then(|r| super::import_cache::served_by_sender(&r, sender_pid).map(|()| r))
        {
            Ok(r) => r,
            Err(e) => {
                let _ = ch.send(&FromReceiver::Failed {
                    reason: e.to_string(),
                });
                return Err(e);
            }
        };
        let mut ptrs = Vec::with_capacity(slots as usize);
        for i in 0..slots as usize {
            let t = ring
                .tensor(&slot_name(i))
                .map_err(|_| bad(format!("the ring's share has no `{}`", slot_name(i))))?;
            if (t.bytes as u64) < slot_bytes {
                return Err(bad(format!(
                    "ring slot {i} maps {} bytes, the sender announced {slot_bytes}",
                    t.bytes
                )));
            }
            ptrs.push(t.ptr);
        }
        ch.send(&FromReceiver::Attached)?;
        Ok(IpcReceiver {
            ch,
            path,
            ring,
            slots: ptrs,
            slot_bytes,
            announced: 0,
            received: 0,
            setup: start.elapsed(),
        })
    }

    /// From connecting to the ring attached (the one handshake of this update).
    pub fn setup_time(&self) -> Duration {
        self.setup
    }

    fn bad(&self, why: String) -> Error {
        Error::InvalidArgument(format!("update sender on {}: {why}", self.path.display()))
    }

    fn died(&self, e: Error) -> Error {
        match e {
            Error::InvalidState(why) => Error::InvalidState(format!(
                "{why}; bucket {} of {} was awaited; nothing of this update was committed",
                self.received, self.announced
            )),
            other => other,
        }
    }
}

pub(super) fn kind(m: &FromSender) -> &'static str {
    match m {
        FromSender::Ring { .. } => "the ring",
        FromSender::Direct { .. } => "a direct update",
        FromSender::Offer => "an offer",
        FromSender::Begin { .. } => "a begin",
        FromSender::Bucket { .. } => "a bucket",
        FromSender::End => "the end",
        FromSender::Abort { .. } => "an abort",
    }
}

impl BucketSource for IpcReceiver {
    fn begin(&mut self) -> Result<Vec<AnnouncedTensor>> {
        match self.ch.recv::<FromSender>().map_err(|e| self.died(e))? {
            FromSender::Begin { tensors, buckets } => {
                self.announced = buckets;
                Ok(tensors)
            }
            FromSender::Abort { reason } => Err(Error::InvalidState(format!(
                "update sender on {}: aborted before the first bucket: {reason}",
                self.path.display()
            ))),
            other => Err(self.bad(format!("expected a begin, got {}", kind(&other)))),
        }
    }

    fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    fn next(&mut self) -> Result<Option<(BucketManifest, DevicePtr)>> {
        // The share may have been revoked (the sender's tag slept): refuse
        // before reading a slot whose memory the sender no longer writes.
        self.ring.check()?;
        match self.ch.recv::<FromSender>().map_err(|e| self.died(e))? {
            FromSender::Bucket { slot, manifest } => {
                if self.received >= self.announced {
                    return Err(self.bad(format!(
                        "bucket {} past the {} announced",
                        manifest.seq, self.announced
                    )));
                }
                let want = (self.received % self.slots.len() as u64) as u32;
                if slot != want {
                    return Err(self.bad(format!(
                        "bucket {} in slot {slot}; its place in the ring is slot {want}",
                        manifest.seq
                    )));
                }
                self.received += 1;
                Ok(Some((manifest, self.slots[slot as usize])))
            }
            FromSender::End => {
                if self.received != self.announced {
                    return Err(self.bad(format!(
                        "ended after {} of the {} buckets announced (a short update)",
                        self.received, self.announced
                    )));
                }
                Ok(None)
            }
            FromSender::Abort { reason } => Err(Error::InvalidState(format!(
                "update sender on {}: aborted after {} of {} buckets: {reason}; nothing of this update was committed",
                self.path.display(),
                self.received,
                self.announced
            ))),
            other => Err(self.bad(format!("expected a bucket, got {}", kind(&other)))),
        }
    }

    fn release(&mut self, seq: u64) -> Result<()> {
        self.ch.send(&FromReceiver::Applied { seq })
    }

    fn finish(&mut self, outcome: std::result::Result<u64, String>) {
        let msg = match outcome {
            Ok(version) => FromReceiver::Committed { version },
            Err(reason) => FromReceiver::Failed { reason },
        };
        // The sender may be gone (that may be why the update failed).
        let _ = self.ch.send(&msg);
    }
}
