//! Property tests of the shuffle, sharding and exact resume on random small Parquet datasets:
//! (a) one epoch emits every row exactly once, (b) output is identical for 1, 2 and 4
//! threads, (c) N batches = k batches, snapshot, restore in a fresh pipeline, N − k batches
//! (a, b and c also with `across_ranks`), (d) every rank gets the same number of batches.
//! The pipeline they run has every stage kind (`select` in the hand-over tests).
//!
//! One test binary, a module per topic in `shuffle/`: `properties` (a–d), `images` (images
//! handed over as views, bad images), `stage_order` (stage orders refused or warned about),
//! `group_by_length`, `resume_checks` (the plan a state is resumed under) and `rescale` (an
//! epoch continued on another number of ranks). The dataset, the pipeline and the runs they
//! share are here.
#![allow(clippy::unwrap_used)]

mod common;

#[path = "shuffle/group_by_length.rs"]
mod group_by_length;
#[path = "shuffle/images.rs"]
mod images;
#[path = "shuffle/properties.rs"]
mod properties;
#[path = "shuffle/rescale.rs"]
mod rescale;
#[path = "shuffle/resume_checks.rs"]
mod resume_checks;
#[path = "shuffle/stage_order.rs"]
mod stage_order;

use std::path::Path;
use std::sync::Arc;

use arrow::array::{FixedSizeBinaryArray, Float32Array, Int64Array, ListArray, RecordBatch};
use arrow::datatypes::Int32Type;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use proptest::prelude::*;
use sluice_pipeline::{Batch, Pipeline, SourceState};

/// Writes `files` Parquet files; file i has the row groups `groups[i]` (row counts). Ids run
/// 0.. across files in listing order.
fn write_dataset(dir: &Path, groups: &[Vec<usize>]) -> u64 {
    let mut id = 0i64;
    for (f, sizes) in groups.iter().enumerate() {
        let path = dir.join(format!("part-{f:03}.parquet"));
        let file = std::fs::File::create(path).unwrap();
        let props = WriterProperties::builder().build();
        let mut writer: Option<ArrowWriter<std::fs::File>> = None;
        let mut file = Some(file);
        for &n in sizes {
            let ids: Vec<i64> = (id..id + n as i64).collect();
            let xs: Vec<f32> = ids.iter().map(|v| *v as f32 * 0.5).collect();
            id += n as i64;
            // A 2×2×3 image and a token sequence per row, derived from the id.
            let imgs = FixedSizeBinaryArray::try_from_iter(ids.iter().map(|v| {
                (0..12)
                    .map(|k| (*v as u8).wrapping_mul(7).wrapping_add(k))
                    .collect::<Vec<u8>>()
            }))
            .unwrap();
            // A 4×4×3 image: long enough (48 bytes) to live outside a view, in its buffer.
            let big = FixedSizeBinaryArray::try_from_iter(ids.iter().map(|v| {
                (0..48)
                    .map(|k| (*v as u8).wrapping_mul(13).wrapping_add(k * 5))
                    .collect::<Vec<u8>>()
            }))
            .unwrap();
            let toks = ListArray::from_iter_primitive::<Int32Type, _, _>(ids.iter().map(|v| {
                Some(
                    (0..(v % 5 + 1) as i32)
                        .map(|t| Some(t + 1))
                        .collect::<Vec<_>>(),
                )
            }));
            let rb = RecordBatch::try_from_iter([
                ("id", Arc::new(Int64Array::from(ids)) as _),
                ("x", Arc::new(Float32Array::from(xs)) as _),
                ("img", Arc::new(imgs) as _),
                ("big", Arc::new(big) as _),
                ("tok", Arc::new(toks) as _),
            ])
            .unwrap();
            let w = writer.get_or_insert_with(|| {
                ArrowWriter::try_new(file.take().unwrap(), rb.schema(), Some(props.clone()))
                    .unwrap()
            });
            w.write(&rb).unwrap();
            w.flush().unwrap(); // one row group per write
        }
        writer.unwrap().close().unwrap();
    }
    id as u64
}

#[derive(Debug, Clone)]
struct Case {
    groups: Vec<Vec<usize>>,
    batch_rows: usize,
    buffer_rows: usize,
    max_memory: usize,
    batch: usize,
    epochs: u64,
    seed: u64,
    filter: bool,
    /// A filter after the last `batch` too (batches then stand for rows they no longer hold).
    trim: bool,
    /// `group_by_length` over the token column, this many batches per group (`buffer_rows`
    /// is then a multiple of `batch`).
    group: Option<usize>,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(prop::collection::vec(1usize..60, 1..4), 1..4),
        1usize..40,
        1usize..150,
        prop_oneof![Just(1usize << 30), 200usize..3000],
        1usize..50,
        1u64..3,
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(1usize..4),
    )
        .prop_map(
            |(
                groups,
                batch_rows,
                buffer_rows,
                max_memory,
                batch,
                epochs,
                seed,
                filter,
                trim,
                group,
            )| {
                Case {
                    groups,
                    batch_rows,
                    buffer_rows: match group {
                        Some(_) => buffer_rows.div_ceil(batch) * batch,
                        None => buffer_rows,
                    },
                    max_memory,
                    batch,
                    epochs,
                    seed,
                    filter,
                    trim,
                    group,
                }
            },
        )
}

fn yaml(dir: &Path, c: &Case, threads: usize, extra_runtime: &str, across: bool) -> String {
    let filter = if c.filter {
        "- {type: filter, predicate: 'id % 5 <> 1'}\n"
    } else {
        ""
    };
    let trim = if c.trim {
        "- {type: filter, predicate: 'id % 7 <> 3'}\n"
    } else {
        ""
    };
    let group = c
        .group
        .map(|g| format!(", group_by_length: {{column: tok, batches: {g}}}"))
        .unwrap_or_default();
    format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: {}, prefetch: 2, epochs: {}}}\n\
         stages:\n\
         {filter}\
         - {{type: gaussian_noise, columns: [x], std: 1.0, seed: 9}}\n\
         - {{type: image, column: img, output: pix, shape: [2, 2, 3], seed: 5, ops: [{{random_crop: {{size: [5, 5], padding: 1, padding_mode: reflect, pad_if_needed: true}}}}, {{horizontal_flip: {{}}}}, {{color_jitter: {{brightness: 0.3, contrast: 0.3, saturation: 0.3, hue: 0.1}}}}, {{random_grayscale: {{p: 0.3}}}}, {{normalize: {{mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}}}}]}}\n\
         - {{type: shuffle, buffer_rows: {}, max_memory: {}, seed: {}, batch_rows: 7, across_ranks: {across}{group}}}\n\
         - {{type: feature_dropout, columns: [x], p: 0.3, seed: 2}}\n\
         - {{type: clip, columns: [x], min: -200.0, max: 200.0}}\n\
         - {{type: standardize, columns: [x]}}\n\
         - {{type: fill_null, columns: {{x: 0.0}}}}\n\
         - {{type: cast, columns: {{id: int64}}}}\n\
         - {{type: one_hot, column: id, num_classes: 1000, output: id_hot, smoothing: 0.1}}\n\
         - {{type: mask_tokens, column: tok, p: 0.3, mask_token: 0, mask_replace_prob: 0.8, random_replace_prob: 0.1, vocab_size: 50, special_tokens: [1], labels_column: tok_labels, seed: 4}}\n\
         - {{type: rename, columns: {{tok_labels: labels}}}}\n\
         - {{type: image, column: img, output: img2, shape: [2, 2, 3], ops: [{{random_resized_crop: {{size: [3, 3]}}}}, {{vertical_flip: {{p: 0.5}}}}, {{random_erasing: {{p: 0.5, scale: [0.1, 0.5], value: random}}}}]}}\n\
         - {{type: batch, size: {}}}\n\
         {trim}\
         - {{type: mixup, columns: [x, pix], alpha: 0.4, seed: 6, cutmix: {{column: pix, shape: [3, 5, 5], p: 0.5}}}}\n\
         runtime: {{threads: {threads}, parallelism: {threads}, queue_bytes: 4 KiB{extra_runtime}}}\n",
        dir.display(),
        c.batch_rows,
        c.epochs,
        c.buffer_rows,
        c.max_memory,
        c.seed,
        c.batch
    )
}

async fn run(p: Pipeline, limit: Option<usize>) -> (Vec<Batch>, SourceState) {
    run_synced(p, limit, None).await
}

/// Like a data-parallel trainer: ranks stop together (a rank that drops its stream while
/// another still needs an exchange would abandon the collective).
async fn run_synced(
    p: Pipeline,
    limit: Option<usize>,
    barrier: Option<Arc<tokio::sync::Barrier>>,
) -> (Vec<Batch>, SourceState) {
    let mut s = p.stream();
    let out = common::take(&mut s, limit).await;
    if let Some(b) = barrier {
        b.wait().await;
    }
    (out, s.snapshot())
}

/// What an interrupted run and its resume deliver: `yaml`'s first `k` batches, a snapshot
/// (through JSON), then the rest from a fresh pipeline restored from it.
async fn interrupted_at(yaml: &str, k: usize) -> Vec<Batch> {
    let (mut head, state) = run(Pipeline::from_yaml(yaml).unwrap(), Some(k)).await;
    let state: SourceState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let (tail, _) = run(Pipeline::from_yaml(yaml).unwrap().resume_from(state), None).await;
    head.extend(tail);
    head
}

/// Whether `policy` gives every one of `world` ranks nothing of the dataset `groups` (its
/// row groups, each of at least one row): an error, not a run that reads nothing.
fn no_share(groups: &[Vec<usize>], world: usize, policy: &str) -> bool {
    let rows: usize = groups.iter().flatten().sum();
    let row_groups: usize = groups.iter().map(Vec::len).sum();
    match policy {
        "drop_last" => row_groups < world,
        "redistribute" => rows < world,
        _ => false,
    }
}
