//! `sluice bench` in a reduced size: the table is complete — Sluice, Sluice from Python, the
//! raw decode, numpy and the PyTorch DataLoader each delivered every row — with ratios, CPU
//! time and a bottleneck. The Python is the Python package's venv (scripts/test.sh sets
//! SLUICE_BENCH_PYTHON to it: numpy, torch and the `sluice` package). With a Python without
//! torch (scripts/python-peers.sh), the torch rows must say they were skipped and how to
//! install what they need. The full size is `sluice bench images` / `sluice bench tabular`.
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

/// Whether `py` can import `modules`: decided here, independently of the bench's own check.
fn imports(py: &str, modules: &str) -> bool {
    std::process::Command::new(py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .unwrap()
        .status
        .success()
}

fn bench(workload: &str, rows: usize) {
    let dir = tempfile::tempdir().unwrap();
    let py = python();
    let torch = imports(&py, "torch");
    let package = torch && imports(&py, "sluice");
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
    assert_eq!(
        r["layout"], "compressed",
        "the default: files as pyarrow writes them"
    );
    let variants = r["variants"].as_array().unwrap();
    let names: Vec<&str> = variants
        .iter()
        .map(|v| v["variant"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "raw",
            "source",
            "sluice",
            "global",
            "python",
            "uint8",
            "float16",
            "floor",
            "dataloader",
            "numpy"
        ]
    );
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
        if matches!(name, "uint8" | "float16") && workload == "tabular" {
            assert_eq!(v["skipped"], "images only");
            assert!(v["measured"].is_null());
            continue;
        }
        if name == "python" && !package {
            let why = v["skipped"].as_str().unwrap();
            assert!(
                why.contains("cannot import") && why.contains("scripts/python"),
                "{why}"
            );
            continue;
        }
        assert!(v["skipped"].is_null(), "{name} skipped: {}", v["skipped"]);
        assert_eq!(v["measured"]["rows"], rows, "{name}: every row once");
        assert!(v["samples_per_second"].as_f64().unwrap() > 0.0, "{name}");
        assert!(v["mb_per_second"].as_f64().unwrap() > 0.0, "{name}");
        let (peak, start) = (
            v["measured"]["peak_rss_mib"].as_f64().unwrap(),
            v["measured"]["start_rss_mib"].as_f64().unwrap(),
        );
        // What the process held before loading (the binary and its libraries, or the
        // interpreter with its imports) is part of its peak, not all of it.
        assert!(
            start > 1.0 && start < peak,
            "{name}: start {start}, peak {peak}"
        );
        if matches!(
            name,
            "raw" | "source" | "sluice" | "global" | "uint8" | "float16" | "floor"
        ) {
            // libtorch's libraries are part of what the binary holds before it loads; a build
            // without `torch` has none.
            let lib = v["measured"]["libtorch_rss_mib"].as_f64().unwrap();
            assert!(lib < start, "{name}: libtorch {lib}, start {start}");
            assert_eq!(lib > 1.0, cfg!(feature = "torch"), "{name}: libtorch {lib}");
        }
        assert!(v["vs_raw"].as_f64().unwrap() > 0.0, "{name}");
        assert!(v["cpu_seconds_per_1k"].as_f64().unwrap() > 0.0, "{name}");
        assert!(
            v["samples_per_cpu_second"].as_f64().unwrap() > 0.0,
            "{name}"
        );
        assert!(v["vs_raw_per_cpu"].as_f64().unwrap() > 0.0, "{name}");
    }
    if package {
        // The suite's wheel is a debug build (scripts/python.sh), a benchmark's a release one:
        // the bench says which, and that a debug build's ratio is not comparable.
        let build = r["python_package_build"].as_str().unwrap();
        assert!(build == "debug" || build == "release", "{build}");
        assert_eq!(
            table.contains("a debug build of the sluice package: not comparable"),
            build == "debug",
            "{table}"
        );
        assert!(r["python_vs_sluice"].as_f64().unwrap() > 0.0);
        assert!(r["python_vs_dataloader"].as_f64().unwrap() > 0.0);
        assert!(
            table.contains("Sluice from Python vs Sluice in Rust"),
            "{table}"
        );
    }
    assert_eq!(
        table.contains("libtorch's libraries:"),
        cfg!(feature = "torch"),
        "{table}"
    );
    if torch {
        assert!(r["sluice_vs_dataloader"].as_f64().unwrap() > 0.0);
        assert!(table.contains("sluice vs PyTorch DataLoader"), "{table}");
    } else {
        assert!(r["sluice_vs_dataloader"].is_null());
    }
    assert!(!r["bottleneck"]["element"].as_str().unwrap().is_empty());
    assert!(!r["bottleneck"]["suggestion"].as_str().unwrap().is_empty());
    let ran = |n: &str| match n {
        "dataloader" => torch,
        "python" => package,
        "uint8" | "float16" => workload == "images",
        _ => true,
    };
    for name in names.iter().filter(|n| ran(n)) {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(name) && l.contains('×')),
            "no table row for {name}:\n{table}"
        );
    }
    assert!(table.contains("bottleneck:"), "{table}");
    assert!(
        variants.iter().all(|v| v["paired"].is_null()),
        "one round: nothing to pair"
    );
}

#[test]
fn images_bench_produces_a_complete_table() {
    bench("images", 2_000);
}

#[test]
fn tabular_bench_produces_a_complete_table() {
    bench("tabular", 20_000);
}

/// Variants left out with `--skip` (and Python peers without a Python) are not failures: the
/// bench exits 0 and their rows say why. (It exited 1 for every `--skip` before.) With two
/// rounds, each variant that ran is also paired round by round with the raw decode.
#[test]
fn skipped_variants_are_not_failures_and_two_rounds_are_paired() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in_for(
        dir.path(),
        &[
            "bench",
            "tabular",
            "--rows",
            "4000",
            "--repeat",
            "2",
            "--python",
            "none",
            "--skip",
            "global",
            "--skip",
            "floor",
            "--json",
            "bench.json",
        ],
        Duration::from_secs(300),
    );
    assert_ok(&out);
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("bench.json")).unwrap()).unwrap();
    let field = |name: &str, key: &str| {
        r["variants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["variant"] == name)
            .unwrap()[key]
            .clone()
    };
    let skipped = |name: &str| field(name, "skipped");
    assert_eq!(skipped("global"), "--skip");
    assert_eq!(skipped("floor"), "--skip");
    assert_eq!(skipped("uint8"), "images only");
    assert_eq!(skipped("float16"), "images only");
    assert!(skipped("sluice").is_null());
    assert!(skipped("raw").is_null());
    let paired = |name: &str| field(name, "paired");
    assert!(paired("global").is_null(), "skipped: nothing to pair");
    // The raw decode against itself, round by round.
    assert_eq!(paired("raw")["median"], 1.0);
    let table = String::from_utf8_lossy(&out.stdout);
    for name in ["source", "sluice"] {
        let p = paired(name);
        assert_eq!(p["rounds"], 2, "{name}: {p}");
        let [min, median, max] = ["min", "median", "max"].map(|k| p[k].as_f64().unwrap());
        assert!(0.0 < min && min <= median && median <= max, "{name}: {p}");
        assert!(p["per_cpu_median"].as_f64().unwrap() > 0.0, "{name}: {p}");
        let shown = format!("{median:.2}× ({min:.2}–{max:.2})");
        let line = |l: &str| l.starts_with(&format!("  {name} ")) && l.contains(&shown);
        assert!(table.lines().any(line), "{name} {shown}: {table}");
    }
    assert!(table.contains("lowest–highest of 2 rounds"), "{table}");
}
