//! Tests of the run's pieces: the length of a resumed run, the stages evaluation runs.

use super::resume::resumed_length;
use super::*;
use crate::checkpoint::CheckpointMeta;
use sluice_pipeline::batch::Mark;
use sluice_pipeline::stages::ImageOp;
use sluice_pipeline::{BatchRun, Pipeline, Rescaled};

/// A run's length after a resume: 10 steps per epoch, 3 epochs.
#[test]
fn a_resumed_run_counts_its_length_from_where_it_is() {
    let meta = |step, epoch: Option<EpochProgress>, pipeline: Vec<SourceState>| CheckpointMeta {
        version: 1,
        step,
        world_size: 1,
        pipeline,
        rows_trained: 0,
        complete: false,
        epoch,
        sync: None,
    };
    let progress = |epoch, steps| {
        Some(EpochProgress {
            epoch,
            rows: 0,
            steps,
        })
    };
    // Never rescaled: epochs × steps, wherever it stopped.
    let plain = meta(14, progress(1, Some(4)), vec![SourceState::default()]);
    assert_eq!(resumed_length(&plain, 3, 10, 1), Some(30));
    // `accumulate: 3`: 4 steps per epoch (3 + 3 + 3 + 1 batches); stopped after 2 steps of
    // epoch 1 (6 batches): 2 steps left in it, 4 in epoch 2.
    let grouped = meta(6, progress(1, Some(6)), vec![SourceState::default()]);
    assert_eq!(resumed_length(&grouped, 3, 10, 3), Some(12));
    // Rescaled earlier (25 steps into epoch 1, its old split had other counts): the rest
    // of epoch 1 and all of epoch 2.
    let later = meta(25, progress(1, Some(4)), vec![SourceState::default()]);
    assert_eq!(resumed_length(&later, 3, 10, 1), Some(25 + 6 + 10));
    // Stopped within a rescaled share: 3 of its 7 batches left, then epochs 1 and 2.
    let share = SourceState {
        rescaled: Some(Box::new(Rescaled {
            from: Vec::new(),
            runs: vec![BatchRun {
                rank: 0,
                first: 0,
                end: 7,
            }],
            batches: 7,
            delivered: 4,
            then: Mark::start_of(1),
        })),
        ..SourceState::default()
    };
    let within = meta(18, None, vec![share]);
    assert_eq!(resumed_length(&within, 3, 10, 1), Some(18 + 3 + 20));
    // Continued at the start of epoch 2 on other ranks (`--elastic` without a rescale):
    // that epoch's steps.
    let next = SourceState {
        parquet: Some(Mark::start_of(2)),
        ..SourceState::default()
    };
    let at_start = meta(17, None, vec![next]);
    assert_eq!(resumed_length(&at_start, 3, 10, 1), Some(17 + 10));
    // An older checkpoint without the steps of its epoch.
    let old = meta(14, progress(1, None), vec![SourceState::default()]);
    assert_eq!(resumed_length(&old, 3, 10, 1), None);
}

#[test]
fn evaluation_leaves_out_the_random_stages_and_keeps_the_rest() {
    let p = Pipeline::from_yaml(
        "source: {type: parquet, path: d.parquet}
stages:
  - {type: cast, columns: {x: float32}}
  - {type: gaussian_noise, columns: [x], std: 0.1}
  - type: image
    column: img
    shape: [8, 8, 3]
    ops:
      - random_crop: {size: [8, 8], padding: 1}
      - horizontal_flip: {}
      - color_jitter: {brightness: 0.2, hue: 0.1}
      - random_grayscale: {p: 0.2}
      - normalize: {mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}
      - random_erasing: {p: 0.5}
  - {type: one_hot, column: y, num_classes: 3, smoothing: 0.1}
  - {type: shuffle}
  - {type: feature_dropout, columns: [x], p: 0.1}
  - {type: mask_tokens, column: t, p: 0.1, mask_token: 0}
  - {type: batch, size: 4}
  - {type: mixup, columns: [x, y], alpha: 0.2}
",
    )
    .unwrap();
    let kept: Vec<&str> = eval_stages(&p.config().stages)
        .iter()
        .map(|s| s.value.kind())
        .collect();
    assert_eq!(kept, ["cast", "image", "one_hot", "batch"]);
    let eval = eval_stages(&p.config().stages);
    let StageConfig::Image(img) = &eval[1].value else {
        panic!("{:?}", eval[1].value)
    };
    // Only the deterministic ops stay: a crop to the image's own size is left out too.
    assert!(
        matches!(img.ops[..], [ImageOp::Normalize { .. }]),
        "{:?}",
        img.ops
    );
    // Crops to another size become their centre / whole-image counterparts.
    for (train, eval) in [
        (
            "random_crop: {size: [6, 6], padding: 2}",
            ImageOp::CenterCrop { size: [6, 6] },
        ),
        (
            "random_resized_crop: {size: [4, 5]}",
            ImageOp::Resize { size: [4, 5] },
        ),
    ] {
        let p = Pipeline::from_yaml(&format!(
            "source: {{type: parquet, path: d.parquet}}
stages:
  - {{type: image, column: img, shape: [8, 8, 3], ops: [{{{train}}}, {{horizontal_flip: {{}}}}]}}
"
        ))
        .unwrap();
        let StageConfig::Image(img) = &eval_stages(&p.config().stages)[0].value else {
            panic!()
        };
        assert_eq!(img.ops, [eval], "{train}");
    }
}
