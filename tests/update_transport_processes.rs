//! The update transports between real processes, on the host backend: the
//! test binary runs itself as the sender (the `child` test, a no-op unless
//! `VMMW_UPDATE_ROLE` is set); the receivers run in this process.
//!
//! Shown: an update from another process arrives bitwise; tensor-parallel
//! worlds of 2, 4 and 8 receivers each keep only their slices; a sender
//! killed mid-update leaves the receiver's last version intact with an error
//! naming the bucket it waited for; a short update, a bucket past the ring's
//! slot, a bucket in the wrong slot, a piece of an unannounced tensor, a
//! ring whose slots are smaller than announced and a sender that aborts are
//! each refused, leaving the last version.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::sync_copy::copy_to_host;
use vmmweights::driver::Driver;
use vmmweights::loader::dtype::Dtype;
use vmmweights::loader::registry::Destination;
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::share::{LogSink, ServeOptions, Server};
use vmmweights::update::transport::bucket::{plan_buckets, AnnouncedTensor, BucketManifest};
use vmmweights::update::transport::control::{Channel, FromReceiver, FromSender};
use vmmweights::update::transport::ipc::{
    IpcReceiver, IpcSender, SendData, SendTensor, SenderOptions,
};
use vmmweights::update::transport::{receive, BucketSink, Landed};
use vmmweights::{tag, Error};

const G: usize = 64 << 10;
const TIMEOUT: Duration = Duration::from_secs(20);

fn host() -> Arc<dyn Driver> {
    Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }))
}

fn pool() -> Arc<Pool> {
    Arc::new(
        Pool::new(
            host(),
            PoolConfig {
                small_segment_bytes: 4 * G,
                small_request_max: 2 * G,
                large_segment_bytes: 16 * G,
                ..PoolConfig::default()
            },
        )
        .unwrap(),
    )
}

fn sock_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmmw-update-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_file(p.with_extension("ring"));
    p
}

/// The model both sides agree on: names, types, shapes (rows divisible by 8
/// so every world of the tests splits them evenly).
fn specs() -> Vec<(&'static str, Dtype, Vec<usize>)> {
    vec![
        ("model.embed_tokens.weight", Dtype::Bf16, vec![256, 136]),
        (
            "model.layers.0.self_attn.qkv_proj.weight",
            Dtype::F32,
            vec![96, 333],
        ),
        ("model.norm.weight", Dtype::F32, vec![8, 17]),
        ("lm_head.weight", Dtype::Bf16, vec![512, 40]),
    ]
}

fn bytes_of(seed: u64, i: usize, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) ^ (i as u64 + 1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The full tensors of version `seed`.
fn weights(seed: u64) -> Vec<Vec<u8>> {
    specs()
        .iter()
        .enumerate()
        .map(|(i, (_, d, s))| bytes_of(seed, i, s.iter().product::<usize>() * d.size()))
        .collect()
}

/// A receiver's destinations: rank `rank` of `world` holds rows
/// `rank*rows/world..` of each tensor (dim 0 cut), filled with version 1.
struct Engine {
    pool: Arc<Pool>,
    dests: Vec<Destination>,
    rank: usize,
    world: usize,
}

impl Engine {
    fn new(rank: usize, world: usize) -> Engine {
        let pool = pool();
        let t = tag::id("update-engine").unwrap();
        let full = weights(1);
        let dests = specs()
            .into_iter()
            .enumerate()
            .map(|(i, (name, dtype, mut shape))| {
                shape[0] /= world;
                let bytes = shape.iter().product::<usize>() * dtype.size();
                let b = pool.alloc_tagged(bytes, t).unwrap();
                let d = Destination {
                    name: name.into(),
                    ptr: b.ptr,
                    dtype,
                    shape,
                };
                // SAFETY: host backend: the block is mapped read-write here.
                unsafe {
                    std::slice::from_raw_parts_mut(d.ptr as *mut u8, bytes)
                        .copy_from_slice(&full[i][rank * bytes..(rank + 1) * bytes]);
                }
                d
            })
            .collect();
        Engine {
            pool,
            dests,
            rank,
            world,
        }
    }

    fn read(&self) -> Vec<Vec<u8>> {
        self.dests
            .iter()
            .map(|d| {
                let mut v = vec![0u8; d.bytes()];
                // SAFETY: the destination is mapped for `d.bytes()` bytes.
                unsafe { copy_to_host(self.pool.driver().as_ref(), &mut v, d.ptr).unwrap() };
                v
            })
            .collect()
    }

    /// What this rank must hold of version `seed`.
    fn expected(&self, seed: u64) -> Vec<Vec<u8>> {
        weights(seed)
            .into_iter()
            .map(|full| {
                let n = full.len() / self.world;
                full[self.rank * n..(self.rank + 1) * n].to_vec()
            })
            .collect()
    }

    fn sink(&self) -> SliceSink<'_> {
        SliceSink {
            engine: self,
            staged: Vec::new(),
            tensors: Vec::new(),
            version: 1,
        }
    }
}

/// The receiving side's update entry for these tests: it keeps only this
/// rank's byte range of each tensor, stages what lands and writes the
/// destinations at commit, so an abort leaves them untouched.
struct SliceSink<'a> {
    engine: &'a Engine,
    staged: Vec<Vec<u8>>,
    tensors: Vec<AnnouncedTensor>,
    version: u64,
}

impl BucketSink for SliceSink<'_> {
    fn begin(&mut self, tensors: &[AnnouncedTensor]) -> vmmweights::Result<()> {
        let mut problems = Vec::new();
        for (t, d) in tensors.iter().zip(&self.engine.dests) {
            if t.name != d.name || t.bytes as usize != d.bytes() * self.engine.world {
                problems.push(format!("`{}`: does not match `{}`", t.name, d.name));
            }
        }
        if tensors.len() != self.engine.dests.len() {
            problems.push(format!(
                "{} tensors, {} destinations",
                tensors.len(),
                self.engine.dests.len()
            ));
        }
        if !problems.is_empty() {
            return Err(Error::InvalidArgument(problems.join("; ")));
        }
        self.tensors = tensors.to_vec();
        self.staged = self
            .engine
            .dests
            .iter()
            .map(|d| vec![0u8; d.bytes()])
            .collect();
        Ok(())
    }

    fn apply(&mut self, b: Landed<'_>) -> vmmweights::Result<()> {
        let driver = self.engine.pool.driver();
        for e in &b.manifest.entries {
            let i = e.tensor as usize;
            let keep = self.staged[i].len() as u64;
            let lo = keep * self.engine.rank as u64;
            let (a, z) = (e.offset.max(lo), (e.offset + e.len).min(lo + keep));
            if a >= z {
                continue;
            }
            let dst = &mut self.staged[i][(a - lo) as usize..(z - lo) as usize];
            // SAFETY: the piece lies inside the landed bucket (the manifest was
            // checked against the ring's slot before `apply`).
            unsafe { copy_to_host(driver.as_ref(), dst, b.src + e.at + (a - e.offset))? };
        }
        Ok(())
    }

    fn commit(&mut self) -> vmmweights::Result<u64> {
        for (d, s) in self.engine.dests.iter().zip(&self.staged) {
            // SAFETY: host backend: the destination is mapped read-write here.
            unsafe { std::slice::from_raw_parts_mut(d.ptr as *mut u8, s.len()).copy_from_slice(s) };
        }
        self.version += 1;
        Ok(self.version)
    }

    fn abort(&mut self) {
        self.staged.clear();
    }
}

struct Proc {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(role: &str, path: &Path, env: &[(&str, String)]) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env("VMMW_UPDATE_ROLE", role)
            .env("VMMW_UPDATE_PATH", path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if let Some((_, rest)) = line.split_once('@') {
                    if tx.send(rest.to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        Proc { child, lines }
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the child answered within 30 s")
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn wait(mut self) -> String {
        let l = self.line();
        self.child.wait().unwrap();
        l
    }
}

fn receive_as(engine: &Engine, path: &Path) -> vmmweights::Result<u64> {
    let mut source = IpcReceiver::connect(engine.pool.driver().clone(), path, TIMEOUT)?;
    let mut sink = engine.sink();
    receive(&mut source, &mut sink)
}

#[test]
fn update_from_another_process_is_bitwise() {
    let path = sock_path("plain");
    let sender = Proc::spawn(
        "sender",
        &path,
        &[("VMMW_UPDATE_SLOT", (40 << 10).to_string())],
    );
    assert_eq!(sender.line(), "ready");
    let engine = Engine::new(0, 1);
    assert_eq!(engine.read(), engine.expected(1));
    let v = receive_as(&engine, &path).unwrap();
    assert_eq!(v, 2);
    assert!(
        engine.read() == engine.expected(7),
        "update arrives bitwise"
    );
    let done = sender.wait();
    assert!(done.starts_with("sent version=2 buckets="), "{done}");
}

#[test]
fn tensor_parallel_ranks_keep_only_their_slices() {
    for world in [2usize, 4, 8] {
        let path = sock_path(&format!("tp{world}"));
        let sender = Proc::spawn(
            "sender",
            &path,
            &[
                ("VMMW_UPDATE_SLOT", (24 << 10).to_string()),
                ("VMMW_UPDATE_RECEIVERS", world.to_string()),
            ],
        );
        assert_eq!(sender.line(), "ready");
        let engines: Vec<Engine> = (0..world).map(|r| Engine::new(r, world)).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = engines
                .iter()
                .map(|e| s.spawn(|| receive_as(e, &path)))
                .collect();
            for h in handles {
                assert_eq!(h.join().unwrap().unwrap(), 2);
            }
        });
        for e in &engines {
            assert!(
                e.read() == e.expected(7),
                "world {world} rank {} holds its slice of the update",
                e.rank
            );
            assert_eq!(e.read()[0].len() * world, weights(7)[0].len());
        }
        let done = sender.wait();
        assert!(done.starts_with("sent version=2"), "{done}");
    }
}

#[test]
fn sender_killed_mid_update_leaves_the_last_version() {
    let path = sock_path("killed");
    let sender = Proc::spawn("stall", &path, &[]);
    assert_eq!(sender.line(), "ready");
    let engine = Engine::new(0, 1);
    let e = std::thread::scope(|s| {
        let r = s.spawn(|| receive_as(&engine, &path));
        assert_eq!(sender.line(), "stalled");
        sender.kill();
        r.join().unwrap().unwrap_err()
    });
    let msg = e.to_string();
    assert!(msg.contains("the connection closed"), "{msg}");
    assert!(msg.contains("bucket 2 of 3 was awaited"), "{msg}");
    assert!(
        msg.contains("nothing of this update was committed"),
        "{msg}"
    );
    assert!(
        engine.read() == engine.expected(1),
        "the last version is intact"
    );
}

#[test]
fn hostile_senders_are_refused_and_change_nothing() {
    let cases = [
        ("short", "ended after 1 of the 2 buckets announced"),
        ("past_ring", "past the ring's slot"),
        ("wrong_slot", "its place in the ring is slot 0"),
        ("unknown_tensor", "names tensor 9"),
        ("out_of_order", "out of order"),
        ("slot_lie", "the sender announced"),
        ("abort", "aborted after 1 of 2 buckets: trainer failed"),
        ("too_many_slots", "1 to 64 slots"),
        ("garbage", "malformed control message"),
    ];
    for (case, want) in cases {
        let path = sock_path(case);
        let sender = Proc::spawn("hostile", &path, &[("VMMW_UPDATE_CASE", case.to_string())]);
        assert_eq!(sender.line(), "ready");
        let engine = Engine::new(0, 1);
        let e = receive_as(&engine, &path).expect_err(case);
        assert!(e.to_string().contains(want), "{case}: {e}");
        assert!(
            engine.read() == engine.expected(1),
            "{case}: the last version is intact"
        );
        sender.kill();
    }
}

/// The other processes' side; a no-op unless this binary was started as one.
#[test]
fn child() {
    let Ok(role) = std::env::var("VMMW_UPDATE_ROLE") else {
        return;
    };
    let path = PathBuf::from(std::env::var("VMMW_UPDATE_PATH").unwrap());
    match role.as_str() {
        "sender" => child_sender(&path),
        "stall" => child_raw(&path, "stall"),
        "hostile" => child_raw(&path, &std::env::var("VMMW_UPDATE_CASE").unwrap()),
        other => panic!("unknown role {other}"),
    }
}

fn env_usize(k: &str, default: usize) -> usize {
    std::env::var(k).map_or(default, |v| v.parse().unwrap())
}

fn child_sender(path: &Path) {
    let options = SenderOptions {
        slots: 2,
        slot_bytes: env_usize("VMMW_UPDATE_SLOT", 64 << 10),
        timeout: TIMEOUT,
        log: LogSink::discard(),
    };
    let mut sender = IpcSender::bind(pool(), path, options).unwrap();
    let data = weights(7);
    let tensors: Vec<SendTensor> = specs()
        .into_iter()
        .zip(&data)
        .map(|((name, dtype, shape), d)| SendTensor {
            name: name.into(),
            dtype,
            shape,
            data: SendData::Host(d),
        })
        .collect();
    println!("@ready");
    match sender.send_to(&tensors, env_usize("VMMW_UPDATE_RECEIVERS", 1)) {
        Ok(r) => println!("@sent version={} buckets={}", r.version, r.buckets),
        Err(e) => println!("@error {e}"),
    }
}

/// A sender that speaks the protocol by hand: `stall` sends two of three
/// buckets and waits to be killed; the other cases each break one rule.
fn child_raw(path: &Path, case: &str) {
    let slot_bytes = 16 << 10;
    let pool = pool();
    let t = tag::id("raw-ring").unwrap();
    let slots: Vec<Destination> = (0..2)
        .map(|i| Destination {
            name: format!("slot.{i}"),
            ptr: pool.alloc_tagged(slot_bytes, t).unwrap().ptr,
            dtype: Dtype::U8,
            shape: vec![slot_bytes],
        })
        .collect();
    let ring = PathBuf::from(format!("{}.ring", path.display()));
    let options = ServeOptions {
        log: LogSink::discard(),
        ..ServeOptions::default()
    };
    let _server = Server::start(pool.clone(), t, slots, &ring, options).unwrap();
    let listener = UnixListener::bind(path).unwrap();
    println!("@ready");
    let (mut sock, _) = listener.accept().unwrap();
    if case == "garbage" {
        use std::io::Write;
        let raw = b"{not json";
        let mut frame = (raw.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(raw);
        sock.write_all(&frame).unwrap();
        std::thread::sleep(Duration::from_secs(600));
    }
    let mut ch = Channel::new(sock, "receiver", TIMEOUT).unwrap();
    let (slots_n, announced_bytes) = match case {
        "too_many_slots" => (65, slot_bytes as u64),
        "slot_lie" => (2, 2 * slot_bytes as u64),
        _ => (2, slot_bytes as u64),
    };
    ch.send(&FromSender::Ring {
        share: ring.to_string_lossy().into_owned(),
        slots: slots_n,
        slot_bytes: announced_bytes,
    })
    .unwrap();
    let _ = ch.recv::<FromReceiver>();
    let sizes: Vec<u64> = weights(7).iter().map(|w| w.len() as u64).collect();
    let tensors: Vec<AnnouncedTensor> = specs()
        .into_iter()
        .zip(&sizes)
        .map(|((name, dtype, shape), &bytes)| AnnouncedTensor {
            name: name.into(),
            dtype: dtype.name().into(),
            shape: shape.iter().map(|&d| d as u64).collect(),
            bytes,
        })
        .collect();
    let plan = plan_buckets(&sizes, slot_bytes as u64).unwrap();
    let announced = if case == "stall" { 3 } else { 2 };
    // The receiver may have refused the ring already.
    let _ = ch.send(&FromSender::Begin {
        tensors,
        buckets: announced,
    });
    let bucket = |seq: usize| FromSender::Bucket {
        slot: (seq % 2) as u32,
        manifest: plan[seq].clone(),
    };
    match case {
        "stall" => {
            let _ = ch.send(&bucket(0));
            let _ = ch.send(&bucket(1));
            let _ = ch.recv::<FromReceiver>();
            let _ = ch.recv::<FromReceiver>();
            println!("@stalled");
            std::thread::sleep(Duration::from_secs(600));
        }
        "short" => {
            let _ = ch.send(&bucket(0));
            let _ = ch.send(&FromSender::End);
        }
        "past_ring" => {
            let mut m: BucketManifest = plan[0].clone();
            m.bytes = slot_bytes as u64 + 4096;
            m.entries[0].len += 4096;
            let _ = ch.send(&FromSender::Bucket {
                slot: 0,
                manifest: m,
            });
        }
        "wrong_slot" => {
            let _ = ch.send(&FromSender::Bucket {
                slot: 1,
                manifest: plan[0].clone(),
            });
        }
        "unknown_tensor" => {
            let mut m = plan[0].clone();
            m.entries[0].tensor = 9;
            let _ = ch.send(&FromSender::Bucket {
                slot: 0,
                manifest: m,
            });
        }
        "out_of_order" => {
            let mut m = plan[1].clone();
            m.seq = 1;
            let _ = ch.send(&FromSender::Bucket {
                slot: 0,
                manifest: m,
            });
        }
        "abort" => {
            let _ = ch.send(&bucket(0));
            let _ = ch.send(&FromSender::Abort {
                reason: "trainer failed".into(),
            });
        }
        _ => {}
    }
    std::thread::sleep(Duration::from_secs(600));
}
