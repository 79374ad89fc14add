//! `sluice run` on data holding NaN and ±inf: the run summary says how many values computed
//! `standardize` statistics left out, a NaN stops the run by default naming its row, and a
//! `filter` drops NaN rows from a comparison.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;

use arrow::array::{Float64Array, RecordBatch};
use common::*;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

/// `dir/x.parquet`: one float64 column `x` holding `values`, one row group.
fn write_x(dir: &Path, values: &[f64]) {
    let batch =
        RecordBatch::try_from_iter([("x", arc(Float64Array::from(values.to_vec())))]).unwrap();
    write_parquet(&dir.join("x.parquet"), &[batch], 1000);
}

fn write_job(dir: &Path, stage: &str) {
    std::fs::write(
        dir.join("job.yaml"),
        format!(
            "source: {{type: parquet, path: x.parquet}}\nstages:\n  - {stage}\nsink: {{type: 'null'}}\n"
        ),
    )
    .unwrap();
}

#[test]
fn run_summary_counts_the_non_finite_values_left_out() {
    let dir = tempfile::tempdir().unwrap();
    write_x(dir.path(), &[1.0, f64::NAN, 2.0, f64::INFINITY, 3.0]);
    write_job(
        dir.path(),
        "{type: standardize, columns: [x], non_finite: skip}",
    );
    sluice()
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--no-report"])
        .assert()
        .success()
        .stdout(contains(
            "computed over 3 values of `x`, 2 NaN/±inf value(s) left out (`non_finite: skip`; the first at ",
        ))
        .stdout(contains(
            "x.parquet row group 0, row 1 (epoch 0)): mean 2.000000, std 0.816497",
        ));
}

#[test]
fn run_stops_at_the_first_nan_naming_its_row() {
    let dir = tempfile::tempdir().unwrap();
    write_x(dir.path(), &[1.0, 2.0, f64::NAN, 3.0]);
    write_job(dir.path(), "{type: standardize, columns: [x]}");
    sluice()
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--no-report"])
        .assert()
        .failure()
        .stderr(contains("column `x` holds NaN (not a finite number)"))
        .stderr(contains("x.parquet row group 0, row 2 (epoch 0)"))
        .stderr(contains("`non_finite: skip`"))
        // Before: "mean NaN, std 1" and exit 0.
        .stdout(contains("mean NaN").not());
}

#[test]
fn filter_comparison_drops_nan_rows() {
    let dir = tempfile::tempdir().unwrap();
    write_x(dir.path(), &[1.0, f64::NAN, -1.0, f64::INFINITY]);
    write_job(dir.path(), "{type: filter, predicate: 'x > 0'}");
    sluice()
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--no-report"])
        .assert()
        .success()
        .stdout(contains("4 rows in, 2 out"));
}
