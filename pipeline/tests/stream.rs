//! The Stream API on the bundled digits: order, exactly-once, determinism across thread counts,
//! lineage, byte-bounded queues.
#![allow(clippy::unwrap_used)]

mod common;

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int64Type;
use common::ids;
use futures::StreamExt;
use proptest::prelude::*;
use sluice_pipeline::{Batch, Pipeline};

fn digits() -> String {
    format!(
        "{}/../data/digits/train.parquet",
        env!("CARGO_MANIFEST_DIR")
    )
}

async fn collect(yaml: &str) -> Vec<Batch> {
    let mut s = Pipeline::from_yaml(yaml).unwrap().stream();
    let mut out = Vec::new();
    while let Some(b) = s.next().await {
        out.push(b.unwrap());
    }
    out
}

fn config(threads: usize, parallelism: usize, batch_rows: usize, size: usize) -> String {
    format!(
        "source: {{type: parquet, path: '{}', batch_rows: {batch_rows}, prefetch: 3, epochs: 2}}\n\
         stages:\n\
         - {{type: filter, predicate: 'label <> 3 AND id % 7 <> 0'}}\n\
         - {{type: cast, columns: {{pixels: float32}}}}\n\
         - {{type: standardize, columns: [pixels]}}\n\
         - {{type: gaussian_noise, columns: [pixels], std: 0.1, seed: 3}}\n\
         - {{type: batch, size: {size}}}\n\
         - {{type: feature_dropout, columns: [pixels], p: 0.1, scale: true, seed: 4}}\n\
         - {{type: clip, columns: [pixels], min: -2, max: 2}}\n\
         runtime: {{threads: {threads}, parallelism: {parallelism}, queue_bytes: 64 KiB}}\n",
        digits()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_identical_for_any_thread_count() {
    let reference = collect(&config(1, 1, 100, 50)).await;
    for (threads, parallelism) in [(2, 2), (4, 8), (3, 1)] {
        let other = collect(&config(threads, parallelism, 100, 50)).await;
        assert_eq!(other.len(), reference.len());
        for (a, b) in reference.iter().zip(&other) {
            assert_eq!(a.data, b.data, "threads={threads}");
            assert_eq!(a.lineage, b.lineage, "threads={threads}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kept_row_exactly_once_in_order_with_lineage() {
    let batches = collect(&config(2, 4, 64, 50)).await;
    let got = ids(&batches);
    // Reference: read the ids directly and apply the predicate by hand.
    let raw = collect(&format!(
        "source: {{type: parquet, path: '{}', columns: [id, label]}}\n",
        digits()
    ))
    .await;
    let mut expected = Vec::new();
    for b in &raw {
        let id = b.data.column(0).as_primitive::<Int64Type>();
        let label = b.data.column(1).as_primitive::<Int64Type>();
        for r in 0..b.num_rows() {
            if label.value(r) != 3 && id.value(r) % 7 != 0 {
                expected.push(id.value(r));
            }
        }
    }
    let two_epochs: Vec<i64> = expected.iter().chain(expected.iter()).copied().collect();
    assert_eq!(got, two_epochs);
    for b in &batches {
        assert_eq!(b.lineage.num_rows() as usize, b.num_rows());
    }
    // Full batches of 50, except each epoch's last; no batch holds two epochs.
    let epoch_of = |b: &Batch| {
        let spans = b.lineage.spans();
        assert!(spans.iter().all(|s| s.epoch == spans[0].epoch));
        spans[0].epoch
    };
    let per_epoch = expected.len();
    for e in 0..2u64 {
        let sizes: Vec<usize> = batches
            .iter()
            .filter(|b| epoch_of(b) == e)
            .map(Batch::num_rows)
            .collect();
        let mut want = vec![50; per_epoch / 50];
        if per_epoch % 50 > 0 {
            want.push(per_epoch % 50);
        }
        assert_eq!(sizes, want, "epoch {e}");
    }
    // Lineage points at the rows: row r of the file has id of the r-th row in the file.
    let file_ids: Vec<i64> = ids(&raw);
    for b in &batches {
        let batch_ids = b
            .data
            .column_by_name("id")
            .unwrap()
            .as_primitive::<Int64Type>();
        let mut i = 0;
        for span in b.lineage.spans() {
            for k in 0..span.len {
                assert_eq!(batch_ids.value(i), file_ids[(span.first + k) as usize]);
                i += 1;
            }
        }
    }
    assert_eq!(
        batches
            .last()
            .unwrap()
            .lineage
            .spans()
            .last()
            .unwrap()
            .epoch,
        1
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Any batch_rows, batch size, drop_last and thread count: rows arrive once, in order,
    /// in full batches (plus at most one short tail).
    #[test]
    fn rebatching_preserves_rows(batch_rows in 1usize..700, size in 1usize..300, drop_last: bool, threads in 1usize..4) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let yaml = format!(
            "source: {{type: parquet, path: '{}', columns: [id], batch_rows: {batch_rows}}}\nstages:\n- {{type: batch, size: {size}, drop_last: {drop_last}}}\nruntime: {{threads: {threads}}}\n",
            digits()
        );
        let batches = rt.block_on(collect(&yaml));
        let got = ids(&batches);
        let full = 1437 / size * size;
        let want: Vec<i64> = rt.block_on(collect(&format!("source: {{type: parquet, path: '{}', columns: [id]}}\n", digits())))
            .iter().flat_map(|b| b.data.column(0).as_primitive::<Int64Type>().values().to_vec()).collect();
        let n = if drop_last { full } else { 1437 };
        prop_assert_eq!(&got[..], &want[..n]);
        for (i, b) in batches.iter().enumerate() {
            if i + 1 < batches.len() || drop_last || 1437 % size == 0 {
                prop_assert_eq!(b.num_rows(), size);
            }
        }
    }
}

/// Augmentation is keyed by row identity: the same pipeline cut into different source batches
/// and re-batched differently gives every row the same noise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn augmentation_does_not_depend_on_batching() {
    let run = |batch_rows: usize, size: usize| {
        format!(
            "source: {{type: parquet, path: '{}', batch_rows: {batch_rows}, epochs: 2}}\n\
             stages:\n\
             - {{type: cast, columns: {{pixels: float32}}}}\n\
             - {{type: gaussian_noise, columns: [pixels], std: 0.5, seed: 11}}\n\
             - {{type: batch, size: {size}}}\n\
             - {{type: feature_dropout, columns: [pixels], p: 0.3, seed: 12}}\n",
            digits()
        )
    };
    let flat = |batches: Vec<Batch>| -> Vec<u32> {
        batches
            .iter()
            .flat_map(|b| {
                let l = b
                    .data
                    .column_by_name("pixels")
                    .unwrap()
                    .as_fixed_size_list();
                let v = l.values().slice(l.offset() * 64, l.len() * 64);
                v.as_primitive::<arrow::datatypes::Float32Type>()
                    .values()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let a = flat(collect(&run(100, 64)).await);
    let b = flat(collect(&run(333, 17)).await);
    assert_eq!(a.len(), 1437 * 2 * 64);
    assert_eq!(a, b);
    // A different seed changes the values.
    let c = flat(collect(&run(100, 64).replace("seed: 11", "seed: 99")).await);
    assert_ne!(a, c);
}

/// `x: fixed_size_list<float32>[width]` in `groups` row groups of `rows` rows.
fn wide_file(dir: &std::path::Path, groups: usize, rows: usize, width: usize) -> String {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let schema = Arc::new(Schema::new(vec![Field::new(
        "x",
        DataType::FixedSizeList(item.clone(), width as i32),
        false,
    )]));
    let path = dir.join("wide.parquet");
    let file = std::fs::File::create(&path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), None).unwrap();
    for g in 0..groups {
        let values = Float32Array::from_iter_values((0..rows * width).map(|i| (i + g) as f32));
        let list = FixedSizeListArray::new(item.clone(), width as i32, Arc::new(values), None);
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(list) as ArrayRef]).unwrap();
        w.write(&batch).unwrap();
        w.flush().unwrap();
    }
    w.close().unwrap();
    path.display().to_string()
}

/// Data readiness at the consumer (the last queue): a stage far slower than the consumer
/// leaves the consumer asking before each batch is there (readiness < 50%); a pipeline far
/// faster than its consumer has every batch but the first waiting (≥ 99%).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_falls_behind_a_slow_stage_and_stays_up_with_a_fast_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    // Slow: Gaussian noise over 64 × 8192 values per batch on one thread, one batch per row
    // group; the consumer takes each batch at once.
    let path = wide_file(dir.path(), 16, 64, 8192);
    let slow = format!(
        "source: {{type: parquet, path: '{path}', batch_rows: 64}}\n\
         stages:\n\
         - {{type: gaussian_noise, columns: [x], std: 0.1, seed: 1}}\n\
         runtime: {{threads: 1}}\n"
    );
    let prepared = Pipeline::from_yaml(&slow).unwrap().prepare().await.unwrap();
    let metrics = prepared.metrics();
    let mut s = prepared.stream();
    let mut batches = 0;
    while let Some(b) = s.next().await {
        b.unwrap();
        batches += 1;
    }
    assert_eq!(batches, 16);
    let ready = metrics.consumer_readiness().unwrap();
    eprintln!("slow stage: consumer readiness {ready:.3}");
    assert!(ready < 0.5, "slow stage: readiness {ready}");
    // Fast: 4-row batches of the digits (two epochs) read ahead while the consumer spends
    // 2 ms on each (a training step's stand-in). Only the first batch (start-up) may miss.
    let fast = format!(
        "source: {{type: parquet, path: '{}', batch_rows: 4, epochs: 2}}\nruntime: {{threads: 2}}\n",
        digits()
    );
    let prepared = Pipeline::from_yaml(&fast).unwrap().prepare().await.unwrap();
    let metrics = prepared.metrics();
    let mut s = prepared.stream();
    let mut batches = 0;
    while let Some(b) = s.next().await {
        b.unwrap();
        batches += 1;
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    assert!(batches >= 500, "{batches} batches");
    let ready = metrics.consumer_readiness().unwrap();
    eprintln!("fast pipeline: consumer readiness {ready:.4} over {batches} batches");
    assert!(
        ready >= 0.99,
        "fast pipeline: readiness {ready} over {batches} batches"
    );
}
