//! `standardize` with one mean and std per element of a `fixed_size_list` column (per
//! feature, as scikit-learn's `StandardScaler`): given as lists, or computed in the first pass
//! (`per_element: true`), and the refusals of settings that cannot mean anything.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Float32Type, Schema};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use sluice_pipeline::stages::{NumberOrList, StageConfig};
use sluice_pipeline::{Pipeline, PreparedPipeline};

const WIDTH: usize = 4;

/// Row `r`, element `k`: a different scale and offset per element, so one mean for all of
/// them would be visibly wrong; `None` rows are null lists.
fn value(r: usize, k: usize) -> f32 {
    let wobble = ((r * 7 + k * 3) % 11) as f32 - 5.0;
    (k as f32 * 100.0 - 150.0) + wobble * (k as f32 + 0.5)
}

/// `x: fixed_size_list<float32>[4]` in two row groups of 6 and 5 rows; row 4 is null, and
/// element 2 of row 7 (of the file: row 1 of group 1) is NaN when `nan` is set.
fn write(dir: &Path, nan: bool) -> (String, Vec<Option<[f32; WIDTH]>>) {
    let rows: Vec<Option<[f32; WIDTH]>> = (0..11)
        .map(|r| {
            (r != 4).then(|| {
                let mut row = [0.0; WIDTH];
                for (k, v) in row.iter_mut().enumerate() {
                    *v = if nan && r == 7 && k == 2 {
                        f32::NAN
                    } else {
                        value(r, k)
                    };
                }
                row
            })
        })
        .collect();
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    let schema = Arc::new(Schema::new(vec![Field::new(
        "x",
        DataType::FixedSizeList(item.clone(), WIDTH as i32),
        true,
    )]));
    let path = dir.join("features.parquet");
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema.clone(), None).unwrap();
    for group in [&rows[..6], &rows[6..]] {
        let values: Float32Array = group
            .iter()
            .flat_map(|r| r.unwrap_or([0.0; WIDTH]))
            .map(Some)
            .collect();
        let nulls =
            arrow::buffer::NullBuffer::from(group.iter().map(Option::is_some).collect::<Vec<_>>());
        let list =
            FixedSizeListArray::new(item.clone(), WIDTH as i32, Arc::new(values), Some(nulls));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(list) as ArrayRef]).unwrap();
        w.write(&batch).unwrap();
        w.flush().unwrap();
    }
    w.close().unwrap();
    (path.display().to_string(), rows)
}

fn yaml(path: &str, options: &str) -> String {
    format!(
        "source: {{type: parquet, path: '{path}'}}\n\
         stages:\n\
         - {{type: standardize, columns: [x]{options}}}\n\
         runtime: {{threads: 2}}\n"
    )
}

async fn prepare(yaml: &str) -> Result<PreparedPipeline, String> {
    Pipeline::from_yaml(yaml)
        .map_err(|e| e.to_string())?
        .prepare()
        .await
        .map_err(|e| e.to_string())
}

/// Every row's `x` (None for a null row), in order.
async fn rows_out(prepared: PreparedPipeline) -> Vec<Option<Vec<f32>>> {
    let mut s = prepared.stream();
    let mut out = Vec::new();
    while let Some(b) = s.next().await {
        let b = b.unwrap();
        let l = b.data.column(0).as_fixed_size_list();
        for r in 0..l.len() {
            out.push(
                l.is_valid(r)
                    .then(|| l.value(r).as_primitive::<Float32Type>().values().to_vec()),
            );
        }
    }
    out
}

/// Two-pass float64 mean and population std of element `k` over the non-null, finite values.
fn reference(rows: &[Option<[f32; WIDTH]>], k: usize) -> (f64, f64) {
    let v: Vec<f64> = rows
        .iter()
        .flatten()
        .map(|r| f64::from(r[k]))
        .filter(|v| v.is_finite())
        .collect();
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64;
    (mean, var.sqrt())
}

/// What the stage must write: `(x - mean[k]) / std[k]` in float32, as the scalar stage does.
fn expected(rows: &[Option<[f32; WIDTH]>], mean: &[f64], std: &[f64]) -> Vec<Option<Vec<f32>>> {
    rows.iter()
        .map(|r| {
            r.map(|r| {
                (0..WIDTH)
                    .map(|k| (r[k] - mean[k] as f32) / std[k] as f32)
                    .collect()
            })
        })
        .collect()
}

fn bits(rows: &[Option<Vec<f32>>]) -> Vec<Option<Vec<u32>>> {
    rows.iter()
        .map(|r| r.as_ref().map(|r| r.iter().map(|v| v.to_bits()).collect()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_lists_standardize_each_element_with_its_own_mean_and_std() {
    let dir = tempfile::tempdir().unwrap();
    let (path, rows) = write(dir.path(), false);
    let (mean, std) = ([-150.5, -48.0, 52.25, 148.0], [0.5, 4.0, 7.5, 11.0]);
    let options = format!(", mean: {mean:?}, std: {std:?}");
    let got = rows_out(prepare(&yaml(&path, &options)).await.unwrap()).await;
    assert_eq!(bits(&got), bits(&expected(&rows, &mean, &std)));
    assert!(got[4].is_none(), "the null row stays null");
    // A single number for one of them applies to every element.
    let got = rows_out(
        prepare(&yaml(&path, &format!(", mean: {mean:?}, std: 2")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(bits(&got), bits(&expected(&rows, &mean, &[2.0; WIDTH])));
}

/// `standardize` then `gaussian_noise` and `feature_dropout` on its column: the noise stage
/// does the standardization in its own pass over each row (the run notes say so on the
/// `standardize` stage), and every value is bit for bit what the stages give one after the
/// other (a `select` between them keeps them apart; one before them in the fused run keeps
/// the noise at the same stage index, which its draws depend on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standardize_fused_with_the_noise_after_it_gives_the_same_values() {
    let dir = tempfile::tempdir().unwrap();
    let (path, rows) = write(dir.path(), true);
    let select = "- {type: select, columns: [x]}\n";
    let run = |before: &'static str, between: &'static str, noise: &'static str| {
        let path = path.clone();
        async move {
            let yaml = format!(
                "source: {{type: parquet, path: '{path}'}}\n\
                 stages:\n\
                 {before}\
                 - {{type: standardize, columns: [x], mean: [-150.5, -48.0, 52.25, 148.0], std: 2}}\n\
                 {between}\
                 - {noise}\n\
                 runtime: {{threads: 2}}\n"
            );
            let prepared = prepare(&yaml).await.unwrap();
            let notes: Vec<String> = prepared
                .metrics()
                .stages()
                .iter()
                .flat_map(|s| s.notes.lock().unwrap().clone())
                .collect();
            (notes, rows_out(prepared).await)
        }
    };
    for noise in [
        "{type: gaussian_noise, columns: [x], std: 0.5, seed: 3}",
        "{type: feature_dropout, columns: [x], p: 0.25, seed: 4}",
    ] {
        let (notes, fused) = run(select, "", noise).await;
        assert!(
            notes.iter().any(|n| n.contains("is done by stages[2]")),
            "{noise}: {notes:?}"
        );
        let (notes, apart) = run("", select, noise).await;
        assert!(notes.is_empty(), "{noise}: {notes:?}");
        assert_eq!(bits(&fused), bits(&apart), "{noise}");
        assert_eq!(fused.len(), rows.len());
        assert!(fused[4].is_none(), "the null row stays null");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn computed_per_element_statistics_equal_a_two_pass_computation() {
    let dir = tempfile::tempdir().unwrap();
    let (path, rows) = write(dir.path(), true);
    let prepared = prepare(&yaml(&path, ", per_element: true, non_finite: skip"))
        .await
        .unwrap();
    let frozen = prepared.frozen_stages();
    let StageConfig::Standardize(c) = &frozen[0].value else {
        panic!("{frozen:?}");
    };
    let (Some(NumberOrList::Each(mean)), Some(NumberOrList::Each(std))) = (&c.mean, &c.std) else {
        panic!("one value per element: {c:?}");
    };
    for k in 0..WIDTH {
        let (m, s) = reference(&rows, k);
        assert!(
            (mean[k] - m).abs() <= 1e-12 * m.abs().max(1.0),
            "mean[{k}] {} vs {m}",
            mean[k]
        );
        assert!(
            (std[k] - s).abs() <= 1e-12 * s,
            "std[{k}] {} vs {s}",
            std[k]
        );
    }
    let note = prepared.metrics().stages()[0]
        .notes
        .lock()
        .unwrap()
        .join("\n");
    assert!(
        note.contains("computed per element over 4 elements of `x` (9–10 values each)")
            && note.contains("1 NaN/±inf value(s) left out")
            && note.contains("row group 1, row 7 (epoch 0)"),
        "{note}"
    );
    let got = rows_out(prepared).await;
    let want = expected(&rows, mean, std);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        match (g, w) {
            (Some(g), Some(w)) => {
                for (a, b) in g.iter().zip(w) {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "{g:?} vs {w:?}"
                    );
                }
            }
            _ => assert_eq!(g.is_none(), w.is_none()),
        }
    }
    // The frozen stage (lists written in) standardizes other data the same way.
    let again = format!(", mean: {mean:?}, std: {std:?}");
    let replayed = rows_out(prepare(&yaml(&path, &again)).await.unwrap()).await;
    assert_eq!(
        format!("{:?}", bits(&replayed)),
        format!("{:?}", bits(&got))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nan_stops_the_per_element_pass_naming_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write(dir.path(), true);
    let err = prepare(&yaml(&path, ", per_element: true"))
        .await
        .unwrap_err();
    assert!(
        err.contains("column `x` holds NaN") && err.contains("row group 1, row 7"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_cannot_apply_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write(dir.path(), false);
    let cases = [
        (
            ", mean: [1, 2, 3], std: 1",
            "`mean` has 3 values but column `x` has 4 elements per row",
        ),
        (
            ", mean: [1, 2, 3, 4], std: [1, 1, 0, 1]",
            "`std` must be a positive number and `mean` finite (got mean 3, std 0 (element 2))",
        ),
        (
            ", mean: [1, 2, 3, 4], std: [1, 1, 1, 1], per_element: true",
            "`per_element` applies only to statistics computed from the data",
        ),
        (", mean: [], std: 1", "must not be empty lists"),
        (
            ", mean: [1, 2], std: {a: 1}",
            "a number, or a list of numbers",
        ),
    ];
    for (options, want) in cases {
        let err = prepare(&yaml(&path, options)).await.unwrap_err();
        assert!(err.contains(want), "{options}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_element_needs_a_fixed_size_list() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Float32, false)]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(Float32Array::from(vec![1.0, 2.0])) as ArrayRef],
    )
    .unwrap();
    let path = dir.path().join("scalar.parquet");
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let path = path.display().to_string();
    let text = yaml(&path, ", per_element: true").replace("[x]", "[v]");
    let err = prepare(&text).await.unwrap_err();
    assert!(
        err.contains("column `v` is Float32: one mean/std per element needs a fixed_size_list"),
        "{err}"
    );
    let text = yaml(&path, ", mean: [1, 2], std: [1, 1]").replace("[x]", "[v]");
    let err = prepare(&text).await.unwrap_err();
    assert!(err.contains("needs a fixed_size_list"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clip_takes_one_bound_per_element() {
    let dir = tempfile::tempdir().unwrap();
    let (path, rows) = write(dir.path(), true);
    let (lo, hi) = ([-151.0f32, -50.0, 50.0, 145.0], 150.0f32);
    let text = yaml(&path, "").replace(
        "{type: standardize, columns: [x]}",
        &format!("{{type: clip, columns: [x], min: {lo:?}, max: {hi}}}"),
    );
    let got = rows_out(prepare(&text).await.unwrap()).await;
    for (g, r) in got.iter().zip(&rows) {
        let (Some(g), Some(r)) = (g, r) else {
            assert_eq!(g.is_none(), r.is_none());
            continue;
        };
        for k in 0..WIDTH {
            if r[k].is_nan() {
                assert!(g[k].is_nan(), "NaN stays NaN");
            } else {
                assert_eq!(g[k], r[k].max(lo[k]).min(hi), "element {k} of {r:?}");
            }
        }
    }
    let bad = yaml(&path, "").replace(
        "{type: standardize, columns: [x]}",
        "{type: clip, columns: [x], min: [0, 1], max: [5, 0]}",
    );
    let err = prepare(&bad).await.unwrap_err();
    assert!(
        err.contains("`min` (1) is greater than `max` (0) at element 1"),
        "{err}"
    );
    let bad = bad.replace("max: [5, 0]", "max: 9");
    let err = prepare(&bad).await.unwrap_err();
    assert!(
        err.contains("`min` has 2 values but column `x` has 4 elements per row"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clip_of_integer_lists_takes_one_bound_per_element() {
    use arrow::array::Int32Array;
    use arrow::datatypes::Int32Type;
    let dir = tempfile::tempdir().unwrap();
    let item = Arc::new(Field::new("item", DataType::Int32, false));
    let schema = Arc::new(Schema::new(vec![Field::new(
        "x",
        DataType::FixedSizeList(item.clone(), 3),
        false,
    )]));
    let values = Int32Array::from((0..30).map(|v| v - 15).collect::<Vec<_>>());
    let list = FixedSizeListArray::new(item, 3, Arc::new(values.clone()), None);
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(list) as ArrayRef]).unwrap();
    let path = dir.path().join("ints.parquet");
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let text = yaml(&path.display().to_string(), "").replace(
        "{type: standardize, columns: [x]}",
        "{type: clip, columns: [x], min: [-10, 0, -20], max: [10, 5, 0]}",
    );
    let mut s = prepare(&text).await.unwrap().stream();
    let mut got = Vec::new();
    while let Some(b) = s.next().await {
        let b = b.unwrap();
        let l = b.data.column(0).as_fixed_size_list();
        got.extend_from_slice(l.values().as_primitive::<Int32Type>().values());
    }
    let (lo, hi) = ([-10, 0, -20], [10, 5, 0]);
    let want: Vec<i32> = values
        .values()
        .iter()
        .enumerate()
        .map(|(i, &v)| v.clamp(lo[i % 3], hi[i % 3]))
        .collect();
    assert_eq!(got, want);
}
