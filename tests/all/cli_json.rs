//! `--json` on every command: stdout is one JSON document of the documented
//! shape (docs/CLI.md), parsed back here and checked against the input.

use crate::common;

use common::cli::*;
use serde_json::Value;

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn inspect_json_counts_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let t = generate(&SMALL, Dtype::Bf16);
    let data: usize = t.values().map(|(_, b)| b.len()).sum();
    let r = vmmw(&["inspect", &ckpt, "--tensors", "--json"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let j = r.json();
    assert_eq!(j["tensor_count"], t.len());
    assert_eq!(j["data_bytes"], data);
    assert_eq!(j["dtypes"]["BF16"]["tensors"], t.len());
    assert_eq!(j["tensors"].as_array().unwrap().len(), t.len());
    assert!(j.get("destinations").is_none(), "no rules, no destinations");
    let r = vmmw(&[
        "inspect",
        &ckpt,
        "--preset",
        "llama",
        "--head-dim",
        "16",
        "--print-rules",
        "--json",
    ]);
    let j = r.json();
    let dests = j["destinations"].as_array().unwrap();
    assert!(dests
        .iter()
        .any(|d| d["name"] == "model.layers.1.self_attn.qkv_proj.weight"
            && d["shape"] == serde_json::json!([128, 64])));
    assert!(j["rules"].is_object(), "{}", r.all());
    // --print-rules works without --preset too (identity rules).
    let r = vmmw(&["inspect", &ckpt, "--print-rules"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(r.stdout.contains("\"rules\""), "{}", r.all());
}

#[test]
fn plan_json_covers_every_destination_byte() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let r = vmmw(&[
        "plan",
        &ckpt,
        "--preset",
        "llama",
        "--head-dim",
        "16",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    let j = r.json();
    let dests = j["destinations"].as_array().unwrap();
    assert!(!dests.is_empty());
    let mut written = 0u64;
    for d in dests {
        let covered: u64 = d["sources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["rows"].as_u64().unwrap() * s["dst_row_bytes"].as_u64().unwrap())
            .sum::<u64>()
            + d["fills"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["bytes"].as_u64().unwrap())
                .sum::<u64>();
        assert_eq!(covered, d["bytes"].as_u64().unwrap(), "{d}");
        written += covered;
    }
    assert_eq!(j["dst_bytes"].as_u64().unwrap(), written);
    // qkv is fused from three sources, at increasing offsets.
    let qkv = dests
        .iter()
        .find(|d| d["name"] == "model.layers.0.self_attn.qkv_proj.weight")
        .unwrap();
    let srcs: Vec<&str> = qkv["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["source"].as_str().unwrap())
        .collect();
    assert_eq!(srcs.len(), 3, "{qkv}");
    assert!(names(&j["missing"]).is_empty() && names(&j["unexpected"]).is_empty());

    // Tensor parallel: each rank reads a different slice of q_proj.
    let rank = |r: &str| {
        let out = vmmw(&[
            "plan",
            &ckpt,
            "--preset",
            "llama",
            "--head-dim",
            "16",
            "--tp-world",
            "2",
            "--tp-rank",
            r,
            "--json",
        ]);
        assert_eq!(out.code, 0, "{}", out.all());
        out.json()["destinations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == "model.layers.0.self_attn.qkv_proj.weight")
            .unwrap()["sources"][0]["tensor_offset"]
            .as_u64()
            .unwrap()
    };
    assert_ne!(rank("0"), rank("1"));
}

#[test]
fn plan_with_a_registry_reports_missing_and_unexpected() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    // The destinations inspect prints, minus one, plus one no tensor fills.
    let r = vmmw(&[
        "inspect",
        &ckpt,
        "--preset",
        "llama",
        "--head-dim",
        "16",
        "--json",
    ]);
    let mut doc = r.json();
    let dests = doc["destinations"].as_array_mut().unwrap();
    let dropped = dests
        .iter()
        .position(|d| d["name"] == "lm_head.weight")
        .unwrap();
    dests.remove(dropped);
    dests.push(serde_json::json!({"name": "extra.bias", "dtype": "F32", "shape": [8]}));
    let reg = dir.path().join("registry.json");
    std::fs::write(&reg, doc.to_string()).unwrap();
    let r = vmmw(&[
        "plan",
        &ckpt,
        "--preset",
        "llama",
        "--head-dim",
        "16",
        "--registry",
        reg.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    let j = r.json();
    assert_eq!(names(&j["missing"]), ["extra.bias"]);
    assert_eq!(names(&j["unexpected"]), ["lm_head.weight"]);
    let r = vmmw(&[
        "plan",
        &ckpt,
        "--preset",
        "llama",
        "--head-dim",
        "16",
        "--registry",
        reg.to_str().unwrap(),
    ]);
    assert!(
        r.stdout
            .contains("missing (destinations no tensor fills) (1): extra.bias"),
        "{}",
        r.all()
    );
    // A destination whose shape disagrees is a mismatch: bad input.
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"[{"name": "model.norm.weight", "dtype": "BF16", "shape": [3]}]"#,
    )
    .unwrap();
    let r = vmmw(&["plan", &ckpt, "--registry", bad.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("model.norm.weight"), "{}", r.all());
}

#[test]
fn load_json_reports_bytes_and_the_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let t = generate(&SMALL, Dtype::Bf16);
    let data: usize = t.values().map(|(_, b)| b.len()).sum();
    let r = vmmw(&["load", &ckpt, "--json", "--strategy", "staged"]);
    assert_eq!(r.code, 0, "{}", r.all());
    // The human lines moved to stderr.
    assert!(r.stderr.contains("loaded"), "{}", r.all());
    let j = r.json();
    assert_eq!(j["backend"], "host");
    assert_eq!(j["bytes"], data);
    assert_eq!(j["destinations"], t.len());
    assert_eq!(j["stats"]["bytes"], data);
    let b = j["timeline"]["boundaries"].as_array().unwrap();
    let steps: Vec<&str> = b.iter().map(|x| x["name"].as_str().unwrap()).collect();
    assert_eq!(steps, ["allocated", "loaded", "freed and trimmed"]);
    let weights = &b[1]["report"]["tags"][0];
    assert_eq!(weights["tag"], "weights");
    assert!(weights["live_bytes"].as_u64().unwrap() >= data as u64);
    assert_eq!(b[2]["report"]["total"]["tracked_bytes"], 0);
    same_vocabulary(&j);
}

/// The command's `backend` and `device` mean what the library's report
/// inside it means: the kind ("cuda"/"host") and the device in words.
fn same_vocabulary(j: &Value) {
    assert!(
        j["backend"] == "host" || j["backend"] == "cuda",
        "backend is the kind: {j}"
    );
    for b in j["timeline"]["boundaries"].as_array().unwrap() {
        let r = &b["report"];
        assert_eq!(r["backend"], j["backend"], "{}", b["name"]);
        assert_eq!(r["device"], j["device"], "{}", b["name"]);
        assert!(r["ordinal"].is_i64(), "the ordinal is its own field: {r}");
    }
}

#[test]
fn load_progress_prints_lines_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let r = vmmw(&["load", &ckpt, "--progress"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let lines: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("load: "))
        .collect();
    assert!(!lines.is_empty() && lines.len() <= 11, "{}", r.all());
    assert!(lines.last().unwrap().ends_with("(100%)"), "{}", r.all());
    // Without --progress and off a terminal: no progress at all.
    let r = vmmw(&["load", &ckpt]);
    assert!(!r.stderr.contains("load: "), "{}", r.all());
}

#[test]
fn demo_json_and_report_agree() {
    let dir = tempfile::tempdir().unwrap();
    let r = vmmw(&["demo", "--json", "--layers", "1", "--hidden", "256"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let j = r.json();
    assert_eq!(j["verified"], true);
    assert_eq!(j["backend"], "host");
    let b = j["timeline"]["boundaries"].as_array().unwrap();
    assert_eq!(b.len(), 6, "{}", r.all());
    // docs/CLI.md lists the boundaries by name, as the demo writes them.
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/CLI.md"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for x in b {
        let name = x["name"].as_str().unwrap();
        assert!(
            doc.contains(&format!("`{name}`")),
            "docs/CLI.md does not name the demo's boundary `{name}`"
        );
    }
    let asleep = &b[2]["report"];
    assert!(
        asleep["tags"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["asleep"] == true),
        "{asleep}"
    );
    assert_eq!(asleep["total"]["tracked_bytes"], 0);
    same_vocabulary(&j);
    let saved = dir.path().join("demo.json");
    std::fs::write(&saved, &r.stdout).unwrap();
    let saved = saved.to_str().unwrap();

    let r = vmmw(&["report", saved, "--json"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["timeline"], j["timeline"]);
    let r = vmmw(&["report", saved]);
    assert_eq!(r.code, 0, "{}", r.all());
    for name in [
        "loaded",
        "cache allocated",
        "asleep (weights offloaded, cache discarded)",
    ] {
        assert!(r.stdout.contains(name), "{}", r.all());
    }
    // The table's columns line up however long the step names are.
    let rows: Vec<&str> = r.stdout.lines().filter(|l| !l.starts_with(' ')).collect();
    let at = |l: &str| l.len();
    assert!(
        rows.windows(2).all(|w| at(w[0]) == at(w[1])),
        "{}",
        r.stdout
    );
    // A bare timeline (as the library's Timeline::to_json writes it) reads too.
    let bare = dir.path().join("bare.json");
    std::fs::write(&bare, j["timeline"].to_string()).unwrap();
    let r = vmmw(&["report", bare.to_str().unwrap(), "--json"]);
    assert_eq!(r.json()["timeline"], j["timeline"]);
}

#[test]
fn bench_json_goes_to_stdout_or_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "bench-pool",
        "--sizes",
        "512,1M",
        "--batches",
        "3",
        "--pairs",
        "5",
    ];
    let mut a = args.to_vec();
    a.push("--json");
    let r = vmmw(&a);
    assert_eq!(r.code, 0, "{}", r.all());
    let j = r.json();
    let sizes: Vec<u64> = j["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [512, 1 << 20]);
    let f = dir.path().join("pool.json");
    let mut a = args.to_vec();
    a.extend(["--json", f.to_str().unwrap()]);
    let r = vmmw(&a);
    assert_eq!(r.code, 0, "{}", r.all());
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    assert_eq!(j["rows"].as_array().unwrap().len(), 2);
    // bench-sleep needs the GPU: a machine failure (1), as JSON under --json.
    let r = vmmw(&["bench-sleep", "--json"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert_eq!(r.json()["error"]["kind"], "failure");
}

#[test]
fn inspect_and_plan_show_gguf_metadata_and_ggml_types() {
    use common::gguf::{every_type, pattern, File};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    File::new(
        every_type(),
        &[
            ("blk.0.attn_q.weight", &[64, 4], 8, pattern(1, 4 * 2 * 34)),
            ("norm", &[8], 0, pattern(2, 32)),
        ],
    )
    .write(&path);
    let p = path.to_str().unwrap();
    let r = vmmw(&["inspect", p, "--tensors", "--json"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let j = r.json();
    assert_eq!(j["format"], "gguf");
    assert_eq!(j["gguf_version"], 3);
    assert_eq!(j["metadata"]["t.u64"]["value"], u64::MAX);
    assert_eq!(j["metadata"]["t.i64"]["type"], "int64");
    assert_eq!(j["metadata"]["t.nested"]["elem_type"], "array");
    let q = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "blk.0.attn_q.weight")
        .unwrap();
    assert_eq!(q["dtype"], "Q8_0");
    assert_eq!(q["ggml_type"], 8);
    assert_eq!(q["shape"], serde_json::json!([4, 64]));
    assert_eq!(q["ne"], serde_json::json!([64, 4]));
    let text = vmmw(&["inspect", p]).stdout;
    assert!(
        text.contains("format: GGUF v3") && text.contains("t.u8 = 200"),
        "{text}"
    );
    let r = vmmw(&["plan", p, "--json"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["format"]["format"], "gguf");
}
