//! `sluice bench` in a reduced size: the table is complete — Sluice, the raw decode and numpy
//! each delivered every row — with ratios and a bottleneck. The Python peers come from
//! scripts/python-peers.sh (scripts/test.sh sets SLUICE_BENCH_PYTHON). The PyTorch
//! DataLoader row is checked like the others when that Python has torch
//! (`scripts/python-peers.sh --with-torch`, 2.7 GB, so not in the default suite); without
//! torch the row must say it was skipped and how to install it. The full size is
//! `sluice bench images` / `sluice bench tabular`.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{assert_ok, run_in_for};

fn python() -> String {
    std::env::var("SLUICE_BENCH_PYTHON").unwrap_or_else(|_| {
        panic!(
            "SLUICE_BENCH_PYTHON is not set: the bench test compares with numpy. Run the suite with \
             scripts/test.sh, or `source scripts/python-peers.sh` first"
        )
    })
}

/// Whether `py` can import torch: decided here, independently of the bench's own check.
fn has_torch(py: &str) -> bool {
    std::process::Command::new(py)
        .args(["-c", "import torch"])
        .output()
        .unwrap()
        .status
        .success()
}

fn bench(workload: &str, rows: usize) {
    let dir = tempfile::tempdir().unwrap();
    let py = python();
    let torch = has_torch(&py);
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
    assert_eq!(names, ["raw", "sluice", "floor", "dataloader", "numpy"]);
    let table = String::from_utf8_lossy(&out.stdout);
    for v in variants {
        let name = v["variant"].as_str().unwrap();
        if name == "dataloader" && !torch {
            let why = v["skipped"].as_str().unwrap();
            assert!(
                why.contains("cannot import torch") && why.contains("--with-torch"),
                "{why}"
            );
            assert!(v["measured"].is_null());
            assert!(
                table
                    .lines()
                    .any(|l| l.starts_with("dataloader") && l.contains("skipped:")),
                "{table}"
            );
            continue;
        }
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
    if torch {
        assert!(r["sluice_vs_dataloader"].as_f64().unwrap() > 0.0);
        assert!(table.contains("sluice vs PyTorch DataLoader"), "{table}");
    } else {
        assert!(r["sluice_vs_dataloader"].is_null());
    }
    assert!(!r["bottleneck"]["element"].as_str().unwrap().is_empty());
    assert!(!r["bottleneck"]["suggestion"].as_str().unwrap().is_empty());
    for name in names.iter().filter(|n| torch || **n != "dataloader") {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(name) && l.contains('×')),
            "no table row for {name}:\n{table}"
        );
    }
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
