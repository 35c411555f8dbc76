//! `--chart FILE.svg`: the file is written, parses as XML, is an SVG document
//! and shows what the run did (step names, sleep marks, result labels).

use crate::common;

use common::cli::*;

#[test]
fn demo_chart_draws_the_timeline_with_sleep_and_wake_marked() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("demo.svg");
    let r = vmmw(&[
        "demo",
        "--layers",
        "1",
        "--hidden",
        "256",
        "--chart",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    let texts = svg_texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t.contains(s));
    for want in [
        "cache allocated",
        "asleep (weights offloaded, cache discarded)",
        "sleep: weights, kv_cache",
        "wake",
        "weights: tracked (physically backed)",
        "kv_cache: reserved (address space)",
        "host backup (all tags)",
    ] {
        assert!(has(want), "chart lacks `{want}`: {texts:?}");
    }
    // The same timeline drawn again from the saved JSON.
    let json = dir.path().join("demo.json");
    let r = vmmw(&["demo", "--layers", "1", "--hidden", "256", "--json"]);
    std::fs::write(&json, &r.stdout).unwrap();
    let again = dir.path().join("again.svg");
    let r = vmmw(&[
        "report",
        json.to_str().unwrap(),
        "--chart",
        again.to_str().unwrap(),
        "--title",
        "from a file <&>",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    let texts = svg_texts(&again);
    assert!(texts.iter().any(|t| t == "from a file <&>"), "{texts:?}");
}

#[test]
fn load_chart_draws_allocated_loaded_freed() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(dir.path());
    let svg = dir.path().join("load.svg");
    let r = vmmw(&["load", &ckpt, "--chart", svg.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.all());
    let texts = svg_texts(&svg);
    for want in ["allocated", "loaded", "freed and trimmed"] {
        assert!(texts.iter().any(|t| t.contains(want)), "{want}: {texts:?}");
    }
    assert!(!texts.iter().any(|t| t.starts_with("sleep:")), "{texts:?}");
}

#[test]
fn bench_chart_draws_one_bar_per_result() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("pool.svg");
    let r = vmmw(&[
        "bench-pool",
        "--sizes",
        "512,64K,1M",
        "--batches",
        "3",
        "--pairs",
        "5",
        "--chart",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    let texts = svg_texts(&svg);
    for want in [
        "512 B",
        "64.00 KiB",
        "1.00 MiB",
        "nanoseconds (median), lower is better",
    ] {
        assert!(texts.iter().any(|t| t == want), "{want}: {texts:?}");
    }
    // No stray results file is left next to the chart.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");

    let ckpt = small_checkpoint(dir.path());
    let svg = dir.path().join("load.svg");
    let r = vmmw(&[
        "bench-load",
        &ckpt,
        "--preset",
        "llama",
        "--head-dim",
        "16",
        "--repeat",
        "1",
        "--link-bytes",
        "4M",
        "--strategies",
        "auto,staged",
        "--chart",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    let texts = svg_texts(&svg);
    assert!(
        texts.iter().any(|t| t.contains("host to device link")),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t.starts_with("staged")), "{texts:?}");
}
