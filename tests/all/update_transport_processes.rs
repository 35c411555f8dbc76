//! The IPC transport between real processes, on the host backend: this test
//! binary runs itself as the sender (the `child` test, a no-op unless
//! `VMMW_UPDATE_ROLE` is set); the engine ranks receive in this process,
//! through the update's rules (the llama preset: fused q/k/v and gate/up).
//!
//! Shown: an update from another process arrives bitwise; tensor-parallel
//! worlds of 2, 4 and 8 ranks each keep only their slices; a sender killed
//! mid-update leaves every destination and the version as they were, with an
//! error naming the bucket it waited for; a short update, a bucket past the
//! ring's slot, a bucket in the wrong slot, a piece of an unannounced tensor,
//! buckets out of order, a ring smaller than announced, too many slots,
//! garbage on the control socket and a sender that aborts are each refused
//! the same way.

use crate::common;
use crate::update_transport_ranks::{model, new_values, send_tensors, write_checkpoint, Rank};

use common::backend::on_each_backend;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use vmmweights::loader::registry::Destination;
use vmmweights::loader::Dtype;
use vmmweights::share::{LogSink, ServeOptions, Server};
use vmmweights::update::transport::bucket::{plan_buckets, AnnouncedTensor, BucketManifest};
use vmmweights::update::transport::control::{Channel, FromReceiver, FromSender};
use vmmweights::update::transport::ipc::{IpcSender, SenderOptions};
use vmmweights::update::transport::receiver::receive_ipc;
use vmmweights::update::UpdateOptions;
use vmmweights::{tag, Pool, PoolConfig, Status};

pub(crate) const TIMEOUT: Duration = Duration::from_secs(20);
pub(crate) const SEED: u64 = 7000;

pub(crate) fn sock_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmmw-update-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_file(format!("{}.ring", p.display()));
    p
}

pub(crate) struct Proc {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Proc {
    pub(crate) fn spawn(role: &str, path: &Path, env: &[(&str, String)]) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "update_transport_processes::child",
            "--nocapture",
            "--test-threads=1",
        ])
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

    pub(crate) fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the child answered within 30 s")
    }

    pub(crate) fn kill(mut self) {
        let _ = self.child.kill();
        self.child.wait().unwrap();
    }

    pub(crate) fn wait(mut self) -> String {
        let l = self.line();
        self.child.wait().unwrap();
        l
    }
}

/// Receive one update at `path` as an engine does, whichever way the sender sends.
pub(crate) fn receive_as(
    r: &Rank,
    path: &Path,
) -> vmmweights::Result<vmmweights::update::UpdateResult> {
    let opts = UpdateOptions::from_version(r.version());
    receive_ipc(
        r.pool.driver().clone(),
        path,
        TIMEOUT,
        &r.session,
        &r.pool,
        &opts,
    )
}

#[test]
fn update_from_another_process_is_bitwise() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let path = sock_path("plain");
    let sender = Proc::spawn("sender", &path, &[("VMMW_UPDATE_SLOT", (5000).to_string())]);
    assert_eq!(sender.line(), "ready");
    let r = Rank::load(dir.path(), &m, "ipc-plain", 0, 1);
    let v0 = r.version();
    let done = receive_as(&r, &path).unwrap();
    assert_eq!(done.version, v0 + 1);
    assert!(done.staged, "a transport's update stages");
    assert!(
        r.snapshot() == r.expected(&m, &new_values(&m, SEED)),
        "the update arrives bitwise"
    );
    let said = sender.wait();
    assert_eq!(
        said,
        format!(
            "sent version={} buckets={}",
            v0 + 1,
            said.rsplit('=').next().unwrap()
        )
    );
}

/// The same on every backend (CUDA VMM IPC on a GPU: the sender's ring is
/// device memory exported once, the receiver imports it), world 1 and a
/// rank of world 2.
#[test]
fn update_from_another_process_on_each_backend() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let new = new_values(&m, SEED);
    on_each_backend("update_from_another_process_on_each_backend", |b| {
        for (rank, world) in [(0, 1), (1, 2)] {
            let path = sock_path(&format!("each-{}-{world}", b.kind()));
            let sender = Proc::spawn(
                "sender",
                &path,
                &[
                    ("VMMW_UPDATE_SLOT", (6000).to_string()),
                    ("VMMW_UPDATE_BACKEND", b.kind().to_string()),
                ],
            );
            assert_eq!(sender.line(), "ready");
            let name = format!("ipc-each-{}", b.kind());
            let r = Rank::load_on(b.driver.clone(), dir.path(), &m, &name, rank, world);
            let v0 = r.version();
            let done = receive_as(&r, &path).unwrap();
            assert_eq!(done.version, v0 + 1);
            assert!(
                r.snapshot() == r.expected(&m, &new),
                "{}: rank {rank} of {world} holds its slices of the update",
                b.kind()
            );
            assert!(sender.wait().starts_with("sent version="));
        }
    });
}

#[test]
fn tensor_parallel_ranks_keep_only_their_slices() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let new = new_values(&m, SEED);
    for world in [2usize, 4, 8] {
        let path = sock_path(&format!("tp{world}"));
        let sender = Proc::spawn(
            "sender",
            &path,
            &[
                ("VMMW_UPDATE_SLOT", (3000).to_string()),
                ("VMMW_UPDATE_RECEIVERS", world.to_string()),
            ],
        );
        assert_eq!(sender.line(), "ready");
        let ranks: Vec<Rank> = (0..world)
            .map(|r| Rank::load(dir.path(), &m, "ipc-tp", r, world))
            .collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .iter()
                .map(|r| s.spawn(|| receive_as(r, &path)))
                .collect();
            for h in handles {
                h.join().unwrap().unwrap();
            }
        });
        for r in &ranks {
            assert!(
                r.snapshot() == r.expected(&m, &new),
                "world {world} rank {} holds its slices of the update",
                r.rank
            );
        }
        assert!(sender.wait().starts_with("sent version="));
    }
}

#[test]
fn sender_killed_mid_update_leaves_the_last_version() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let path = sock_path("killed");
    let sender = Proc::spawn("raw", &path, &[("VMMW_UPDATE_CASE", "stall".into())]);
    assert_eq!(sender.line(), "ready");
    let r = Rank::load(dir.path(), &m, "ipc-killed", 0, 1);
    let (before, v0) = (r.snapshot(), r.version());
    let e = std::thread::scope(|s| {
        let h = s.spawn(|| receive_as(&r, &path));
        assert_eq!(sender.line(), "stalled");
        sender.kill();
        h.join().unwrap().unwrap_err()
    });
    assert_eq!(e.status(), Status::UpdateSource, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("the connection closed"), "{msg}");
    assert!(msg.contains("bucket 2 of"), "{msg}");
    assert!(
        r.snapshot() == before,
        "every destination keeps the last version"
    );
    assert_eq!(r.version(), v0);
}

#[test]
fn hostile_senders_are_refused_and_change_nothing() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let cases = [
        ("short", "ended after 1 of the 2 buckets announced"),
        ("short_tensors", "tensors short"),
        ("past_ring", "past the ring's slot"),
        ("wrong_slot", "its place in the ring is slot 0"),
        ("unknown_tensor", "names tensor 999"),
        ("out_of_order", "out of order"),
        ("slot_lie", "the sender announced"),
        ("abort", "aborted after 1 of 2 buckets: trainer failed"),
        ("too_many_slots", "1 to 64 slots"),
        ("garbage", "malformed control message"),
    ];
    let r = Rank::load(dir.path(), &m, "ipc-hostile", 0, 1);
    for (case, want) in cases {
        let path = sock_path(case);
        let sender = Proc::spawn("raw", &path, &[("VMMW_UPDATE_CASE", case.to_string())]);
        assert_eq!(sender.line(), "ready");
        let (before, v0) = (r.snapshot(), r.version());
        let e = receive_as(&r, &path).expect_err(case);
        assert!(e.to_string().contains(want), "{case}: {e}");
        assert!(r.snapshot() == before, "{case}: the last version is intact");
        assert_eq!(r.version(), v0, "{case}");
        sender.kill();
    }
}

#[test]
fn a_receiver_that_refuses_tells_the_sender_and_changes_nothing() {
    // The engine holds the qwen3-shaped model; the sender sends llama's.
    let m = crate::loader_tp::models().into_iter().nth(2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let path = sock_path("refused");
    let sender = Proc::spawn("sender", &path, &[]);
    assert_eq!(sender.line(), "ready");
    let r = Rank::load(dir.path(), &m, "ipc-refused", 0, 1);
    let (before, v0) = (r.snapshot(), r.version());
    let e = receive_as(&r, &path).unwrap_err();
    assert_eq!(e.status(), Status::PlanMismatch, "{e}");
    assert!(r.snapshot() == before && r.version() == v0);
    let said = sender.wait();
    assert!(
        said.starts_with("error ") && said.contains("the receiver refused it"),
        "{said}"
    );
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
        "raw" => child_raw(&path, &std::env::var("VMMW_UPDATE_CASE").unwrap()),
        "direct" => crate::update_transport_direct::child_sender(&path),
        "direct_raw" => crate::update_transport_direct::child_raw(
            &path,
            &std::env::var("VMMW_UPDATE_CASE").unwrap(),
        ),
        "direct_repeat" => crate::update_transport_direct_cache::child_repeat(&path),
        "direct_relay" => crate::update_transport_direct_cache::child_relay(&path),
        "direct_raw_twice" => crate::update_transport_direct_cache::child_raw_twice(
            &path,
            &std::env::var("VMMW_UPDATE_CASE").unwrap(),
        ),
        other => panic!("unknown role {other}"),
    }
}

fn env_usize(k: &str, default: usize) -> usize {
    std::env::var(k).map_or(default, |v| v.parse().unwrap())
}

/// The sender's pool, on the backend the parent names (`VMMW_UPDATE_BACKEND`,
/// host by default): a ring on the cuda backend is CUDA VMM memory, exported
/// to the receiver as such.
pub(crate) fn sender_pool() -> std::sync::Arc<Pool> {
    let driver = match std::env::var("VMMW_UPDATE_BACKEND").as_deref() {
        Ok("cuda") => common::backend::cuda_device(0).expect("the cuda sender's device"),
        _ => crate::update_transport_ranks::host_driver(),
    };
    std::sync::Arc::new(Pool::new(driver, PoolConfig::default()).unwrap())
}

fn child_sender(path: &Path) {
    let options = SenderOptions {
        slots: 2,
        slot_bytes: env_usize("VMMW_UPDATE_SLOT", 64 << 10),
        timeout: TIMEOUT,
        log: LogSink::discard(),
    };
    let mut sender = IpcSender::bind(sender_pool(), path, options).unwrap();
    let new = new_values(&model(), SEED);
    println!("@ready");
    match sender.send_to(&send_tensors(&new), env_usize("VMMW_UPDATE_RECEIVERS", 1)) {
        Ok(r) => println!("@sent version={} buckets={}", r.version, r.buckets),
        Err(e) => println!("@error {e}"),
    }
}

/// A sender that speaks the protocol by hand: `stall` sends two of three
/// buckets and waits to be killed; the other cases each break one rule.
fn child_raw(path: &Path, case: &str) {
    let slot_bytes = 4096;
    let pool = sender_pool();
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
    let _ = ch.send(&FromSender::Ring {
        share: ring.to_string_lossy().into_owned(),
        slots: slots_n,
        slot_bytes: announced_bytes,
    });
    let _ = ch.recv::<FromReceiver>();
    let new = new_values(&model(), SEED);
    let tensors: Vec<AnnouncedTensor> = new
        .iter()
        .map(|(name, (shape, bytes))| AnnouncedTensor {
            name: name.clone(),
            dtype: "BF16".into(),
            shape: shape.iter().map(|&d| d as u64).collect(),
            bytes: bytes.len() as u64,
        })
        .collect();
    let sizes: Vec<u64> = tensors.iter().map(|t| t.bytes).collect();
    let plan = plan_buckets(&sizes, slot_bytes as u64).unwrap();
    let announced = match case {
        "stall" => 3,
        "short_tensors" => 1,
        _ => 2,
    };
    // The receiver may have refused the ring already: sends may fail from here.
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
            println!("@stalled");
        }
        "short" => {
            let _ = ch.send(&bucket(0));
            let _ = ch.send(&FromSender::End);
        }
        "short_tensors" => {
            // Every announced bucket arrives, but they do not cover the tensors.
            let _ = ch.send(&bucket(0));
            let _ = ch.send(&FromSender::End);
        }
        "past_ring" => {
            let mut m: BucketManifest = plan[0].clone();
            m.bytes = slot_bytes as u64 + 4096;
            m.entries.last_mut().unwrap().len += 4096;
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
            m.entries[0].tensor = 999;
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
