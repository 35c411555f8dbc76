//! `vmmw ctl` against a control socket this test process serves (its pools
//! on the host backend), and `vmmw exec`'s checks before anything runs:
//! answers as text and as one JSON document, refusals exit 1 with the
//! process's code and reason, bad input exits 2.

use std::path::PathBuf;
use std::sync::Arc;

use vmmweights::control::{ControlLog, ControlOptions, ProcessPools, Server};
use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::Driver;
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::tag;

use crate::common;
use common::cli::*;

fn serve(name: &str) -> (Server, Arc<Pool>, PathBuf) {
    let d: Arc<dyn Driver> = Arc::new(HostDriver::for_device(HostConfig::default(), 0).unwrap());
    let pool = Arc::new(Pool::new(d, PoolConfig::default()).unwrap());
    let p = pool.clone();
    let dir = std::env::temp_dir().join(format!("vmmw-cli-ctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let server = Server::start(
        &path,
        Arc::new(ProcessPools::new(Box::new(move || vec![p.clone()]), None)),
        ControlOptions {
            log: ControlLog::discard(),
            ..ControlOptions::default()
        },
    )
    .unwrap();
    (server, pool, path)
}

#[test]
fn ctl_reports_sleeps_and_wakes_a_process() {
    let (_server, pool, path) = serve("ctl.sock");
    let s = path.to_str().unwrap();
    let r = vmmw(&["ctl", s, "status"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        r.stdout.contains(": awake") && r.stdout.contains("no allocations yet"),
        "{}",
        r.all()
    );
    let r = vmmw(&["ctl", s, "sleep"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("no allocations yet"), "{}", r.all());
    let b = pool
        .alloc_segment(6 << 20, tag::id("cli-ctl").unwrap())
        .unwrap();
    let r = vmmw(&["ctl", s, "sleep", "--policy", "discard", "--tag", "cli-ctl"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        r.stdout.starts_with("slept (discard) 6.00 MiB"),
        "{}",
        r.all()
    );
    let r = vmmw(&["ctl", s, "status", "--json"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let doc = r.json();
    assert_eq!(doc["state"], "asleep");
    assert_eq!(doc["tags"][0]["tag"], "cli-ctl");
    assert_eq!(doc["last"]["policy"], "discard");
    let r = vmmw(&["ctl", s, "wake", "--wait-memory", "1000", "--json"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["bytes"], 6 << 20);
    // Refusals: exit 1, the code and the reason; under --json the error document.
    let r = vmmw(&["ctl", s, "sleep", "--tag", "cli-ctl-nope", "--json"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert_eq!(r.json()["error"]["kind"], "failure");
    assert!(
        r.stderr.contains("unknown tag `cli-ctl-nope`"),
        "{}",
        r.all()
    );
    pool.free_segment(b.ptr).unwrap();
}

#[test]
fn ctl_and_exec_refuse_bad_input_before_anything_runs() {
    let (_server, _pool, path) = serve("ctl-bad.sock");
    let s = path.to_str().unwrap();
    for args in [
        vec!["ctl", s, "sleep", "--policy", "reload"],
        vec!["ctl", s, "wake", "--wait-memory", "3600001"],
        vec!["ctl", s, "wake", "--wait-memory", "-1"],
        vec!["ctl", s, "sleep", "--tag", ""],
        vec!["ctl", "/nonexistent/control.sock", "status"],
        vec!["ctl", s, "explode"],
    ] {
        let r = vmmw(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.all());
    }
    let r = vmmw(&["ctl", "/nonexistent/control.sock", "status"]);
    assert!(
        r.stderr.contains("/nonexistent/control.sock"),
        "{}",
        r.all()
    );
    // exec: the library, the socket path and the tag are checked first.
    let r = vmmw(&[
        "exec",
        "--lib",
        "/nonexistent/libvmmw_preload.so",
        "--",
        "true",
    ]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("cannot find libvmmw_preload.so"),
        "{}",
        r.all()
    );
    let lib = std::env::current_exe().unwrap();
    let lib = lib.to_str().unwrap();
    let r = vmmw(&["exec", "--lib", lib, "--socket", s, "--", "true"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("the path exists"), "{}", r.all());
    let r = vmmw(&["exec", "--lib", lib, "--tag", "", "--", "true"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("--tag"), "{}", r.all());
    let r = vmmw(&["exec", "--lib", lib]);
    assert_eq!(r.code, 2, "a command is required: {}", r.all());
}

#[test]
fn exec_hands_the_program_an_absolute_socket_path() {
    // A program that changes directory before its first CUDA call (served
    // then) must bind where `vmmw exec` said and will clean up.
    let dir = std::env::temp_dir().join(format!("vmmw-cli-exec-rel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Not a library: the loader says it cannot preload it and runs on.
    let lib = dir.join("not-a-library.so");
    std::fs::write(&lib, b"").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vmmw"))
        .current_dir(&dir)
        .args(["exec", "--socket", "rel.sock", "--lib"])
        .arg(&lib)
        .args([
            "--",
            "sh",
            "-c",
            "cd / && printf %s \"$VMMW_CONTROL_SOCKET\"",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::path::Path::new(&*stdout),
        dir.join("rel.sock"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
