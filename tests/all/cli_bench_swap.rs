//! `vmmw bench-swap` on the host backend, the CI twin of
//! scripts/gpu.d/81-swap-duplex.sh: every pair of policies runs, the JSON
//! carries the link (each direction and both at once) and every pair's
//! timings and ratios, and every woken model's bytes were verified.

use crate::common;

use common::cli::vmmw;
use serde_json::Value;

#[test]
fn bench_swap_measures_every_policy_pair_and_verifies_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("swap.json");
    let models = dir.path().join("models");
    let r = vmmw(&[
        "bench-swap",
        "--model-mib",
        "1",
        "--rounds",
        "1",
        "--dir",
        models.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(r.stdout.contains("| waking slept with |"), "{}", r.all());
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["backend"], "host");
    assert_eq!(j["model_bytes"], 1 << 20);
    for k in [
        "h2d_gbps",
        "d2h_gbps",
        "duplex_h2d_gbps",
        "duplex_d2h_gbps",
        "duplex_total_gbps",
    ] {
        assert!(
            j["link"][k].as_f64().unwrap() > 0.0,
            "link.{k}: {}",
            j["link"]
        );
    }
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 16, "every pair of the four policies");
    let mut pairs = std::collections::BTreeSet::new();
    let mut verified = 0;
    for row in rows {
        let (w, s) = (
            row["waking"].as_str().unwrap(),
            row["sleeping"].as_str().unwrap(),
        );
        pairs.insert((w.to_owned(), s.to_owned()));
        assert!(row["swap_s"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["sequential_s"].as_f64().unwrap() > 0.0, "{row}");
        assert!(
            row["swap_over_slower_side"].as_f64().unwrap() > 0.0,
            "{row}"
        );
        let v = row["verified_bytes"].as_u64().unwrap();
        // The woken model's bytes are checked unless it slept with Discard.
        assert_eq!(v > 0, w != "discard", "{row}");
        verified += v;
        let crosses = row["out_bytes"].as_u64().unwrap() + row["in_bytes"].as_u64().unwrap() > 0;
        assert_eq!(row["swap_over_link"].is_f64(), crosses, "{row}");
        if crosses {
            assert!(row["swap_over_duplex"].as_f64().unwrap() > 0.0, "{row}");
        }
    }
    assert_eq!(pairs.len(), 16);
    assert_eq!(j["verified_bytes"].as_u64().unwrap(), verified);
    // The checkpoints are kept in --dir and reused.
    assert!(models.join("model-a.safetensors").is_file());
    let r = vmmw(&["bench-swap", "--model-mib", "0"]);
    assert_eq!(r.code, 2, "a zero size is bad input: {}", r.all());
}
