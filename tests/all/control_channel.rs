//! The control channel (docs/PRELOAD.md) on the host backend, without
//! preloading anything: a process's pools on two simulated devices served
//! on a socket and driven by the client, as `vmmw ctl` and the interposer
//! do. Sleep synchronizes every device first and keeps every byte at its
//! address; a wake without room refuses before mapping anything; a wake
//! failing midway puts back to sleep what it woke; a wake may wait for
//! memory; one sleep or wake runs at a time; refusals carry their status.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmmweights::control::{
    Client, ControlLog, ControlOptions, DeviceSync, Phase, ProcessPools, Server, WirePolicy,
};
use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::{DevicePtr, Driver, StreamId};
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::{tag, Error, Result, Status};

const MIB: usize = 1 << 20;

/// Records each synchronization; blocks while `gate` holds a receiver.
#[derive(Default)]
struct Syncs {
    calls: Mutex<Vec<Vec<i32>>>,
    gate: Mutex<Option<Receiver<()>>>,
    entered: Mutex<Option<Sender<()>>>,
}

struct Recorded(Arc<Syncs>);

impl DeviceSync for Recorded {
    fn synchronize(&self, devices: &[i32]) -> Result<()> {
        self.0.calls.lock().unwrap().push(devices.to_vec());
        if let Some(tx) = self.0.entered.lock().unwrap().take() {
            let _ = tx.send(());
        }
        let gate = self.0.gate.lock().unwrap().take();
        if let Some(rx) = gate {
            let _ = rx.recv();
        }
        Ok(())
    }
}

struct Process {
    drivers: Vec<Arc<HostDriver>>,
    pools: Vec<Arc<Pool>>,
    syncs: Arc<Syncs>,
    server: Server,
    path: PathBuf,
}

fn socket_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmmw-control-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

/// Two simulated devices of `limit` bytes each, their pools served on a socket.
fn process(name: &str, limit: u64) -> Process {
    let drivers: Vec<Arc<HostDriver>> = (0..2)
        .map(|d| {
            Arc::new(
                HostDriver::for_device(
                    HostConfig {
                        memory_limit: limit,
                        ..HostConfig::default()
                    },
                    d,
                )
                .unwrap(),
            )
        })
        .collect();
    let pools: Vec<Arc<Pool>> = drivers
        .iter()
        .map(|d| Arc::new(Pool::new(d.clone() as Arc<dyn Driver>, PoolConfig::default()).unwrap()))
        .collect();
    let syncs = Arc::new(Syncs::default());
    let source = pools.clone();
    let target = ProcessPools::new(
        Box::new(move || source.clone()),
        Some(Box::new(Recorded(syncs.clone()))),
    );
    let path = socket_path(name);
    let server = Server::start(
        &path,
        Arc::new(target),
        ControlOptions {
            log: ControlLog::discard(),
            ..ControlOptions::default()
        },
    )
    .unwrap();
    Process {
        drivers,
        pools,
        syncs,
        server,
        path,
    }
}

fn fill(d: &dyn Driver, ptr: DevicePtr, len: usize, seed: u8) {
    let v: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ seed).collect();
    // SAFETY: `ptr` is a live awake block of at least `len` bytes.
    unsafe { d.copy_htod_async(ptr, v.as_ptr(), len, StreamId::DEFAULT) }.unwrap();
}

fn holds(d: &dyn Driver, ptr: DevicePtr, len: usize, seed: u8) -> bool {
    let mut v = vec![0u8; len];
    // SAFETY: `ptr` is a live awake block of at least `len` bytes.
    unsafe { d.copy_dtoh_async(v.as_mut_ptr(), ptr, len, StreamId::DEFAULT) }.unwrap();
    v.iter()
        .enumerate()
        .all(|(i, &b)| b == (i % 251) as u8 ^ seed)
}

/// A large and a small block under `tag` on each device, filled.
fn allocate(p: &Process, tag_name: &str) -> Vec<(usize, DevicePtr, usize, u8)> {
    let t = tag::id(tag_name).unwrap();
    let mut out = Vec::new();
    for (k, pool) in p.pools.iter().enumerate() {
        for (len, seed) in [(5 * MIB + 7, 11u8), (3000, 13u8)] {
            let b = if len > MIB {
                pool.alloc_segment(len, t).unwrap()
            } else {
                pool.alloc_tagged(len, t).unwrap()
            };
            fill(&*p.drivers[k], b.ptr, len, seed + k as u8);
            out.push((k, b.ptr, len, seed + k as u8));
        }
    }
    out
}

fn all_hold(p: &Process, blocks: &[(usize, DevicePtr, usize, u8)]) -> bool {
    blocks
        .iter()
        .all(|&(k, ptr, len, seed)| holds(&*p.drivers[k], ptr, len, seed))
}

fn refused(e: &Error) -> (Status, String) {
    match e {
        Error::ControlRefused {
            status, message, ..
        } => (*status, message.clone()),
        other => panic!("expected a refusal, got {other}"),
    }
}

#[test]
fn sleep_synchronizes_every_device_and_wake_keeps_every_byte() {
    let p = process("cycle", 1 << 30);
    let mut c = Client::connect(&p.path).unwrap();
    let s = c.status().unwrap();
    assert_eq!(s.state, Phase::Awake);
    assert!(s.tags.is_empty() && s.devices.len() == 2, "{s:?}");
    let blocks = allocate(&p, "ctl-cycle");
    for policy in [
        WirePolicy::Offload,
        WirePolicy::OffloadCompressed,
        WirePolicy::Offload,
    ] {
        let before = c.status().unwrap();
        let ours: u64 = before.tags.iter().map(|t| t.tracked_bytes).sum();
        let r = c.sleep(policy, None).unwrap();
        assert_eq!(r.bytes, ours, "{r:?}");
        assert_eq!(r.synced_devices, vec![0, 1]);
        assert_eq!(r.policy, Some(policy));
        assert!(r.backup_bytes > 0);
        let s = c.status().unwrap();
        assert_eq!(s.state, Phase::Asleep);
        assert!(s.tags.iter().all(|t| t.asleep && t.tracked_bytes == 0));
        assert!(s.host_backup_bytes > 0);
        for d in &s.devices {
            assert_eq!(d.ours, 0, "{d:?}");
        }
        assert_eq!(s.last.as_ref().unwrap()["op"], "sleep");
        let w = c.wake(None, None).unwrap();
        assert_eq!(w.bytes, ours);
        assert_eq!(c.status().unwrap().state, Phase::Awake);
        assert!(
            all_hold(&p, &blocks),
            "bytes changed across a {policy:?} cycle"
        );
    }
    // One synchronization of both devices per sleep, before it.
    assert_eq!(*p.syncs.calls.lock().unwrap(), vec![vec![0, 1]; 3]);
    // A sleep of one tag leaves the others awake.
    let other = allocate(&p, "ctl-cycle-other");
    let r = c
        .sleep(WirePolicy::Discard, Some(vec!["ctl-cycle-other".into()]))
        .unwrap();
    assert!(r.tags.iter().all(|t| t.tag == "ctl-cycle-other"));
    let s = c.status().unwrap();
    assert!(s
        .tags
        .iter()
        .all(|t| t.asleep == (t.tag == "ctl-cycle-other")));
    assert_eq!(s.state, Phase::Asleep);
    c.wake(Some(vec!["ctl-cycle-other".into()]), None).unwrap();
    assert!(all_hold(&p, &blocks));
    drop(other);
}

#[test]
fn refusals_change_nothing_and_carry_their_status() {
    let p = process("refusals", 1 << 30);
    let mut c = Client::connect(&p.path).unwrap();
    let (status, why) = refused(&c.sleep(WirePolicy::Offload, None).unwrap_err());
    assert_eq!(status, Status::InvalidState);
    assert!(why.contains("no allocations yet"), "{why}");
    let blocks = allocate(&p, "ctl-refusals");
    let (status, why) = refused(
        &c.sleep(WirePolicy::Offload, Some(vec!["ctl-no-such-tag".into()]))
            .unwrap_err(),
    );
    assert_eq!(status, Status::UnknownTag);
    assert!(
        why.contains("ctl-refusals") && why.contains("nothing was changed"),
        "{why}"
    );
    assert_eq!(c.status().unwrap().state, Phase::Awake);
    assert!(
        p.syncs.calls.lock().unwrap().is_empty(),
        "refused before synchronizing"
    );
    // A wake of an awake process is a no-op.
    let w = c.wake(None, None).unwrap();
    assert_eq!(w.bytes, 0);
    assert!(w.tags.is_empty());
    // Bad values are refused by the process.
    let e = c
        .request(&vmmweights::control::Request::Wake {
            tags: None,
            wait_memory_ms: Some(u64::MAX),
        })
        .unwrap_err();
    assert_eq!(refused(&e).0, Status::InvalidArgument);
    assert!(all_hold(&p, &blocks));
    // Nobody there.
    let gone = socket_path("nobody");
    let e = Client::connect(&gone).unwrap_err();
    assert_eq!(e.status(), Status::Io);
    assert!(e.to_string().contains("nobody"), "{e}");
}

#[test]
fn a_wake_without_room_refuses_before_mapping_and_can_wait_for_memory() {
    let p = process("room", 64 << 20);
    let mut c = Client::connect(&p.path).unwrap();
    let blocks = allocate(&p, "ctl-room");
    c.sleep(WirePolicy::Offload, None).unwrap();
    // Another tag takes device 1's memory meanwhile.
    let hog = p.pools[1]
        .alloc_segment(60 << 20, tag::id("ctl-room-hog").unwrap())
        .unwrap();
    let t = Instant::now();
    let (status, why) = refused(&c.wake(None, None).unwrap_err());
    assert_eq!(status, Status::OutOfMemory);
    assert!(
        why.contains("device 1") && why.contains("nothing mapped"),
        "{why}"
    );
    assert!(t.elapsed() < Duration::from_secs(2), "refused at once");
    let s = c.status().unwrap();
    assert!(s
        .tags
        .iter()
        .filter(|t| t.tag == "ctl-room")
        .all(|t| t.asleep && t.backup_bytes > 0));
    assert_eq!(s.devices[0].ours, 0, "device 0 was not woken either");
    assert_eq!(s.last.as_ref().unwrap()["code"], "VMMW_OUT_OF_MEMORY");
    // Asked to wait, the wake takes the memory once it is released.
    let pool = p.pools[1].clone();
    let freer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        pool.free_segment(hog.ptr).unwrap();
    });
    let w = c.wake(None, Some(10_000)).unwrap();
    freer.join().unwrap();
    assert!(w.wait_seconds >= 0.25, "{w:?}");
    assert!(all_hold(&p, &blocks));
    // A wait that ends first refuses the same way.
    c.sleep(WirePolicy::Offload, None).unwrap();
    let hog = p.pools[1]
        .alloc_segment(60 << 20, tag::id("ctl-room-hog").unwrap())
        .unwrap();
    let (status, why) = refused(&c.wake(None, Some(200)).unwrap_err());
    assert_eq!(status, Status::OutOfMemory);
    assert!(why.contains("waited"), "{why}");
    p.pools[1].free_segment(hog.ptr).unwrap();
    c.wake(None, None).unwrap();
    assert!(all_hold(&p, &blocks));
}

#[test]
fn a_wake_failing_midway_puts_back_to_sleep_what_it_woke() {
    let p = process("midway", 1 << 30);
    let mut c = Client::connect(&p.path).unwrap();
    let blocks = allocate(&p, "ctl-midway");
    c.sleep(WirePolicy::Offload, None).unwrap();
    // Device 1 refuses to create memory: its wake fails after the room check.
    p.drivers[1].fail_always(FaultOp::Create);
    let (status, why) = refused(&c.wake(None, None).unwrap_err());
    assert_eq!(status, Status::OutOfMemory, "{why}");
    assert!(
        why.contains("device 1") && why.contains("stays asleep"),
        "{why}"
    );
    let s = c.status().unwrap();
    assert_eq!(s.state, Phase::Asleep);
    assert!(s.tags.iter().all(|t| t.asleep), "{:?}", s.tags);
    assert_eq!(s.devices[0].ours, 0, "device 0 put back to sleep");
    p.drivers[1].clear_faults();
    c.wake(None, None).unwrap();
    assert!(all_hold(&p, &blocks), "every backup intact");
}

#[test]
fn one_sleep_or_wake_runs_at_a_time() {
    let p = process("busy", 1 << 30);
    let blocks = allocate(&p, "ctl-busy");
    let (release, gate) = channel();
    let (entered_tx, entered) = channel();
    *p.syncs.gate.lock().unwrap() = Some(gate);
    *p.syncs.entered.lock().unwrap() = Some(entered_tx);
    let path = p.path.clone();
    let first = std::thread::spawn(move || {
        Client::connect(&path)
            .unwrap()
            .sleep(WirePolicy::Offload, None)
    });
    entered.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut c = Client::connect(&p.path).unwrap();
    assert_eq!(c.status().unwrap().state, Phase::Sleeping);
    let (status, why) = refused(&c.wake(None, None).unwrap_err());
    assert_eq!(status, Status::InvalidState);
    assert!(why.contains("a sleep is running"), "{why}");
    let (status, _) = refused(&c.sleep(WirePolicy::Discard, None).unwrap_err());
    assert_eq!(status, Status::InvalidState);
    release.send(()).unwrap();
    first.join().unwrap().unwrap();
    // The refusals did not replace the answer of the sleep that ran.
    let s = c.status().unwrap();
    assert_eq!(s.state, Phase::Asleep);
    assert_eq!(s.last.as_ref().unwrap()["op"], "sleep");
    c.wake(None, None).unwrap();
    assert!(all_hold(&p, &blocks));
}

#[test]
fn status_counts_the_memory_kept_for_reuse() {
    let p = process("cached", 1 << 30);
    let mut c = Client::connect(&p.path).unwrap();
    let t = tag::id("ctl-cached").unwrap();
    let b = p.pools[0].alloc_tagged(4096, t).unwrap();
    let s = c.status().unwrap();
    assert_eq!(s.devices[0].cached, 0);
    p.pools[0].free(b.ptr).unwrap();
    let s = c.status().unwrap();
    assert_eq!(s.devices[0].cached, s.devices[0].ours, "{:?}", s.devices[0]);
    assert!(s.devices[0].cached > 0);
    assert_eq!(s.devices[0].total, 1 << 30);
}

#[test]
fn the_socket_is_new_private_and_removed_by_its_server() {
    let mut p = process("files", 1 << 30);
    let mode = std::fs::metadata(&p.path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // A second server on the same path is refused; the first keeps it.
    let target = Arc::new(ProcessPools::new(Box::new(Vec::new), None));
    let e = Server::start(&p.path, target, ControlOptions::default()).unwrap_err();
    assert_eq!(e.status(), Status::Io);
    assert!(p.path.exists());
    assert!(p.server.answered() == 0);
    Client::connect(&p.path).unwrap().status().unwrap();
    p.server.stop();
    assert!(!p.path.exists());
    // A path someone else bound since is not removed.
    let mut p = process("files2", 1 << 30);
    std::fs::remove_file(&p.path).unwrap();
    let other = std::os::unix::net::UnixListener::bind(&p.path).unwrap();
    p.server.stop();
    assert!(p.path.exists(), "not ours: left alone");
    drop(other);
    let _ = std::fs::remove_file(&p.path);
}

#[test]
fn a_failed_wake_never_puts_an_offloaded_tag_back_with_discard() {
    // A second sleep of an asleep process leaves its tags as they are (their
    // backups kept) whatever policy it names; a wake failing afterwards must
    // put what it woke back to sleep with a backup, not with that policy.
    let p = process("stale-policy", 1 << 30);
    let mut c = Client::connect(&p.path).unwrap();
    let blocks = allocate(&p, "ctl-stale-policy");
    c.sleep(WirePolicy::Offload, None).unwrap();
    c.sleep(WirePolicy::Discard, None).unwrap();
    let s = c.status().unwrap();
    assert!(
        s.tags.iter().all(|t| t.asleep && t.backup_bytes > 0),
        "{s:?}"
    );
    p.drivers[1].fail_always(FaultOp::Create);
    let (status, why) = refused(&c.wake(None, None).unwrap_err());
    assert_eq!(status, Status::OutOfMemory, "{why}");
    p.drivers[1].clear_faults();
    c.wake(None, None).unwrap();
    assert!(
        all_hold(&p, &blocks),
        "a failed wake lost the bytes it put back to sleep"
    );
}

#[test]
fn a_sleep_failing_midway_leaves_every_byte_recoverable() {
    // Device 1 fails at a copy, an unmap or a release, part of the way
    // through its tags; the refusal says what is asleep. Finished by a
    // second sleep, or woken as it stands: every byte comes back.
    for (op, nth, finish) in [
        (FaultOp::CopyDtoh, 2, true),
        (FaultOp::CopyDtoh, 2, false),
        (FaultOp::Unmap, 3, false),
        (FaultOp::Release, 1, true),
    ] {
        let p = process(&format!("sleep-midway-{op:?}-{finish}"), 1 << 30);
        let mut c = Client::connect(&p.path).unwrap();
        let mut blocks = allocate(&p, "ctl-sleep-midway");
        blocks.extend(allocate(&p, "ctl-sleep-midway-2"));
        p.drivers[1].fail_nth(op, nth);
        let (_, why) = refused(&c.sleep(WirePolicy::Offload, None).unwrap_err());
        assert!(
            why.contains("device 1") && why.contains("asleep now"),
            "{why}"
        );
        p.drivers[1].clear_faults();
        if finish {
            c.sleep(WirePolicy::Offload, None).unwrap();
            assert!(c.status().unwrap().tags.iter().all(|t| t.asleep));
        }
        c.wake(None, None).unwrap();
        assert_eq!(c.status().unwrap().state, Phase::Awake);
        assert!(
            all_hold(&p, &blocks),
            "bytes lost after a sleep failing at {op:?} {nth} (finished by a second sleep: {finish})"
        );
    }
}

#[test]
fn a_waiting_wake_waits_at_most_what_it_asked_in_all() {
    // Two tags asleep on device 1, the memory each needs freed long apart:
    // the wake's wait covers the whole wake, not each tag anew.
    let p = process("wait-bound", 64 << 20);
    let mut c = Client::connect(&p.path).unwrap();
    let pool = p.pools[1].clone();
    let mut blocks = Vec::new();
    for (name, seed) in [("ctl-wait-a", 3u8), ("ctl-wait-b", 5u8)] {
        let b = pool
            .alloc_segment(16 << 20, tag::id(name).unwrap())
            .unwrap();
        fill(&*p.drivers[1], b.ptr, 16 << 20, seed);
        blocks.push((1, b.ptr, 16 << 20, seed));
    }
    c.sleep(WirePolicy::Offload, None).unwrap();
    let hog = tag::id("ctl-wait-hog").unwrap();
    let first = pool.alloc_segment(16 << 20, hog).unwrap();
    let second = pool.alloc_segment(16 << 20, hog).unwrap();
    let rest = pool.alloc_segment(30 << 20, hog).unwrap();
    let freer = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1000));
            pool.free_segment(first.ptr).unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            pool.free_segment(second.ptr).unwrap();
        })
    };
    let t = Instant::now();
    let r = c.wake(None, Some(2000));
    let took = t.elapsed();
    freer.join().unwrap();
    let (status, why) = refused(&r.unwrap_err());
    assert_eq!(status, Status::OutOfMemory, "{why}");
    assert!(
        took < Duration::from_millis(2400),
        "waited {took:?} for 2 s asked"
    );
    assert!(c
        .status()
        .unwrap()
        .tags
        .iter()
        .filter(|t| t.tag.starts_with("ctl-wait-") && t.tag != "ctl-wait-hog")
        .all(|t| t.asleep));
    pool.free_segment(rest.ptr).unwrap();
    c.wake(None, None).unwrap();
    assert!(all_hold(&p, &blocks));
}

#[test]
fn a_peer_gone_mid_sleep_leaves_a_whole_sleep_and_no_connection() {
    use std::io::Write;
    let p = process("gone", 1 << 30);
    let blocks = allocate(&p, "ctl-gone");
    let (release, gate) = channel();
    let (entered_tx, entered) = channel();
    *p.syncs.gate.lock().unwrap() = Some(gate);
    *p.syncs.entered.lock().unwrap() = Some(entered_tx);
    let mut s = std::os::unix::net::UnixStream::connect(&p.path).unwrap();
    s.write_all(b"{\"op\":\"sleep\"}\n").unwrap();
    entered.recv_timeout(Duration::from_secs(10)).unwrap();
    drop(s);
    release.send(()).unwrap();
    let t = Instant::now();
    while p.server.connections() > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the connection is still counted"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = Client::connect(&p.path).unwrap();
    let s = c.status().unwrap();
    assert_eq!(s.state, Phase::Asleep, "the sleep ran to its end");
    assert_eq!(s.last.as_ref().unwrap()["op"], "sleep");
    c.wake(None, None).unwrap();
    assert!(all_hold(&p, &blocks));
}
