//! `vmmw bench-update`: how fast an update writes new weights into a loaded
//! checkpoint's destinations from tensors in device memory of this process
//! (a trainer's gathered state dict), against a plain device-to-device copy
//! of the same bytes measured in the same run.
//!
//! The checkpoint is loaded into pool memory through the preset's rules
//! (fused q/k/v and gate/up, and tensor-parallel slices with `--tp-world`);
//! the source is every checkpoint tensor, whole, in one segment, filled with
//! other bytes. Each timed update goes from one version to the next (median
//! of `--repeat`, after one untimed update); the reference is one copy of
//! the bytes the update writes, segment to segment. Afterwards every
//! destination a source fills whole is compared with the source, bitwise.
//! On the host backend the rates are those of the simulation, labelled so.
//! `--transport ipc` sends the source through the IPC transport's ring from
//! another thread (the export, the attach and the buckets every time);
//! `--transport ipc-direct` sends it straight out of the sender's pool (the
//! trainer's tensors allocated one by one there), to a receiver that keeps
//! its imports across updates: the first update attaches, the timed ones
//! reuse.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use vmmweights::driver::{Driver, StreamId};
use vmmweights::loader::{Session, Tp};
use vmmweights::share::LogSink;
use vmmweights::update::transport::ipc::{
    IpcReceiver, IpcSender, SendData, SendTensor, SenderOptions,
};
use vmmweights::update::transport::receiver::{ReceiverOptions, UpdateReceiver};
use vmmweights::update::transport::{receive, send};
use vmmweights::update::{self, Bytes, Staging, Tensors, UpdateOptions};
use vmmweights::{tag, BackendKind, Error, Pool, PoolConfig, Result, Segment};

use crate::backend::BackendArgs;

/// Options of `vmmw bench-update`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Checkpoint file or folder.
    checkpoint: std::path::PathBuf,
    /// Mapping preset (llama, mistral, qwen, qwen2, qwen3) or `none` for names as they are.
    #[arg(long, default_value = "none", value_parser = preset_or_none)]
    preset: String,
    /// Head dimension for the preset.
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// Tensor-parallel world (with --tp-rank): the destinations are this
    /// rank's slices; the source is still every tensor whole.
    #[arg(long, default_value_t = 0)]
    tp_world: usize,
    /// Tensor-parallel rank.
    #[arg(long, default_value_t = 0)]
    tp_rank: usize,
    /// Timed updates (median reported).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Stage through scratch device memory (as a streaming source does).
    #[arg(long)]
    staged: bool,
    /// How the source reaches the update: `direct` (the tensors of this
    /// process), `ipc` (a sender on another thread sends them through the
    /// IPC transport's ring: export, attach, buckets; each timed update
    /// includes its handshake) or `ipc-direct` (the sender's tensors lie in
    /// its pool and are copied straight out of them by a receiver that keeps
    /// its imports; each timed update includes its handshake).
    #[arg(long, default_value = "direct", value_parser = ["direct", "ipc", "ipc-direct"])]
    transport: String,
    /// Bucket (ring slot) size for `--transport ipc`.
    #[arg(long, default_value_t = vmmweights::update::transport::DEFAULT_BUCKET_BYTES)]
    bucket_bytes: usize,
    /// Write the results as JSON to FILE; `--json` alone (or `--json -`) prints
    /// them on stdout and moves the other lines to stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
}

fn preset_or_none(s: &str) -> std::result::Result<String, String> {
    if s == "none" {
        Ok(s.to_owned())
    } else {
        crate::parse::preset(s).map_err(|e| format!("{e}, or none"))
    }
}

#[derive(Debug, serde::Serialize)]
struct Output {
    what: &'static str,
    backend: String,
    device: String,
    reason: String,
    note: Option<&'static str>,
    checkpoint: String,
    preset: String,
    tp: Option<Tp>,
    staged: bool,
    transport: String,
    bucket_bytes: Option<usize>,
    setup_ms: Vec<f64>,
    /// `ipc-direct`: per timed update, whether the receiver recognized the
    /// manifest and reused every import.
    recognized: Option<Vec<bool>>,
    bytes: u64,
    destinations: u64,
    copies: u64,
    update_seconds: Vec<f64>,
    /// Each timed update's phases (checks and plan, issue, wait, bookkeeping).
    update_phases: Vec<update::UpdatePhases>,
    update_gbps: f64,
    copy_seconds: Vec<f64>,
    copy_gbps: f64,
    ratio: f64,
    first_version: u64,
    last_version: u64,
    verified_destinations: usize,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// Where each source tensor lies: name -> (address, bytes).
type Placed = BTreeMap<String, (u64, u64)>;

/// The checkpoint's tensors, whole, in one segment of `driver`, each filled
/// with a byte of its own (other bytes than the checkpoint's).
fn trainer_tensors(
    driver: &Arc<dyn Driver>,
    session: &Session,
) -> Result<(Segment, Tensors, Placed)> {
    let ckpt = vmmweights::loader::Checkpoint::open(session.path())?;
    let total: u64 = ckpt
        .tensors
        .values()
        .map(|t| t.len.div_ceil(256) * 256)
        .sum();
    let seg = Segment::allocate(driver.clone(), total.max(1) as usize, 256 << 20)?;
    let mut src = Tensors::new();
    let mut at = BTreeMap::new();
    let mut ptr = seg.ptr();
    for (i, (name, t)) in ckpt.tensors.iter().enumerate() {
        // SAFETY: `[ptr, ptr + len)` lies in the segment, mapped and writable.
        unsafe {
            driver.memset_async(ptr, (i * 37 + 11) as u8, t.len as usize, StreamId::DEFAULT)
        }?;
        // SAFETY: the segment outlives every update of this run.
        unsafe { src.add(name, t.dtype, &t.shape, Bytes::Device(ptr)) }?;
        at.insert(name.clone(), (ptr, t.len));
        ptr += t.len.div_ceil(256) * 256;
    }
    driver.synchronize()?;
    Ok((seg, src, at))
}

/// Each destination a source tensor fills whole (same name, same size),
/// compared with it, bitwise; returns how many were checked.
fn verify(driver: &Arc<dyn Driver>, session: &Session, at: &Placed) -> Result<usize> {
    let mut checked = 0;
    for d in session.destinations() {
        let Some(&(src, len)) = at.get(&d.name) else {
            continue;
        };
        if len != d.bytes() as u64 {
            continue;
        }
        let mut a = vec![0u8; len as usize];
        let mut b = vec![0u8; len as usize];
        // SAFETY: both ranges are mapped device memory of `len` bytes.
        unsafe {
            vmmweights::driver::sync_copy::copy_to_host(driver.as_ref(), &mut a, src)?;
            vmmweights::driver::sync_copy::copy_to_host(driver.as_ref(), &mut b, d.ptr)?;
        }
        if a != b {
            return Err(Error::InvalidState(format!(
                "after the update, destination `{}` differs from its source",
                d.name
            )));
        }
        checked += 1;
    }
    Ok(checked)
}

/// The IPC transport's sending side for the benchmark: a pool of its own on
/// the same device, a ring exported once, a control socket in a temporary
/// folder; each update is sent from another thread and received here.
struct Sender {
    dir: tempfile_dir::Dir,
    tx: IpcSender,
}

mod tempfile_dir {
    /// A private folder under the temporary directory, removed on drop.
    pub struct Dir(pub std::path::PathBuf);

    impl Dir {
        pub fn new() -> std::io::Result<Dir> {
            let p = std::env::temp_dir().join(format!("vmmw-bench-update-{}", std::process::id()));
            std::fs::create_dir_all(&p)?;
            Ok(Dir(p))
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Sender {
    fn new(driver: &Arc<dyn Driver>, bucket_bytes: usize) -> Result<Sender> {
        let dir = tempfile_dir::Dir::new().map_err(|e| Error::io(std::env::temp_dir(), e))?;
        let pool = Arc::new(Pool::new(driver.clone(), PoolConfig::default())?);
        let options = SenderOptions {
            slot_bytes: bucket_bytes,
            log: LogSink::discard(),
            ..SenderOptions::default()
        };
        let tx = IpcSender::bind(pool, dir.0.join("sender.sock"), options)?;
        Ok(Sender { dir, tx })
    }

    /// One update of `session`'s destinations from `src` through the ring;
    /// returns the update and the handshake's time.
    fn update(
        &mut self,
        session: &Session,
        pool: &Pool,
        src: &mut Tensors,
        opts: &UpdateOptions,
    ) -> Result<(update::UpdateResult, Option<std::time::Duration>)> {
        let path = self.dir.0.join("sender.sock");
        let tx = &mut self.tx;
        std::thread::scope(|s| {
            let received = s.spawn(move || {
                let wait = std::time::Duration::from_secs(60);
                IpcReceiver::connect(pool.driver().clone(), &path, wait)
                    .and_then(|mut rx| receive(&mut rx, session, pool, opts))
            });
            let sent = send::with_source(src, |t| tx.send(t));
            let r = received
                .join()
                .map_err(|_| Error::InvalidState("the receiving thread panicked".into()))??;
            Ok((r, Some(sent?.setup)))
        })
    }
}

/// A direct IPC sender for the benchmark: the trainer's tensors allocated
/// one by one in a pool of its own on the same device (as a framework's
/// allocator places them), sent from another thread straight out of that
/// memory to a receiver here that keeps its imports across updates.
struct DirectSender {
    dir: tempfile_dir::Dir,
    tx: IpcSender,
    rx: UpdateReceiver,
    tensors: Vec<SendTensor<'static>>,
    /// Per update: the receiver recognized the manifest (the last one, byte
    /// for byte) and reused every import.
    recognized: Vec<bool>,
}

impl DirectSender {
    /// The sender, its tensors (each filled with a byte of its own) and
    /// where they lie.
    fn new(driver: &Arc<dyn Driver>, session: &Session) -> Result<(DirectSender, Placed)> {
        let dir = tempfile_dir::Dir::new().map_err(|e| Error::io(std::env::temp_dir(), e))?;
        let pool = Arc::new(Pool::new(driver.clone(), PoolConfig::default())?);
        let t = tag::id("bench-update-sender")?;
        let ckpt = vmmweights::loader::Checkpoint::open(session.path())?;
        let mut tensors = Vec::with_capacity(ckpt.tensors.len());
        let mut at = BTreeMap::new();
        for (i, (name, info)) in ckpt.tensors.iter().enumerate() {
            let block = pool.alloc_tagged(info.len.max(1) as usize, t)?;
            // SAFETY: the block is mapped, writable and at least `len` long.
            unsafe {
                driver.memset_async(
                    block.ptr,
                    (i * 37 + 11) as u8,
                    info.len as usize,
                    StreamId::DEFAULT,
                )
            }?;
            tensors.push(SendTensor {
                name: name.clone(),
                dtype: info.dtype,
                shape: info.shape.clone(),
                data: SendData::Device(block.ptr),
            });
            at.insert(name.clone(), (block.ptr, info.len));
        }
        driver.synchronize()?;
        let path = dir.0.join("direct.sock");
        let options = SenderOptions {
            log: LogSink::discard(),
            ..SenderOptions::default()
        };
        let tx = IpcSender::bind(pool, &path, options)?;
        let rx = UpdateReceiver::new(driver.clone(), &path, ReceiverOptions::default());
        let sender = DirectSender {
            dir,
            tx,
            rx,
            tensors,
            recognized: Vec::new(),
        };
        Ok((sender, at))
    }

    /// One update of `session`'s destinations, sent from another thread;
    /// returns the update and the receiver's setup (connect to every share
    /// resolved and the manifest checked).
    fn update(
        &mut self,
        session: &Session,
        pool: &Pool,
        opts: &UpdateOptions,
    ) -> Result<(update::UpdateResult, Option<std::time::Duration>)> {
        let _ = &self.dir;
        let (tx, tensors, rx) = (&mut self.tx, &self.tensors, &mut self.rx);
        let (r, stats) = std::thread::scope(|s| {
            let sent = s.spawn(move || tx.send_direct_to(tensors, 1));
            let r = rx.receive(session, pool, opts);
            sent.join()
                .map_err(|_| Error::InvalidState("the sending thread panicked".into()))??;
            Ok::<_, Error>((r?, rx.last_receive()))
        })?;
        let stats = stats.unwrap_or_default();
        self.recognized
            .push(stats.recognized && stats.attached == 0 && stats.reused > 0);
        Ok((r, Some(stats.setup)))
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.repeat == 0 {
        return Err(Error::InvalidArgument("--repeat must be at least 1".into()));
    }
    let tp = (a.tp_world > 0).then_some(Tp {
        rank: a.tp_rank,
        world: a.tp_world,
    });
    let session = Session::open(&a.checkpoint)?;
    if a.preset != "none" {
        session.set_preset(&a.preset, tp, a.head_dim)?;
    } else if tp.is_some() {
        return Err(Error::InvalidArgument(
            "--tp-world needs a --preset (its shard rules)".into(),
        ));
    }
    let opened = a.backend.open()?;
    let driver = opened.driver.clone();
    let pool = Pool::new(driver.clone(), PoolConfig::default())?;
    let t = tag::id("bench-update")?;
    outln!("backend: {}", driver.kind());
    outln!("  device: {}", driver.describe());
    outln!("  why:    {}", opened.reason);
    let note = (driver.kind() == BackendKind::Host)
        .then_some("host backend: copies are memcpy in host memory, not GPU rates");
    if let Some(n) = note {
        outln!("  note:   {n}");
    }
    session.allocate(&pool, t)?;
    session.load(&pool, None)?;
    let (_src_seg, mut src, mut at) = trainer_tensors(&driver, &session)?;
    let mut opts = UpdateOptions::from_version(pool.tag_version(t)?);
    if a.staged {
        opts.staging = Staging::Always;
    }
    let first_version = opts.expected_version;
    let ipc = a.transport == "ipc";
    let mut sender = if ipc {
        Some(Sender::new(&driver, a.bucket_bytes)?)
    } else {
        None
    };
    let mut direct = if a.transport == "ipc-direct" {
        let (d, placed) = DirectSender::new(&driver, &session)?;
        at = placed;
        Some(d)
    } else {
        None
    };
    let mut one = |opts: &UpdateOptions, src: &mut Tensors| match (&mut sender, &mut direct) {
        (Some(s), _) => s.update(&session, &pool, src, opts),
        (None, Some(d)) => d.update(&session, &pool, opts),
        (None, None) => update::update(&session, &pool, src, opts).map(|r| (r, None)),
    };
    // Untimed: plans once (kept by the session) and warms the copy path.
    let (mut last, _) = one(&opts, &mut src)?;
    let mut update_seconds = Vec::with_capacity(a.repeat);
    let mut setup_ms = Vec::new();
    let mut update_phases = Vec::with_capacity(a.repeat);
    for _ in 0..a.repeat {
        opts.expected_version = last.version;
        let t0 = Instant::now();
        let (r, setup) = one(&opts, &mut src)?;
        update_seconds.push(t0.elapsed().as_secs_f64());
        setup_ms.extend(setup.map(|s| s.as_secs_f64() * 1e3));
        update_phases.push(r.phases);
        last = r;
    }
    if ipc {
        outln!(
            "  transport: ipc, buckets of {} bytes, setup (the ring's handshake) {:.1} ms median",
            a.bucket_bytes,
            median(&setup_ms)
        );
    }
    let recognized = direct.as_ref().map(|d| d.recognized[1..].to_vec());
    if let Some(r) = &recognized {
        outln!(
            "  transport: ipc-direct, {} of {} timed updates recognized the manifest and reused the imports; setup (connect to the manifest checked) {:.2} ms median",
            r.iter().filter(|&&x| x).count(),
            r.len(),
            median(&setup_ms)
        );
    }
    let bytes = last.bytes;
    outln!(
        "  update: {} destinations, {} copies, {:.2} GB{}",
        last.destinations,
        last.copies,
        bytes as f64 / 1e9,
        if a.staged { ", staged" } else { "" }
    );
    // The reference: one device-to-device copy of as many bytes.
    let copy_seconds = {
        let from = Segment::allocate(driver.clone(), bytes.max(1) as usize, 256 << 20)?;
        let to = Segment::allocate(driver.clone(), bytes.max(1) as usize, 256 << 20)?;
        let stream = driver.stream_create()?;
        let mut secs = Vec::with_capacity(a.repeat);
        for i in 0..=a.repeat {
            driver.synchronize()?;
            let t0 = Instant::now();
            // SAFETY: both segments are mapped, `bytes` long, and distinct.
            unsafe {
                driver.copy_2d_dtod_async(
                    to.ptr(),
                    bytes as usize,
                    from.ptr(),
                    bytes as usize,
                    bytes as usize,
                    1,
                    stream,
                )
            }?;
            driver.stream_synchronize(stream)?;
            if i > 0 {
                secs.push(t0.elapsed().as_secs_f64());
            }
        }
        driver.stream_destroy(stream)?;
        secs
    };
    let verified = verify(&driver, &session, &at)?;
    let update_gbps = bytes as f64 / median(&update_seconds) / 1e9;
    let copy_gbps = bytes as f64 / median(&copy_seconds) / 1e9;
    let ratio = update_gbps / copy_gbps;
    outln!(
        "  update {update_gbps:.1} GB/s (median of {}), device-to-device copy {copy_gbps:.1} GB/s: {ratio:.3} of the copy",
        a.repeat
    );
    let ms = |f: fn(&update::UpdatePhases) -> f64| {
        median(&update_phases.iter().map(f).collect::<Vec<_>>()) * 1e3
    };
    outln!(
        "  update phases (median ms): plan {:.2}, issue {:.2}, wait {:.2}, bookkeeping {:.2}; whole call {:.2}",
        ms(|p| p.plan),
        ms(|p| p.issue),
        ms(|p| p.wait),
        ms(|p| p.bookkeeping),
        median(&update_seconds) * 1e3
    );
    outln!(
        "  version {first_version} -> {}; {verified} destinations equal their source, bitwise",
        last.version
    );
    let out = Output {
        what: "vmmweights update from device tensors vs one device-to-device copy",
        backend: driver.kind().to_string(),
        device: driver.describe(),
        reason: opened.reason,
        note,
        checkpoint: a.checkpoint.display().to_string(),
        preset: a.preset,
        tp,
        staged: a.staged,
        transport: a.transport,
        bucket_bytes: ipc.then_some(a.bucket_bytes),
        setup_ms,
        recognized,
        bytes,
        destinations: last.destinations,
        copies: last.copies,
        update_seconds,
        update_phases,
        update_gbps,
        copy_seconds,
        copy_gbps,
        ratio,
        first_version,
        last_version: last.version,
        verified_destinations: verified,
    };
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&out).expect("plain data serializes");
        std::fs::write(path, text).map_err(|e| Error::io(path, e))?;
        outln!("wrote {}", path.display());
    }
    Ok(())
}
