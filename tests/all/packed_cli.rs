//! `vmmw pack`, `unpack` and `inspect` as a user runs them, from a separate
//! process: a pack killed by a write failure midway (a file size limit)
//! leaves nothing under the output's name and no temporary behind; a
//! corrupt packed file is refused with its name; `inspect --json` reports
//! the packed ratio per tensor and per dtype.

use crate::common;

use std::process::Command;

use common::cli::*;

#[test]
fn a_pack_that_fails_midway_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_checkpoint(dir.path());
    let out = dir.path().join("out.packed");
    // Writes past 8 KiB fail (EFBIG; SIGXFSZ ignored), well inside the frames.
    let st = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 16; exec \"$0\" pack --cpu --frame 64K \"$1\" \"$2\"")
        .arg(env!("CARGO_BIN_EXE_vmmw"))
        .arg(&src)
        .arg(&out)
        .env("VMMW_BACKEND", "host")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success(), "{err}");
    assert!(!out.exists(), "a half-written output is left: {err}");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["model.safetensors".to_owned()], "{err}");
}

#[test]
fn inspect_reports_ratios_and_a_corrupt_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_checkpoint(dir.path());
    let p = dir.path().join("m.packed");
    let ps = p.to_str().unwrap();
    let r = vmmw(&["pack", "--cpu", "--frame", "64K", &src, ps, "--json"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(r.json()["ratio"].as_f64().unwrap() < 1.0, "{}", r.all());
    let j = vmmw(&["inspect", ps, "--tensors", "--json"]).json();
    assert_eq!(j["packed"], true);
    let bf = &j["dtypes"]["BF16"];
    assert!(bf["packed_ratio"].as_f64().unwrap() < 0.9, "{j}");
    assert!(j["tensors"][0]["packed_bytes"].as_u64().is_some(), "{j}");
    // A refused pack of a packed file, and of an output that exists.
    let again = vmmw(&["pack", "--cpu", ps, dir.path().join("x").to_str().unwrap()]);
    assert_ne!(again.code, 0);
    assert!(again.stderr.contains("already packed"), "{}", again.all());
    // One manifest byte changed: refused at open, naming the file.
    let mut b = std::fs::read(&p).unwrap();
    b[100] ^= 0x20;
    std::fs::write(&p, &b).unwrap();
    let bad = vmmw(&["inspect", ps]);
    assert_ne!(bad.code, 0);
    assert!(
        bad.stderr.contains("m.packed") && bad.stderr.contains("checksum"),
        "{}",
        bad.all()
    );
    let un = vmmw(&["unpack", ps, dir.path().join("y").to_str().unwrap()]);
    assert_ne!(un.code, 0);
    assert!(!dir.path().join("y").exists());
}
