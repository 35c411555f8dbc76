//! `vmmw bench-update` on the host backend: it loads, updates from device
//! tensors, reports the rate against a device-to-device copy of the same
//! bytes labelled as the host simulation, and checks the destinations a
//! source fills whole; bad arguments fail with a clear message.

use crate::common;

use common::cli::*;

#[test]
fn bench_update_reports_the_ratio_and_checks_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let r = vmmw(&[
        "bench-update",
        &ckpt,
        "--preset",
        "llama",
        "--head-dim",
        "16",
        "--repeat",
        "2",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    let j = r.json();
    assert_eq!(j["backend"], "host");
    assert!(j["note"].as_str().unwrap().contains("not GPU rates"), "{j}");
    assert_eq!(j["first_version"], 1);
    assert_eq!(j["last_version"], 4, "one untimed and two timed updates");
    assert!(j["ratio"].as_f64().unwrap() > 0.0);
    assert!(j["bytes"].as_u64().unwrap() > 0);
    // The norms and embeddings are whole tensors: checked bitwise.
    assert!(j["verified_destinations"].as_u64().unwrap() >= 5, "{j}");
    assert_eq!(j["update_seconds"].as_array().unwrap().len(), 2);

    // A rank of a tensor-parallel world, staged.
    let r = vmmw(&[
        "bench-update",
        &ckpt,
        "--preset",
        "llama",
        "--head-dim",
        "16",
        "--tp-world",
        "2",
        "--tp-rank",
        "1",
        "--staged",
        "--repeat",
        "1",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["staged"], true);
}

#[test]
fn bench_update_refuses_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let r = vmmw(&["bench-update", &ckpt, "--repeat", "0"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("--repeat"), "{}", r.all());
    let r = vmmw(&["bench-update", &ckpt, "--tp-world", "2"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("--preset"), "{}", r.all());
    let r = vmmw(&[
        "bench-update",
        &ckpt,
        "--preset",
        "llama",
        "--head-dim",
        "16",
        "--tp-world",
        "2",
        "--tp-rank",
        "2",
    ]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("rank 2"), "{}", r.all());
    let r = vmmw(&["bench-update", "/nonexistent/model.safetensors"]);
    assert_ne!(r.code, 0);
}
