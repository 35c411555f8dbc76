//! `vmmw bench-update` on the host backend: it loads, updates from device
//! tensors, reports the rate against a device-to-device copy of the same
//! bytes labelled as the host simulation, and checks the destinations a
//! source fills whole, also through the IPC transport; bad arguments fail
//! with a clear message.

use crate::common;

use common::cli::*;

/// `vmmw bench-update CKPT` on the llama preset (head dim 16), then `args`.
fn bench_update(ckpt: &str, args: &[&str]) -> Run {
    let mut all = vec![
        "bench-update",
        ckpt,
        "--preset",
        "llama",
        "--head-dim",
        "16",
    ];
    all.extend_from_slice(args);
    vmmw(&all)
}

#[test]
fn bench_update_reports_the_ratio_and_checks_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let r = bench_update(&ckpt, &["--repeat", "2", "--json"]);
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
    let phases = j["update_phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2, "{j}");
    for (p, whole) in phases.iter().zip(j["update_seconds"].as_array().unwrap()) {
        let part = |k: &str| p[k].as_f64().unwrap();
        assert!(
            part("plan") > 0.0 && part("issue") > 0.0 && part("bookkeeping") > 0.0,
            "{p}"
        );
        let sum = part("plan") + part("issue") + part("wait") + part("bookkeeping");
        assert!(
            sum <= whole.as_f64().unwrap(),
            "phases {p} exceed the update's {whole} s"
        );
    }

    // A rank of a tensor-parallel world, staged.
    let r = bench_update(
        &ckpt,
        &[
            "--tp-world",
            "2",
            "--tp-rank",
            "1",
            "--staged",
            "--repeat",
            "1",
            "--json",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["staged"], true);
}

#[test]
fn bench_update_through_the_ipc_transport() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    // Through the ring, then straight out of the sender's pool (the first
    // update attaches, the timed ones recognize the manifest and reuse the
    // imports).
    for transport in ["ipc", "ipc-direct"] {
        let r = bench_update(
            &ckpt,
            &[
                "--transport",
                transport,
                "--bucket-bytes",
                "4096",
                "--repeat",
                "2",
                "--json",
            ],
        );
        assert_eq!(r.code, 0, "{transport}: {}", r.all());
        let j = r.json();
        assert_eq!(j["transport"], transport);
        assert_eq!(j["last_version"], 4, "one untimed and two timed updates");
        assert_eq!(j["setup_ms"].as_array().unwrap().len(), 2, "{j}");
        assert!(j["verified_destinations"].as_u64().unwrap() >= 5, "{j}");
        if transport == "ipc" {
            assert_eq!(j["bucket_bytes"], 4096);
        } else {
            assert_eq!(j["recognized"], serde_json::json!([true, true]), "{j}");
        }
    }
    let r = vmmw(&["bench-update", &ckpt, "--transport", "carrier-pigeon"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("ipc"), "{}", r.all());
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
    let r = bench_update(&ckpt, &["--tp-world", "2", "--tp-rank", "2"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("rank 2"), "{}", r.all());
    let r = vmmw(&["bench-update", "/nonexistent/model.safetensors"]);
    assert_ne!(r.code, 0);
}
