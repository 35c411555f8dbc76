//! `vmmw serve` as a real process on the host backend: it loads a generated
//! checkpoint and serves it; this test attaches through the Rust API and
//! reads the file's bytes, rewrites the file's data, sends SIGHUP and sees
//! version + 1 with the new bytes, then SIGTERM: exit 0, socket removed.
//! And a server whose standard error nobody reads keeps serving.

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use common::cli::{generate, vmmw, write_file, Dtype, SMALL};
use vmmweights::share::{AttachOptions, Attachment};
use vmmweights::Status;

/// Every tensor of a safetensors file: name -> bytes.
fn file_tensors(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let raw = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&raw).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, v.data().to_vec()))
        .collect()
}

/// Every tensor the attachment maps: name -> bytes read through it.
fn shared_tensors(a: &Attachment) -> BTreeMap<String, Vec<u8>> {
    a.tensors()
        .unwrap()
        .into_iter()
        .map(|t| {
            let mut buf = vec![0u8; t.bytes];
            a.read(t.ptr, &mut buf).unwrap();
            (t.name.clone(), buf)
        })
        .collect()
}

struct Serve {
    child: Child,
    lines: Receiver<String>,
}

impl Serve {
    fn start(args: &[&str]) -> Serve {
        Serve::start_with(args, Stdio::inherit())
    }

    fn start_with(args: &[&str], stderr: Stdio) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vmmw"))
            .arg("serve")
            .args(args)
            .env("VMMW_BACKEND", "host")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("vmmw runs");
        let out: ChildStdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Serve { child, lines }
    }

    fn line(&mut self) -> String {
        match self.lines.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(_) => {
                let _ = self.child.kill();
                panic!("no line from vmmw serve (status {:?})", self.child.wait());
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `key=value` from a line of words.
fn field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in `{line}`"))
        .to_owned()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmmw-serve-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn serve_attach_sighup_reload_sigterm() {
    let dir = tmp("cycle");
    let ckpt = dir.join("model.safetensors");
    write_file(&ckpt, &generate(&SMALL, Dtype::Bf16), Dtype::Bf16);
    let sock = dir.join("w.sock");
    let mut s = Serve::start(&[
        ckpt.to_str().unwrap(),
        "--socket",
        sock.to_str().unwrap(),
        "--policy",
        "revoke",
        "--allow-write",
    ]);
    let ready = s.line();
    assert!(
        ready.starts_with(&format!("serving {} ", sock.display())),
        "{ready}"
    );
    let want = file_tensors(&ckpt);
    assert_eq!(field(&ready, "tensors"), want.len().to_string());
    let total: usize = want.values().map(Vec::len).sum();
    assert_eq!(field(&ready, "bytes"), total.to_string());
    assert_eq!(field(&ready, "version"), "1");

    let rw = AttachOptions {
        read_write: true,
        ..AttachOptions::default()
    };
    let a = Attachment::attach(common::loader::host(), &sock, &rw).unwrap();
    assert!(
        a.is_read_write(),
        "--allow-write lets importers map read-write"
    );
    assert_eq!(a.version().unwrap(), 1);
    assert_eq!(
        shared_tensors(&a),
        want,
        "the importer reads the file's bytes"
    );

    // New weights, same shapes: every data byte flipped, in place.
    let mut raw = std::fs::read(&ckpt).unwrap();
    let header = 8 + u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    for b in &mut raw[header..] {
        *b ^= 0x5A;
    }
    std::fs::write(&ckpt, &raw).unwrap();
    let new = file_tensors(&ckpt);
    assert_ne!(new, want);
    s.signal(libc::SIGHUP);
    let reloaded = s.line();
    assert!(reloaded.starts_with("reloaded "), "{reloaded}");
    assert_eq!(field(&reloaded, "version"), "2");
    let mut seen = 0;
    for _ in 0..500 {
        seen = a.version().unwrap();
        if seen == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(seen, 2, "the importer sees the published version");
    assert_eq!(
        shared_tensors(&a),
        new,
        "the importer reads the reloaded bytes in place"
    );

    s.signal(libc::SIGTERM);
    let stopped = s.line();
    assert!(stopped.starts_with("stopped (SIGTERM)"), "{stopped}");
    let status = s.child.wait().unwrap();
    assert!(
        status.success(),
        "vmmw serve exits 0 on SIGTERM: {status:?}"
    );
    assert!(!sock.exists(), "the socket file is removed");
    // The owner is gone; the mapping stays readable.
    assert_eq!(shared_tensors(&a), new);
    a.detach().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_sigint_stops_cleanly_and_failed_reload_keeps_version() {
    let dir = tmp("sigint");
    let ckpt = dir.join("model.safetensors");
    write_file(&ckpt, &generate(&SMALL, Dtype::Bf16), Dtype::Bf16);
    let sock = dir.join("w.sock");
    let mut s = Serve::start(&[ckpt.to_str().unwrap(), "--socket", sock.to_str().unwrap()]);
    assert!(s.line().starts_with("serving "));
    std::fs::write(&ckpt, b"not a checkpoint").unwrap();
    s.signal(libc::SIGHUP); // fails: reported on stderr, version unchanged
    let rw = AttachOptions {
        read_write: true,
        ..AttachOptions::default()
    };
    let e = Attachment::attach(common::loader::host(), &sock, &rw).unwrap_err();
    assert_eq!(
        e.status(),
        Status::ShareRefused,
        "read-write without --allow-write: {e}"
    );
    let a = Attachment::attach(common::loader::host(), &sock, &AttachOptions::default()).unwrap();
    assert!(!a.is_read_write());
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(a.version().unwrap(), 1, "a failed reload publishes nothing");
    a.detach().unwrap();
    s.signal(libc::SIGINT);
    assert!(s.line().starts_with("stopped (SIGINT)"));
    assert!(s.child.wait().unwrap().success());
    assert!(!sock.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_refuses_an_existing_socket_path_before_loading() {
    let dir = tmp("exists");
    let ckpt = common::cli::small_checkpoint(&dir);
    let sock = dir.join("taken");
    std::fs::write(&sock, b"").unwrap();
    let r = vmmw(&["serve", &ckpt, "--socket", sock.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("the path exists"), "{}", r.all());
    let r = vmmw(&[
        "serve",
        &ckpt,
        "--socket",
        "x.sock",
        "--policy",
        "sometimes",
    ]);
    assert_eq!(r.code, 2, "{}", r.all());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_bounds_its_connections_and_checks_its_limits() {
    let dir = tmp("bounds");
    let ckpt = common::cli::small_checkpoint(&dir);
    for bad in [
        &["--max-connections", "0"][..],
        &["--handshake-timeout", "0"],
        &["--handshake-timeout", "-1"],
        &["--allow-gid", "x"],
    ] {
        let mut args = vec!["serve", &ckpt, "--socket", "never.sock"];
        args.extend_from_slice(bad);
        let r = vmmw(&args);
        assert_eq!(r.code, 2, "{bad:?}: {}", r.all());
    }
    let sock = dir.join("w.sock");
    let mut s = Serve::start(&[
        &ckpt,
        "--socket",
        sock.to_str().unwrap(),
        "--max-connections",
        "1",
        "--allow-gid",
        "0",
        "--handshake-timeout",
        "2.5",
    ]);
    assert!(s.line().starts_with("serving "));
    let a = Attachment::attach(common::loader::host(), &sock, &AttachOptions::default()).unwrap();
    let e =
        Attachment::attach(common::loader::host(), &sock, &AttachOptions::default()).unwrap_err();
    assert_eq!(e.status(), Status::ShareRefused, "{e}");
    assert!(e.to_string().contains("too many connections"), "{e}");
    a.detach().unwrap();
    let mut again = None;
    for _ in 0..200 {
        match Attachment::attach(common::loader::host(), &sock, &AttachOptions::default()) {
            Ok(a) => {
                again = Some(a);
                break;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    again
        .expect("a slot frees once the importer detached")
        .detach()
        .unwrap();
    s.signal(libc::SIGTERM);
    assert!(s.line().starts_with("stopped (SIGTERM)"));
    assert!(s.child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pipe of one page: (read end, write end).
fn small_pipe() -> (std::fs::File, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, which we own from here.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fds[1] is the open write end; F_SETPIPE_SZ only resizes its buffer.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 4096) };
    // SAFETY: both are open descriptors nothing else owns.
    unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    }
}

/// Bytes written to a pipe and not read yet.
fn unread(f: &std::fs::File) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int for an open pipe descriptor.
    assert_eq!(
        unsafe { libc::ioctl(f.as_raw_fd(), libc::FIONREAD, &mut n) },
        0
    );
    n as usize
}

#[test]
fn a_log_nobody_reads_never_stops_serving() {
    // Standard error is a one-page pipe this test does not read: the
    // server's audit lines fill it at once. Silent peers take every
    // connection slot, then 2000 more connections are each refused with an
    // audit line by the accept loop itself, more than the log's queue holds
    // (share::log::QUEUE_LINES); an accept loop that waited on its log would
    // stop accepting, and the attach below would time out.
    let dir = tmp("stalled-log");
    let ckpt = dir.join("model.safetensors");
    write_file(&ckpt, &generate(&SMALL, Dtype::Bf16), Dtype::Bf16);
    let sock = dir.join("w.sock");
    let (log_read, log_write) = small_pipe();
    let mut s = Serve::start_with(
        &[
            ckpt.to_str().unwrap(),
            "--socket",
            sock.to_str().unwrap(),
            "--max-connections",
            "4",
            "--handshake-timeout",
            "60",
        ],
        Stdio::from(log_write),
    );
    assert!(s.line().starts_with("serving "));
    let silent: Vec<_> = (0..4)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap())
        .collect();
    let flood_sock = sock.clone();
    let (done_tx, done) = channel();
    std::thread::spawn(move || {
        for _ in 0..2000 {
            match std::os::unix::net::UnixStream::connect(&flood_sock) {
                Ok(c) => drop(c),
                Err(e) => {
                    let _ = done_tx.send(Err(e.to_string()));
                    return;
                }
            }
        }
        let _ = done_tx.send(Ok(()));
    });
    match done.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("a connection of the flood failed: {e}"),
        Err(_) => panic!("2000 connections were not accepted within 60 s: the accept loop stalled"),
    }
    // Every refusal was logged or dropped by now; the pipe is full.
    let stalled = unread(&log_read);
    assert!(
        stalled >= 2048,
        "the log pipe holds only {stalled} bytes: the log was not stalled"
    );
    drop(silent);
    let quick = AttachOptions {
        timeout: Duration::from_secs(5),
        ..AttachOptions::default()
    };
    let mut attached = None;
    for _ in 0..200 {
        // The silent peers' slots free as their handshakes see them close.
        match Attachment::attach(common::loader::host(), &sock, &quick) {
            Ok(a) => {
                attached = Some(a);
                break;
            }
            Err(e) if e.to_string().contains("too many connections") => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("attach with the log stalled: {e}"),
        }
    }
    let a = attached.expect("an attach once the silent peers left, with the log still stalled");
    assert_eq!(shared_tensors(&a), file_tensors(&ckpt));
    a.detach().unwrap();
    // Now read the log: the writer says how many lines it dropped.
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut text = String::new();
        let mut r = log_read;
        let _ = r.read_to_string(&mut text);
        text
    });
    s.signal(libc::SIGTERM);
    assert!(s.line().starts_with("stopped (SIGTERM)"));
    assert!(s.child.wait().unwrap().success());
    let log = reader.join().unwrap();
    let dropped = log
        .lines()
        .find_map(|l| {
            l.strip_prefix("vmmw: ")?
                .strip_suffix(" log lines dropped (the log's reader fell behind)")?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no `N log lines dropped` line in the log:\n{log}"));
    assert!(dropped > 0 && dropped <= 2010, "{dropped} lines dropped");
    assert!(
        log.contains("too many connections") || log.contains("connections open"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
