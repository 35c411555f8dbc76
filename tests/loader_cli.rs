//! The `vmmw inspect`, `load` and `bench-load` subcommands on the host backend.

mod common;

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
        "--checkpoint",
        p,
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
