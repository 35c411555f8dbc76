//! A reader that goes away early (`vmmw plan ck | head -1`): `vmmw` ends with
//! exit code 0 and nothing on stderr, never a panic or code 101.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::cli::small_checkpoint;

fn first_line_then_close(args: &[&str]) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmmw"))
        .args(args)
        .env("VMMW_BACKEND", "host")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is dropped here: later writes find the pipe closed.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!first.is_empty(), "{args:?}: no first line");
    assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    assert!(stderr.is_empty(), "{args:?} wrote to stderr: {stderr}");
}

#[test]
fn a_closed_stdout_ends_quietly_with_success() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    first_line_then_close(&["plan", &ckpt, "--preset", "llama", "--head-dim", "16"]);
    first_line_then_close(&["inspect", "--tensors", &ckpt]);
    first_line_then_close(&["demo"]);
}
