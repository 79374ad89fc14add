//! `sluice bench` in a reduced size: the table is complete — Sluice, the raw decode, the
//! PyTorch DataLoader and numpy each delivered every row — with ratios and a bottleneck.
//! The Python peers come from scripts/python-peers.sh (scripts/test.sh sets
//! SLUICE_BENCH_PYTHON); the full size is `sluice bench images` / `sluice bench tabular`.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{assert_ok, run_in_for};

fn python() -> String {
    std::env::var("SLUICE_BENCH_PYTHON").unwrap_or_else(|_| {
        panic!(
            "SLUICE_BENCH_PYTHON is not set: the bench test compares with PyTorch. Run the suite with \
             scripts/test.sh, or `source scripts/python-peers.sh` first"
        )
    })
}

fn bench(workload: &str, rows: usize) {
    let dir = tempfile::tempdir().unwrap();
    let py = python();
    let rows_s = rows.to_string();
    let out = run_in_for(
        dir.path(),
        &[
            "bench",
            workload,
            "--rows",
            &rows_s,
            "--repeat",
            "1",
            "--python",
            &py,
            "--json",
            "bench.json",
        ],
        Duration::from_secs(300),
    );
    assert_ok(&out);
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("bench.json")).unwrap()).unwrap();
    assert_eq!(r["rows"], rows);
    let variants = r["variants"].as_array().unwrap();
    let names: Vec<&str> = variants
        .iter()
        .map(|v| v["variant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["raw", "sluice", "dataloader", "numpy"]);
    for v in variants {
        let name = v["variant"].as_str().unwrap();
        assert!(v["skipped"].is_null(), "{name} skipped: {}", v["skipped"]);
        assert_eq!(v["measured"]["rows"], rows, "{name}: every row once");
        assert!(v["samples_per_second"].as_f64().unwrap() > 0.0, "{name}");
        assert!(v["mb_per_second"].as_f64().unwrap() > 0.0, "{name}");
        assert!(
            v["measured"]["peak_rss_mib"].as_f64().unwrap() > 1.0,
            "{name}"
        );
        assert!(v["vs_raw"].as_f64().unwrap() > 0.0, "{name}");
    }
    assert!(r["sluice_vs_dataloader"].as_f64().unwrap() > 0.0);
    assert!(!r["bottleneck"]["element"].as_str().unwrap().is_empty());
    assert!(!r["bottleneck"]["suggestion"].as_str().unwrap().is_empty());
    let table = String::from_utf8_lossy(&out.stdout);
    for name in names {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(name) && l.contains('×')),
            "no table row for {name}:\n{table}"
        );
    }
    assert!(table.contains("sluice vs PyTorch DataLoader"), "{table}");
    assert!(table.contains("bottleneck:"), "{table}");
}

#[test]
fn images_bench_produces_a_complete_table() {
    bench("images", 2_000);
}

#[test]
fn tabular_bench_produces_a_complete_table() {
    bench("tabular", 20_000);
}
