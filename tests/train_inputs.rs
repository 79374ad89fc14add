//! `sluice train` on what a pipeline makes of its data: image augmentation and its
//! deterministic counterparts, mixup with smoothed labels, batches a filter emptied, and a mix
//! of two datasets.
#![cfg(feature = "torch")]
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::train::train_summary;

use std::time::Duration;

use common::*;

/// Writes `dir/name`: the digits pipeline `stages` (source and stages) feeding its float32
/// column `x` and one-hot labels to an MLP for 20 epochs on 2 workers, evaluated on the 360
/// held-out digits; trains it and returns its last evaluation.
fn train_digits(dir: &std::path::Path, name: &str, stages: &str, x: &str) -> serde_json::Value {
    let yaml = format!(
        "{stages}loader:
  tensors:
    x: {{column: {x}, dtype: f32}}
    y: {{column: label, dtype: f32}}
trainer:
  model: {{type: mlp, hidden: [128], outputs: 10}}
  optimizer: {{type: sgd, lr: 0.1, momentum: 0.9}}
  epochs: 20
  eval: {{path: '{d}/test.parquet'}}
  allreduce: {{workers: 2}}
",
        d = repo().join("data/digits").display()
    );
    std::fs::write(dir.join(name), yaml).unwrap();
    let (r, _) = train_summary(dir, &[name]);
    let eval = r["evals"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(eval["rows"], 360);
    eval
}

/// Digits as images through the training-only image ops (random resized crop, erasing,
/// CutMix): the evaluation turns the crop into the resize of the whole image and leaves the
/// rest out, and scores the held-out digits well.
#[test]
fn image_augmentation_trains_and_evaluates_with_the_deterministic_counterparts() {
    let dir = tempfile::tempdir().unwrap();
    let data = repo().join("data/digits");
    let stages = format!(
        "source: {{type: parquet, path: '{d}/train.parquet'}}
stages:
  - type: image
    column: pixels
    output: image
    shape: [8, 8, 1]
    seed: 7
    ops:
      - random_resized_crop: {{size: [6, 6], scale: [0.6, 1.0]}}
      - normalize: {{mean: [0.0191], std: [0.0236]}}
      - random_erasing: {{p: 0.3}}
  - {{type: one_hot, column: label, num_classes: 10}}
  - {{type: select, columns: [image, label]}}
  - {{type: shuffle, buffer_rows: 500, seed: 1}}
  - {{type: batch, size: 64}}
  - {{type: mixup, columns: [image, label], alpha: 0.2, seed: 2, cutmix: {{column: image, shape: [1, 6, 6]}}}}
",
        d = data.display()
    );
    let eval = train_digits(dir.path(), "img.yaml", &stages, "image");
    let acc = eval["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.9, "test accuracy {acc}");
}

/// Smoothed one-hot labels blended by `mixup` (half the rows by CutMix boxes) train with the
/// soft-label cross-entropy, and the evaluation (which leaves `mixup` out) scores them against
/// the held-out digits.
#[test]
fn mixup_with_smoothed_one_hot_labels_trains_and_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    let data = repo().join("data/digits");
    let stages = format!(
        "source: {{type: parquet, path: '{d}/train.parquet', columns: [label, pixels]}}
stages:
  - {{type: cast, columns: {{pixels: float32}}}}
  - {{type: standardize, columns: [pixels]}}
  - {{type: one_hot, column: label, num_classes: 10, smoothing: 0.1}}
  - {{type: shuffle, buffer_rows: 500, seed: 1}}
  - {{type: batch, size: 64}}
  - {{type: mixup, columns: [pixels, label], alpha: 0.2, seed: 2, cutmix: {{column: pixels, shape: [1, 8, 8], p: 0.5}}}}
",
        d = data.display()
    );
    let eval = train_digits(dir.path(), "mixup.yaml", &stages, "pixels");
    let acc = eval["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.93, "test accuracy {acc}");
    // Smoothed targets bound the loss from below by their entropy (0.5 nats for ε = 0.1
    // over 10 classes); the mean loss of a fit model is near it, not near 0.
    let loss = eval["loss"].as_f64().unwrap();
    assert!(loss > 0.45, "eval loss {loss}");

    // The same labels loaded as integers: a clear error, not a libtorch panic.
    let yaml = std::fs::read_to_string(dir.path().join("mixup.yaml")).unwrap();
    let bad = yaml.replace("{column: label, dtype: f32}", "{column: label, dtype: i64}");
    std::fs::write(dir.path().join("bad.yaml"), bad).unwrap();
    let out = run_in_for(dir.path(), &["train", "bad.yaml"], Duration::from_secs(120));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the target tensor `y` (Int64 [64, 10]) does not fit")
            && err.contains("`dtype: f32`")
            && !err.contains("panicked"),
        "{err}"
    );
}

/// A filter after the last `batch` (batches of one row, so every row with label 0 empties its
/// batch) on 2 workers without a shuffle: each rank has a different number of emptied
/// batches. They are delivered empty, so both ranks take every step and every kept row is
/// trained. (Left out, the rank with more of them would run out of data first: fewer steps,
/// and the other rank's last batches untrained.)
#[test]
fn batches_emptied_after_the_last_batch_keep_the_ranks_in_step() {
    let data = repo().join("data/digits/train.parquet");
    let labels = int64_values(&read_parquet(&data), "label");
    // `redistribute`: 718 rows per rank, the epoch's last row left out.
    let share = labels.len() / 2;
    let zeros = |rows: &[i64]| rows.iter().filter(|l| **l == 0).count();
    let (zeros0, zeros1) = (zeros(&labels[..share]), zeros(&labels[share..2 * share]));
    assert_ne!(
        zeros0, zeros1,
        "the ranks must empty different numbers of batches"
    );
    let dir = tempfile::tempdir().unwrap();
    let job = |stages: &str| {
        format!(
            "source: {{type: parquet, path: '{}', columns: [label, pixels], epochs: 2}}
stages:
  - {{type: cast, columns: {{pixels: float32}}}}
{stages}runtime: {{threads: 1}}
loader:
  tensors:
    x: {{column: pixels, dtype: f32}}
    y: {{column: label, dtype: i64}}
trainer:
  model: {{type: mlp, hidden: [8], outputs: 10}}
  optimizer: {{type: sgd, lr: 0.01}}
  epochs: 2
  allreduce: {{workers: 2}}
",
            data.display()
        )
    };
    let train = |stages: &str| {
        std::fs::write(dir.path().join("job.yaml"), job(stages)).unwrap();
        let (r, output) = train_summary(dir.path(), &["job.yaml"]);
        (r, String::from_utf8_lossy(&output.stderr).into_owned())
    };
    const UNEQUAL: &str = "the ranks may get unequal counts";
    // Before the batch: the counts depend on the data; said so, and the end is clean.
    let (r, stderr) =
        train("  - {type: filter, predicate: 'label <> 0'}\n  - {type: batch, size: 1}\n");
    assert!(stderr.contains(UNEQUAL), "{stderr}");
    assert!(r["rows_untrained"].as_u64().unwrap() > 0, "{r}");
    // After it: every step on both ranks.
    let (r, stderr) =
        train("  - {type: batch, size: 1}\n  - {type: filter, predicate: 'label <> 0'}\n");
    assert!(!stderr.contains(UNEQUAL), "{stderr}");
    assert_eq!(r["steps"], 2 * share as u64, "{r}");
    assert_eq!(r["rows_untrained"], 0, "{r}");
    assert_eq!(
        r["rows_trained"],
        2 * (2 * share - zeros0 - zeros1) as u64,
        "{r}"
    );
    assert!(r["last_loss"].as_f64().unwrap().is_finite(), "{r}");
}

/// Two datasets mixed 1 : 1 (the digits 0–4 and 5–9 of the training split, written apart):
/// training sees both every epoch and scores the held-out digits of all ten classes; the
/// evaluation reads its own file whole (the mix is the training data's), and the summary
/// says what each dataset gave.
#[test]
fn a_mix_of_two_datasets_trains_on_both_and_evaluates_the_held_out_file_whole() {
    use arrow::array::{AsArray, BooleanArray};
    use arrow::datatypes::Int64Type;
    let dir = tempfile::tempdir().unwrap();
    let train = read_parquet(&repo().join("data/digits/train.parquet"));
    for (name, low) in [("low", true), ("high", false)] {
        let parts: Vec<arrow::array::RecordBatch> = train
            .iter()
            .map(|b| {
                let label = b.column_by_name("label").unwrap();
                let label =
                    arrow::compute::cast(label, &arrow::datatypes::DataType::Int64).unwrap();
                let keep: BooleanArray = label
                    .as_primitive::<Int64Type>()
                    .iter()
                    .map(|l| Some((l.unwrap() < 5) == low))
                    .collect();
                arrow::compute::filter_record_batch(b, &keep).unwrap()
            })
            .collect();
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
        write_parquet(&dir.path().join(name).join("part-0.parquet"), &parts, 200);
    }
    let stages = "source: {type: parquet, path: [low, high], columns: [label, pixels], mix: {weights: [1, 1], seed: 3}}
stages:
  - {type: cast, columns: {pixels: float32}}
  - {type: standardize, columns: [pixels]}
  - {type: one_hot, column: label, num_classes: 10}
  - {type: shuffle, buffer_rows: 500, seed: 1}
  - {type: batch, size: 64}
";
    let eval = train_digits(dir.path(), "mix.yaml", stages, "pixels");
    let acc = eval["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.93, "test accuracy {acc}");
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("s.json")).unwrap()).unwrap();
    let notes = r["notes"].to_string();
    assert!(
        notes.contains("source: mix of ") && notes.contains("`high` ") && notes.contains("`low` "),
        "{notes}"
    );
}
