//! Direct IPC updates between real processes, on the host backend (and on
//! CUDA when a GPU is there): the sender's tensors lie in its pool, it serves
//! them as shares and sends one manifest; the receiver copies straight out
//! of the imported memory, without staging.
//!
//! Shown: a direct update arrives bitwise, unstaged, at world 1 and as a
//! rank of world 2 keeping its slices; a sender killed once the receiver
//! attached still leaves a whole update, and one killed right after its
//! manifest leaves either the whole update or none of it; hostile manifests
//! (an unknown share or segment, a tensor past its segment or at an offset
//! that overflows, segments other than the share serves, a share named
//! twice, a share that is not there, a wrong shape or dtype) are refused
//! with nothing written; the ring still works beside it.

use crate::common;
use crate::update_transport_processes::{receive_as, sender_pool, sock_path, Proc, SEED, TIMEOUT};
use crate::update_transport_ranks::{model, new_values, write_checkpoint, Rank};

use common::backend::on_each_backend;

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use vmmweights::loader::registry::Destination;
use vmmweights::loader::Dtype;
use vmmweights::share::{LogSink, ServeOptions, Server};
use vmmweights::update::transport::control::{Channel, FromReceiver, FromSender};
use vmmweights::update::transport::direct::{DirectShare, DirectTensor};
use vmmweights::update::transport::ipc::{IpcSender, SenderOptions};
use vmmweights::update::transport::{SendData, SendTensor};
use vmmweights::{tag, Pool, Status};

/// The update's tensors copied into `pool` under one tag, as a trainer
/// holding its weights in our pool has them.
pub fn in_pool(pool: &Arc<Pool>, name: &str) -> Vec<Destination> {
    let t = tag::id(name).unwrap();
    let new = new_values(&model(), SEED);
    let driver = pool.driver().clone();
    let stream = driver.stream_create().unwrap();
    let out = new
        .iter()
        .map(|(n, (shape, bytes))| {
            let b = pool.alloc_tagged(bytes.len(), t).unwrap();
            // SAFETY: `b` is this pool's allocation of `bytes.len()`; the
            // stream is synchronized before `bytes` goes away.
            unsafe {
                driver
                    .copy_htod_async(b.ptr, bytes.as_ptr(), bytes.len(), stream)
                    .unwrap();
            }
            Destination {
                name: n.clone(),
                ptr: b.ptr,
                dtype: Dtype::Bf16,
                shape: shape.clone(),
            }
        })
        .collect();
    driver.stream_synchronize(stream).unwrap();
    driver.stream_destroy(stream).unwrap();
    out
}

pub fn options() -> SenderOptions {
    SenderOptions {
        timeout: TIMEOUT,
        log: LogSink::discard(),
        ..SenderOptions::default()
    }
}

pub fn sends(d: &[Destination]) -> Vec<SendTensor<'static>> {
    d.iter()
        .map(|d| SendTensor {
            name: d.name.clone(),
            dtype: d.dtype,
            shape: d.shape.clone(),
            data: SendData::Device(d.ptr),
        })
        .collect()
}

/// A direct sender child: the update's tensors in its pool, sent to
/// `VMMW_UPDATE_RECEIVERS` receivers.
pub fn child_sender(path: &Path) {
    let pool = sender_pool();
    let tensors = in_pool(&pool, "direct-sender");
    let mut sender = IpcSender::bind(pool, path, options()).unwrap();
    println!("@ready");
    let receivers = std::env::var("VMMW_UPDATE_RECEIVERS").map_or(1, |v| v.parse().unwrap());
    match sender.send_direct_to(&sends(&tensors), receivers) {
        Ok(r) => println!("@sent version={} bytes={}", r.version, r.bytes),
        Err(e) => println!("@error {e}"),
    }
}

/// Serve the segments of `pool` that hold `tensors` at `share` as a direct
/// sender does (tensor `segment.K` spanning segment K), and describe them
/// as its manifest does, under `generation`.
pub fn serve_raw(
    pool: &Arc<Pool>,
    tensors: &[Destination],
    share: &Path,
    generation: u64,
) -> (Server, DirectShare, Vec<DirectTensor>) {
    let t = pool.segment_of(tensors[0].ptr).unwrap().tag;
    let mut bases: Vec<(u64, usize)> = tensors
        .iter()
        .map(|d| {
            let s = pool.segment_of(d.ptr).unwrap();
            (s.base, s.tracked_bytes)
        })
        .collect();
    bases.sort();
    bases.dedup();
    let segments: Vec<Destination> = bases
        .iter()
        .enumerate()
        .map(|(k, &(base, bytes))| Destination {
            name: format!("segment.{k}"),
            ptr: base,
            dtype: Dtype::U8,
            shape: vec![bytes],
        })
        .collect();
    let _ = std::fs::remove_file(share);
    let options = ServeOptions {
        log: LogSink::discard(),
        ..ServeOptions::default()
    };
    let server = Server::start(pool.clone(), t, segments, share, options).unwrap();
    let manifest = tensors
        .iter()
        .map(|d| {
            let base = pool.segment_of(d.ptr).unwrap().base;
            DirectTensor {
                name: d.name.clone(),
                dtype: "BF16".into(),
                shape: d.shape.iter().map(|&n| n as u64).collect(),
                share: 0,
                segment: bases.iter().position(|b| b.0 == base).unwrap() as u32,
                offset: d.ptr - base,
            }
        })
        .collect();
    let wire = DirectShare {
        path: share.to_string_lossy().into_owned(),
        sender: "raw".into(),
        generation,
        segments: bases.iter().map(|b| b.1 as u64).collect(),
    };
    (server, wire, manifest)
}

/// Break the rule `case` names in a direct manifest.
pub fn break_rule(case: &str, shares: &mut [DirectShare], manifest: &mut [DirectTensor]) {
    match case {
        "unknown_share" => manifest[1].share = 3,
        "unknown_segment" => manifest[1].segment = 9,
        "past_segment" => manifest[0].offset = shares[0].segments[0] - 2,
        "offset_overflow" => manifest[0].offset = u64::MAX - 1,
        "other_segments" => shares[0].segments[0] += 65536,
        "wrong_shape" => manifest[0].shape[0] += 1,
        "wrong_dtype" => manifest[0].dtype = "F32".into(),
        "no_share" => shares[0].path.push_str(".missing"),
        "twice" => {
            let again = shares[0].clone();
            shares[1] = again;
        }
        _ => {}
    }
}

/// A direct sender that speaks the protocol by hand: it serves the real
/// tensors, then sends a manifest that breaks one rule, or dies.
pub fn child_raw(path: &Path, case: &str) {
    let pool = sender_pool();
    let tensors = in_pool(&pool, "direct-raw");
    let share = PathBuf::from(format!("{}.share", path.display()));
    let (_server, wire, mut manifest) = serve_raw(&pool, &tensors, &share, 1);
    let mut shares = vec![wire];
    if case == "twice" {
        shares.push(shares[0].clone());
        manifest[1].share = 1;
    }
    let listener = UnixListener::bind(path).unwrap();
    println!("@ready");
    let (sock, _) = listener.accept().unwrap();
    let mut ch = Channel::new(sock, "receiver", TIMEOUT).unwrap();
    break_rule(case, &mut shares, &mut manifest);
    let _ = ch.send(&FromSender::Direct {
        shares,
        tensors: manifest,
    });
    match case {
        // Dies right after its manifest: the receiver may or may not have attached.
        "die_at_manifest" => std::process::exit(3),
        // Dies once the receiver holds the memory: the update must complete.
        "die_after_attach" => {
            let _ = ch.recv::<FromReceiver>();
            std::process::exit(3)
        }
        _ => {}
    }
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn direct_update_is_bitwise_and_unstaged_on_each_backend() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let new = new_values(&m, SEED);
    on_each_backend(
        "direct_update_is_bitwise_and_unstaged_on_each_backend",
        |b| {
            for (rank, world) in [(0, 1), (1, 2)] {
                let path = sock_path(&format!("direct-{}-{world}", b.kind()));
                let sender = Proc::spawn(
                    "direct",
                    &path,
                    &[("VMMW_UPDATE_BACKEND", b.kind().to_string())],
                );
                assert_eq!(sender.line(), "ready");
                let name = format!("direct-each-{}", b.kind());
                let r = Rank::load_on(b.driver.clone(), dir.path(), &m, &name, rank, world);
                let v0 = r.version();
                let done = receive_as(&r, &path).unwrap();
                assert_eq!(done.version, v0 + 1);
                assert!(!done.staged, "a direct update copies without staging");
                assert!(
                    r.snapshot() == r.expected(&m, &new),
                    "{}: rank {rank} of {world} holds its slices of the update",
                    b.kind()
                );
                assert_eq!(
                    sender.wait().split(' ').nth(1).unwrap(),
                    format!("version={}", v0 + 1)
                );
            }
        },
    );
}

#[test]
fn direct_update_serves_every_rank_of_a_world() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let new = new_values(&m, SEED);
    let path = sock_path("direct-tp2");
    let sender = Proc::spawn("direct", &path, &[("VMMW_UPDATE_RECEIVERS", "2".into())]);
    assert_eq!(sender.line(), "ready");
    let ranks: Vec<Rank> = (0..2)
        .map(|r| Rank::load(dir.path(), &m, "direct-tp", r, 2))
        .collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| s.spawn(|| receive_as(r, &path)))
            .collect();
        for h in hs {
            assert!(!h.join().unwrap().unwrap().staged);
        }
    });
    for r in &ranks {
        assert!(
            r.snapshot() == r.expected(&m, &new),
            "rank {} of 2 holds its slices",
            r.rank
        );
    }
    assert!(sender.wait().starts_with("sent version="));
}

#[test]
fn sender_killed_after_attach_still_leaves_a_whole_update() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let new = new_values(&m, SEED);
    let path = sock_path("direct-die-attached");
    let sender = Proc::spawn(
        "direct_raw",
        &path,
        &[("VMMW_UPDATE_CASE", "die_after_attach".into())],
    );
    assert_eq!(sender.line(), "ready");
    let r = Rank::load(dir.path(), &m, "direct-die-attached", 0, 1);
    let v0 = r.version();
    let done = receive_as(&r, &path).unwrap();
    assert_eq!(done.version, v0 + 1);
    assert!(r.snapshot() == r.expected(&m, &new), "the update is whole");
    sender.kill();
}

#[test]
fn sender_killed_at_its_manifest_leaves_all_or_nothing() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let new = new_values(&m, SEED);
    let r = Rank::load(dir.path(), &m, "direct-die-manifest", 0, 1);
    for i in 0..4 {
        let path = sock_path(&format!("direct-die-manifest-{i}"));
        let sender = Proc::spawn(
            "direct_raw",
            &path,
            &[("VMMW_UPDATE_CASE", "die_at_manifest".into())],
        );
        assert_eq!(sender.line(), "ready");
        let (before, v0) = (r.snapshot(), r.version());
        match receive_as(&r, &path) {
            Ok(done) => {
                assert_eq!(done.version, v0 + 1);
                assert!(r.snapshot() == r.expected(&m, &new), "a whole update");
            }
            Err(e) => {
                assert_eq!(e.status(), Status::UpdateSource, "{e}");
                assert!(r.snapshot() == before, "nothing written: {e}");
                assert_eq!(r.version(), v0);
            }
        }
        sender.kill();
    }
}

#[test]
fn hostile_direct_manifests_are_refused_and_change_nothing() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    // (case, what the error says; None: refused by the update's plan instead)
    let cases = [
        ("unknown_share", Some("names share 3 of the 1 sent")),
        ("unknown_segment", Some("names segment 9 of share 0")),
        ("past_segment", Some("run past segment 0 of share 0")),
        ("offset_overflow", Some("run past segment 0 of share 0")),
        ("other_segments", Some("the sender claims segments")),
        ("no_share", Some("attaching share")),
        ("twice", Some("named twice")),
        ("wrong_shape", None),
        ("wrong_dtype", None),
    ];
    let r = Rank::load(dir.path(), &m, "direct-hostile", 0, 1);
    for (case, want) in cases {
        let path = sock_path(&format!("direct-{case}"));
        let sender = Proc::spawn(
            "direct_raw",
            &path,
            &[("VMMW_UPDATE_CASE", case.to_string())],
        );
        assert_eq!(sender.line(), "ready");
        let (before, v0) = (r.snapshot(), r.version());
        let e = receive_as(&r, &path).expect_err(case);
        if let Some(want) = want {
            assert_eq!(e.status(), Status::UpdateSource, "{case}: {e}");
            assert!(e.to_string().contains(want), "{case}: {e}");
        }
        assert!(r.snapshot() == before, "{case}: the last version is intact");
        assert_eq!(r.version(), v0, "{case}");
        sender.kill();
    }
}

#[test]
fn direct_sender_refuses_memory_outside_its_pool() {
    let pool = sender_pool();
    let path = sock_path("direct-host-memory");
    let mut sender = IpcSender::bind(pool, &path, options()).unwrap();
    let bytes = vec![0u8; 8];
    let e = sender
        .send_direct_to(
            &[SendTensor {
                name: "w".into(),
                dtype: Dtype::Bf16,
                shape: vec![4],
                data: SendData::Host(&bytes),
            }],
            1,
        )
        .unwrap_err();
    assert!(e.to_string().contains("lies in host memory"), "{e}");
    let e = sender
        .send_direct_to(
            &[SendTensor {
                name: "w".into(),
                dtype: Dtype::Bf16,
                shape: vec![4],
                data: SendData::Device(0x1000),
            }],
            1,
        )
        .unwrap_err();
    assert!(e.to_string().contains("not in this sender's pool"), "{e}");
}

/// A receiver count no engine has (the most a C caller can pass) is
/// refused before anything is served or waited for, ring or direct: not a
/// table for that many receivers (which aborts the process when it cannot
/// be allocated), not a wait for the first of them.
#[test]
fn a_receiver_count_past_the_bound_is_refused_before_anything_is_served() {
    let pool = sender_pool();
    let path = sock_path("direct-many-receivers");
    let tensors = in_pool(&pool, "direct-many-receivers");
    let mut sender = IpcSender::bind(pool, &path, options()).unwrap();
    let host = vec![0u8; 8];
    let ring = [SendTensor {
        name: "w".into(),
        dtype: Dtype::Bf16,
        shape: vec![4],
        data: SendData::Host(&host),
    }];
    let max = vmmweights::update::transport::MAX_RECEIVERS;
    for receivers in [max + 1, u32::MAX as usize] {
        let start = std::time::Instant::now();
        let e = sender
            .send_direct_to(&sends(&tensors), receivers)
            .unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(
            e.to_string().contains(&format!("at most {max} receivers")),
            "{e}"
        );
        assert_eq!(sender.direct_shares(), 0, "nothing served");
        let e = sender.send_to(&ring, receivers).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(
            e.to_string().contains(&format!("at most {max} receivers")),
            "{e}"
        );
        assert!(start.elapsed() < TIMEOUT, "refused without waiting");
    }
}

/// The sender waits for its receiver in the kernel, up to its timeout: one
/// that never comes is reported once the timeout has passed (not before,
/// not long after), and one that connects late in the wait is answered and
/// receives the manifest.
#[test]
fn the_sender_waits_its_timeout_for_a_receiver_and_answers_a_late_one() {
    let wait = Duration::from_millis(400);
    let pool = sender_pool();
    let path = sock_path("direct-late-receiver");
    let tensors = in_pool(&pool, "direct-late-receiver");
    let mut sender = IpcSender::bind(
        pool,
        &path,
        SenderOptions {
            timeout: wait,
            ..options()
        },
    )
    .unwrap();
    let start = std::time::Instant::now();
    let e = sender.send_direct_to(&sends(&tensors), 1).unwrap_err();
    let took = start.elapsed();
    assert!(
        e.to_string().contains("no receiver connected within"),
        "{e}"
    );
    assert!(
        took >= wait && took < wait + Duration::from_secs(3),
        "waited {took:?} for a timeout of {wait:?}"
    );

    let late = {
        let path = path.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            let sock = std::os::unix::net::UnixStream::connect(&path).unwrap();
            let mut ch = Channel::new(sock, "test sender", Duration::from_secs(5)).unwrap();
            let first = ch.recv::<FromSender>().unwrap();
            // Refuse it: the sender reports the refusal, nothing is written.
            ch.send(&FromReceiver::Failed {
                reason: "a test receiver only looks".into(),
            })
            .unwrap();
            first
        })
    };
    let e = sender.send_direct_to(&sends(&tensors), 1).unwrap_err();
    assert!(e.to_string().contains("a test receiver only looks"), "{e}");
    match late.join().unwrap() {
        FromSender::Direct { tensors: t, .. } => assert_eq!(t.len(), tensors.len()),
        other => panic!("the late receiver got {other:?}"),
    }
}
