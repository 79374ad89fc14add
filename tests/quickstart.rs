//! The README's quickstart: the bundled digits through `configs/quickstart.yaml`.
#![allow(clippy::unwrap_used)]

use crate::common;

use arrow::array::{Array, AsArray};
use arrow::datatypes::Float32Type;
use common::*;

#[test]
fn quickstart_writes_exactly_the_input_rows() {
    let out = tempfile::tempdir().unwrap();
    let summary = out.path().join("summary.json");
    let assert = sluice()
        .arg("run")
        .arg(repo().join("configs/quickstart.yaml"))
        .arg("--summary-json")
        .arg(&summary)
        .env("SLUICE_OUT_DIR", out.path())
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&assert.get_output().stdout).to_string();
    assert!(
        stdout.contains("rows/s") && stdout.contains("MB/s"),
        "{stdout}"
    );

    let input = read_parquet(&repo().join("data/digits/train.parquet"));
    let output = read_parquet(&out.path().join("digits-train.parquet"));
    assert_eq!(rows(&input), 1437);
    assert_eq!(
        rows(&output),
        rows(&input),
        "every input row is written once"
    );
    assert_eq!(
        checksum_i64(&output, &["id", "label"]),
        checksum_i64(&input, &["id", "label"]),
        "same rows, same order"
    );

    // The pixels were cast, standardized with the data's own mean/std and clipped.
    let mut values = Vec::new();
    for b in &output {
        let list = b.column_by_name("pixels").unwrap().as_fixed_size_list();
        assert_eq!(list.value_length(), 64);
        values.extend_from_slice(list.values().as_primitive::<Float32Type>().values());
    }
    assert_eq!(values.len(), 1437 * 64);
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / n;
    assert!(mean.abs() < 0.05, "mean after standardize+clip: {mean}");
    assert!(values.iter().all(|v| (-3.0..=3.0).contains(v)));

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(report["rows_read"], 1437);
    assert_eq!(report["rows_written"], 1437);
    assert_eq!(
        report["batches_written"], 23,
        "22 batches of 64 + a tail of 29"
    );
    // Nothing but the output and the summary in the output directory (no staging files).
    assert_eq!(
        files_under(out.path()),
        vec!["digits-train.parquet", "summary.json"]
    );
    let _ = output[0].column(0).len();
}
