//! The `vmmw inspect`, `load` and `bench-load` subcommands on the host backend.

use crate::common;

use std::process::Command;

use common::loader::*;
use vmmweights::loader::Dtype;

fn vmmw(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vmmw"))
        .args(args)
        .env("VMMW_BACKEND", "host")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn inspect_load_and_bench_load_run_on_a_generated_checkpoint() {
    let t = generate(&SMALL, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    let p = dir.path().to_str().unwrap();

    let (ok, out) = vmmw(&[
        "inspect",
        p,
        "--preset",
        "qwen3",
        "--head-dim",
        "16",
        "--tp-world",
        "2",
        "--tp-rank",
        "1",
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains("model.layers.1.self_attn.qkv_proj.weight BF16 [64, 64]"),
        "{out}"
    );

    let (ok, out) = vmmw(&[
        "load",
        p,
        "--preset",
        "llama",
        "--head-dim",
        "16",
        "--dtype",
        "f32",
        "--strategy",
        "staged",
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains("loaded") && out.contains("destinations"),
        "{out}"
    );

    let (ok, out) = vmmw(&[
        "bench-load",
        p,
        "--preset",
        "qwen3",
        "--head-dim",
        "16",
        "--repeat",
        "1",
        "--link-bytes",
        "4M",
        "--verify",
        "--strategies",
        "auto,direct,staged,read,simple",
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains("rows match the file") && out.contains("simple"),
        "{out}"
    );

    // Errors name the file.
    let (ok, out) = vmmw(&["inspect", "/nonexistent/ckpt"]);
    assert!(!ok && out.contains("/nonexistent/ckpt"), "{out}");
}

#[test]
fn bench_load_devices_compares_loads_and_wakes_on_simulated_devices() {
    let t = generate(&SMALL, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    let p = dir.path().to_str().unwrap();
    let json = dir.path().join("multi.json");
    let (ok, out) = vmmw(&[
        "bench-load",
        p,
        "--preset",
        "qwen3",
        "--head-dim",
        "16",
        "--repeat",
        "1",
        "--verify",
        "--devices",
        "0,1",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("replicas from one backup"), "{out}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // The keys scripts/gpu.d/70-multi.sh reads.
    for k in [
        "one_device",
        "replicas",
        "ranks",
        "one_device_wake",
        "replicas_wake",
        "replicas_speedup",
        "replicas_wake_checkpoint",
    ] {
        assert!(!r[k].is_null(), "{k} missing: {r}");
    }
    let wake = &r["replicas_wake"];
    let last = &wake["last_wake"];
    let delivered = wake["delivered_bytes"].as_u64().unwrap();
    assert_eq!(last["delivered_bytes"].as_u64().unwrap(), delivered);
    assert!(
        last["host_bytes"].as_u64().unwrap() * 2 == delivered,
        "{last}"
    );
    assert!(wake["verified_rows"].as_u64().unwrap() > 0, "{wake}");
    assert!(r["one_device_wake"]["delivered_bytes"].as_u64().unwrap() * 2 == delivered);
    // The wakes from a compressed backup: every device decodes a share of
    // the holder's frames, only encoded bytes read from host memory.
    assert!(out.contains("compressed wake"), "{out}");
    let c = &r["compressed"];
    for k in [
        "backup_ratio",
        "one_device_wake",
        "replicas_wake",
        "one_device_over_link",
        "replicas_over_link",
        "replicas_over_raw_replicas",
    ] {
        assert!(!c[k].is_null(), "compressed.{k} missing: {c}");
    }
    let ratio = c["backup_ratio"].as_f64().unwrap();
    assert!(ratio > 0.5 && ratio < 0.9, "bf16 backup at {ratio} of raw");
    let cw = &c["replicas_wake"];
    let last = &cw["last_wake"];
    assert_eq!(cw["delivered_bytes"].as_u64().unwrap(), delivered);
    assert_eq!(last["decoded_bytes"].as_u64().unwrap() * 2, delivered);
    assert!(
        last["host_bytes"].as_u64().unwrap() * 2 < delivered,
        "{last}"
    );
    assert!(cw["verified_rows"].as_u64().unwrap() > 0, "{cw}");

    // The one-device table's options are refused with --devices, not ignored.
    for extra in [
        &["--strategies", "auto"][..],
        &["--cold"][..],
        &["--chart", "x.svg"][..],
    ] {
        let mut args = vec!["bench-load", p, "--preset", "qwen3", "--devices", "0,1"];
        args.extend_from_slice(extra);
        let (ok, out) = vmmw(&args);
        assert!(
            !ok && out.contains("cannot be used with"),
            "{extra:?}: {out}"
        );
    }
}
