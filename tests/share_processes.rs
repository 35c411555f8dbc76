//! Sharing across real processes on the host backend: the test binary runs
//! itself as the other processes (the `child` test, which does nothing unless
//! `VMMW_SHARE_ROLE` is set), and drives them line by line over stdin/stdout.
//!
//! Shown: attach/read/detach with two and three processes; an owner killed
//! while importers read; importers killed mid-handshake and while attached;
//! sleep of a shared tag under each policy; a published version; read-only
//! mappings that fault on write; hostile manifests and wrong peers refused;
//! descriptor counts equal before and after.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::testing::Testing;
use vmmweights::driver::{BackendKind, Driver};
use vmmweights::loader::dtype::Dtype;
use vmmweights::loader::registry::Destination;
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::share::manifest::{Hello, Manifest, SharedTensor, FORMAT};
use vmmweights::share::{wire, AttachOptions, Attachment, ServeOptions, Server, SleepPolicy};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Error, Status};

const G: usize = 64 << 10;
const TAG: &str = "share-weights";

/// Tests count this process's descriptors, so they run one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn host() -> Arc<dyn Driver> {
    Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }))
}

fn sock_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmmw-share-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

/// FNV-1a over (name, bytes) of each tensor, by name.
fn checksum(mut tensors: Vec<(String, u64, usize)>) -> String {
    tensors.sort();
    let mut h: u64 = 0xcbf29ce484222325;
    for (name, ptr, bytes) in tensors {
        // SAFETY: the pointer is mapped and readable for `bytes` in this process.
        let data = unsafe { std::slice::from_raw_parts(ptr as *const u8, bytes) };
        for &b in name.as_bytes().iter().chain(data) {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }
    format!("{h:016x}")
}

/// The owner's weights: three tensors in one tag, filled from `seed`.
struct Weights {
    pool: Arc<Pool>,
    tensors: Vec<Destination>,
}

impl Weights {
    fn new() -> Weights {
        let pool = Arc::new(
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
        );
        let t = tag::id(TAG).unwrap();
        let specs = [
            ("model.embed", Dtype::Bf16, vec![300usize, 130]),
            ("model.layer0.qkv", Dtype::F32, vec![96, 1000]),
            ("model.norm", Dtype::F32, vec![130]),
        ];
        let tensors = specs
            .into_iter()
            .map(|(name, dtype, shape)| {
                let bytes = shape.iter().product::<usize>() * dtype.size();
                let b = pool.alloc_tagged(bytes, t).unwrap();
                Destination {
                    name: name.into(),
                    ptr: b.ptr,
                    dtype,
                    shape,
                }
            })
            .collect();
        let w = Weights { pool, tensors };
        w.fill(1);
        w
    }

    fn fill(&self, seed: u64) {
        for (i, d) in self.tensors.iter().enumerate() {
            // SAFETY: host backend: the block is mapped read-write in this process.
            let s = unsafe { std::slice::from_raw_parts_mut(d.ptr as *mut u8, d.bytes()) };
            let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) ^ i as u64;
            for b in s {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
        }
    }

    fn sum(&self) -> String {
        checksum(
            self.tensors
                .iter()
                .map(|d| (d.name.clone(), d.ptr, d.bytes()))
                .collect(),
        )
    }

    fn serve(&self, path: &Path, options: ServeOptions) -> Server {
        Server::start(
            self.pool.clone(),
            tag::id(TAG).unwrap(),
            self.tensors.clone(),
            path,
            options,
        )
        .unwrap()
    }
}

fn attachment_sum(a: &Attachment) -> vmmweights::Result<String> {
    Ok(checksum(
        a.tensors()?
            .into_iter()
            .map(|t| (t.name, t.ptr, t.bytes))
            .collect(),
    ))
}

// ---- the other processes -------------------------------------------------

/// A process this test started, driven over its stdin and stdout.
/// Dropping it kills the process if still running and joins the thread that
/// reads its output, so no pipe outlives it (the tests count descriptors).
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Proc {
    fn spawn(role: &str, path: &Path, env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env("VMMW_SHARE_ROLE", role)
            .env("VMMW_SHARE_PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            stdin: Some(stdin),
            lines: rx,
            reader: Some(reader),
        }
    }

    /// The text after `@` of the next line holding one (the harness prints
    /// other lines, and its "test child ..." prefix before the first).
    fn line(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self
                .lines
                .recv_timeout(left)
                .expect("the child answered within 30 s");
            if let Some((_, rest)) = l.split_once('@') {
                return rest.to_owned();
            }
        }
    }

    fn send(&mut self, cmd: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
    }

    fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.line()
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn finish(mut self) -> std::process::ExitStatus {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "exit");
        }
        self.child.wait().unwrap()
    }
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("`{line}` has no `{key}=`"))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The other processes' side; a no-op unless this binary was started as one.
#[test]
fn child() {
    let Ok(role) = std::env::var("VMMW_SHARE_ROLE") else {
        return;
    };
    let path = PathBuf::from(std::env::var("VMMW_SHARE_PATH").unwrap());
    match role.as_str() {
        "owner" => child_owner(&path),
        "importer" => child_importer(&path),
        "handshake" => {
            // Connect, ask, read part of the manifest, then hang until killed.
            let mut s = UnixStream::connect(&path).unwrap();
            s.write_all(b"r").unwrap();
            let mut b = [0u8; 4];
            std::io::Read::read_exact(&mut s, &mut b).unwrap();
            println!("@partial");
            std::thread::sleep(Duration::from_secs(600));
        }
        other => panic!("unknown role {other}"),
    }
}

fn commands() -> impl Iterator<Item = String> {
    std::io::stdin().lines().map_while(|l| l.ok())
}

fn child_owner(path: &Path) {
    let w = Weights::new();
    let server = w.serve(path, ServeOptions::default());
    println!("@serving sum={}", w.sum());
    for cmd in commands() {
        match cmd.as_str() {
            "attached" => println!("@attached={}", server.attached()),
            "exit" => break,
            other => println!("@unknown={other}"),
        }
    }
}

fn child_importer(path: &Path) {
    let rw = std::env::var("VMMW_SHARE_RW").is_ok();
    let fds_before = fd_count();
    let options = AttachOptions {
        read_write: rw,
        ..AttachOptions::default()
    };
    let a = match Attachment::attach(host(), path, &options) {
        Ok(a) => a,
        Err(e) => {
            println!("@attach_err={} {e}", e.status().name());
            return;
        }
    };
    // Pointers kept outside the API, as an engine keeps its tensors.
    let raw: Vec<(String, u64, usize)> = a
        .tensors()
        .unwrap()
        .into_iter()
        .map(|t| (t.name, t.ptr, t.bytes))
        .collect();
    println!(
        "@attached sum={} version={}",
        attachment_sum(&a).unwrap(),
        a.version().unwrap()
    );
    let mut a = Some(a);
    for cmd in commands() {
        let att = a.as_ref();
        match cmd.as_str() {
            "sum" => match attachment_sum(att.unwrap()) {
                Ok(s) => println!("@sum={s}"),
                Err(e) => println!("@err={} {e}", e.status().name()),
            },
            "rawsum" => println!("@rawsum={}", checksum(raw.clone())),
            "version" => match att.unwrap().version() {
                Ok(v) => println!("@version={v}"),
                Err(e) => println!("@err={} {e}", e.status().name()),
            },
            "owner" => println!("@owner_connected={}", att.unwrap().owner_connected()),
            "write" => {
                // SAFETY: deliberately writes to the first tensor; on a
                // read-only mapping the process dies with SIGSEGV, as the test expects.
                unsafe { std::ptr::write_volatile(raw[0].1 as *mut u8, 0x5a) };
                println!("@wrote");
            }
            "detach" => {
                a.take().unwrap().detach().unwrap();
                println!("@detached fds_before={fds_before} fds_after={}", fd_count());
            }
            "exit" => break,
            other => println!("@unknown={other}"),
        }
    }
}

// ---- the tests -------------------------------------------------------------

#[test]
fn two_and_three_processes_attach_read_and_detach() {
    let _s = serial();
    let fds0 = fd_count();
    {
        let w = Weights::new();
        let path = sock_path("three");
        let server = w.serve(&path, ServeOptions::default());
        let expect = w.sum();
        let mut importers: Vec<Proc> = (0..2)
            .map(|_| Proc::spawn("importer", &path, &[]))
            .collect();
        for p in &importers {
            let l = p.line();
            assert_eq!(field(&l, "sum"), expect, "{l}");
            assert_eq!(field(&l, "version"), "1");
        }
        wait_until("two importers", || server.attached() == 2);
        // A third process joins while two are attached.
        let third = Proc::spawn("importer", &path, &[]);
        assert_eq!(field(&third.line(), "sum"), expect);
        importers.push(third);
        wait_until("three importers", || server.attached() == 3);
        // In-process importer as a fourth: same bytes at other addresses.
        let fds1 = fd_count();
        let a = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap();
        assert_eq!(attachment_sum(&a).unwrap(), expect);
        let mine = a.tensor("model.norm").unwrap();
        let theirs = &w.tensors[2];
        assert_ne!(
            mine.ptr, theirs.ptr,
            "mapped at the importer's own addresses"
        );
        assert_eq!((mine.dtype, mine.shape.clone()), (Dtype::F32, vec![130]));
        a.detach().unwrap();
        // The owner (this process too) closes its end on its connection thread.
        wait_until("attach + detach leaves no descriptor behind", || {
            fd_count() == fds1
        });
        for mut p in importers {
            let l = p.ask("detach");
            assert_eq!(field(&l, "fds_before"), field(&l, "fds_after"), "{l}");
            assert!(p.finish().success());
        }
        wait_until("all detached", || server.attached() == 0);
    }
    // Connection threads close their ends just after their importer left.
    wait_until("serving leaves no descriptor behind", || fd_count() == fds0);
}

#[test]
fn an_owner_that_dies_leaves_importers_mappings_valid() {
    let _s = serial();
    let path = sock_path("owner-dies");
    let mut owner = Proc::spawn("owner", &path, &[]);
    let expect = field(&owner.line(), "sum").to_owned();
    let fds0 = fd_count();
    let a = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap();
    let other = Proc::spawn("importer", &path, &[]);
    assert_eq!(field(&other.line(), "sum"), expect);
    assert_eq!(owner.ask("attached"), "attached=2");
    assert!(a.owner_connected());
    owner.kill();
    // The memory outlives its owner in both importers.
    wait_until("the owner seen gone", || !a.owner_connected());
    assert_eq!(attachment_sum(&a).unwrap(), expect);
    let mut other = other;
    assert_eq!(other.ask("sum"), format!("sum={expect}"));
    assert_eq!(other.ask("owner"), "owner_connected=false");
    a.detach().unwrap();
    assert_eq!(fd_count(), fds0);
    assert!(other.finish().success());
}

#[test]
fn importers_killed_mid_handshake_or_attached_release_everything() {
    let _s = serial();
    let fds0 = fd_count();
    {
        let w = Weights::new();
        let path = sock_path("killed");
        let server = w.serve(&path, ServeOptions::default());
        let hanging = Proc::spawn("handshake", &path, &[]);
        assert_eq!(hanging.line(), "partial");
        let holder = Proc::spawn("importer", &path, &[]);
        holder.line();
        wait_until("both counted", || server.attached() == 2);
        // Refused sleep while they are there...
        let t = tag::id(TAG).unwrap();
        assert!(w.pool.sleep(&[(t, Policy::Offload)]).is_err());
        hanging.kill();
        holder.kill();
        wait_until("both released", || server.attached() == 0);
        // ...and allowed once the dead are gone; the bytes survive the cycle.
        w.pool.sleep(&[(t, Policy::Offload)]).unwrap();
        w.pool.wake(&[t]).unwrap();
        let a = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap();
        assert_eq!(attachment_sum(&a).unwrap(), w.sum());
        drop(a);
    }
    wait_until("every descriptor closed", || fd_count() == fds0);
}

#[test]
fn sleep_of_a_shared_tag_is_refused_while_attached() {
    let _s = serial();
    let w = Weights::new();
    let path = sock_path("refuse");
    let server = w.serve(&path, ServeOptions::default());
    let t = tag::id(TAG).unwrap();
    let mut p = Proc::spawn("importer", &path, &[]);
    p.line();
    let e = w.pool.sleep(&[(t, Policy::Offload)]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidState);
    let msg = e.to_string();
    assert!(
        msg.contains("1 attached importer") && msg.contains("revoke policy"),
        "{msg}"
    );
    assert!(
        !w.pool.is_tag_asleep(t),
        "a refused sleep leaves the tag awake"
    );
    assert_eq!(p.ask("sum"), format!("sum={}", w.sum()));
    p.ask("detach");
    assert!(p.finish().success());
    wait_until("detached", || server.attached() == 0);
    w.pool.sleep(&[(t, Policy::Offload)]).unwrap();
    // An attach while asleep is refused with the owner's reason.
    let e = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap_err();
    assert_eq!(e.status(), Status::ShareRefused);
    assert!(e.to_string().contains("asleep"), "{e}");
    w.pool.wake(&[t]).unwrap();
    let a = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap();
    assert_eq!(attachment_sum(&a).unwrap(), w.sum());
}

#[test]
fn serving_is_refused_for_an_asleep_tag_or_memory_outside_it() {
    let _s = serial();
    let w = Weights::new();
    let t = tag::id(TAG).unwrap();
    let path = sock_path("asleep-start");
    w.pool.sleep(&[(t, Policy::Offload)]).unwrap();
    let start = |tensors: Vec<Destination>| {
        Server::start(w.pool.clone(), t, tensors, &path, ServeOptions::default())
    };
    let e = start(w.tensors.clone()).unwrap_err();
    assert!(e.to_string().contains("asleep"), "{e}");
    assert!(!path.exists(), "a refused start leaves no socket behind");
    w.pool.wake(&[t]).unwrap();
    let mut outside = w.tensors.clone();
    outside[0].ptr += 1 << 30;
    let e = start(outside).unwrap_err();
    assert!(
        e.to_string().contains("not inside the committed memory"),
        "{e}"
    );
    assert!(start(Vec::new())
        .unwrap_err()
        .to_string()
        .contains("no tensors"));
    drop(start(w.tensors.clone()).unwrap());
    assert!(!path.exists(), "stopping removes the socket");
}

#[test]
fn sleep_under_the_revoke_policy_notifies_importers() {
    let _s = serial();
    let w = Weights::new();
    let path = sock_path("revoke");
    let options = ServeOptions {
        sleep_policy: SleepPolicy::Revoke,
        ..ServeOptions::default()
    };
    let server = w.serve(&path, options);
    let t = tag::id(TAG).unwrap();
    let expect = w.sum();
    let mut p = Proc::spawn("importer", &path, &[]);
    p.line();
    wait_until("attached", || server.attached() == 1);
    w.pool.sleep(&[(t, Policy::Offload)]).unwrap();
    // The next API call fails clearly...
    let l = p.ask("version");
    assert!(l.starts_with("err=VMMW_SHARE_REVOKED"), "{l}");
    assert!(p.ask("sum").starts_with("err=VMMW_SHARE_REVOKED"));
    // ...and the memory it still maps reads without a fault until it detaches.
    assert_eq!(p.ask("rawsum"), format!("rawsum={expect}"));
    p.ask("detach");
    assert!(p.finish().success());
    w.pool.wake(&[t]).unwrap();
    assert_eq!(server.version(), 2, "a revoke changes the version");
    let a = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap();
    assert_eq!(a.version().unwrap(), 2);
    assert_eq!(attachment_sum(&a).unwrap(), expect);
}

#[test]
fn a_published_version_reaches_attached_importers() {
    let _s = serial();
    let w = Weights::new();
    let path = sock_path("publish");
    let server = w.serve(&path, ServeOptions::default());
    let mut p = Proc::spawn("importer", &path, &[]);
    let first = field(&p.line(), "sum").to_owned();
    // The owner writes new weights in place (an RL trainer's update).
    w.fill(2);
    assert_eq!(server.publish().unwrap(), 2);
    assert_eq!(p.ask("version"), "version=2");
    let l = p.ask("sum");
    assert_eq!(field(&l, "sum"), w.sum());
    assert_ne!(field(&l, "sum"), first);
    assert!(p.finish().success());
}

#[test]
fn read_only_mappings_fault_on_write_and_read_write_needs_the_owners_consent() {
    let _s = serial();
    let w = Weights::new();
    let path = sock_path("readonly");
    let _server = w.serve(&path, ServeOptions::default());
    let mut p = Proc::spawn("importer", &path, &[]);
    p.line();
    p.send("write");
    let status = p.child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(11),
        "a write to a read-only share faults"
    );
    let p = Proc::spawn("importer", &path, &[("VMMW_SHARE_RW", "1")]);
    let l = p.line();
    assert!(l.starts_with("attach_err=VMMW_SHARE_REFUSED"), "{l}");
    assert!(l.contains("shares read-only"), "{l}");
    drop(_server);
    // Memory served read-only stays sealed against new writers (host
    // backend), so the read-write share is of other memory.
    let w = Weights::new();
    let path = sock_path("readwrite");
    let _server = w.serve(
        &path,
        ServeOptions {
            allow_write: true,
            ..ServeOptions::default()
        },
    );
    let mut p = Proc::spawn("importer", &path, &[("VMMW_SHARE_RW", "1")]);
    p.line();
    assert_eq!(p.ask("write"), "wrote");
    // SAFETY: host backend; the owner's block is mapped read-write here.
    assert_eq!(unsafe { *(w.tensors_first_ptr() as *const u8) }, 0x5a);
    assert!(p.finish().success());
}

impl Weights {
    fn tensors_first_ptr(&self) -> u64 {
        let mut by_name: Vec<&Destination> = self.tensors.iter().collect();
        by_name.sort_by(|a, b| a.name.cmp(&b.name));
        by_name[0].ptr
    }
}

#[test]
fn a_wrong_peer_is_refused_on_either_side() {
    let _s = serial();
    let w = Weights::new();
    let path = sock_path("peer");
    let me = wire::own_uid();
    let server = w.serve(
        &path,
        ServeOptions {
            allowed_uids: Some(vec![me.wrapping_add(1)]),
            ..ServeOptions::default()
        },
    );
    let fds0 = fd_count();
    let e = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap_err();
    assert_eq!(e.status(), Status::ShareRefused);
    assert!(
        e.to_string().contains(&format!("uid {me} is not allowed")),
        "{e}"
    );
    drop(server);
    let server = w.serve(&path, ServeOptions::default());
    let e = Attachment::attach(
        host(),
        &path,
        &AttachOptions {
            allowed_owner_uids: Some(vec![me.wrapping_add(1)]),
            ..AttachOptions::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("not an allowed user"), "{e}");
    // A peer that does not speak the protocol is refused and not counted.
    let mut raw = UnixStream::connect(&path).unwrap();
    raw.write_all(b"x").unwrap();
    let mut stray = Vec::new();
    match wire::read_hello(&raw, &mut stray, None).unwrap() {
        Hello::Refused(why) => assert!(why.contains("access request"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(stray.is_empty());
    drop(raw);
    wait_until("refused peers uncounted", || server.attached() == 0);
    // The owner's connection threads close their ends just after replying.
    wait_until("every descriptor closed", || fd_count() == fds0);
}

/// A fake owner that sends `hello`, `nfds` memfds of `G` bytes and the end
/// of the handshake, then waits.
fn fake_owner(path: &Path, hello: Vec<u8>, nfds: usize) -> std::thread::JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(&hello).unwrap();
        let d = host();
        let handles: Vec<_> = (0..nfds).map(|_| d.create(G).unwrap()).collect();
        let fds: Vec<OwnedFd> = handles.iter().map(|&h| d.export_fd(h).unwrap()).collect();
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        let _ = wire::send_fds(&s, &borrowed, None);
        let _ = s.write_all(b"E");
        drop(fds);
        for h in handles {
            d.release(h).unwrap();
        }
        wire::wait_for_close(&s);
    })
}

fn framed(hello: &Hello) -> Vec<u8> {
    let json = serde_json::to_vec(hello).unwrap();
    let mut b = wire::MAGIC.to_vec();
    b.extend_from_slice(&(json.len() as u64).to_le_bytes());
    b.extend_from_slice(&json);
    b
}

fn manifest(chunks: Vec<u64>, tensors: Vec<SharedTensor>) -> Manifest {
    Manifest {
        format: FORMAT,
        version: 1,
        backend: BackendKind::Host,
        tag: "fake".into(),
        owner_pid: 1,
        writable: false,
        chunks,
        tensors,
    }
}

#[test]
fn hostile_owners_are_refused_and_leak_nothing() {
    let _s = serial();
    let t = |offset: u64, shape: Vec<u64>| SharedTensor {
        name: "w".into(),
        dtype: Dtype::F32,
        shape,
        offset,
    };
    let cases: Vec<(&str, Vec<u8>, usize, &str)> = vec![
        (
            "out of range",
            framed(&Hello::Manifest(manifest(
                vec![G as u64],
                vec![t(16, vec![G as u64])],
            ))),
            1,
            "invalid manifest: tensor `w` spans",
        ),
        (
            "overflowing shape",
            framed(&Hello::Manifest(manifest(
                vec![G as u64],
                vec![t(0, vec![u64::MAX / 2, 3])],
            ))),
            1,
            "overflows",
        ),
        (
            "too many descriptors",
            framed(&Hello::Manifest(manifest(
                vec![G as u64],
                vec![t(0, vec![4])],
            ))),
            3,
            "lists 1 chunks, the owner sent 3 descriptors",
        ),
        (
            "too few descriptors",
            framed(&Hello::Manifest(manifest(
                vec![G as u64, G as u64],
                vec![t(0, vec![4])],
            ))),
            1,
            "lists 2 chunks, the owner sent 1 descriptors",
        ),
        (
            "a size past the descriptor's memory",
            framed(&Hello::Manifest(manifest(
                vec![2 * G as u64],
                vec![t(0, vec![4])],
            ))),
            1,
            "not physical memory of",
        ),
        (
            "wrong magic",
            b"NOTVMMW\0\0\0\0\0\0\0\0\0".to_vec(),
            0,
            "wrong magic",
        ),
        (
            "a huge length",
            {
                let mut b = wire::MAGIC.to_vec();
                b.extend_from_slice(&u64::MAX.to_le_bytes());
                b
            },
            0,
            "claims",
        ),
        (
            "not JSON",
            {
                let mut b = wire::MAGIC.to_vec();
                b.extend_from_slice(&3u64.to_le_bytes());
                b.extend_from_slice(b"{{{");
                b
            },
            0,
            "not valid JSON",
        ),
    ];
    let driver = host();
    for (what, hello, nfds, needle) in cases {
        let path = sock_path("hostile");
        let fds0 = fd_count();
        let owner = fake_owner(&path, hello, nfds);
        let options = AttachOptions {
            timeout: Duration::from_secs(2),
            ..AttachOptions::default()
        };
        let e = Attachment::attach(driver.clone(), &path, &options).unwrap_err();
        owner.join().unwrap();
        assert!(
            matches!(e, Error::ShareRefused { .. } | Error::InvalidArgument(_)),
            "{what}: {e}"
        );
        assert!(
            e.to_string().contains(needle),
            "{what}: `{e}` lacks `{needle}`"
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(fd_count(), fds0, "{what}: descriptors leaked");
        let c = driver.as_host().unwrap().counts();
        assert_eq!((c.handles, c.mappings, c.reservations), (0, 0, 0), "{what}");
    }
}

/// Many chunks, sent in several descriptor messages: attach imports and maps
/// each message's chunks as it arrives, reads the owner's bytes, and a map
/// that fails partway through (in any message) leaves nothing behind in the
/// importer.
#[test]
fn attach_of_many_chunks_reads_the_same_and_undoes_a_failed_map() {
    let _s = serial();
    let pool = Arc::new(
        Pool::new(
            host(),
            PoolConfig {
                chunk_bytes: G,
                ..PoolConfig::default()
            },
        )
        .unwrap(),
    );
    let t = tag::id(TAG).unwrap();
    let tensors: Vec<Destination> = (0..3)
        .map(|i| {
            let shape = vec![16 * G + 3 * i + 1];
            let b = pool.alloc_tagged(shape[0], t).unwrap();
            // SAFETY: host backend: the block is mapped read-write here.
            let s = unsafe { std::slice::from_raw_parts_mut(b.ptr as *mut u8, shape[0]) };
            for (k, x) in s.iter_mut().enumerate() {
                *x = (k * 7 + i * 13) as u8;
            }
            Destination {
                name: format!("w{i}"),
                ptr: b.ptr,
                dtype: Dtype::U8,
                shape,
            }
        })
        .collect();
    let owner_sum = checksum(
        tensors
            .iter()
            .map(|d| (d.name.clone(), d.ptr, d.bytes()))
            .collect(),
    );
    let path = sock_path("threads");
    let server = Server::start(pool.clone(), t, tensors, &path, ServeOptions::default()).unwrap();
    let importer = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }));
    let fds0 = fd_count();
    for round in 0..2 {
        let a = Attachment::attach(importer.clone(), &path, &AttachOptions::default()).unwrap();
        let st = a.stats();
        assert!(
            st.chunks > 2 * wire::FDS_PER_MESSAGE,
            "{} chunks; the test wants several descriptor messages",
            st.chunks
        );
        assert_eq!(attachment_sum(&a).unwrap(), owner_sum, "round {round}");
        a.detach().unwrap();
    }
    let clean = importer.counts();
    assert_eq!(
        (clean.handles, clean.mappings, clean.reservations),
        (0, 0, 0)
    );
    for nth in [1, 5, 17, 40] {
        importer.fail_nth(FaultOp::Map, nth);
        let e = Attachment::attach(importer.clone(), &path, &AttachOptions::default()).unwrap_err();
        assert_eq!(e.status(), Status::DriverError, "map {nth}: {e}");
        let c = importer.counts();
        assert_eq!(
            (c.handles, c.mappings, c.reservations, c.physical_bytes),
            (0, 0, 0, clean.physical_bytes),
            "map {nth} failed: the importer holds nothing"
        );
        // The owner (this process too) closes its end once it sees ours gone.
        wait_until("the owner to drop the failed importer", || {
            server.attached() == 0
        });
        assert_eq!(fd_count(), fds0, "map {nth} failed: no descriptor kept");
    }
    importer.clear_faults();
    let a = Attachment::attach(importer.clone(), &path, &AttachOptions::default()).unwrap();
    assert_eq!(attachment_sum(&a).unwrap(), owner_sum, "after the faults");
    a.detach().unwrap();
}
