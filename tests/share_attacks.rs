//! Attacks on a share from other processes, on the host backend. The test
//! binary runs itself as the attacker (the `child` test, a no-op unless
//! `VMMW_ATTACK_ROLE` is set), which speaks the wire directly where the
//! library would refuse to misbehave, and reports over stdout lines that
//! start with `@`.
//!
//! Shown: a read-only importer cannot write through, reopen or truncate what
//! it received; an owner cannot truncate memory under an importer; an importer
//! that reads no notices is evicted (never dropped silently) and still counted;
//! peers are checked at accept before any read; connections are bounded and
//! silent ones cut at one handshake deadline; running out of descriptors backs
//! off without spinning; an owner that drips bytes cannot stretch an attach
//! past its deadline; `stop` is a barrier and removes only its own socket;
//! oversized chunks are refused as `ShareRefused`; names are printed escaped.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::testing::Testing;
use vmmweights::driver::{BackendKind, Driver};
use vmmweights::loader::dtype::Dtype;
use vmmweights::loader::registry::Destination;
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::share::manifest::{Hello, Manifest, SharedTensor, FORMAT};
use vmmweights::share::{wire, AttachOptions, Attachment, LogSink, ServeOptions, Server};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Error, Status};

const G: usize = 64 << 10;
const TAG: &str = "attacked-weights";

/// Tests count threads and descriptors, so they run one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

fn host() -> Arc<dyn Driver> {
    Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }))
}

fn sock_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmmw-attack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn quiet() -> ServeOptions {
    ServeOptions {
        log: LogSink::discard(),
        ..ServeOptions::default()
    }
}

/// A log that keeps its lines, for tests that check them.
fn kept() -> (LogSink, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l = lines.clone();
    (
        LogSink::new(move |s| l.lock().unwrap().push(s.to_owned())),
        lines,
    )
}

/// One tag with one tensor of 4 chunks, filled with a pattern.
struct Owner {
    pool: Arc<Pool>,
    tensors: Vec<Destination>,
}

impl Owner {
    fn new() -> Owner {
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
        let bytes = 4 * G;
        let b = pool.alloc_tagged(bytes, t).unwrap();
        // SAFETY: host backend: the block is mapped read-write in this process.
        let s = unsafe { std::slice::from_raw_parts_mut(b.ptr as *mut u8, bytes) };
        for (i, x) in s.iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        Owner {
            pool,
            tensors: vec![Destination {
                name: "w".into(),
                ptr: b.ptr,
                dtype: Dtype::U8,
                shape: vec![bytes],
            }],
        }
    }

    fn first_bytes(&self) -> Vec<u8> {
        // SAFETY: host backend: mapped and readable here.
        unsafe { std::slice::from_raw_parts(self.tensors[0].ptr as *const u8, 64) }.to_vec()
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

// ---- the attacker process ----------------------------------------------------

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn spawn(role: &str, path: &Path, env: &[(&str, String)]) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env("VMMW_ATTACK_ROLE", role)
            .env("VMMW_ATTACK_PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if let Some((_, rest)) = l.split_once('@') {
                    if tx.send(rest.to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        Proc {
            child,
            stdin,
            lines,
        }
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the attacker answered within 30 s")
    }

    fn ask(&mut self, cmd: &str) -> String {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        self.line()
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

fn commands() -> impl Iterator<Item = String> {
    std::io::stdin().lines().map_while(|l| l.ok())
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The attacker's side; a no-op unless this binary was started as one.
#[test]
fn child() {
    let Ok(role) = std::env::var("VMMW_ATTACK_ROLE") else {
        return;
    };
    let path = PathBuf::from(std::env::var("VMMW_ATTACK_PATH").unwrap());
    match role.as_str() {
        "raw-read" => raw_read_attack(&path),
        "lazy-importer" => lazy_importer(&path),
        "silent" => silent_clients(&path),
        "fake-owner" => fake_owner(&path),
        "emfile-owner" => emfile_owner(&path),
        "stalled-reader" => stalled_reader(&path),
        other => panic!("unknown role {other}"),
    }
}

/// Speak the protocol by hand: ask `r` (or `w`), read the manifest and every
/// descriptor without the library's checks.
fn raw_attach(path: &Path, ask: u8) -> (Manifest, Vec<OwnedFd>, UnixStream) {
    let s = UnixStream::connect(path).unwrap();
    wire::send_all(&s, &[ask], None).unwrap();
    let mut fds = Vec::new();
    let Hello::Manifest(m) = wire::read_hello(&s, &mut fds, None).unwrap() else {
        panic!("refused")
    };
    let mut byte = [0u8; 1];
    while fds.len() < m.chunks.len() {
        wire::recv_exact(&s, &mut byte, &mut fds, None).unwrap();
    }
    (m, fds, s)
}

fn errno_of(rc: bool) -> String {
    if rc {
        "ok".into()
    } else {
        std::io::Error::last_os_error()
            .raw_os_error()
            .map_or("?".into(), |e| format!("errno{e}"))
    }
}

/// Try every way to write through a descriptor received for reading.
fn raw_read_attack(path: &Path) {
    let ask = std::env::var("VMMW_ATTACK_ASK").unwrap().as_bytes()[0];
    let (m, fds, _s) = raw_attach(path, ask);
    let fd = fds[0].as_raw_fd();
    let size = m.chunks[0] as usize;
    // SAFETY: F_GETFL on an open descriptor.
    let mode = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_ACCMODE;
    let map_write = |fd: i32| {
        // SAFETY: a fresh mapping of an open descriptor, unmapped at once.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        let ok = p != libc::MAP_FAILED;
        let r = errno_of(ok);
        if ok {
            // SAFETY: the byte is inside the mapping just made; the write is the attack.
            unsafe { *(p as *mut u8) = 0xee };
            // SAFETY: unmapping the mapping just made.
            unsafe { libc::munmap(p, size) };
        }
        r
    };
    let direct = map_write(fd);
    // A memfd's mode is 0777: a reopen through /proc asks for write again.
    let proc_path = format!("/proc/self/fd/{fd}\0");
    // SAFETY: NUL-terminated path.
    let rw = unsafe { libc::open(proc_path.as_ptr().cast(), libc::O_RDWR) };
    let reopened = if rw >= 0 {
        map_write(rw)
    } else {
        errno_of(false)
    };
    let target = if rw >= 0 { rw } else { fd };
    // SAFETY: writing one byte from a live buffer.
    let write = errno_of(unsafe { libc::pwrite(target, [0xeeu8].as_ptr().cast(), 1, 0) } == 1);
    // SAFETY: ftruncate of an open descriptor: the attack.
    let truncate = errno_of(unsafe { libc::ftruncate(target, 0) } == 0);
    // A read-only mapping upgraded with mprotect.
    // SAFETY: a fresh read-only shared mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ,
            libc::MAP_SHARED,
            target,
            0,
        )
    };
    // SAFETY: mprotect of the mapping just made.
    let mprotect = errno_of(
        p != libc::MAP_FAILED
            && unsafe { libc::mprotect(p, size, libc::PROT_READ | libc::PROT_WRITE) } == 0,
    );
    println!(
        "@mode={} map_write={direct} reopen_map_write={reopened} pwrite={write} \
         truncate={truncate} mprotect={mprotect}",
        if mode == libc::O_RDONLY { "ro" } else { "rw" }
    );
    for _ in commands() {}
}

/// Attach through the library and read nothing until told.
fn lazy_importer(path: &Path) {
    let a = Attachment::attach(host(), path, &AttachOptions::default()).unwrap();
    println!("@attached version={}", a.version().unwrap());
    for cmd in commands() {
        match cmd.as_str() {
            "version" => match a.version() {
                Ok(v) => println!("@version={v}"),
                Err(e) => println!("@err={} {e}", e.status().name()),
            },
            "tensor" => match a.tensor("w") {
                Ok(_) => println!("@tensor=ok"),
                Err(e) => println!("@err={} {e}", e.status().name()),
            },
            "detach" => {
                a.detach().unwrap();
                println!("@detached");
                break;
            }
            other => println!("@unknown={other}"),
        }
    }
}

/// Open N connections that never ask; report, once every one has ended,
/// how many were refused for the count and how long the others lasted.
fn silent_clients(path: &Path) {
    let n: usize = std::env::var("VMMW_ATTACK_N").unwrap().parse().unwrap();
    let t0 = Instant::now();
    let socks: Vec<UnixStream> = (0..n).map(|_| UnixStream::connect(path).unwrap()).collect();
    println!("@connected");
    let (mut count, mut cut, mut longest, mut first) = (0, 0, 0u128, String::new());
    for s in &socks {
        let deadline = Some(Instant::now() + Duration::from_secs(20));
        let why = match wire::read_hello(s, &mut Vec::new(), deadline) {
            Ok(Hello::Refused(why)) => why,
            Ok(_) => "a manifest".into(),
            Err(e) => e.to_string(),
        };
        if why.contains("too many connections") {
            count += 1;
        } else {
            cut += 1;
            longest = longest.max(t0.elapsed().as_millis());
        }
        if first.is_empty() {
            first = why;
        }
    }
    println!("@refused={count} cut={cut} longest_ms={longest} first={first:?}");
    for _ in commands() {}
}

/// A hostile owner: sends the `VMMW_ATTACK_HELLO` bytes (hex) one byte every
/// `VMMW_ATTACK_DRIP_MS`, then `VMMW_ATTACK_FDS` memfds of `G` bytes
/// (unsealed when `VMMW_ATTACK_UNSEALED` is set) and `E`; then truncates them.
fn fake_owner(path: &Path) {
    let hello = hex_decode(&std::env::var("VMMW_ATTACK_HELLO").unwrap());
    let drip: u64 = std::env::var("VMMW_ATTACK_DRIP_MS").map_or(0, |v| v.parse().unwrap());
    let nfds: usize = std::env::var("VMMW_ATTACK_FDS").map_or(0, |v| v.parse().unwrap());
    let unsealed = std::env::var("VMMW_ATTACK_UNSEALED").is_ok();
    let listener = UnixListener::bind(path).unwrap();
    println!("@listening");
    let (s, _) = listener.accept().unwrap();
    if drip > 0 {
        for b in &hello {
            if wire::send_all(&s, &[*b], None).is_err() {
                println!("@cut");
                return;
            }
            std::thread::sleep(Duration::from_millis(drip));
        }
    } else {
        wire::send_all(&s, &hello, None).unwrap();
    }
    let fds: Vec<OwnedFd> = (0..nfds)
        .map(|_| {
            let flags = if unsealed { 0 } else { libc::MFD_ALLOW_SEALING };
            // SAFETY: valid NUL-terminated name.
            let fd = unsafe { libc::memfd_create(c"fake".as_ptr(), libc::MFD_CLOEXEC | flags) };
            // SAFETY: `fd` was just created and is owned by nothing else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: sizing the memfd just created.
            assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), G as i64) }, 0);
            if !unsealed {
                // SAFETY: sealing the memfd just created, as an honest owner does.
                let rc =
                    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
                assert_eq!(rc, 0);
            }
            fd
        })
        .collect();
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let _ = wire::send_fds(&s, &borrowed, None);
    let _ = wire::send_all(&s, b"E", None);
    for fd in &fds {
        // SAFETY: truncating our own memfd: the attack on the importer's mapping.
        unsafe { libc::ftruncate(fd.as_raw_fd(), 0) };
    }
    println!("@sent");
    wire::wait_for_close(&s);
}

/// An owner at its descriptor limit: serve, fill the file table, report.
fn emfile_owner(path: &Path) {
    let o = Owner::new();
    let (log, lines) = kept();
    let server = o.serve(
        path,
        ServeOptions {
            log,
            ..ServeOptions::default()
        },
    );
    let mut filler: Vec<std::fs::File> = Vec::new();
    let limit = libc::rlimit {
        rlim_cur: 256,
        rlim_max: 4096,
    };
    // SAFETY: setrlimit with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    while let Ok(f) = std::fs::File::open("/dev/null") {
        filler.push(f);
    }
    println!("@full");
    for cmd in commands() {
        match cmd.as_str() {
            "free" => {
                filler.clear();
                println!("@freed");
            }
            "attached" => println!("@attached={}", server.attached()),
            "log" => println!("@log={:?}", lines.lock().unwrap().join(" | ")),
            _ => break,
        }
    }
}

/// Ask for read, then read nothing until told; report the descriptors that arrive.
fn stalled_reader(path: &Path) {
    let s = UnixStream::connect(path).unwrap();
    wire::send_all(&s, b"r", None).unwrap();
    println!("@asked");
    for cmd in commands() {
        if cmd == "read" {
            let mut fds = Vec::new();
            let mut buf = vec![0u8; 1 << 16];
            let mut bytes = 0;
            while let Ok(n) = wire::recv(&s, &mut buf, &mut fds, false) {
                if n == 0 {
                    break;
                }
                bytes += n;
            }
            println!("@fds={} bytes={bytes}", fds.len());
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn framed(m: Manifest) -> Vec<u8> {
    wire::hello_bytes(&Hello::Manifest(m)).unwrap()
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

fn tensor(name: &str, shape: Vec<u64>) -> SharedTensor {
    SharedTensor {
        name: name.into(),
        dtype: Dtype::U8,
        shape,
        offset: 0,
    }
}

// ---- the tests -------------------------------------------------------------

#[test]
fn a_read_only_importer_cannot_write_reopen_or_truncate_what_it_received() {
    let _s = serial();
    let o = Owner::new();
    let before = o.first_bytes();
    let path = sock_path("ro");
    let server = o.serve(&path, quiet());
    let p = Proc::spawn("raw-read", &path, &[("VMMW_ATTACK_ASK", "r".into())]);
    let l = p.line();
    assert!(l.starts_with("mode=ro map_write=errno13 "), "{l}");
    assert!(l.contains("reopen_map_write=errno1 "), "{l}");
    assert!(l.contains("pwrite=errno1 "), "{l}");
    assert!(l.contains("truncate=errno1 "), "{l}");
    assert!(l.contains("mprotect=errno13"), "{l}");
    drop(p);
    assert_eq!(o.first_bytes(), before, "the owner's bytes are unchanged");
    drop(server);
    // The same attack on a share that allows writes gets through: the test
    // above can fail.
    let o = Owner::new();
    let server = o.serve(
        &path,
        ServeOptions {
            allow_write: true,
            ..quiet()
        },
    );
    let p = Proc::spawn("raw-read", &path, &[("VMMW_ATTACK_ASK", "w".into())]);
    let l = p.line();
    assert!(l.starts_with("mode=rw map_write=ok "), "{l}");
    // Even a read-write importer cannot resize the owner's memory.
    assert!(l.contains("truncate=errno1 "), "{l}");
    drop(p);
    assert_eq!(o.first_bytes()[0], 0xee, "the write-enabled attack wrote");
    drop(server);
}

#[test]
fn an_owner_cannot_truncate_memory_under_an_importer() {
    let _s = serial();
    let m = manifest(vec![G as u64], vec![tensor("w", vec![G as u64])]);
    for (unsealed, needle) in [(true, "not sealed against shrinking"), (false, "")] {
        let path = sock_path("truncating");
        let mut env = vec![
            ("VMMW_ATTACK_HELLO", hex(&framed(m.clone()))),
            ("VMMW_ATTACK_FDS", "1".into()),
        ];
        if unsealed {
            env.push(("VMMW_ATTACK_UNSEALED", "1".into()));
        }
        let owner = Proc::spawn("fake-owner", &path, &env);
        assert_eq!(owner.line(), "listening");
        let r = Attachment::attach(host(), &path, &AttachOptions::default());
        if unsealed {
            let e = r.unwrap_err();
            assert_eq!(e.status(), Status::ShareRefused, "{e}");
            assert!(e.to_string().contains(needle), "{e}");
        } else {
            // Sealed: the owner's truncate fails, and reading never faults.
            let a = r.unwrap();
            assert_eq!(owner.line(), "sent");
            let t = a.tensor("w").unwrap();
            let mut buf = vec![1u8; G];
            a.read(t.ptr, &mut buf).unwrap();
            assert!(buf.iter().all(|&b| b == 0));
            a.detach().unwrap();
        }
        drop(owner);
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn an_importer_that_reads_no_notices_is_evicted_and_counted_until_it_detaches() {
    let _s = serial();
    let o = Owner::new();
    let path = sock_path("lazy");
    let (log, lines) = kept();
    let server = o.serve(&path, ServeOptions { log, ..quiet() });
    let mut p = Proc::spawn("lazy-importer", &path, &[]);
    assert_eq!(p.line(), "attached version=1");
    wait_until("attached", 10, || server.attached() == 1);
    for _ in 0..1000 {
        server.publish().unwrap();
    }
    assert_eq!(server.attached(), 1, "never dropped silently");
    assert_eq!(server.evicted(), 1);
    assert!(
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("evicted pid=")),
        "{:?}",
        lines.lock().unwrap()
    );
    // The refuse policy still sees it.
    let t = tag::id(TAG).unwrap();
    let e = o.pool.sleep(&[(t, Policy::Offload)]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidState, "{e}");
    // Its next calls say it was revoked.
    let l = p.ask("version");
    assert!(l.starts_with("err=VMMW_SHARE_REVOKED"), "{l}");
    assert!(l.contains("evicted"), "{l}");
    assert!(p.ask("tensor").starts_with("err=VMMW_SHARE_REVOKED"));
    assert_eq!(p.ask("detach"), "detached");
    wait_until("the evicted importer to leave", 10, || {
        server.attached() == 0
    });
    o.pool.sleep(&[(t, Policy::Offload)]).unwrap();
}

#[test]
fn peers_are_refused_at_accept_before_any_read() {
    let _s = serial();
    let o = Owner::new();
    let path = sock_path("early");
    let me = wire::own_uid();
    let server = o.serve(
        &path,
        ServeOptions {
            allowed_uids: Some(vec![me.wrapping_add(1)]),
            ..quiet()
        },
    );
    // Connections that never ask are refused at once, not after a read.
    let p = Proc::spawn("silent", &path, &[("VMMW_ATTACK_N", "5".into())]);
    assert_eq!(p.line(), "connected");
    let l = p.line();
    assert!(l.starts_with("refused=0 cut=5 "), "{l}");
    let ms: u128 = l["refused=0 cut=5 longest_ms=".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ms < 1000, "refused at once, not after a read: {l}");
    assert!(l.contains("is not allowed"), "{l}");
    drop(p);
    assert_eq!(server.attached(), 0);
    drop(server);
    // A group allow-list admits a peer whose group is named.
    // SAFETY: getegid has no preconditions.
    let gid = unsafe { libc::getegid() };
    let server = o.serve(
        &path,
        ServeOptions {
            allowed_uids: Some(vec![me.wrapping_add(1)]),
            allowed_gids: vec![gid],
            ..quiet()
        },
    );
    let a = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap();
    a.detach().unwrap();
    drop(server);
}

#[test]
fn connections_are_bounded_and_silent_ones_cut_at_one_deadline() {
    let _s = serial();
    let o = Owner::new();
    let path = sock_path("bounded");
    let server = o.serve(
        &path,
        ServeOptions {
            max_connections: 8,
            handshake_timeout: Duration::from_millis(1500),
            ..quiet()
        },
    );
    // Threads of the server (accept, watch) and of the harness; the
    // attacker adds this process's thread that reads its output.
    let base = threads() + 1;
    let p = Proc::spawn("silent", &path, &[("VMMW_ATTACK_N", "40".into())]);
    assert_eq!(p.line(), "connected");
    std::thread::sleep(Duration::from_millis(300));
    assert!(server.attached() <= 8, "{} counted", server.attached());
    // At most one thread per handshake.
    assert!(
        threads() <= base + 8,
        "{} threads, {base} before",
        threads()
    );
    let l = p.line();
    assert!(l.starts_with("refused=32 cut=8 "), "{l}");
    let ms: u128 = l["refused=32 cut=8 longest_ms=".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1400..5000).contains(&ms),
        "silent connections cut at the 1.5 s deadline: {l}"
    );
    assert!(l.contains("no access request"), "{l}");
    wait_until("cut connections uncounted", 10, || server.attached() == 0);
    wait_until("handshake threads gone", 10, || threads() <= base);
    // A real importer gets through afterwards.
    let a = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap();
    a.detach().unwrap();
    drop(p);
}

/// The CPU time (user + system, in clock ticks) of process `pid`.
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn running_out_of_descriptors_backs_off_and_never_spins() {
    let _s = serial();
    let path = sock_path("emfile");
    let mut owner = Proc::spawn("emfile-owner", &path, &[]);
    assert_eq!(owner.line(), "full");
    // Clients queue in the backlog while the owner cannot accept them.
    let clients: Vec<UnixStream> = (0..4)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = cpu_ticks(owner.pid());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(owner.pid()) - t0;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(
        used * 10 < hz * 2,
        "the owner used {used} ticks ({hz}/s) in 2 s at its descriptor limit"
    );
    let log = owner.ask("log");
    assert!(log.contains("cannot accept"), "{log}");
    assert_eq!(
        log.matches("cannot accept").count(),
        1,
        "one line per episode: {log}"
    );
    assert_eq!(owner.ask("free"), "freed");
    for c in &clients {
        wire::send_all(c, b"r", None).unwrap();
    }
    // Each queued client gets an answer: a manifest, or (accepted while the
    // owner still had one descriptor free) a refusal that names the cause.
    for c in &clients {
        let d = Some(Instant::now() + Duration::from_secs(10));
        let h = wire::read_hello(c, &mut Vec::new(), d);
        match h {
            Ok(Hello::Manifest(_)) => {}
            Ok(Hello::Refused(why)) => assert!(why.contains("Too many open files"), "{why}"),
            Err(e) => panic!("no answer: {e}"),
        }
    }
    drop(clients);
    let a = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap();
    a.detach().unwrap();
    let log = owner.ask("log");
    assert!(log.contains("accepting again"), "{log}");
}

#[test]
fn an_owner_that_drips_bytes_cannot_stretch_an_attach_past_its_deadline() {
    let _s = serial();
    let path = sock_path("drip");
    let m = manifest(vec![G as u64], vec![tensor("w", vec![16])]);
    let owner = Proc::spawn(
        "fake-owner",
        &path,
        &[
            ("VMMW_ATTACK_HELLO", hex(&framed(m))),
            ("VMMW_ATTACK_DRIP_MS", "100".into()),
            ("VMMW_ATTACK_FDS", "1".into()),
        ],
    );
    assert_eq!(owner.line(), "listening");
    let t = Instant::now();
    let e = Attachment::attach(
        host(),
        &path,
        &AttachOptions {
            timeout: Duration::from_millis(700),
            ..AttachOptions::default()
        },
    )
    .unwrap_err();
    let took = t.elapsed();
    assert_eq!(e.status(), Status::ShareRefused, "{e}");
    assert!(e.to_string().contains("deadline"), "{e}");
    assert!(took < Duration::from_millis(1500), "attach took {took:?}");
}

#[test]
fn stop_is_a_barrier_and_removes_only_its_own_socket() {
    let _s = serial();
    let o = Owner::new();
    // Names long enough that the manifest fills the socket buffer, so the
    // handshake is still sending when stop is called.
    let tensors: Vec<Destination> = (0..200)
        .map(|i| Destination {
            name: format!("{i}-{}", "n".repeat(3000)),
            ..o.tensors[0].clone()
        })
        .collect();
    let path = sock_path("barrier");
    let mut server = Server::start(
        o.pool.clone(),
        tag::id(TAG).unwrap(),
        tensors,
        &path,
        quiet(),
    )
    .unwrap();
    let mut p = Proc::spawn("stalled-reader", &path, &[]);
    assert_eq!(p.line(), "asked");
    wait_until("the handshake to start", 10, || server.attached() == 1);
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    server.stop();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "stop took {:?}",
        t.elapsed()
    );
    let l = p.ask("read");
    assert!(l.starts_with("fds=0 "), "no descriptor after stop: {l}");
    assert!(!path.exists(), "its own socket removed");
    drop(server);

    // Another server bound the path since: stop leaves it.
    let mut server = o.serve(&path, quiet());
    std::fs::remove_file(&path).unwrap();
    let other = UnixListener::bind(&path).unwrap();
    server.stop();
    assert!(path.exists(), "another server's socket stays");
    drop(other);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn oversized_chunks_are_refused_as_share_refused() {
    let _s = serial();
    let path = sock_path("oversized");
    let m = manifest(vec![1u64 << 46], vec![tensor("w", vec![16])]);
    let owner = Proc::spawn(
        "fake-owner",
        &path,
        &[
            ("VMMW_ATTACK_HELLO", hex(&framed(m))),
            ("VMMW_ATTACK_FDS", "1".into()),
        ],
    );
    assert_eq!(owner.line(), "listening");
    let d = host();
    let e = Attachment::attach(d.clone(), &path, &AttachOptions::default()).unwrap_err();
    assert_eq!(e.status(), Status::ShareRefused, "{e}");
    let c = d.as_host().unwrap().counts();
    assert_eq!((c.handles, c.mappings, c.reservations), (0, 0, 0));
}

#[test]
fn names_from_another_process_are_printed_escaped() {
    let _s = serial();
    let path = sock_path("names");
    let evil = "w\n\u{1b}[31mFAKE\u{202e}";
    let m = manifest(
        vec![G as u64],
        vec![tensor(evil, vec![16]), tensor(evil, vec![16])],
    );
    let owner = Proc::spawn(
        "fake-owner",
        &path,
        &[
            ("VMMW_ATTACK_HELLO", hex(&framed(m))),
            ("VMMW_ATTACK_FDS", "1".into()),
        ],
    );
    assert_eq!(owner.line(), "listening");
    let e = Attachment::attach(host(), &path, &AttachOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains(r"w\n\u{1b}[31mFAKE\u{202e}"), "{msg}");
    assert!(
        !msg.contains('\n') && !msg.contains('\u{1b}') && !msg.contains('\u{202e}'),
        "{msg:?}"
    );
    assert!(matches!(e, Error::ShareRefused { .. }));
}
