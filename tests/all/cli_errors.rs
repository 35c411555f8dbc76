//! `vmmw` on bad input: exit code 2 with a message naming the option, the
//! value and what was expected, checked before any device work; failures of
//! the machine exit 1; names with control characters are escaped.

use crate::common;

use common::cli::*;

#[test]
fn help_documents_exit_codes_and_describes_demo() {
    let r = vmmw(&["--help"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(r.stdout.contains("Exit codes:"), "{}", r.all());
    assert!(r.stdout.contains("2  bad input"), "{}", r.all());
    assert!(
        r.stdout.contains("1  the machine or driver failed"),
        "{}",
        r.all()
    );
    let demo = r
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("demo"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        demo.contains("checkpoint") && demo.contains("sleep"),
        "demo's line in --help: {demo}"
    );
    for cmd in ["demo", "inspect", "plan", "load", "report", "bench-sleep"] {
        let r = vmmw(&[cmd, "--help"]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert!(r.stdout.contains("--json"), "{cmd}: {}", r.all());
        assert!(r.stdout.contains("Exit codes:"), "{cmd}: {}", r.all());
    }
}

#[test]
fn bad_paths_exit_2_and_name_the_path() {
    for cmd in ["inspect", "plan", "load"] {
        let r = vmmw(&[cmd, "/nonexistent/ckpt"]);
        assert_eq!(r.code, 2, "{cmd}: {}", r.all());
        assert!(r.stderr.contains("/nonexistent/ckpt"), "{cmd}: {}", r.all());
        // Under --json the error is the one document on stdout.
        let r = vmmw(&[cmd, "/nonexistent/ckpt", "--json"]);
        assert_eq!(r.code, 2, "{cmd}: {}", r.all());
        let e = &r.json()["error"];
        assert_eq!(e["exit_code"], 2, "{}", r.all());
        assert_eq!(e["kind"], "bad_input", "{}", r.all());
        assert!(e["message"].as_str().unwrap().contains("/nonexistent/ckpt"));
    }
    let r = vmmw(&["report", "/nonexistent/timeline.json"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("/nonexistent/timeline.json"),
        "{}",
        r.all()
    );
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let r = vmmw(&["plan", &ckpt, "--registry", "/nonexistent/reg.json"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("--registry /nonexistent/reg.json"),
        "{}",
        r.all()
    );
}

#[test]
fn corrupt_files_exit_2_and_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let bytes = std::fs::read(&ckpt).unwrap();
    // Truncated: the header promises more data than the file holds.
    let cut = dir.path().join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    // Garbage: the length prefix runs past the end.
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, b"this is not a safetensors file at all").unwrap();
    // A header that is not JSON.
    let mut bad = 8u64.to_le_bytes().to_vec();
    bad.extend_from_slice(b"{not js}");
    let badjson = dir.path().join("badjson.safetensors");
    std::fs::write(&badjson, &bad).unwrap();
    for f in [&cut, &junk, &badjson] {
        let f = f.to_str().unwrap();
        for cmd in ["inspect", "plan", "load"] {
            let r = vmmw(&[cmd, f]);
            assert_eq!(r.code, 2, "{cmd} {f}: {}", r.all());
            assert!(r.stderr.contains(f), "{cmd} {f}: {}", r.all());
            assert!(
                r.stdout.is_empty() || !r.stdout.contains("loaded"),
                "{}",
                r.all()
            );
        }
    }
    // Mapping rules that are not JSON, and a registry that is not a list.
    let rules = dir.path().join("rules.json");
    std::fs::write(&rules, "{ nope").unwrap();
    let r = vmmw(&["inspect", &ckpt, "--rules", rules.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("--rules") && r.stderr.contains("rules.json"),
        "{}",
        r.all()
    );
    let reg = dir.path().join("reg.json");
    std::fs::write(&reg, r#"{"nothing": 1}"#).unwrap();
    let r = vmmw(&["plan", &ckpt, "--registry", reg.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("expected a JSON list"), "{}", r.all());
    // A timeline file that holds something else.
    let r = vmmw(&["report", reg.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("expected JSON holding a timeline"),
        "{}",
        r.all()
    );
}

#[test]
fn bad_sizes_name_the_option_the_value_and_the_units() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    for (opt, val) in [
        ("--window", "64X"),
        ("--window=-1", "-1"),
        ("--slot", "lots"),
        ("--window", "99999999999E"),
    ] {
        let r = if opt.contains('=') {
            vmmw(&["load", &ckpt, opt])
        } else {
            vmmw(&["load", &ckpt, opt, val])
        };
        let opt = opt.split('=').next().unwrap();
        assert_eq!(r.code, 2, "{opt} {val}: {}", r.all());
        assert!(
            r.stderr.contains(opt) && r.stderr.contains(val),
            "{opt} {val}: {}",
            r.all()
        );
    }
    let r = vmmw(&["load", &ckpt, "--window", "64X"]);
    assert!(
        r.stderr.contains("64MiB") && r.stderr.contains("1GiB"),
        "{}",
        r.all()
    );
    let r = vmmw(&["bench-load", &ckpt, "--link-bytes", "2Q"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("--link-bytes"), "{}", r.all());
    let r = vmmw(&["bench-pool", "--sizes", "1M,big"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("--sizes") && r.stderr.contains("big"),
        "{}",
        r.all()
    );
    // The library's host backend reads the same spellings.
    let r = vmmw_env(&["load", &ckpt], &[("VMMW_HOST_MEMORY", "12 parsecs")]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("VMMW_HOST_MEMORY"), "{}", r.all());
    for ok in ["64M", "64MB", "64MiB", "1G", "1GiB", "1GB"] {
        let r = vmmw(&["load", &ckpt, "--window", ok]);
        assert_eq!(r.code, 0, "{ok}: {}", r.all());
        let r = vmmw_env(&["load", &ckpt], &[("VMMW_HOST_MEMORY", ok)]);
        assert_eq!(r.code, 0, "VMMW_HOST_MEMORY={ok}: {}", r.all());
    }
}

#[test]
fn other_bad_options_exit_2_with_what_was_expected() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["load", &ckpt, "--strategy", "fast"],
            &["--strategy", "fast", "staged"],
        ),
        (
            &["load", &ckpt, "--dtype", "f33"],
            &["--dtype", "f33", "BF16"],
        ),
        (
            &["inspect", &ckpt, "--preset", "gpt9"],
            &["--preset", "gpt9", "qwen3"],
        ),
        (
            &["plan", &ckpt, "--tp-world", "2", "--tp-rank", "2"],
            &["--tp-rank 2", "--tp-world 2"],
        ),
        (&["plan", &ckpt, "--tp-world", "0"], &["--tp-world", "0"]),
        (&["load", &ckpt, "--threads", "99"], &["--threads", "99"]),
        (
            &["load", &ckpt, "--backend", "tpu"],
            &["--backend", "tpu", "cuda"],
        ),
        (
            &["demo", "--hidden", "100"],
            &["--hidden", "100", "multiple of 128"],
        ),
        (&["demo", "--layers", "0"], &["--layers", "0"]),
        (
            &["demo", "--chart", "timeline.png"],
            &["--chart", "timeline.png", ".svg"],
        ),
        (
            &["load", &ckpt, "--chart", "/nonexistent/x.svg"],
            &["--chart", "/nonexistent"],
        ),
        (&["bench-pool", "--chart", "x.txt"], &["--chart", "x.txt"]),
        (
            &["bench-load", &ckpt, "--strategies", "auto,staged:4Q"],
            &["--strategies", "4Q"],
        ),
        (
            &["bench-load", &ckpt, "--strategies", "staged@200"],
            &["--strategies", "staged@200", "DIRECT_PERCENT"],
        ),
        (
            &["bench-load", &ckpt, "--preset", "gpt"],
            &["--preset", "gpt", "none"],
        ),
    ];
    for (args, want) in cases {
        let r = vmmw(args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.all());
        for w in *want {
            assert!(
                r.stderr.contains(w),
                "{args:?} should mention {w}: {}",
                r.all()
            );
        }
    }
    let r = vmmw_env(&["load", &ckpt], &[("VMMW_BACKEND", "foo")]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr
            .contains("VMMW_BACKEND=`foo`: expected host, cuda or auto"),
        "{}",
        r.all()
    );
    assert_eq!(
        r.stderr.matches("invalid argument").count(),
        0,
        "{}",
        r.all()
    );
}

#[test]
fn input_is_checked_before_the_device_is_opened() {
    // With the cuda backend requested on a machine without a GPU, opening the
    // device fails (exit 1); bad input must be reported first (exit 2).
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let cuda = [("VMMW_BACKEND", "cuda")];
    for args in [
        vec!["load", "/nonexistent/ckpt"],
        vec![
            "load",
            ckpt.as_str(),
            "--preset",
            "llama",
            "--rules",
            "/nonexistent/r.json",
        ],
        vec!["load", ckpt.as_str(), "--chart", "/nonexistent/c.svg"],
        vec!["demo", "--chart", "c.pdf"],
        vec!["bench-sleep", "--chart", "/nonexistent/c.svg"],
        vec!["bench-load", "/nonexistent/ckpt"],
        vec!["bench-sleep", "--reload-checkpoint", "/nonexistent/ckpt"],
    ] {
        let r = vmmw_env(&args, &cuda);
        assert_eq!(r.code, 2, "{args:?}: {}", r.all());
        assert!(!r.stderr.contains("CUDA"), "{args:?}: {}", r.all());
    }
    // Good input then reaches the device: without a GPU that is a machine
    // failure (1); on a GPU machine it loads (0).
    let r = vmmw_env(&["load", &ckpt], &cuda);
    match r.code {
        0 => assert!(r.stdout.contains("loaded"), "{}", r.all()),
        1 => assert!(r.stderr.contains("CUDA"), "{}", r.all()),
        _ => panic!("expected 0 or 1: {}", r.all()),
    }
}

#[test]
fn control_characters_in_tensor_names_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = generate(&SMALL, Dtype::Bf16);
    let (shape, bytes) = t.remove("model.norm.weight").unwrap();
    let evil = "model.norm\u{1b}[2J\u{7}\nweight\u{202e}";
    t.insert(evil.to_owned(), (shape, bytes));
    let p = dir.path().join("model.safetensors");
    write_file(&p, &t, Dtype::Bf16);
    let p = p.to_str().unwrap();
    for args in [
        vec!["inspect", p, "--tensors"],
        vec!["inspect", p, "--preset", "llama", "--head-dim", "16"],
        vec!["plan", p],
    ] {
        let r = vmmw(&args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.all());
        let out = r.stdout.clone() + &r.stderr;
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\u{202e}'),
            "{args:?}: raw control characters printed: {out:?}"
        );
        assert!(
            out.contains("model.norm\\u{1b}[2J\\u{7}\\nweight\\u{202e}"),
            "{args:?}: {out}"
        );
    }
    let r = vmmw(&["load", p]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        !r.stdout.contains('\u{1b}') && !r.stderr.contains('\u{1b}'),
        "{}",
        r.all()
    );
    // JSON carries the name exactly (JSON escapes it).
    let r = vmmw(&["inspect", p, "--tensors", "--json"]);
    let names: Vec<String> = r.json()["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(names.iter().any(|n| n == evil), "{names:?}");
    assert!(!r.stdout.contains('\u{1b}'), "{}", r.all());
}

#[test]
fn a_bad_host_granularity_names_its_variable() {
    for bad in ["3M", "1000", "0"] {
        let r = vmmw_env(&["demo"], &[("VMMW_HOST_GRANULARITY", bad)]);
        assert_eq!(r.code, 2, "{bad}: {}", r.all());
        assert!(
            r.stderr.contains(&format!("VMMW_HOST_GRANULARITY=`{bad}`")),
            "{bad}: {}",
            r.all()
        );
    }
}

#[test]
fn hostile_gguf_files_exit_2_and_name_the_file_tensor_or_key() {
    use common::gguf::{every_type, pattern, File, V};
    let dir = tempfile::tempdir().unwrap();
    let good = File::new(
        every_type(),
        &[
            ("w", &[64, 2], 8, pattern(1, 2 * 2 * 34)),
            ("n", &[4], 0, pattern(2, 16)),
        ],
    );
    let bytes = good.bytes();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("cut.gguf", bytes[..bytes.len() - 20].to_vec(), "`n`"),
        (
            "type.gguf",
            {
                let mut f = good.clone();
                f.tensors[0].ty = 77;
                f.bytes()
            },
            "unknown ggml type 77",
        ),
        (
            "key.gguf",
            {
                let mut f = good.clone();
                f.kv[1].1 = V::Raw(8, (1u64 << 40).to_le_bytes().to_vec());
                f.bytes()
            },
            "`t.u8`",
        ),
        (
            "count.gguf",
            {
                let mut f = good.clone();
                f.n_kv = Some(u64::MAX);
                f.bytes()
            },
            "metadata key count",
        ),
    ];
    for (name, data, needle) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        let p = p.to_str().unwrap();
        for cmd in ["inspect", "plan", "load"] {
            let r = vmmw(&[cmd, p]);
            assert_eq!(r.code, 2, "{cmd} {name}: {}", r.all());
            assert!(
                r.stderr.contains(p) && r.stderr.contains(needle),
                "{cmd} {name}: {}",
                r.all()
            );
            assert!(!r.stdout.contains("loaded"), "{}", r.all());
        }
    }
}
