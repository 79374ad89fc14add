//! NaN and infinity through the numeric stages: `filter` compares floats as IEEE 754 numbers
//! (every comparison with NaN is false except `<>`), `clip` keeps NaN and clips ±inf, and
//! computed `standardize` statistics stop at the first NaN/±inf (naming its row) or leave
//! them out and say how many.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float32Array, Float64Array, Int64Array, ListArray};
use arrow::datatypes::{DataType, Field, Float32Type, Float64Type, Schema};
use arrow::record_batch::RecordBatch;
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use sluice_pipeline::stages::{StageConfig, StandardizeConfig};
use sluice_pipeline::{Batch, Pipeline, PreparedPipeline};

/// Writes `groups` to `dir/name`, one row group each.
fn write(dir: &Path, name: &str, groups: &[RecordBatch]) -> String {
    let path = dir.join(name);
    let file = std::fs::File::create(&path).unwrap();
    let mut w = ArrowWriter::try_new(file, groups[0].schema(), None).unwrap();
    for g in groups {
        w.write(g).unwrap();
        w.flush().unwrap(); // one row group per batch
    }
    w.close().unwrap();
    path.display().to_string()
}

fn f64s(values: &[Option<f64>]) -> ArrayRef {
    Arc::new(Float64Array::from(values.to_vec()))
}

/// One nullable float64 column `x` (the same schema for every row group of a file).
fn x_batch(values: &[Option<f64>]) -> RecordBatch {
    let schema = Schema::new(vec![Field::new("x", DataType::Float64, true)]);
    RecordBatch::try_new(Arc::new(schema), vec![f64s(values)]).unwrap()
}

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// `id`, and two float64 columns `x` and `y` (and `f`, `x` as float32) that meet every case:
///
/// | id | 0   | 1    | 2    | 3   | 4    | 5    | 6    | 7   |
/// |----|-----|------|------|-----|------|------|------|-----|
/// | x  | NaN | inf  | -inf | 1   | -0   | null | 2    | NaN |
/// | y  | NaN | inf  | 1    | NaN | 0    | 1    | null | 1   |
fn comparison_file(dir: &Path) -> String {
    let x = [
        Some(NAN),
        Some(INF),
        Some(-INF),
        Some(1.0),
        Some(-0.0),
        None,
        Some(2.0),
        Some(NAN),
    ];
    let y = [
        Some(NAN),
        Some(INF),
        Some(1.0),
        Some(NAN),
        Some(0.0),
        Some(1.0),
        None,
        Some(1.0),
    ];
    let f: Float32Array = x.iter().map(|v| v.map(|v| v as f32)).collect();
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..8)) as ArrayRef,
        ),
        ("x", f64s(&x)),
        ("y", f64s(&y)),
        ("f", Arc::new(f) as ArrayRef),
    ])
    .unwrap();
    write(dir, "cmp.parquet", &[batch])
}

async fn collect(yaml: &str) -> Result<Vec<Batch>, String> {
    let mut s = Pipeline::from_yaml(yaml)
        .map_err(|e| e.to_string())?
        .stream();
    let mut out = Vec::new();
    while let Some(b) = s.next().await {
        out.push(b.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// The ids a `filter` with `predicate` keeps from [`comparison_file`].
async fn kept(predicate: &str) -> Vec<i64> {
    let dir = tempfile::tempdir().unwrap();
    let path = comparison_file(dir.path());
    let yaml = format!(
        "source: {{type: parquet, path: '{path}'}}\n\
         stages:\n\
         - {{type: filter, predicate: '{predicate}'}}\n\
         runtime: {{threads: 1}}\n"
    );
    common::ids(&collect(&yaml).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_eq_is_false_for_nan_and_true_for_minus_zero() {
    // Arrow's total order says NaN = NaN and -0 ≠ 0: ids 0 and 1 instead of 1 and 4.
    assert_eq!(kept("x = y").await, [1, 4]);
    assert_eq!(kept("x = 0").await, [4]);
    assert_eq!(kept("x = 1").await, [3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_not_eq_is_true_for_nan() {
    // NaN <> NaN is true, -0 <> 0 false; a null on either side is null (row dropped).
    assert_eq!(kept("x <> y").await, [0, 2, 3, 7]);
    assert_eq!(kept("x != y").await, [0, 2, 3, 7]);
    assert_eq!(kept("x <> 1").await, [0, 1, 2, 4, 6, 7]);
    // True exactly for NaN: the SQL way to find NaN rows.
    assert_eq!(kept("x <> x").await, [0, 7]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_lt_is_false_for_nan() {
    // Arrow: 1 < NaN and -0 < 0 are true (ids 3 and 4 too).
    assert_eq!(kept("x < y").await, [2]);
    assert_eq!(kept("1 < x").await, [1, 6]);
    assert_eq!(kept("x < 0").await, [2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_lt_eq_is_false_for_nan() {
    // Arrow: NaN <= NaN and 1 <= NaN are true (ids 0 and 3 too).
    assert_eq!(kept("x <= y").await, [1, 2, 4]);
    assert_eq!(kept("x <= 1").await, [2, 3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_gt_is_false_for_nan() {
    // The issue's case: Arrow keeps the NaN rows 0 and 7 for `x > 0`.
    assert_eq!(kept("x > 0").await, [1, 3, 6]);
    assert_eq!(kept("f > 0").await, [1, 3, 6]);
    assert_eq!(kept("x > y").await, Vec::<i64>::new());
    // +inf is above every number, -inf below.
    assert_eq!(kept("x > 1e308").await, [1]);
    assert_eq!(kept("x < -1e308").await, [2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_gt_eq_is_false_for_nan() {
    // Arrow: NaN >= NaN and NaN >= 1 are true, -0 >= 0 false (ids 0, 1, 7).
    assert_eq!(kept("x >= y").await, [1, 4]);
    assert_eq!(kept("f >= 1").await, [1, 3, 6]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_between_is_false_for_nan_and_not_between_true() {
    // `x BETWEEN a AND b` is `x >= a AND x <= b`; its negation keeps NaN rows.
    assert_eq!(kept("x BETWEEN -1 AND y").await, [1, 4]);
    assert_eq!(kept("x NOT BETWEEN -1 AND y").await, [0, 2, 3, 7]);
    assert_eq!(kept("x BETWEEN -1e308 AND 1e308").await, [3, 4, 6]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_in_is_false_for_nan_and_not_in_true() {
    // `x IN (a, b)` is `x = a OR x = b`: NaN is in no list, not even one holding NaN.
    assert_eq!(kept("x IN (y, 5)").await, [1, 4]);
    assert_eq!(kept("x NOT IN (y, 5)").await, [0, 2, 3, 7]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_not_of_a_nan_comparison_is_true() {
    assert_eq!(kept("NOT (x > 0)").await, [0, 2, 4, 7]);
    // Nulls stay null through NOT: id 5 is never kept.
    assert_eq!(kept("NOT (x <= 0)").await, [0, 1, 3, 6, 7]);
}

fn float64s(batches: &[Batch], column: &str) -> Vec<Option<f64>> {
    batches
        .iter()
        .flat_map(|b| {
            b.data
                .column_by_name(column)
                .unwrap()
                .as_primitive::<Float64Type>()
                .iter()
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `a` and `b` equal as bit patterns up to NaN's sign and payload (any NaN matches any NaN).
fn same(a: &[Option<f64>], b: &[Option<f64>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits(),
            (None, None) => true,
            _ => false,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clip_keeps_nan_and_clips_infinities_to_the_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let x = [
        Some(NAN),
        Some(-NAN),
        Some(INF),
        Some(-INF),
        Some(5.0),
        Some(-5.0),
        Some(0.5),
        None,
    ];
    let f: Float32Array = x.iter().map(|v| v.map(|v| v as f32)).collect();
    let batch =
        RecordBatch::try_from_iter([("x", f64s(&x)), ("f", Arc::new(f) as ArrayRef)]).unwrap();
    let path = write(dir.path(), "clip.parquet", &[batch]);
    let yaml = format!(
        "source: {{type: parquet, path: '{path}'}}\n\
         stages:\n\
         - {{type: clip, columns: [x, f], min: -1, max: 1}}\n\
         runtime: {{threads: 1}}\n"
    );
    let out = collect(&yaml).await.unwrap();
    let want = [
        Some(NAN),
        Some(NAN),
        Some(1.0),
        Some(-1.0),
        Some(1.0),
        Some(-1.0),
        Some(0.5),
        None,
    ];
    let got = float64s(&out, "x");
    assert!(same(&got, &want), "float64: {got:?}");
    let got: Vec<Option<f64>> = out
        .iter()
        .flat_map(|b| {
            b.data
                .column_by_name("f")
                .unwrap()
                .as_primitive::<Float32Type>()
                .iter()
                .map(|v| v.map(f64::from))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(same(&got, &want), "float32: {got:?}");
    // One bound only: NaN still passes.
    let yaml = yaml.replace("min: -1, max: 1", "max: 1");
    let got = float64s(&collect(&yaml).await.unwrap(), "x");
    let want = [
        Some(NAN),
        Some(NAN),
        Some(1.0),
        Some(-INF),
        Some(1.0),
        Some(-5.0),
        Some(0.5),
        None,
    ];
    assert!(same(&got, &want), "max only: {got:?}");
}

/// `x` in two row groups: 1, 2, NaN, 3 | inf, 4, -inf, 5, null.
fn stats_file(dir: &Path) -> String {
    let groups = [
        vec![Some(1.0), Some(2.0), Some(NAN), Some(3.0)],
        vec![Some(INF), Some(4.0), Some(-INF), Some(5.0), None],
    ];
    let batches: Vec<RecordBatch> = groups.iter().map(Vec::as_slice).map(x_batch).collect();
    write(dir, "stats.parquet", &batches)
}

fn standardize_yaml(path: &str, options: &str) -> String {
    format!(
        "source: {{type: parquet, path: '{path}'}}\n\
         stages:\n\
         - {{type: standardize, columns: [x]{options}}}\n\
         runtime: {{threads: 1}}\n"
    )
}

async fn prepare(yaml: &str) -> Result<PreparedPipeline, String> {
    Pipeline::from_yaml(yaml)
        .map_err(|e| e.to_string())?
        .prepare()
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standardize_skip_leaves_non_finite_values_out_and_reports_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = stats_file(dir.path());
    let prepared = prepare(&standardize_yaml(&path, ", non_finite: skip"))
        .await
        .unwrap();
    // The statistics of the finite values 1..=5: mean 3, population std √2.
    let frozen = prepared.frozen_stages();
    let StageConfig::Standardize(c) = &frozen[0].value else {
        panic!("{frozen:?}");
    };
    let (mean, std) = (c.mean.as_ref().unwrap(), c.std.as_ref().unwrap());
    let (mean, std) = (mean.values()[0], std.values()[0]);
    assert!((mean - 3.0).abs() < 1e-12, "mean {mean}");
    assert!((std - 2f64.sqrt()).abs() < 1e-12, "std {std}");
    let notes = prepared.metrics().stages()[0].notes.lock().unwrap().clone();
    let note = notes.join("\n");
    assert!(
        note.contains("computed over 5 values of `x`, 3 NaN/±inf value(s) left out (`non_finite: skip`; the first at ")
            && note.contains("stats.parquet row group 0, row 2 (epoch 0)")
            && note.contains(": mean 3.000000, std 1.414214"),
        "{note}"
    );
    // Standardizing keeps NaN and ±inf as they are, and nulls null.
    let mut stream = prepared.stream();
    let mut out = Vec::new();
    while let Some(b) = stream.next().await {
        out.push(b.unwrap());
    }
    let s = 2f64.sqrt();
    let want = [
        Some(-2.0 / s),
        Some(-1.0 / s),
        Some(NAN),
        Some(0.0),
        Some(INF),
        Some(1.0 / s),
        Some(-INF),
        Some(2.0 / s),
        None,
    ];
    let got = float64s(&out, "x");
    assert!(
        got.len() == want.len()
            && got.iter().zip(&want).all(|(g, w)| match (g, w) {
                (Some(g), Some(w)) if w.is_finite() => (g - w).abs() < 1e-12,
                (Some(g), Some(w)) => (g.is_nan() && w.is_nan()) || g == w,
                (None, None) => true,
                _ => false,
            }),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standardize_stops_at_the_first_non_finite_value_by_default() {
    let dir = tempfile::tempdir().unwrap();
    // The first row group is clean; the NaN is row 1 of the second, row 5 of the file.
    let groups = [
        vec![Some(1.0), Some(2.0), None, Some(3.0)],
        vec![Some(4.0), Some(NAN), Some(INF)],
    ];
    let batches: Vec<RecordBatch> = groups.iter().map(Vec::as_slice).map(x_batch).collect();
    let path = write(dir.path(), "bad.parquet", &batches);
    for options in ["", ", non_finite: error"] {
        let e = prepare(&standardize_yaml(&path, options))
            .await
            .unwrap_err();
        assert!(
            e.contains("stages[0] (standardize)")
                && e.contains("column `x` holds NaN (not a finite number)")
                && e.contains("`non_finite: skip`")
                && e.contains("bad.parquet row group 1, row 5 (epoch 0)"),
            "{options}: {e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standardize_error_names_the_row_of_a_list_value() {
    let dir = tempfile::tempdir().unwrap();
    // Rows: [1, 2], [], [3, inf]: the inf is leaf 3, in row 2 (after an empty row).
    let lists = ListArray::from_iter_primitive::<Float64Type, _, _>(vec![
        Some(vec![Some(1.0), Some(2.0)]),
        Some(vec![]),
        Some(vec![Some(3.0), Some(INF)]),
    ]);
    let batch = RecordBatch::try_from_iter([("x", Arc::new(lists) as ArrayRef)]).unwrap();
    let path = write(dir.path(), "lists.parquet", &[batch]);
    let e = prepare(&standardize_yaml(&path, "")).await.unwrap_err();
    assert!(
        e.contains("column `x` holds inf")
            && e.contains("lists.parquet row group 0, row 2 (epoch 0)"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standardize_of_an_all_non_finite_column_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let x = [Some(NAN), Some(INF), None, Some(-INF)];
    let batch = x_batch(&x);
    let path = write(dir.path(), "nan.parquet", &[batch]);
    // Before: "mean NaN, std 1" and every output value NaN.
    let e = prepare(&standardize_yaml(&path, ", non_finite: skip"))
        .await
        .unwrap_err();
    assert!(
        e.contains("every one of the 3 non-null values of column `x` is NaN or ±inf"),
        "{e}"
    );
    let e = prepare(&standardize_yaml(&path, "")).await.unwrap_err();
    assert!(
        e.contains("column `x` holds NaN") && e.contains("row 0 (epoch 0)"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_finite_needs_computed_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let path = stats_file(dir.path());
    let e = prepare(&standardize_yaml(
        &path,
        ", mean: 0, std: 1, non_finite: skip",
    ))
    .await
    .unwrap_err();
    assert!(
        e.contains("`non_finite` applies only to statistics computed from the data"),
        "{e}"
    );
    let e = prepare(&standardize_yaml(&path, ", non_finite: sometimes"))
        .await
        .unwrap_err();
    assert!(e.contains("unknown variant `sometimes`"), "{e}");
}

/// The resume stamp hashes a stage's `Debug` text: a config without `non_finite` or
/// `per_element`, and with numbers (not lists) for `mean`/`std`, must print as it did before
/// those existed, or older checkpoints would be refused.
#[test]
fn standardize_debug_text_is_unchanged_without_non_finite() {
    let mut c = StandardizeConfig {
        columns: vec!["x".into()],
        mean: None,
        std: None,
        non_finite: None,
        per_element: false,
    };
    assert_eq!(
        format!("{:?}", StageConfig::Standardize(c.clone())),
        r#"Standardize(StandardizeConfig { columns: ["x"], mean: None, std: None })"#
    );
    let given: StandardizeConfig =
        serde_json::from_str(r#"{"columns": ["x"], "mean": 0.5, "std": 2}"#).unwrap();
    assert_eq!(
        format!("{given:?}"),
        r#"StandardizeConfig { columns: ["x"], mean: Some(0.5), std: Some(2.0) }"#
    );
    c.non_finite = Some(sluice_pipeline::stages::NonFinite::Skip);
    assert!(format!("{c:?}").contains("non_finite: Skip"), "{c:?}");
    c.per_element = true;
    assert!(format!("{c:?}").contains("per_element: true"), "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clip_of_finite_values_reaches_the_bounds_and_keeps_the_type() {
    // The fast path: a clean column clips as before (bounds reached exactly, type kept).
    let dir = tempfile::tempdir().unwrap();
    let x = [Some(-3.0), Some(-1.0), Some(0.0), Some(1.0), Some(3.0)];
    let batch = x_batch(&x);
    let path = write(dir.path(), "clean.parquet", &[batch]);
    let yaml = format!(
        "source: {{type: parquet, path: '{path}'}}\n\
         stages:\n\
         - {{type: clip, columns: [x], min: -1.5, max: 2}}\n\
         runtime: {{threads: 1}}\n"
    );
    let out = collect(&yaml).await.unwrap();
    assert_eq!(
        float64s(&out, "x"),
        [Some(-1.5), Some(-1.0), Some(0.0), Some(1.0), Some(2.0)]
    );
    assert_eq!(
        out[0]
            .data
            .schema()
            .field_with_name("x")
            .unwrap()
            .data_type(),
        &DataType::Float64
    );
    assert_eq!(out[0].data.column(0).null_count(), 0);
}
